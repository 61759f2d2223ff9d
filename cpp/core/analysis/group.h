// Multi-rank analysis: the runs of one distributed job (runs.group_id), side by side.
//
// Each rank is a RunView built from that rank's run row, steps and comm_buckets (the group
// loader reads nothing else). Group rules (registry entries with evaluate_group) compare the
// ranks: rank_skew (per-rank work time between the collectives, else step times), bucket_skew
// (per-bucket collective start times). Times of different ranks are put on one clock with each
// run's start_unix_ns minus the rank's measured clock offset (RankClock) where one was recorded.
// Pure functions; the store entry point is AnalyzeStoredGroup in analysis.h.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "analysis/insight.h"
#include "analysis/report.h"
#include "analysis/run_view.h"
#include "store/sqlite_store.h"

namespace gpuprof::analysis {

// How a rank's run clock relates to the reference rank's (rank 0's), as measured at the start
// of a distributed run and stored in runs.config_json under "distributed":
//   clock_offset_ns       this rank's run clock minus the reference rank's at the same instant
//   clock_uncertainty_ns  how far off that estimate may be
//   clock_reference_rank, clock_rounds, clock_method   how it was measured
//   clock_unaligned_reason  why no offset was measured (when "clock_offset_ns" is absent)
// Any key may be missing; a config_json that is null, not JSON or not an object reads as none.
struct RankClock {
  std::optional<int64_t> offset_ns;
  std::optional<int64_t> uncertainty_ns;
  std::optional<int64_t> reference_rank;
  std::optional<int64_t> rounds;
  std::string method;  // empty when not recorded
  // Set exactly when offset_ns is nullopt: "not aligned: <the recorded reason>", or
  // "not aligned: no clock alignment recorded".
  std::string unaligned_reason;
  bool aligned() const { return offset_ns.has_value(); }
};
RankClock ReadRankClock(const store::RunInfo& run);

struct GroupView {
  std::string group_id;
  // One view per rank, ordered by rank (runs without a rank last, by run_id). When a rank was
  // recorded more than once (a restarted job), the newest run (largest run_id) is used.
  std::vector<RunView> ranks;
  // clocks[i] is ranks[i]'s clock (ReadRankClock). The reference rank that other ranks were
  // aligned to reads offset 0 (uncertainty 0) when it recorded no offset and no reason itself.
  std::vector<RankClock> clocks;
  // Older runs of a rank that appears more than once; left out of the analysis.
  std::vector<store::RunInfo> superseded;

  // A time `rel_ns` of ranks[i]'s run clock (run-relative ns, like steps.start_ns) on the common
  // clock: start_unix_ns + rel_ns - clock offset (the wall clock as it is when not aligned).
  int64_t AlignedNs(size_t i, int64_t rel_ns) const;
  // How many ranks have a clock offset.
  size_t AlignedRanks() const;
  // One line on how the ranks' times are compared: "clocks aligned to rank 0 (±56.0 µs, ...)",
  // "clocks not aligned: wall clocks compared as they are ...", or the mix of both.
  std::string AlignmentBasis() const;
};

// Builds the group from its runs (any order).
GroupView BuildGroupView(std::string group_id, std::vector<store::RunData> runs);

// How long `self` (a rank of a multi-rank job) waited for the job's other ranks in its
// collectives, per step (PeerWaits). `runs` are runs of the job with their comm_buckets (any
// order; `self` and runs of its own rank among them are ignored): per other rank, the newest
// run whose time span overlaps self's is compared, on the common clock (GroupView::AlignedNs).
PeerWaits MeasurePeerWaits(const store::RunData& self, std::vector<store::RunData> runs);
// The same for every rank of a group view against all its other ranks (element i: ranks[i]);
// one pass over the bucket rows.
std::vector<PeerWaits> PeerWaitsOfEveryRank(const GroupView& group);

// Per-rank figures for the report.
struct RankStats {
  std::optional<double> wait_fraction;  // steady-state loader wait share
  std::optional<double> comm_fraction;  // steady-state share with a collective in flight
  // Steady-state share spent waiting for the other ranks in the collectives (peer_wait's
  // measure); nullopt without `peers` or a step another rank timed too.
  std::optional<double> peer_wait_fraction;
};
RankStats ComputeRankStats(const RunView& rank, const PeerWaits* peers = nullptr);

struct GroupReport {
  GroupView view;
  std::vector<Insight> insights;            // most severe first; ties in registry order
  std::vector<NotEvaluated> not_evaluated;  // registry order
  // Findings folded under the finding of the same cause (the registry's precedence: rank_skew
  // and bucket_skew of one rank are reported once).
  std::vector<Explained> explained;  // registry order
};

// Runs every group rule of the registry.
GroupReport AnalyzeGroup(std::string group_id, std::vector<store::RunData> runs,
                         const RuleContext& context);

// What `gpuprof insights --group NAME` prints: one line per rank (step statistics, loader wait,
// collective share, clock offset), how the clocks were aligned, the group insights with their
// fixes (and the findings each one explains), and the rules not evaluated.
// `db_path` is quoted in the per-rank report hint.
std::string FormatGroupReport(const GroupReport& report, const std::string& db_path);
// What `gpuprof insights --group NAME --json` prints. Stable keys; unknown values are null.
nlohmann::json GroupReportJson(const GroupReport& report);

}  // namespace gpuprof::analysis
