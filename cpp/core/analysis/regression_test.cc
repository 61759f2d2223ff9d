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
using ::testing::HasSubstr;
using testing::kMs;
using testing::RunBuilder;
using testing::Split;
using testing::StepShape;
using testing::WithPreviousRuns;

// A run named `name` of 30 steps of `step_ms` (steady time per step = step_ms).
RunBuilder Paced(double step_ms, const std::string& name = "baseline") {
  RunBuilder b;
  b.Name(name);
  const auto ms = static_cast<int64_t>(step_ms * 10);  // tenths of a millisecond
  StepShape s = Split(100, 5, 90);
  s.duration_ns = ms * kMs / 10;
  b.Steps(30, s);
  return b;
}

// A loader that delivers batches in pairs: `n` steps alternating a long wait (`long_ms`, of which
// `long_ms - 4` waiting on the DataLoader) with none (`short_ms`); `long_share` of them long, the
// long ones spread evenly.
RunBuilder Paired(int64_t long_ms, int64_t short_ms, size_t n = 40, double long_share = 0.5) {
  RunBuilder b;
  b.Name("baseline");
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += long_share;
    const bool is_long = acc >= 1.0;
    if (is_long) acc -= 1.0;
    StepShape s = is_long ? Split(long_ms, long_ms - 4, 3) : Split(short_ms, 0, 3);
    s.wait_source = "dataloader";
    b.Step(s);
  }
  return b;
}

// The earlier run `b` as the regression rule's baseline sees it (what LoadPriorRuns reads).
PriorRun PriorOf(const RunBuilder& b, int64_t id) {
  const RunView v = BuildRunView(b.Build());
  const auto t = MeasureThroughput(v);
  PriorRun p;
  p.run_id = id;
  p.status = "ok";
  p.steps = v.steps.size();
  p.steady_steps = t ? t->steps : 0;
  if (t) p.steady_mean_ns = t->mean_ns;
  if (t) p.spread = t->spread;
  return p;
}

RuleContext Baseline(std::vector<PriorRun> runs) {
  RuleContext ctx;
  ctx.previous_runs = std::move(runs);
  return ctx;
}

double SteadyMeanMs(const RunBuilder& b) {
  return MeasureThroughput(BuildRunView(b.Build()))->mean_ns / kMs;
}

TEST(Regression, FiresMedWhenSlowerThanTheLastThreeRuns) {
  const RuleResult r = Eval("regression", Paced(152), WithPreviousRuns({108, 110, 104}));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "Regression vs last 3 runs of 'baseline' (median): " + FormatDuration(152.0 * kMs) +
                " per step vs " + FormatDuration(108.0 * kMs) + " (" +
                FormatPercent(152.0 / 108 - 1) +
                " slower; steady-state time per step, loader wait included)");
  EXPECT_EQ(r.insight->message,
            "Regression vs last 3 runs of 'baseline' (median): 152.0 ms per step vs 108.0 ms "
            "(41% slower; steady-state time per step, loader wait included)");
  // The fix names the baseline runs, oldest first.
  EXPECT_THAT(r.insight->fix, HasSubstr("Diff this run against runs 98, 99 and 100"));
  EXPECT_EQ(r.insight->evidence["baseline_run_ids"], nlohmann::json({100, 99, 98}));
  EXPECT_DOUBLE_EQ(r.insight->evidence["ratio"].get<double>(), 152.0 / 108);
}

TEST(Regression, LargeChangesReadAsMultiples) {
  const RuleResult slow = Eval("regression", Paced(1500), WithPreviousRuns({100}, 7));
  ASSERT_TRUE(slow.fired());
  EXPECT_THAT(slow.insight->message,
              HasSubstr("Regression vs the previous run of 'baseline' (run 7): 1.50 s per step "
                        "vs 100.0 ms (15.0× slower;"));
  EXPECT_THAT(slow.insight->fix, HasSubstr("against run 7 "));
  const RuleResult fast = Eval("regression", Paced(7), WithPreviousRuns({98}, 7));
  ASSERT_TRUE(fast.fired());
  EXPECT_EQ(fast.insight->severity, Severity::kInfo);
  EXPECT_THAT(fast.insight->message, HasSubstr("7.0 ms per step vs 98.0 ms (14.0× faster;"));
}

TEST(Regression, ImprovementsAreReportedAsInfo) {
  const RuleResult r = Eval("regression", Paced(86.4), WithPreviousRuns({108, 108, 108}));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kInfo);
  EXPECT_EQ(r.insight->message,
            "Improvement vs last 3 runs of 'baseline' (median): " + FormatDuration(86.4 * kMs) +
                " per step vs " + FormatDuration(108.0 * kMs) + " (" +
                FormatPercent(1 - 86.4 / 108) +
                " faster; steady-state time per step, loader wait included)");
}

TEST(Regression, NearMisses) {
  for (double ms : {115.0, 98.0}) {  // 6.5% slower, 9.3% faster
    const RuleResult r = Eval("regression", Paced(ms), WithPreviousRuns({108, 108, 108}));
    EXPECT_FALSE(r.fired()) << ms;
    EXPECT_FALSE(r.skipped()) << ms;
  }
}

TEST(Regression, APairedLoaderIsJudgedByItsThroughputNotItsMedian) {
  // GIVEN a baseline whose loader delivers batches in pairs: steps alternate 155 ms / 4 ms
  const RunBuilder base = Paired(155, 4);
  // WHEN an identical run is compared with it
  const RuleResult same = Eval("regression", Paired(155, 4), Baseline({PriorOf(base, 1)}));
  // THEN nothing changed
  EXPECT_FALSE(same.fired());
  EXPECT_FALSE(same.skipped());
  // WHEN the loader gets 3× slower (the waits triple, the steps alternate 465 / 12 ms)
  const RuleResult slow = Eval("regression", Paired(465, 12), Baseline({PriorOf(base, 1)}));
  // THEN the size is the wall-time ratio: 3×
  ASSERT_TRUE(slow.fired());
  EXPECT_NEAR(slow.insight->evidence["ratio"].get<double>(), 3.0, 1e-9);
  EXPECT_THAT(slow.insight->message, HasSubstr("(3.0× slower;"));
  // WHEN the share of long steps falls from 60% to 40%, the median jumps from the long mode to
  // the short one, but the time per step falls by a third only
  const RunBuilder mostly_long = Paired(155, 4, 40, 0.6);
  const RunBuilder mostly_short = Paired(155, 4, 40, 0.4);
  const RuleResult better = Eval("regression", mostly_short, Baseline({PriorOf(mostly_long, 1)}));
  ASSERT_TRUE(better.fired());
  const double truth = SteadyMeanMs(mostly_short) / SteadyMeanMs(mostly_long);
  EXPECT_NEAR(better.insight->evidence["ratio"].get<double>(), truth, 1e-9);
  EXPECT_GT(truth, 0.6);
  EXPECT_LT(truth, 0.75);
}

TEST(Regression, ANoisyRunIsInconclusive) {
  // GIVEN a flat baseline and a run whose pace doubles halfway through (90 ms, then 180 ms):
  // 35% slower on average, but its blocks of steps vary ±40%
  RunBuilder noisy;
  noisy.Name("baseline");
  StepShape a = Split(100, 5, 90), b = Split(100, 5, 90);
  a.duration_ns = 90 * kMs;
  b.duration_ns = 180 * kMs;
  noisy.Steps(kWarmupSteps + 20, a).Steps(20, b);
  const RuleResult r = Eval("regression", noisy, WithPreviousRuns({100}, 7, 0.0));
  // THEN no size is claimed: it is inconclusive, with the numbers
  ASSERT_TRUE(r.skipped());
  EXPECT_THAT(*r.not_evaluated, ::testing::StartsWith("inconclusive: "));
  EXPECT_THAT(*r.not_evaluated, HasSubstr("vs 100.0 ms in run 7 (35% slower), within the noise"));
  EXPECT_THAT(*r.not_evaluated, HasSubstr("a longer run decides"));
}

TEST(Regression, DisagreeingBaselineRunsWidenTheNoise) {
  // GIVEN baseline runs at 100, 130 and 160 ms per step: a run at 150 ms is 15% above their
  // median, but inside their own spread
  const RuleResult r = Eval("regression", Paced(150), WithPreviousRuns({100, 130, 160}));
  ASSERT_TRUE(r.skipped());
  EXPECT_THAT(*r.not_evaluated, ::testing::StartsWith("inconclusive: 150.0 ms per step vs "
                                                      "130.0 ms in runs 98, 99 and 100"));
  // AND far beyond it, the change is reported
  EXPECT_TRUE(Eval("regression", Paced(400), WithPreviousRuns({100, 130, 160})).fired());
}

TEST(Regression, ShortRunsAreInconclusive) {
  RunBuilder short_run;
  short_run.Name("baseline").Steps(kWarmupSteps + 8, Split(300, 5, 90));
  EXPECT_EQ(*Eval("regression", short_run, WithPreviousRuns({100})).not_evaluated,
            "inconclusive: only 8 steady-state steps in this run; comparing throughput needs at "
            "least 10 (run 13+ steps)");
  // AND earlier runs that short are not a baseline
  RuleContext short_base = WithPreviousRuns({100, 100});
  for (auto& p : *short_base.previous_runs) p.steady_steps = 9;
  EXPECT_EQ(*Eval("regression", Paced(300), short_base).not_evaluated,
            "the 2 earlier runs named 'baseline' have fewer than 10 steady-state steps, too few "
            "to compare; a run of 13+ steps becomes the baseline");
}

TEST(Regression, BaselineSkipsRunsWithoutASteadyStateAndUsesAtMostThree) {
  RuleContext ctx = WithPreviousRuns({0, 108, 108, 108, 50});
  ctx.previous_runs->front().steady_mean_ns.reset();  // newest run had one step
  ctx.previous_runs->front().steady_steps = 0;
  const RuleResult r = Eval("regression", Paced(108), ctx);
  EXPECT_FALSE(r.fired());  // the 50 ms run is the 4th comparable one: outside the baseline
  EXPECT_FALSE(r.skipped());
}

TEST(Regression, NotEvaluated) {
  EXPECT_EQ(*Eval("regression", Paced(100)).not_evaluated,
            "previous runs not loaded (analysis without a store)");
  EXPECT_EQ(*Eval("regression", Paced(100), WithPreviousRuns({})).not_evaluated,
            "no earlier finished run named 'baseline' in this DB");
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
  ids.push_back(testing::WriteRun(*db, Paced(90).Build()));  // 4th newest: outside the baseline
  ids.push_back(testing::WriteRun(*db, Paced(104).Build()));
  ids.push_back(testing::WriteRun(*db, Paced(108).Build()));
  ids.push_back(testing::WriteRun(*db, Paced(300, "other").Build()));  // another name
  RunBuilder killed = Paced(500);
  killed.run().status = "running";  // never finished: not a baseline
  ids.push_back(testing::WriteRun(*db, killed.Build()));
  RunBuilder crashed = Paced(100);
  crashed.run().status = "failed";
  ids.push_back(testing::WriteRun(*db, crashed.Build()));  // finished (failed) but comparable
  ids.push_back(testing::WriteRun(*db, Paced(152).Build()));
  const int64_t current = ids.back();

  auto prior = LoadPriorRuns(*db, db->LoadRun(current)->run);
  ASSERT_TRUE(prior.ok()) << prior.error();
  ASSERT_EQ(prior->size(), 3u);  // stops after three comparable runs
  EXPECT_EQ((*prior)[0].run_id, ids[5]);
  EXPECT_EQ((*prior)[0].status, "failed");
  EXPECT_EQ((*prior)[1].run_id, ids[2]);
  EXPECT_EQ((*prior)[2].run_id, ids[1]);
  EXPECT_DOUBLE_EQ(*(*prior)[1].steady_mean_ns, 108.0 * kMs);
  EXPECT_EQ((*prior)[1].steady_steps, 27u);

  auto report = AnalyzeRun(*db, current, AnalysisOptions{});
  ASSERT_TRUE(report.ok()) << report.error();
  const Insight* regression = nullptr;
  for (const Insight& in : report->insights) {
    if (in.rule_id == "regression") regression = &in;
  }
  ASSERT_NE(regression, nullptr);
  // Baseline: median of 100, 108 and 104 ms = 104 ms.
  EXPECT_THAT(regression->message, HasSubstr("Regression vs last 3 runs of 'baseline' (median): " +
                                             FormatDuration(152.0 * kMs) + " per step vs " +
                                             FormatDuration(104.0 * kMs) + " (" +
                                             FormatPercent(152.0 / 104 - 1) + " slower;"));
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
