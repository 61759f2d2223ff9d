// The summary block, the full report and the JSON document, checked against numbers
// computed from each scenario.
#include "analysis/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/test_runs.h"

namespace gpuprof::analysis {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using testing::HealthyRun;
using testing::kMs;
using testing::RunBuilder;
using testing::StepShape;

// A regex for one table row: the label, spaces, then the value (escaped).
std::string Row(const std::string& label, const std::string& value) {
  std::string escaped;
  for (char c : value) {
    if (std::string("\\.()[]{}*+?^$|").find(c) != std::string::npos) escaped += '\\';
    escaped += c;
  }
  return "\n +" + label + " +" + escaped;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string Rule60() {
  std::string s;
  for (int i = 0; i < 60; ++i) s += "─";
  return s;
}

// The README's example run: 200 steps of 121.3 ms, 34% of each waiting on the loader,
// MFU 12.4% of the H100 bf16 peak.
struct ExampleRun {
  static constexpr int64_t kStepNs = 121'300'000;
  static constexpr double kWait = 0.34;
  static constexpr double kMfu = 0.124;
  RunBuilder builder;
  ExampleRun() {
    builder.Name("my-experiment");
    StepShape s;
    s.duration_ns = kStepNs;
    s.wait_ns = static_cast<int64_t>(kWait * kStepNs);
    const int64_t busy = kStepNs - *s.wait_ns - 2 * kMs;  // 2 ms outside phases
    s.phases = {{"forward", busy / 3, std::nullopt},
                {"backward", busy - busy / 3 - busy / 10, std::nullopt},
                {"optimizer", busy / 10, std::nullopt}};
    builder.Steps(200, s);
    builder.Flops(kMfu * 989e12 * (kStepNs * 1e-9), "bf16");
  }
};

TEST(Summary, MatchesTheReadmeShapeWithTheRunsOwnNumbers) {
  ExampleRun ex;
  const Report report = Analyze(ex.builder.Build(), RuleContext{});
  const std::string text = FormatSummary(report, "gpuprof.db");
  const auto lines = Lines(text);
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(lines.front(), Rule60());
  EXPECT_EQ(lines.back(), Rule60());
  EXPECT_EQ(lines[1], "gpuprof · my-experiment  (200 steps, avg " +
                          FormatDuration(static_cast<double>(ExampleRun::kStepNs)) + ")");
  EXPECT_EQ(lines[1], "gpuprof · my-experiment  (200 steps, avg 121.3 ms)");
  EXPECT_EQ(lines[2], "  Insights (3):");
  EXPECT_EQ(lines[3], "  [HIGH]  " + FormatPercent(ExampleRun::kWait) +
                          " of step time waiting on the loader (inter-step gap)");
  // HIGH and MED findings carry their fix on the next line.
  const auto fix_line = [&](const std::string& rule_id) {
    for (const Insight& in : report.insights) {
      if (in.rule_id == rule_id) return "          → " + in.fix;
    }
    return std::string("missing insight ") + rule_id;
  };
  EXPECT_EQ(lines[4], fix_line("dataloader_stall"));
  EXPECT_EQ(lines[5],
            "  [MED]   MFU " + FormatPercent(ExampleRun::kMfu, 1) + " of 989 TFLOPs bf16 peak");
  EXPECT_EQ(lines[6], fix_line("low_mfu"));
  const double seconds = 200 * ExampleRun::kStepNs * 1e-9;
  const double usd = seconds / 3600 * 12.29;
  EXPECT_EQ(lines[7],
            "  [LOW]   Estimated cost: " + FormatUsd(usd) + " (" + FormatMinutes(seconds * 1e9) +
                " · $12.29/h); ~" + FormatUsd(usd * (1 - ExampleRun::kMfu)) +
                " of that is idle capacity (MFU " + FormatPercent(ExampleRun::kMfu, 1) + ")");
  // The rules whose inputs this run lacks (no telemetry, no earlier runs) are named on one line.
  EXPECT_THAT(lines[8], ::testing::StartsWith(
                            StrFormat("  Not evaluated (%zu): ", report.not_evaluated.size())));
  EXPECT_EQ(lines[9], "  Full report: gpuprof insights gpuprof.db 1");
  EXPECT_EQ(lines.size(), 11u) << text;
}

TEST(Summary, SaysSoWhenThereAreNoInsights) {
  RunBuilder b = HealthyRun();
  b.Gpu("NVIDIA H200", 1);  // no reference rate: no cost line either
  const Report report = Analyze(b.Build(), RuleContext{});
  ASSERT_TRUE(report.insights.empty());
  const std::string text = FormatSummary(report, "runs/x.db");
  EXPECT_THAT(text, HasSubstr("  Insights: none"));
  EXPECT_THAT(text, HasSubstr(StrFormat("  Not evaluated (%zu): ", report.not_evaluated.size())));
  EXPECT_THAT(text, HasSubstr("(reasons in the full report)\n"));
  EXPECT_THAT(text, HasSubstr("Full report: gpuprof insights runs/x.db 1"));
}

TEST(Summary, ARankOfAGroupPointsToTheGroupReport) {
  RunBuilder b = HealthyRun();
  b.Rank("my job", 1, 4);
  const std::string text = FormatSummary(Analyze(b.Build(), RuleContext{}), "runs/x.db");
  EXPECT_THAT(text, HasSubstr("  All 4 ranks: gpuprof insights runs/x.db --group 'my job'\n"));
  // AND when its store holds only some of the ranks (each node wrote its own file) it says how
  // to bring them together
  RuleContext two_of_four;
  two_of_four.peer_waits = PeerWaits{};
  two_of_four.peer_waits->other_ranks = 1;
  EXPECT_THAT(FormatSummary(Analyze(b.Build(), two_of_four), "runs/x.db"),
              HasSubstr("  2 of 4 ranks are in this file; to compare them all: gpuprof merge "
                        "all.db runs/x.db <the other ranks' files>, then gpuprof insights all.db "
                        "--group 'my job'\n"));
  two_of_four.peer_waits->other_ranks = 3;
  EXPECT_THAT(FormatSummary(Analyze(b.Build(), two_of_four), "runs/x.db"),
              HasSubstr("  All 4 ranks: gpuprof insights runs/x.db --group 'my job'\n"));
  // AND a run of no group has no such line
  EXPECT_THAT(FormatSummary(Analyze(HealthyRun().Build(), RuleContext{}), "x.db"),
              ::testing::Not(HasSubstr("--group")));
}

TEST(Summary, NotEvaluatedLineNamesWhatFitsThenCounts) {
  RunBuilder b = HealthyRun();
  b.Cpu();
  const Report report = Analyze(b.Build(), RuleContext{});
  ASSERT_GT(report.not_evaluated.size(), 5u);
  const std::string text = FormatSummary(report, "gpuprof.db");
  std::string line;
  for (const std::string& l : Lines(text)) {
    if (l.rfind("  Not evaluated (", 0) == 0) line = l;
  }
  ASSERT_FALSE(line.empty()) << text;
  EXPECT_LE(line.size(), kSummaryMaxLineColumns);
  // The first rules are named in registry order; the rest are counted.
  EXPECT_THAT(line, HasSubstr(StrFormat("Not evaluated (%zu): %s, %s", report.not_evaluated.size(),
                                        report.not_evaluated[0].rule_id.c_str(),
                                        report.not_evaluated[1].rule_id.c_str())));
  EXPECT_THAT(line, ::testing::ContainsRegex(", … \\+[0-9]+ \\(reasons in the full report\\)$"));
}

TEST(Summary, FailedRunShowsTheErrorInTheHeader) {
  RunBuilder b;
  b.Name("crashy").Steps(4, StepShape{});
  b.run().status = "failed";
  b.run().error = "RuntimeError: CUDA out of memory\nTraceback (most recent call last): ...";
  const std::string text = FormatSummary(Analyze(b.Build(), RuleContext{}), "gpuprof.db");
  EXPECT_EQ(Lines(text)[1], "gpuprof · crashy  (4 steps, avg " + FormatDuration(100.0 * kMs) +
                                ") · failed: RuntimeError: CUDA out of memory");
}

TEST(Summary, ZeroStepsPointsAtTheManualApi) {
  RunBuilder b;
  b.Name("no-steps").Cpu();
  const std::string text = FormatSummary(Analyze(b.Build(), RuleContext{}), "gpuprof.db");
  EXPECT_EQ(Lines(text)[1], "gpuprof · no-steps  (no steps recorded)");
  EXPECT_THAT(text, HasSubstr("No steps were recorded"));
  EXPECT_THAT(text, HasSubstr("optimizer.step()"));
  EXPECT_THAT(text, HasSubstr("prof.step()"));
  EXPECT_THAT(text, HasSubstr("Insights: none"));
}

TEST(Summary, ZeroStepsSaysTheLoopRanOnAnotherThread) {
  // GIVEN a run without steps whose hooked calls came from another thread (noted at stop)
  RunBuilder b;
  b.Name("threaded").Cpu();
  b.data().diagnostics.push_back(
      store::DiagnosticRow{5, "warning", "threads", "44 model calls ran on other threads"});
  b.data().diagnostics.push_back(store::DiagnosticRow{6, "info", "steps", "unrelated"});
  const Report report = Analyze(b.Build(), RuleContext{});
  // THEN the summary and the full report say so under "no steps", and nothing else is added
  const std::string text = FormatSummary(report, "gpuprof.db");
  EXPECT_THAT(text, HasSubstr("No steps were recorded"));
  EXPECT_THAT(text, HasSubstr("\n  44 model calls ran on other threads\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("unrelated")));
  EXPECT_THAT(FormatFullReport(report), HasSubstr("\n  44 model calls ran on other threads\n"));
}

TEST(Summary, QuotesADbPathWithSpaces) {
  const Report report = Analyze(HealthyRun().Build(), RuleContext{});
  EXPECT_THAT(FormatSummary(report, "my runs/g.db"),
              HasSubstr("Full report: gpuprof insights 'my runs/g.db' 1"));
}

TEST(FullReport, ListsHeaderStepsTelemetryInsightsAndSkippedRules) {
  RunBuilder b;
  b.Name("full").Gpu("NVIDIA H100 80GB HBM3", 8);
  b.run().run_id = 7;
  b.run().python_version = "3.11.9";
  b.run().torch_version = "2.3.0";
  StepShape s;  // wait 5, forward 30, backward 50, optimizer 10 of 100 ms
  s.wait_ns = 40 * kMs;
  s.phases = {{"forward", 20 * kMs, 15 * kMs},
              {"backward", 30 * kMs, 25 * kMs},
              {"optimizer", 5 * kMs, std::nullopt}};
  b.Steps(20, s);
  b.Telemetry("gpu", true, "nvml", std::nullopt);
  b.Telemetry("host", false, std::nullopt, "/proc not readable");
  store::GpuSampleRow g;
  g.util_pct = 42;
  g.mem_used_bytes = 40LL << 30;
  g.mem_total_bytes = 80LL << 30;
  b.GpuSample(g);
  const Report report = Analyze(b.Build(), RuleContext{});
  const std::string text = FormatFullReport(report);
  EXPECT_THAT(text, HasSubstr("gpuprof · full · run 7  (20 steps, avg " +
                              FormatDuration(100.0 * kMs) + ")\n"));
  EXPECT_THAT(text, HasSubstr("  status     ok\n"));
  EXPECT_THAT(text, HasSubstr("  started    2024-05-01 12:00:00 UTC\n"));
  EXPECT_THAT(text, HasSubstr("  duration   " + FormatDuration(20 * 100.0 * kMs) + "\n"));
  EXPECT_THAT(text, HasSubstr("  device     cuda · NVIDIA H100 80GB HBM3 × 8\n"));
  EXPECT_THAT(text, HasSubstr("  backend    nvml\n"));
  EXPECT_THAT(text, HasSubstr("Python 3.11.9 · torch 2.3.0"));
  EXPECT_THAT(text, HasSubstr("Steps (20)\n"));
  EXPECT_THAT(text, HasSubstr("steady state steps 3–19"));
  // Breakdown rows: share of the steady step time, then GPU times in their own section.
  EXPECT_THAT(text, ContainsRegex(Row("loader wait", FormatPercent(0.40, 1))));
  EXPECT_THAT(text, ContainsRegex(Row("forward", FormatPercent(0.20, 1))));
  EXPECT_THAT(text, ContainsRegex(Row("backward", FormatPercent(0.30, 1))));
  EXPECT_THAT(text, ContainsRegex(Row("optimizer", FormatPercent(0.05, 1))));
  EXPECT_THAT(text, ContainsRegex(Row("other", FormatPercent(0.05, 1))));
  const size_t gpu_section = text.find("GPU time per step (CUDA events");
  ASSERT_NE(gpu_section, std::string::npos);
  const std::string gpu_text = text.substr(gpu_section);
  EXPECT_THAT(gpu_text, ContainsRegex(Row("forward", FormatDuration(15.0 * kMs))));
  EXPECT_THAT(gpu_text, ContainsRegex(Row("backward", FormatDuration(25.0 * kMs))));
  EXPECT_THAT(gpu_text, ContainsRegex(Row("optimizer", "—") + " +\\(not measured\\)"));
  EXPECT_THAT(text, HasSubstr("MFU          MFU unknown: flops_per_step not declared"));
  EXPECT_THAT(text, HasSubstr("  gpu          available (nvml) · 1 sample · mean util 42%"));
  EXPECT_THAT(text, HasSubstr("peak memory 40.0 GiB of 80.0 GiB"));
  EXPECT_THAT(text, HasSubstr("  host         unavailable: /proc not readable\n"));
  // Every insight with its fix; every skipped rule with its reason.
  for (const Insight& in : report.insights) {
    EXPECT_THAT(text, HasSubstr(in.message));
    EXPECT_THAT(text, HasSubstr("fix: " + in.fix));
  }
  EXPECT_THAT(text, HasSubstr("[HIGH]  " + FormatPercent(0.40) + " of step time waiting"));
  EXPECT_THAT(text, HasSubstr(StrFormat("Not evaluated (%zu)", report.not_evaluated.size())));
  EXPECT_THAT(text, ContainsRegex("\n  low_mfu +MFU unknown: flops_per_step not declared"));
  // A rule that needs host telemetry names why it is missing.
  EXPECT_THAT(text, ContainsRegex("\n  host_memory_pressure +swap-in rate not sampled \\(telemetry "
                                  "unavailable: /proc not readable\\)"));
}

TEST(FullReport, ShowsTheCommPhaseDerivedFromTheBuckets) {
  // GIVEN a DDP rank whose steps (100 ms: forward 30, backward 50, optimizer 10) wait 20 ms
  // after their last gradient bucket was ready for the collectives to finish
  RunBuilder b;
  b.Rank("job", 1, 2).Steps(20, StepShape{});
  for (const auto& s : b.steps()) {
    b.CommBucket(s.step, 0, s.start_ns + 50 * kMs, s.start_ns + 60 * kMs);
    b.CommBucket(s.step, 1, s.start_ns + 60 * kMs, s.start_ns + 80 * kMs);
  }
  const Report report = Analyze(b.Build(), RuleContext{});
  const std::string text = FormatFullReport(report);
  // THEN the breakdown has a comm row of 20% and backward lost as much
  EXPECT_THAT(text, ContainsRegex(Row("backward", FormatPercent(0.30, 1))));
  EXPECT_THAT(
      text, ContainsRegex(Row("comm", FormatPercent(0.20, 1)) + " +" + FormatDuration(20.0 * kMs) +
                          "/step \\(collectives after the "
                          "last gradient bucket was ready, from comm_buckets; taken out "
                          "of backward\\)"));
  EXPECT_THAT(text, ContainsRegex(Row("other", FormatPercent(0.05, 1))));
  // AND the JSON phase says it was derived
  const nlohmann::json j = ReportJson(report);
  const nlohmann::json& phases = j["steps"]["breakdown"]["phases"];
  ASSERT_EQ(phases.size(), 4u);
  EXPECT_EQ(phases[3]["name"], "comm");
  EXPECT_EQ(phases[3]["derived"], true);
  EXPECT_EQ(phases[3]["calls"], 2 * (20 - kWarmupSteps));
  EXPECT_EQ(phases[1]["derived"], false);
}

TEST(FullReport, NoStepsAndRunningRun) {
  RunBuilder b;
  b.run().status = "running";
  b.run().end_ns.reset();
  const std::string text = FormatFullReport(Analyze(b.Build(), RuleContext{}));
  EXPECT_THAT(text, HasSubstr("status     running (no end recorded"));
  EXPECT_THAT(text, HasSubstr("duration   —"));
  EXPECT_THAT(text, HasSubstr("Steps: none recorded"));
  size_t per_run = 0;
  for (const RuleSpec& r : Rules()) per_run += r.group() ? 0 : 1;
  EXPECT_THAT(text, HasSubstr(StrFormat("Not evaluated (%zu)", per_run)));
}

TEST(ReportJson, StableShapeWithNullsForUnknowns) {
  ExampleRun ex;
  ex.builder.run().flops_per_step.reset();  // MFU unknown -> nulls and a reason
  const Report report = Analyze(ex.builder.Build(), RuleContext{});
  const nlohmann::json j = ReportJson(report);
  for (const char* key :
       {"format", "run", "steps", "mfu", "telemetry", "gpu", "host", "insights", "not_evaluated"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["run"]["run_name"], "my-experiment");
  EXPECT_EQ(j["run"]["gpu_count"], 1);
  EXPECT_TRUE(j["run"]["flops_per_step"].is_null());
  EXPECT_TRUE(j["run"]["error"].is_null());
  EXPECT_EQ(j["steps"]["count"], 200);
  EXPECT_DOUBLE_EQ(j["steps"]["all"]["mean_ns"].get<double>(), ExampleRun::kStepNs);
  EXPECT_EQ(j["steps"]["steady_first_step"], 3);
  EXPECT_EQ(j["steps"]["breakdown"]["wait_source"], "gap");
  EXPECT_EQ(j["steps"]["breakdown"]["phases"].size(), 3u);
  EXPECT_TRUE(j["mfu"]["value"].is_null());
  EXPECT_THAT(j["mfu"]["reason"].get<std::string>(), HasSubstr("flops_per_step"));
  EXPECT_TRUE(j["gpu"]["mean_util_pct"].is_null());
  EXPECT_EQ(j["gpu"]["samples"], 0);
  ASSERT_EQ(j["insights"].size(), report.insights.size());
  EXPECT_EQ(j["insights"][0]["rule_id"], "dataloader_stall");
  EXPECT_EQ(j["insights"][0]["severity"], "high");
  EXPECT_EQ(j["insights"][0]["message"], report.insights[0].message);
  EXPECT_TRUE(j["insights"][0]["evidence"].is_object());
  ASSERT_EQ(j["not_evaluated"].size(), report.not_evaluated.size());
  bool mfu_listed = false;
  for (const auto& n : j["not_evaluated"]) mfu_listed = mfu_listed || n["rule_id"] == "low_mfu";
  EXPECT_TRUE(mfu_listed);
  // Round-trips through text.
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);
}

TEST(InsightRows, OrdinalsSeverityAndEvidence) {
  ExampleRun ex;
  const Report report = Analyze(ex.builder.Build(), RuleContext{});
  const auto rows = ToInsightRows(report);
  ASSERT_EQ(rows.size(), report.insights.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].ordinal, static_cast<int64_t>(i));
    EXPECT_EQ(rows[i].rule_id, report.insights[i].rule_id);
    EXPECT_EQ(rows[i].severity, SeverityName(report.insights[i].severity));
    EXPECT_EQ(nlohmann::json::parse(*rows[i].evidence_json), report.insights[i].evidence);
  }
}

TEST(Format, StepSetsNameFewStepsAndSayWhenTheyAreEvenlySpaced) {
  EXPECT_EQ(FormatStepSet({}), "no steps");
  EXPECT_EQ(FormatStepSet({25}), "step 25");
  EXPECT_EQ(FormatStepSet({25, 50}), "steps 25 and 50");
  EXPECT_EQ(FormatStepSet({25, 50, 80}), "steps 25, 50 and 80");
  EXPECT_EQ(FormatStepSet({24, 49, 74, 99, 124}), "5 steps, every 25th (24, 49, …, 124)");
  EXPECT_EQ(FormatStepSet({3, 4, 5, 6}), "4 steps, every step (3, 4, …, 6)");
  EXPECT_EQ(FormatStepSet({25, 31, 90, 91}), "4 steps (25, 31, 90, …)");
  EXPECT_EQ(Ordinal(1), "1st");
  EXPECT_EQ(Ordinal(2), "2nd");
  EXPECT_EQ(Ordinal(3), "3rd");
  EXPECT_EQ(Ordinal(11), "11th");
  EXPECT_EQ(Ordinal(12), "12th");
  EXPECT_EQ(Ordinal(22), "22nd");
  EXPECT_EQ(Ordinal(113), "113th");
  EXPECT_EQ(Ordinal(101), "101st");
}

TEST(Format, Helpers) {
  EXPECT_EQ(FormatDuration(850), "850 ns");
  EXPECT_EQ(FormatDuration(12'340), "12.3 µs");
  EXPECT_EQ(FormatDuration(121.3e6), "121.3 ms");
  EXPECT_EQ(FormatDuration(2.414e9), "2.41 s");
  EXPECT_EQ(FormatDuration(210e9), "3.5 min");
  EXPECT_EQ(FormatMinutes(41e9), "41 s");
  EXPECT_EQ(FormatMinutes(231 * 60e9), "231 min");
  // Text from a damaged DB prints as valid UTF-8.
  EXPECT_EQ(ValidUtf8("A\xff"
                      "B"),
            "A\xEF\xBF\xBD"
            "B");
  EXPECT_EQ(ValidUtf8("caf\xC3\xA9 · ok"), "caf\xC3\xA9 · ok");
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong '/'
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(ValidUtf8("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // cut short
  // A short run never reads "0 s".
  EXPECT_EQ(FormatMinutes(366e6), "366.0 ms");
  EXPECT_EQ(FormatMinutes(4.24e9), "4.2 s");
  EXPECT_EQ(FormatMinutes(0.4e6), "400.0 µs");
  EXPECT_EQ(FormatMinutes(0), "0 s");
  // Two close values compared in one sentence never read the same.
  EXPECT_EQ(FormatDurations(1.2e6, 1.2049e6),
            std::make_pair(std::string("1.200 ms"), std::string("1.205 ms")));
  EXPECT_EQ(FormatDurations(121.3e6, 80e6),
            std::make_pair(std::string("121.3 ms"), std::string("80.0 ms")));
  EXPECT_TRUE(DurationsDiffer(1.2e6, 1.2049e6));
  EXPECT_FALSE(DurationsDiffer(1.2e6, 1.2e6 + 1));  // 1 ns apart: equal to a reader
  EXPECT_EQ(FormatPercent(0.3412), "34%");
  EXPECT_EQ(FormatPercent(0.124, 1), "12.4%");
  EXPECT_EQ(FormatCompact(989), "989");
  EXPECT_EQ(FormatCompact(417.5), "417.5");
  EXPECT_EQ(FormatUsd(0.004), "<$0.01");
  EXPECT_EQ(FormatUsd(47.2), "$47.20");
  EXPECT_EQ(FormatBytes(80.0 * (1LL << 30)), "80.0 GiB");
  EXPECT_EQ(FormatRatio(2.66), "2.7×");
  EXPECT_EQ(SeverityName(Severity::kMed), "med");
  EXPECT_EQ(ParseSeverity("high"), Severity::kHigh);
  EXPECT_EQ(ParseSeverity("urgent"), std::nullopt);
}

}  // namespace
}  // namespace gpuprof::analysis
