// Every rule: a scenario that fires, a near miss that must not, and the inputs whose absence
// makes it "not evaluated". Expected numbers are computed from the scenario's shapes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "analysis/format.h"
#include "analysis/report.h"
#include "analysis/rule_test_util.h"
#include "analysis/rules/registry.h"
#include "analysis/test_runs.h"

namespace gpuprof::analysis {
namespace {

using testing::Eval;
using testing::FoldedUnder;
using testing::HasInsight;
using ::testing::HasSubstr;
using testing::HealthyFullRun;
using testing::HealthyRun;
using testing::kMs;
using testing::kSec;
using ::testing::Not;
using testing::RunBuilder;
using testing::Shape;
using testing::Split;
using testing::StepShape;

// ---------------------------------------------------------------- registry

TEST(Registry, EveryRuleIsCompleteAndUnique) {
  std::set<std::string> ids;
  const std::set<std::string> families = {"data_pipeline",  "host",   "compute",
                                          "memory_thermal", "warmup", "distributed",
                                          "regression",     "cost"};
  for (const RuleSpec& r : Rules()) {
    EXPECT_TRUE(ids.insert(r.id).second) << "duplicate " << r.id;
    EXPECT_TRUE(families.count(r.family)) << r.id << " family " << r.family;
    EXPECT_FALSE(r.fires_when.empty()) << r.id;
    EXPECT_FALSE(r.fix.empty()) << r.id;
    EXPECT_FALSE(r.inputs.empty()) << r.id;
    EXPECT_FALSE(r.severity.empty()) << r.id;
    EXPECT_NE(r.evaluate == nullptr, r.evaluate_group == nullptr) << r.id << ": one kind";
    EXPECT_EQ(FindRule(r.id), &r);
  }
  for (const char* id : {"dataloader_stall",
                         "loader_epoch_start",
                         "prefetch_queue_starved",
                         "cpu_bound_dataloader",
                         "io_bound_dataloader",
                         "cold_cache",
                         "cache_thrashing",
                         "pcie_saturation",
                         "worker_imbalance",
                         "host_memory_pressure",
                         "low_mfu",
                         "small_batch",
                         "kernel_launch_overhead",
                         "gradient_checkpointing_detected",
                         "sdpa_suboptimal",
                         "kernel_drift",
                         "memory_pressure",
                         "thermal_throttling",
                         "compilation_warmup",
                         "first_step_outlier",
                         "high_step_variance",
                         "evaluation_in_steps",
                         "comm_dominant",
                         "peer_wait",
                         "bucket_skew",
                         "rank_skew",
                         "regression",
                         "cost",
                         "host_stalls"}) {
    EXPECT_TRUE(ids.count(id)) << id;
  }
  EXPECT_EQ(ids.size(), 30u);
  EXPECT_TRUE(FindRule("bucket_skew")->group());
  EXPECT_TRUE(FindRule("rank_skew")->group());
  EXPECT_FALSE(FindRule("comm_dominant")->group());
  EXPECT_FALSE(FindRule("peer_wait")->group());
  EXPECT_EQ(FindRule("no_such_rule"), nullptr);
}

TEST(Registry, MarkdownIsGeneratedFromTheConstants) {
  const std::string md = RulesMarkdown();
  EXPECT_THAT(md, HasSubstr("| Rule | Family | Severity | Fires when | Fix |"));
  for (const RuleSpec& r : Rules()) {
    EXPECT_THAT(md, HasSubstr("| `" + r.id + "`" + (r.group() ? " (group)" : "") + " | " +
                              r.family + " |"));
    for (const RuleThreshold& t : r.thresholds) {
      EXPECT_THAT(md, HasSubstr("`" + t.name + "` | " + StrFormat("%g", t.value)));
    }
  }
  // The "fires when" text quotes the very constants the rules compare with.
  EXPECT_THAT(FindRule("dataloader_stall")->fires_when,
              HasSubstr(FormatPercent(thresholds::kStallFraction)));
  EXPECT_THAT(FindRule("low_mfu")->fires_when, HasSubstr(FormatPercent(thresholds::kLowMfu)));
  EXPECT_THAT(FindRule("compilation_warmup")->fires_when,
              HasSubstr(FormatCompact(thresholds::kWarmupRatio) + "×"));
  EXPECT_THAT(FindRule("first_step_outlier")->fires_when,
              HasSubstr(FormatCompact(thresholds::kFirstStepRatio) + "×"));
  EXPECT_THAT(FindRule("prefetch_queue_starved")->fires_when,
              HasSubstr(FormatCompact(thresholds::kStarvedWaitMs) + " ms on ≥ " +
                        FormatPercent(thresholds::kStarvedStepFraction)));
  EXPECT_THAT(FindRule("thermal_throttling")->fires_when,
              HasSubstr(FormatCompact(thresholds::kThrottleTempC) + " °C"));
  EXPECT_THAT(FindRule("rank_skew")->fires_when,
              HasSubstr(FormatPercent(thresholds::kRankSkewFraction)));
  EXPECT_THAT(RulesText(), HasSubstr("kernel_launch_overhead"));
  EXPECT_THAT(RulesText(), HasSubstr("bucket_skew (group)"));
}

TEST(Registry, PrecedenceNamesRealRulesAndHasNoCycle) {
  for (const RuleSpec& r : Rules()) {
    for (const RuleExplains& e : r.explains) {
      const RuleSpec* other = FindRule(e.rule_id);
      ASSERT_NE(other, nullptr) << r.id << " explains unknown " << e.rule_id;
      EXPECT_NE(other, &r) << r.id << " explains itself";
      EXPECT_EQ(other->group(), r.group()) << r.id << " / " << e.rule_id;
      EXPECT_EQ(e.when.empty(), e.when_text.empty()) << r.id << " / " << e.rule_id;
    }
  }
  // No rule reaches itself through "explains" (depth-first from each rule), except through a
  // pair that explains each other under conditions that exclude each other: both entries
  // conditional, about the same thing (`same`), on different evidence keys (each rule sets the
  // one the other reads as the complement of its own; the distributed tests check the values).
  auto mutual = [](const RuleSpec& a, const RuleExplains& e) {
    const RuleSpec* b = FindRule(e.rule_id);
    for (const RuleExplains& back : b->explains) {
      if (back.rule_id != a.id) continue;
      return !e.when.empty() && !back.when.empty() && e.when != back.when && !e.same.empty() &&
             e.same == back.same;
    }
    return false;
  };
  size_t mutual_pairs = 0;
  for (const RuleSpec& start : Rules()) {
    std::vector<const RuleSpec*> stack = {&start};
    std::set<std::string> seen;
    while (!stack.empty()) {
      const RuleSpec* r = stack.back();
      stack.pop_back();
      for (const RuleExplains& e : r->explains) {
        if (mutual(*r, e)) {
          ++mutual_pairs;
          continue;
        }
        ASSERT_NE(e.rule_id, start.id) << "cycle through " << start.id;
        if (seen.insert(e.rule_id).second) stack.push_back(FindRule(e.rule_id));
      }
    }
  }
  EXPECT_GT(mutual_pairs, 0u);  // bucket_skew <-> rank_skew
  EXPECT_EQ(FindRule("bucket_skew")->explains[0].when, "bucket_local");
  EXPECT_EQ(FindRule("rank_skew")->explains[0].when, "rank_wide");
  // The documented precedence: a specific loader diagnosis explains the general stall.
  const std::string md = RulesMarkdown();
  EXPECT_THAT(md, HasSubstr("| `cpu_bound_dataloader` | `dataloader_stall`, "
                            "`prefetch_queue_starved`, `high_step_variance` (when its slow steps "
                            "are mostly loader wait), `cpu_contention` (when the training's "
                            "threads queue behind its own CPU-bound loading) |"));
  EXPECT_THAT(RulesText(), HasSubstr("explains:   `compilation_warmup`"));
}

TEST(Registry, PrecedenceFoldsChainsUnderTheirRootInRegistryOrder) {
  // GIVEN findings of a CPU-bound loader: the stall, its starved queue and its slow steps
  auto finding = [](const std::string& id, nlohmann::json evidence = nlohmann::json::object()) {
    Insight in;
    in.rule_id = id;
    in.evidence = std::move(evidence);
    return in;
  };
  std::vector<Insight> fired = {finding("dataloader_stall"), finding("prefetch_queue_starved"),
                                finding("cpu_bound_dataloader"),
                                finding("high_step_variance", {{"loader_caused", true}}),
                                finding("low_mfu")};
  std::vector<Explained> explained;
  ApplyPrecedence(&fired, &explained);
  // THEN the specific diagnosis leads, everything it explains (directly or through the stall)
  // is folded under it, and the unrelated finding stays
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_EQ(fired[0].rule_id, "cpu_bound_dataloader");
  EXPECT_EQ(fired[1].rule_id, "low_mfu");
  ASSERT_EQ(explained.size(), 3u);
  for (const Explained& e : explained) EXPECT_EQ(e.by, "cpu_bound_dataloader");
  EXPECT_EQ(explained[0].insight.rule_id, "dataloader_stall");
  EXPECT_EQ(explained[2].insight.rule_id, "high_step_variance");
  // AND a conditional fold needs its condition: variance not caused by the loader stays
  std::vector<Insight> other = {finding("dataloader_stall"),
                                finding("high_step_variance", {{"loader_caused", false}})};
  explained.clear();
  ApplyPrecedence(&other, &explained);
  EXPECT_EQ(other.size(), 2u);
  EXPECT_TRUE(explained.empty());
}

TEST(Registry, NvmlThermalBitsAreNvmlsDocumentedValues) {
  // nvml.h: nvmlClocksEventReasonSwThermalSlowdown 0x20, ...HwThermalSlowdown 0x40.
  EXPECT_EQ(thresholds::kNvmlSwThermalSlowdown, 0x20);
  EXPECT_EQ(thresholds::kNvmlHwThermalSlowdown, 0x40);
}

TEST(Registry, GroupRulesAreNotEvaluatedOnOneRun) {
  const RuleResult r = Eval("rank_skew", HealthyRun());
  ASSERT_TRUE(r.skipped());
  EXPECT_THAT(*r.not_evaluated, HasSubstr("--group"));
}

TEST(Registry, EvaluateRuleFillsIdFamilyAndFix) {
  RunBuilder b;
  b.Steps(10, Shape(100, 40, {{"forward", 50}}));
  const RuleResult r = Eval("dataloader_stall", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->rule_id, "dataloader_stall");
  EXPECT_EQ(r.insight->family, "data_pipeline");
  EXPECT_EQ(r.insight->fix, FindRule("dataloader_stall")->fix);
}

// ---------------------------------------------------------------- dataloader_stall

TEST(DataloaderStall, FiresHighAtAThirdOfStepTime) {
  RunBuilder b;
  b.Steps(20, Split(100, 34, 60));
  const RuleResult r = Eval("dataloader_stall", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kHigh);
  EXPECT_EQ(r.insight->message,
            FormatPercent(34.0 / 100) + " of step time waiting on the loader (inter-step gap)");
  EXPECT_DOUBLE_EQ(r.insight->evidence["wait_fraction"].get<double>(), 0.34);
  EXPECT_EQ(r.insight->evidence["steps"].get<size_t>(), 20u - kWarmupSteps);
}

TEST(DataloaderStall, FiresMedBelowTheHighThreshold) {
  RunBuilder b;
  StepShape s = Split(100, 20, 70);
  s.wait_source = "explicit";
  b.Steps(20, s);
  const RuleResult r = Eval("dataloader_stall", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message,
            FormatPercent(0.20) + " of step time waiting on the loader (wrap_dataloader)");
}

TEST(DataloaderStall, NamesADataLoaderWaitMeasuredInNext) {
  // GIVEN auto mode's DataLoader waits: 25 ms of each 100 ms step, 20 ms of other host work
  RunBuilder b;
  StepShape s = Split(100, 25, 55);
  s.wait_source = "dataloader";
  b.Steps(20, s);
  // THEN the stall counts the measured wait only and says where it was measured
  const RuleResult r = Eval("dataloader_stall", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->message,
            FormatPercent(0.25) + " of step time waiting on the loader (DataLoader next())");
  EXPECT_DOUBLE_EQ(r.insight->evidence["wait_fraction"].get<double>(), 0.25);
  // AND the remaining 20% is host work outside the loader and the phases
  const RuleResult other = Eval("kernel_launch_overhead", b);
  ASSERT_TRUE(other.fired());
  EXPECT_DOUBLE_EQ(other.insight->evidence["other_fraction"].get<double>(), 0.20);
}

TEST(DataloaderStall, AStepThatDidNotCallTheLoaderWaitedZeroNotItsGap) {
  // GIVEN a GAN-like loop: each batch feeds a D step (its next() measured: 1 ms) and a G step
  // (no next(): its wait is the 30 ms of logging before it, a gap)
  RunBuilder b;
  StepShape d = Split(60, 1, 59);
  d.wait_source = "dataloader";
  const StepShape g = Split(60, 30, 30);
  for (int i = 0; i < 10; ++i) b.Step(d).Step(g);
  // THEN no loader stall: the G steps' loader wait is 0 ...
  const RuleResult r = Eval("dataloader_stall", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
  // ... and their gap is host work outside the loader and the phases
  const RuleResult other = Eval("kernel_launch_overhead", b);
  ASSERT_TRUE(other.fired());
  // (steady steps 3..19: 9 G steps with 30 ms of it each, 8 D steps with none)
  EXPECT_NEAR(other.insight->evidence["other_fraction"].get<double>(), 9 * 30.0 / (17 * 60.0),
              1e-9);
  // AND where every wait is a gap (no loader measured), the gap still counts as the wait
  RunBuilder gaps;
  for (int i = 0; i < 10; ++i) gaps.Step(Split(60, 1, 59)).Step(g);
  EXPECT_TRUE(Eval("dataloader_stall", gaps).fired());
}

TEST(DataloaderStall, NearMissAtTheThresholdDoesNotFire) {
  RunBuilder b;
  b.Steps(20, Split(100, 15, 80));  // exactly 15%: the rule needs more
  const RuleResult r = Eval("dataloader_stall", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(DataloaderStall, WarmupWaitDoesNotCount) {
  // Workers starting up: 90 ms explicit wait on steps 0-2, 5 ms afterwards.
  RunBuilder b;
  StepShape warm = Split(100, 90, 5);
  warm.wait_source = "explicit";
  StepShape steady = Split(100, 5, 90);
  steady.wait_source = "explicit";
  b.Steps(3, warm).Steps(20, steady);
  EXPECT_FALSE(Eval("dataloader_stall", b).fired());
}

TEST(DataloaderStall, NotEvaluatedWithoutWaitTimes) {
  RunBuilder b;
  b.Steps(20, Split(100, std::nullopt, 80));
  const RuleResult r = Eval("dataloader_stall", b);
  ASSERT_TRUE(r.skipped());
  EXPECT_THAT(*r.not_evaluated, HasSubstr("not measured"));
  RunBuilder none;
  EXPECT_EQ(*Eval("dataloader_stall", none).not_evaluated, "no steps recorded");
}

// ---------------------------------------------------------------- kernel_launch_overhead

TEST(KernelLaunchOverhead, FiresLowWhenStepExceedsWaitPlusPhases) {
  RunBuilder b;
  b.Steps(20, Split(100, 5, 80));  // 15 ms of 100 outside
  const RuleResult r = Eval("kernel_launch_overhead", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  EXPECT_THAT(r.insight->message, HasSubstr(FormatPercent(15.0 / 100) + " of step time (" +
                                            FormatDuration(15.0 * kMs) + " per step)"));
  EXPECT_THAT(r.insight->message, HasSubstr("forward/backward/optimizer"));
}

TEST(KernelLaunchOverhead, FiresMedAtAQuarter) {
  RunBuilder b;
  b.Steps(20, Split(100, 5, 60));  // 35 ms outside
  const RuleResult r = Eval("kernel_launch_overhead", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_THAT(r.insight->message, HasSubstr(FormatPercent(0.35)));
}

TEST(KernelLaunchOverhead, NearMissDoesNotFire) {
  RunBuilder b;
  b.Steps(20, Split(100, 5, 86));  // 9% outside
  const RuleResult r = Eval("kernel_launch_overhead", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(KernelLaunchOverhead, OverlappingManualPhasesDoNotFire) {
  RunBuilder b;
  b.Steps(20, Shape(100, 5, {{"forward", 60}, {"attention", 40}, {"backward", 30}}));
  EXPECT_FALSE(Eval("kernel_launch_overhead", b).fired());
}

TEST(KernelLaunchOverhead, NotEvaluatedWithoutPhasesOrWait) {
  RunBuilder no_phases;
  no_phases.Steps(20, Shape(100, 5, {}));
  EXPECT_THAT(*Eval("kernel_launch_overhead", no_phases).not_evaluated,
              HasSubstr("no phase timings"));
  RunBuilder no_wait;
  no_wait.Steps(20, Split(100, std::nullopt, 50));
  EXPECT_THAT(*Eval("kernel_launch_overhead", no_wait).not_evaluated,
              HasSubstr("wait not measured"));
}

// ---------------------------------------------------------------- low_mfu

RunBuilder MfuRun(double mfu, const std::string& model = "NVIDIA H100 80GB HBM3",
                  double peak_tflops = 989, const std::string& dtype = "bf16") {
  RunBuilder b;
  b.Gpu(model, 1).Steps(10, StepShape{});  // 100 ms steps
  b.Flops(mfu * peak_tflops * 1e12 * 0.100, dtype);
  return b;
}

TEST(LowMfu, FiresBelowThirtyPercent) {
  const RuleResult r = Eval("low_mfu", MfuRun(0.124));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->message, "MFU " + FormatPercent(0.124, 1) + " of 989 TFLOPs bf16 peak");
  EXPECT_NEAR(r.insight->evidence["mfu"].get<double>(), 0.124, 1e-12);
}

TEST(LowMfu, UsesTheDtypePeak) {
  const RuleResult r = Eval("low_mfu", MfuRun(0.2, "NVIDIA A100-SXM4-40GB", 156, "tf32"));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->message, "MFU " + FormatPercent(0.2, 1) + " of 156 TFLOPs tf32 peak");
}

TEST(LowMfu, NearMissDoesNotFire) {
  const RuleResult r = Eval("low_mfu", MfuRun(0.31));
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(LowMfu, NotEvaluatedWhenAnInputIsMissing) {
  RunBuilder cpu = MfuRun(0.1);
  cpu.Cpu();
  EXPECT_EQ(*Eval("low_mfu", cpu).not_evaluated,
            "MFU unknown: CPU run (MFU compares with a GPU's peak; `gpuprof rules --reference` "
            "lists the GPUs)");
  RunBuilder no_flops = MfuRun(0.1);
  no_flops.run().flops_per_step.reset();
  EXPECT_THAT(*Eval("low_mfu", no_flops).not_evaluated, HasSubstr("flops_per_step not declared"));
  RunBuilder volta = MfuRun(0.1, "Tesla V100-SXM2-16GB", 125, "bf16");
  EXPECT_THAT(*Eval("low_mfu", volta).not_evaluated, HasSubstr("no bf16 peak listed"));
  // Over 100% means flops_per_step counts more than one GPU's work.
  EXPECT_THAT(*Eval("low_mfu", MfuRun(3.0)).not_evaluated, HasSubstr("more than"));
}

// ---------------------------------------------------------------- compilation_warmup

TEST(CompilationWarmup, FiresWhenFirstStepIsFourTimesSteady) {
  RunBuilder b;
  b.Step(Split(400, 0, 300)).Steps(19, Split(100, 5, 90));
  const RuleResult r = Eval("compilation_warmup", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  // Steps are judged outside their loader wait: 95 ms of each steady step, all 400 ms of step 0
  // (its gap wait is unknown).
  EXPECT_THAT(r.insight->message,
              HasSubstr("Step 0 ran for " + FormatDuration(400.0 * kMs) + " outside the loader, " +
                        FormatRatio(400.0 / 95) + " the steady-state median of " +
                        FormatDuration(95.0 * kMs)));
  // Steps 0-2 are warmup; only step 0 exceeds the median, by 305 ms: 13% of the run's 2.3 s.
  EXPECT_THAT(r.insight->message,
              HasSubstr("warmup (steps 0–2) cost " + FormatDuration(305.0 * kMs) +
                        " over steady pace (" + FormatPercent(305.0 / 2300) + " of step time)"));
}

TEST(CompilationWarmup, NearMissDoesNotFire) {
  RunBuilder b;
  b.Step(Split(280, 0, 200)).Steps(19, Split(100, 5, 90));  // 2.95× the 95 ms median
  const RuleResult r = Eval("compilation_warmup", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(CompilationWarmup, AWarmupTooSmallToMatterDoesNotFire) {
  // GIVEN the same 4× step 0, in a run of 200 steps: its 305 ms are 1.5% of the step time
  RunBuilder b;
  b.Step(Split(400, 0, 300)).Steps(199, Split(100, 5, 90));
  const RuleResult r = Eval("compilation_warmup", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(CompilationWarmup, LoaderStartUpIsNotCompilation) {
  // GIVEN a DataLoader whose workers take 300 ms to start: step 0 waits for its first batch,
  // then computes like every other step
  RunBuilder b;
  StepShape first = Split(400, 305, 90), rest = Split(100, 5, 90);
  first.wait_source = rest.wait_source = "dataloader";
  b.Step(first).Steps(19, rest);
  // THEN neither warmup rule calls it a one-time compute cost
  EXPECT_FALSE(Eval("compilation_warmup", b).fired());
  EXPECT_FALSE(Eval("first_step_outlier", b).fired());
}

TEST(CompilationWarmup, NotEvaluatedOnTwoSteps) {
  RunBuilder b;
  b.Step(Split(900, 0, 800)).Step(Split(100, 5, 90));
  EXPECT_THAT(*Eval("compilation_warmup", b).not_evaluated,
              HasSubstr("only 2 steps recorded; needs at least 3"));
}

// ---------------------------------------------------------------- first_step_outlier

TEST(FirstStepOutlier, FiresAtFifteenTimesTheRest) {
  RunBuilder b;
  b.Step(Split(1500, 0, 1400)).Steps(9, Split(100, 5, 90));
  const RuleResult r = Eval("first_step_outlier", b);
  ASSERT_TRUE(r.fired());
  const double mean_all = (1500.0 + 9 * 100) / 10;
  EXPECT_THAT(r.insight->message,
              HasSubstr("Step 0 ran for " + FormatDuration(1500.0 * kMs) + " outside the loader, " +
                        FormatRatio(1500.0 / 95) + " the median of the other 9 steps (" +
                        FormatDuration(95.0 * kMs) + ")"));
  EXPECT_THAT(r.insight->message,
              HasSubstr("from " + FormatDuration(100.0 * kMs) + " to " +
                        FormatDuration(mean_all * kMs) + " (" + FormatRatio(mean_all / 100) + ")"));
}

TEST(FirstStepOutlier, NearMissDoesNotFire) {
  RunBuilder b;
  b.Step(Split(950, 0, 900)).Steps(9, Split(100, 5, 90));  // exactly 10× the 95 ms median
  EXPECT_FALSE(Eval("first_step_outlier", b).fired());
  // ...while the softer warmup rule does see it.
  EXPECT_TRUE(Eval("compilation_warmup", b).fired());
}

TEST(FirstStepOutlier, AStepZeroThatBarelyMovesTheMeanDoesNotFire) {
  // GIVEN a 12 ms step 0 before 999 steps of 1.2 ms: 10.5× the rest, but the mean step time
  // moves from 1.2 ms to 1.211 ms (+0.9%): nothing to filter out of an average
  RunBuilder b;
  StepShape first, rest;
  first.duration_ns = 12 * kMs;
  first.wait_ns.reset();
  first.phases = {{"forward", 12 * kMs, std::nullopt}};
  rest.duration_ns = 1200 * 1000;
  rest.wait_ns = 50 * 1000;
  rest.phases = {{"forward", 1100 * 1000, std::nullopt}};
  b.Step(first).Steps(999, rest);
  EXPECT_FALSE(Eval("first_step_outlier", b).fired());
  EXPECT_FALSE(Eval("compilation_warmup", b).fired());
}

TEST(FirstStepOutlier, TheWarmupRuleIsFoldedUnderIt) {
  // GIVEN a step 0 far beyond both thresholds
  RunBuilder b;
  b.Step(Split(1500, 0, 1400)).Steps(9, Split(100, 5, 90));
  EXPECT_TRUE(Eval("first_step_outlier", b).fired());
  EXPECT_TRUE(Eval("compilation_warmup", b).fired());
  // THEN the report names it once, by first_step_outlier, which explains compilation_warmup
  const Report report = Analyze(b.Build(), RuleContext{});
  std::set<std::string> reported;
  for (const Insight& in : report.insights) reported.insert(in.rule_id);
  EXPECT_TRUE(reported.count("first_step_outlier"));
  EXPECT_FALSE(reported.count("compilation_warmup"));
  ASSERT_EQ(report.explained.size(), 1u);
  EXPECT_EQ(report.explained[0].insight.rule_id, "compilation_warmup");
  EXPECT_EQ(report.explained[0].by, "first_step_outlier");
}

TEST(FirstStepOutlier, NotEvaluatedOnOneStep) {
  RunBuilder b;
  b.Step(Split(900, 0, 800));
  EXPECT_THAT(*Eval("first_step_outlier", b).not_evaluated, HasSubstr("only 1 step recorded"));
}

// ---------------------------------------------------------------- high_step_variance

RunBuilder SpikyRun(size_t spikes) {
  RunBuilder b;
  b.Steps(kWarmupSteps, Split(100, 5, 90));
  for (size_t i = 0; i < 100; ++i) {
    b.Step(i % 20 == 7 && i / 20 < spikes ? Split(300, 5, 90) : Split(100, 5, 90));
  }
  return b;
}

TEST(HighStepVariance, FiresWithFiveSpikesInAHundred) {
  const RuleResult r = Eval("high_step_variance", SpikyRun(5));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  // p99 of 95×100 ms + 5×300 ms sits inside the spikes: 300 ms.
  EXPECT_EQ(r.insight->message, "Step time p99 is " + FormatRatio(3.0) + " p50 (" +
                                    FormatDuration(300.0 * kMs) + " vs " +
                                    FormatDuration(100.0 * kMs) +
                                    "); 5 of 100 steady-state steps took over 2× the median, "
                                    "every 20th step from step 10, 100% of their extra time "
                                    "outside the loader wait and the phases");
  // AND that time is host work between steps: the periodic host work fix
  EXPECT_EQ(r.insight->fix, thresholds::kPeriodicHostWorkFix);
  EXPECT_EQ(r.insight->evidence["other_caused"], true);
  EXPECT_EQ(r.insight->evidence["spike_period"], 20);
}

TEST(HighStepVariance, TheStepsGpuprofsOwnCpuTraceSlowedAreLeftOut) {
  // GIVEN the five spikes of SpikyRun(5) and their next steps, slowed by gpuprof's CPU-operator
  // trace: the spikes are traced steps (cpu_ops rows name them)
  RunBuilder b = SpikyRun(5);
  for (const auto& s : b.steps()) {
    if (s.end_ns - s.start_ns == 300 * kMs) {
      b.CpuOp(s.start_ns, s.end_ns, s.step, "aten::mm", 10, 50 * kMs);
    }
  }
  // THEN their time is the profiler's, not the training's: no variance
  const RuleResult r = Eval("high_step_variance", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
  // AND untraced spikes among traced steps still count, with how many steps were left out
  RunBuilder both = SpikyRun(5);
  both.CpuOp(0, 1, kWarmupSteps + 3, "aten::mm", 1, 1);
  const RuleResult still = Eval("high_step_variance", both);
  ASSERT_TRUE(still.fired());
  EXPECT_EQ(still.insight->evidence["traced_steps_left_out"], 2u);
  EXPECT_THAT(still.insight->message, HasSubstr("5 of 98 steady-state steps"));
  // AND a short run whose steps are mostly traced says so
  RunBuilder short_run;
  short_run.Steps(kWarmupSteps + 40, Split(100, 5, 90));
  for (int64_t i = 0; i < 40; i += 2) short_run.CpuOp(0, 1, kWarmupSteps + i, "aten::mm", 1, 1);
  EXPECT_THAT(*Eval("high_step_variance", short_run).not_evaluated,
              HasSubstr("outside the traced steps and the steps after them (40)"));
}

TEST(HighStepVariance, OneSpikeIsANearMiss) {
  // One 300 ms step in 100: p99 = 100 + 0.01 × 200 = 102 ms.
  const RuleResult r = Eval("high_step_variance", SpikyRun(1));
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(HighStepVariance, ALoneSpikeInAShortRunIsNotVariance) {
  // 37 steady steps, one of them 3× the median: p99 is that spike, but one hiccup is not variance.
  RunBuilder b;
  b.Steps(kWarmupSteps, Split(100, 5, 90)).Steps(20, Split(100, 5, 90));
  b.Step(Split(300, 5, 90)).Steps(16, Split(100, 5, 90));
  const RuleResult r = Eval("high_step_variance", b);
  EXPECT_FALSE(r.fired());
  EXPECT_FALSE(r.skipped());
}

TEST(HighStepVariance, FewCheapSpikesAreLow) {
  // Two 250 ms steps among 100 steady steps of 100 ms: p99 = 250 ms (2.5× p50), but only
  // 2 × 150 ms of 10.3 s (2.9%) is lost to them: below kVarianceMedShare, so low.
  RunBuilder b;
  b.Steps(kWarmupSteps, Split(100, 5, 90));
  for (size_t i = 0; i < 100; ++i) {
    b.Step(i == 30 || i == 70 ? Split(250, 5, 90) : Split(100, 5, 90));
  }
  const RuleResult r = Eval("high_step_variance", b);
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  EXPECT_NEAR(r.insight->evidence["lost_share"].get<double>(), 300.0 / 10300.0, 1e-9);
}

// SpikyRun(5) with the stall watch on and each spike's extra 200 ms (or `stall_ms` of it) a
// stall: the process held off the CPU.
RunBuilder StalledSpikes(int64_t stall_ms) {
  RunBuilder b = SpikyRun(5);
  b.StallWatch();
  for (size_t i = 0; i < b.steps().size(); ++i) {
    if (b.steps()[i].end_ns - b.steps()[i].start_ns == 300 * kMs) {
      b.StallInStep(i, stall_ms * kMs);
    }
  }
  return b;
}

TEST(HighStepVariance, SpikesThatAreStallsAreTheMachinesAndSaySo) {
  // GIVEN five 300 ms spikes, each 200 ms of it the process held off the CPU
  const RuleResult r = Eval("high_step_variance", StalledSpikes(200));
  ASSERT_TRUE(r.fired());
  // THEN the insight names the stalls and gives the host's fix, not logging or GC
  EXPECT_THAT(r.insight->message,
              HasSubstr(", 100% of their extra time with the process held off the CPU"));
  EXPECT_THAT(r.insight->fix, HasSubstr("The slow steps are the machine's"));
  EXPECT_THAT(r.insight->fix, Not(HasSubstr("gc.freeze")));
  EXPECT_TRUE(r.insight->evidence["stall_caused"].get<bool>());
  EXPECT_NEAR(r.insight->evidence["stall_share"].get<double>(), 1.0, 1e-9);
}

TEST(HighStepVariance, StallsBelowHalfTheExtraTimeLeaveTheUsualAdvice) {
  // GIVEN spikes 60 ms of whose 200 ms extra were stalls (30%)
  const RuleResult r = Eval("high_step_variance", StalledSpikes(60));
  ASSERT_TRUE(r.fired());
  EXPECT_FALSE(r.insight->evidence["stall_caused"].get<bool>());
  EXPECT_NEAR(r.insight->evidence["stall_share"].get<double>(), 0.3, 1e-9);
  // (the rest of their extra time is outside the loader and the phases: host work's fix)
  EXPECT_EQ(r.insight->fix, thresholds::kPeriodicHostWorkFix);
  // AND without the watch the share is unknown (null), not 0
  const RuleResult unwatched = Eval("high_step_variance", SpikyRun(5));
  EXPECT_TRUE(unwatched.insight->evidence["stall_share"].is_null());
}

TEST(HighStepVariance, HostStallsExplainsStalledSpikes) {
  // GIVEN stalled spikes: 1 s of stalls in 10.9 s of steady state (9%), so host_stalls fires
  const Report report = Analyze(StalledSpikes(200).Build(), RuleContext{});
  // THEN the variance is reported under host_stalls, as the same cause
  EXPECT_TRUE(HasInsight(report, "host_stalls"));
  EXPECT_FALSE(HasInsight(report, "high_step_variance"));
  EXPECT_TRUE(FoldedUnder(report, "high_step_variance", "host_stalls"));
}

// ---------------------------------------------------------------- evaluation_in_steps

// 3 warmup + 100 steady steps of 100 ms, `wait_ms` of each waiting on the DataLoader; every 25th
// steady step (steps 27, 52, 77, 102) also runs an unwrapped evaluation: 33 forward calls with
// the step's one backward, `eval_ms` longer, `eval_wait_ms` of that waiting on its loader and
// the rest in forward.
RunBuilder EvaluationRun(int64_t eval_ms, int64_t eval_wait_ms, int64_t wait_ms = 5) {
  RunBuilder b;
  const int64_t work = 100 - wait_ms;  // forward 30%, backward 50%, optimizer 20% of it
  const int64_t fwd = work * 3 / 10, opt = work * 2 / 10, bwd = work - fwd - opt;
  StepShape normal = Shape(100, wait_ms, {{"forward", fwd}, {"backward", bwd}, {"optimizer", opt}});
  normal.wait_source = "dataloader";
  StepShape eval =
      Shape(100 + eval_ms, wait_ms + eval_wait_ms,
            {{"forward", fwd + eval_ms - eval_wait_ms}, {"backward", bwd}, {"optimizer", opt}});
  eval.wait_source = "dataloader";
  b.Steps(kWarmupSteps, normal);
  for (size_t i = 0; i < 100; ++i) {
    const bool evaluates = i % 25 == 24;
    b.Step(evaluates ? eval : normal);
    if (evaluates) b.Calls(kWarmupSteps + i, 33, 1);
  }
  return b;
}

TEST(EvaluationInSteps, StepsWithManyForwardsAndOneBackwardAreNamedWithWhatTheyCost) {
  // GIVEN an evaluation 200 ms long inside every 25th step
  const RuleResult r = Eval("evaluation_in_steps", EvaluationRun(200, 100));
  ASSERT_TRUE(r.fired());
  // THEN it names the steps, their calls and their cost: 800 ms of 10.8 s (7%), low
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  EXPECT_EQ(r.insight->message,
            "An evaluation inside the training steps? 4 steps, every 25th (27, 52, …, 102), ran "
            "33 forward calls each with 1 backward pass (a typical step: 1 and 1) and took " +
                FormatDuration(200.0 * kMs) + " more each than a typical step's " +
                FormatDuration(100.0 * kMs) + ": " + FormatPercent(800.0 / 10800) +
                " of steady-state step time");
  EXPECT_THAT(r.insight->fix, HasSubstr("prof.evaluation()"));
  EXPECT_EQ(r.insight->evidence["evaluation_steps"], 4);
  EXPECT_EQ(r.insight->evidence["step_period"], 25);
  // AND a larger one is med
  EXPECT_EQ(Eval("evaluation_in_steps", EvaluationRun(2000, 1900)).insight->severity,
            Severity::kMed);
  // AND a cheap one (40 ms in 10 s) is not worth a finding
  EXPECT_FALSE(Eval("evaluation_in_steps", EvaluationRun(10, 5)).fired());
}

TEST(EvaluationInSteps, TheEvaluationsLoaderIsNotTheTrainingLoopsStall) {
  // GIVEN evaluations that wait 1.9 s each on their own loader: 45% of all step time is loader
  // wait, 5% of the training steps'
  const Report report = Analyze(EvaluationRun(2000, 1900).Build(), RuleContext{});
  // THEN the report leads with the evaluation, not with "raise num_workers" or step variance
  ASSERT_FALSE(report.insights.empty());
  EXPECT_EQ(report.insights[0].rule_id, "evaluation_in_steps");
  EXPECT_FALSE(HasInsight(report, "dataloader_stall"));
  EXPECT_FALSE(HasInsight(report, "high_step_variance"));
  // AND a training loop that does stall is judged on its own steps, and says so
  const RuleResult stall = Eval("dataloader_stall", EvaluationRun(2000, 1900, 40));
  ASSERT_TRUE(stall.fired());
  EXPECT_EQ(stall.insight->message, FormatPercent(0.40) +
                                        " of step time waiting on the loader (DataLoader next(), "
                                        "without the 4 evaluation steps)");
  EXPECT_EQ(stall.insight->evidence["evaluation_steps_left_out"], 4);
  EXPECT_NEAR(stall.insight->evidence["wait_fraction"].get<double>(), 0.40, 1e-9);
}

TEST(EvaluationInSteps, ForwardsThatComeWithBackwardsOrEveryStepAreTraining) {
  const auto flagged = [](const RunBuilder& b) {
    return BuildRunView(b.Build()).evaluation_steps.steps;
  };
  // GIVEN gradient accumulation: 4 forwards and 4 backwards every step, one step with 8 and 8
  RunBuilder accumulation;
  accumulation.Steps(30, Split(100, 5, 90)).BackwardPasses(4).Calls(10, 8, 8);
  EXPECT_TRUE(flagged(accumulation).empty());
  // GIVEN distillation: a frozen teacher's forward and the student's every step (2 to 1)
  RunBuilder teacher;
  teacher.Steps(30, Split(100, 5, 90));
  for (size_t i = 0; i < 30; ++i) teacher.Calls(i, 2, 1);
  EXPECT_TRUE(flagged(teacher).empty());
  // GIVEN a GAN: its D steps run 3 forwards, its G steps 2, each one backward
  RunBuilder gan;
  gan.Steps(30, Split(100, 5, 90));
  for (size_t i = 0; i < 30; ++i) gan.Calls(i, i % 2 ? 3 : 2, 1);
  EXPECT_TRUE(flagged(gan).empty());
  // GIVEN 2 extra forwards in one step (below kEvalExtraForwards)
  RunBuilder two;
  two.Steps(30, Split(100, 5, 90)).Calls(12, 3, 1);
  EXPECT_TRUE(flagged(two).empty());
  // GIVEN the evaluation inside warmup step 1: outside the steady state
  RunBuilder warm;
  warm.Steps(30, Split(100, 5, 90)).Calls(1, 40, 1);
  EXPECT_TRUE(flagged(warm).empty());
  // AND 3 extra forwards do make one
  RunBuilder three;
  three.Steps(30, Split(100, 5, 90)).Calls(12, 4, 1);
  EXPECT_EQ(flagged(three), std::vector<int64_t>{12});
}

TEST(EvaluationInSteps, TheTrainingBreakdownLeavesThemOutAndTheReportsBreakdownDoesNot) {
  const RunView v = BuildRunView(EvaluationRun(2000, 1900).Build());
  EXPECT_EQ(v.evaluation_steps.steps, (std::vector<int64_t>{27, 52, 77, 102}));
  EXPECT_EQ(v.evaluation_steps.typical_forwards, 1);
  EXPECT_NEAR(*v.training_breakdown.wait_fraction, 0.05, 1e-9);
  EXPECT_NEAR(*v.breakdown.wait_fraction, (100 * 5.0 + 4 * 1900) / (100 * 100.0 + 4 * 2000), 1e-9);
}

// ---------------------------------------------------------------- periodic host work

// 3 warmup + 100 steady steps of 100 ms with `other_ms` outside the loader and the phases; every
// 25th steady step (27, 52, 77, 102) spends `spike_ms` more there (a checkpoint save).
RunBuilder CheckpointRun(int64_t other_ms, int64_t spike_ms) {
  RunBuilder b;
  b.Steps(kWarmupSteps, Split(100, 5, 95 - other_ms));
  for (size_t i = 0; i < 100; ++i) {
    b.Step(Split(i % 25 == 24 ? 100 + spike_ms : 100, 5, 95 - other_ms));
  }
  return b;
}

TEST(KernelLaunchOverhead, TimeOutsideInAFewStepsIsPeriodicHostWorkNotLaunchOverhead) {
  // GIVEN 5 ms outside per step, and 200 ms more every 25th step: 1.3 s of 10.8 s (12%)
  const RuleResult r = Eval("kernel_launch_overhead", CheckpointRun(5, 200));
  ASSERT_TRUE(r.fired());
  // THEN it says where the time is, and gives the fix for periodic work, not torch.compile
  EXPECT_EQ(r.insight->message,
            FormatPercent(1300.0 / 10800) + " of step time (" + FormatDuration(13.0 * kMs) +
                " per step) is outside the loader wait and forward/backward/optimizer; " +
                FormatPercent(800.0 / 1300) + " of it in 4 steps, every 25th (27, 52, …, 102), " +
                FormatDuration(200.0 * kMs) + " each above the median step's " +
                FormatDuration(5.0 * kMs) +
                ": periodic host work (checkpoint saves, logging, evaluation), not launch "
                "overhead");
  EXPECT_EQ(r.insight->fix, thresholds::kPeriodicHostWorkFix);
  // (800 ms of 10.8 s: med, as high_step_variance would say)
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_EQ(r.insight->evidence["periodic_other"], true);
  EXPECT_EQ(r.insight->evidence["spike_period"], 25);
  // AND the report gives that one finding: the slow steps are the same cause
  const Report report = Analyze(CheckpointRun(5, 200).Build(), RuleContext{});
  EXPECT_TRUE(HasInsight(report, "kernel_launch_overhead"));
  EXPECT_TRUE(FoldedUnder(report, "high_step_variance", "kernel_launch_overhead"));
}

TEST(KernelLaunchOverhead, OverheadOnEveryStepBesideTheSpikesIsNamedToo) {
  // GIVEN 25 ms outside on every step and 1.2 s more every 25th step
  const RuleResult r = Eval("kernel_launch_overhead", CheckpointRun(25, 1200));
  ASSERT_TRUE(r.fired());
  // (the rest: 25 ms of every 100 ms step, once the spikes' 4.8 s are set aside)
  EXPECT_THAT(r.insight->message,
              HasSubstr("; the rest, " + FormatPercent(0.25) +
                        " of the other step time, is launch and Python overhead"));
  EXPECT_EQ(r.insight->severity, Severity::kMed);
  EXPECT_THAT(r.insight->fix, HasSubstr(thresholds::kPeriodicHostWorkFix));
  EXPECT_THAT(r.insight->fix, HasSubstr("For the rest: Cut per-step host work"));
}

TEST(KernelLaunchOverhead, EvenOverheadIsLaunchOverheadAndLeavesTheVarianceAlone) {
  // GIVEN 15 ms outside every step
  RunBuilder b;
  b.Steps(20, Split(100, 5, 80));
  const RuleResult r = Eval("kernel_launch_overhead", b);
  ASSERT_TRUE(r.fired());
  EXPECT_THAT(r.insight->message, ::testing::EndsWith(": launch and Python overhead"));
  EXPECT_EQ(r.insight->evidence["periodic_other"], false);
  EXPECT_EQ(r.insight->fix, FindRule("kernel_launch_overhead")->fix);
  // AND with loader spikes as well, the variance is not folded under it (another cause)
  StepShape slow = Split(400, 305, 80);
  RunBuilder both;
  both.Steps(kWarmupSteps, Split(100, 5, 80));
  for (size_t i = 0; i < 100; ++i) both.Step(i % 20 == 7 ? slow : Split(100, 5, 80));
  const Report report = Analyze(both.Build(), RuleContext{});
  EXPECT_TRUE(HasInsight(report, "kernel_launch_overhead"));
  EXPECT_FALSE(FoldedUnder(report, "high_step_variance", "kernel_launch_overhead"));
}

// ---------------------------------------------------------------- host_stalls

TEST(HostStalls, FiresOnRepeatedStallsWithTheirTotalAndLongest) {
  // GIVEN 100 steady steps of 100 ms, 4 of them with a stall (60, 60, 80, 120 ms)
  RunBuilder b;
  b.StallWatch().Steps(kWarmupSteps + 100, Split(100, 5, 90));
  const int64_t stalls[] = {60, 60, 80, 120};
  for (size_t k = 0; k < 4; ++k) b.StallInStep(kWarmupSteps + 10 + 20 * k, stalls[k] * kMs);
  const RuleResult r = Eval("host_stalls", b);
  // THEN it fires, low (320 ms of 10 s = 3.2%), naming the count, total and longest
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  EXPECT_EQ(r.insight->message, "The process was held off the CPU 4 times in the steady state, " +
                                    FormatDuration(320.0 * kMs) + " in all (" +
                                    FormatPercent(0.032) + " of step time; longest " +
                                    FormatDuration(120.0 * kMs) +
                                    "): those steps were slow whatever its code did");
  EXPECT_THAT(r.insight->fix, HasSubstr("CPU steal"));
  EXPECT_EQ(r.insight->evidence["stalls"].get<int64_t>(), 4);
}

TEST(HostStalls, IsMedFromATenthOfStepTime) {
  RunBuilder b;
  b.StallWatch().Steps(kWarmupSteps + 20, Split(100, 5, 90));
  b.StallInStep(kWarmupSteps + 3, 150 * kMs).StallInStep(kWarmupSteps + 9, 150 * kMs);
  const RuleResult r = Eval("host_stalls", b);
  ASSERT_TRUE(r.fired());  // 300 ms of 2 s
  EXPECT_EQ(r.insight->severity, Severity::kMed);
}

TEST(HostStalls, OneStallOrALittleStallingPasses) {
  RunBuilder one;
  one.StallWatch().Steps(kWarmupSteps + 20, Split(100, 5, 90));
  one.StallInStep(kWarmupSteps + 5, 500 * kMs);
  EXPECT_FALSE(Eval("host_stalls", one).fired());
  EXPECT_FALSE(Eval("host_stalls", one).skipped());
  // 3 stalls of 15 ms in 10 s: 0.45%, under kHostStallShare
  RunBuilder few;
  few.StallWatch().Steps(kWarmupSteps + 100, Split(100, 5, 90));
  for (size_t k = 0; k < 3; ++k) few.StallInStep(kWarmupSteps + 30 * k, 15 * kMs);
  EXPECT_FALSE(Eval("host_stalls", few).fired());
  EXPECT_FALSE(Eval("host_stalls", few).skipped());
}

TEST(HostStalls, StallsDuringWarmupAreNotCounted) {
  RunBuilder b;
  b.StallWatch().Steps(kWarmupSteps + 20, Split(100, 5, 90));
  b.StallInStep(0, 90 * kMs).StallInStep(1, 90 * kMs);
  EXPECT_FALSE(Eval("host_stalls", b).fired());
}

TEST(HostStalls, WithoutTheWatchItIsNotEvaluatedAndSaysWhy) {
  RunBuilder b;
  b.Steps(kWarmupSteps + 20, Split(100, 5, 90));
  const RuleResult none = Eval("host_stalls", b);
  ASSERT_TRUE(none.skipped());
  EXPECT_THAT(*none.not_evaluated, HasSubstr("no stall watch"));
  b.Telemetry("stalls", false, std::nullopt, "host telemetry disabled (host=False)");
  EXPECT_EQ(*Eval("host_stalls", b).not_evaluated,
            "no stall watch: host telemetry disabled (host=False)");
}

// ---------------------------------------------------------------- cpu_contention

// 100 steady steps of 100 ms with the CPU wait read; `waits` (step index in the steady state,
// ms of CPU wait in it); host samples every 100 ms of a 2-core host `host_pct` busy with the
// training's tree on `tree_pct` (percent of one core).
// job_pct: the job's other ranks on the host (a rank a launcher started beside others).
RunBuilder Contended(const std::vector<std::pair<size_t, int64_t>>& waits, double host_pct,
                     double tree_pct, std::optional<double> job_pct = std::nullopt) {
  RunBuilder b;
  b.CpuWaitWatch().Steps(kWarmupSteps + 100, Split(100, 5, 90));
  for (const auto& [i, ms] : waits) b.CpuWaitInStep(kWarmupSteps + i, ms * kMs);
  b.HostEvery(100 * kMs, [&](int64_t, store::HostSampleRow& h) {
    h.cpu_pct = host_pct;
    h.ncores = 2;
    h.proc_cpu_pct = tree_pct;
    h.job_cpu_pct = job_pct;
  });
  return b;
}

TEST(CpuContention, FiresWhenTheTrainingsThreadsQueueAndSaysWhoseLoadItIs) {
  // GIVEN 40 steps that each queued 40 ms for a CPU, one 60 ms (1.62 s of 10 s: 16.2%) on a
  // 2-core host 90% busy, the training on 0.8 of a core: other processes hold about 1 core
  std::vector<std::pair<size_t, int64_t>> waits;
  for (size_t i = 0; i < 40; ++i) waits.emplace_back(2 * i + 1, i == 10 ? 60 : 40);
  const RuleResult r = Eval("cpu_contention", Contended(waits, 90, 80));
  // THEN it fires, low, with the total, the share, the worst step and whose load it is
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  EXPECT_EQ(r.insight->message, "The training's threads queued " + FormatDuration(1620.0 * kMs) +
                                    " for a CPU in the steady state (" + FormatPercent(0.162) +
                                    " of step time; step " + std::to_string(kWarmupSteps + 21) +
                                    " waited " + FormatDuration(60.0 * kMs) + " of its " +
                                    FormatDuration(100.0 * kMs) +
                                    "): other processes kept about 1 of the host's 2 cores busy");
  EXPECT_EQ(r.insight->fix, thresholds::kCpuContentionOthersFix);
  EXPECT_TRUE(r.insight->evidence["other_load"].get<bool>());
  EXPECT_NEAR(r.insight->evidence["other_load_min_cores"].get<double>(), 1.0, 1e-9);
}

TEST(CpuContention, TheTrainingsOwnThreadsGetTheThreadCountFixAndSeverityGrowsWithTheShare) {
  // GIVEN every steady step queueing 60 ms (60%) on a host the training alone keeps busy
  std::vector<std::pair<size_t, int64_t>> waits;
  for (size_t i = 0; i < 100; ++i) waits.emplace_back(i, 60);
  const RuleResult r = Eval("cpu_contention", Contended(waits, 95, 185));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kHigh);
  EXPECT_THAT(r.insight->message,
              HasSubstr("the training's own threads and processes outnumber the host's 2 cores"));
  EXPECT_EQ(r.insight->fix, thresholds::kCpuContentionOwnFix);
  EXPECT_TRUE(r.insight->evidence["own_threads"].get<bool>());
  // AND 30 ms a step (30%) is med
  for (auto& w : waits) w.second = 30;
  EXPECT_EQ(Eval("cpu_contention", Contended(waits, 95, 185)).insight->severity, Severity::kMed);
  // AND without host samples it still fires, with the general fix
  RunBuilder bare;
  bare.CpuWaitWatch().Steps(kWarmupSteps + 20, Split(100, 5, 90));
  for (size_t i = 0; i < 20; ++i) bare.CpuWaitInStep(kWarmupSteps + i, 30 * kMs);
  const RuleResult plain = Eval("cpu_contention", bare);
  ASSERT_TRUE(plain.fired());
  EXPECT_EQ(plain.insight->fix, thresholds::kCpuContentionFix);
  EXPECT_TRUE(plain.insight->evidence["other_load_min_cores"].is_null());
}

TEST(CpuContention, TheJobsOtherRanksOnTheHostAreNotOtherProcesses) {
  // GIVEN a rank queueing 60 ms of every 100 ms step on a 2-core host 95% busy: this rank on
  // 0.9 of a core, the job's other rank on this host on 0.8 (0.2 of a core left to others)
  std::vector<std::pair<size_t, int64_t>> waits;
  for (size_t i = 0; i < 100; ++i) waits.emplace_back(i, 60);
  const RuleResult r = Eval("cpu_contention", Contended(waits, 95, 90, 80));
  // THEN the load is the job's: its ranks on this host get the per-rank share fix, not "move
  // the other processes"
  ASSERT_TRUE(r.fired());
  EXPECT_THAT(r.insight->message,
              HasSubstr(": the job's other ranks on this host kept about 0.8 of its 2 cores "
                        "busy, this rank about 0.9 (processes outside the job under 0.5 of a "
                        "core)"));
  EXPECT_EQ(r.insight->fix, thresholds::kCpuContentionJobFix);
  EXPECT_TRUE(r.insight->evidence["job_load"].get<bool>());
  EXPECT_NEAR(r.insight->evidence["job_load_mean_cores"].get<double>(), 0.8, 1e-9);
  EXPECT_NEAR(r.insight->evidence["other_load_min_cores"].get<double>(), 0.2, 1e-9);

  // GIVEN the ranks told each other their pids only after the first samples (mp.spawn: at the
  // first step): the samples before have no job figure
  RunBuilder late;
  late.CpuWaitWatch().Steps(kWarmupSteps + 100, Split(100, 5, 90));
  for (const auto& [i, ms] : waits) late.CpuWaitInStep(kWarmupSteps + i, ms * kMs);
  late.HostEvery(100 * kMs, [&](int64_t ts, store::HostSampleRow& h) {
    h.cpu_pct = 95;
    h.ncores = 2;
    h.proc_cpu_pct = 90;
    if (ts >= 3000 * kMs) h.job_cpu_pct = 80;
  });
  const RuleResult later = Eval("cpu_contention", late);
  // THEN it is still the job's load, from the samples that have it
  ASSERT_TRUE(later.fired());
  EXPECT_EQ(later.insight->fix, thresholds::kCpuContentionJobFix);

  // GIVEN the same with a process outside the job on a full core (host 100%: 0.9 + 0.1 + 1)
  const RuleResult outside = Eval("cpu_contention", Contended(waits, 100, 90, 10));
  // THEN that process is the one to move, and the ranks' own share is named beside it
  ASSERT_TRUE(outside.fired());
  EXPECT_THAT(outside.insight->message,
              HasSubstr(": other processes kept about 1 of the host's 2 cores busy (besides the "
                        "job's other ranks on this host, about 0.1)"));
  EXPECT_EQ(outside.insight->fix, thresholds::kCpuContentionOthersFix);

  // GIVEN the other ranks idle and this rank's own threads on the whole host
  const RuleResult own = Eval("cpu_contention", Contended(waits, 95, 185, 2));
  // THEN it is this rank's threads
  ASSERT_TRUE(own.fired());
  EXPECT_EQ(own.insight->fix, thresholds::kCpuContentionOwnFix);
}

TEST(CpuContention, ALittleQueueingPassesAndWithoutTheReadingItSaysWhy) {
  // 4 steps of 100 queueing 10 ms: 0.4%
  const RuleResult quiet =
      Eval("cpu_contention", Contended({{1, 10}, {2, 10}, {3, 10}, {4, 10}}, 50, 90));
  EXPECT_FALSE(quiet.fired());
  EXPECT_FALSE(quiet.skipped());
  RunBuilder b;
  b.Steps(kWarmupSteps + 20, Split(100, 5, 90));
  EXPECT_THAT(*Eval("cpu_contention", b).not_evaluated, HasSubstr("CPU wait not read"));
  b.Telemetry("cpu_wait", false, std::nullopt, "host telemetry disabled (host=False)");
  EXPECT_EQ(*Eval("cpu_contention", b).not_evaluated,
            "CPU wait not read: host telemetry disabled (host=False)");
}

TEST(CpuContention, AStretchSpanningStepsIsSharedByOverlapAndCappedAtTheStep) {
  // GIVEN one 200 ms stretch with 300 ms of wait (two threads queueing) over steps 3 and 4
  RunBuilder b;
  b.CpuWaitWatch().Steps(10, Split(100, 5, 90));
  b.CpuWait(b.steps()[3].start_ns, b.steps()[4].end_ns, 300 * kMs);
  const RunView v = BuildRunView(b.Build());
  // THEN each step takes half, capped at its 100 ms; the others none
  EXPECT_EQ(v.steps[3].cpu_wait_ns, 100 * kMs);
  EXPECT_EQ(v.steps[4].cpu_wait_ns, 100 * kMs);
  EXPECT_EQ(v.steps[5].cpu_wait_ns, 0);
  EXPECT_EQ(v.steps[4].machine_ns(), 100 * kMs);
}

TEST(HighStepVariance, SpikesThatQueueForACpuAreTheMachinesAndFoldUnderCpuContention) {
  // GIVEN five 300 ms spikes, each 190 ms of it the training's threads queued for a CPU
  RunBuilder b = SpikyRun(5);
  b.CpuWaitWatch();
  for (size_t i = 0; i < b.steps().size(); ++i) {
    if (b.steps()[i].end_ns - b.steps()[i].start_ns == 300 * kMs) b.CpuWaitInStep(i, 190 * kMs);
  }
  const RuleResult r = Eval("high_step_variance", b);
  ASSERT_TRUE(r.fired());
  // THEN the slow steps are the machine's, with the contention fix
  EXPECT_THAT(r.insight->message,
              HasSubstr(", 95% of their extra time with its threads queued for a CPU"));
  EXPECT_TRUE(r.insight->evidence["cpu_wait_caused"].get<bool>());
  EXPECT_FALSE(r.insight->evidence["stall_caused"].get<bool>());
  EXPECT_EQ(r.insight->fix, std::string("The slow steps are the machine's, not the training's. ") +
                                thresholds::kCpuContentionFix);
  // AND when cpu_contention fires (the spikes' 950 ms and 10 ms in every step: 1.95 s of
  // ~10.9 s) the variance is folded under it
  for (size_t i = 0; i < b.steps().size(); ++i) b.CpuWaitInStep(i, 10 * kMs);
  const Report report = Analyze(b.Build(), RuleContext{});
  EXPECT_TRUE(HasInsight(report, "cpu_contention"));
  EXPECT_FALSE(HasInsight(report, "high_step_variance"));
}

TEST(Warmup, AFirstStepThatQueuedForACpuIsNoWarmup) {
  // GIVEN a 1.6 s step 0 of which 1.5 s its threads queued for a CPU
  RunBuilder b;
  b.CpuWaitWatch().Step(Split(1600, 5, 90)).Steps(39, Split(100, 5, 90));
  b.CpuWaitInStep(0, 1500 * kMs);
  EXPECT_FALSE(Eval("first_step_outlier", b).fired());
  EXPECT_FALSE(Eval("compilation_warmup", b).fired());
}

TEST(Warmup, AFirstStepThatWasAStallIsNoWarmup) {
  // GIVEN a 1.6 s step 0 of which 1.5 s the process was held off the CPU
  RunBuilder b;
  b.StallWatch().Step(Split(1600, 5, 90)).Steps(39, Split(100, 5, 90));
  b.StallInStep(0, 1500 * kMs);
  // THEN neither warmup rule blames compilation
  EXPECT_FALSE(Eval("first_step_outlier", b).fired());
  EXPECT_FALSE(Eval("compilation_warmup", b).fired());
  // AND a real one-time cost beside a stall is still found, measured without the stall
  RunBuilder c;
  c.StallWatch().Step(Split(3000, 5, 90)).Steps(39, Split(100, 5, 90));
  c.StallInStep(0, 500 * kMs);
  const RuleResult r = Eval("first_step_outlier", c);
  ASSERT_TRUE(r.fired());
  EXPECT_THAT(r.insight->message, HasSubstr("outside the loader and time without a CPU"));
  // (step 0's gap wait is unknown: all of its time but the stall is work)
  EXPECT_NEAR(r.insight->evidence["first_step_work_ns"].get<double>(), 2500.0 * kMs, 1e3);
}

// `spikes` steady steps out of 100 that wait `extra_wait_ms` longer on the DataLoader.
RunBuilder LoaderSpikes(size_t spikes, int64_t extra_wait_ms) {
  RunBuilder b;
  StepShape normal = Split(100, 5, 90);
  normal.wait_source = "dataloader";
  StepShape slow = Split(100 + extra_wait_ms, 5 + extra_wait_ms, 90);
  slow.wait_source = "dataloader";
  b.Steps(kWarmupSteps, normal);
  for (size_t i = 0; i < 100; ++i) b.Step(i % 20 == 7 && i / 20 < spikes ? slow : normal);
  return b;
}

TEST(HighStepVariance, SlowStepsThatWaitOnTheLoaderSayItAndGetTheLoadersFix) {
  // GIVEN 5 steps in 100 that wait 200 ms longer for their batch
  const RuleResult r = Eval("high_step_variance", LoaderSpikes(5, 200));
  ASSERT_TRUE(r.fired());
  // THEN the slow steps are blamed on the loader, not on logging or GC
  EXPECT_THAT(r.insight->message, HasSubstr("5 of 100 steady-state steps took over 2× the "
                                            "median, every 20th step from step 10, 100% of "
                                            "their extra time waiting on the loader"));
  EXPECT_EQ(r.insight->evidence["loader_caused"], true);
  EXPECT_THAT(r.insight->fix, HasSubstr("more num_workers"));
  EXPECT_THAT(r.insight->fix, ::testing::Not(HasSubstr("GC")));
  // AND spikes outside the loader (SpikyRun: the time is in the step, not the wait) are not
  const RuleResult other = Eval("high_step_variance", SpikyRun(5));
  ASSERT_TRUE(other.fired());
  EXPECT_EQ(other.insight->evidence["loader_caused"], false);
  EXPECT_EQ(other.insight->evidence["other_caused"], true);
  EXPECT_EQ(other.insight->fix, thresholds::kPeriodicHostWorkFix);
}

TEST(HighStepVariance, ALoaderRuleThatFiresExplainsLoaderSpikes) {
  // GIVEN loader spikes large enough that the loader also stalls the run (5 steps in 100 wait
  // 2 s more: half the run's time): dataloader_stall fires too
  const Report report = Analyze(LoaderSpikes(5, 2000).Build(), RuleContext{});
  std::set<std::string> reported, folded;
  for (const Insight& in : report.insights) reported.insert(in.rule_id);
  for (const Explained& e : report.explained) folded.insert(e.insight.rule_id);
  // THEN one finding names the cause, and the variance is folded under it
  EXPECT_TRUE(reported.count("dataloader_stall"));
  EXPECT_FALSE(reported.count("high_step_variance"));
  EXPECT_TRUE(folded.count("high_step_variance"));
  for (const Explained& e : report.explained) EXPECT_EQ(e.by, "dataloader_stall");
}

TEST(HighStepVariance, NotEvaluatedOnFewSteadySteps) {
  RunBuilder b;
  b.Steps(kWarmupSteps + 5, Split(100, 5, 90));
  EXPECT_THAT(*Eval("high_step_variance", b).not_evaluated, HasSubstr("only 5 steady-state steps"));
  // AND one step is one step
  RunBuilder one;
  one.Steps(2, Split(100, 5, 90));
  EXPECT_THAT(*Eval("high_step_variance", one).not_evaluated,
              HasSubstr("only 1 steady-state step;"));
}

// ---------------------------------------------------------------- cost

RunBuilder TimedRun(int64_t duration_s, const std::string& model, int64_t gpus) {
  RunBuilder b;
  b.Gpu(model, gpus).Steps(10, StepShape{});
  b.run().end_ns = duration_s * kSec;
  return b;
}

TEST(Cost, OneGpuAtTheReferenceRate) {
  const RuleResult r = Eval("cost", TimedRun(120, "NVIDIA H100 80GB HBM3", 1));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->severity, Severity::kLow);
  EXPECT_EQ(r.insight->message,
            "Estimated cost: " + FormatUsd(120.0 / 3600 * 12.29) + " (2 min · $12.29/h)");
}

TEST(Cost, EightGpusWithIdleShareFromMfu) {
  RunBuilder b = TimedRun(231 * 60, "NVIDIA H100 80GB HBM3", 8);
  b.Flops(0.35 * 989e12 * 0.100, "bf16");
  const RuleResult r = Eval("cost", b);
  ASSERT_TRUE(r.fired());
  const double usd = 231.0 / 60 * 8 * 12.29;
  EXPECT_EQ(r.insight->message,
            "Estimated cost: " + FormatUsd(usd) + " (231 min · 8× GPU @ $12.29/h); ~" +
                FormatUsd(usd * (1 - 0.35)) + " of that is idle capacity (MFU 35.0%)");
}

TEST(Cost, RateOverrideFromOptionsOrEnvironment) {
  const RunBuilder b = TimedRun(3600, "NVIDIA H100 80GB HBM3", 2);
  const RuleContext env = MakeRuleContext({}, "3.50");
  EXPECT_EQ(env.gpu_rate_source, "GPUPROF_GPU_RATE");
  EXPECT_EQ(Eval("cost", b, env).insight->message,
            "Estimated cost: $7.00 (60 min · 2× GPU @ $3.50/h)");
  AnalysisOptions opts;
  opts.gpu_rate_usd_per_hour = 1.0;
  const RuleContext both = MakeRuleContext(opts, "3.50");  // the option wins
  EXPECT_EQ(Eval("cost", b, both).insight->evidence["usd"].get<double>(), 2.0);
  const RuleContext bad = MakeRuleContext({}, "lots");
  EXPECT_THAT(*Eval("cost", b, bad).not_evaluated, HasSubstr("GPUPROF_GPU_RATE='lots'"));
}

TEST(Cost, CpuRunNeedsARate) {
  RunBuilder b = TimedRun(120, "unused", 1);
  b.Cpu();
  EXPECT_THAT(*Eval("cost", b).not_evaluated, HasSubstr("CPU run and no rate given"));
  const RuleResult r = Eval("cost", b, MakeRuleContext({}, "0.5"));
  ASSERT_TRUE(r.fired());
  EXPECT_EQ(r.insight->message,
            "Estimated cost: " + FormatUsd(120.0 / 3600 * 0.5) + " (2 min · 1 machine @ $0.50/h)");
}

TEST(Cost, NotEvaluatedOnSimulatedGpus) {
  // GIVEN a run on mock GPUs that look like H100s
  RunBuilder b = TimedRun(120, "NVIDIA H100 80GB HBM3", 4);
  b.run().gpu_backend = "mock";
  // WHEN the cost rule runs, with or without a rate THEN it gives no number
  EXPECT_THAT(*Eval("cost", b).not_evaluated, HasSubstr("simulated"));
  EXPECT_THAT(*Eval("cost", b, MakeRuleContext({}, "2.0")).not_evaluated, HasSubstr("simulated"));
  // AND the same when the training ran on the CPU beside the simulated GPUs (a CPU run,
  // which a rate would otherwise price per machine)
  b.Cpu();
  b.run().gpu_backend = "mock";
  EXPECT_THAT(*Eval("cost", b, MakeRuleContext({}, "2.0")).not_evaluated, HasSubstr("simulated"));
}

TEST(Cost, AnIdleShareBelowOneCentIsNotMarkedApproximateTwice) {
  // GIVEN a one-second run at 35% MFU, whose idle share is below $0.01
  RunBuilder b = TimedRun(1, "NVIDIA H100 80GB HBM3", 1);
  b.Flops(0.35 * 989e12 * 0.100, "bf16");
  const RuleResult r = Eval("cost", b);
  ASSERT_TRUE(r.fired());
  // THEN the message reads "<$0.01 of that", not "~<$0.01"
  EXPECT_THAT(r.insight->message,
              HasSubstr("; " + FormatUsd(1.0 / 3600 * 12.29 * 0.65) + " of that is idle"));
  EXPECT_THAT(r.insight->message, ::testing::Not(HasSubstr("~<")));
}

TEST(Cost, NotEvaluatedWithoutAReferenceRate) {
  const RuleResult r = Eval("cost", TimedRun(120, "NVIDIA H200", 1));
  ASSERT_TRUE(r.skipped());
  EXPECT_THAT(*r.not_evaluated, HasSubstr("no reference rate for 'NVIDIA H200'"));
  RunBuilder no_count = TimedRun(120, "NVIDIA H100 80GB HBM3", 1);
  no_count.run().gpu_count.reset();
  EXPECT_THAT(*Eval("cost", no_count).not_evaluated, HasSubstr("GPU count"));
  RunBuilder no_time;
  no_time.run().end_ns.reset();
  EXPECT_THAT(*Eval("cost", no_time).not_evaluated, HasSubstr("duration"));
}

// ---------------------------------------------------------------- whole runs

TEST(Analyze, HealthyRunHasNoHighOrMedInsight) {
  const Report report = Analyze(HealthyRun().Build(), RuleContext{});
  for (const Insight& in : report.insights) {
    EXPECT_LT(in.severity, Severity::kMed) << in.rule_id << ": " << in.message;
  }
  ASSERT_EQ(report.insights.size(), 1u);
  EXPECT_EQ(report.insights[0].rule_id, "cost");
}

TEST(Analyze, HealthyRunWithFullTelemetryEvaluatesEveryRuleAndFlagsNothing) {
  // Previous runs of the same name ran at the same pace.
  const Report report =
      Analyze(HealthyFullRun().Build(), testing::WithPreviousRuns({100, 101, 99}));
  // Everything the rules need was measured, so every per-run rule was evaluated ...
  for (const NotEvaluated& n : report.not_evaluated) {
    ADD_FAILURE() << n.rule_id << " not evaluated: " << n.reason;
  }
  // ... and the one thing the run gets told is what it cost.
  for (const Insight& in : report.insights) {
    EXPECT_LT(in.severity, Severity::kMed) << in.rule_id << ": " << in.message;
  }
  ASSERT_EQ(report.insights.size(), 1u) << report.insights.back().rule_id;
  EXPECT_EQ(report.insights[0].rule_id, "cost");
}

TEST(Analyze, InsightsAreOrderedBySeverityThenRegistry) {
  RunBuilder b;
  b.Step(Split(2000, 0, 1900)).Steps(30, Split(100, 40, 30));  // stall HIGH, overhead MED
  const Report report = Analyze(b.Build(), RuleContext{});
  ASSERT_GE(report.insights.size(), 3u);
  for (size_t i = 1; i < report.insights.size(); ++i) {
    EXPECT_GE(report.insights[i - 1].severity, report.insights[i].severity);
  }
  EXPECT_EQ(report.insights[0].rule_id, "dataloader_stall");
  EXPECT_EQ(report.insights[1].rule_id, "kernel_launch_overhead");
}

TEST(Analyze, EveryRuleIsEitherFiredPassedOrSkippedOnAnEmptyRun) {
  RunBuilder b;
  b.run().end_ns.reset();
  const Report report = Analyze(b.Build(), RuleContext{});
  EXPECT_TRUE(report.insights.empty());
  size_t per_run = 0;
  for (const RuleSpec& r : Rules()) per_run += r.group() ? 0 : 1;
  EXPECT_EQ(report.not_evaluated.size(), per_run);
  for (const NotEvaluated& n : report.not_evaluated) EXPECT_FALSE(FindRule(n.rule_id)->group());
}

}  // namespace
}  // namespace gpuprof::analysis
