// Multi-rank analysis: the runs of one distributed job (runs.group_id), side by side.
//
// Each rank is a RunView built from that rank's run row, steps and comm_buckets (the group
// loader reads nothing else). Group rules (registry entries with evaluate_group) compare the
// ranks: rank_skew (step times), bucket_skew (per-bucket collective start times, aligned across
// hosts by each run's start_unix_ns). Pure functions; the store entry point is
// AnalyzeStoredGroup in analysis.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/insight.h"
#include "analysis/report.h"
#include "analysis/run_view.h"
#include "store/sqlite_store.h"

namespace gpuprof::analysis {

struct GroupView {
  std::string group_id;
  // One view per rank, ordered by rank (runs without a rank last, by run_id). When a rank was
  // recorded more than once (a restarted job), the newest run (largest run_id) is used.
  std::vector<RunView> ranks;
  // Older runs of a rank that appears more than once; left out of the analysis.
  std::vector<store::RunInfo> superseded;
};

// Builds the group from its runs (any order).
GroupView BuildGroupView(std::string group_id, std::vector<store::RunData> runs);

// Per-rank figures for the report.
struct RankStats {
  std::optional<double> wait_fraction;  // steady-state loader wait share
  std::optional<double> comm_fraction;  // steady-state share with a collective in flight
};
RankStats ComputeRankStats(const RunView& rank);

struct GroupReport {
  GroupView view;
  std::vector<Insight> insights;            // most severe first; ties in registry order
  std::vector<NotEvaluated> not_evaluated;  // registry order
};

// Runs every group rule of the registry.
GroupReport AnalyzeGroup(std::string group_id, std::vector<store::RunData> runs,
                         const RuleContext& context);

// What `gpuprof insights --group NAME` prints: one line per rank (step statistics, loader wait,
// collective share), the group insights with their fixes, and the rules not evaluated.
// `db_path` is quoted in the per-rank report hint.
std::string FormatGroupReport(const GroupReport& report, const std::string& db_path);
// What `gpuprof insights --group NAME --json` prints. Stable keys; unknown values are null.
nlohmann::json GroupReportJson(const GroupReport& report);

}  // namespace gpuprof::analysis
