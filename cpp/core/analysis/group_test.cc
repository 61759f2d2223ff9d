// Distributed rules (comm_dominant on one rank; bucket_skew and rank_skew across a group), the
// group view and its renderings, and AnalyzeStoredGroup against a real store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "analysis/analysis.h"
#include "analysis/format.h"
#include "analysis/group.h"
#include "analysis/rule_test_util.h"
#include "analysis/store_test_util.h"

namespace gpuprof::analysis {
namespace {

using testing::Eval;
using testing::EvalGroup;
using testing::kMs;
using testing::RunBuilder;
using testing::Split;
using testing::StepShape;
using ::testing::HasSubstr;

// ---------------------------------------------------------------- comm_dominant

// 20 steps of 100 ms on rank 0 of 2; every step has buckets at the given offsets (ms) into it.
RunBuilder Comm(const std::vector<std::pair<int64_t, int64_t>>& spans_ms) {
  RunBuilder b;
  b.Rank("job", 0, 2);
  b.Steps(20, Split(100, 5, 90));
  for (const auto& s : b.steps()) {
    int64_t bucket = 0;
    for (const auto& [a, z] : spans_ms) {
      b.CommBucket(s.step, bucket++, s.start_ns + a * kMs, s.start_ns + z * kMs, 25LL << 20);
    }
  }
  return b;
}

TEST(CommDominant, FiresWhenCollectivesFillTheStep) {
  // [50, 70] and [60, 80] overlap (30 ms together) plus [85, 95]: 40 ms of 100.
  const RuleResult r = Eval("comm_dominant", Comm({{50, 70}, {60, 80}, {85, 95}}));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "Collectives were in flight for 40% of step time (" +
                                    FormatDuration(40.0 * kMs) + " of " +
                                    FormatDuration(100.0 * kMs) + " per step, 3 buckets per step)");
  EXPECT_EQ(r.insight->evidence["steps"], 20u - kWarmupSteps);
}

TEST(CommDominant, NearMissAndSingleProcess) {
  EXPECT_FALSE(Eval("comm_dominant", Comm({{50, 60}, {70, 78}})).fired());  // 18%
  EXPECT_FALSE(Eval("comm_dominant", Comm({{50, 60}, {70, 78}})).skipped());
  // A process that is not distributed has no collectives to dominate.
  RunBuilder single;
  single.Steps(20, Split(100, 5, 90));
  const RuleResult r = Eval("comm_dominant", single);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(CommDominant, NotEvaluatedForARankWithoutTimings) {
  RunBuilder b;
  b.Rank("job", 3, 8).Steps(20, Split(100, 5, 90));
  EXPECT_THAT(*Eval("comm_dominant", b).not_evaluated,
              HasSubstr("rank of 8: gpuprof does not time DDP's collectives yet"));
  RunBuilder none;
  EXPECT_EQ(*Eval("comm_dominant", none).not_evaluated, "no steps recorded");
}

// ---------------------------------------------------------------- bucket_skew

// Rank `rank` of a job whose wall clock started `offset_ms` after a common epoch. On the common
// timeline step k's bucket b starts at 1000 + 100k + 50 + 5b ms, plus late_ms(k, b) on this
// rank; run-relative times subtract the offset, as a real rank's would.
RunBuilder Bucketed(int64_t rank, int64_t offset_ms,
                    const std::function<double(int64_t, int64_t)>& late_ms, int64_t steps = 20,
                    int64_t buckets = 4) {
  RunBuilder b;
  b.Rank("job", rank, 3);
  b.run().run_id = 10 + rank;
  b.run().start_unix_ns += offset_ms * kMs;
  b.Steps(static_cast<size_t>(steps), Split(100, 5, 90));
  for (int64_t k = 0; k < steps; ++k) {
    for (int64_t bk = 0; bk < buckets; ++bk) {
      const double common_ms = 1000 + 100 * k + 50 + 5 * bk + late_ms(k, bk);
      const auto start = static_cast<int64_t>((common_ms - offset_ms) * kMs);
      b.CommBucket(k, bk, start, start + 3 * kMs);
    }
  }
  return b;
}

const auto kOnTime = [](int64_t, int64_t) { return 0.0; };

TEST(BucketSkew, FiresHighWhenOneRankIsAlwaysLateOnOneBucket) {
  const RuleResult r = EvalGroup(
      "bucket_skew", {Bucketed(0, 0, kOnTime),
                      Bucketed(1, 37, [](int64_t, int64_t bk) { return bk == 3 ? 20.0 : 0.0; }),
                      Bucketed(2, -12, kOnTime)});
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kHigh);
  EXPECT_EQ(r.insight->message, "Bucket 3: rank 1 is late on 100% of steps (p95 delta " +
                                    FormatDuration(20.0 * kMs) + ")");
  EXPECT_EQ(r.insight->rule_id, "bucket_skew");
  EXPECT_EQ(r.insight->evidence["run_id"], 11);
}

TEST(BucketSkew, FiresMedAndCountsOtherFindings) {
  const RuleResult r = EvalGroup(
      "bucket_skew",
      {Bucketed(0, 0, kOnTime),
       Bucketed(1, 0, [](int64_t k, int64_t bk) { return bk == 3 && k % 10 < 7 ? 20.0 : 0.0; }),
       Bucketed(2, 0, [](int64_t k, int64_t bk) { return bk == 1 && k % 10 < 6 ? 4.0 : 0.0; })});
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "Bucket 3: rank 1 is late on 70% of steps (p95 delta " +
                                    FormatDuration(20.0 * kMs) +
                                    "); 1 more bucket/rank pair shows the same");
}

TEST(BucketSkew, NearMisses) {
  // Aligned by start_unix_ns, these ranks start every bucket together; read run-relative they
  // would look up to 49 ms apart.
  const RuleResult aligned = EvalGroup(
      "bucket_skew",
      {Bucketed(0, 0, kOnTime), Bucketed(1, 37, kOnTime), Bucketed(2, -12, kOnTime)});
  EXPECT_FALSE(aligned.fired());
  EXPECT_FALSE(aligned.skipped());
  // Late on half the steps only.
  EXPECT_FALSE(EvalGroup("bucket_skew",
                         {Bucketed(0, 0, kOnTime), Bucketed(1, 0, [](int64_t k, int64_t bk) {
                            return bk == 3 && k % 2 == 0 ? 20.0 : 0.0;
                          })})
                   .fired());
  // Always last, but by 0.5 ms: clock noise, not a straggler.
  EXPECT_FALSE(EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime),
                                         Bucketed(1, 0, [](int64_t, int64_t) { return 0.5; })})
                   .fired());
}

TEST(BucketSkew, NotEvaluated) {
  EXPECT_EQ(*EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime)}).not_evaluated,
            "needs at least 2 ranks; the group has 1");
  RunBuilder no_comm;
  no_comm.Rank("job", 1, 2).Steps(20, Split(100, 5, 90));
  EXPECT_EQ(*EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime), no_comm}).not_evaluated,
            "collective timings (comm_buckets) recorded on 1 of 2 ranks; needs at least 2");
  // AND with none recorded anywhere, the reason says gpuprof does not time them yet
  RunBuilder no_comm0;
  no_comm0.Rank("job", 0, 2).Steps(20, Split(100, 5, 90));
  EXPECT_THAT(*EvalGroup("bucket_skew", {no_comm0, no_comm}).not_evaluated,
              HasSubstr("gpuprof does not time DDP's collectives yet"));
  EXPECT_EQ(*EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime, 4), Bucketed(1, 0, kOnTime, 4)})
                 .not_evaluated,
            "no bucket was timed on 2+ ranks on at least 5 steps");
}

// ---------------------------------------------------------------- rank_skew

RunBuilder Ranked(int64_t rank, int64_t step_ms, size_t steps = 30) {
  RunBuilder b;
  b.Rank("job", rank, 4);
  b.run().run_id = 20 + rank;
  b.run().hostname = "node-" + std::to_string(rank);
  b.Steps(steps, Split(step_ms, 5, step_ms - 10));
  return b;
}

TEST(RankSkew, FiresOnTheSlowRank) {
  const RuleResult r = EvalGroup(
      "rank_skew", {Ranked(0, 62), Ranked(1, 62), Ranked(2, 63), Ranked(3, 87)});
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "Rank skew: rank 3 median step " + FormatDuration(87.0 * kMs) +
                                    " vs " + FormatDuration(62.0 * kMs) +
                                    ", the median of the other 3 ranks (" +
                                    FormatPercent(87.0 / 62 - 1) + " slower)");
}

TEST(RankSkew, TwoRanksNameTheOther) {
  const RuleResult r = EvalGroup("rank_skew", {Ranked(0, 62), Ranked(1, 87)});
  ASSERT_TRUE(r.fired());
  EXPECT_THAT(r.insight->message, HasSubstr("vs " + FormatDuration(62.0 * kMs) + " on rank 0 ("));
}

TEST(RankSkew, NearMiss) {
  const RuleResult r = EvalGroup("rank_skew", {Ranked(0, 62), Ranked(1, 62), Ranked(2, 72)});
  EXPECT_FALSE(r.fired());  // 16% slower
  EXPECT_FALSE(r.skipped());
}

TEST(RankSkew, NotEvaluatedWithoutTwoSteadyRanks) {
  EXPECT_EQ(*EvalGroup("rank_skew", {Ranked(0, 62)}).not_evaluated,
            "needs at least 2 ranks with a steady state; the group has 1");
  EXPECT_EQ(*EvalGroup("rank_skew", {Ranked(0, 62), Ranked(1, 90, 1)}).not_evaluated,
            "needs at least 2 ranks with a steady state; the group has 1");
}

// ---------------------------------------------------------------- group view and report

TEST(GroupView, OrdersByRankAndKeepsTheNewestRunOfARank) {
  RunBuilder old_rank0 = Ranked(0, 62);
  old_rank0.run().run_id = 5;
  RunBuilder unranked = Ranked(0, 62);
  unranked.run().rank.reset();
  unranked.run().run_id = 1;
  const GroupView g = BuildGroupView(
      "job", {Ranked(1, 62).Build(), unranked.Build(), Ranked(0, 62).Build(), old_rank0.Build()});
  ASSERT_EQ(g.ranks.size(), 3u);
  EXPECT_EQ(g.ranks[0].run().run_id, 20);  // rank 0, the newer of runs 5 and 20
  EXPECT_EQ(g.ranks[1].run().run_id, 21);  // rank 1
  EXPECT_EQ(g.ranks[2].run().run_id, 1);   // no rank: last
  ASSERT_EQ(g.superseded.size(), 1u);
  EXPECT_EQ(g.superseded[0].run_id, 5);
}

std::vector<store::RunData> SkewedGroup() {
  RunBuilder r0 = Ranked(0, 62);
  RunBuilder r1 = Ranked(1, 87);
  // Both ranks start bucket 0 of step k together (20 ms into rank 0's step): no bucket skew.
  for (RunBuilder* b : {&r0, &r1}) {
    for (int64_t k = 0; k < 30; ++k) b->CommBucket(k, 0, (62 * k + 20) * kMs, (62 * k + 30) * kMs);
  }
  return {r0.Build(), r1.Build()};
}

TEST(GroupReport, TextListsRanksInsightsAndSkippedRules) {
  const GroupReport report = AnalyzeGroup("job", SkewedGroup(), RuleContext{});
  ASSERT_EQ(report.insights.size(), 1u);
  EXPECT_EQ(report.insights[0].rule_id, "rank_skew");
  ASSERT_EQ(report.not_evaluated.size(), 0u);  // bucket_skew was evaluated and passed
  const std::string text = FormatGroupReport(report, "my runs.db");
  EXPECT_THAT(text, HasSubstr("gpuprof · group job · 2 ranks (runs 20, 21)\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex("\n +rank +run +host +status +steps +median +mean "
                                             "+p99 +loader wait +comm\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "\n +0 +20 +node-0 +ok +30 +" + FormatDuration(62.0 * kMs) + " +" +
                        FormatDuration(62.0 * kMs) + " +" + FormatDuration(62.0 * kMs) + " +" +
                        FormatPercent(5.0 / 62, 1) + " +" + FormatPercent(10.0 / 62, 1) + "\n"));
  EXPECT_THAT(text, HasSubstr("[MED]   " + report.insights[0].message));
  EXPECT_THAT(text, HasSubstr("fix: " + report.insights[0].fix));
  EXPECT_THAT(text, HasSubstr("Per-rank reports: gpuprof insights 'my runs.db' RUN (e.g. 20)"));
}

TEST(GroupReport, JsonHasRanksInsightsAndNotEvaluated) {
  std::vector<store::RunData> runs = SkewedGroup();
  runs[1].comm_buckets.clear();
  const GroupReport report = AnalyzeGroup("job", std::move(runs), RuleContext{});
  const nlohmann::json j = GroupReportJson(report);
  EXPECT_EQ(j["format"], "gpuprof.group_insights/1");
  EXPECT_EQ(j["group_id"], "job");
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][1]["rank"], 1);
  EXPECT_EQ(j["ranks"][1]["run_id"], 21);
  EXPECT_DOUBLE_EQ(j["ranks"][1]["steady"]["p50_ns"].get<double>(), 87.0 * kMs);
  EXPECT_TRUE(j["ranks"][1]["comm_fraction"].is_null());  // not measured, not 0
  ASSERT_EQ(j["insights"].size(), 1u);
  EXPECT_EQ(j["insights"][0]["rule_id"], "rank_skew");
  ASSERT_EQ(j["not_evaluated"].size(), 1u);
  EXPECT_EQ(j["not_evaluated"][0]["rule_id"], "bucket_skew");
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);
}

// ---------------------------------------------------------------- through the store

TEST(AnalyzeStoredGroup, LoadsEveryRankAndMatchesThePureAnalysis) {
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  const auto late_on_3 = [](int64_t, int64_t bk) { return bk == 3 ? 20.0 : 0.0; };
  std::vector<RunBuilder> ranks = {Bucketed(0, 0, kOnTime), Bucketed(1, 37, late_on_3),
                                   Bucketed(2, -12, kOnTime)};
  testing::WriteRun(*db, testing::HealthyRun().Build());  // not in the group
  std::vector<store::RunData> written;
  for (RunBuilder& b : ranks) {
    const int64_t id = testing::WriteRun(*db, b.Build());
    b.run().run_id = id;
    written.push_back(b.Build());
  }
  auto stored = AnalyzeStoredGroup(*db, "job", AnalysisOptions{});
  ASSERT_TRUE(stored.ok()) << stored.error();
  const GroupReport pure = AnalyzeGroup("job", written, RuleContext{});
  ASSERT_EQ(stored->view.ranks.size(), 3u);
  ASSERT_EQ(stored->insights.size(), pure.insights.size());
  for (size_t i = 0; i < pure.insights.size(); ++i) {
    EXPECT_EQ(stored->insights[i].message, pure.insights[i].message);
    EXPECT_EQ(stored->insights[i].evidence, pure.insights[i].evidence);
  }
  EXPECT_EQ(stored->insights[0].rule_id, "bucket_skew");
  EXPECT_EQ(FormatGroupReport(*stored, file.path()), FormatGroupReport(pure, file.path()));
}

TEST(AnalyzeStoredGroup, UnknownGroupNamesTheGroupsThatExist) {
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  testing::WriteRun(*db, testing::HealthyRun().Build());
  auto none = AnalyzeStoredGroup(*db, "job", AnalysisOptions{});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error(),
            "no runs with group_id 'job' in " + file.path() + " (no run in it has a group_id)");
  testing::WriteRun(*db, Ranked(0, 62).Build());
  RunBuilder other = Ranked(0, 62);
  other.run().group_id = "alpha";
  testing::WriteRun(*db, other.Build());
  auto wrong = AnalyzeStoredGroup(*db, "jbo", AnalysisOptions{});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error(),
            "no runs with group_id 'jbo' in " + file.path() + " (groups: alpha, job)");
}

}  // namespace
}  // namespace gpuprof::analysis
