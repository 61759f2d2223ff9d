// Distributed rules (comm_dominant on one rank; bucket_skew and rank_skew across a group), the
// group view and its renderings, and AnalyzeStoredGroup against a real store.
#include "analysis/group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "analysis/analysis.h"
#include "analysis/format.h"
#include "analysis/rule_test_util.h"
#include "analysis/run_loader.h"
#include "analysis/store_test_util.h"

namespace gpuprof::analysis {
namespace {

using testing::Eval;
using testing::EvalGroup;
using ::testing::HasSubstr;
using testing::kMs;
using ::testing::Not;
using testing::RunBuilder;
using testing::Split;
using testing::StepShape;

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

TEST(CommDominant, GradientAccumulationGetsTheFixForHowItReduces) {
  // GIVEN steps of 4 backward passes whose 2 buckets are all-reduced after each pass (8 rows a
  // step: 4 × [10, 20] and [30, 40] ... apart by 25 ms), no no_sync()
  RunBuilder b;
  b.Rank("job", 0, 2).Steps(20, Split(100, 5, 90)).BackwardPasses(4);
  for (const auto& s : b.steps()) {
    for (int64_t pass = 0; pass < 4; ++pass) {
      const int64_t at = s.start_ns + pass * 25 * kMs;
      b.CommBucket(s.step, 0, at + 5 * kMs, at + 12 * kMs, 1 << 20);
      b.CommBucket(s.step, 1, at + 12 * kMs, at + 20 * kMs, 1 << 20);
    }
  }
  const RuleResult every = Eval("comm_dominant", b);
  // THEN it says each bucket went 4 times a step and the fix is no_sync()
  ASSERT_TRUE(every.fired());
  EXPECT_THAT(every.insight->message,
              HasSubstr("8 buckets per step): each bucket was all-reduced 4 times a step, after "
                        "each of its 4 backward passes"));
  EXPECT_EQ(every.insight->fix, thresholds::kCommDominantNoSyncFix);
  EXPECT_EQ(every.insight->evidence["syncs_per_step"], 4.0);

  // GIVEN the same steps reducing once, after the last pass (no_sync() on the others)
  RunBuilder once;
  once.Rank("job", 0, 2).Steps(20, Split(100, 5, 90)).BackwardPasses(4);
  for (const auto& s : once.steps()) {
    once.CommBucket(s.step, 0, s.start_ns + 60 * kMs, s.start_ns + 80 * kMs, 1 << 20);
    once.CommBucket(s.step, 1, s.start_ns + 75 * kMs, s.start_ns + 95 * kMs, 1 << 20);
  }
  const RuleResult accumulating = Eval("comm_dominant", once);
  // THEN no_sync() is not suggested again: more micro-batches per step is
  ASSERT_TRUE(accumulating.fired());
  EXPECT_THAT(accumulating.insight->message,
              HasSubstr("2 buckets per step): one all-reduce per 4 backward passes"));
  EXPECT_EQ(accumulating.insight->fix, thresholds::kCommDominantAccumulatingFix);
  EXPECT_THAT(accumulating.insight->fix, Not(HasSubstr("no_sync")));

  // AND one backward pass a step keeps the general fix and message
  const RuleResult plain = Eval("comm_dominant", Comm({{50, 70}, {60, 80}, {85, 95}}));
  EXPECT_EQ(plain.insight->fix, thresholds::kCommDominantFix);
  // AND one bucket a step is "1 bucket"
  EXPECT_THAT(Eval("comm_dominant", Comm({{50, 80}})).insight->message,
              HasSubstr("per step, 1 bucket per step)"));
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
  // gpuprof times DDP's buckets with a comm hook of its own: none means it was not installed.
  EXPECT_EQ(*Eval("comm_dominant", b).not_evaluated,
            "no collective timings: the DDP comm hook was not installed (no "
            "DistributedDataParallel model in auto mode, FSDP/DeepSpeed, or a comm hook "
            "registered before profile() started; see the run's diagnostics)");
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
  const RuleResult aligned =
      EvalGroup("bucket_skew",
                {Bucketed(0, 0, kOnTime), Bucketed(1, 37, kOnTime), Bucketed(2, -12, kOnTime)});
  EXPECT_FALSE(aligned.fired());
  EXPECT_FALSE(aligned.skipped());
  // Late on half the steps only.
  EXPECT_FALSE(EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime),
                                         Bucketed(1, 0,
                                                  [](int64_t k, int64_t bk) {
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
  // AND with none recorded anywhere, the reason says the comm hook was not installed
  RunBuilder no_comm0;
  no_comm0.Rank("job", 0, 2).Steps(20, Split(100, 5, 90));
  EXPECT_THAT(*EvalGroup("bucket_skew", {no_comm0, no_comm}).not_evaluated,
              HasSubstr("no collective timings: the DDP comm hook was not installed ("));
  EXPECT_EQ(*EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime, 4), Bucketed(1, 0, kOnTime, 4)})
                 .not_evaluated,
            "no bucket was timed on 2+ ranks on at least 5 steps");
}

// The "distributed" object the recording side writes into runs.config_json.
std::string Distributed(const nlohmann::json& fields) {
  return nlohmann::json{{"distributed", fields}}.dump();
}

TEST(BucketSkew, SubtractsEachRanksMeasuredClockOffset) {
  // GIVEN two ranks that start every bucket together, rank 1's wall clock reading 30 ms ahead
  // of rank 0's (so are its run's start and every time on it)
  RunBuilder r1 = Bucketed(1, 0, kOnTime);
  r1.run().start_unix_ns += 30 * kMs;
  // WHEN no offset was measured THEN rank 1 looks late on every bucket
  EXPECT_TRUE(EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime), r1}).fired());
  // WHEN its offset to rank 0 was measured THEN the ranks line up
  r1.Config(Distributed({{"rank", 1},
                         {"clock_offset_ns", 30 * kMs},
                         {"clock_uncertainty_ns", 56'000},
                         {"clock_reference_rank", 0}}));
  const RuleResult aligned = EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime), r1});
  EXPECT_FALSE(aligned.fired());
  EXPECT_FALSE(aligned.skipped());
  // AND a real straggler is measured by its own delay, not the clocks'
  RunBuilder late = Bucketed(1, 0, [](int64_t, int64_t bk) { return bk == 3 ? 20.0 : 0.0; });
  late.run().start_unix_ns += 30 * kMs;
  late.Config(*r1.run().config_json);
  const RuleResult r = EvalGroup("bucket_skew", {Bucketed(0, 0, kOnTime), late});
  ASSERT_TRUE(r.fired());
  EXPECT_DOUBLE_EQ(r.insight->evidence["p95_delta_ns"].get<double>(), 20.0 * kMs);
  EXPECT_EQ(r.insight->evidence["aligned_ranks"], 2);  // rank 0 is the reference
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
  const RuleResult r =
      EvalGroup("rank_skew", {Ranked(0, 62), Ranked(1, 62), Ranked(2, 63), Ranked(3, 87)});
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->evidence["basis"], "step_time");  // no collective timings to go by
  EXPECT_EQ(r.insight->message, "Rank skew: rank 3 median step " + FormatDuration(87.0 * kMs) +
                                    " vs " + FormatDuration(62.0 * kMs) +
                                    ", the median of the other 3 ranks (" +
                                    FormatPercent(87.0 / 62 - 1) + " slower)");
}

TEST(RankSkew, QuotesTheStragglersOwnLeadingFindingAndItsFix) {
  // GIVEN the slow rank's own report: a communication finding first (about the others' wait,
  // not its cause), then a loader stall
  RunBuilder slow = Ranked(3, 87);
  slow.StoredInsight("comm_dominant", "distributed", "med", "Collectives were in flight ...",
                     "Shrink or overlap communication.");
  slow.StoredInsight("dataloader_stall", "data_pipeline", "high",
                     "34% of step time waiting on the loader", "Raise num_workers.");
  const RuleResult r =
      EvalGroup("rank_skew", {Ranked(0, 62), Ranked(1, 62), Ranked(2, 63), std::move(slow)});
  // THEN the group finding ends with the stall, and its fix starts there
  ASSERT_TRUE(r.fired());
  EXPECT_THAT(
      r.insight->message,
      ::testing::EndsWith(" slower); its own report leads with [HIGH] 34% of step time waiting on "
                          "the loader"));
  EXPECT_EQ(r.insight->fix,
            "Start with rank 3's own finding (dataloader_stall): Raise num_workers.");
  EXPECT_EQ(r.insight->evidence["straggler_insight"]["rule_id"], "dataloader_stall");
  // AND without a stored finding the message and fix are the rule's own
  const RuleResult bare =
      EvalGroup("rank_skew", {Ranked(0, 62), Ranked(1, 62), Ranked(2, 63), Ranked(3, 87)});
  EXPECT_TRUE(bare.insight->evidence["straggler_insight"].is_null());
  EXPECT_THAT(bare.insight->fix, Not(HasSubstr("own finding")));
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

// Rank `rank` of 2 of a synchronous (DDP) job: 20 steps of 100 ms, started together on every
// rank (each waits for the slowest in the collectives); its buckets 0..3 are ready at
// ready_ms(bucket) into the step and every collective has finished at end_ms.
RunBuilder Ddp(int64_t rank, const std::function<double(int64_t)>& ready_ms, int64_t end_ms = 75) {
  RunBuilder b;
  b.Rank("job", rank, 2);
  b.run().run_id = 30 + rank;
  b.Steps(20, Split(100, 5, 90));
  for (const auto& s : b.steps()) {
    for (int64_t bk = 0; bk < 4; ++bk) {
      b.CommBucket(s.step, bk, s.start_ns + static_cast<int64_t>(ready_ms(bk) * kMs),
                   s.start_ns + end_ms * kMs);
    }
  }
  return b;
}
// Rank 0's backward readies a bucket every 10 ms from 20 ms on.
const auto kFast = [](int64_t bk) { return 20.0 + 10.0 * static_cast<double>(bk); };
// A rank whose whole backward is 50% slower: late on every bucket, by 20 ms on the last.
const auto kSlow = [](int64_t bk) { return 10.0 + 15.0 * static_cast<double>(bk + 1); };
// A rank with 25 ms more work before bucket 2 (late on buckets 2 and 3 only).
const auto kSlowBefore2 = [](int64_t bk) { return kFast(bk) + (bk >= 2 ? 25.0 : 0.0); };

TEST(RankSkew, FindsTheSlowRankOfASynchronousJobByItsWorkTime) {
  // GIVEN a DDP job whose ranks all take 100 ms per step, rank 1 working 20 ms longer before
  // its last bucket while rank 0 waits for it in the collectives
  const RuleResult r = EvalGroup("rank_skew", {Ddp(0, kFast), Ddp(1, kSlow)});
  // THEN rank_skew compares the work time: rank 0 works 100 - 20 = 80 ms, rank 1 100 ms
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->message, "Rank skew: rank 1 works " + FormatDuration(100.0 * kMs) +
                                    " per step vs " + FormatDuration(80.0 * kMs) +
                                    " on rank 0 (25% slower; the others wait for it in the "
                                    "collectives)");
  EXPECT_EQ(r.insight->evidence["basis"], "work_time");
  EXPECT_EQ(r.insight->evidence["run_id"], 31);
  EXPECT_DOUBLE_EQ(r.insight->evidence["others_median_ns"].get<double>(), 80.0 * kMs);
  EXPECT_DOUBLE_EQ(r.insight->evidence["step_median_ns"].get<double>(), 100.0 * kMs);
  EXPECT_EQ(r.insight->evidence["work_steps"], 20u - kWarmupSteps);
  // AND by step time alone nothing differs: with buckets timed on one rank only it passes
  RunBuilder untimed = Ddp(1, kSlow);
  untimed.data().comm_buckets.clear();
  const RuleResult by_step = EvalGroup("rank_skew", {Ddp(0, kFast), untimed});
  EXPECT_FALSE(by_step.fired());
  EXPECT_FALSE(by_step.skipped());
  // AND equal ranks pass on the work-time basis too
  EXPECT_FALSE(EvalGroup("rank_skew", {Ddp(0, kFast), Ddp(1, kFast)}).fired());
}

TEST(RankSkew, WorkTimeUsesTheMeasuredClockOffsets) {
  // GIVEN equal ranks, rank 1's wall clock 30 ms ahead: unaligned, rank 0 seems to wait 30 ms
  RunBuilder ahead = Ddp(1, kFast);
  ahead.run().start_unix_ns += 30 * kMs;
  EXPECT_TRUE(EvalGroup("rank_skew", {Ddp(0, kFast), ahead}).fired());
  // WHEN the offset was measured THEN neither waits for the other
  ahead.Config(Distributed({{"clock_offset_ns", 30 * kMs}, {"clock_reference_rank", 0}}));
  EXPECT_FALSE(EvalGroup("rank_skew", {Ddp(0, kFast), ahead}).fired());
}

// ---------------------------------------------------------------- precedence

TEST(DistributedPrecedence, ARankLateOnEveryBucketIsRankSkew) {
  // GIVEN rank 1 slower through its whole backward: late on all 4 buckets, and working longer
  const GroupReport report =
      AnalyzeGroup("job", {Ddp(0, kFast).Build(), Ddp(1, kSlow).Build()}, RuleContext{});
  // THEN one finding: rank_skew, with bucket_skew of the same rank folded under it
  ASSERT_EQ(report.insights.size(), 1u);
  EXPECT_EQ(report.insights[0].rule_id, "rank_skew");
  EXPECT_EQ(report.insights[0].evidence["bucket_local"], false);
  ASSERT_EQ(report.explained.size(), 1u);
  EXPECT_EQ(report.explained[0].by, "rank_skew");
  EXPECT_EQ(report.explained[0].insight.rule_id, "bucket_skew");
  EXPECT_EQ(report.explained[0].insight.evidence["rank_wide"], true);
  EXPECT_EQ(report.explained[0].insight.evidence["late_buckets"], 4);
  EXPECT_EQ(report.explained[0].insight.evidence["buckets_evaluated"], 4);
  // AND the report prints the folded finding under the one that explains it
  const std::string text = FormatGroupReport(report, "db");
  EXPECT_THAT(text, HasSubstr("          explains: bucket_skew — " +
                              report.explained[0].insight.message + "\n"));
  const nlohmann::json j = GroupReportJson(report);
  EXPECT_EQ(j["insights"][0]["explains"], nlohmann::json::array({"bucket_skew"}));
  ASSERT_EQ(j["explained"].size(), 1u);
  EXPECT_EQ(j["explained"][0]["explained_by"], "rank_skew");
}

TEST(DistributedPrecedence, ARankLateBeforeSomeBucketsIsBucketSkew) {
  // GIVEN rank 1 with extra work before bucket 2 only: late on 2 of the 4 buckets
  const GroupReport report =
      AnalyzeGroup("job", {Ddp(0, kFast).Build(), Ddp(1, kSlowBefore2).Build()}, RuleContext{});
  // THEN one finding: bucket_skew, with rank_skew of the same rank folded under it
  ASSERT_EQ(report.insights.size(), 1u);
  EXPECT_EQ(report.insights[0].rule_id, "bucket_skew");
  EXPECT_EQ(report.insights[0].message, "Bucket 2: rank 1 is late on 100% of steps (p95 delta " +
                                            FormatDuration(25.0 * kMs) +
                                            "); 1 more bucket/rank pair shows the same");
  EXPECT_EQ(report.insights[0].evidence["rank_wide"], false);
  EXPECT_EQ(report.insights[0].evidence["late_buckets"], 2);
  ASSERT_EQ(report.explained.size(), 1u);
  EXPECT_EQ(report.explained[0].by, "bucket_skew");
  EXPECT_EQ(report.explained[0].insight.rule_id, "rank_skew");
  EXPECT_EQ(report.explained[0].insight.evidence["bucket_local"], true);
}

TEST(DistributedPrecedence, FindingsAboutDifferentRanksAreNotFolded) {
  auto finding = [](const std::string& id, nlohmann::json evidence) {
    Insight in;
    in.rule_id = id;
    in.evidence = std::move(evidence);
    return in;
  };
  // GIVEN bucket_skew late on every bucket on one rank and rank_skew on another
  std::vector<Insight> fired = {finding("bucket_skew", {{"rank_wide", true}, {"run_id", 11}}),
                                finding("rank_skew", {{"bucket_local", false}, {"run_id", 12}})};
  std::vector<Explained> explained;
  ApplyPrecedence(&fired, &explained);
  // THEN both are reported
  EXPECT_EQ(fired.size(), 2u);
  EXPECT_TRUE(explained.empty());
  // AND of the same rank, the condition decides the direction
  fired = {finding("bucket_skew", {{"rank_wide", true}, {"run_id", 11}}),
           finding("rank_skew", {{"bucket_local", false}, {"run_id", 11}})};
  ApplyPrecedence(&fired, &explained);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].rule_id, "rank_skew");
  ASSERT_EQ(explained.size(), 1u);
  EXPECT_EQ(explained[0].by, "rank_skew");
}

// ---------------------------------------------------------------- peer_wait

// The context AnalyzeRun gives `self`: its waits for the other runs.
RuleContext PeersOf(const RunBuilder& self, const std::vector<RunBuilder>& others) {
  std::vector<store::RunData> runs;
  for (const RunBuilder& b : others) runs.push_back(b.Build());
  RuleContext ctx;
  ctx.peer_waits = MeasurePeerWaits(self.Build(), std::move(runs));
  return ctx;
}

TEST(PeerWaits, MeasuresHowLongThisRankWaitsForTheLastRankPerStep) {
  // GIVEN rank 1 50% slower through its backward (its last bucket ready 20 ms after rank 0's)
  const PeerWaits fast = MeasurePeerWaits(Ddp(0, kFast).Build(), {Ddp(1, kSlow).Build()});
  // THEN every step of rank 0 waited 20 ms, for rank 1
  EXPECT_EQ(fast.group_id, "job");
  EXPECT_EQ(fast.peers, std::vector<std::string>{"rank 1"});
  EXPECT_TRUE(fast.reason.empty());
  ASSERT_EQ(fast.steps.size(), 20u);
  for (const auto& [step, w] : fast.steps) {
    EXPECT_EQ(w.wait_ns, 20 * kMs) << step;
    EXPECT_EQ(w.last_peer, 0) << step;
  }
  // AND rank 1, the last on every bucket, waited for nobody
  const PeerWaits slow = MeasurePeerWaits(Ddp(1, kSlow).Build(), {Ddp(0, kFast).Build()});
  ASSERT_EQ(slow.steps.size(), 20u);
  for (const auto& [step, w] : slow.steps) {
    EXPECT_EQ(w.wait_ns, 0) << step;
    EXPECT_EQ(w.last_peer, -1) << step;
  }
}

TEST(PeerWaits, UsesTheMeasuredClockOffsetsAndOnlyRunsAtTheSameTime) {
  // GIVEN equal ranks, rank 1's wall clock 30 ms ahead of rank 0's
  RunBuilder ahead = Ddp(1, kFast);
  ahead.run().start_unix_ns += 30 * kMs;
  // WHEN no offset was measured THEN rank 0 seems to wait 30 ms for it
  EXPECT_EQ(MeasurePeerWaits(Ddp(0, kFast).Build(), {ahead.Build()}).steps.at(5).wait_ns, 30 * kMs);
  // WHEN the offset was measured THEN nobody waits
  ahead.Config(Distributed({{"clock_offset_ns", 30 * kMs}, {"clock_reference_rank", 0}}));
  EXPECT_EQ(MeasurePeerWaits(Ddp(0, kFast).Build(), {ahead.Build()}).steps.at(5).wait_ns, 0);
  // AND an earlier attempt of rank 1 (a restarted job), over before rank 0 began, is ignored
  RunBuilder earlier = Ddp(1, [](int64_t) { return 90.0; });
  earlier.run().run_id = 7;
  earlier.run().start_unix_ns -= 3600 * 1000 * kMs;
  EXPECT_EQ(
      MeasurePeerWaits(Ddp(0, kFast).Build(), {earlier.Build(), ahead.Build()}).steps.at(5).wait_ns,
      0);
  const PeerWaits alone = MeasurePeerWaits(Ddp(0, kFast).Build(), {earlier.Build()});
  EXPECT_TRUE(alone.peers.empty());
  EXPECT_THAT(alone.reason, HasSubstr("no other rank of job 'job' that ran at the same time"));
  // AND runs of its own rank are never its peers
  RunBuilder twin = Ddp(0, kSlow);
  twin.run().run_id = 99;
  EXPECT_TRUE(MeasurePeerWaits(Ddp(0, kFast).Build(), {twin.Build()}).peers.empty());
}

// Rank 1 starts every bucket at 85 ms: rank 0, ready at 20-50 ms and done at 95 ms, waits
// 65 ms of its 75 ms in flight.
const auto kLateAll = [](int64_t bk) { return 85.0 + static_cast<double>(bk); };

TEST(PeerWait, NamesTheRankThisOneWaitsFor) {
  // GIVEN rank 0 waiting 65 ms of every 100 ms step for rank 1
  const RunBuilder r0 = Ddp(0, kFast, 95);
  const RuleResult r = Eval("peer_wait", r0, PeersOf(r0, {Ddp(1, kLateAll, 95)}));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            "This rank waited 65% of step time (" + FormatDuration(65.0 * kMs) + " of " +
                FormatDuration(100.0 * kMs) +
                " per step) in its collectives for rank 1, the last to start them on 100% of the "
                "steps it waited: the job runs at that rank's pace");
  EXPECT_THAT(r.insight->fix, HasSubstr("Make rank 1 faster, not the communication: gpuprof "
                                        "insights --group job compares the ranks"));
  EXPECT_EQ(r.insight->evidence["slowest"], "rank 1");
  EXPECT_EQ(r.insight->evidence["steps"], 20u - kWarmupSteps);
  EXPECT_EQ(r.insight->evidence["ranks_compared"], 1u);
  // AND the rank waited for is not told to wait
  const RunBuilder r1 = Ddp(1, kLateAll, 95);
  const RuleResult other = Eval("peer_wait", r1, PeersOf(r1, {Ddp(0, kFast, 95)}));
  EXPECT_FALSE(other.fired());
  EXPECT_FALSE(other.skipped());
}

TEST(PeerWait, AWaitIsNeverLongerThanTheCollectivesWereInFlight) {
  // GIVEN rank 1 starting its buckets 40 ms after rank 0's collectives all ended (impossible in
  // a synchronous job; clocks off by more than their measured uncertainty)
  const RunBuilder r0 = Ddp(
      0, [](int64_t) { return 20.0; }, 30);
  const RuleResult r = Eval("peer_wait", r0, PeersOf(r0, {Ddp(1, [](int64_t) { return 70.0; })}));
  // THEN the wait counted is the 10 ms in flight, not 50 ms: it does not fire
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(PeerWait, NotEvaluatedWithoutThePeersAndPassesOnOneProcess) {
  const RunBuilder r0 = Ddp(0, kFast);
  EXPECT_EQ(*Eval("peer_wait", r0).not_evaluated,
            "needs the other ranks' bucket timings from the store the job wrote (this analysis "
            "read the run alone)");
  EXPECT_THAT(*Eval("peer_wait", r0, PeersOf(r0, {})).not_evaluated,
              HasSubstr("no other rank of job 'job' that ran at the same time is in this store"));
  RunBuilder untimed = Ddp(1, kFast);
  untimed.data().comm_buckets.clear();
  EXPECT_EQ(*Eval("peer_wait", r0, PeersOf(r0, {untimed})).not_evaluated,
            "no steady-state step whose buckets another rank timed too (rank 1 compared: their "
            "bucket timings are not in the store yet, or they timed other steps)");
  // A peer that timed only the first steady steps: too few to speak for the run.
  RunBuilder partial = Ddp(1, kLateAll, 95);
  std::erase_if(partial.data().comm_buckets,
                [](const store::CommBucketRow& b) { return b.step > 8; });
  EXPECT_THAT(
      *Eval("peer_wait", Ddp(0, kFast, 95), PeersOf(Ddp(0, kFast, 95), {partial})).not_evaluated,
      HasSubstr("only 6 of the 17 steady-state steps with collectives were timed"));
  RunBuilder single;
  single.Steps(20, Split(100, 5, 90));
  const RuleResult one = Eval("peer_wait", single);
  EXPECT_FALSE(one.fired());
  EXPECT_FALSE(one.skipped());
}

TEST(PeerWait, ExplainsCollectivesThatAreMostlyWaiting) {
  // GIVEN rank 0 with collectives in flight 75% of step time, 65 points of it waiting for rank 1
  const RunBuilder r0 = Ddp(0, kFast, 95);
  const RuleContext ctx = PeersOf(r0, {Ddp(1, kLateAll, 95)});
  const RuleResult comm = Eval("comm_dominant", r0, ctx);
  ASSERT_TRUE(comm.fired());
  EXPECT_THAT(comm.insight->message,
              HasSubstr("; 65% of step time waiting for the other ranks to start them)"));
  EXPECT_EQ(comm.insight->evidence["mostly_peer_wait"], true);
  // THEN the report leads with the wait and folds comm_dominant's advice under it
  const Report report = Analyze(r0.Build(), ctx);
  ASSERT_FALSE(report.insights.empty());
  std::vector<std::string> ids;
  for (const Insight& i : report.insights) ids.push_back(i.rule_id);
  EXPECT_THAT(ids, ::testing::Contains("peer_wait"));
  EXPECT_THAT(ids, Not(::testing::Contains("comm_dominant")));
  ASSERT_EQ(report.explained.size(), 1u);
  EXPECT_EQ(report.explained[0].by, "peer_wait");
  EXPECT_EQ(report.explained[0].insight.rule_id, "comm_dominant");
  // AND collectives that are long without the wait keep their own finding beside it
  const RunBuilder own = Ddp(
      0, [](int64_t bk) { return 5.0 + static_cast<double>(bk); }, 95);
  const RuleContext some = PeersOf(own, {Ddp(
                                            1, [](int64_t bk) { return 30.0 + 0 * bk; }, 95)});
  const RuleResult both = Eval("comm_dominant", own, some);
  ASSERT_TRUE(both.fired());
  EXPECT_EQ(both.insight->evidence["mostly_peer_wait"], false);
  EXPECT_TRUE(Eval("peer_wait", own, some).fired());  // 25 ms of 90 ms in flight
  const Report report2 = Analyze(own.Build(), some);
  EXPECT_TRUE(report2.explained.empty());
  // AND without the peers comm_dominant reads as before, its wait unknown
  const RuleResult alone = Eval("comm_dominant", r0);
  ASSERT_TRUE(alone.fired());
  EXPECT_TRUE(alone.insight->evidence["peer_wait_fraction"].is_null());
  EXPECT_THAT(alone.insight->message, Not(HasSubstr("waiting")));
}

// ---------------------------------------------------------------- rank clocks

TEST(RankClock, ReadsTheDistributedObjectOfConfigJson) {
  RunBuilder b;
  b.Config(Distributed({{"rank", 1},
                        {"world_size", 2},
                        {"clock_offset_ns", -1234},
                        {"clock_uncertainty_ns", 56000.4},
                        {"clock_reference_rank", 0},
                        {"clock_rounds", 64},
                        {"clock_method", "gloo send/recv ping-pong"}}));
  const RankClock c = ReadRankClock(b.run());
  EXPECT_TRUE(c.aligned());
  EXPECT_EQ(c.offset_ns, -1234);
  EXPECT_EQ(c.uncertainty_ns, 56000);  // a float is rounded
  EXPECT_EQ(c.reference_rank, 0);
  EXPECT_EQ(c.rounds, 64);
  EXPECT_EQ(c.method, "gloo send/recv ping-pong");
  EXPECT_EQ(c.unaligned_reason, "");
}

TEST(RankClock, WithoutAnOffsetItSaysWhyAndKeepsNoUncertainty) {
  RunBuilder b;
  b.Config(
      Distributed({{"clock_unaligned_reason", "gloo unavailable"}, {"clock_uncertainty_ns", 5}}));
  RankClock c = ReadRankClock(b.run());
  EXPECT_FALSE(c.aligned());
  EXPECT_FALSE(c.uncertainty_ns);
  EXPECT_EQ(c.unaligned_reason, "not aligned: gloo unavailable");
  // Whatever config_json holds that is not an offset reads as "none recorded", never 0.
  for (const std::optional<std::string>& config :
       {std::optional<std::string>(), std::optional<std::string>("not json {"),
        std::optional<std::string>("[1, 2]"), std::optional<std::string>(R"({"distributed": 3})"),
        std::optional<std::string>(R"({"distributed": {"clock_offset_ns": "12"}})"),
        std::optional<std::string>(R"({"grad_checkpoint": true})")}) {
    b.run().config_json = config;
    c = ReadRankClock(b.run());
    EXPECT_FALSE(c.offset_ns) << config.value_or("null");
    EXPECT_EQ(c.unaligned_reason, "not aligned: no clock alignment recorded");
  }
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
                                             "+p99 +loader wait +comm +waiting +clock offset\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "\n +0 +20 +node-0 +ok +30 +" + FormatDuration(62.0 * kMs) + " +" +
                        FormatDuration(62.0 * kMs) + " +" + FormatDuration(62.0 * kMs) + " +" +
                        FormatPercent(5.0 / 62, 1) + " +" + FormatPercent(10.0 / 62, 1) + " +" +
                        FormatPercent(0.0, 1) + " +—\n"));
  // No clock offsets recorded: the wall clocks are compared as they are, and the report says so.
  EXPECT_THAT(text, HasSubstr("\n  clocks not aligned: wall clocks compared as they are (each "
                              "run's start time; as close as the hosts' clock sync)\n  rank 0, "
                              "rank 1: not aligned: no clock alignment recorded\n"));
  EXPECT_THAT(text, HasSubstr("[MED]   " + report.insights[0].message));
  EXPECT_THAT(text, HasSubstr("fix: " + report.insights[0].fix));
  EXPECT_THAT(text, HasSubstr("Per-rank reports: gpuprof insights 'my runs.db' RUN (e.g. 20)"));
}

TEST(GroupReport, ShowsHowLongEachRankWaitedForTheOthers) {
  // GIVEN rank 0 waiting 65 ms of every 100 ms step for rank 1
  std::vector<store::RunData> runs = {Ddp(0, kFast, 95).Build(), Ddp(1, kLateAll, 95).Build()};
  const GroupReport report = AnalyzeGroup("job", runs, RuleContext{});
  // THEN the table's "waiting" column says so, rank 1 waiting for nobody
  const std::string text = FormatGroupReport(report, "db");
  EXPECT_THAT(text, ::testing::ContainsRegex("\n +0 +30 .* " + FormatPercent(0.75, 1) + " +" +
                                             FormatPercent(0.65, 1) + " +—\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex("\n +1 +31 .* " + FormatPercent(0.10, 1) + " +" +
                                             FormatPercent(0.0, 1) + " +—\n"));
  // AND --json has it per rank; a rank without bucket timings has it unknown, not 0
  const nlohmann::json j = GroupReportJson(report);
  EXPECT_DOUBLE_EQ(j["ranks"][0]["peer_wait_fraction"].get<double>(), 0.65);
  EXPECT_DOUBLE_EQ(j["ranks"][1]["peer_wait_fraction"].get<double>(), 0.0);
  runs[1].comm_buckets.clear();
  const nlohmann::json untimed = GroupReportJson(AnalyzeGroup("job", runs, RuleContext{}));
  EXPECT_TRUE(untimed["ranks"][0]["peer_wait_fraction"].is_null());
  EXPECT_TRUE(untimed["ranks"][1]["peer_wait_fraction"].is_null());
  // AND one pass over the group gives each rank what MeasurePeerWaits gives it alone
  const std::vector<PeerWaits> all = PeerWaitsOfEveryRank(BuildGroupView(
      "job", {Ddp(0, kFast).Build(), Ddp(1, kSlow).Build(), Ddp(2, kSlowBefore2).Build()}));
  ASSERT_EQ(all.size(), 3u);
  for (int64_t r = 0; r < 3; ++r) {
    std::vector<store::RunData> others;
    for (int64_t o = 0; o < 3; ++o) {
      const auto shape = o == 0 ? kFast : o == 1 ? kSlow : kSlowBefore2;
      if (o != r) others.push_back(Ddp(o, shape).Build());
    }
    const auto shape = r == 0 ? kFast : r == 1 ? kSlow : kSlowBefore2;
    const PeerWaits alone = MeasurePeerWaits(Ddp(r, shape).Build(), others);
    EXPECT_EQ(all[r].peers, alone.peers) << r;
    ASSERT_EQ(all[r].steps.size(), alone.steps.size()) << r;
    for (const auto& [step, w] : alone.steps) {
      EXPECT_EQ(all[r].steps.at(step).wait_ns, w.wait_ns) << r << " " << step;
      EXPECT_EQ(all[r].steps.at(step).last_peer, w.last_peer) << r << " " << step;
    }
  }
  // rank 0 waits for rank 1's last bucket (20 ms) and rank 2's bucket 2 (25 ms): rank 2 it is
  EXPECT_EQ(all[0].steps.at(5).wait_ns, 25 * kMs);
  EXPECT_EQ(all[0].peers[static_cast<size_t>(all[0].steps.at(5).last_peer)], "rank 2");
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
  EXPECT_TRUE(j["ranks"][1]["clock_offset_ns"].is_null());
  EXPECT_TRUE(j["ranks"][1]["clock_uncertainty_ns"].is_null());
  EXPECT_EQ(j["ranks"][1]["clock_unaligned_reason"], "not aligned: no clock alignment recorded");
  EXPECT_EQ(j["clock_alignment"]["aligned_ranks"], 0);
  EXPECT_TRUE(j["clock_alignment"]["reference_rank"].is_null());
  EXPECT_THAT(j["clock_alignment"]["basis"].get<std::string>(),
              HasSubstr("clocks not aligned: wall clocks compared as they are"));
  EXPECT_EQ(j["explained"], nlohmann::json::array());
  ASSERT_EQ(j["insights"].size(), 1u);
  EXPECT_EQ(j["insights"][0]["rule_id"], "rank_skew");
  ASSERT_EQ(j["not_evaluated"].size(), 1u);
  EXPECT_EQ(j["not_evaluated"][0]["rule_id"], "bucket_skew");
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);
}

TEST(GroupReport, ShowsEachRanksClockOffsetAndTheAlignmentBasis) {
  // GIVEN rank 0 (the reference, which recorded no offset of its own), rank 1 aligned to it, and
  // rank 2 whose alignment failed
  std::vector<store::RunData> runs;
  RunBuilder r1 = Ranked(1, 62);
  r1.Config(Distributed({{"rank", 1},
                         {"clock_offset_ns", -1234},
                         {"clock_uncertainty_ns", 56000},
                         {"clock_reference_rank", 0},
                         {"clock_rounds", 64},
                         {"clock_method", "gloo send/recv ping-pong"}}));
  RunBuilder r2 = Ranked(2, 62);
  r2.Config(Distributed({{"rank", 2}, {"clock_unaligned_reason", "gloo unavailable"}}));
  const GroupReport report =
      AnalyzeGroup("job", {Ranked(0, 62).Build(), r1.Build(), r2.Build()}, RuleContext{});
  ASSERT_EQ(report.view.clocks.size(), 3u);
  EXPECT_EQ(report.view.clocks[0].offset_ns, 0);  // the reference rank, by definition
  EXPECT_EQ(report.view.AlignedNs(1, 5000), report.view.ranks[1].run().start_unix_ns + 6234);
  const std::string text = FormatGroupReport(report, "db");
  // THEN the clock column shows the reference, the offset with its uncertainty, and "—"
  EXPECT_THAT(text, ::testing::ContainsRegex("\n +0 +20 +node-0 .* reference\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex("\n +1 +21 +node-1 .* " + FormatDuration(-1234.0) +
                                             " ±" + FormatDuration(56000.0) + "\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex("\n +2 +22 +node-2 .* +—\n"));
  EXPECT_THAT(
      text, HasSubstr("\n  clocks aligned to rank 0 on 2 of 3 ranks (±" + FormatDuration(56000.0) +
                      "; gloo send/recv ping-pong); the "
                      "others' wall clocks compared as they are\n"
                      "  rank 2: not aligned: gloo unavailable\n"));
  // AND the JSON has the same, null with a reason where unknown
  const nlohmann::json j = GroupReportJson(report);
  EXPECT_EQ(j["ranks"][0]["clock_offset_ns"], 0);
  EXPECT_EQ(j["ranks"][1]["clock_offset_ns"], -1234);
  EXPECT_EQ(j["ranks"][1]["clock_uncertainty_ns"], 56000);
  EXPECT_TRUE(j["ranks"][1]["clock_unaligned_reason"].is_null());
  EXPECT_TRUE(j["ranks"][2]["clock_offset_ns"].is_null());
  EXPECT_EQ(j["ranks"][2]["clock_unaligned_reason"], "not aligned: gloo unavailable");
  EXPECT_EQ(j["clock_alignment"]["aligned_ranks"], 2);
  EXPECT_EQ(j["clock_alignment"]["reference_rank"], 0);
  EXPECT_EQ(j["clock_alignment"]["uncertainty_ns"], 56000);
  // AND with every rank aligned the line says so without a caveat
  r2.Config(Distributed(
      {{"clock_offset_ns", 700}, {"clock_uncertainty_ns", 3000}, {"clock_reference_rank", 0}}));
  const GroupReport all =
      AnalyzeGroup("job", {Ranked(0, 62).Build(), r1.Build(), r2.Build()}, RuleContext{});
  EXPECT_EQ(all.view.AlignmentBasis(), "clocks aligned to rank 0 (±" + FormatDuration(56000.0) +
                                           "; gloo send/recv ping-pong)");
  EXPECT_THAT(FormatGroupReport(all, "db"), Not(HasSubstr("not aligned")));
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

TEST(AnalyzeStoredGroup, RankSkewQuotesTheStragglersStoredFinding) {
  // GIVEN two ranks in a file, rank 1 slower, whose own report stored a loader stall
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  testing::WriteRun(*db, Ranked(0, 62).Build());
  const int64_t slow = testing::WriteRun(*db, Ranked(1, 87).Build());
  ASSERT_TRUE(db->ReplaceInsights(slow, {store::InsightRow{0, "dataloader_stall", "data_pipeline",
                                                           "high", "Steps wait 34% on data",
                                                           "Raise num_workers.", std::nullopt}})
                  .ok());
  // WHEN the group is analysed from the store
  auto stored = AnalyzeStoredGroup(*db, "job", AnalysisOptions{});
  ASSERT_TRUE(stored.ok()) << stored.error();
  // THEN rank_skew names rank 1 and what its own report found
  const auto it = std::find_if(stored->insights.begin(), stored->insights.end(),
                               [](const Insight& i) { return i.rule_id == "rank_skew"; });
  ASSERT_NE(it, stored->insights.end());
  EXPECT_THAT(it->message, HasSubstr("rank 1"));
  EXPECT_THAT(it->message, HasSubstr("its own report leads with [HIGH] Steps wait 34% on data"));
  EXPECT_EQ(it->fix, "Start with rank 1's own finding (dataloader_stall): Raise num_workers.");
}

TEST(AnalyzeRun, ComparesARankWithTheOtherRanksInItsStore) {
  // GIVEN rank 0 and rank 1 of a job in one file, rank 0 waiting for rank 1, and another job's
  // rank 1 that never waited
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  const int64_t r0 = testing::WriteRun(*db, Ddp(0, kFast, 95).Build());
  RunBuilder stranger = Ddp(1, kFast, 95);
  stranger.run().group_id = "other";
  testing::WriteRun(*db, stranger.Build());
  // WHEN rank 0 is analysed before rank 1 is in the file THEN peer_wait says why it cannot tell
  auto before = AnalyzeRun(*db, r0, AnalysisOptions{});
  ASSERT_TRUE(before.ok()) << before.error();
  bool skipped = false;
  for (const NotEvaluated& n : before->not_evaluated) {
    if (n.rule_id != "peer_wait") continue;
    skipped = true;
    EXPECT_THAT(n.reason, HasSubstr("no other rank of job 'job' that ran at the same time"));
  }
  EXPECT_TRUE(skipped);
  // WHEN rank 1 has written its timings THEN rank 0's report names it
  const int64_t r1 = testing::WriteRun(*db, Ddp(1, kLateAll, 95).Build());
  auto after = AnalyzeRun(*db, r0, AnalysisOptions{});
  ASSERT_TRUE(after.ok()) << after.error();
  const auto it = std::find_if(after->insights.begin(), after->insights.end(),
                               [](const Insight& i) { return i.rule_id == "peer_wait"; });
  ASSERT_NE(it, after->insights.end());
  EXPECT_EQ(it->evidence["slowest"], "rank 1");
  EXPECT_DOUBLE_EQ(it->evidence["peer_wait_fraction"].get<double>(), 0.65);
  EXPECT_TRUE(it->evidence["slowest_insight"].is_null());  // rank 1 stored no finding yet
  EXPECT_THAT(it->message, ::testing::EndsWith("the job runs at that rank's pace"));
  // WHEN rank 1's own report is stored (its own comm finding first, then its cause)
  ASSERT_TRUE(db->ReplaceInsights(r1, {store::InsightRow{0, "comm_dominant", "distributed", "med",
                                                         "Collectives", "Shrink.", std::nullopt},
                                       store::InsightRow{1, "cpu_contention", "host", "high",
                                                         "Threads queued 40% for a CPU",
                                                         "Fewer threads.", std::nullopt}})
                  .ok());
  auto quoted = AnalyzeRun(*db, r0, AnalysisOptions{});
  ASSERT_TRUE(quoted.ok()) << quoted.error();
  const auto q = std::find_if(quoted->insights.begin(), quoted->insights.end(),
                              [](const Insight& i) { return i.rule_id == "peer_wait"; });
  ASSERT_NE(q, quoted->insights.end());
  // THEN rank 0's finding ends with rank 1's cause, and its fix starts there
  EXPECT_THAT(q->message,
              ::testing::EndsWith("the job runs at that rank's pace; rank 1's own report leads "
                                  "with [HIGH] Threads queued 40% for a CPU"));
  EXPECT_EQ(q->fix, "Start with rank 1's own finding (cpu_contention): Fewer threads.");
  EXPECT_EQ(q->evidence["slowest_insight"]["rule_id"], "cpu_contention");
}

TEST(LoadPeerWaits, BoundsTheRowsARunsOwnReportCompares) {
  testing::TempDb file;
  auto db = testing::OpenDb(file.path());
  ASSERT_TRUE(db);
  testing::WriteRun(*db, Ddp(1, kFast).Build());
  store::RunData self = Ddp(0, kFast).Build();
  self.run.run_id = 1000;
  // Not distributed: nobody looks.
  store::RunData alone = self;
  alone.run.world_size = 1;
  EXPECT_FALSE(LoadPeerWaits(*db, alone).has_value());
  // No group id: the reason says why the peers cannot be found.
  store::RunData anonymous = self;
  anonymous.run.group_id.reset();
  EXPECT_EQ(LoadPeerWaits(*db, anonymous)->reason,
            "the run has no group id, so its job's other ranks cannot be found");
  // One bucket row more than the bound: no peer is loaded, and the reason points at --group.
  self.comm_buckets.assign(thresholds::kPeerWaitMaxRows + 1, store::CommBucketRow{});
  const std::optional<PeerWaits> big = LoadPeerWaits(*db, self);
  ASSERT_TRUE(big.has_value());
  EXPECT_TRUE(big->peers.empty());
  EXPECT_EQ(big->reason,
            "its 1000001 bucket rows times the job's 1 other run is more than a run's own "
            "report compares (1000000); gpuprof insights --group job compares the ranks");
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
