// JSON form of a run and of its rows: what a client pushes to `gpuprof serve` (docs/server.md)
// and what the server stores through the same SqliteStore. Values are keyed by the column
// names of store/schema.sql; std::optional<> is null (or an absent key) == not measured. A
// table comes in either of two layouts (RowLayout), decoded alike:
//
//   {"steps": [{"step": 0, "start_ns": 0, "end_ns": 5000000, ...}, ...],          objects
//    "gpu_samples": {"columns": ["ts_ns", "gpu_index", ...], "rows": [[0, 0, ...], ...]}}
//
// Decoding is strict, so that a bad batch is refused whole with a message that names the
// problem: an unknown table or column, a missing required column, a value of the wrong type
// (an integer column holding 1.5 or "1"), each named as `table[index].column`; text that is
// not JSON is JsonReader's error ("not valid JSON: ... at byte N"). It reads the text
// directly (util/json_reader.h), without a document: the team server's ingest hot path.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "store/rows.h"
#include "util/json_reader.h"
#include "util/status.h"

namespace gpuprof::store {

// The JSON key of a row's table ("steps", "gpu_samples", ...; PhaseGpuRow is
// "phase_gpu_times": GPU time added to a phase row).
const char* RowJsonTable(const Row& row);

enum class RowLayout {
  kObjects,  // [{"column": value, ...}, ...]: one object per row (readable; tests, docs)
  kColumns,  // {"columns": [...], "rows": [[value, ...], ...]}: what the client pushes (a
             // third of the bytes; every column is listed, in schema order)
};

// {"<table>": rows, ...} in the order the rows came (grouped by table).
nlohmann::json RowsToJson(const std::vector<Row>& rows, RowLayout layout = RowLayout::kObjects);
// The rows of such an object's text (tables in either layout); an error names the first
// problem. `max_rows` bounds the count.
Expected<std::vector<Row>> RowsFromJsonText(std::string_view text, size_t max_rows);
// The same from `reader` positioned at the object (the rest of the text is the caller's):
// rows are appended to *rows; *too_many is set when there were more than `max_rows` (the error
// says so). When the text is not JSON, the error is the reader's and reader.ok() is false.
Status ReadRows(JsonReader& reader, size_t max_rows, std::vector<Row>* rows, bool* too_many);

// Insights are not writer rows (ReplaceInsights stores the whole list): "insights": [...].
nlohmann::json InsightsToJson(const std::vector<InsightRow>& insights);
Expected<std::vector<InsightRow>> InsightsFromJsonText(std::string_view text);

// The run's fields (run_id is the receiver's: not encoded, ignored when decoding).
nlohmann::json RunInfoToJson(const RunInfo& info);
Expected<RunInfo> RunInfoFromJson(const nlohmann::json& doc);

}  // namespace gpuprof::store
