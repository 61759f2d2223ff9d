// Every rule through the real store: a scenario written with SqliteStore::WriteRows and read
// back with LoadRun must produce exactly the insights (and skipped rules) of the in-memory run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>

#include "analysis/report.h"
#include "analysis/rules/registry.h"
#include "analysis/store_test_util.h"
#include "analysis/test_runs.h"

namespace gpuprof::analysis {
namespace {

using testing::HealthyFullRun;
using testing::HealthyRun;
using testing::kMs;
using testing::kSec;
using testing::RunBuilder;
using testing::StepShape;

StepShape Shape(int64_t duration_ms, std::optional<int64_t> wait_ms, int64_t fwd_ms, int64_t bwd_ms,
                int64_t opt_ms, std::optional<int64_t> gpu_ms = std::nullopt) {
  StepShape s;
  s.duration_ns = duration_ms * kMs;
  s.wait_ns = wait_ms ? std::optional<int64_t>(*wait_ms * kMs) : std::nullopt;
  auto gpu = gpu_ms ? std::optional<int64_t>(*gpu_ms * kMs) : std::nullopt;
  s.phases = {{"forward", fwd_ms * kMs, gpu},
              {"backward", bwd_ms * kMs, gpu},
              {"optimizer", opt_ms * kMs, std::nullopt}};
  return s;
}

// 20 steps of 100 ms with `wait_ms` of loader wait (source `source`).
RunBuilder Waiting(int64_t wait_ms, const std::string& source = "gap", size_t steps = 20) {
  RunBuilder b;
  StepShape s = Shape(100, wait_ms, 20, 100 - wait_ms - 30, 5);
  s.wait_source = source;
  b.Steps(steps, s);
  return b;
}

RunBuilder WithHost(RunBuilder b, const std::function<void(int64_t, store::HostSampleRow&)>& fill) {
  b.Telemetry("host", true, "procfs", std::nullopt);
  b.HostEvery(50 * kMs, fill);
  return b;
}

RunBuilder WithGpu(RunBuilder b, const std::function<void(int64_t, store::GpuSampleRow&)>& fill) {
  b.Telemetry("gpu", true, "nvml", std::nullopt);
  b.GpuInfo(0, 80LL << 30, 1980);
  b.GpuEvery(20 * kMs, fill);
  return b;
}

struct Scenario {
  std::string name;
  std::string must_fire;  // rule id
  std::function<RunBuilder()> build;
};

std::vector<Scenario> Scenarios() {
  return {
      {"dataloader_stall", "dataloader_stall",
       [] {
         RunBuilder b;
         b.Steps(30, Shape(100, 40, 20, 30, 5));
         return b;
       }},
      {"kernel_launch_overhead", "kernel_launch_overhead",
       [] {
         RunBuilder b;
         b.Steps(30, Shape(100, 5, 20, 30, 5, 12));
         return b;
       }},
      {"low_mfu", "low_mfu",
       [] {
         RunBuilder b = HealthyRun();
         b.Flops(0.1 * 989e12 * 0.100, "bf16");
         return b;
       }},
      {"compilation_warmup", "compilation_warmup",
       [] {
         RunBuilder b;
         b.Step(Shape(500, std::nullopt, 400, 50, 5)).Steps(20, Shape(100, 5, 30, 50, 10));
         return b;
       }},
      {"first_step_outlier", "first_step_outlier",
       [] {
         RunBuilder b;
         b.Step(Shape(3000, std::nullopt, 2900, 50, 5)).Steps(20, Shape(100, 5, 30, 50, 10));
         return b;
       }},
      {"high_step_variance", "high_step_variance",
       [] {
         RunBuilder b;
         for (int i = 0; i < 60; ++i) {
           b.Step(i % 10 == 5 ? Shape(400, 5, 30, 50, 10) : Shape(100, 5, 30, 50, 10));
         }
         return b;
       }},
      {"cost_eight_gpus", "cost",
       [] {
         RunBuilder b = HealthyRun();
         b.Gpu("NVIDIA A100-SXM4-80GB", 8);
         b.Flops(0.6 * 312e12 * 0.100, "bf16");
         b.run().end_ns = 3600LL * kSec;
         return b;
       }},
      {"prefetch_queue_starved", "prefetch_queue_starved",
       [] { return Waiting(45, "explicit", 30); }},
      {"cpu_bound_dataloader", "cpu_bound_dataloader",
       [] {
         return WithHost(Waiting(40), [](int64_t, store::HostSampleRow& h) {
           h.cpu_pct = 95;
           h.cpu_per_core = {95, 96, 94, 95};
           h.ncores = 4;
           h.disk_read_bps = 3e6;
           h.disk_read_iops = 40;
         });
       }},
      // The training's process tree busy (4 workers + main on 4.4 cores): fires with the tree
      // in its message and evidence, read back from proc_cpu_pct and worker_samples_10s.
      {"cpu_bound_dataloader_busy_tree", "cpu_bound_dataloader",
       [] {
         RunBuilder b = WithHost(Waiting(40), [](int64_t, store::HostSampleRow& h) {
           h.cpu_pct = 97;
           h.ncores = 8;
           h.disk_read_bps = 3e6;
           h.proc_cpu_pct = 440;
         });
         for (int64_t t = 0; t <= b.end_ns(); t += 50 * kMs) {
           b.WorkerSample({t, 100, "main", 60.0, 2LL << 30});
           for (int64_t w = 0; w < 4; ++w) b.WorkerSample({t, 300 + w, "child", 95.0, 1LL << 30});
         }
         return b;
       }},
      // A machine pegged by others while the training idles at 20% of a core: the stall fires,
      // cpu_bound_dataloader passes, the same after the round trip.
      {"stall_with_idle_tree", "dataloader_stall",
       [] {
         RunBuilder b = WithHost(Waiting(40), [](int64_t, store::HostSampleRow& h) {
           h.cpu_pct = 100;
           h.ncores = 2;
           h.disk_read_bps = 0;
           h.proc_cpu_pct = 20;
         });
         for (int64_t t = 0; t <= b.end_ns(); t += 50 * kMs) {
           b.WorkerSample({t, 100, "main", 20.0, 2LL << 30});
         }
         return b;
       }},
      {"io_bound_dataloader", "io_bound_dataloader",
       [] {
         return WithHost(Waiting(25), [](int64_t, store::HostSampleRow& h) {
           h.cpu_pct = 35;
           h.disk_read_bps = 820e6;
           h.disk_read_iops = 6100;
         });
       }},
      {"cold_cache", "cold_cache",
       [] {
         RunBuilder b;
         b.Steps(3, Shape(100, 5, 20, 60, 10)).Steps(10, Shape(150, 5, 20, 110, 10));
         const int64_t boundary = b.end_ns();
         b.Steps(20, Shape(100, 5, 20, 60, 10));
         return WithHost(b, [boundary](int64_t t, store::HostSampleRow& h) {
           h.disk_read_bps = t <= boundary ? 600e6 : 10e6;
         });
       }},
      {"cache_thrashing", "cache_thrashing",
       [] {
         return WithHost(Waiting(30), [](int64_t, store::HostSampleRow& h) {
           h.mem_total_bytes = 128LL << 30;
           h.page_cache_bytes = 66LL << 30;
           h.disk_read_bps = 310e6;
         });
       }},
      {"pcie_saturation", "pcie_saturation",
       [] {
         return WithGpu(Waiting(5), [](int64_t t, store::GpuSampleRow& g) {
           g.pcie_rx_bps = t % (200 * kMs) == 0 ? 24.1e9 : 9e9;
         });
       }},
      {"worker_imbalance", "worker_imbalance",
       [] {
         RunBuilder b =
             WithHost(Waiting(5), [](int64_t, store::HostSampleRow& h) { h.cpu_pct = 40; });
         for (int64_t t = 0; t <= b.end_ns(); t += 100 * kMs) {
           b.WorkerSample({t, 100, "main", 100.0, 2LL << 30});
           for (int64_t w = 0; w < 6; ++w) {
             b.WorkerSample({t, 300 + w, "child", w == 2 ? 97.5 : 12.25, 1LL << 30});
           }
         }
         return b;
       }},
      {"host_memory_pressure", "host_memory_pressure",
       [] {
         return WithHost(Waiting(5), [](int64_t, store::HostSampleRow& h) {
           h.swap_in_bps = 12.4e6;
           h.mem_used_bytes = 120LL << 30;
           h.mem_total_bytes = 128LL << 30;
         });
       }},
      {"small_batch", "small_batch",
       [] {
         RunBuilder b =
             WithGpu(Waiting(5), [](int64_t, store::GpuSampleRow& g) { g.util_pct = 87; });
         b.Flops(0.12 * 989e12 * 0.100, "bf16");
         return b;
       }},
      {"gradient_checkpointing_detected", "gradient_checkpointing_detected",
       [] {
         RunBuilder b;
         StepShape s = Shape(150, 5, 20, 30, 5);
         s.phases[0].gpu_ns = 30 * kMs;
         s.phases[1].gpu_ns = 93 * kMs;
         b.Steps(20, s).Config(R"({"grad_checkpoint": false, "sample_hz": 100.0})");
         return b;
       }},
      {"sdpa_suboptimal", "sdpa_suboptimal",
       [] {
         RunBuilder b = Waiting(5);
         for (int64_t w = 0; w < 3; ++w) {
           b.Kernel(w * kSec, (w + 1) * kSec, "ampere_bf16_s16816gemm", 900, 500 * kMs)
               .Kernel(w * kSec, (w + 1) * kSec, "cunn_SoftMaxForward", 100, 150 * kMs)
               .Kernel(w * kSec, (w + 1) * kSec, "aten::bmm", 200, 250 * kMs);
         }
         return b;
       }},
      {"kernel_drift", "kernel_drift",
       [] {
         RunBuilder b = Waiting(5);
         for (int64_t w = 0; w < 8; ++w) {
           b.Kernel(w * kSec, (w + 1) * kSec, "aten::mm", 100, (w < 4 ? 14 : 22) * kMs)
               .Kernel(w * kSec, (w + 1) * kSec, "sm90_xmma_gemm", 50, 200 * kMs);
         }
         return b;
       }},
      {"memory_pressure", "memory_pressure",
       [] {
         return WithGpu(Waiting(5), [](int64_t t, store::GpuSampleRow& g) {
           g.mem_used_bytes = t > kSec ? (77LL << 30) : (40LL << 30);  // total from gpus
         });
       }},
      {"thermal_throttling", "thermal_throttling",
       [] {
         return WithGpu(Waiting(5), [](int64_t t, store::GpuSampleRow& g) {
           const bool hot = t > 1200 * kMs;
           g.temp_c = hot ? 88 : 70;
           g.sm_clock_mhz = hot ? 1400 : 1980;
           g.clock_reasons = hot ? 0x40 : 0;
         });
       }},
      {"comm_dominant", "comm_dominant",
       [] {
         RunBuilder b = Waiting(5);
         b.Rank("job", 1, 4);
         for (const auto& st : b.steps()) {
           b.CommBucket(st.step, 0, st.start_ns + 40 * kMs, st.start_ns + 70 * kMs, 25LL << 20)
               .CommBucket(st.step, 1, st.start_ns + 60 * kMs, st.start_ns + 75 * kMs);
         }
         return b;
       }},
      {"healthy_full_telemetry", "cost", [] { return HealthyFullRun(); }},
      {"healthy_with_telemetry", "cost",
       [] {
         RunBuilder b = HealthyRun();
         b.Telemetry("gpu", true, "nvml", std::nullopt)
             .Telemetry("host", false, std::nullopt, "psutil-free host sampler disabled");
         store::GpuSampleRow g;
         g.ts_ns = 10 * kMs;
         g.util_pct = 91.5;
         g.mem_used_bytes = 30LL << 30;
         g.mem_total_bytes = 80LL << 30;
         g.temp_c = 64;
         b.GpuSample(g);
         return b;
       }},
  };
}

void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

class StoreRoundTrip : public ::testing::TestWithParam<Scenario> {};

TEST_P(StoreRoundTrip, RulesFireTheSameAfterLoadRun) {
  const Scenario& sc = GetParam();
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  RunBuilder b = sc.build();
  const int64_t id = testing::WriteRun(*db, b.Build());
  ASSERT_GT(id, 0);
  b.run().run_id = id;

  auto loaded = db->LoadRun(id);
  ASSERT_TRUE(loaded.ok()) << loaded.error();
  const Report before = Analyze(b.Build(), RuleContext{});
  const Report after = Analyze(std::move(loaded).value(), RuleContext{});

  // It fired: reported, or folded under the finding that explains it (precedence).
  bool fired = false;
  for (const Insight& in : after.insights) fired = fired || in.rule_id == sc.must_fire;
  for (const Explained& e : after.explained) fired = fired || e.insight.rule_id == sc.must_fire;
  EXPECT_TRUE(fired) << sc.must_fire << " did not fire after the round trip";
  ASSERT_EQ(before.explained.size(), after.explained.size());
  for (size_t i = 0; i < before.explained.size(); ++i) {
    EXPECT_EQ(before.explained[i].by, after.explained[i].by);
    EXPECT_EQ(before.explained[i].insight.message, after.explained[i].insight.message);
  }

  ASSERT_EQ(before.insights.size(), after.insights.size());
  for (size_t i = 0; i < before.insights.size(); ++i) {
    EXPECT_EQ(before.insights[i].rule_id, after.insights[i].rule_id);
    EXPECT_EQ(before.insights[i].severity, after.insights[i].severity);
    EXPECT_EQ(before.insights[i].message, after.insights[i].message);
    EXPECT_EQ(before.insights[i].evidence, after.insights[i].evidence);
  }
  ASSERT_EQ(before.not_evaluated.size(), after.not_evaluated.size());
  for (size_t i = 0; i < before.not_evaluated.size(); ++i) {
    EXPECT_EQ(before.not_evaluated[i].rule_id, after.not_evaluated[i].rule_id);
    EXPECT_EQ(before.not_evaluated[i].reason, after.not_evaluated[i].reason);
  }
  EXPECT_EQ(FormatSummary(before, file.path()), FormatSummary(after, file.path()));
  EXPECT_EQ(ReportJson(before), ReportJson(after));
  EXPECT_EQ(FormatFullReport(before), FormatFullReport(after));
}

INSTANTIATE_TEST_SUITE_P(EveryRule, StoreRoundTrip, ::testing::ValuesIn(Scenarios()),
                         [](const auto& info) { return info.param.name; });

TEST(StoreRoundTrip, AnIdleTrainingOnAPeggedMachineIsNotCpuBoundAfterLoadRun) {
  // GIVEN the stall_with_idle_tree run written to and read back from the store
  const auto all = Scenarios();
  const auto it = std::find_if(
      all.begin(), all.end(), [](const Scenario& sc) { return sc.name == "stall_with_idle_tree"; });
  ASSERT_NE(it, all.end());
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  const int64_t id = testing::WriteRun(*db, it->build().Build());
  auto loaded = db->LoadRun(id);
  ASSERT_TRUE(loaded.ok()) << loaded.error();
  ASSERT_FALSE(loaded.value().host_samples.empty());
  ASSERT_TRUE(loaded.value().host_samples.back().proc_cpu_pct.has_value());
  // THEN cpu_bound_dataloader was evaluated and did not fire: neither an insight nor skipped
  const Report r = Analyze(std::move(loaded).value(), RuleContext{});
  for (const Insight& in : r.insights) EXPECT_NE(in.rule_id, "cpu_bound_dataloader");
  for (const auto& n : r.not_evaluated) EXPECT_NE(n.rule_id, "cpu_bound_dataloader") << n.reason;
}

TEST(StoreRoundTrip, NotEvaluatedReasonsSurviveNulls) {
  // A CPU run without wait or phases: NULL columns must come back as unknown, not 0.
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  RunBuilder b;
  b.Cpu();
  StepShape s;
  s.wait_ns.reset();
  s.phases.clear();
  b.Steps(12, s);
  const int64_t id = testing::WriteRun(*db, b.Build());
  auto loaded = db->LoadRun(id);
  ASSERT_TRUE(loaded.ok()) << loaded.error();
  const Report after = Analyze(std::move(loaded).value(), RuleContext{});
  std::map<std::string, std::string> skipped;
  for (const auto& n : after.not_evaluated) skipped[n.rule_id] = n.reason;
  EXPECT_EQ(skipped["low_mfu"],
            "MFU unknown: CPU run (MFU compares with a GPU's peak; `gpuprof rules --reference` "
            "lists the GPUs)");
  EXPECT_THAT(skipped["dataloader_stall"], ::testing::HasSubstr("not measured"));
  EXPECT_THAT(skipped["kernel_launch_overhead"], ::testing::HasSubstr("no phase timings"));
  EXPECT_THAT(skipped["cost"], ::testing::HasSubstr("CPU run"));
}

}  // namespace
}  // namespace gpuprof::analysis
