// Entry points of the insights engine against a store (see docs/rules.md).
//
//   AnalyzeRun   load a stored run and analyze it (writes nothing); the regression rule
//                compares it with the earlier runs of the same run_name in the same store
//   AnalyzeStoredGroup  load every run of a multi-rank group and run the group rules
//   SummaryText  AnalyzeRun + the summary block
//   FinalizeRun  AnalyzeRun + store.ReplaceInsights + the summary block; called once when
//                `with gpuprof.profile(...)` exits, after FinishRun.
//
// The pure pieces (RunView, rules, Report rendering) live in run_view.h, rules/registry.h and
// report.h; they need no store and are what tests use on in-memory runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/group.h"
#include "analysis/insight.h"
#include "analysis/report.h"
#include "store/sqlite_store.h"
#include "util/status.h"

namespace gpuprof::analysis {

// Loads run `run_id` and analyzes it with the rate override resolved from `options` and
// $GPUPROF_GPU_RATE, and with the earlier runs of the same name (their steps only) as the
// regression baseline. Errors: unknown run id, store read failures.
Expected<Report> AnalyzeRun(store::RunStore& store, int64_t run_id, const AnalysisOptions& options);

// Loads every run with runs.group_id == group_id (run rows, steps, comm_buckets) and runs the
// group rules. Errors: no run has that group id (the message lists the groups that exist),
// store read failures.
Expected<GroupReport> AnalyzeStoredGroup(store::RunStore& store, const std::string& group_id,
                                         const AnalysisOptions& options);

// What `gpuprof insights --group NAME` analyzes: NAME as a group id when some run has that
// runs.group_id; else, when runs named NAME (runs.run_name) have a group_id, the group of the
// newest of them (largest run_id), with the number of distinct groups those runs belong to.
// Errors: neither (the message lists the groups that exist and says run names are accepted),
// store read failures.
struct GroupName {
  std::string group_id;
  // Set when NAME was read as a run name: how many groups the runs of that name belong to.
  std::optional<size_t> groups_of_run_name;
};
Expected<GroupName> ResolveGroupName(store::RunStore& store, const std::string& name);

// The summary block for a stored run (what FinalizeRun returns), without writing anything.
// `db_path` is quoted in the "Full report:" hint as given.
Expected<std::string> SummaryText(store::RunStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options);

// Runs the analysis, replaces the run's rows in the insights table, stores the rate the cost
// line used with the run (StoreCostRate), then returns the summary block printed at the end of
// `with gpuprof.profile(...)`. When the store refuses those writes (locked, disk full) the
// summary is still returned, with a data-loss line, and `not_stored` (if given) gets the error.
Expected<std::string> FinalizeRun(store::RunStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options,
                                  std::optional<std::string>* not_stored = nullptr);

// Writes report.cost_rate_* into the run's config_json (kStoredRateKey, kStoredRateSourceKey;
// report.h), which AnalyzeRun reads back (ApplyStoredRate). Nothing to do without a rate, when
// it is stored already, or when config_json is not a JSON object.
Status StoreCostRate(store::RunStore& store, const Report& report);

}  // namespace gpuprof::analysis
