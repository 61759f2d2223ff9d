#include "analysis/flops.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "analysis/pricing.h"
#include "analysis/test_runs.h"

namespace gpuprof::analysis {
namespace {

using testing::kMs;
using testing::RunBuilder;
using testing::StepShape;

TEST(Flops, ParseDtypeAcceptsCommonSpellings) {
  EXPECT_EQ(ParseDtype("bf16"), Dtype::kBf16);
  EXPECT_EQ(ParseDtype("torch.bfloat16"), Dtype::kBf16);
  EXPECT_EQ(ParseDtype("FP16"), Dtype::kFp16);
  EXPECT_EQ(ParseDtype("half"), Dtype::kFp16);
  EXPECT_EQ(ParseDtype("tf32"), Dtype::kTf32);
  EXPECT_EQ(ParseDtype("float32"), Dtype::kFp32);
  EXPECT_EQ(ParseDtype("float8_e4m3fn"), Dtype::kFp8);
  EXPECT_EQ(ParseDtype("int8"), std::nullopt);
  EXPECT_EQ(DtypeName(Dtype::kBf16), "bf16");
}

TEST(Flops, NamesMatchOnWholeWords) {
  EXPECT_TRUE(GpuNameMatches("NVIDIA A100-SXM4-80GB", "A100"));
  EXPECT_FALSE(GpuNameMatches("NVIDIA A100-SXM4-80GB", "A10"));
  EXPECT_FALSE(GpuNameMatches("NVIDIA L40S", "L4"));
  EXPECT_TRUE(GpuNameMatches("NVIDIA H100 PCIe", "h100 pcie"));
  EXPECT_FALSE(GpuNameMatches("NVIDIA H100 80GB HBM3", "H100 PCIe"));
  EXPECT_FALSE(GpuNameMatches("NVIDIA GH200 480GB", "H200"));
}

TEST(Flops, PeakTableHoldsDenseDatasheetFigures) {
  EXPECT_EQ(PeakTflops("NVIDIA A100-SXM4-80GB", Dtype::kBf16), 312);
  EXPECT_EQ(PeakTflops("NVIDIA A100-PCIE-40GB", Dtype::kFp16), 312);
  EXPECT_EQ(PeakTflops("NVIDIA A100-SXM4-40GB", Dtype::kTf32), 156);
  EXPECT_EQ(PeakTflops("NVIDIA H100 80GB HBM3", Dtype::kBf16), 989);
  EXPECT_EQ(PeakTflops("NVIDIA H100 PCIe", Dtype::kBf16), 756);
  EXPECT_EQ(PeakTflops("NVIDIA H200", Dtype::kBf16), 989);
  EXPECT_EQ(PeakTflops("Tesla V100-SXM2-16GB", Dtype::kFp16), 125);
  EXPECT_EQ(PeakTflops("NVIDIA L4", Dtype::kBf16), 121);
  EXPECT_EQ(PeakTflops("NVIDIA L40S", Dtype::kBf16), 362);
  EXPECT_EQ(PeakTflops("NVIDIA A10G", Dtype::kBf16), 125);
  // No bf16 tensor cores on Volta: unknown, not 0.
  EXPECT_EQ(PeakTflops("Tesla V100-SXM2-16GB", Dtype::kBf16), std::nullopt);
  EXPECT_EQ(PeakTflops("Some Future GPU", Dtype::kBf16), std::nullopt);
  // Every entry is reachable: the first entry matching its own words is itself.
  for (const PeakTflopsEntry& e : PeakTflopsTable()) {
    EXPECT_EQ(FindPeakEntry(e.match), &e) << e.match;
  }
}

TEST(Flops, MfuIsFlopsOverSteadyMeanStepTimeOverPeak) {
  RunBuilder b;
  StepShape first;
  first.duration_ns = 900 * kMs;  // warmup: excluded from the steady mean
  StepShape s;
  s.duration_ns = 200 * kMs;
  const double flops = 50e12;  // per step
  b.Step(first).Steps(9, s).Flops(flops, "bf16");
  const MfuResult r = ComputeMfu(BuildRunView(b.Build()));
  ASSERT_TRUE(r.mfu) << r.reason;
  const double achieved = flops / 0.200 / 1e12;  // TFLOPs
  EXPECT_DOUBLE_EQ(r.mfu->achieved_tflops, achieved);
  EXPECT_DOUBLE_EQ(r.mfu->value, achieved / 989);
  EXPECT_EQ(r.mfu->gpu_label, "H100 SXM");
}

TEST(Flops, MfuAbove100PercentIsUnknownNotAnImpossibleNumber) {
  // GIVEN FLOPs per step far above what one H100 can do in the step time
  RunBuilder b;
  StepShape s;
  s.duration_ns = 10 * kMs;
  b.Steps(10, s).Flops(1e18, "bf16");
  // WHEN MFU is computed THEN it is unknown, and the reason says it exceeds the peak
  const MfuResult r = ComputeMfu(BuildRunView(b.Build()));
  EXPECT_FALSE(r.mfu);
  EXPECT_THAT(r.reason, ::testing::StartsWith("MFU unknown: computes to "));
  EXPECT_THAT(r.reason, ::testing::HasSubstr("of one H100 SXM's peak"));
}

TEST(Flops, MfuOfASimulatedGpuIsUnknown) {
  // GIVEN a run whose (mock) GPU looks like an H100, with FLOPs and a dtype
  RunBuilder b;
  b.Steps(10, StepShape{}).Flops(1e12, "bf16");
  b.run().gpu_backend = "mock";
  // WHEN MFU is computed THEN it is unknown because the GPU is simulated
  const MfuResult r = ComputeMfu(BuildRunView(b.Build()));
  EXPECT_FALSE(r.mfu);
  EXPECT_THAT(r.reason, ::testing::HasSubstr("simulated"));
}

TEST(Flops, MfuUnknownSaysWhy) {
  RunBuilder cpu;
  cpu.Steps(5, StepShape{}).Flops(1e12, "bf16").Cpu();
  EXPECT_EQ(ComputeMfu(BuildRunView(cpu.Build())).reason,
            "MFU unknown: CPU run (MFU compares with a GPU's peak; `gpuprof rules --reference` "
            "lists the GPUs)");

  RunBuilder no_flops;
  no_flops.Steps(5, StepShape{});
  EXPECT_NE(ComputeMfu(BuildRunView(no_flops.Build())).reason.find("flops_per_step"),
            std::string::npos);

  RunBuilder no_dtype;
  no_dtype.Steps(5, StepShape{}).Flops(1e12, "bf16");
  no_dtype.run().dtype.reset();
  EXPECT_NE(ComputeMfu(BuildRunView(no_dtype.Build())).reason.find("dtype"), std::string::npos);

  RunBuilder unknown_gpu;
  unknown_gpu.Steps(5, StepShape{}).Flops(1e12, "bf16").Gpu("Acme X1", 1);
  EXPECT_NE(ComputeMfu(BuildRunView(unknown_gpu.Build())).reason.find("Acme X1"),
            std::string::npos);

  RunBuilder no_model;
  no_model.Steps(5, StepShape{}).Flops(1e12, "bf16");
  no_model.run().gpu_model.reset();
  no_model.Telemetry("gpu", false, "nvml", "libnvidia-ml.so.1 not found");
  EXPECT_NE(ComputeMfu(BuildRunView(no_model.Build())).reason.find("libnvidia-ml.so.1 not found"),
            std::string::npos);
}

// ---------------------------------------------------------------- transformer FLOPs

// A small shape whose per-token FLOPs are worked out by hand below: 2 layers, h = 64, 4 heads
// (d = 16), 2 KV heads (kv = 32), seq 128, vocab 1000, ffn 256, plain (2-matrix) MLP.
TransformerShape Small() {
  TransformerShape s;
  s.layers = 2;
  s.hidden = 64;
  s.heads = 4;
  s.kv_heads = 2;
  s.seq_len = 128;
  s.vocab = 1000;
  s.ffn_hidden = 256;
  return s;
}

TEST(TransformerFlops, SmallShapeByHand) {
  const auto f = TransformerFlopsPerToken(Small());
  ASSERT_TRUE(f.ok()) << f.error();
  // Per layer: Q 2·64·64 = 8192, K and V 2·2·64·32 = 8192, O 8192 -> 24576.
  EXPECT_DOUBLE_EQ(f->attention_proj, 2 * 24576.0);
  // QKᵀ and A·V: 2·2·128·64 = 32768 per layer (full seq_len, no causal halving).
  EXPECT_DOUBLE_EQ(f->attention_scores, 2 * 32768.0);
  // MLP: 2 matrices · 2·64·256 = 65536 per layer.
  EXPECT_DOUBLE_EQ(f->mlp, 2 * 65536.0);
  // LM head: 2·64·1000.
  EXPECT_DOUBLE_EQ(f->lm_head, 128000.0);
  EXPECT_DOUBLE_EQ(f->lora_adapters, 0.0);
  EXPECT_DOUBLE_EQ(f->forward, 373760.0);  // 2·(24576 + 32768 + 65536) + 128000
  EXPECT_DOUBLE_EQ(f->model, 3 * 373760.0);
  EXPECT_DOUBLE_EQ(f->hardware, f->model);  // no checkpointing: nothing recomputed
}

TEST(TransformerFlops, DefaultsAreMultiHeadAndFourTimesHidden) {
  TransformerShape explicit_shape = Small();
  explicit_shape.kv_heads = 4;
  explicit_shape.ffn_hidden = 256;  // = 4 × 64
  TransformerShape defaults = Small();
  defaults.kv_heads.reset();
  defaults.ffn_hidden.reset();
  EXPECT_DOUBLE_EQ(TransformerFlopsPerToken(defaults)->model,
                   TransformerFlopsPerToken(explicit_shape)->model);
}

TEST(TransformerFlops, GradientCheckpointingAddsTheLayersForwardToHardwareFlopsOnly) {
  TransformerShape s = Small();
  s.grad_checkpoint = true;
  const auto f = TransformerFlopsPerToken(s);
  ASSERT_TRUE(f.ok());
  // Model FLOPs (MFU) exclude the recompute; hardware FLOPs add one forward of the layers
  // (2·(24576 + 32768 + 65536) = 245760), not of the LM head.
  EXPECT_DOUBLE_EQ(f->model, 1121280.0);
  EXPECT_DOUBLE_EQ(f->hardware, 1121280.0 + 245760.0);
}

TEST(TransformerFlops, GatedMlpAndMixtureOfExperts) {
  TransformerShape s = Small();
  s.gated_mlp = true;
  s.ffn_hidden = 128;
  s.moe_experts = 8;
  s.moe_top_k = 2;
  const auto f = TransformerFlopsPerToken(s);
  ASSERT_TRUE(f.ok());
  // Per layer: 2 active experts · 3 matrices · 2·64·128 = 98304, router 2·64·8 = 1024.
  EXPECT_DOUBLE_EQ(f->mlp, 2 * (98304.0 + 1024.0));
  // Only the active experts count: 8 experts with top-2 cost what 2 dense MLPs would (+router).
  TransformerShape two = s;
  two.moe_experts = 2;
  EXPECT_DOUBLE_EQ(TransformerFlopsPerToken(two)->mlp, 2 * (98304.0 + 256.0));
}

TEST(TransformerFlops, LoraFreezesBaseWeights) {
  TransformerShape s = Small();
  s.lora_rank = 8;
  const auto f = TransformerFlopsPerToken(s);
  ASSERT_TRUE(f.ok());
  // Adapters per layer: Q 2·8·(64+64), K and V 2·8·(64+32) each, O 2·8·(64+64) -> 7168;
  // MLP 2·8·(64+256) per matrix, 2 matrices -> 10240. Total 17408 per layer.
  EXPECT_DOUBLE_EQ(f->lora_adapters, 2 * 17408.0);
  EXPECT_DOUBLE_EQ(f->forward, 373760.0 + 2 * 17408.0);
  // Frozen base (projections, MLP, LM head): 2× forward; scores and adapters: 3×.
  const double base = 2 * (24576.0 + 65536.0) + 128000.0;
  EXPECT_DOUBLE_EQ(f->model, 2 * base + 3 * (2 * 32768.0) + 3 * (2 * 17408.0));
  EXPECT_DOUBLE_EQ(f->model, 917504.0);
  // Cheaper than the full fine-tune of the same shape, by about a third of the base matmuls.
  EXPECT_LT(f->model, TransformerFlopsPerToken(Small())->model);
}

// Llama-2-7B: 32 layers, hidden 4096, 32 heads, SwiGLU 11008, vocab 32000, seq 4096.
TransformerShape Llama7B() {
  TransformerShape s;
  s.layers = 32;
  s.hidden = 4096;
  s.heads = 32;
  s.seq_len = 4096;
  s.vocab = 32000;
  s.ffn_hidden = 11008;
  s.gated_mlp = true;
  return s;
}

TEST(TransformerFlops, Llama7BMatchesTheSixNPlusAttentionApproximation) {
  const TransformerShape s = Llama7B();
  const double h = 4096, L = 32, T = 4096;
  // Parameters: per layer 4·h² (attention) + 3·h·11008 (MLP); embedding and LM head h·vocab
  // each. About 6.74 B.
  const double n = L * (4 * h * h + 3 * h * 11008) + 2 * h * 32000;
  EXPECT_NEAR(n / 1e9, 6.74, 0.01);
  // The PaLM approximation: 6·N + 12·L·h·T per token (it counts the embedding too, which is a
  // lookup, so it sits ~1% above the matmul count).
  const double approx = 6 * n + 12 * L * h * T;
  const auto f = TransformerFlopsPerToken(s);
  ASSERT_TRUE(f.ok());
  EXPECT_NEAR(f->model / approx, 1.0, 0.03);
  // Exactly: 6·(N without the embedding) + 12·L·h·T.
  EXPECT_DOUBLE_EQ(f->model, 6 * (n - h * 32000) + 12 * L * h * T);
  // 4096-token sequences of a 7B model: ~46 GFLOPs per trained token.
  EXPECT_NEAR(f->model / 1e9, 46.08, 0.01);
}

TEST(TransformerFlops, MixtralLikeCountsActiveParameters) {
  // Mixtral-8x7B-like: 32 layers, h 4096, 32 heads, 8 KV heads, SwiGLU 14336, 8 experts top-2.
  TransformerShape s;
  s.layers = 32;
  s.hidden = 4096;
  s.heads = 32;
  s.kv_heads = 8;
  s.seq_len = 4096;
  s.vocab = 32000;
  s.ffn_hidden = 14336;
  s.gated_mlp = true;
  s.moe_experts = 8;
  s.moe_top_k = 2;
  const double h = 4096, L = 32, T = 4096;
  // Active parameters per token: attention 2·h² + 2·h·1024, 2 experts · 3·h·14336, router
  // 8·h, LM head h·vocab: ~12.7 B active (of ~46.7 B).
  const double active = L * (2 * h * h + 2 * h * 1024 + 2 * 3 * h * 14336 + 8 * h) + h * 32000;
  EXPECT_NEAR(active / 1e9, 12.75, 0.01);
  const auto f = TransformerFlopsPerToken(s);
  ASSERT_TRUE(f.ok());
  EXPECT_DOUBLE_EQ(f->model, 6 * active + 12 * L * h * T);
}

TEST(TransformerFlops, PerStepScalesByTokens) {
  const auto step = TransformerFlopsPerStep(Small(), 8 * 128);
  ASSERT_TRUE(step.ok()) << step.error();
  EXPECT_EQ(step->tokens_per_step, 1024);
  EXPECT_DOUBLE_EQ(step->model_per_step, 1121280.0 * 1024);
  EXPECT_DOUBLE_EQ(step->hardware_per_step, 1121280.0 * 1024);
  EXPECT_EQ(TransformerFlopsPerStep(Small(), 0).error(), "tokens_per_step must be > 0, got 0");
}

TEST(TransformerFlops, InvalidShapesNameTheField) {
  auto error = [](auto edit) {
    TransformerShape s = Small();
    edit(s);
    return TransformerFlopsPerToken(s).error();
  };
  EXPECT_EQ(error([](TransformerShape& s) { s.layers = 0; }), "layers must be > 0, got 0");
  EXPECT_EQ(error([](TransformerShape& s) { s.vocab = -3; }), "vocab must be > 0, got -3");
  EXPECT_EQ(error([](TransformerShape& s) { s.heads = 5; }), "heads (5) must divide hidden (64)");
  EXPECT_EQ(error([](TransformerShape& s) { s.kv_heads = 3; }),
            "kv_heads (3) must divide heads (4)");
  EXPECT_EQ(error([](TransformerShape& s) { s.kv_heads = 8; }),
            "kv_heads (8) must divide heads (4)");
  EXPECT_EQ(error([](TransformerShape& s) { s.kv_heads = -1; }), "kv_heads must be > 0, got -1");
  EXPECT_EQ(error([](TransformerShape& s) { s.kv_heads = 0; }), "kv_heads must be > 0, got 0");
  EXPECT_EQ(error([](TransformerShape& s) { s.ffn_hidden = 0; }), "ffn_hidden must be > 0, got 0");
  EXPECT_EQ(error([](TransformerShape& s) { s.moe_experts = 0; }),
            "moe_experts must be > 0, got 0");
  EXPECT_EQ(error([](TransformerShape& s) {
              s.moe_experts = 2;
              s.moe_top_k = 3;
            }),
            "moe_top_k (3) must be <= moe_experts (2)");
  EXPECT_THAT(error([](TransformerShape& s) { s.lora_rank = 0; }),
              ::testing::HasSubstr("lora_rank must be > 0"));
  EXPECT_TRUE(ValidateTransformerShape(Small()).ok());
}

TEST(Flops, MfuNamesTheFlopsMethodAndQuotesAFailedCount) {
  RunBuilder b;
  b.Steps(8, StepShape{}).Flops(1e12, "bf16");
  b.run().flops_method = "arch";
  const MfuResult r = ComputeMfu(BuildRunView(b.Build()));
  ASSERT_TRUE(r.mfu) << r.reason;
  EXPECT_EQ(r.mfu->flops_method, "arch");
  EXPECT_EQ(FlopsMethodLabel("arch"), "TransformerArch");
  EXPECT_EQ(FlopsMethodLabel("declared"), "declared flops_per_step");
  EXPECT_EQ(FlopsMethodLabel("counted"), "counted (FlopCounterMode, one step)");

  // No FLOPs, and the Python layer said why the automatic count produced none.
  RunBuilder failed;
  failed.Steps(8, StepShape{}).Flops(1e12, "bf16");
  failed.run().flops_per_step.reset();
  store::RunData data = failed.Build();
  data.diagnostics.push_back({std::nullopt, "warning", std::string(kFlopsDiagnosticSource),
                              "automatic FLOP count failed: boom"});
  EXPECT_EQ(ComputeMfu(BuildRunView(std::move(data))).reason,
            "MFU unknown: automatic FLOP count failed: boom");
}

TEST(Pricing, ReferenceRatesByModel) {
  EXPECT_DOUBLE_EQ(FindGpuRate("NVIDIA H100 80GB HBM3")->usd_per_gpu_hour, 12.29);
  EXPECT_DOUBLE_EQ(FindGpuRate("NVIDIA A100-SXM4-80GB")->usd_per_gpu_hour, 5.12);
  EXPECT_DOUBLE_EQ(FindGpuRate("NVIDIA A100-SXM4-40GB")->usd_per_gpu_hour, 4.10);
  EXPECT_EQ(FindGpuRate("NVIDIA GeForce RTX 4090"), nullptr);
  for (const GpuRateEntry& e : GpuRateTable()) {
    EXPECT_EQ(FindGpuRate(e.match), &e) << e.match;
    EXPECT_GT(e.usd_per_gpu_hour, 0);
    EXPECT_FALSE(e.source.empty());
  }
}

TEST(Pricing, ParseRate) {
  EXPECT_EQ(ParseRate("12.29"), 12.29);
  EXPECT_EQ(ParseRate(" $3.5 "), 3.5);
  EXPECT_EQ(ParseRate("0"), 0.0);
  EXPECT_EQ(ParseRate("-1"), std::nullopt);
  EXPECT_EQ(ParseRate("abc"), std::nullopt);
  EXPECT_EQ(ParseRate("12x"), std::nullopt);
  EXPECT_EQ(ParseRate(""), std::nullopt);
  EXPECT_EQ(ParseRate("nan"), std::nullopt);
}

}  // namespace
}  // namespace gpuprof::analysis
