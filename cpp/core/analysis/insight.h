// The vocabulary of the insights engine: severities, insights, the result of evaluating one
// rule, and the context (user options) rules may read. Rules never read the environment or
// the store themselves; everything they depend on is in RunView or RuleContext.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "store/rows.h"

namespace gpuprof::analysis {

// Ordered: a larger value is more severe.
enum class Severity { kInfo = 0, kLow = 1, kMed = 2, kHigh = 3 };

// Stored spelling (insights.severity column, JSON): high | med | low | info.
std::string_view SeverityName(Severity severity);
// Display tag without brackets: HIGH | MED | LOW | INFO.
std::string_view SeverityTag(Severity severity);
std::optional<Severity> ParseSeverity(std::string_view name);

// One diagnosis of one run.
struct Insight {
  std::string rule_id;
  std::string family;
  Severity severity = Severity::kInfo;
  std::string message;                                 // one sentence quoting the run's own numbers
  std::string fix;                                     // what to do about it
  nlohmann::json evidence = nlohmann::json::object();  // the numbers behind the message
};

// Outcome of evaluating one rule on one run; exactly one of three states:
//   fired          -> insight is set
//   not fired      -> neither is set (the inputs were measured and the run is fine)
//   not evaluated  -> not_evaluated holds the reason (an input was not measured)
// A fired result carries severity, message and evidence; the registry fills in rule_id,
// family and (unless the rule tailored it) the fix text.
struct RuleResult {
  std::optional<Insight> insight;
  std::optional<std::string> not_evaluated;

  static RuleResult Pass() { return {}; }
  static RuleResult Skip(std::string reason) {
    RuleResult r;
    r.not_evaluated = std::move(reason);
    return r;
  }
  static RuleResult Fire(Severity severity, std::string message,
                         nlohmann::json evidence = nlohmann::json::object()) {
    RuleResult r;
    r.insight = Insight{};
    r.insight->severity = severity;
    r.insight->message = std::move(message);
    r.insight->evidence = std::move(evidence);
    return r;
  }
  bool fired() const { return insight.has_value(); }
  bool skipped() const { return not_evaluated.has_value(); }
};

// What the caller of the analysis may set.
struct AnalysisOptions {
  // USD per GPU-hour; nullopt = $GPUPROF_GPU_RATE if set, else the reference table.
  std::optional<double> gpu_rate_usd_per_hour;
  // Diagnostics of the run that could not be written to the store (it was locked or full when
  // the run ended): the analysis reads them as if stored, so the summary still says so.
  std::vector<store::DiagnosticRow> unstored_diagnostics;
};

// What the regression rule needs of one earlier run of the same run_name: its throughput
// (analysis::Throughput, run_view.h). Loaded by AnalyzeRun (analysis.h) from the store; only the
// steps are read.
struct PriorRun {
  int64_t run_id = 0;
  std::string status;  // ok | failed
  size_t steps = 0;    // every step
  size_t steady_steps = 0;
  std::optional<double> steady_mean_ns;  // wall time per steady step; nullopt: no steady state
  std::optional<double> spread;          // Throughput::spread
};

// How long one rank of a multi-rank job waited for the other ranks in its collectives, from the
// bucket timings (comm_buckets) that the job's other ranks stored in the same store. Measured by
// MeasurePeerWaits (group.h); AnalyzeRun loads it for a run with a group_id and world_size > 1.
struct PeerWaits {
  std::string group_id;
  // The other ranks compared ("rank 1", ...), in rank order; empty when none could be.
  std::vector<std::string> peers;
  // Set exactly when `peers` is empty: why no other rank was compared.
  std::string reason;
  struct Step {
    // The longest, over the step's buckets that a peer timed too, of how much later than this
    // rank the last rank started the bucket on the common clock (0 when this rank was last).
    int64_t wait_ns = 0;
    int last_peer = -1;  // index into peers of the rank that started that bucket last; -1: none
  };
  std::unordered_map<int64_t, Step> steps;  // by step number; steps no peer timed are absent
  // Per peer label, its own leading finding as its report stored it (LeadingFinding); absent
  // when it stored none (yet).
  std::map<std::string, store::InsightRow> peer_leads;
  // How many other ranks of the job (any attempt) the store holds; nullopt when it could not
  // be told (no group id, a failed read). The summary says when the file lacks some.
  std::optional<size_t> other_ranks;
};

// Inputs to rules that do not come from the run itself. Built once per analysis by
// MakeRuleContext (report.h); rules treat it as read-only.
struct RuleContext {
  // Price override per GPU-hour (per machine-hour on a CPU run); nullopt = use the reference
  // table for the run's GPU model.
  std::optional<double> gpu_rate_usd_per_hour;
  // Where the override came from, for the report ("GPUPROF_GPU_RATE", "option").
  std::string gpu_rate_source;
  // Set when $GPUPROF_GPU_RATE was present but unusable; the cost rule reports it.
  std::optional<std::string> gpu_rate_error;
  // Earlier finished runs with the same run_name in the same store, newest first (at most
  // thresholds::kRegressionLookback). nullopt when nobody looked (an analysis without a store):
  // the regression rule is then "not evaluated"; an empty list means there are none.
  std::optional<std::vector<PriorRun>> previous_runs;
  // This rank's waits for the other ranks of its job. nullopt when nobody looked (an analysis
  // without a store, or a run that is not a rank of a multi-rank job): peer_wait is then not
  // evaluated on a distributed rank.
  std::optional<PeerWaits> peer_waits;
};

}  // namespace gpuprof::analysis
