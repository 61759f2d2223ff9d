#include "lines/kernel_lines.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "lines/sampler.h"

namespace gpuprof::lines {
namespace {

telemetry::KernelTagTotals Tag(uint64_t tag, uint64_t ns, uint64_t count = 1) {
  telemetry::KernelTagTotals t;
  t.tag = tag;
  t.kernel_count = count;
  t.kernel_ns = ns;
  t.kernel_busy_ns = ns;
  return t;
}

TEST(KernelLineMapTest, LaunchesGoToTheLineTheirIntervalWasChargedTo) {
  KernelLineMap m;
  // GIVEN launches during interval 0 (tag 0) and interval 1 (tag 1)
  EXPECT_EQ(m.CurrentInterval(), 0u);
  m.CloseInterval(/*file*/ 0, /*line*/ 10);  // interval 0 -> line 10
  EXPECT_EQ(KernelLineMap::TagFn(&m), 1u);
  m.CloseInterval(0, 20);  // interval 1 -> line 20
  telemetry::KernelTraceTotals t;
  t.tags = {Tag(0, 300, 2), Tag(1, 50)};
  // WHEN resolved
  m.Resolve(t);
  // THEN each line has its kernels' exact time
  ASSERT_EQ(m.lines().size(), 2u);
  EXPECT_EQ(m.lines().at(KernelLineMap::Key(0, 10)).kernel_ns, 300);
  EXPECT_EQ(m.lines().at(KernelLineMap::Key(0, 10)).kernel_count, 2);
  EXPECT_EQ(m.lines().at(KernelLineMap::Key(0, 20)).kernel_busy_ns, 50);
  EXPECT_EQ(m.unattributed().kernel_ns, 0);
}

TEST(KernelLineMapTest, RecordsOfAnOpenIntervalWaitForItToClose) {
  KernelLineMap m;
  telemetry::KernelTraceTotals early;
  early.tags = {Tag(0, 100)};
  m.Resolve(early);  // interval 0 still open: kept
  EXPECT_TRUE(m.lines().empty());
  m.CloseInterval(3, 7);
  telemetry::KernelTraceTotals more;
  more.tags = {Tag(0, 20)};
  m.Resolve(more);
  EXPECT_EQ(m.lines().at(KernelLineMap::Key(3, 7)).kernel_ns, 120);
  // A final resolve puts what is still open into the unattributed total.
  telemetry::KernelTraceTotals open;
  open.tags = {Tag(1, 9)};
  m.Resolve(open, /*final=*/true);
  EXPECT_EQ(m.unattributed().kernel_ns, 9);
}

TEST(KernelLineMapTest, IntervalsWithoutALineAndLateRecordsAreUnattributed) {
  KernelLineMap m(16);
  m.CloseInterval(-1, 0);                                    // interval 0: no recorded frame
  for (int i = 0; i < 40; ++i) m.CloseInterval(1, 100 + i);  // the ring wraps past 1..
  telemetry::KernelTraceTotals t;
  t.tags = {Tag(0, 5), Tag(2, 7), Tag(40, 11)};
  t.unattributed = Tag(telemetry::kNoTag, 13);
  m.Resolve(t);
  EXPECT_EQ(m.late_records(), 2);  // tags 0 and 2 fell out of the 16-slot ring
  EXPECT_EQ(m.unattributed().kernel_ns, 5 + 7 + 13);
  EXPECT_EQ(m.lines().at(KernelLineMap::Key(1, 139)).kernel_ns, 11);
}

TEST(KernelLineMapTest, TagReadsFromOtherThreadsSeeClosedIntervals) {
  KernelLineMap m;
  std::atomic<bool> stop{false};
  uint64_t last = 0;
  bool monotonic = true;
  std::thread reader([&] {
    while (!stop.load()) {
      uint64_t v = m.CurrentInterval();
      monotonic &= v >= last;
      last = v;
    }
  });
  for (int i = 0; i < 100000; ++i) m.CloseInterval(0, i % 50);
  stop = true;
  reader.join();
  EXPECT_TRUE(monotonic);
  EXPECT_EQ(m.CurrentInterval(), 100000u);
}

}  // namespace
}  // namespace gpuprof::lines

namespace gpuprof::lines {
namespace {

TEST(ApplyKernelTracingTest, ActiveTracerMakesGpuTimeMeasured) {
  GpuSamplingSummary g;
  g.ticks = 4;
  g.util_readings = 4;
  auto s = SummarizeGpuCollection(std::nullopt, "nvml", 1, g, {});
  LineKernelTotals un;
  un.kernel_count = 2;
  un.kernel_ns = 5000;
  ApplyKernelTracing(s, true, std::nullopt, "/x/libcupti.so", 130000, un, 1, {"dropped 3"});
  EXPECT_EQ(s.method, "cupti");
  EXPECT_TRUE(s.time_available);
  EXPECT_TRUE(s.utilization_scope.empty());
  bool measured = false, estimated = false, unattr = false, note = false;
  for (auto& d : s.diagnostics) {
    measured |= d.find("measured kernel time (CUPTI 130000, /x/libcupti.so)") != std::string::npos;
    estimated |= d.rfind("GPU time is estimated", 0) == 0;
    unattr |= d.find("2 kernels (5 us)") != std::string::npos;
    note |= d == "CUPTI: dropped 3";
  }
  EXPECT_TRUE(measured && unattr && note);
  EXPECT_FALSE(estimated);
  // AND the lost records are a warning too, once
  FinishGpuCollection(s, 1, g, {});
  EXPECT_EQ(std::count(s.warnings.begin(), s.warnings.end(), "CUPTI: dropped 3"), 1);
}

TEST(ApplyKernelTracingTest, ActiveTracerAlsoReplacesThePerProcessEstimate) {
  GpuSamplingSummary g;
  g.ticks = 4;
  g.util_readings = 4;
  g.proc_util_readings = 4;
  auto s = SummarizeGpuCollection(std::nullopt, "nvml", 1, g, {});
  ASSERT_EQ(s.utilization_scope, "process");
  ApplyKernelTracing(s, true, std::nullopt, "/x/libcupti.so", 130000, {}, 0, {});
  EXPECT_TRUE(s.utilization_scope.empty());
  for (auto& d : s.diagnostics) EXPECT_NE(d.rfind("GPU time is estimated", 0), 0u) << d;
}

TEST(ApplyKernelTracingTest, FailedTracerKeepsTheEstimateAndSaysWhy) {
  GpuSamplingSummary g;
  g.ticks = 4;
  g.util_readings = 4;
  auto s = SummarizeGpuCollection(std::nullopt, "nvml", 1, g, {});
  ApplyKernelTracing(s, false, std::string("cannot load CUPTI: tried libcupti.so"), "", 0, {}, 0,
                     {});
  EXPECT_EQ(s.method, "nvml-sampled");
  EXPECT_NE(s.diagnostics.back().find("cannot load CUPTI"), std::string::npos);
  EXPECT_NE(s.diagnostics.back().find("estimated"), std::string::npos);
}

}  // namespace
}  // namespace gpuprof::lines

namespace gpuprof::lines {
namespace {

TEST(KernelLineMapTest, LineTagsNameTheirLineDirectly) {
  KernelLineMap m;
  telemetry::KernelTraceTotals t;
  t.tags = {Tag(KernelLineMap::LineTag(2, 41), 700), Tag(0, 1)};
  m.Resolve(t);  // interval 0 is still open: only the line tag resolves now
  EXPECT_EQ(m.lines().at(KernelLineMap::Key(2, 41)).kernel_ns, 700);
  EXPECT_EQ(m.lines().size(), 1u);
}

}  // namespace
}  // namespace gpuprof::lines
