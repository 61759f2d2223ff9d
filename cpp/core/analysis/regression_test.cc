// The regression rule on in-memory baselines, and AnalyzeRun building the baseline from the
// earlier runs of the same name in a real store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "analysis/analysis.h"
#include "analysis/format.h"
#include "analysis/rule_test_util.h"
#include "analysis/run_loader.h"
#include "analysis/store_test_util.h"

namespace gpuprof::analysis {
namespace {

using testing::Eval;
using testing::kMs;
using testing::RunBuilder;
using testing::Split;
using testing::StepShape;
using testing::WithPreviousRuns;
using ::testing::HasSubstr;

// A run named `name` of 30 steps of `step_ms` (steady median = step_ms).
RunBuilder Paced(double step_ms, const std::string& name = "baseline") {
  RunBuilder b;
  b.Name(name);
  const auto ms = static_cast<int64_t>(step_ms * 10);  // tenths of a millisecond
  StepShape s = Split(100, 5, 90);
  s.duration_ns = ms * kMs / 10;
  b.Steps(30, s);
  return b;
}

TEST(Regression, FiresMedWhenSlowerThanTheLastThreeRuns) {
  const RuleResult r = Eval("regression", Paced(152), WithPreviousRuns({108, 110, 104}));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "Regression vs last 3 runs of 'baseline' (median): step time " +
                                    FormatDuration(152.0 * kMs) + " vs " +
                                    FormatDuration(108.0 * kMs) + " (" +
                                    FormatPercent(152.0 / 108 - 1) + " slower)");
  EXPECT_EQ(r.insight->message,
            "Regression vs last 3 runs of 'baseline' (median): step time 152.0 ms vs 108.0 ms "
            "(41% slower)");
  // The fix names the baseline runs, oldest first.
  EXPECT_THAT(r.insight->fix, HasSubstr("Diff this run against runs 98, 99 and 100"));
  EXPECT_EQ(r.insight->evidence["baseline_run_ids"], nlohmann::json({100, 99, 98}));
}

TEST(Regression, OnePreviousRunIsNamed) {
  const RuleResult r = Eval("regression", Paced(130), WithPreviousRuns({100}, 7));
  ASSERT_TRUE(r.fired());
  EXPECT_THAT(r.insight->message,
              HasSubstr("Regression vs the previous run of 'baseline' (run 7): step time"));
  EXPECT_THAT(r.insight->fix, HasSubstr("against run 7 "));
}

TEST(Regression, ImprovementsAreReportedAsInfo) {
  const RuleResult r = Eval("regression", Paced(86.4), WithPreviousRuns({108, 108, 108}));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kInfo);
  EXPECT_EQ(r.insight->message,
            "Improvement vs last 3 runs of 'baseline' (median): step time " +
                FormatDuration(86.4 * kMs) + " vs " + FormatDuration(108.0 * kMs) + " (" +
                FormatPercent(1 - 86.4 / 108) + " faster)");
}

TEST(Regression, NearMisses) {
  for (double ms : {115.0, 98.0}) {  // 6.5% slower, 9.3% faster
    const RuleResult r = Eval("regression", Paced(ms), WithPreviousRuns({108, 108, 108}));
    EXPECT_FALSE(r.fired()) << ms;
    EXPECT_FALSE(r.skipped()) << ms;
  }
}

TEST(Regression, BaselineSkipsRunsWithoutASteadyStateAndUsesAtMostThree) {
  RuleContext ctx = WithPreviousRuns({0, 108, 108, 108, 50});
  ctx.previous_runs->front().steady_median_ns.reset();  // newest run had one step
  const RuleResult r = Eval("regression", Paced(108), ctx);
  EXPECT_FALSE(r.fired());  // the 50 ms run is the 4th comparable one: outside the baseline
  EXPECT_FALSE(r.skipped());
}

TEST(Regression, NotEvaluated) {
  EXPECT_EQ(*Eval("regression", Paced(100)).not_evaluated,
            "previous runs not loaded (analysis without a store)");
  EXPECT_EQ(*Eval("regression", Paced(100), WithPreviousRuns({})).not_evaluated,
            "no earlier finished run named 'baseline' in this DB");
  RuleContext short_runs = WithPreviousRuns({100, 100});
  for (auto& p : *short_runs.previous_runs) p.steady_median_ns.reset();
  EXPECT_EQ(*Eval("regression", Paced(100), short_runs).not_evaluated,
            "the 2 earlier runs named 'baseline' have no steady-state step time");
  RunBuilder one_step;
  one_step.Name("baseline").Step(Split(100, 5, 90));
  EXPECT_THAT(*Eval("regression", one_step, WithPreviousRuns({100})).not_evaluated,
              HasSubstr("only 1 step"));
}

// ---------------------------------------------------------------- through the store

TEST(RegressionInStore, AnalyzeRunComparesWithTheFinishedRunsOfTheSameName) {
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  std::vector<int64_t> ids;
  ids.push_back(testing::WriteRun(*db, Paced(90).Build()));    // 4th newest: outside the baseline
  ids.push_back(testing::WriteRun(*db, Paced(104).Build()));
  ids.push_back(testing::WriteRun(*db, Paced(108).Build()));
  ids.push_back(testing::WriteRun(*db, Paced(300, "other").Build()));  // another name
  RunBuilder killed = Paced(500);
  killed.run().status = "running";  // never finished: not a baseline
  ids.push_back(testing::WriteRun(*db, killed.Build()));
  RunBuilder tiny = Paced(40);
  tiny.run().status = "failed";
  ids.push_back(testing::WriteRun(*db, tiny.Build()));  // finished (failed) but comparable
  ids.push_back(testing::WriteRun(*db, Paced(152).Build()));
  const int64_t current = ids.back();

  auto prior = LoadPriorRuns(*db, db->LoadRun(current)->run);
  ASSERT_TRUE(prior.ok()) << prior.error();
  ASSERT_EQ(prior->size(), 3u);  // stops after three comparable runs
  EXPECT_EQ((*prior)[0].run_id, ids[5]);
  EXPECT_EQ((*prior)[0].status, "failed");
  EXPECT_EQ((*prior)[1].run_id, ids[2]);
  EXPECT_EQ((*prior)[2].run_id, ids[1]);
  EXPECT_DOUBLE_EQ(*(*prior)[1].steady_median_ns, 108.0 * kMs);

  auto report = AnalyzeRun(*db, current, AnalysisOptions{});
  ASSERT_TRUE(report.ok()) << report.error();
  const Insight* regression = nullptr;
  for (const Insight& in : report->insights) {
    if (in.rule_id == "regression") regression = &in;
  }
  ASSERT_NE(regression, nullptr);
  // Baseline: median of 40, 108 and 104 ms = 104 ms.
  EXPECT_EQ(regression->message, "Regression vs last 3 runs of 'baseline' (median): step time " +
                                     FormatDuration(152.0 * kMs) + " vs " +
                                     FormatDuration(104.0 * kMs) + " (" +
                                     FormatPercent(152.0 / 104 - 1) + " slower)");
  // The same analysis with the store's baseline handed in by hand gives the same insight.
  RuleContext ctx;
  ctx.previous_runs = *prior;
  auto loaded = db->LoadRun(current);
  const Report pure = Analyze(std::move(loaded).value(), ctx);
  ASSERT_EQ(pure.insights.size(), report->insights.size());
  for (size_t i = 0; i < pure.insights.size(); ++i) {
    EXPECT_EQ(pure.insights[i].message, report->insights[i].message);
    EXPECT_EQ(pure.insights[i].evidence, report->insights[i].evidence);
  }
  // FinalizeRun stores it with the rest.
  ASSERT_TRUE(FinalizeRun(*db, current, file.path(), AnalysisOptions{}).ok());
  auto after = db->LoadRun(current);
  ASSERT_TRUE(after.ok()) << after.error();
  bool stored = false;
  for (const auto& row : after->insights) stored |= row.rule_id == "regression";
  EXPECT_TRUE(stored);
}

TEST(RegressionInStore, FirstRunOfANameIsNotEvaluated) {
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  const int64_t id = testing::WriteRun(*db, Paced(100, "fresh").Build());
  auto report = AnalyzeRun(*db, id, AnalysisOptions{});
  ASSERT_TRUE(report.ok()) << report.error();
  std::string reason;
  for (const auto& n : report->not_evaluated) {
    if (n.rule_id == "regression") reason = n.reason;
  }
  EXPECT_EQ(reason, "no earlier finished run named 'fresh' in this DB");
}

}  // namespace
}  // namespace gpuprof::analysis
