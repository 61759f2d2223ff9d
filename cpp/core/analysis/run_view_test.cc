#include "analysis/run_view.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "analysis/test_runs.h"

namespace gpuprof::analysis {
namespace {

using testing::kMs;
using testing::RunBuilder;
using testing::StepShape;

StepShape Dur(int64_t ms) {
  StepShape s;
  s.duration_ns = ms * kMs;
  return s;
}

TEST(RunView, PercentileInterpolatesLinearly) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 1.0), 4);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.99), 3 + 0.97);  // rank 2.97
  EXPECT_DOUBLE_EQ(Percentile({7}, 0.99), 7);
  EXPECT_EQ(Median({}), std::nullopt);
  EXPECT_DOUBLE_EQ(*Median({5, 1, 3}), 3);
}

TEST(RunView, EmptyRunHasNoStatistics) {
  RunBuilder b;
  b.run().end_ns.reset();
  const RunView v = BuildRunView(b.Build());
  EXPECT_EQ(v.step_count(), 0u);
  EXPECT_FALSE(v.all);
  EXPECT_FALSE(v.steady);
  EXPECT_FALSE(v.breakdown.wait_fraction);
  EXPECT_FALSE(v.duration_ns);
}

TEST(RunView, SteadyStateSkipsThreeWarmupStepsWhenEnoughRemain) {
  RunBuilder b;
  b.Step(Dur(1000)).Step(Dur(500)).Step(Dur(300)).Steps(3, Dur(100));
  const RunView v = BuildRunView(b.Build());
  ASSERT_EQ(v.step_count(), kWarmupSteps + kMinSteadySteps);
  EXPECT_EQ(v.steady_begin, kWarmupSteps);
  ASSERT_TRUE(v.steady);
  EXPECT_EQ(v.steady->count, 3u);
  EXPECT_DOUBLE_EQ(v.steady->p50_ns, 100.0 * kMs);
  EXPECT_DOUBLE_EQ(v.all->mean_ns, (1000.0 + 500 + 300 + 300) / 6 * kMs);
}

TEST(RunView, ShortRunsSkipOnlyStepZero) {
  RunBuilder b;
  b.Step(Dur(1000)).Steps(4, Dur(100));
  const RunView v = BuildRunView(b.Build());
  EXPECT_EQ(v.steady_begin, 1u);
  EXPECT_EQ(v.steady->count, 4u);
  EXPECT_DOUBLE_EQ(v.steady->mean_ns, 100.0 * kMs);

  RunBuilder one;
  one.Step(Dur(100));
  const RunView single = BuildRunView(one.Build());
  EXPECT_EQ(single.steady_count(), 0u);
  EXPECT_FALSE(single.steady);
  EXPECT_TRUE(single.all);
}

TEST(RunView, StepsAreSortedAndTileTheTimeline) {
  RunBuilder b;
  b.Steps(4, Dur(100));
  store::RunData d = b.Build();
  std::swap(d.steps[0], d.steps[3]);
  const RunView v = BuildRunView(std::move(d));
  for (size_t i = 0; i < v.steps.size(); ++i) {
    EXPECT_EQ(v.steps[i].step, static_cast<int64_t>(i));
    EXPECT_EQ(v.steps[i].duration_ns, 100 * kMs);
    if (i) {
      EXPECT_EQ(v.steps[i].start_ns, v.steps[i - 1].end_ns);
    }
  }
}

TEST(RunView, BreakdownUsesSteadyStepsAndSkipsUnmeasuredWait) {
  // Steps 0-2 wait 90 ms (explicit, measured) but are warmup; steady steps wait 20 of 100 ms,
  // except one steady step whose wait was not measured.
  RunBuilder b;
  StepShape warm;
  warm.wait_ns = 90 * kMs;
  warm.wait_source = "explicit";
  warm.phases = {};
  StepShape steady;
  steady.wait_ns = 20 * kMs;
  StepShape unmeasured;
  unmeasured.wait_ns.reset();
  b.Steps(3, warm).Steps(5, steady).Step(unmeasured);
  const RunView v = BuildRunView(b.Build());
  const Breakdown& br = v.breakdown;
  EXPECT_EQ(br.wait_steps, 5u);
  ASSERT_TRUE(br.wait_fraction);
  EXPECT_DOUBLE_EQ(*br.wait_fraction, 20.0 / 100.0);
  EXPECT_EQ(br.wait_source, "gap");
  // forward/backward/optimizer summed over the 6 steady steps.
  ASSERT_EQ(br.phases.size(), 3u);
  EXPECT_EQ(br.phases[0].name, "forward");
  EXPECT_DOUBLE_EQ(br.phases[0].wall_fraction, 30.0 / 100.0);
  EXPECT_DOUBLE_EQ(br.phases[1].wall_fraction, 50.0 / 100.0);
  // Other = 100 - 20 - 90 = -10 ms (this shape over-fills the step): negative is kept.
  ASSERT_TRUE(br.other_fraction);
  EXPECT_DOUBLE_EQ(*br.other_fraction, -10.0 / 100.0);
  EXPECT_EQ(br.other_steps, 5u);
}

TEST(RunView, CanonicalPhasesComeFirstThenFirstAppearance) {
  RunBuilder b;
  StepShape s;
  s.phases = {{"zeta", 1 * kMs, std::nullopt},
              {"optimizer", 1 * kMs, std::nullopt},
              {"alpha", 1 * kMs, std::nullopt},
              {"forward", 1 * kMs, 2 * kMs}};
  b.Steps(3, s);
  const RunView v = BuildRunView(b.Build());
  std::vector<std::string> names;
  for (const auto& p : v.breakdown.phases) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"forward", "optimizer", "zeta", "alpha"}));
  EXPECT_EQ(v.breakdown.phases[0].gpu_steps, 2u);
  EXPECT_DOUBLE_EQ(*v.breakdown.phases[0].gpu_mean_ns, 2.0 * kMs);
  EXPECT_FALSE(v.breakdown.phases[1].gpu_mean_ns);
}

// The phase named `name` of step `step`, or null.
const PhaseTime* PhaseOf(const RunView& v, size_t step, const std::string& name) {
  for (const PhaseTime& p : v.steps.at(step).phases) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

TEST(RunView, CommBucketsBecomeACommPhaseTakenOutOfBackward) {
  // GIVEN 8 steps of 100 ms (forward 30, backward 50, optimizer 10) whose DDP buckets are ready
  // at 40, 55 and 70 ms into the step, the collectives finishing at 60, 72 and 82 ms
  RunBuilder b;
  b.Steps(8, StepShape{});
  for (const auto& s : b.steps()) {
    if (s.step == 5) continue;  // a step without bucket rows
    b.CommBucket(s.step, 0, s.start_ns + 40 * kMs, s.start_ns + 60 * kMs);
    b.CommBucket(s.step, 1, s.start_ns + 55 * kMs, s.start_ns + 72 * kMs);
    b.CommBucket(s.step, 2, s.start_ns + 70 * kMs, s.start_ns + 82 * kMs);
  }
  b.CommBucket(99, 0, 0, kMs);  // buckets of a step that was never closed: ignored
  const RunView v = BuildRunView(b.Build());
  // THEN each step with buckets has a derived comm phase: the last bucket was ready at 70 ms and
  // the collectives were done at 82 ms, 12 ms exposed, which backward no longer counts
  const PhaseTime* comm = PhaseOf(v, 4, "comm");
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->wall_ns, 12 * kMs);
  EXPECT_EQ(comm->calls, 3);
  EXPECT_TRUE(comm->derived);
  EXPECT_FALSE(comm->gpu_ns);  // unknown, not 0
  EXPECT_EQ(PhaseOf(v, 4, "backward")->wall_ns, 38 * kMs);
  EXPECT_EQ(v.steps[4].phase_wall_ns, 90 * kMs);  // the phases still sum to the same
  // AND a step without bucket rows is left as recorded
  EXPECT_EQ(PhaseOf(v, 5, "comm"), nullptr);
  EXPECT_EQ(PhaseOf(v, 5, "backward")->wall_ns, 50 * kMs);
  // AND the breakdown lists comm after the recorded phases, marked derived, over its 4 steps
  const Breakdown& br = v.breakdown;
  ASSERT_EQ(br.phases.size(), 4u);
  EXPECT_EQ(br.phases[3].name, "comm");
  EXPECT_TRUE(br.phases[3].derived);
  EXPECT_FALSE(br.phases[1].derived);
  EXPECT_EQ(br.phases[3].steps, 4u);
  EXPECT_DOUBLE_EQ(br.phases[3].wall_fraction, 4 * 12.0 / (5 * 100.0));
  EXPECT_DOUBLE_EQ(br.phases[1].wall_fraction, (4 * 38.0 + 50) / (5 * 100.0));
}

TEST(RunView, DerivedCommIsClippedToBackwardAndNeverNegative) {
  RunBuilder b;
  StepShape s;
  s.phases = {{"forward", 30 * kMs, std::nullopt}, {"backward", 8 * kMs, 6 * kMs}};
  StepShape no_backward;
  no_backward.phases = {{"forward", 30 * kMs, std::nullopt}};
  b.Step(s).Step(s).Step(no_backward);
  // Step 0: 12 ms exposed but backward is 8 ms long: clipped to 8, backward left with 0.
  b.CommBucket(0, 0, 10 * kMs, 20 * kMs).CommBucket(0, 1, 20 * kMs, 32 * kMs);
  // Step 1: the bucket's end reads before its start: an exposed time below 0 reads 0.
  b.CommBucket(1, 0, 100 * kMs + 50 * kMs, 100 * kMs + 45 * kMs);
  // Step 2: no backward phase: the whole exposed time, nothing taken from elsewhere.
  b.CommBucket(2, 0, 200 * kMs + 10 * kMs, 200 * kMs + 25 * kMs);
  const RunView v = BuildRunView(b.Build());
  EXPECT_EQ(PhaseOf(v, 0, "comm")->wall_ns, 8 * kMs);
  EXPECT_EQ(PhaseOf(v, 0, "backward")->wall_ns, 0);
  EXPECT_EQ(PhaseOf(v, 0, "backward")->gpu_ns, 6 * kMs);  // GPU time is left as recorded
  EXPECT_EQ(v.steps[0].phase_wall_ns, 38 * kMs);
  EXPECT_EQ(PhaseOf(v, 1, "comm")->wall_ns, 0);
  EXPECT_EQ(PhaseOf(v, 1, "backward")->wall_ns, 8 * kMs);
  EXPECT_EQ(PhaseOf(v, 2, "comm")->wall_ns, 15 * kMs);
  EXPECT_EQ(v.steps[2].phase_wall_ns, 45 * kMs);
}

TEST(RunView, ARecordedCommPhaseWinsOverTheBuckets) {
  RunBuilder b;
  StepShape s;
  s.phases = {{"backward", 50 * kMs, std::nullopt}, {"comm", 7 * kMs, std::nullopt}};
  b.Step(s);
  b.CommBucket(0, 0, 10 * kMs, 40 * kMs);
  const RunView v = BuildRunView(b.Build());
  ASSERT_EQ(v.steps[0].phases.size(), 2u);
  EXPECT_EQ(PhaseOf(v, 0, "comm")->wall_ns, 7 * kMs);
  EXPECT_FALSE(PhaseOf(v, 0, "comm")->derived);
  EXPECT_EQ(PhaseOf(v, 0, "backward")->wall_ns, 50 * kMs);
}

TEST(RunView, DurationFromRunEndElseLastStep) {
  RunBuilder b;
  b.Steps(3, Dur(100));
  b.run().end_ns = 400 * kMs;
  EXPECT_EQ(BuildRunView(b.Build()).duration_ns, 400 * kMs);
  b.run().end_ns.reset();
  const RunView v = BuildRunView(b.Build());
  EXPECT_EQ(v.duration_ns, 300 * kMs);
  EXPECT_TRUE(v.duration_from_steps);
}

TEST(RunView, GpuAndHostAggregatesIgnoreNulls) {
  RunBuilder b;
  store::GpuSampleRow s1;
  s1.ts_ns = 1;
  s1.util_pct = 80;
  s1.mem_used_bytes = 40;
  s1.mem_total_bytes = 100;
  s1.temp_c = 60;
  s1.power_mw = 300000;
  store::GpuSampleRow s2;
  s2.ts_ns = 2;
  s2.gpu_index = 1;
  s2.util_pct = 40;
  s2.mem_used_bytes = 90;
  s2.mem_total_bytes = 100;
  store::GpuSampleRow s3;  // everything unmeasured
  s3.ts_ns = 3;
  b.GpuSample(s1).GpuSample(s2).GpuSample(s3);
  store::HostSampleRow h1;
  h1.cpu_pct = 50;
  h1.ncores = 16;
  store::HostSampleRow h2;
  h2.cpu_pct = 70;
  h2.swap_in_bps = 2e6;
  b.HostSample(h1).HostSample(h2);
  const RunView v = BuildRunView(b.Build());
  EXPECT_EQ(v.gpu.samples, 3u);
  EXPECT_EQ(v.gpu.gpus_sampled, 2u);
  EXPECT_DOUBLE_EQ(*v.gpu.mean_util_pct, 60);
  EXPECT_DOUBLE_EQ(*v.gpu.peak_mem_used_bytes, 90);
  EXPECT_DOUBLE_EQ(*v.gpu.peak_mem_fraction, 0.9);
  EXPECT_DOUBLE_EQ(*v.gpu.max_temp_c, 60);
  EXPECT_DOUBLE_EQ(*v.gpu.mean_power_w, 300);
  EXPECT_FALSE(v.gpu.max_pcie_rx_bps);
  EXPECT_EQ(v.host.samples, 2u);
  EXPECT_DOUBLE_EQ(*v.host.mean_cpu_pct, 60);
  EXPECT_DOUBLE_EQ(*v.host.ncores, 16);
  EXPECT_DOUBLE_EQ(*v.host.max_swap_in_bps, 2e6);
  EXPECT_FALSE(v.host.mean_disk_read_bps);
}

TEST(RunView, GpuAggregatesFromRollupsEqualThoseOfTheRawSamples) {
  // GIVEN 2 GPUs sampled at 100 Hz for 5.5 s with readings that vary every sample and are
  // sometimes missing (util every 7th, power every 5th, PCIe once a second)
  RunBuilder b;
  b.GpuInfo(0, 80LL << 30, 1980).GpuInfo(1, 80LL << 30, 1980);
  double util_sum = 0, power_sum = 0, util_max = -1, rx_max = -1, temp_max = -1;
  int64_t util_n = 0, power_n = 0, n = 0, clock_min = 1 << 30, used_max = 0;
  for (int i = 0; i <= 550; ++i) {
    for (int64_t g = 0; g < 2; ++g) {
      store::GpuSampleRow s;
      s.ts_ns = i * 10 * kMs;
      s.gpu_index = g;
      ++n;
      if (i % 7 != 0) {
        s.util_pct = (i * 37 + g * 11) % 101;
        util_sum += *s.util_pct;
        util_max = std::max(util_max, *s.util_pct);
        ++util_n;
      }
      if (i % 5 != 0) {
        s.power_mw = 100'000 + (i * 7919 + g) % 600'000;
        power_sum += *s.power_mw / 1000.0;
        ++power_n;
      }
      s.mem_used_bytes = (30LL << 30) + ((i * 104729 + g * 7) % 1000) * (1LL << 20);
      used_max = std::max(used_max, *s.mem_used_bytes);
      s.mem_total_bytes = 80LL << 30;
      s.temp_c = 60 + (i * 13 + g) % 25;
      temp_max = std::max(temp_max, *s.temp_c);
      s.sm_clock_mhz = 1400 + (i * 31 + g) % 580;
      clock_min = std::min(clock_min, *s.sm_clock_mhz);
      if (i % 100 == 0) {
        s.pcie_rx_bps = 1e9 * ((i / 100 + g) % 7);
        rx_max = std::max(rx_max, *s.pcie_rx_bps);
      }
      b.GpuSample(s);
    }
  }
  // WHEN the view is built (from the per-second rollups)
  const RunView v = BuildRunView(b.Build());
  EXPECT_EQ(b.Build().gpu_samples_1s.size(), 2u * 6);
  // THEN every aggregate equals the one over the raw samples
  EXPECT_EQ(v.gpu.samples, static_cast<size_t>(n));
  EXPECT_EQ(v.gpu.gpus_sampled, 2u);
  EXPECT_NEAR(*v.gpu.mean_util_pct, util_sum / util_n, 1e-9);
  EXPECT_EQ(*v.gpu.max_util_pct, util_max);
  EXPECT_NEAR(*v.gpu.mean_power_w, power_sum / power_n, 1e-9);
  EXPECT_EQ(*v.gpu.peak_mem_used_bytes, static_cast<double>(used_max));
  EXPECT_DOUBLE_EQ(*v.gpu.peak_mem_fraction, static_cast<double>(used_max) / (80LL << 30));
  EXPECT_EQ(*v.gpu.max_temp_c, temp_max);
  EXPECT_EQ(*v.gpu.min_sm_clock_mhz, clock_min);
  EXPECT_EQ(*v.gpu.max_pcie_rx_bps, rx_max);
}

TEST(RunView, CpuRunDetection) {
  RunBuilder b;
  EXPECT_FALSE(BuildRunView(b.Build()).IsCpuRun());
  b.Cpu();
  EXPECT_TRUE(BuildRunView(b.Build()).IsCpuRun());
  b.run().device_kind.reset();  // unknown device and no GPU seen
  EXPECT_TRUE(BuildRunView(b.Build()).IsCpuRun());
  b.run().gpu_model = "NVIDIA L4";
  EXPECT_FALSE(BuildRunView(b.Build()).IsCpuRun());
}

}  // namespace
}  // namespace gpuprof::analysis
