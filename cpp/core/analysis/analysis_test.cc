// Entry points against a real store: AnalyzeRun, SummaryText, FinalizeRun.
#include "analysis/analysis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "analysis/format.h"
#include "analysis/store_test_util.h"
#include "analysis/test_runs.h"

namespace gpuprof::analysis {
namespace {

using ::testing::HasSubstr;
using testing::kMs;
using testing::kSec;
using testing::RunBuilder;
using testing::StepShape;

// Sets an environment variable for one scope and restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

RunBuilder StallRun() {
  RunBuilder b;
  b.Name("stall");
  StepShape s;
  s.wait_ns = 45 * kMs;
  s.phases = {{"forward", 20 * kMs, std::nullopt},
              {"backward", 25 * kMs, std::nullopt},
              {"optimizer", 5 * kMs, std::nullopt}};
  b.Steps(12, s);
  return b;
}

TEST(FinalizeRun, StoresInsightsAndReturnsTheSummary) {
  ScopedEnv env("GPUPROF_GPU_RATE", nullptr);
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  const int64_t id = testing::WriteRun(*db, StallRun().Build());

  auto summary = FinalizeRun(*db, id, file.path(), AnalysisOptions{});
  ASSERT_TRUE(summary.ok()) << summary.error();
  EXPECT_THAT(*summary,
              HasSubstr("gpuprof · stall  (12 steps, avg " + FormatDuration(100.0 * kMs) + ")"));
  EXPECT_THAT(*summary, HasSubstr("[HIGH]  " + FormatPercent(0.45) +
                                  " of step time waiting on the loader (inter-step gap)"));
  EXPECT_THAT(*summary, HasSubstr(StrFormat("Full report: gpuprof insights %s %lld",
                                            file.path().c_str(), static_cast<long long>(id))));

  auto loaded = db->LoadRun(id);
  ASSERT_TRUE(loaded.ok()) << loaded.error();
  const Report report = Analyze(loaded.value(), RuleContext{});
  ASSERT_EQ(loaded->insights.size(), report.insights.size());
  const auto rows = ToInsightRows(report);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(loaded->insights[i].ordinal, rows[i].ordinal);
    EXPECT_EQ(loaded->insights[i].rule_id, rows[i].rule_id);
    EXPECT_EQ(loaded->insights[i].severity, rows[i].severity);
    EXPECT_EQ(loaded->insights[i].message, rows[i].message);
    EXPECT_EQ(loaded->insights[i].fix, rows[i].fix);
  }
  EXPECT_EQ(loaded->insights[0].rule_id, "dataloader_stall");

  // Finalizing again replaces, never duplicates.
  ASSERT_TRUE(FinalizeRun(*db, id, file.path(), AnalysisOptions{}).ok());
  EXPECT_EQ(db->LoadRun(id)->insights.size(), rows.size());
}

TEST(SummaryText, WritesNothing) {
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  const int64_t id = testing::WriteRun(*db, StallRun().Build());
  auto summary = SummaryText(*db, id, "gpuprof.db", AnalysisOptions{});
  ASSERT_TRUE(summary.ok()) << summary.error();
  EXPECT_THAT(*summary, HasSubstr("Full report: gpuprof insights gpuprof.db"));
  EXPECT_TRUE(db->LoadRun(id)->insights.empty());
}

TEST(AnalyzeRun, UnknownRunIsAnError) {
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  auto report = AnalyzeRun(*db, 42, AnalysisOptions{});
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.error(), HasSubstr("no run 42"));
}

TEST(AnalyzeRun, RateFromEnvironmentAndOptions) {
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  RunBuilder b = StallRun();
  b.Gpu("Acme X1", 4);  // no reference rate
  b.run().end_ns = 1800 * kSec;
  const int64_t id = testing::WriteRun(*db, b.Build());
  {
    ScopedEnv env("GPUPROF_GPU_RATE", nullptr);
    auto r = AnalyzeRun(*db, id, AnalysisOptions{});
    ASSERT_TRUE(r.ok());
    bool skipped = false;
    for (const auto& n : r->not_evaluated) skipped = skipped || n.rule_id == "cost";
    EXPECT_TRUE(skipped);
  }
  {
    ScopedEnv env("GPUPROF_GPU_RATE", "2.00");
    auto r = AnalyzeRun(*db, id, AnalysisOptions{});
    ASSERT_TRUE(r.ok());
    const auto& last = r->insights.back();
    EXPECT_EQ(last.rule_id, "cost");
    EXPECT_EQ(last.message,
              "Estimated cost: " + FormatUsd(0.5 * 4 * 2.0) + " (30 min · 4× GPU @ $2.00/h)");
    AnalysisOptions opts;
    opts.gpu_rate_usd_per_hour = 1.0;  // the option wins over the environment
    auto o = AnalyzeRun(*db, id, opts);
    EXPECT_EQ(o->insights.back().message,
              "Estimated cost: " + FormatUsd(0.5 * 4 * 1.0) + " (30 min · 4× GPU @ $1.00/h)");
  }
}

}  // namespace
}  // namespace gpuprof::analysis
