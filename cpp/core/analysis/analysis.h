// Entry points of the insights engine against a store (see docs/rules.md).
//
//   AnalyzeRun   load a stored run and analyze it (writes nothing)
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

#include "analysis/insight.h"
#include "analysis/report.h"
#include "store/sqlite_store.h"
#include "util/status.h"

namespace gpuprof::analysis {

// Loads run `run_id` and analyzes it with the rate override resolved from `options` and
// $GPUPROF_GPU_RATE. Errors: unknown run id, store read failures.
Expected<Report> AnalyzeRun(store::SqliteStore& store, int64_t run_id,
                            const AnalysisOptions& options);

// The summary block for a stored run (what FinalizeRun returns), without writing anything.
// `db_path` is quoted in the "Full report:" hint as given.
Expected<std::string> SummaryText(store::SqliteStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options);

// Runs the analysis, replaces the run's rows in the insights table, then returns the summary
// block printed at the end of `with gpuprof.profile(...)`.
Expected<std::string> FinalizeRun(store::SqliteStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options);

}  // namespace gpuprof::analysis
