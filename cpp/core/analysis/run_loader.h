// Light reads for analyses that span several runs of one store (the regression baseline, the
// ranks of a multi-rank group): only the rows those analyses use, so that comparing against
// long runs does not load their telemetry. Cold path; errors name the file and what was being
// read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/insight.h"
#include "store/sqlite_store.h"
#include "util/status.h"

namespace gpuprof::analysis {

// The earlier finished runs with `run`'s run_name (SqliteStore::PreviousRunsNamed), newest
// first, at most thresholds::kRegressionLookback, each with its throughput (MeasureThroughput).
// Stops once thresholds::kRegressionRuns runs long enough to compare (kRegressionMinSteps
// steady-state steps) are listed.
Expected<std::vector<PriorRun>> LoadPriorRuns(store::RunStore& store, const store::RunInfo& run);

// Every run whose group_id is `group_id` (any status), with its steps, comm_buckets and stored
// insights; the other RunData members stay empty. An empty vector when there is none.
Expected<std::vector<store::RunData>> LoadGroupRuns(store::RunStore& store,
                                                    const std::string& group_id);
// For a rank of a multi-rank job (world_size > 1): its waits for the job's other ranks in the
// collectives (MeasurePeerWaits), from their comm_buckets in the same store; nullopt for a run
// that is not distributed. Never an error: what kept the ranks from being compared (no group
// id, no other rank in the store, more than thresholds::kPeerWaitMaxRows bucket rows, a read
// that failed) is the reason of a PeerWaits without peers.
std::optional<PeerWaits> LoadPeerWaits(store::RunStore& store, const store::RunData& self);

// The distinct group ids in the store, sorted.
Expected<std::vector<std::string>> ListGroupIds(store::RunStore& store);

}  // namespace gpuprof::analysis
