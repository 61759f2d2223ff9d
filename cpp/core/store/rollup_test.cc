// Tests of the telemetry rollups (store/rollup.h): exact aggregates from scripted samples,
// NULL handling, throttled-sample counting, row boundaries.
#include "store/rollup.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace gpuprof::store {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSec = 1'000'000'000;

GpuSampleRow Sample(int64_t ts, int64_t gpu = 0) {
  GpuSampleRow s;
  s.ts_ns = ts;
  s.gpu_index = gpu;
  return s;
}

TEST(RollupStart, FloorsToTheWidthAlsoBelowZero) {
  EXPECT_EQ(RollupStart(0, kSec), 0);
  EXPECT_EQ(RollupStart(999 * kMs, kSec), 0);
  EXPECT_EQ(RollupStart(kSec, kSec), kSec);
  EXPECT_EQ(RollupStart(25 * kSec + 1, kWorkerRollupNs), 20 * kSec);
  EXPECT_EQ(RollupStart(-1, kSec), -kSec);
}

TEST(GpuRollup, ExactAggregatesOfOneSecond) {
  // GIVEN four samples of GPU 0 in second 0 (one field missing in some) and one in second 1
  GpuRollup rollup;
  std::vector<GpuRollupRow> out;
  const double utils[] = {10, 20, 30};
  for (int i = 0; i < 4; ++i) {
    GpuSampleRow s = Sample(i * 250 * kMs);
    if (i < 3) s.util_pct = utils[i];
    s.mem_util_pct = 5.0 * (i + 1);            // 5 10 15 20 -> mean 12.5
    s.mem_used_bytes = int64_t{10 + i} << 30;  // max 13 GiB
    s.mem_total_bytes = int64_t{80} << 30;
    if (i != 1) s.proc_mem_bytes = int64_t{i} << 30;  // 0, 2, 3 GiB -> max 3 GiB
    s.power_mw = 100'000 * (i + 1);                   // mean 250 W, max 400 W
    s.temp_c = 60.0 + i;                              // max 63
    s.sm_clock_mhz = 1900 + 10 * i;                   // 1900..1930
    s.clock_reasons = int64_t{1} << i;                // OR 0xf
    if (i % 2 == 0) {
      s.pcie_rx_bps = i == 0 ? 25e9 : 5e9;  // two readings: mean 15 GB/s, one above 20 GB/s
      s.pcie_tx_bps = 1e9 * (i + 1);        // max 3 GB/s
    }
    rollup.Add(s, &out);
  }
  EXPECT_TRUE(out.empty());  // the second is still open
  GpuSampleRow next = Sample(kSec + 3 * kMs);
  next.util_pct = 99;
  rollup.Add(next, &out);
  // THEN second 0 is emitted once a sample of second 1 arrives
  ASSERT_EQ(out.size(), 1u);
  const GpuRollupRow& r = out[0];
  EXPECT_EQ(r.ts_ns, 0);
  EXPECT_EQ(r.gpu_index, 0);
  EXPECT_EQ(r.samples, 4);
  EXPECT_EQ(r.util_samples, 3);
  EXPECT_EQ(r.util_mean_pct, 20.0);
  EXPECT_EQ(r.util_min_pct, 10.0);
  EXPECT_EQ(r.util_max_pct, 30.0);
  EXPECT_EQ(r.mem_util_mean_pct, 12.5);
  EXPECT_EQ(r.mem_used_max_bytes, int64_t{13} << 30);
  EXPECT_EQ(r.mem_total_bytes, int64_t{80} << 30);
  EXPECT_EQ(r.proc_mem_max_bytes, int64_t{3} << 30);
  EXPECT_EQ(r.power_samples, 4);
  EXPECT_EQ(r.power_mean_mw, 250'000.0);
  EXPECT_EQ(r.power_max_mw, 400'000);
  EXPECT_EQ(r.temp_max_c, 63.0);
  EXPECT_EQ(r.sm_clock_min_mhz, 1900);
  EXPECT_EQ(r.sm_clock_max_mhz, 1930);
  EXPECT_EQ(r.clock_reasons_or, 0xf);
  EXPECT_EQ(r.pcie_rx_samples, 2);
  EXPECT_EQ(r.pcie_rx_mean_bps, 15e9);
  EXPECT_EQ(r.pcie_rx_max_bps, 25e9);
  EXPECT_EQ(r.pcie_rx_high_samples, 1);
  EXPECT_EQ(r.pcie_tx_max_bps, 3e9);
  // AND the end of the run flushes the open second
  rollup.Flush(&out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].ts_ns, kSec);
  EXPECT_EQ(out[1].samples, 1);
  EXPECT_EQ(out[1].util_mean_pct, 99.0);
  // AND a second flush has nothing left
  rollup.Flush(&out);
  EXPECT_EQ(out.size(), 2u);
}

TEST(GpuRollup, UnmeasuredStaysNullAndZeroStaysZero) {
  GpuRollup rollup;
  std::vector<GpuRollupRow> out;
  // GIVEN second 0: two samples without any reading, and a NaN utilization
  rollup.Add(Sample(0), &out);
  GpuSampleRow nan = Sample(10 * kMs);
  nan.util_pct = std::numeric_limits<double>::quiet_NaN();
  rollup.Add(nan, &out);
  // AND second 1: one sample reading 0 everywhere
  GpuSampleRow zero{kSec, 0, 0.0, 0.0, 0, 0, 0, 0, 0.0, 0, 0, 0.0, 0.0};
  rollup.Add(zero, &out);
  rollup.Flush(&out);
  ASSERT_EQ(out.size(), 2u);
  // THEN second 0 counts its samples but has no aggregate (NaN is no reading)
  const GpuRollupRow& n = out[0];
  EXPECT_EQ(n.samples, 2);
  EXPECT_EQ(n.util_samples + n.power_samples + n.thermal_samples + n.pcie_rx_samples, 0);
  EXPECT_FALSE(n.util_mean_pct || n.util_min_pct || n.util_max_pct || n.mem_util_mean_pct ||
               n.mem_used_max_bytes || n.mem_total_bytes || n.proc_mem_max_bytes ||
               n.power_mean_mw || n.power_max_mw || n.temp_max_c || n.sm_clock_min_mhz ||
               n.sm_clock_max_mhz || n.clock_reasons_or || n.throttled_temp_max_c ||
               n.throttled_sm_clock_min_mhz || n.pcie_rx_mean_bps || n.pcie_rx_max_bps ||
               n.pcie_tx_max_bps);
  // AND second 1's zeros are measurements
  const GpuRollupRow& z = out[1];
  EXPECT_EQ(z.util_samples, 1);
  EXPECT_EQ(z.util_mean_pct, 0.0);
  EXPECT_EQ(z.mem_util_mean_pct, 0.0);
  EXPECT_EQ(z.mem_used_max_bytes, 0);
  EXPECT_EQ(z.power_samples, 1);
  EXPECT_EQ(z.power_mean_mw, 0.0);
  EXPECT_EQ(z.temp_max_c, 0.0);
  EXPECT_EQ(z.sm_clock_min_mhz, 0);
  EXPECT_EQ(z.clock_reasons_or, 0);
  EXPECT_EQ(z.thermal_samples, 1);  // the reasons (0) were read
  EXPECT_EQ(z.throttled_samples, 0);
  EXPECT_EQ(z.pcie_rx_samples, 1);
  EXPECT_EQ(z.pcie_rx_mean_bps, 0.0);
  EXPECT_EQ(z.pcie_rx_high_samples, 0);
}

TEST(GpuRollup, CountsThrottledSamplesByReasonAndByHeatWithALowClock) {
  // GIVEN a GPU whose maximum SM clock is 1980 MHz (85% of it: 1683 MHz)
  GpuRollup rollup;
  rollup.SetMaxClock(0, 1980);
  std::vector<GpuRollupRow> out;
  auto add = [&](int i, std::optional<double> temp, std::optional<int64_t> clock,
                 std::optional<int64_t> reasons) {
    GpuSampleRow s = Sample(i * 10 * kMs);
    s.temp_c = temp;
    s.sm_clock_mhz = clock;
    s.clock_reasons = reasons;
    rollup.Add(s, &out);
  };
  add(0, 85, 1400, std::nullopt);          // hot and slow: throttled
  add(1, 85, 1700, std::nullopt);          // hot, clock only 14% down: not
  add(2, 82, 1200, std::nullopt);          // 82 °C is not above 82: not
  add(3, 60, 1980, 0x40);                  // HW thermal slowdown bit: throttled, by reason
  add(4, 88, 1300, 0x20 | 0x4);            // both: throttled once, by reason
  add(5, 70, 1500, 0x4);                   // power cap only, cool: judged, not throttled
  add(6, 95, std::nullopt, std::nullopt);  // no clock and no reasons: cannot be judged
  rollup.Flush(&out);
  ASSERT_EQ(out.size(), 1u);
  const GpuRollupRow& r = out[0];
  EXPECT_EQ(r.samples, 7);
  EXPECT_EQ(r.thermal_samples, 6);
  EXPECT_EQ(r.throttled_samples, 3);
  EXPECT_EQ(r.throttled_by_reason_samples, 2);
  EXPECT_EQ(r.throttled_temp_max_c, 88.0);        // over throttled samples only (not 95)
  EXPECT_EQ(r.throttled_sm_clock_min_mhz, 1300);  // over throttled samples only (not 1200)
  EXPECT_EQ(r.temp_max_c, 95.0);
  EXPECT_EQ(r.sm_clock_min_mhz, 1200);
  EXPECT_EQ(r.clock_reasons_or, 0x64);
}

TEST(GpuRollup, WithoutAMaxClockUsesTheHighestSeenSoFar) {
  GpuRollup rollup;
  std::vector<GpuRollupRow> out;
  auto add = [&](int i, double temp, int64_t clock) {
    GpuSampleRow s = Sample(i * 10 * kMs, 3);
    s.temp_c = temp;
    s.sm_clock_mhz = clock;
    rollup.Add(s, &out);
  };
  add(0, 90, 1400);  // its own clock is the highest yet: judged, not throttled
  add(1, 70, 1980);
  add(2, 90, 1400);  // now 29% below 1980: throttled
  rollup.Flush(&out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].gpu_index, 3);
  EXPECT_EQ(out[0].thermal_samples, 3);
  EXPECT_EQ(out[0].throttled_samples, 1);
}

TEST(GpuRollup, KeepsOneOpenSecondPerGpu) {
  GpuRollup rollup;
  std::vector<GpuRollupRow> out;
  // GIVEN two GPUs sampled together, then GPU 1 alone in second 1, then GPU 0 in second 2
  for (int64_t g : {0, 1}) {
    GpuSampleRow s = Sample(500 * kMs, g);
    s.util_pct = 10.0 * (g + 1);
    rollup.Add(s, &out);
  }
  rollup.Add(Sample(kSec + kMs, 1), &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].gpu_index, 1);
  EXPECT_EQ(out[0].ts_ns, 0);
  // A late sample of second 0 for GPU 1 counts into its open row (second 1).
  rollup.Add(Sample(900 * kMs, 1), &out);
  rollup.Add(Sample(2 * kSec, 0), &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].gpu_index, 0);
  EXPECT_EQ(out[1].util_mean_pct, 10.0);
  rollup.Flush(&out);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2].gpu_index, 0);  // flushed in gpu_index order
  EXPECT_EQ(out[2].ts_ns, 2 * kSec);
  EXPECT_EQ(out[3].gpu_index, 1);
  EXPECT_EQ(out[3].ts_ns, kSec);
  EXPECT_EQ(out[3].samples, 2);
}

TEST(RollupGpuSamples, SortsByTimeAndTakesMaxClocksFromTheGpusRows) {
  std::vector<GpuSampleRow> samples;
  for (int i = 9; i >= 0; --i) {  // given in reverse
    GpuSampleRow s = Sample(i * 300 * kMs, i % 2);
    s.temp_c = 90;
    s.sm_clock_mhz = 1000;
    samples.push_back(s);
  }
  const auto rows =
      RollupGpuSamples(samples, {GpuInfoRow{0, std::nullopt, std::nullopt, std::nullopt, 1980}});
  ASSERT_EQ(rows.size(), 6u);  // seconds 0..2 for two GPUs
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_LE(std::make_pair(rows[i - 1].ts_ns, rows[i - 1].gpu_index),
              std::make_pair(rows[i].ts_ns, rows[i].gpu_index));
  }
  int64_t throttled0 = 0, throttled1 = 0, total = 0;
  for (const auto& r : rows) {
    total += r.samples;
    (r.gpu_index == 0 ? throttled0 : throttled1) += r.throttled_samples;
  }
  EXPECT_EQ(total, 10);
  EXPECT_EQ(throttled0, 5);  // 1000 MHz is far below GPU 0's 1980 MHz
  EXPECT_EQ(throttled1, 0);  // GPU 1 has no max: 1000 MHz is the highest it ever read
}

TEST(WorkerRollup, AggregatesPerProcessAndTenSecondWindow) {
  WorkerRollup rollup;
  std::vector<WorkerRollupRow> out;
  // GIVEN the main process and one worker sampled every 2 s from 0 to 10 s; the worker has no
  // CPU reading at t = 0 (its first tick) and becomes pid 301 after a restart at 6 s
  for (int64_t t = 0; t <= 10; t += 2) {
    rollup.Add(WorkerSampleRow{t * kSec, 100, "main", 100.0 + t, int64_t{4} << 30}, &out);
    const int64_t pid = t < 6 ? 300 : 301;
    std::optional<double> cpu = t == 0 ? std::nullopt : std::optional<double>(10.0 * t);
    rollup.Add(WorkerSampleRow{t * kSec, pid, "child", cpu, (int64_t{1} << 30) + t}, &out);
  }
  // THEN window 0 closed when the 10 s samples arrived: one row per pid, by pid
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].pid, 100);
  EXPECT_EQ(out[0].ts_ns, 0);
  EXPECT_EQ(out[0].role, "main");
  EXPECT_EQ(out[0].samples, 5);
  EXPECT_EQ(out[0].cpu_samples, 5);
  EXPECT_EQ(out[0].cpu_mean_pct, 104.0);  // 100, 102, ..., 108
  EXPECT_EQ(out[0].cpu_max_pct, 108.0);
  EXPECT_EQ(out[1].pid, 300);
  EXPECT_EQ(out[1].samples, 3);
  EXPECT_EQ(out[1].cpu_samples, 2);      // t = 0 had no reading
  EXPECT_EQ(out[1].cpu_mean_pct, 30.0);  // 20, 40
  EXPECT_EQ(out[1].rss_max_bytes, (int64_t{1} << 30) + 4);
  EXPECT_EQ(out[2].pid, 301);
  EXPECT_EQ(out[2].samples, 2);
  EXPECT_EQ(out[2].cpu_mean_pct, 70.0);  // 60, 80
  rollup.Flush(&out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[3].ts_ns, 10 * kSec);
  EXPECT_EQ(out[4].pid, 301);
  EXPECT_EQ(out[4].cpu_mean_pct, 100.0);
}

TEST(WorkerRollup, AProcessWithoutReadingsHasNullAggregates) {
  const auto rows =
      RollupWorkerSamples({WorkerSampleRow{0, 7, "child", std::nullopt, std::nullopt},
                           WorkerSampleRow{kSec, 7, "child", std::nullopt, std::nullopt}});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].samples, 2);
  EXPECT_EQ(rows[0].cpu_samples, 0);
  EXPECT_FALSE(rows[0].cpu_mean_pct || rows[0].cpu_max_pct || rows[0].rss_max_bytes);
}

}  // namespace
}  // namespace gpuprof::store
