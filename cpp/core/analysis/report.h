// Report: the result of analyzing one run, and its three renderings (summary block, full
// text report, JSON). Everything here is pure: no store, no environment except in
// MakeRuleContextFromEnv.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/flops.h"
#include "analysis/insight.h"
#include "analysis/run_view.h"
#include "store/rows.h"

namespace gpuprof::analysis {

// A rule that could not run because an input was not measured.
struct RuleSpec;  // rules/registry.h

struct NotEvaluated {
  std::string rule_id;
  std::string family;
  std::string reason;
};

// Evaluates every registry rule of one kind (per-run when `group` is false, multi-rank when
// true) with `evaluate(spec)`, appending what fired (most severe first, registry order within
// a severity) and what could not be evaluated (registry order).
// The `insights` / `not_evaluated` arrays of the --json outputs (single run and group).
nlohmann::json InsightsJson(const std::vector<Insight>& insights);
nlohmann::json NotEvaluatedJson(const std::vector<NotEvaluated>& not_evaluated);

void EvaluateRules(bool group, const std::function<RuleResult(const RuleSpec&)>& evaluate,
                   std::vector<Insight>* insights, std::vector<NotEvaluated>* not_evaluated);

struct Report {
  RunView view;
  MfuResult mfu;
  std::vector<Insight> insights;  // most severe first; ties in registry order
  std::vector<NotEvaluated> not_evaluated;  // registry order
};

// Resolves the rate override: options.gpu_rate_usd_per_hour wins; else `env_rate` (the value
// of $GPUPROF_GPU_RATE, null when unset). An unparsable env value sets gpu_rate_error.
RuleContext MakeRuleContext(const AnalysisOptions& options, const char* env_rate);
// The same, reading $GPUPROF_GPU_RATE.
RuleContext MakeRuleContextFromEnv(const AnalysisOptions& options);

// Builds the RunView and runs every per-run rule of the registry (group rules need every rank:
// AnalyzeGroup in group.h).
Report Analyze(store::RunData data, const RuleContext& context);

// Width of the summary block's horizontal rules.
inline constexpr int kSummaryRuleWidth = 60;
// The summary block shows at most this many insights, then "… N more".
inline constexpr size_t kSummaryMaxInsights = 8;
// The summary's "Not evaluated (N): ..." line names rules until it would pass this many bytes.
inline constexpr size_t kSummaryMaxLineColumns = 120;

// The block printed when `with gpuprof.profile(...)` exits. `db_path` is shown in the
// "Full report: gpuprof insights <db> <run>" hint as given. Ends with a newline.
std::string FormatSummary(const Report& report, const std::string& db_path);
// What `gpuprof insights` prints: run header, step statistics and phase breakdown,
// telemetry availability, every insight with its fix, and the rules not evaluated.
std::string FormatFullReport(const Report& report);
// What `gpuprof insights --json` prints. Stable keys; unknown values are null.
nlohmann::json ReportJson(const Report& report);

// The insights as rows for SqliteStore::ReplaceInsights (ordinal = position).
std::vector<store::InsightRow> ToInsightRows(const Report& report);

}  // namespace gpuprof::analysis
