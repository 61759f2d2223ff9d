// Report: the result of analyzing one run, and its three renderings (summary block, full
// text report, JSON). Everything here is pure: no store, no environment except in
// MakeRuleContextFromEnv.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

// A finding that fired but is folded under the finding that explains it (RuleExplains in
// rules/registry.h): same cause, so it is not reported on its own.
struct Explained {
  std::string by;  // rule_id of the reported finding that explains it
  Insight insight;
};

// The `insights` / `not_evaluated` / `explained` arrays of the --json outputs (single run and
// group). Each insight lists the rule ids it explains ("explains").
nlohmann::json InsightsJson(const std::vector<Insight>& insights,
                            const std::vector<Explained>& explained = {});
nlohmann::json NotEvaluatedJson(const std::vector<NotEvaluated>& not_evaluated);
nlohmann::json ExplainedJson(const std::vector<Explained>& explained);

// Evaluates every registry rule of one kind (per-run when `group` is false, multi-rank when
// true) with `evaluate(spec)`, appending what fired (most severe first, registry order within
// a severity) and what could not be evaluated (registry order). With `explained`, a fired
// finding that another fired finding explains (the registry's precedence) goes there instead
// of `insights`, in registry order.
void EvaluateRules(bool group, const std::function<RuleResult(const RuleSpec&)>& evaluate,
                   std::vector<Insight>* insights, std::vector<NotEvaluated>* not_evaluated,
                   std::vector<Explained>* explained = nullptr);

// Applies the registry's precedence to findings in registry order: moves each one that another
// finding explains to `explained` (by the first finding of its chain that nothing explains).
void ApplyPrecedence(std::vector<Insight>* fired, std::vector<Explained>* explained);

struct Report {
  RunView view;
  MfuResult mfu;
  std::vector<Insight> insights;            // most severe first; ties in registry order
  std::vector<NotEvaluated> not_evaluated;  // registry order
  std::vector<Explained> explained;         // registry order
  // The rate the cost line used (rules::ResolveCostRate), per GPU-hour or machine-hour; nullopt
  // when the run could not be priced. FinalizeRun stores it with the run (runs.config_json
  // keys kStoredRateKey / kStoredRateSourceKey) so that later reports price it the same way.
  std::optional<double> cost_rate_usd_per_hour;
  std::string cost_rate_source;
  // A rank of a multi-rank job: how many of the job's other ranks its store holds
  // (PeerWaits::other_ranks); nullopt when not known. The summary says when some are missing.
  std::optional<size_t> other_ranks_in_store;
};

inline constexpr const char* kStoredRateKey = "gpu_rate_usd_per_hour";
inline constexpr const char* kStoredRateSourceKey = "gpu_rate_source";
// Sets `context`'s rate from the one stored with `run` (kStoredRateKey in its config_json) unless
// `options` gives one: what the run's summary used is what later reports use. A stored rate
// also overrides an unusable $GPUPROF_GPU_RATE.
void ApplyStoredRate(const store::RunInfo& run, const AnalysisOptions& options,
                     RuleContext* context);

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
// Rows of the full report's top-kernels (or top CPU operators) section.
inline constexpr size_t kReportTopKernels = 10;
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
