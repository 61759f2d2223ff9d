// JSON form of a run and of its rows: what a client pushes to `gpuprof serve` (docs/server.md)
// and what the server stores through the same SqliteStore. One object per row, keyed by the
// column names of store/schema.sql; std::optional<> is null (or an absent key) == not measured.
//
//   {"steps": [{"step": 0, "start_ns": 0, "end_ns": 5000000, ...}], "gpu_samples": [...], ...}
//
// Decoding is strict, so that a bad batch is refused whole with a message that names the
// problem: an unknown table or column, a missing required column, a value of the wrong type
// (an integer column holding 1.5 or "1"), each named as `table[index].column`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "store/rows.h"
#include "util/status.h"

namespace gpuprof::store {

// The JSON key of a row's table ("steps", "gpu_samples", ...; PhaseGpuRow is
// "phase_gpu_times": GPU time added to a phase row).
const char* RowJsonTable(const Row& row);

// {"<table>": [row, ...], ...} in the order the rows came (grouped by table).
nlohmann::json RowsToJson(const std::vector<Row>& rows);
// The rows of such an object; an error names the first problem. `max_rows` bounds the count.
Expected<std::vector<Row>> RowsFromJson(const nlohmann::json& doc, size_t max_rows);

// Insights are not writer rows (ReplaceInsights stores the whole list): "insights": [...].
nlohmann::json InsightsToJson(const std::vector<InsightRow>& insights);
Expected<std::vector<InsightRow>> InsightsFromJson(const nlohmann::json& list);

// The run's fields (run_id is the receiver's: not encoded, ignored when decoding).
nlohmann::json RunInfoToJson(const RunInfo& info);
Expected<RunInfo> RunInfoFromJson(const nlohmann::json& doc);

}  // namespace gpuprof::store
