#include "store/row_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuprof::store {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// One row of every table, with every optional set on some and left out on others.
std::vector<Row> EveryKindOfRow() {
  std::vector<Row> rows;
  rows.emplace_back(StepRow{3, 100, 900, 40, "dataloader", 1, 1, 1});
  rows.emplace_back(StepRow{4, 900, 1700, std::nullopt, std::nullopt, 0, 0, 0});
  rows.emplace_back(PhaseRow{3, "forward", 300, 250, 2});
  rows.emplace_back(PhaseGpuRow{3, "backward", 77});
  rows.emplace_back(GpuInfoRow{0, "NVIDIA H200", "GPU-1", 141LL << 30, 1980});
  GpuSampleRow g;
  g.ts_ns = 5;
  g.gpu_index = 1;
  g.util_pct = 97.5;
  g.power_mw = 650000;
  g.clock_reasons = 0x40;
  rows.emplace_back(g);
  HostSampleRow h;
  h.ts_ns = 7;
  h.cpu_pct = 12.5;
  h.cpu_per_core = {10.0, 15.0};
  h.ncores = 2;
  rows.emplace_back(h);
  rows.emplace_back(WorkerSampleRow{8, 4242, "child", 99.0, std::nullopt});
  rows.emplace_back(KernelRow{0, 1000, "sm90_gemm", 12, 800, "cupti"});
  rows.emplace_back(CommBucketRow{3, 0, 10, 20, 1 << 20});
  rows.emplace_back(TelemetryStatusRow{"gpu", false, std::nullopt, "no NVML"});
  rows.emplace_back(DiagnosticRow{std::nullopt, "warning", "store", "3 rows lost"});
  GpuRollupRow r;
  r.ts_ns = 1'000'000'000;
  r.samples = 10;
  r.util_mean_pct = 80;
  r.throttled_samples = 2;
  rows.emplace_back(r);
  rows.emplace_back(WorkerRollupRow{0, 4242, "child", 5, 5, 50.0, 90.0, 1 << 20});
  rows.emplace_back(StallRow{10, 20});
  rows.emplace_back(CpuWaitRow{0, 20'000'000, 3'000'000});
  return rows;
}

TEST(RowJsonTest, EveryTableRoundTripsExactly) {
  const std::vector<Row> rows = EveryKindOfRow();
  const json doc = RowsToJson(rows);
  // The JSON names the tables and columns as the schema does; unknown stays null
  EXPECT_EQ(doc["steps"][1]["wait_ns"], nullptr);
  EXPECT_EQ(doc["phase_gpu_times"][0]["gpu_ns"], 77);
  EXPECT_EQ(doc["host_samples"][0]["cpu_per_core"], json({10.0, 15.0}));
  // AND decoding its text gives the same rows back
  auto back = RowsFromJsonText(doc.dump(), 1000);
  ASSERT_TRUE(back.ok()) << back.error();
  ASSERT_EQ(back->size(), rows.size());
  EXPECT_EQ(RowsToJson(*back), doc);
  for (const Row& row : *back) EXPECT_STRNE(RowJsonTable(row), "");
}

TEST(RowJsonTest, ABadBatchIsRefusedNamingTheProblem) {
  auto error = [](const std::string& text, size_t max_rows = 100) {
    auto r = RowsFromJsonText(text, max_rows);
    return r.ok() ? std::string("(accepted)") : r.error();
  };
  EXPECT_THAT(error(R"({"stepz": []})"), HasSubstr("unknown table 'stepz' (tables: steps,"));
  EXPECT_EQ(error(R"({"steps": "x"})"),
            "rows.steps: expected an array of rows or {\"columns\": ..., \"rows\": ...}, got "
            "string");
  EXPECT_EQ(error(R"({"host_stalls": [{"start_ns": 1, "duration_ns": 2, "start_ns": 3}]})"),
            "host_stalls[0].start_ns: given twice");
  EXPECT_EQ(error(R"({"steps": [{"step": 1, "start_ns": 0}]})"),
            "steps[0].end_ns: missing (required)");
  EXPECT_EQ(error(R"({"steps": [{"step": 1.5, "start_ns": 0, "end_ns": 1, "forward_calls": 0,
                     "backward_calls": 0, "optimizer_calls": 0}]})"),
            "steps[0].step: expected an integer, got number");
  EXPECT_EQ(error(R"({"phases": [{"step": 1, "name": 7, "wall_ns": 1, "calls": 1}]})"),
            "phases[0].name: expected a string, got number");
  EXPECT_EQ(error(R"({"host_stalls": [{"start_ns": 1, "duration_ns": 2, "x": 3}]})"),
            "host_stalls[0]: unknown column 'x'");
  EXPECT_EQ(error(R"({"host_stalls": [{"start_ns": 1, "duration_ns": 2}, 5]})"),
            "host_stalls[1]: expected an object, got number");
  EXPECT_EQ(error(R"({"host_stalls": [{"start_ns": 1, "duration_ns": 2},
                                      {"start_ns": 3, "duration_ns": 4}]})",
                  1),
            "rows: more than 1 rows in one batch; send smaller batches");
  EXPECT_EQ(error(R"({"host_stalls": [{"start_ns": 18446744073709551615, "duration_ns": 2}]})"),
            "host_stalls[0].start_ns: integer out of range");
  EXPECT_EQ(error(R"([1])"), "rows: expected an object of tables, got array");
}

TEST(RowJsonTest, TheColumnsLayoutRoundTripsEveryTableAndDecodesAsTheObjectsLayout) {
  // GIVEN one row of every table, encoded in the compact layout the client pushes
  const std::vector<Row> rows = EveryKindOfRow();
  const json compact = RowsToJson(rows, RowLayout::kColumns);
  EXPECT_EQ(compact["gpu_samples"]["columns"][0], "ts_ns");
  EXPECT_EQ(compact["steps"]["rows"][1][3], nullptr);  // wait_ns unknown
  EXPECT_EQ(compact["host_samples"]["rows"][0].size(), compact["host_samples"]["columns"].size());
  // WHEN it is decoded from its text
  auto back = RowsFromJsonText(compact.dump(), 1000);
  ASSERT_TRUE(back.ok()) << back.error();
  // THEN the rows are the same as through the objects layout, and it is smaller
  ASSERT_EQ(back->size(), rows.size());
  EXPECT_EQ(RowsToJson(*back), RowsToJson(rows));
  EXPECT_EQ(RowsToJson(*back, RowLayout::kColumns), compact);
}

TEST(RowJsonTest, TheColumnsLayoutTakesAnyOrderOfColumnsAndLeavesOutOptionalOnes) {
  // "rows" before "columns", columns in another order, optional ones left out
  auto rows = RowsFromJsonText(
      R"({"gpu_samples": {"rows": [[5, 50.5, 0], [7, null, 1]],
                          "columns": ["ts_ns", "util_pct", "gpu_index"]},
          "host_stalls": {"columns": ["duration_ns", "start_ns"], "rows": []}})",
      100);
  ASSERT_TRUE(rows.ok()) << rows.error();
  ASSERT_EQ(rows->size(), 2u);
  const auto& first = std::get<GpuSampleRow>((*rows)[0]);
  EXPECT_EQ(first.ts_ns, 5);
  EXPECT_EQ(first.gpu_index, 0);
  EXPECT_EQ(first.util_pct, 50.5);
  EXPECT_EQ(first.power_mw, std::nullopt);
  const auto& second = std::get<GpuSampleRow>((*rows)[1]);
  EXPECT_EQ(second.gpu_index, 1);
  EXPECT_EQ(second.util_pct, std::nullopt);
}

TEST(RowJsonTest, ABadColumnsTableIsRefusedNamingTheProblem) {
  auto error = [](const std::string& text, size_t max_rows = 100) {
    auto r = RowsFromJsonText(text, max_rows);
    return r.ok() ? std::string("(accepted)") : r.error();
  };
  const std::string cols = R"("columns": ["start_ns", "duration_ns"])";
  EXPECT_EQ(error(R"({"host_stalls": {"rows": []}})"),
            "rows.host_stalls: 'columns' missing (the names of the rows' values)");
  EXPECT_EQ(error(R"({"host_stalls": {)" + cols + "}}"), "rows.host_stalls: 'rows' missing");
  EXPECT_EQ(error(R"({"host_stalls": {)" + cols + R"(, "rows": [], "x": 1}})"),
            "rows.host_stalls: unknown key 'x' (expected: columns, rows)");
  EXPECT_EQ(error(R"({"host_stalls": {"columns": ["start_ns"], "rows": []}})"),
            "rows.host_stalls.columns: 'duration_ns' missing (required)");
  EXPECT_EQ(error(R"({"host_stalls": {"columns": ["start_ns", "duration_ns", "x"], "rows": []}})"),
            "rows.host_stalls.columns: unknown column 'x'");
  EXPECT_EQ(
      error(R"({"host_stalls": {"columns": ["start_ns", "start_ns", "duration_ns"], "rows": []}})"),
      "rows.host_stalls.columns: 'start_ns' is given twice");
  EXPECT_EQ(error(R"({"host_stalls": {"columns": "start_ns", "rows": []}})"),
            "rows.host_stalls.columns: expected an array of column names, got string");
  EXPECT_EQ(error(R"({"host_stalls": {)" + cols + R"(, "rows": {}}})"),
            "rows.host_stalls.rows: expected an array of rows, got object");
  EXPECT_EQ(error(R"({"host_stalls": {)" + cols + R"(, "rows": [[1, 2], 3]}})"),
            "host_stalls[1]: expected an array of values, got number");
  EXPECT_EQ(error(R"({"host_stalls": {)" + cols + R"(, "rows": [[1, 2], [1]]}})"),
            "host_stalls[1]: expected 2 values (one per column), got a different number");
  EXPECT_EQ(error(R"({"host_stalls": {)" + cols + R"(, "rows": [[1, 2, 3]]}})"),
            "host_stalls[0]: expected 2 values (one per column), got a different number");
  EXPECT_EQ(error(R"({"host_stalls": {)" + cols + R"(, "rows": [[1, 2], [1, "2"]]}})"),
            "host_stalls[1].duration_ns: expected an integer, got string");
  EXPECT_EQ(error(R"({"host_stalls": {)" + cols + R"(, "rows": [[1, 2], [1, 2]]}})", 1),
            "rows: more than 1 rows in one batch; send smaller batches");
  // Text that is not JSON is the reader's error, with the byte
  EXPECT_THAT(error(R"({"host_stalls": {)" + cols + R"(, "rows": [[1, 2],]}})"),
              HasSubstr("not valid JSON: "));
  EXPECT_THAT(error(R"({"host_stalls": [)"), HasSubstr("not valid JSON: unexpected end at byte"));
}

TEST(RowJsonTest, RunInfoAndInsightsRoundTripAndAreChecked) {
  RunInfo info;
  info.run_id = 99;  // the receiver's, not sent
  info.run_name = "exp";
  info.hostname = "node-1";
  info.pid = 7;
  info.start_unix_ns = 1;
  info.status = "ok";
  info.end_ns = 5;
  info.gpu_model = "NVIDIA H200";
  info.flops_per_step = 1.5e12;
  const json doc = RunInfoToJson(info);
  EXPECT_FALSE(doc.contains("run_id"));
  auto back = RunInfoFromJson(doc);
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(RunInfoToJson(*back), doc);
  json bad = doc;
  bad["status"] = "done";
  EXPECT_EQ(RunInfoFromJson(bad).error(), "run.status: 'done' is not running, ok or failed");
  InsightRow in{0, "dataloader_stall", "data_pipeline", "high", "34% ...", "raise", "{}"};
  auto insights = InsightsFromJsonText(InsightsToJson({in}).dump());
  ASSERT_TRUE(insights.ok()) << insights.error();
  EXPECT_EQ((*insights)[0].rule_id, "dataloader_stall");
  EXPECT_THAT(InsightsFromJsonText("{}").error(), HasSubstr("expected an array"));
}

}  // namespace
}  // namespace gpuprof::store
