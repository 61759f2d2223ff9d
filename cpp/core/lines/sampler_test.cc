#include "lines/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "clock/clock.h"
#include "lines/kernel_lines.h"
#include "telemetry/mock_collector.h"

namespace gpuprof::lines {
namespace {

TEST(BoundedTimelineTest, KeepsEveryPointUntilFull) {
  BoundedTimeline t(8);
  for (int i = 0; i < 5; ++i) t.Add(i * 10, 100 + i);
  auto p = t.Points();
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0], (std::pair<int64_t, int64_t>{0, 100}));
  EXPECT_EQ(p[4], (std::pair<int64_t, int64_t>{40, 104}));
  EXPECT_EQ(t.samples_per_point(), 1);
}

TEST(BoundedTimelineTest, StaysBoundedSpansTheRunAndKeepsThePeak) {
  // GIVEN a small bound and a long series with one spike in the middle
  BoundedTimeline t(16);
  const int n = 10'000;
  for (int i = 0; i < n; ++i) t.Add(i, i == 5'001 ? 1'000'000 : i % 7);
  // THEN it holds at most the bound (+ the open point), covers start to end, and the spike
  auto p = t.Points();
  EXPECT_LE(p.size(), 17u);
  EXPECT_GE(p.size(), 8u);
  EXPECT_LT(p.front().first, n / 8);
  EXPECT_GT(p.back().first, n - n / 8);
  bool spike = false;
  for (auto& [ts, v] : p) spike |= (ts == 5'001 && v == 1'000'000);
  EXPECT_TRUE(spike);
  EXPECT_EQ(t.raw_samples(), n);
  for (size_t i = 1; i < p.size(); ++i) EXPECT_LT(p[i - 1].first, p[i].first);
}

TEST(RssReaderTest, ReadsThisProcessesResidentSet) {
  RssReader r;
  ASSERT_TRUE(r.Open().ok());
  auto before = r.Read();
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(*before, 1 << 20);
  // Touch 64 MiB: RSS grows by about that much.
  const size_t n = 64u << 20;
  char* p = static_cast<char*>(std::malloc(n));
  for (size_t i = 0; i < n; i += 4096) p[i] = 1;
  auto after = r.Read();
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(*after - *before, int64_t{48} << 20);
  std::free(p);
}

// A request function that answers on the measured thread through a flag (as the binding
// answers through Py_AddPendingCall). It records when each request was made and when each was
// answered, so that rate checks can measure what the sampler controls (how soon it asks again
// after an answer) rather than how much CPU a loaded machine gave the answering thread.
struct Pump {
  std::atomic<int> requested{0};
  int answered = 0;
  std::mutex mu;
  std::vector<int64_t> request_ns;  // guarded by mu
  std::vector<int64_t> answer_ns;   // only the answering thread
  static bool Request(void* ctx) noexcept {
    auto* p = static_cast<Pump*>(ctx);
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->request_ns.push_back(clock::NowNs());
    }
    p->requested.fetch_add(1);
    return true;
  }
  // For `ms` milliseconds, answers each request with `answer()` and runs `between()` after
  // every poll; returns how many requests were answered.
  template <class Answer, class Between>
  int AnswerFor(int ms, Answer answer, Between between) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      if (requested.load() > answered) {
        ++answered;
        answer_ns.push_back(clock::NowNs());
        answer();
      }
      between();
    }
    return answered;
  }
  // The median time from an answer to the request after it: the sampler's own pacing. A prompt
  // answer lets the sampler ask again at its next deadline, at most one interval later; an
  // answer that comes after that deadline is followed by a request at once.
  int64_t MedianAnswerToNextRequestNs() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<int64_t> gaps;
    for (size_t k = 0; k < answer_ns.size() && k + 1 < request_ns.size(); ++k)
      gaps.push_back(request_ns[k + 1] - answer_ns[k]);
    if (gaps.empty()) return -1;
    std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
    return gaps[gaps.size() / 2];
  }
};

// Waits up to 5 s for `done()`: for events a loaded machine may delay but must not prevent.
template <class Done>
bool WaitUntil(Done done) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

TEST(LineSamplerTest, IntervalsTileWallTimeAndMeasureCpu) {
  // GIVEN a 1 kHz sampler on this thread
  Pump pump;
  SamplerOptions o;
  o.interval_ns = 1'000'000;
  LineSampler s(o, &Pump::Request, &pump);
  const int64_t before_start = clock::NowNs();
  ASSERT_TRUE(s.Start().ok());
  const int64_t after_start = clock::NowNs();
  // WHEN the measured thread answers every request for ~60 ms, half busy, half asleep
  int64_t wall = 0, cpu = 0, before_last = 0, after_last = 0;
  bool busy = true;
  bool cpu_known = true;
  int answered = pump.AnswerFor(
      60,
      [&] {
        before_last = clock::NowNs();
        auto iv = s.TakeInterval();
        after_last = clock::NowNs();
        wall += iv.wall_ns;
        cpu_known &= iv.cpu_ns.has_value();
        cpu += iv.cpu_ns.value_or(0);
        EXPECT_LE(iv.cpu_ns.value_or(0), iv.wall_ns + 1'000'000);  // this thread's CPU only
        EXPECT_FALSE(iv.rss_delta.has_value());                    // memory off: unknown, not 0
        EXPECT_FALSE(iv.gpu_busy_ns.has_value());
        busy = !busy;
      },
      [&] {
        if (busy) {
          volatile double x = 0;
          for (int i = 0; i < 20000; ++i) x = x + i;
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(300));
        }
      });
  s.Stop();
  s.Stop();  // idempotent
  // THEN requests came, the intervals tile the time from start to the last answer exactly (no
  // gap, no overlap), and CPU <= wall
  ASSERT_GE(answered, 2);
  EXPECT_TRUE(cpu_known);
  EXPECT_GE(wall, before_last - after_start);
  EXPECT_LE(wall, after_last - before_start);
  EXPECT_GT(cpu, 0);
  EXPECT_LE(cpu, wall + 2'000'000);
  EXPECT_EQ(s.failed_requests(), 0);
}

#ifdef __linux__
// The number of threads the kernel counts for this process (field 20 of /proc/self/stat), as
// CPython 3.12+'s os.fork() reads it before warning about forking a multi-threaded process.
int OsThreads() {
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  if (f == nullptr) return -1;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  for (int field = 2; p != nullptr && field < 20; ++field) p = std::strchr(p + 1, ' ');
  return p == nullptr ? -1 : std::atoi(p + 1);
}

TEST(LineSamplerTest, PauseLeavesNoThreadAndResumeSamplesOnOverTheSameIntervals) {
  // GIVEN a running 1 kHz sampler whose requests are answered
  const int threads = OsThreads();
  ASSERT_GT(threads, 0);
  Pump pump;
  SamplerOptions o;
  o.interval_ns = 1'000'000;
  o.memory = true;
  LineSampler s(o, &Pump::Request, &pump);
  const int64_t after_start = [&] {
    EXPECT_TRUE(s.Start().ok());
    return clock::NowNs();
  }();
  EXPECT_EQ(OsThreads(), threads + 1);
  int64_t wall = 0;
  auto take = [&] { wall += s.TakeInterval().wall_ns; };
  auto idle = [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); };
  ASSERT_GE(pump.AnswerFor(20, take, idle), 2);
  // WHEN it is paused (as before os.fork())
  s.Pause();
  s.Pause();  // a no-op
  // THEN the kernel counts no thread of it at once, it stays running, and nothing is asked
  EXPECT_EQ(OsThreads(), threads);
  EXPECT_TRUE(s.running() && s.paused());
  const int requested = pump.requested.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(pump.requested.load(), requested);
  // AND after Resume() requests come again, the answered intervals still tile the time since
  // Start() (the pause included, in the first interval after it), and Stop() ends it all
  ASSERT_TRUE(s.Resume().ok());
  EXPECT_TRUE(s.Resume().ok());  // a no-op
  EXPECT_FALSE(s.paused());
  ASSERT_GE(pump.AnswerFor(20, take, idle), requested + 2);
  const int64_t before_last = clock::NowNs();
  take();
  EXPECT_GE(wall, before_last - after_start);
  s.Pause();
  s.Stop();  // from paused
  s.Stop();
  EXPECT_FALSE(s.running());
  EXPECT_EQ(OsThreads(), threads);
  EXPECT_TRUE(s.rss_end().has_value());  // the final reading was taken
}
#endif

TEST(LineSamplerTest, OneUnansweredRequestAtATimeAndNoWakeupsWhileItWaits) {
  // GIVEN a 5 kHz sampler with nothing to read and a measured thread that does not answer
  Pump pump;
  SamplerOptions o;
  o.interval_ns = 200'000;
  LineSampler s(o, &Pump::Request, &pump);
  ASSERT_TRUE(s.Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // THEN only the first request was made, and the thread sleeps until the answer instead of
  // waking up every interval
  EXPECT_EQ(pump.requested.load(), 1);
  EXPECT_LE(s.wakeups(), 3);
  // AND the late answer closes one interval spanning the whole wait, and wakes the thread:
  // the next request follows about an interval later
  auto iv = s.TakeInterval();
  EXPECT_GE(iv.wall_ns, 45'000'000);
  EXPECT_TRUE(WaitUntil([&] { return pump.requested.load() >= 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(pump.requested.load(), 2);  // and, unanswered, no third
  s.Stop();
}

TEST(LineSamplerTest, PromptAnswersKeepTheRateWhileTheGpuIsReadSlower) {
  auto scenario = telemetry::MockScenario::Parse("util=50,util_amp=0");
  ASSERT_TRUE(scenario.ok());
  telemetry::MockCollector gpu(1, std::move(scenario).value());
  Pump pump;
  SamplerOptions o;
  o.interval_ns = 1'000'000;
  o.gpu = &gpu;
  o.gpu_interval_ns = 10'000'000;
  LineSampler s(o, &Pump::Request, &pump);
  ASSERT_TRUE(s.Start().ok());
  const int64_t t0 = clock::NowNs();
  int answered = pump.AnswerFor(
      100, [&] { (void)s.TakeInterval(); },
      [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); });
  s.Stop();
  const int64_t elapsed = clock::NowNs() - t0;
  // THEN after each answer the next request follows within about the 1 ms interval, not the
  // GPU's 10 ms; and the GPU is read at its own rate, never more
  ASSERT_GE(answered, 5);
  EXPECT_LE(pump.MedianAnswerToNextRequestNs(), 3'000'000);
  EXPECT_LE(s.gpu_summary().ticks, elapsed / 10'000'000 + 2);
}

TEST(NextRequestDeadlineTest, LateWakeUpsKeepTheGridLongWaitsRestartIt) {
  constexpr int64_t kInterval = 1'000;
  // on time, or late by less than an interval: the next request is one interval after the
  // last one was due, not after it was made
  EXPECT_EQ(NextRequestDeadline(10'000, 10'000, kInterval), 11'000);
  EXPECT_EQ(NextRequestDeadline(10'000, 10'300, kInterval), 11'000);
  EXPECT_EQ(NextRequestDeadline(10'000, 10'999, kInterval), 11'000);
  // a whole interval or more behind: no catching up, the grid restarts from now
  EXPECT_EQ(NextRequestDeadline(10'000, 11'000, kInterval), 12'000);
  EXPECT_EQ(NextRequestDeadline(10'000, 55'500, kInterval), 56'500);
}

TEST(LineSamplerTest, PromptAnswersGetAboutTheRateAndNeverMore) {
  // GIVEN a 1 kHz sampler and a measured thread that answers soon after it is asked
  Pump pump;
  SamplerOptions o;
  o.interval_ns = 1'000'000;
  LineSampler s(o, &Pump::Request, &pump);
  ASSERT_TRUE(s.Start().ok());
  const int64_t t0 = clock::NowNs();
  int answered = pump.AnswerFor(
      300, [&] { (void)s.TakeInterval(); },
      [] { std::this_thread::sleep_for(std::chrono::microseconds(20)); });
  s.Stop();
  const int64_t elapsed = clock::NowNs() - t0;
  // THEN after each answer the sampler asked again within about an interval (how many answers
  // fit in 300 ms depends on how much CPU a loaded machine gives this thread, so the count is
  // not the measure), and it never ran ahead of the rate
  ASSERT_GE(answered, 10);
  EXPECT_LE(pump.MedianAnswerToNextRequestNs(), 2'500'000);
  EXPECT_LE(pump.requested.load(), elapsed / 1'000'000 + 3);
}

TEST(LineSamplerTest, FailedRequestsAreCountedAndRetried) {
  struct Failing {
    static bool Request(void* ctx) noexcept {
      static_cast<std::atomic<int>*>(ctx)->fetch_add(1);
      return false;
    }
  };
  std::atomic<int> calls{0};
  SamplerOptions o;
  o.interval_ns = 500'000;
  LineSampler s(o, &Failing::Request, &calls);
  ASSERT_TRUE(s.Start().ok());
  EXPECT_TRUE(WaitUntil([&] { return calls.load() >= 5; }));  // retried, not given up
  s.Stop();
  EXPECT_GE(calls.load(), 5);
  EXPECT_EQ(s.failed_requests(), calls.load());
}

TEST(LineSamplerTest, MemoryDeltasAndPeaksFollowAllocations) {
  // GIVEN memory sampling
  Pump pump;
  SamplerOptions o;
  o.interval_ns = 500'000;
  o.memory = true;
  LineSampler s(o, &Pump::Request, &pump);
  ASSERT_TRUE(s.Start().ok());
  ASSERT_TRUE(s.rss_start().has_value());
  int answered = 0;
  auto wait_answer = [&] {
    while (pump.requested.load() <= answered)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    ++answered;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a tick after the touch
    return s.TakeInterval();
  };
  (void)wait_answer();
  // WHEN 96 MiB are touched, then freed
  const size_t n = 96u << 20;
  char* p = static_cast<char*>(std::malloc(n));
  for (size_t i = 0; i < n; i += 4096) p[i] = 1;
  auto grow = wait_answer();
  std::free(p);
  auto shrink = wait_answer();
  s.Stop();
  // THEN the growing interval has +~96 MiB, and its peak is the high level
  ASSERT_TRUE(grow.rss_delta && grow.rss_peak);
  EXPECT_GT(*grow.rss_delta, int64_t{80} << 20);
  ASSERT_TRUE(shrink.rss_delta && shrink.rss_peak);
  EXPECT_LT(*shrink.rss_delta, -(int64_t{80} << 20));
  EXPECT_GE(*shrink.rss_peak, *s.rss_start() + (int64_t{80} << 20));  // freed during it
  EXPECT_GE(*s.rss_peak(), *s.rss_start() + (int64_t{80} << 20));
  EXPECT_GT(s.rss_timeline().raw_samples(), 3);
}

TEST(LineSamplerTest, WithALineSourceRssReadingsGoToThePublishedLine) {
  // GIVEN memory sampling charged to a published line (no request is ever answered)
  Pump pump;
  SamplerOptions o;
  o.interval_ns = 1'000'000;
  o.memory = true;
  std::atomic<uint64_t> line{0};
  LineSampler s(o, &Pump::Request, &pump);
  s.SetLineSource(&line);
  ASSERT_TRUE(s.Start().ok());
  // WHEN line A touches 96 MiB and stays current 30 ms, then line B frees it and stays 30 ms
  constexpr uint64_t kA = LineAggregator::LineKey(0, 7), kB = LineAggregator::LineKey(0, 8);
  line.store(kA);
  const size_t n = 96u << 20;
  char* p = static_cast<char*>(std::malloc(n));
  for (size_t i = 0; i < n; i += 4096) p[i] = 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  line.store(kB);
  std::free(p);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  line.store(0);  // no line: the readings after this are not charged
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s.Stop();
  // THEN A has the growth and the high peak, B the release
  const SourceLineMemory* a = nullptr;
  const SourceLineMemory* b = nullptr;
  auto rows = s.SourceLines();
  for (const auto& m : rows) {
    if (m.key == kA) a = &m;
    if (m.key == kB) b = &m;
  }
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(rows.size(), 2u);
  EXPECT_GT(a->rss_delta, int64_t{80} << 20);
  EXPECT_GE(a->rss_peak, *s.rss_start() + (int64_t{80} << 20));
  EXPECT_LT(b->rss_delta, -(int64_t{80} << 20));
  EXPECT_GT(a->readings, 5);
}

TEST(LineKeyTest, RoundTripsCodeAndLine) {
  constexpr uint64_t k = LineAggregator::LineKey(41, 1234);
  static_assert(LineAggregator::KeyCode(k) == 41 && LineAggregator::KeyLine(k) == 1234);
  static_assert(LineAggregator::LineKey(0, 1) != 0);  // 0 means "no line"
  EXPECT_EQ(LineAggregator::KeyCode(k), 41);
}

// The GPU busy time of one ~50 ms interval with `gpu` sampled every 2 ms.
SampleInterval OneGpuInterval(telemetry::GpuCollector& gpu, GpuSamplingSummary* summary) {
  Pump pump;
  SamplerOptions o;
  o.interval_ns = 1'000'000;
  o.gpu = &gpu;
  o.gpu_interval_ns = 2'000'000;
  LineSampler s(o, &Pump::Request, &pump);
  EXPECT_TRUE(s.Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  (void)s.TakeInterval();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto iv = s.TakeInterval();
  s.Stop();
  *summary = s.gpu_summary();
  return iv;
}

TEST(LineSamplerTest, GpuBusyTimeIsUtilizationTimesTime) {
  // GIVEN one mock GPU at a constant 50% with this process holding 1 GiB on it
  auto scenario = telemetry::MockScenario::Parse(
      "util=50,util_amp=0,mem_total_gib=1,mem_frac=1,mem_start_frac=1");
  ASSERT_TRUE(scenario.ok()) << scenario.error();
  telemetry::MockCollector gpu(1, std::move(scenario).value());
  // WHEN one interval of ~50 ms passes
  GpuSamplingSummary g;
  auto iv = OneGpuInterval(gpu, &g);
  // THEN its GPU busy time is ~half its wall time, and the device memory peak is known
  ASSERT_TRUE(iv.gpu_busy_ns.has_value());
  EXPECT_NEAR(static_cast<double>(*iv.gpu_busy_ns) / iv.wall_ns, 0.5, 0.1);
  ASSERT_TRUE(iv.gpu_mem_peak.has_value());
  EXPECT_EQ(*iv.gpu_mem_peak, int64_t{1} << 30);
  EXPECT_GE(g.ticks, 5);
  EXPECT_TRUE(g.used_devices_known);
}

// A GPU collector answering every read with the same row: device-wide and per-process
// utilization as given (nullopt: not reported), this process holding 1 MiB.
class FixedRowCollector final : public telemetry::GpuCollector {
 public:
  FixedRowCollector(std::optional<double> util, std::optional<double> proc_util)
      : util_(util), proc_util_(proc_util) {
    devices_.push_back(telemetry::GpuDevice{});
  }
  std::string backend() const override { return "nvml"; }
  const std::vector<telemetry::GpuDevice>& devices() const override { return devices_; }
  bool Sample(int64_t now, const std::vector<int64_t>&,
              std::vector<store::GpuSampleRow>* out) noexcept override {
    out->clear();
    store::GpuSampleRow r;
    r.ts_ns = now;
    r.util_pct = util_;
    r.proc_util_pct = proc_util_;
    r.proc_mem_bytes = 1 << 20;
    out->push_back(r);
    return true;
  }

 private:
  std::optional<double> util_, proc_util_;
  std::vector<telemetry::GpuDevice> devices_;
};

TEST(LineSamplerTest, GpuBusyTimeUsesThisProcesssOwnUtilizationWhenReported) {
  // GIVEN a GPU at 90% of which this process's own share is 30%
  FixedRowCollector gpu(90.0, 30.0);
  // WHEN one interval passes
  GpuSamplingSummary g;
  auto iv = OneGpuInterval(gpu, &g);
  // THEN its GPU busy time is ~30% of its wall time (not 90%), every reading per-process
  ASSERT_TRUE(iv.gpu_busy_ns.has_value());
  EXPECT_NEAR(static_cast<double>(*iv.gpu_busy_ns) / iv.wall_ns, 0.3, 0.08);
  EXPECT_GE(g.util_readings, 5);
  EXPECT_EQ(g.proc_util_readings, g.util_readings);
}

TEST(LineSamplerTest, GpuBusyTimeFallsBackToDeviceUtilizationWithoutPerProcess) {
  // GIVEN a GPU at 90% whose driver reports no per-process utilization
  FixedRowCollector gpu(90.0, std::nullopt);
  GpuSamplingSummary g;
  auto iv = OneGpuInterval(gpu, &g);
  // THEN the device-wide 90% is used, and no reading counts as per-process
  ASSERT_TRUE(iv.gpu_busy_ns.has_value());
  EXPECT_NEAR(static_cast<double>(*iv.gpu_busy_ns) / iv.wall_ns, 0.9, 0.1);
  EXPECT_GE(g.util_readings, 5);
  EXPECT_EQ(g.proc_util_readings, 0);
}

TEST(SampleAggregatorTest, SumsPerLineAndKeepsUnknownUnknown) {
  SampleAggregator a;
  int32_t f = a.InternFile("/p/a.py");
  EXPECT_EQ(a.InternFile("/p/a.py"), f);
  SampleInterval i1;
  i1.wall_ns = 100;
  i1.cpu_ns = 80;
  i1.rss_delta = 10;
  i1.rss_peak = 1000;
  SampleInterval i2;
  i2.wall_ns = 50;
  i2.cpu_ns = 50;
  i2.rss_delta = -4;
  i2.rss_peak = 900;
  i2.gpu_busy_ns = 7;
  a.AddLine(f, 3, i1);
  a.AddLine(f, 3, i2);
  SampleInterval i3;
  i3.wall_ns = 5;
  a.AddLine(f, 9, i3);
  a.AddUnattributed(i3);
  auto lines = a.Lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].line, 3);
  EXPECT_EQ(lines[0].samples, 2);
  EXPECT_EQ(lines[0].wall_ns, 150);
  EXPECT_EQ(lines[0].cpu_ns, 130);
  EXPECT_EQ(lines[0].rss_delta, 6);
  EXPECT_EQ(lines[0].rss_peak, 1000);
  EXPECT_EQ(lines[0].gpu_busy_ns, 7);
  EXPECT_FALSE(lines[0].gpu_mem_peak.has_value());
  EXPECT_FALSE(lines[1].cpu_ns.has_value());
  EXPECT_FALSE(lines[1].rss_delta.has_value());
  EXPECT_EQ(a.unattributed_ns(), 5);
  EXPECT_EQ(a.total_samples(), 4);
  int32_t fn = a.AddFunction(f, "work", 1);
  a.AddOwn(fn, i1);
  a.AddTotal(fn, i1);
  a.AddTotal(fn, i2);
  EXPECT_EQ(a.functions()[0].own_ns, 100);
  EXPECT_EQ(a.functions()[0].total_ns, 150);
}

}  // namespace
}  // namespace gpuprof::lines

namespace gpuprof::lines {
namespace {

TEST(SummarizeGpuCollectionTest, NoCollectorMeansBothUnavailableWithTheReason) {
  auto s = SummarizeGpuCollection(std::string("NVML not available: cannot load x"), "", 0, {}, {});
  EXPECT_FALSE(s.method.has_value());
  EXPECT_FALSE(s.time_available);
  EXPECT_FALSE(s.memory_available);
  ASSERT_TRUE(s.time_reason && s.memory_reason);
  EXPECT_NE(s.memory_reason->find("NVML not available: cannot load x"), std::string::npos);
  ASSERT_EQ(s.diagnostics.size(), 1u);
  EXPECT_NE(s.diagnostics[0].find("continued"), std::string::npos);
}

TEST(SummarizeGpuCollectionTest, NoPerProcessMemoryKeepsTimeAndSaysWhy) {
  GpuSamplingSummary g;
  g.ticks = 10;
  g.util_readings = 10;
  auto s = SummarizeGpuCollection(std::nullopt, "nvml", 2, g, {"proc_mem: Not Supported"});
  EXPECT_EQ(s.method, "nvml-sampled");
  EXPECT_TRUE(s.time_available);
  EXPECT_FALSE(s.memory_available);
  ASSERT_TRUE(s.memory_reason.has_value());
  EXPECT_NE(s.memory_reason->find("per-process device memory"), std::string::npos);
  EXPECT_NE(s.memory_reason->find("time sampling continued"), std::string::npos);
  EXPECT_FALSE(s.time_reason.has_value());
  EXPECT_EQ(s.utilization_scope, "device");
  bool other = false, note = false;
  for (auto& d : s.diagnostics) {
    other |= d.find("other processes") != std::string::npos &&
             d.find("every GPU (2 GPUs)") != std::string::npos;
    note |= d == "GPU collector: proc_mem: Not Supported";
  }
  EXPECT_TRUE(other);
  EXPECT_TRUE(note);
}

TEST(SummarizeGpuCollectionTest, NeuronCoresSayHowTheirTimeIsEstimated) {
  GpuSamplingSummary g;
  g.ticks = 3;
  g.util_readings = 3;
  g.proc_mem_readings = 3;
  auto s = SummarizeGpuCollection(std::nullopt, "neuron", 2, g, {});
  EXPECT_EQ(s.method, "neuron-sampled");
  ASSERT_EQ(s.diagnostics.size(), 1u);
  EXPECT_NE(s.diagnostics[0].find("per-NeuronCore"), std::string::npos);
}

TEST(SummarizeGpuCollectionTest, FailuresAreCountedAndAllFailedMeansUnavailable) {
  GpuSamplingSummary g;
  g.ticks = 10;
  g.failed_ticks = 3;
  g.util_readings = 7;
  g.proc_mem_readings = 7;
  g.used_devices_known = true;
  g.used_devices = {1};
  auto s = SummarizeGpuCollection(std::nullopt, "nvml", 2, g, {});
  FinishGpuCollection(s, 2, g, {});
  EXPECT_TRUE(s.time_available && s.memory_available);
  EXPECT_EQ(s.diagnostics.size(), 2u);
  EXPECT_NE(s.diagnostics[0].find("holds memory count (gpu1)"), std::string::npos);
  EXPECT_EQ(s.diagnostics[1],
            "GPU readings failed in 3 of 10 samples; lines whose samples all failed have no GPU "
            "time or GPU peak memory");
  g.failed_ticks = 10;
  auto all = SummarizeGpuCollection(std::nullopt, "nvml", 2, g, {});
  EXPECT_FALSE(all.time_available || all.memory_available);
  EXPECT_NE(all.time_reason->find("every GPU reading failed"), std::string::npos);
  GpuSamplingSummary none;
  auto early = SummarizeGpuCollection(std::nullopt, "nvml", 1, none, {});
  EXPECT_NE(early.memory_reason->find("before the first sample"), std::string::npos);
}

// True when some diagnostic contains every one of `parts`.
bool AnyDiagnostic(const GpuCollectionSummary& s, std::initializer_list<const char*> parts) {
  for (const auto& d : s.diagnostics) {
    bool all = true;
    for (const char* p : parts) all &= d.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

TEST(SummarizeGpuCollectionTest, PerProcessUtilizationForEveryReadingIsProcessScope) {
  GpuSamplingSummary g;
  g.ticks = 10;
  g.util_readings = 10;
  g.proc_util_readings = 10;
  g.proc_mem_readings = 10;
  auto s = SummarizeGpuCollection(std::nullopt, "nvml", 1, g, {});
  EXPECT_TRUE(s.time_available);
  EXPECT_EQ(s.utilization_scope, "process");
  EXPECT_TRUE(AnyDiagnostic(s, {"GPU time is estimated from this process's own utilization "
                                "(NVML per-process accounting)"}));
  EXPECT_FALSE(AnyDiagnostic(s, {"other processes"}));
}

TEST(SummarizeGpuCollectionTest, AFewDeviceWideReadingsKeepProcessScopeAndAreCounted) {
  // 95 of 100 readings per-process: at least kProcessScopeShare (90%)
  GpuSamplingSummary g;
  g.ticks = 100;
  g.util_readings = 100;
  g.proc_util_readings = 95;
  auto s = SummarizeGpuCollection(std::nullopt, "nvml", 1, g, {});
  EXPECT_EQ(s.utilization_scope, "process");
  EXPECT_TRUE(
      AnyDiagnostic(s, {"own utilization", "5 of 100 readings", "device-wide", "other processes"}));
}

TEST(SummarizeGpuCollectionTest, WithoutPerProcessUtilizationTheScopeIsDeviceAndSaysWhy) {
  GpuSamplingSummary g;
  g.ticks = 10;
  g.util_readings = 10;
  g.proc_mem_readings = 10;
  // GIVEN the collector's note that the device does not support it
  auto s = SummarizeGpuCollection(std::nullopt, "nvml", 1, g,
                                  {"gpu0: proc_util not supported by this device"});
  EXPECT_EQ(s.utilization_scope, "device");
  EXPECT_TRUE(AnyDiagnostic(s, {"other processes",
                                "per-process utilization unavailable: gpu0: "
                                "proc_util not supported by this device"}));
  // GIVEN no note: the driver gave nothing for this process
  auto quiet = SummarizeGpuCollection(std::nullopt, "nvml", 1, g, {});
  EXPECT_EQ(quiet.utilization_scope, "device");
  EXPECT_TRUE(AnyDiagnostic(quiet, {"other processes", "no per-process sample"}));
  // GIVEN per-process values for only half the readings
  g.proc_util_readings = 5;
  auto half = SummarizeGpuCollection(std::nullopt, "nvml", 1, g, {});
  EXPECT_EQ(half.utilization_scope, "device");
  EXPECT_TRUE(AnyDiagnostic(half, {"other processes", "only 5 of 10 readings"}));
  // GIVEN a collector that has no per-process utilization at all
  g.proc_util_readings = 0;
  auto mock = SummarizeGpuCollection(std::nullopt, "mock", 1, g, {});
  EXPECT_EQ(mock.utilization_scope, "device");
  EXPECT_TRUE(AnyDiagnostic(mock, {"other processes", "not provided by the 'mock' collector"}));
}

// ---- FinishGpuCollection: read failures and result.warnings -------------------------------

using Failure = telemetry::GpuReadFailure;

Failure FieldFailed(const std::string& device, const std::string& field,
                    const std::string& error = "Unknown Error (NVML error 999)") {
  return {Failure::Kind::kField, device.back() - '0', device, field, error};
}
Failure DeviceLost(const std::string& device) {
  return {Failure::Kind::kDeviceLost, device.back() - '0', device, "",
          "GPU is lost (NVML error 15)"};
}
Failure DeviceReadFailed(const std::string& device) {
  return {Failure::Kind::kDeviceRead, device.back() - '0', device, "", "Timeout (NVML error 10)"};
}

// The three steps line_sampler.cc takes (kernel tracing inactive unless `cupti`).
GpuCollectionSummary Summary(const GpuSamplingSummary& g, size_t devices,
                             const std::vector<Failure>& failures, bool cupti = false,
                             const std::string& backend = "nvml") {
  auto s = SummarizeGpuCollection(std::nullopt, backend, devices, g, {}, failures);
  ApplyKernelTracing(s, cupti, std::nullopt, "/x/libcupti.so", 130000, {}, 0, {});
  FinishGpuCollection(s, devices, g, failures);
  return s;
}

bool Has(const std::vector<std::string>& texts, const std::string& text) {
  return std::find(texts.begin(), texts.end(), text) != texts.end();
}
int CountPrefix(const std::vector<std::string>& texts, const std::string& prefix) {
  int n = 0;
  for (const auto& t : texts) n += t.rfind(prefix, 0) == 0;
  return n;
}

// Readings of one GPU over 10 ticks, every one answered, this process's own utilization.
GpuSamplingSummary TenGoodReadings() {
  GpuSamplingSummary g;
  g.ticks = 10;
  g.util_readings = 10;
  g.proc_util_readings = 10;
  g.proc_mem_readings = 10;
  return g;
}

TEST(FinishGpuCollectionTest, UtilizationReadsFailingMidRunAreCountedWithTheDriversError) {
  // GIVEN 4 of 10 answered readings without utilization, the collector having recorded why
  GpuSamplingSummary g = TenGoodReadings();
  g.util_readings = g.proc_util_readings = 6;
  auto s = Summary(g, 1, {FieldFailed("gpu0", "util")});
  // THEN time stays available, and one diagnostic, also a warning, counts and names the error
  const std::string said =
      "GPU utilization reads failed in 4 of 10 readings (gpu0: Unknown Error (NVML error 999)); "
      "lines whose samples all failed have no GPU time";
  EXPECT_TRUE(s.time_available);
  EXPECT_FALSE(s.time_reason.has_value());
  EXPECT_TRUE(Has(s.diagnostics, said));
  EXPECT_EQ(s.warnings, std::vector<std::string>{said});
  // AND with two GPUs the unit is device readings
  g.util_readings = g.proc_util_readings = 15;
  g.proc_mem_readings = 20;
  auto two = Summary(g, 2, {FieldFailed("gpu1", "util")});
  EXPECT_TRUE(Has(two.warnings,
                  "GPU utilization reads failed in 5 of 20 device readings (gpu1: Unknown Error "
                  "(NVML error 999)); lines whose samples all failed have no GPU time"));
}

TEST(FinishGpuCollectionTest, UtilizationFailuresDoNotMatterWhenKernelTimeIsMeasured) {
  // GIVEN failed utilization reads, and CUPTI measuring GPU time
  GpuSamplingSummary g = TenGoodReadings();
  g.util_readings = g.proc_util_readings = 6;
  auto s = Summary(g, 1, {FieldFailed("gpu0", "util")}, /*cupti=*/true);
  // THEN no utilization failure is said, and no utilization scope warning either
  EXPECT_EQ(s.method, "cupti");
  EXPECT_EQ(CountPrefix(s.diagnostics, "GPU utilization reads failed"), 0);
  EXPECT_TRUE(s.warnings.empty()) << s.warnings.front();
}

TEST(FinishGpuCollectionTest, MemoryReadsFailingMidRunAreCountedWithTheDriversError) {
  GpuSamplingSummary g = TenGoodReadings();
  g.proc_mem_readings = 7;
  auto s = Summary(g, 1, {FieldFailed("gpu0", "proc_mem")});
  const std::string said =
      "GPU memory reads failed in 3 of 10 readings (gpu0: Unknown Error (NVML error 999)); "
      "lines whose samples all failed have no GPU peak memory";
  EXPECT_TRUE(s.memory_available);
  EXPECT_FALSE(s.memory_reason.has_value());
  EXPECT_TRUE(Has(s.diagnostics, said));
  EXPECT_EQ(s.warnings, std::vector<std::string>{said});
  // AND when every answered reading had memory (the failures were on a field's other reads),
  // it is "during the run"
  g.proc_mem_readings = 10;
  auto all_counted = Summary(g, 1, {FieldFailed("gpu0", "proc_mem")});
  EXPECT_TRUE(Has(all_counted.warnings,
                  "GPU memory reads failed during the run (gpu0: Unknown Error (NVML error "
                  "999)); lines whose samples all failed have no GPU peak memory"));
}

TEST(FinishGpuCollectionTest, ALostDeviceMidRunReplacesTheCountOfFailedReadings) {
  // GIVEN the only GPU lost after 6 of 10 ticks
  GpuSamplingSummary g = TenGoodReadings();
  g.failed_ticks = 4;
  g.util_readings = g.proc_util_readings = g.proc_mem_readings = 6;
  auto s = Summary(g, 1, {DeviceLost("gpu0")});
  const std::string said =
      "GPU readings failed in 4 of 10 samples (gpu0 lost: GPU is lost (NVML error 15)); lines "
      "whose samples all failed have no GPU time or GPU peak memory";
  // THEN one diagnostic says so with the driver's error, and it is a warning
  EXPECT_TRUE(Has(s.diagnostics, said));
  EXPECT_EQ(CountPrefix(s.diagnostics, "4 of 10 GPU readings failed"), 0);
  EXPECT_EQ(s.warnings, std::vector<std::string>{said});
  // (answered readings all had values: no utilization or memory failure besides)
  EXPECT_EQ(CountPrefix(s.diagnostics, "GPU utilization reads failed"), 0);
}

TEST(FinishGpuCollectionTest, OneOfSeveralDevicesLostIsSaidDuringTheRun) {
  // GIVEN two GPUs, gpu1 lost while gpu0 kept answering (no tick failed as a whole)
  GpuSamplingSummary g;
  g.ticks = 10;
  g.util_readings = g.proc_util_readings = g.proc_mem_readings = 14;
  auto s = Summary(g, 2, {DeviceLost("gpu1")});
  EXPECT_TRUE(Has(s.warnings,
                  "GPU readings failed during the run (gpu1 lost: GPU is lost (NVML error 15)); "
                  "lines sampled then have no GPU values from that GPU"));
}

TEST(FinishGpuCollectionTest, FailedTicksWithNothingAvailableKeepTheirPlainCount) {
  // GIVEN 3 of 10 ticks failed and the others gave neither utilization nor process memory
  GpuSamplingSummary g;
  g.ticks = 10;
  g.failed_ticks = 3;
  auto s = Summary(g, 1, {});
  EXPECT_TRUE(
      Has(s.diagnostics, "3 of 10 GPU readings failed; lines sampled then have no GPU time"));
  EXPECT_EQ(CountPrefix(s.warnings, "GPU readings failed"), 0);
  EXPECT_EQ(CountPrefix(s.warnings, "3 of 10"), 0);
}

TEST(FinishGpuCollectionTest, EveryUtilizationAndMemoryReadFailingNamesTheDriversError) {
  // GIVEN readings that came, but whose utilization and process memory reads all failed
  GpuSamplingSummary g;
  g.ticks = 10;
  auto s = Summary(g, 1, {FieldFailed("gpu0", "util"), FieldFailed("gpu0", "proc_mem")});
  // THEN both are unavailable, the reasons name NVML's error, not "not supported"
  EXPECT_FALSE(s.time_available || s.memory_available);
  EXPECT_EQ(s.time_reason,
            "every GPU utilization read failed (gpu0: Unknown Error (NVML error "
            "999)); GPU time cannot be estimated");
  EXPECT_EQ(s.memory_reason,
            "every per-process device memory read failed (gpu0: Unknown Error (NVML error 999))");
  // AND result.warnings has both, once each, and nothing else
  EXPECT_EQ(s.warnings,
            (std::vector<std::string>{"GPU time unavailable: " + *s.time_reason,
                                      "GPU peak memory unavailable: " + *s.memory_reason}));
  // AND with utilization read, only memory failing: "GPU time sampling continued"
  g.util_readings = 10;
  auto mem = Summary(g, 1, {FieldFailed("gpu0", "proc_mem")});
  EXPECT_EQ(mem.memory_reason,
            "every per-process device memory read failed (gpu0: Unknown "
            "Error (NVML error 999)); GPU time sampling continued");
  // AND without failures the reasons stay "not reported"
  g.util_readings = 0;
  auto quiet = Summary(g, 1, {});
  EXPECT_EQ(quiet.time_reason->rfind("the driver reported no GPU utilization for 1 GPU", 0), 0u);
  EXPECT_EQ(quiet.memory_reason->rfind("the driver reported no per-process device memory", 0), 0u);
}

TEST(FinishGpuCollectionTest, EveryTickFailingNamesTheCausesOnceInOneReason) {
  // GIVEN every tick failed: gpu0's reads failed, then it was lost
  GpuSamplingSummary g;
  g.ticks = g.failed_ticks = 5;
  auto s = Summary(g, 1,
                   {FieldFailed("gpu0", "util", "Timeout (NVML error 10)"),
                    DeviceReadFailed("gpu0"), DeviceLost("gpu0")});
  // THEN one reason for both, with each cause once (the lost device before the failed read)
  const std::string reason =
      "every GPU reading failed (5 attempts on 1 GPU): gpu0: Timeout (NVML error 10); gpu0 "
      "lost: GPU is lost (NVML error 15)";
  EXPECT_EQ(s.time_reason, reason);
  EXPECT_EQ(s.memory_reason, reason);
  EXPECT_EQ(s.warnings,
            std::vector<std::string>{"GPU time and GPU peak memory unavailable: " + reason});
  // AND without recorded failures the reason points at the diagnostics
  auto quiet = Summary(g, 1, {});
  EXPECT_EQ(quiet.time_reason,
            "every GPU reading failed (5 attempts on 1 GPU); see the "
            "diagnostics");
  // AND when CUPTI measures GPU time, peak memory keeps the reason with its causes
  auto measured = Summary(g, 1, {DeviceLost("gpu0")}, /*cupti=*/true);
  EXPECT_FALSE(measured.memory_available);
  EXPECT_EQ(measured.memory_reason,
            "every GPU reading failed (5 attempts on 1 GPU): gpu0 lost: "
            "GPU is lost (NVML error 15)");
  EXPECT_TRUE(Has(measured.warnings, "GPU peak memory unavailable: " + *measured.memory_reason));
  EXPECT_EQ(CountPrefix(measured.warnings, "GPU time unavailable"), 0);
}

TEST(FinishGpuCollectionTest, DeviceWideUtilizationIsAWarningOnceExceptForNeuronCores) {
  // GIVEN GPU time from device-wide utilization of the GPU this process holds memory on
  GpuSamplingSummary g = TenGoodReadings();
  g.proc_util_readings = 0;
  g.used_devices_known = true;
  g.used_devices = {0};
  auto s = Summary(g, 1, {});
  ASSERT_EQ(s.utilization_scope, "device");
  EXPECT_EQ(s.warnings, std::vector<std::string>{kDeviceWideGpuWarning});
  // AND finishing again says it still once
  FinishGpuCollection(s, 1, g, {});
  EXPECT_EQ(s.warnings, std::vector<std::string>{kDeviceWideGpuWarning});
  // GIVEN per-process memory readings showing no memory of this process on any GPU: no GPU
  // counted, and that is what the warning (and the diagnostic) say instead
  GpuSamplingSummary idle = g;
  idle.used_devices_known = false;
  idle.used_devices.clear();
  auto no_memory = Summary(idle, 1, {});
  EXPECT_EQ(no_memory.warnings, std::vector<std::string>{kNoDeviceMemoryGpuWarning});
  EXPECT_EQ(CountPrefix(no_memory.diagnostics, "GPU time is estimated from sampled"), 1);
  EXPECT_NE(no_memory.diagnostics.back().find(kNoDeviceMemoryGpuWarning), std::string::npos);
  // GIVEN this process's own utilization: no such warning
  auto own = Summary(TenGoodReadings(), 1, {});
  ASSERT_EQ(own.utilization_scope, "process");
  EXPECT_TRUE(own.warnings.empty());
  // GIVEN NeuronCores (device scope, but the cores this process's runtime holds memory on)
  auto neuron = Summary(g, 2, {}, false, "neuron");
  ASSERT_EQ(neuron.method, "neuron-sampled");
  ASSERT_EQ(neuron.utilization_scope, "device");
  EXPECT_TRUE(neuron.warnings.empty());
  // GIVEN time unavailable: nothing to warn about its scope
  GpuSamplingSummary no_util;
  no_util.ticks = 4;
  no_util.proc_mem_readings = 4;
  auto none = Summary(no_util, 1, {});
  EXPECT_EQ(CountPrefix(none.warnings, "GPU utilization is device-wide"), 0);
  EXPECT_EQ(CountPrefix(none.warnings,
                        "GPU time unavailable: the driver reported no GPU "
                        "utilization"),
            1);
}

TEST(FinishGpuCollectionTest, TheMockCollectorSaysItsValuesAreSimulatedFirst) {
  // GIVEN readings from gpuprof's mock collector (GPUPROF_GPU_BACKEND=mock)
  GpuSamplingSummary g = TenGoodReadings();
  g.proc_util_readings = 0;
  auto s = Summary(g, 1, {}, false, "mock");
  ASSERT_EQ(s.method, "mock-sampled");
  // THEN the first warning says that no device was measured, once
  ASSERT_FALSE(s.warnings.empty());
  EXPECT_EQ(s.warnings.front(), kMockGpuWarning);
  EXPECT_EQ(CountPrefix(s.warnings, "GPU values are simulated"), 1);
  // AND a real collector's summary does not say it
  EXPECT_EQ(CountPrefix(Summary(g, 1, {}).warnings, "GPU values are simulated"), 0);
}

TEST(FinishGpuCollectionTest, WithoutACollectorTheReasonIsTheWarningAndMacOsSaysMps) {
  const std::optional<std::string> error("NVML not available: cannot load x");
  auto s = SummarizeGpuCollection(error, "", 0, {}, {});
  FinishGpuCollection(s, 0, {}, {});
  EXPECT_EQ(s.warnings, std::vector<std::string>{"GPU measurements unavailable: NVML not "
                                                 "available: cannot load x"});
  // GIVEN a Mac: both reasons are MPS's, said once; the diagnostics keep the collector's error
  auto mac = SummarizeGpuCollection(error, "", 0, {}, {});
  FinishGpuCollection(mac, 0, {}, {}, /*apple_host=*/true);
  EXPECT_EQ(mac.time_reason, kMpsUnavailable);
  EXPECT_EQ(mac.memory_reason, kMpsUnavailable);
  EXPECT_EQ(mac.warnings,
            std::vector<std::string>{std::string("GPU time and GPU peak memory unavailable: ") +
                                     kMpsUnavailable});
  EXPECT_TRUE(AnyDiagnostic(mac, {"NVML not available: cannot load x"}));
}

}  // namespace
}  // namespace gpuprof::lines
