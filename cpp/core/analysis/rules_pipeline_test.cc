// Data-pipeline and host rules: a scenario that fires, near misses that must not, and the
// missing inputs that make each "not evaluated". Expected numbers come from the scenarios.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "analysis/format.h"
#include "analysis/rule_test_util.h"

namespace gpuprof::analysis {
namespace {

using testing::Eval;
using testing::FoldedUnder;
using testing::HasInsight;
using ::testing::HasSubstr;
using testing::kMs;
using testing::RunBuilder;
using testing::Split;
using testing::StepShape;

// ---------------------------------------------------------------- loader_epoch_start

// 3 warmup + 100 steady steps of 100 ms, each waiting 5 ms in the DataLoader's next(); every
// 10th steady step (3, 13, …, 93) starts an epoch: its wait holds an iter(loader) of
// `start_ms` / 2 and waits `start_ms` longer in all.
RunBuilder Epochs(int64_t start_ms) {
  RunBuilder b;
  StepShape normal = Split(100, 5, 90);
  normal.wait_source = "dataloader";
  StepShape start = Split(100 + start_ms, 5 + start_ms, 90);
  start.wait_source = "dataloader";
  b.Steps(3, normal);
  for (size_t i = 0; i < 100; ++i) {
    b.Step(i % 10 == 0 ? start : normal);
    if (i % 10 == 0) b.LoaderStart(3 + i, 1, start_ms * kMs / 2);
  }
  return b;
}

TEST(LoaderEpochStart, EachEpochsStartThatWaitsIsNamedWithItsCost) {
  // GIVEN 10 epoch starts that each wait 100 ms more: 1 s of 11 s
  const RuleResult r = Eval("loader_epoch_start", Epochs(100));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "Each epoch's start waits for the loader: 10 steps, every 10th (3, 13, …, 93), "
            "waited " +
                FormatDuration(100.0 * kMs) + " more each than the other steps' median " +
                FormatDuration(5.0 * kMs) + " (" + FormatDuration(50.0 * kMs) +
                " of it inside iter(loader), starting its worker processes; the rest for their "
                "first batch): " +
                FormatPercent(1000.0 / 11000) + " of step time, " + FormatPercent(1000.0 / 1500) +
                " of the loader wait");
  EXPECT_THAT(r.insight->fix, HasSubstr("persistent_workers=True"));
  EXPECT_EQ(r.insight->evidence["starts"], 10);
  EXPECT_EQ(r.insight->evidence["start_period"], 10);
  // AND starts that wait no longer than other steps (persistent workers) are not a finding
  EXPECT_FALSE(Eval("loader_epoch_start", Epochs(0)).fired());
  EXPECT_FALSE(Eval("loader_epoch_start", Epochs(0)).skipped());
}

TEST(LoaderEpochStart, ExplainsTheStallItMostlyIs) {
  // GIVEN epoch starts that wait 200 ms more: 2 s of the 2.5 s loader wait (21% of step time)
  const Report report = Analyze(Epochs(200).Build(), RuleContext{});
  // THEN the report leads with the epoch starts, the stall folded under them
  EXPECT_TRUE(HasInsight(report, "loader_epoch_start"));
  EXPECT_FALSE(HasInsight(report, "dataloader_stall"));
  EXPECT_TRUE(FoldedUnder(report, "dataloader_stall", "loader_epoch_start"));
  // AND a stall that is mostly steady waiting stays a finding of its own
  RunBuilder b;
  StepShape slow = Split(100, 30, 60);
  slow.wait_source = "dataloader";
  StepShape start = Split(300, 230, 60);
  start.wait_source = "dataloader";
  b.Steps(3, slow);
  for (size_t i = 0; i < 100; ++i) {
    b.Step(i % 25 == 0 ? start : slow);
    if (i % 25 == 0) b.LoaderStart(3 + i, 1, 100 * kMs);
  }
  const Report both = Analyze(b.Build(), RuleContext{});
  EXPECT_TRUE(HasInsight(both, "dataloader_stall"));
  EXPECT_TRUE(HasInsight(both, "loader_epoch_start"));
}

TEST(LoaderEpochStart, NotEvaluatedWithoutWaitsMeasuredInADataLoader) {
  // GIVEN waits timed by wrap_dataloader (or a file from before loader_starts)
  RunBuilder b;
  StepShape wrapped = Split(100, 30, 60);
  wrapped.wait_source = "explicit";
  b.Steps(20, wrapped);
  const RuleResult r = Eval("loader_epoch_start", b);
  ASSERT_TRUE(r.skipped());
  EXPECT_THAT(*r.not_evaluated, HasSubstr("torch DataLoader"));
}

// ---------------------------------------------------------------- prefetch_queue_starved

StepShape Explicit(int64_t wait_ms) {
  StepShape s = Split(100, wait_ms, 60);
  s.wait_source = "explicit";
  return s;
}

// 3 warmup steps, then 27 steady steps of which every `every`-th waits `wait_ms`, the rest 5 ms.
RunBuilder Starving(size_t every, int64_t wait_ms) {
  RunBuilder b;
  b.Steps(3, Explicit(80));  // worker start-up: not counted
  for (size_t i = 0; i < 27; ++i) b.Step(Explicit(i % every == 0 ? wait_ms : 5));
  return b;
}

TEST(PrefetchQueueStarved, FiresMedOnAThirdOfSteps) {
  const RuleResult r = Eval("prefetch_queue_starved", Starving(3, 40));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "the loader's next() waited over " + FormatDuration(30.0 * kMs) +
                                    " for a batch on " + FormatPercent(9.0 / 27) +
                                    " of steps (9 of 27, median " + FormatDuration(40.0 * kMs) +
                                    "): the prefetch queue runs dry");
  EXPECT_EQ(r.insight->evidence["starved_steps"], 9);
}

TEST(PrefetchQueueStarved, FiresHighWhenMostStepsStarve) {
  const RuleResult r = Eval("prefetch_queue_starved", Starving(1, 45));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kHigh);
  EXPECT_THAT(r.insight->message, HasSubstr("on 100% of steps (27 of 27"));
}

TEST(PrefetchQueueStarved, NearMisses) {
  // 5 of 27 steps (19%) starve.
  RunBuilder few;
  few.Steps(3, Explicit(5));
  for (size_t i = 0; i < 27; ++i) few.Step(Explicit(i < 5 ? 40 : 5));
  EXPECT_FALSE(Eval("prefetch_queue_starved", few).fired());
  EXPECT_FALSE(Eval("prefetch_queue_starved", few).skipped());
  // Every step waits exactly the threshold: not over it.
  EXPECT_FALSE(Eval("prefetch_queue_starved", Starving(1, 30)).fired());
}

TEST(PrefetchQueueStarved, DataLoaderWaitsCountLikeWrappedOnes) {
  // GIVEN auto mode's DataLoader next() waits: 40 ms on every step after warmup
  RunBuilder b;
  StepShape s = Split(100, 40, 60);
  s.wait_source = "dataloader";
  b.Steps(30, s);
  // THEN the queue is starved on every steady step
  const RuleResult r = Eval("prefetch_queue_starved", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kHigh);
}

TEST(PrefetchQueueStarved, NotEvaluatedWithoutAMeasuredWait) {
  RunBuilder gap;
  gap.Steps(30, Split(100, 40, 50));  // gap waits say nothing about the prefetch queue
  EXPECT_THAT(*Eval("prefetch_queue_starved", gap).not_evaluated,
              HasSubstr("prof.wrap_dataloader(loader)"));
  RunBuilder none;
  EXPECT_EQ(*Eval("prefetch_queue_starved", none).not_evaluated, "no steps recorded");
}

// ---------------------------------------------------------------- cpu_bound_dataloader

// 20 steps of 100 ms with `wait_ms` of loader wait, host sampled every 50 ms.
RunBuilder Loader(int64_t wait_ms, double cpu, std::optional<double> disk_bps,
                  std::optional<double> iops) {
  RunBuilder b;
  b.Steps(20, Split(100, wait_ms, 100 - wait_ms - 5));
  b.HostEvery(50 * kMs, [&](int64_t, store::HostSampleRow& h) {
    h.cpu_pct = cpu;
    h.ncores = 16;
    h.disk_read_bps = disk_bps;
    h.disk_read_iops = iops;
  });
  return b;
}

TEST(CpuBoundDataloader, FiresWithPeggedCpuAndIdleDisk) {
  const RuleResult r = Eval("cpu_bound_dataloader", Loader(40, 95, 3e6, 50));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kHigh);  // the stall is 40% of step time
  EXPECT_EQ(r.insight->message,
            "Dataloader stall (" + FormatPercent(0.40) +
                " of step time) with the host CPU pegged (95% average across 16 cores) and the "
                "disk idle (3.0 MB/s): the loader workers are CPU-bound");
  EXPECT_EQ(r.insight->evidence["window"], "steady");
  // A smaller stall gives MED.
  EXPECT_EQ(Eval("cpu_bound_dataloader", Loader(20, 95, 3e6, 50)).insight->severity,
            Severity::kMed);
}

TEST(CpuBoundDataloader, NearMisses) {
  EXPECT_FALSE(Eval("cpu_bound_dataloader", Loader(40, 78, 3e6, 50)).fired());   // CPU 78%
  EXPECT_FALSE(Eval("cpu_bound_dataloader", Loader(40, 95, 80e6, 50)).fired());  // disk busy
  EXPECT_FALSE(Eval("cpu_bound_dataloader", Loader(40, 95, 3e6, 900)).fired());  // IOPS busy
  const RuleResult no_stall = Eval("cpu_bound_dataloader", Loader(5, 95, 3e6, 50));
  EXPECT_FALSE(no_stall.fired());
  EXPECT_FALSE(no_stall.skipped());
}

TEST(CpuBoundDataloader, NotEvaluatedWithoutHostTelemetry) {
  RunBuilder b;
  b.Steps(20, Split(100, 40, 55));
  b.Telemetry("host", false, std::nullopt, "host_hz=0");
  EXPECT_EQ(*Eval("cpu_bound_dataloader", b).not_evaluated,
            "host CPU not sampled (telemetry unavailable: host_hz=0)");
  // CPU measured but not the disk: NULL is not "idle".
  EXPECT_THAT(
      *Eval("cpu_bound_dataloader", Loader(40, 95, std::nullopt, std::nullopt)).not_evaluated,
      HasSubstr("disk reads not sampled"));
  RunBuilder no_wait;
  no_wait.Steps(20, Split(100, std::nullopt, 55));
  EXPECT_THAT(*Eval("cpu_bound_dataloader", no_wait).not_evaluated,
              HasSubstr("dataloader wait not measured"));
}

// Loader(40, 100, 3 MB/s, 50 IOPS) plus the training's process tree: proc_cpu_pct(t) on every
// host sample, and worker samples every 50 ms for the main process and `workers(t)` child pids.
RunBuilder PeggedWithTree(const std::function<double(int64_t)>& tree_pct,
                          const std::function<std::vector<int64_t>(int64_t)>& workers) {
  RunBuilder b;
  b.Steps(20, Split(100, 40, 55));
  b.HostEvery(50 * kMs, [&](int64_t t, store::HostSampleRow& h) {
    h.cpu_pct = 100;
    h.ncores = 16;
    h.disk_read_bps = 3e6;
    h.disk_read_iops = 50;
    h.proc_cpu_pct = tree_pct(t);
  });
  for (int64_t t = 0; t <= b.end_ns(); t += 50 * kMs) {
    b.WorkerSample({t, 100, "main", 20.0, 1LL << 30});
    for (int64_t pid : workers(t)) b.WorkerSample({t, pid, "child", 95.0, 1LL << 29});
  }
  return b;
}

std::vector<int64_t> NoWorkers(int64_t) { return {}; }
std::vector<int64_t> FourWorkers(int64_t) { return {201, 202, 203, 204}; }

TEST(CpuBoundDataloader, PassesWhenOtherProcessesPegTheCpuAndTheTrainingIdles) {
  // GIVEN a machine at 100% CPU while the training (num_workers=0) uses 15-25% of one core
  const RunBuilder b =
      PeggedWithTree([](int64_t t) { return t % (100 * kMs) ? 15.0 : 25.0; }, NoWorkers);
  // THEN the loader is not called CPU-bound: evaluated, not fired; the stall speaks for itself
  const RuleResult r = Eval("cpu_bound_dataloader", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
  EXPECT_TRUE(Eval("dataloader_stall", b).fired());
  // AND four workers idling at 30% of a core in all are not CPU-bound either
  EXPECT_FALSE(
      Eval("cpu_bound_dataloader", PeggedWithTree([](int64_t) { return 30.0; }, FourWorkers))
          .fired());
}

TEST(CpuBoundDataloader, FiresWhenTheTrainingsProcessesAreBusy) {
  // GIVEN four workers and the main process using 4.0 of their 5 cores on a pegged machine
  const RuleResult r =
      Eval("cpu_bound_dataloader", PeggedWithTree([](int64_t) { return 400.0; }, FourWorkers));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->message,
            "Dataloader stall (" + FormatPercent(0.40) +
                " of step time) with the host CPU pegged (100% average across 16 cores; the "
                "training's processes busy on up to 4 cores) and the disk idle (3.0 MB/s): the "
                "loader workers are CPU-bound");
  EXPECT_EQ(r.insight->evidence["tree_processes"], 5.0);
  EXPECT_EQ(r.insight->evidence["tree_usable_cores"], 5.0);
  // AND with num_workers=0 a main process busy on 0.9 cores is what is CPU-bound
  const RuleResult alone =
      Eval("cpu_bound_dataloader", PeggedWithTree([](int64_t) { return 90.0; }, NoWorkers));
  ASSERT_TRUE(alone.fired());
  EXPECT_THAT(alone.insight->message,
              HasSubstr("busy on up to 0.9 cores) and the disk idle (3.0 MB/s): the "
                        "loading runs in the training process (no worker processes seen) and "
                        "is CPU-bound"));
}

TEST(CpuBoundDataloader, AHostOthersPegWhileTheTrainingsThreadsQueueIsContentionNotTheLoader) {
  // GIVEN an in-process loader stall on a 2-core host 90% busy, the training's process on 0.8
  // of a core (torch's threads spinning while they wait) and other processes on about 1 core
  auto host = [](RunBuilder& b) {
    b.HostEvery(50 * kMs, [](int64_t, store::HostSampleRow& h) {
      h.cpu_pct = 90;
      h.ncores = 2;
      h.disk_read_bps = 3e6;
      h.disk_read_iops = 50;
      h.proc_cpu_pct = 80;
    });
  };
  RunBuilder unread;
  unread.Steps(20, Split(100, 40, 55));
  host(unread);
  // THEN from the host samples alone the loader looks CPU-bound (nothing tells them apart)
  EXPECT_TRUE(Eval("cpu_bound_dataloader", unread).fired());
  // AND with the training's threads queueing 20 ms a step for a CPU it is contention: the
  // loader is not blamed, cpu_contention says whose load it is, the stall stands alone
  RunBuilder read;
  read.CpuWaitWatch().Steps(20, Split(100, 40, 55));
  for (size_t i = 0; i < 20; ++i) read.CpuWaitInStep(i, 20 * kMs);
  host(read);
  const RuleResult r = Eval("cpu_bound_dataloader", read);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
  const RuleResult c = Eval("cpu_contention", read);
  ASSERT_TRUE(c.fired());
  EXPECT_TRUE(c.insight->evidence["other_load"].get<bool>());
  EXPECT_TRUE(Eval("dataloader_stall", read).fired());
}

TEST(CpuBoundDataloader, ExplainsTheQueueingOfTheTrainingsOwnThreads) {
  // GIVEN four CPU-bound workers keeping a 4-core host busy by themselves (no other load) and
  // the main thread queueing behind them
  RunBuilder b;
  b.CpuWaitWatch().Steps(20, Split(100, 40, 55));
  for (size_t i = 0; i < 20; ++i) b.CpuWaitInStep(i, 25 * kMs);
  b.HostEvery(50 * kMs, [](int64_t, store::HostSampleRow& h) {
    h.cpu_pct = 100;
    h.ncores = 4;
    h.disk_read_bps = 3e6;
    h.disk_read_iops = 50;
    h.proc_cpu_pct = 395;
  });
  for (int64_t t = 0; t <= b.end_ns(); t += 50 * kMs) {
    b.WorkerSample({t, 100, "main", 20.0, 1LL << 30});
    for (int64_t pid : FourWorkers(t)) b.WorkerSample({t, pid, "child", 95.0, 1LL << 29});
  }
  const Report report = Analyze(b.Build(), RuleContext{});
  // THEN the loader's diagnosis leads and the queueing is folded under it
  EXPECT_TRUE(HasInsight(report, "cpu_bound_dataloader"));
  EXPECT_FALSE(HasInsight(report, "cpu_contention"));
  EXPECT_TRUE(FoldedUnder(report, "cpu_contention", "cpu_bound_dataloader"));
}

TEST(CpuBoundDataloader, WorkersFoundLateOrRestartedEachEpochStillCount) {
  // GIVEN workers that join the sampled tree only at 1.5 s (the sampler's rescan): the
  // readings before see the main process alone, so they undercount the tree
  const auto late = [](int64_t t) { return t < 1500 * kMs ? 20.0 : 400.0; };
  const auto late_workers = [](int64_t t) {
    return t < 1500 * kMs ? std::vector<int64_t>{} : FourWorkers(t);
  };
  EXPECT_TRUE(Eval("cpu_bound_dataloader", PeggedWithTree(late, late_workers)).fired());
  // AND so do workers seen only in the last 15% of a short run's readings (a 2 s run whose
  // workers the rescan found at 1.7 s): the tree's peak counts, not a percentile
  const auto later = [](int64_t t) { return t < 1700 * kMs ? 15.0 : 400.0; };
  const auto later_workers = [](int64_t t) {
    return t < 1700 * kMs ? std::vector<int64_t>{} : FourWorkers(t);
  };
  EXPECT_TRUE(Eval("cpu_bound_dataloader", PeggedWithTree(later, later_workers)).fired());
  // AND four workers restarted every 0.5 s (16 pids in all) are four processes at a time, not
  // sixteen: 4.0 busy cores of 5 usable
  const auto restarted = [](int64_t t) {
    const int64_t epoch = t / (500 * kMs);
    std::vector<int64_t> pids;
    for (int64_t w = 0; w < 4; ++w) pids.push_back(300 + 4 * epoch + w);
    return pids;
  };
  const RuleResult r =
      Eval("cpu_bound_dataloader", PeggedWithTree([](int64_t) { return 400.0; }, restarted));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->evidence["tree_usable_cores"], 5.0);
}

// A run of `steps` 100 ms steps (40 ms loader wait) sampled every `period_ms`, pegged and idle
// disk: enough for the io/cpu rules' data, except possibly the number and span of readings.
RunBuilder Sampled(size_t steps, int64_t period_ms, double cpu, double disk_bps) {
  RunBuilder b;
  b.Steps(steps, Split(100, 40, 55));
  b.HostEvery(period_ms * kMs, [&](int64_t t, store::HostSampleRow& h) {
    if (t == 0) return;  // the first sample only primes the rates
    h.cpu_pct = cpu;
    h.ncores = 2;
    h.disk_read_bps = disk_bps;
  });
  return b;
}

TEST(CpuBoundDataloader, NotEvaluatedFromTooFewHostReadings) {
  // GIVEN a very short run: 8 steps of 2 ms and one CPU reading covering its 15 ms
  RunBuilder tiny;
  tiny.Steps(8, Split(2, 1, 1));
  tiny.HostSample({.ts_ns = 0});
  store::HostSampleRow reading;
  reading.ts_ns = 15 * kMs;
  reading.cpu_pct = 100;
  reading.ncores = 2;
  reading.disk_read_bps = 0;
  tiny.HostSample(reading);
  const RuleResult r = Eval("cpu_bound_dataloader", tiny);
  ASSERT_TRUE(r.skipped());
  EXPECT_EQ(*r.not_evaluated, "only 1 host CPU reading covering " + FormatDuration(15.0 * kMs) +
                                  " in the steady state; deciding "
                                  "needs at least 5 covering " +
                                  FormatDuration(1e9) +
                                  " (run longer, or raise profile(host_hz=))");
  // AND at the edges: 5 readings over 1.0 s decide; 4 readings (over 1.2 s) or 11 over 0.55 s
  // do not
  EXPECT_TRUE(Eval("cpu_bound_dataloader", Sampled(13, 200, 95, 3e6)).fired());
  EXPECT_THAT(*Eval("cpu_bound_dataloader", Sampled(13, 300, 95, 3e6)).not_evaluated,
              HasSubstr("only 4 host CPU readings covering " + FormatDuration(1.2e9) +
                        " in the steady state"));
  // (enough readings, too short a span: the reason says the span is what is short)
  EXPECT_EQ(*Eval("cpu_bound_dataloader", Sampled(8, 50, 95, 3e6)).not_evaluated,
            "the 11 host CPU readings cover only " + FormatDuration(550.0 * kMs) +
                " in the steady state; deciding needs them to cover at least " +
                FormatDuration(1e9) + " (run longer)");
  // AND io_bound_dataloader, deciding from the same readings, waits for as many
  EXPECT_THAT(*Eval("io_bound_dataloader", Sampled(8, 50, 30, 900e6)).not_evaluated,
              HasSubstr("the 11 host CPU readings cover only"));
  EXPECT_TRUE(Eval("io_bound_dataloader", Sampled(13, 200, 30, 900e6)).fired());
}

// ---------------------------------------------------------------- io_bound_dataloader

TEST(IoBoundDataloader, FiresOnThroughput) {
  const RuleResult r = Eval("io_bound_dataloader", Loader(20, 35, 820e6, 6100));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "Dataloader stall (" + FormatPercent(0.20) +
                " of step time) while the disk reads 820 MB/s, 6.1k IOPS on average and the host "
                "CPU has headroom (35% average): the input pipeline is I/O-bound");
}

TEST(IoBoundDataloader, FiresOnIopsAlone) {
  const RuleResult r = Eval("io_bound_dataloader", Loader(40, 20, 100e6, 8000));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kHigh);
  EXPECT_THAT(r.insight->message, HasSubstr("100 MB/s, 8k IOPS"));
}

TEST(IoBoundDataloader, NearMisses) {
  EXPECT_FALSE(Eval("io_bound_dataloader", Loader(40, 35, 450e6, 4000)).fired());  // below both
  EXPECT_FALSE(Eval("io_bound_dataloader", Loader(40, 70, 820e6, 6100)).fired());  // CPU busy
  EXPECT_FALSE(Eval("io_bound_dataloader", Loader(5, 35, 820e6, 6100)).fired());   // no stall
}

TEST(IoBoundDataloader, NotEvaluatedWithoutDiskOrCpu) {
  EXPECT_THAT(
      *Eval("io_bound_dataloader", Loader(40, 35, std::nullopt, std::nullopt)).not_evaluated,
      HasSubstr("disk reads not sampled"));
  RunBuilder no_cpu;
  no_cpu.Steps(20, Split(100, 40, 55));
  no_cpu.HostEvery(50 * kMs, [](int64_t, store::HostSampleRow& h) { h.disk_read_bps = 900e6; });
  EXPECT_THAT(*Eval("io_bound_dataloader", no_cpu).not_evaluated,
              HasSubstr("host CPU not sampled"));
}

// ---------------------------------------------------------------- cold_cache

// 3 warmup steps of 100 ms, then 30 steady steps: the first 10 take `slow_ms`, the rest 100 ms.
// Disk reads `early_bps` up to the end of the first steady third, then `late_bps`.
RunBuilder Cache(int64_t slow_ms, double early_bps, double late_bps) {
  RunBuilder b;
  b.Steps(3, Split(100, 5, 90)).Steps(10, Split(slow_ms, 5, slow_ms - 10));
  const int64_t boundary = b.end_ns();
  b.Steps(20, Split(100, 5, 90));
  b.HostEvery(50 * kMs, [&](int64_t t, store::HostSampleRow& h) {
    h.disk_read_bps = t <= boundary ? early_bps : late_bps;
  });
  return b;
}

TEST(ColdCache, FiresWhenReadsFallAndStepsSpeedUp) {
  const RuleResult r = Eval("cold_cache", Cache(150, 600e6, 10e6));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  EXPECT_EQ(r.insight->message,
            "Disk reads fell from 600 MB/s in the first third of the run to 10.0 MB/s in the last "
            "while the median step sped up from " +
                FormatDuration(150.0 * kMs) + " to " + FormatDuration(100.0 * kMs) +
                ": the first pass read from a cold cache");
  EXPECT_EQ(r.insight->evidence["steps_per_third"], 10);
}

TEST(ColdCache, NearMisses) {
  EXPECT_FALSE(Eval("cold_cache", Cache(100, 600e6, 10e6)).fired());   // steps did not speed up
  EXPECT_FALSE(Eval("cold_cache", Cache(108, 600e6, 10e6)).fired());   // only 8% faster
  EXPECT_FALSE(Eval("cold_cache", Cache(150, 600e6, 250e6)).fired());  // reads fell 2.4×
  EXPECT_FALSE(Eval("cold_cache", Cache(150, 30e6, 1e6)).fired());     // never read much
  EXPECT_FALSE(Eval("cold_cache", Cache(150, 30e6, 1e6)).skipped());
}

TEST(ColdCache, NotEvaluated) {
  RunBuilder short_run;
  short_run.Steps(3 + 8, Split(100, 5, 90));
  EXPECT_THAT(*Eval("cold_cache", short_run).not_evaluated,
              HasSubstr("only 8 steady-state steps; comparing thirds needs at least 9"));
  RunBuilder no_host;
  no_host.Steps(40, Split(100, 5, 90));
  EXPECT_EQ(*Eval("cold_cache", no_host).not_evaluated, "disk reads not sampled");
}

// ---------------------------------------------------------------- cache_thrashing

RunBuilder Thrash(int64_t wait_ms, double cache_fraction, double read_bps) {
  RunBuilder b;
  b.Steps(20, Split(100, wait_ms, 100 - wait_ms - 5));
  b.HostEvery(50 * kMs, [&](int64_t, store::HostSampleRow& h) {
    h.mem_total_bytes = 128LL << 30;
    h.page_cache_bytes = static_cast<int64_t>(cache_fraction * (128LL << 30));
    h.disk_read_bps = read_bps;
  });
  return b;
}

TEST(CacheThrashing, FiresMedWithAStall) {
  const RuleResult r = Eval("cache_thrashing", Thrash(30, 0.52, 310e6));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "The page cache fills 52% of RAM (" + FormatBytes(0.52 * (128LL << 30)) +
                " of 128.0 GiB) yet the disk still reads 310 MB/s (median) in the steady state: "
                "the data's working set does not fit in memory");
}

TEST(CacheThrashing, LowWithoutAStall) {
  const RuleResult r = Eval("cache_thrashing", Thrash(5, 0.52, 310e6));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
}

TEST(CacheThrashing, NearMisses) {
  EXPECT_FALSE(Eval("cache_thrashing", Thrash(30, 0.35, 310e6)).fired());  // cache 35% of RAM
  EXPECT_FALSE(Eval("cache_thrashing", Thrash(30, 0.52, 90e6)).fired());   // reads 90 MB/s
}

TEST(CacheThrashing, NotEvaluatedWithoutPageCache) {
  RunBuilder b = Loader(30, 50, 300e6, std::nullopt);  // no page cache / total RAM readings
  EXPECT_EQ(*Eval("cache_thrashing", b).not_evaluated, "page cache or total RAM not sampled");
}

// ---------------------------------------------------------------- pcie_saturation

// GPU samples every 10 ms: 9 GB/s, with every 8th sample at `peak_bps`.
RunBuilder Pcie(double peak_bps) {
  RunBuilder b;
  b.Steps(20, Split(100, 5, 90));
  int i = 0;
  b.GpuEvery(10 * kMs, [&](int64_t, store::GpuSampleRow& g) {
    g.pcie_rx_bps = i++ % 8 == 0 ? peak_bps : 9e9;
  });
  return b;
}

TEST(PcieSaturation, FiresAbovePeak) {
  const RunBuilder b = Pcie(24.1e9);
  const size_t n = b.gpu_samples().size(), peaks = (n + 7) / 8;
  const double mean = (peaks * 24.1e9 + (n - peaks) * 9e9) / n;
  const RuleResult r = Eval("pcie_saturation", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "PCIe host-to-device traffic peaked at 24.1 GB/s on GPU 0 (mean " +
                                    FormatBandwidth(mean) + "; above 20.0 GB/s on " +
                                    FormatPercent(static_cast<double>(peaks) / n) +
                                    " of samples): input copies are bandwidth-bound");
}

TEST(PcieSaturation, NearMiss) {
  const RuleResult r = Eval("pcie_saturation", Pcie(19.5e9));
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(PcieSaturation, NotEvaluatedWithoutPcieReadings) {
  RunBuilder cpu;
  cpu.Cpu().Steps(5, StepShape{});
  EXPECT_EQ(*Eval("pcie_saturation", cpu).not_evaluated,
            "PCIe throughput not sampled: a CPU run has no GPU telemetry");
  RunBuilder no_nvml;
  no_nvml.Steps(5, StepShape{});
  no_nvml.Telemetry("gpu", false, std::nullopt, "libnvidia-ml.so.1 not found");
  EXPECT_EQ(*Eval("pcie_saturation", no_nvml).not_evaluated,
            "PCIe throughput not sampled (telemetry unavailable: libnvidia-ml.so.1 not found)");
  RunBuilder blank;
  blank.Steps(5, StepShape{});
  blank.GpuEvery(10 * kMs, [](int64_t, store::GpuSampleRow& g) { g.util_pct = 50; });
  EXPECT_EQ(*Eval("pcie_saturation", blank).not_evaluated, "PCIe throughput not sampled");
}

// ---------------------------------------------------------------- worker_imbalance

// `cpu` per worker (pid 300, 301, ...), sampled every 100 ms, plus the main process.
RunBuilder Workers(const std::vector<double>& cpu) {
  RunBuilder b;
  b.Steps(20, Split(100, 5, 90));
  b.HostEvery(100 * kMs, [](int64_t, store::HostSampleRow& h) { h.cpu_pct = 40; });
  for (int64_t t = 0; t <= b.end_ns(); t += 100 * kMs) {
    b.WorkerSample({t, 100, "main", 100.0, std::nullopt});
    for (size_t w = 0; w < cpu.size(); ++w) {
      b.WorkerSample({t, 300 + static_cast<int64_t>(w), "child", cpu[w], std::nullopt});
    }
  }
  return b;
}

TEST(WorkerImbalance, FiresOnOneHotWorker) {
  const std::vector<double> cpu = {96, 16, 16, 16, 16, 16, 16, 16};
  const double fair = (96 + 7 * 16) / 8.0;
  const RuleResult r = Eval("worker_imbalance", Workers(cpu));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "Dataloader worker pid 300 averages 96% of a core, " +
                                    FormatRatio(96 / fair) + " its fair share (" +
                                    FormatPercent(fair / 100) +
                                    " across 8 workers): one worker does most of the loading");
}

TEST(WorkerImbalance, NearMisses) {
  // 60 vs a fair share of 25: 2.4×.
  EXPECT_FALSE(Eval("worker_imbalance", Workers({60, 20, 20, 20, 20, 20, 10, 30})).fired());
  // Idle workers: the ratio is large but nobody is busy.
  EXPECT_FALSE(Eval("worker_imbalance", Workers({8, 0.5, 0.5, 0.5})).fired());
  EXPECT_FALSE(Eval("worker_imbalance", Workers({8, 0.5, 0.5, 0.5})).skipped());
}

TEST(WorkerImbalance, NotEvaluatedWithoutWorkers) {
  EXPECT_THAT(*Eval("worker_imbalance", Workers({})).not_evaluated,
              HasSubstr("no dataloader worker processes sampled (num_workers=0"));
  EXPECT_THAT(*Eval("worker_imbalance", Workers({90})).not_evaluated,
              HasSubstr("only 1 dataloader worker"));
  RunBuilder no_host;
  no_host.Steps(5, StepShape{});
  EXPECT_EQ(*Eval("worker_imbalance", no_host).not_evaluated,
            "dataloader worker processes not sampled");
}

// ---------------------------------------------------------------- host_memory_pressure

RunBuilder Swap(double swap_bps) {
  RunBuilder b;
  b.Steps(20, Split(100, 5, 90));
  int i = 0;
  b.HostEvery(100 * kMs, [&](int64_t, store::HostSampleRow& h) {
    h.swap_in_bps = i++ % 2 == 0 ? 0 : 2 * swap_bps;  // mean = swap_bps when the count is even
    h.mem_used_bytes = static_cast<int64_t>(121.6 * (1LL << 30));
    h.mem_total_bytes = 128LL << 30;
  });
  return b;
}

TEST(HostMemoryPressure, FiresOnSustainedSwapIn) {
  const RunBuilder b = Swap(12.4e6);
  const auto rows = b.Build().host_samples;
  double sum = 0;
  for (const auto& h : rows) sum += *h.swap_in_bps;
  const RuleResult r = Eval("host_memory_pressure", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "The host swapped in " + FormatBandwidth(sum / rows.size()) + " on average (peak " +
                FormatBandwidth(24.8e6) + ") with up to 121.6 GiB of 128.0 GiB RAM in use (" +
                FormatPercent(121.6 / 128) + "): the OS is paging memory back from disk");
}

TEST(HostMemoryPressure, NearMiss) {
  const RuleResult r = Eval("host_memory_pressure", Swap(0.4e6));
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(HostMemoryPressure, NotEvaluatedWithoutSwapReadings) {
  EXPECT_EQ(*Eval("host_memory_pressure", Loader(5, 30, 1e6, 1)).not_evaluated,
            "swap-in rate not sampled");
}

}  // namespace
}  // namespace gpuprof::analysis
