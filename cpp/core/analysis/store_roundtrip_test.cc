// Every rule through the real store: a scenario written with SqliteStore::WriteRows and read
// back with LoadRun must produce exactly the insights (and skipped rules) of the in-memory run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "analysis/report.h"
#include "analysis/rules/registry.h"
#include "analysis/store_test_util.h"
#include "analysis/test_runs.h"

namespace gpuprof::analysis {
namespace {

using testing::HealthyRun;
using testing::kMs;
using testing::kSec;
using testing::RunBuilder;
using testing::StepShape;

StepShape Shape(int64_t duration_ms, std::optional<int64_t> wait_ms, int64_t fwd_ms,
                int64_t bwd_ms, int64_t opt_ms, std::optional<int64_t> gpu_ms = std::nullopt) {
  StepShape s;
  s.duration_ns = duration_ms * kMs;
  s.wait_ns = wait_ms ? std::optional<int64_t>(*wait_ms * kMs) : std::nullopt;
  auto gpu = gpu_ms ? std::optional<int64_t>(*gpu_ms * kMs) : std::nullopt;
  s.phases = {{"forward", fwd_ms * kMs, gpu}, {"backward", bwd_ms * kMs, gpu},
              {"optimizer", opt_ms * kMs, std::nullopt}};
  return s;
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

  bool fired = false;
  for (const Insight& in : after.insights) fired = fired || in.rule_id == sc.must_fire;
  EXPECT_TRUE(fired) << sc.must_fire << " did not fire after the round trip";

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
  EXPECT_EQ(FormatFullReport(before), FormatFullReport(after));
}

INSTANTIATE_TEST_SUITE_P(EveryRule, StoreRoundTrip, ::testing::ValuesIn(Scenarios()),
                         [](const auto& info) { return info.param.name; });

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
  EXPECT_EQ(skipped["low_mfu"], "MFU unknown: CPU run");
  EXPECT_THAT(skipped["dataloader_stall"], ::testing::HasSubstr("not measured"));
  EXPECT_THAT(skipped["kernel_launch_overhead"], ::testing::HasSubstr("no phase timings"));
  EXPECT_THAT(skipped["cost"], ::testing::HasSubstr("CPU run"));
}

}  // namespace
}  // namespace gpuprof::analysis
