// Compute, memory and thermal rules that read GPU telemetry, phase GPU times and the kernels
// table: firing scenarios, near misses, and "not evaluated" when an input is missing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "analysis/format.h"
#include "analysis/rule_test_util.h"

namespace gpuprof::analysis {
namespace {

using testing::Eval;
using ::testing::HasSubstr;
using testing::kMs;
using testing::kSec;
using testing::RunBuilder;
using testing::Split;
using testing::StepShape;

// ---------------------------------------------------------------- small_batch

RunBuilder Busy(double mfu, std::optional<double> util) {
  RunBuilder b;
  b.Steps(20, StepShape{});  // 100 ms steps
  b.Flops(mfu * 989e12 * 0.100, "bf16");
  if (util) b.GpuEvery(10 * kMs, [&](int64_t, store::GpuSampleRow& g) { g.util_pct = util; });
  return b;
}

TEST(SmallBatch, FiresWhenBusyButLowMfu) {
  const RuleResult r = Eval("small_batch", Busy(0.124, 87));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "The GPU is busy 87% of the time yet MFU is only " + FormatPercent(0.124, 1) +
                ": it runs many small or memory-bound kernels instead of large matmuls");
}

TEST(SmallBatch, NearMisses) {
  EXPECT_FALSE(Eval("small_batch", Busy(0.124, 55)).fired());  // not busy: starved, not small
  EXPECT_FALSE(Eval("small_batch", Busy(0.26, 90)).fired());   // MFU fine
  EXPECT_FALSE(Eval("small_batch", Busy(0.26, 90)).skipped());
}

TEST(SmallBatch, NotEvaluatedWithoutMfuOrUtilization) {
  RunBuilder no_flops = Busy(0.1, 90);
  no_flops.run().flops_per_step.reset();
  EXPECT_THAT(*Eval("small_batch", no_flops).not_evaluated, HasSubstr("MFU unknown"));
  EXPECT_EQ(*Eval("small_batch", Busy(0.1, std::nullopt)).not_evaluated,
            "GPU utilization not sampled");
}

// ---------------------------------------------------------------- gradient_checkpointing_detected

// 20 steps with forward / backward GPU times (ms) and an optional config.
RunBuilder Ckpt(std::optional<std::string> config, int64_t fwd_ms, int64_t bwd_ms,
                bool gpu_times = true) {
  RunBuilder b;
  StepShape s;
  s.duration_ns = 150 * kMs;
  auto gpu = [&](int64_t ms) {
    return gpu_times ? std::optional<int64_t>(ms * kMs) : std::nullopt;
  };
  s.phases = {{"forward", 20 * kMs, gpu(fwd_ms)},
              {"backward", 30 * kMs, gpu(bwd_ms)},
              {"optimizer", 5 * kMs, std::nullopt}};
  b.Steps(20, s);
  if (config) b.Config(*config);
  return b;
}

TEST(GradientCheckpointing, FiresMedOnUndeclaredCheckpointing) {
  const RuleResult r =
      Eval("gradient_checkpointing_detected", Ckpt(R"({"grad_checkpoint": false})", 30, 93));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "Backward takes 3.1× forward (GPU time " + FormatDuration(93.0 * kMs) + " vs " +
                FormatDuration(30.0 * kMs) +
                ", medians per step), which implies activation checkpointing, but the run "
                "declares grad_checkpoint=False");
  EXPECT_THAT(r.insight->fix, HasSubstr("grad_checkpoint=True"));
  EXPECT_NE(r.insight->fix, FindRule("gradient_checkpointing_detected")->fix);
}

TEST(GradientCheckpointing, FiresLowWhenDeclaredButNotSeen) {
  const RuleResult r =
      Eval("gradient_checkpointing_detected", Ckpt(R"({"grad_checkpoint": true})", 30, 60));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  EXPECT_THAT(r.insight->message,
              HasSubstr("Backward takes only 2.0× forward (GPU time " + FormatDuration(60.0 * kMs) +
                        " vs " + FormatDuration(30.0 * kMs) +
                        ", medians per step), as without checkpointing, but the run "
                        "declares grad_checkpoint=True"));
}

TEST(GradientCheckpointing, CpuRunUsesWallTimes) {
  // On a CPU run the wall clock is the compute time: forward 20 ms, backward 62 ms.
  RunBuilder b;
  b.Cpu().Config(R"({"grad_checkpoint": false})");
  b.Steps(20, testing::Shape(100, 5, {{"forward", 20}, {"backward", 62}, {"optimizer", 8}}));
  const RuleResult r = Eval("gradient_checkpointing_detected", b);
  ASSERT_TRUE(r.fired());
  EXPECT_THAT(r.insight->message,
              HasSubstr("Backward takes 3.1× forward (CPU time " + FormatDuration(62.0 * kMs) +
                        " vs " + FormatDuration(20.0 * kMs) + ", medians per step)"));
}

TEST(GradientCheckpointing, OneSlowBackwardIsNotARecompute) {
  // GIVEN a CPU run without checkpointing (backward 2× forward) whose backward stalls once,
  // (260 ms instead of 20) in 30 steps: the mean ratio would be 2.8×
  RunBuilder b;
  b.Cpu().Config(R"({"grad_checkpoint": false})");
  b.Steps(15, testing::Shape(100, 5, {{"forward", 10}, {"backward", 20}, {"optimizer", 8}}));
  b.Step(testing::Shape(300, 5, {{"forward", 10}, {"backward", 260}, {"optimizer", 8}}));
  b.Steps(14, testing::Shape(100, 5, {{"forward", 10}, {"backward", 20}, {"optimizer", 8}}));
  // THEN the per-step median (2.0×) decides: no checkpointing claim
  const RuleResult r = Eval("gradient_checkpointing_detected", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(GradientCheckpointing, NearMissesAndTheAmbiguousBand) {
  const char* off = R"({"grad_checkpoint": false, "other": 1})";
  const char* on = R"({"grad_checkpoint": true})";
  EXPECT_FALSE(Eval("gradient_checkpointing_detected", Ckpt(off, 30, 60)).fired());  // 2.0×
  EXPECT_FALSE(Eval("gradient_checkpointing_detected", Ckpt(on, 30, 90)).fired());   // 3.0×
  // 2.5× sits between the bands: neither claim is safe.
  EXPECT_FALSE(Eval("gradient_checkpointing_detected", Ckpt(off, 30, 75)).fired());
  EXPECT_FALSE(Eval("gradient_checkpointing_detected", Ckpt(on, 30, 75)).fired());
  EXPECT_FALSE(Eval("gradient_checkpointing_detected", Ckpt(on, 30, 75)).skipped());
}

TEST(GradientCheckpointing, NotEvaluatedWithoutADeclarationOrGpuTimes) {
  for (std::optional<std::string> config :
       {std::optional<std::string>(), std::optional<std::string>(R"({"sample_hz": 100})"),
        std::optional<std::string>(R"({"grad_checkpoint": "yes"})")}) {
    EXPECT_THAT(*Eval("gradient_checkpointing_detected", Ckpt(config, 30, 93)).not_evaluated,
                HasSubstr("gradient checkpointing not declared"));
  }
  EXPECT_EQ(*Eval("gradient_checkpointing_detected", Ckpt("not json", 30, 93)).not_evaluated,
            "runs.config_json is not a JSON object");
  // On CUDA, CPU-side phase times are launch times: no ratio without CUDA events.
  EXPECT_THAT(*Eval("gradient_checkpointing_detected",
                    Ckpt(R"({"grad_checkpoint": false})", 30, 93, /*gpu_times=*/false))
                   .not_evaluated,
              HasSubstr("CUDA events off"));
}

// ---------------------------------------------------------------- sdpa_suboptimal

RunBuilder Kernels(const std::vector<std::pair<std::string, int64_t>>& ms_per_window) {
  RunBuilder b;
  b.Steps(20, Split(100, 5, 90));
  for (int64_t w = 0; w < 4; ++w) {
    for (const auto& [name, ms] : ms_per_window) {
      b.Kernel(w * kSec, (w + 1) * kSec, name, 100, ms * kMs);
    }
  }
  return b;
}

TEST(SdpaSuboptimal, FiresOnUnfusedAttention) {
  const RuleResult r = Eval("sdpa_suboptimal", Kernels({{"ampere_bf16_s16816gemm", 500},
                                                        {"cunn_SoftMaxForward", 150},
                                                        {"aten::bmm", 250},
                                                        {"elementwise_kernel", 100}}));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "Softmax and bmm kernels take 40% of GPU kernel time (softmax 15%, bmm 25%) and no "
            "fused attention kernel ran: attention is computed unfused");
}

TEST(SdpaSuboptimal, NearMisses) {
  // A flash kernel ran: attention is fused (the bmm is something else).
  EXPECT_FALSE(Eval("sdpa_suboptimal", Kernels({{"gemm", 500},
                                                {"cunn_SoftMaxForward", 150},
                                                {"aten::bmm", 250},
                                                {"flash_fwd_kernel", 100}}))
                   .fired());
  // PyTorch's memory-efficient kernel counts as fused too.
  EXPECT_FALSE(Eval("sdpa_suboptimal", Kernels({{"gemm", 500},
                                                {"softmax", 150},
                                                {"bmm", 250},
                                                {"fmha_cutlassF_bf16_aligned_64x64_rf_sm80", 100}}))
                   .fired());
  // Softmax + bmm only 15% of kernel time.
  EXPECT_FALSE(
      Eval("sdpa_suboptimal", Kernels({{"gemm", 850}, {"softmax", 50}, {"aten::bmm", 100}}))
          .fired());
  // Softmax alone (a classifier head) is not attention.
  EXPECT_FALSE(Eval("sdpa_suboptimal", Kernels({{"gemm", 500}, {"softmax", 500}})).fired());
}

TEST(SdpaSuboptimal, NotEvaluatedWithoutKernelTimings) {
  RunBuilder b;
  b.Steps(5, StepShape{});
  // The reason says how to get the timings.
  EXPECT_EQ(*Eval("sdpa_suboptimal", b).not_evaluated,
            "needs per-kernel GPU times: trace steps with profile(trace_every_n_steps=N), "
            "trace_range=(a, b) or continuous_traces_hz=1.0, or import an Nsight Systems "
            "capture (gpuprof nsys-import)");
  // The session's own reason, when it recorded one, wins (tracing off, CUPTI missing).
  RunBuilder with_status = b;
  with_status.Telemetry("kernels", false, std::nullopt, "CUPTI could not be loaded");
  EXPECT_EQ(*Eval("sdpa_suboptimal", with_status).not_evaluated,
            "needs traced kernels: CUPTI could not be loaded");
  b.Cpu();
  EXPECT_EQ(*Eval("sdpa_suboptimal", b).not_evaluated,
            "needs traced steps: profile(trace_every_n_steps=N) records the CPU operators of a "
            "CPU run");
}

// A CPU run: the traced steps' operators (self CPU time) stand in for kernels.
RunBuilder CpuOps(const std::vector<std::pair<std::string, int64_t>>& ms_per_step) {
  RunBuilder b;
  b.Cpu();
  b.Steps(20, Split(100, 5, 90));
  for (int64_t s = 0; s < 4; ++s) {
    for (const auto& [name, ms] : ms_per_step) {
      b.CpuOp(s * 100 * kMs, (s + 1) * 100 * kMs, s, name, 3, ms * kMs);
    }
  }
  return b;
}

TEST(SdpaSuboptimal, FiresOnTheCpuOperatorsOfACpuRun) {
  const RuleResult r = Eval(
      "sdpa_suboptimal",
      CpuOps({{"aten::addmm", 40}, {"aten::bmm", 35}, {"aten::_softmax", 15}, {"aten::mul", 10}}));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->evidence["basis"], "cpu_ops");
  EXPECT_EQ(r.insight->message,
            "Softmax and bmm operators take 50% of CPU operator self time (softmax 15%, bmm "
            "35%) and no fused attention operator ran: attention is computed unfused");
  // F.scaled_dot_product_attention on inputs its fused kernels refuse (3-D on CPU, fp32 on
  // some GPUs) runs its math path: the message says so.
  const RuleResult math =
      Eval("sdpa_suboptimal", CpuOps({{"aten::addmm", 40},
                                      {"aten::_scaled_dot_product_attention_math", 1},
                                      {"aten::bmm", 35},
                                      {"aten::_softmax", 15}}));
  ASSERT_TRUE(math.fired());
  EXPECT_EQ(math.insight->evidence["sdpa_math_fallback"], true);
  EXPECT_THAT(math.insight->message,
              HasSubstr("(scaled_dot_product_attention fell back to its math path)"));
  // torch's fused CPU attention operator ran: nothing to say.
  EXPECT_FALSE(
      Eval("sdpa_suboptimal", CpuOps({{"aten::addmm", 40},
                                      {"aten::_scaled_dot_product_flash_attention_for_cpu", 50},
                                      {"aten::bmm", 5},
                                      {"aten::_softmax", 5}}))
          .fired());
}

TEST(SdpaSuboptimal, KernelsWinOverCpuOperators) {
  // Both tables (an nsys import into a run that also traced CPU operators): GPU time decides,
  // the two are never summed.
  RunBuilder b = CpuOps({{"aten::bmm", 60}, {"aten::_softmax", 40}});
  for (int64_t w = 0; w < 2; ++w) b.Kernel(w * kSec, (w + 1) * kSec, "sm90_gemm", 10, kSec / 2);
  const RuleResult r = Eval("sdpa_suboptimal", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

// ---------------------------------------------------------------- kernel_drift

// 10 one-second windows: aten::mm takes `mm_first` µs per window in the first five and
// `mm_second` in the last five (100 calls each unless `calls_second` says otherwise), next to a
// steady 200 ms gemm.
RunBuilder Drift(int64_t mm_first_us, int64_t mm_second_us, int64_t calls_second = 100) {
  RunBuilder b;
  b.Steps(20, Split(100, 5, 90));
  for (int64_t w = 0; w < 10; ++w) {
    const bool second = w >= 5;
    b.Kernel(w * kSec, (w + 1) * kSec, "aten::mm", second ? calls_second : 100,
             (second ? mm_second_us : mm_first_us) * 1000);
    b.Kernel(w * kSec, (w + 1) * kSec, "sm90_xmma_gemm", 50, 200 * kMs);
  }
  return b;
}

TEST(KernelDrift, FiresWhenAKernelSlowsDown) {
  const RuleResult r = Eval("kernel_drift", Drift(14'100, 21'300));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "Kernel drift: aten::mm added " + FormatDuration(7.2 * kMs) +
                                    "/window in the second half (" + FormatDuration(14.1 * kMs) +
                                    " → " + FormatDuration(21.3 * kMs) + " per window, +" +
                                    FormatPercent(21.3 / 14.1 - 1) + ")");
  EXPECT_EQ(r.insight->evidence["windows_first_half"], 5);
}

TEST(KernelDrift, NearMisses) {
  EXPECT_FALSE(Eval("kernel_drift", Drift(14'100, 19'700)).fired());  // +40%
  // Twice the calls in twice the time: the loop ran more steps per window, no kernel slowed.
  EXPECT_FALSE(Eval("kernel_drift", Drift(14'100, 28'200, 200)).fired());
  // A tiny kernel tripling adds 0.2 ms to ~200 ms of kernel time per window (< 1%).
  EXPECT_FALSE(Eval("kernel_drift", Drift(100, 300)).fired());
  EXPECT_FALSE(Eval("kernel_drift", Drift(100, 300)).skipped());
}

TEST(KernelDrift, FiresOnCpuOperatorsThatSlowDown) {
  RunBuilder b;
  b.Cpu();
  b.Steps(20, Split(100, 5, 90));
  for (int64_t s = 0; s < 8; ++s) {
    const int64_t mm_ms = s < 4 ? 10 : 30;
    b.CpuOp(s * 100 * kMs, (s + 1) * 100 * kMs, s, "aten::mm", 4, mm_ms * kMs);
    b.CpuOp(s * 100 * kMs, (s + 1) * 100 * kMs, s, "aten::relu", 4, 20 * kMs);
  }
  const RuleResult r = Eval("kernel_drift", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->evidence["basis"], "cpu_ops");
  EXPECT_EQ(r.insight->evidence["kernel"], "aten::mm");
  EXPECT_EQ(r.insight->message, "CPU operator drift: aten::mm added " + FormatDuration(20.0 * kMs) +
                                    "/window in the second half (" + FormatDuration(10.0 * kMs) +
                                    " → " + FormatDuration(30.0 * kMs) + " per window, +" +
                                    FormatPercent(2.0) + ")");
}

TEST(KernelDrift, NotEvaluatedOnTooFewWindows) {
  RunBuilder b;
  b.Steps(5, StepShape{});
  EXPECT_THAT(*Eval("kernel_drift", b).not_evaluated, HasSubstr("needs per-kernel GPU times"));
  for (int64_t w = 0; w < 3; ++w) b.Kernel(w * kSec, (w + 1) * kSec, "aten::mm", 10, kMs);
  EXPECT_EQ(*Eval("kernel_drift", b).not_evaluated,
            "kernel timings cover 3 windows; drift needs at least 2 in each half of the run");
}

// ---------------------------------------------------------------- memory_pressure

RunBuilder Memory(double peak_gib, bool total_in_samples = true) {
  RunBuilder b;
  b.Steps(10, StepShape{});
  b.GpuInfo(0, 80LL << 30, 1980).GpuInfo(1, 80LL << 30, 1980);
  int i = 0;
  b.GpuEvery(
      50 * kMs,
      [&](int64_t, store::GpuSampleRow& g) {
        const bool peak = g.gpu_index == 1 && i++ == 7;
        g.mem_used_bytes = static_cast<int64_t>((peak ? peak_gib : 40.0) * (1LL << 30));
        if (total_in_samples) g.mem_total_bytes = 80LL << 30;
      },
      /*gpus=*/2);
  return b;
}

TEST(MemoryPressure, FiresNearTheDeviceLimit) {
  const RuleResult r = Eval("memory_pressure", Memory(76.1));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "Peak GPU memory use was 76.1 GiB of 80.0 GiB (" +
                                    FormatPercent(76.1 / 80) +
                                    ") on GPU 1: close to out-of-memory, where the allocator "
                                    "frees and retries");
  // The device total may come from the gpus table alone.
  EXPECT_TRUE(Eval("memory_pressure", Memory(76.1, /*total_in_samples=*/false)).fired());
}

TEST(MemoryPressure, NearMiss) {
  const RuleResult r = Eval("memory_pressure", Memory(71.2));  // 89%
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(MemoryPressure, NotEvaluatedWithoutMemoryReadings) {
  RunBuilder b;
  b.Steps(5, StepShape{});
  b.GpuEvery(50 * kMs, [](int64_t, store::GpuSampleRow& g) { g.mem_used_bytes = 1LL << 30; });
  EXPECT_EQ(*Eval("memory_pressure", b).not_evaluated, "GPU memory use and total not sampled");
}

// ---------------------------------------------------------------- thermal_throttling

// 100 samples of GPU 0 (max clock 1980 MHz in the gpus table); the first `hot` of them read
// `temp` °C at `clock` MHz with `reasons`, the rest 70 °C at 1980 MHz with no reasons.
RunBuilder Thermal(int hot, double temp, int64_t clock, std::optional<int64_t> reasons) {
  RunBuilder b;
  b.Steps(10, StepShape{});  // 1 s
  b.GpuInfo(0, 80LL << 30, 1980);
  int i = 0;
  b.GpuEvery(10 * kMs, [&](int64_t, store::GpuSampleRow& g) {
    const bool h = i++ < hot;
    g.temp_c = h ? temp : 70;
    g.sm_clock_mhz = h ? clock : 1980;
    g.clock_reasons = h ? reasons : std::optional<int64_t>(0);
  });
  return b;
}

TEST(ThermalThrottling, FiresOnHeatAndALowClock) {
  const RunBuilder b = Thermal(30, 87, 1410, std::nullopt);
  const size_t n = b.gpu_samples().size();
  const RuleResult r = Eval("thermal_throttling", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "GPU 0 was thermally throttled on " + FormatPercent(30.0 / n) +
                                    " of samples (up to 87 °C; SM clock down to 1410 MHz, " +
                                    FormatPercent(1 - 1410.0 / 1980) + " below its 1980 MHz max)");
}

TEST(ThermalThrottling, FiresHighOnNvmlThermalReasons) {
  const RuleResult r =
      Eval("thermal_throttling", Thermal(60, 78, 1600, thresholds::kNvmlHwThermalSlowdown));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kHigh);
  EXPECT_THAT(r.insight->message, HasSubstr("(NVML reports thermal slowdown; up to 78 °C"));
  EXPECT_TRUE(Eval("thermal_throttling", Thermal(60, 60, 1980, 0x20 | 0x4)).fired());
}

TEST(ThermalThrottling, NearMisses) {
  EXPECT_FALSE(Eval("thermal_throttling", Thermal(30, 87, 1800, 0)).fired());    // clock -9%
  EXPECT_FALSE(Eval("thermal_throttling", Thermal(30, 81, 1200, 0)).fired());    // 81 °C
  EXPECT_FALSE(Eval("thermal_throttling", Thermal(4, 90, 1200, 0x40)).fired());  // 4% of samples
  // A power cap (0x4) slows the clock too, but it is not heat.
  EXPECT_FALSE(Eval("thermal_throttling", Thermal(50, 75, 1300, 0x4)).fired());
  EXPECT_FALSE(Eval("thermal_throttling", Thermal(50, 75, 1300, 0x4)).skipped());
}

TEST(ThermalThrottling, CountsEveryRawSampleOfALongRunThroughTheRollups) {
  // GIVEN 30 s of two GPUs at 50 Hz where every 10th sample of GPU 1 is hot and slow
  RunBuilder b;
  b.Steps(300, StepShape{});  // 30 s
  b.GpuInfo(0, 80LL << 30, 1980).GpuInfo(1, 80LL << 30, 1980);
  int i = 0;
  b.GpuEvery(
      20 * kMs,
      [&](int64_t, store::GpuSampleRow& g) {
        const bool hot = g.gpu_index == 1 && i++ % 10 == 3;
        g.temp_c = hot ? 88 : 70;
        g.sm_clock_mhz = hot ? 1300 : 1980;
      },
      /*gpus=*/2);
  size_t n1 = 0, hot1 = 0;
  for (const auto& s : b.gpu_samples()) {
    if (s.gpu_index != 1) continue;
    ++n1;
    hot1 += *s.temp_c > 82 ? 1 : 0;
  }
  // WHEN the rule reads the per-second rollups
  ASSERT_EQ(b.Build().gpu_samples_1s.size(), 2u * 31);
  const RuleResult r = Eval("thermal_throttling", b);
  // THEN the share is the raw samples' share
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->evidence["throttled_samples"], hot1);
  EXPECT_EQ(r.insight->evidence["samples"], n1);
  EXPECT_EQ(r.insight->message,
            "GPU 1 was thermally throttled on " +
                FormatPercent(static_cast<double>(hot1) / static_cast<double>(n1)) +
                " of samples (up to 88 °C; SM clock down to 1300 MHz, " +
                FormatPercent(1 - 1300.0 / 1980) + " below its 1980 MHz max)");
}

TEST(ThermalThrottling, NotEvaluatedWithoutTemperatureOrReasons) {
  RunBuilder b;
  b.Steps(10, StepShape{});
  b.GpuEvery(10 * kMs, [](int64_t, store::GpuSampleRow& g) {
    g.util_pct = 90;
    g.temp_c = 90;  // a temperature without a clock cannot show a slowdown
  });
  EXPECT_EQ(*Eval("thermal_throttling", b).not_evaluated,
            "GPU temperature with SM clock, or clock-event reasons not sampled");
  // On a CPU run the cause follows the inputs with no stray comma.
  RunBuilder cpu;
  cpu.Cpu().Steps(10, StepShape{});
  EXPECT_EQ(*Eval("thermal_throttling", cpu).not_evaluated,
            "GPU temperature with SM clock, or clock-event reasons not sampled: a CPU run has no "
            "GPU telemetry");
}

}  // namespace
}  // namespace gpuprof::analysis
