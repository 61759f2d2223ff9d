#include "analysis/flops.h"

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

TEST(Flops, MfuUnknownSaysWhy) {
  RunBuilder cpu;
  cpu.Steps(5, StepShape{}).Flops(1e12, "bf16").Cpu();
  EXPECT_EQ(ComputeMfu(BuildRunView(cpu.Build())).reason, "MFU unknown: CPU run");

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
