// Entry points of the insights engine (owned by analysis/; see docs/architecture.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "store/sqlite_store.h"
#include "util/status.h"

namespace gpuprof::analysis {

struct AnalysisOptions {
  // USD per GPU-hour; nullopt = $GPUPROF_GPU_RATE if set, else the reference table.
  std::optional<double> gpu_rate_usd_per_hour;
};

// Analyzes a stored run: builds the RunView, runs every rule, compares with previous runs.
// Returns the insights (ordered by severity) and writes nothing.
struct Report;  // defined by the analysis implementation
Expected<std::string> SummaryText(store::SqliteStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options);
// Runs the analysis and stores the insights of the run (insights table), then returns the
// summary block printed at the end of `with gpuprof.profile(...)`.
Expected<std::string> FinalizeRun(store::SqliteStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options);

}  // namespace gpuprof::analysis
