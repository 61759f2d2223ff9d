#include "lines/spark.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace gpuprof::lines {
namespace {

using nlohmann::json;

TEST(SparkMetric, ReadsSizesDurationsAndCounts) {
  EXPECT_DOUBLE_EQ(*ParseSparkSize("336.0 B"), 336.0);
  EXPECT_DOUBLE_EQ(*ParseSparkSize("1.5 KiB"), 1536.0);
  EXPECT_NEAR(*ParseSparkSize("8.2 MiB"), 8.2 * 1048576.0, 1.0);
  EXPECT_DOUBLE_EQ(*ParseSparkDuration("12 ms"), 12e6);
  EXPECT_DOUBLE_EQ(*ParseSparkDuration("1.5 s"), 1.5e9);
  EXPECT_DOUBLE_EQ(*ParseSparkDuration("2.0 m"), 120e9);
  EXPECT_DOUBLE_EQ(*ParseSparkDuration("1.00 h"), 3600e9);
  EXPECT_DOUBLE_EQ(*ParseSparkCount("1,000"), 1000.0);
  EXPECT_DOUBLE_EQ(*ParseSparkCount("7"), 7.0);
}

TEST(SparkMetric, UnreadableTextIsUnknownNotZero) {
  EXPECT_FALSE(ParseSparkSize("12 parsecs"));
  EXPECT_FALSE(ParseSparkDuration("soon"));
  EXPECT_FALSE(ParseSparkCount("1,000 rows"));
  EXPECT_FALSE(ParseSparkCount(""));
  const SparkMetricValue v = ParseSparkMetric("size", "n/a");
  EXPECT_EQ(v.unit, "bytes");
  EXPECT_FALSE(v.total);
}

TEST(SparkMetric, ReadsTheTotalAndTheTaskSpread) {
  const SparkMetricValue t = ParseSparkMetric(
      "timing",
      "total (min, med, max (stageId: taskId))\n8 ms (2 ms, 6 ms, 6 ms (stage 0.0: task 0))");
  EXPECT_EQ(t.unit, "ns");
  EXPECT_DOUBLE_EQ(*t.total, 8e6);
  EXPECT_DOUBLE_EQ(*t.min, 2e6);
  EXPECT_DOUBLE_EQ(*t.med, 6e6);
  EXPECT_DOUBLE_EQ(*t.max, 6e6);
  const SparkMetricValue s = ParseSparkMetric(
      "size",
      "total (min, med, max (stageId: taskId))\n512.0 KiB (256.0 KiB, 256.0 KiB, 256.0 KiB "
      "(stage 0.0: task 0))");
  EXPECT_DOUBLE_EQ(*s.total, 524288.0);
  EXPECT_DOUBLE_EQ(*s.max, 262144.0);
  const SparkMetricValue c = ParseSparkMetric("sum", "1,000");
  EXPECT_EQ(c.unit, "count");
  EXPECT_DOUBLE_EQ(*c.total, 1000.0);
  EXPECT_FALSE(c.min);
  const SparkMetricValue ns = ParseSparkMetric("nsTiming", "0 ms");
  EXPECT_EQ(ns.unit, "ns");
  EXPECT_DOUBLE_EQ(*ns.total, 0.0);
}

json Raw() {
  return json::parse(R"json({
    "name": "collect", "status": "success", "error": null, "driver_time_ns": 5000000,
    "location": {"filename": "/w/job.py", "line": 7, "function": "<module>"},
    "plans": {"optimized": "Aggregate", "analyzed": "Aggregate'", "parsed": null},
    "executions": [{
      "id": 3, "description": "collect at job.py:7", "physical_plan": "== Physical Plan ==",
      "nodes": [
        {"id": 0, "name": "AdaptiveSparkPlan", "desc": "", "cluster": null, "is_cluster": false, "metrics": []},
        {"id": 1, "name": "WholeStageCodegen (2)", "desc": "", "cluster": null, "is_cluster": true,
         "metrics": [{"name": "duration", "acc": 100, "type": "timing"}]},
        {"id": 2, "name": "HashAggregate", "desc": "HashAggregate(keys=[k])", "cluster": 1, "is_cluster": false,
         "metrics": [{"name": "number of output rows", "acc": 101, "type": "sum"},
                     {"name": "peak memory", "acc": 102, "type": "size"}]},
        {"id": 3, "name": "Exchange", "desc": "", "cluster": null, "is_cluster": false,
         "metrics": [{"name": "shuffle bytes written", "acc": 42, "type": "size"}]},
        {"id": 4, "name": "Range", "desc": "", "cluster": null, "is_cluster": false,
         "metrics": [{"name": "number of output rows", "acc": 35, "type": "sum"}]}],
      "edges": [[2, 0], [3, 2], [4, 3]],
      "metric_values": {
  "100": "41 ms", "101": "7", "102": "8.2 MiB", "35": "1,000",
        "42": "total (min, med, max (stageId: taskId))\n336.0 B (168.0 B, 168.0 B, 168.0 B (stage 0.0: task 0))"
}
}],
    "jobs": [{"id": 0, "status": "SUCCEEDED", "stage_ids": [0, 1], "num_tasks": 3}],
    "stages": [
      {"id": 0, "attempt": 0, "name": "collect", "status": "COMPLETE", "num_tasks": 2,
       "executor_run_time_ms": 442, "executor_cpu_time_ns": 168779656, "shuffle_read_bytes": 0,
       "shuffle_write_bytes": 364, "memory_spilled_bytes": 0, "disk_spilled_bytes": 0,
       "peak_execution_memory_bytes": 524288, "input_bytes": 0, "input_records": 1000},
      {"id": 1, "attempt": 0, "name": "collect", "status": "COMPLETE", "num_tasks": 1,
       "executor_run_time_ms": 20, "executor_cpu_time_ns": 1000000, "shuffle_read_bytes": 364,
       "shuffle_write_bytes": 0, "memory_spilled_bytes": 0, "disk_spilled_bytes": 0,
       "peak_execution_memory_bytes": 1000, "input_bytes": 0, "input_records": 0},
      {"id": 2, "attempt": 0, "name": "skipped", "status": "SKIPPED", "num_tasks": 2,
       "executor_run_time_ms": 0}]
})json");
}

TEST(SparkExecution, BuildsTheOperatorTreeWithParsedMetrics) {
  auto built = BuildSparkExecution(Raw().dump());
  ASSERT_TRUE(built) << built.error();
  const json e = json::parse(*built);
  ASSERT_EQ(e["operators"].size(), 1u);
  const json& root = e["operators"][0];
  EXPECT_EQ(root["name"], "AdaptiveSparkPlan");
  const json& codegen = root["children"][0];
  EXPECT_EQ(codegen["name"], "WholeStageCodegen (2)");
  EXPECT_TRUE(codegen["codegen"].get<bool>());
  EXPECT_EQ(codegen["metrics"][0]["value"], 41000000);
  const json& agg = codegen["children"][0];
  EXPECT_EQ(agg["name"], "HashAggregate");
  EXPECT_EQ(agg["metrics"][0]["value"], 7);
  EXPECT_EQ(agg["metrics"][1]["unit"], "bytes");
  const json& exchange = agg["children"][0];
  EXPECT_EQ(exchange["metrics"][0]["value"], 336);
  EXPECT_EQ(exchange["metrics"][0]["max"], 168);
  EXPECT_EQ(exchange["children"][0]["name"], "Range");
  EXPECT_EQ(e["plans"]["executed"], "== Physical Plan ==");
  EXPECT_EQ(e["plans"]["optimized"], "Aggregate");
  EXPECT_TRUE(e["plans"]["parsed"].is_null());
  EXPECT_EQ(e["stats"]["output_rows"], 7);
}

TEST(SparkExecution, DriverAndExecutorTimeStaySeparate) {
  const json e = json::parse(*BuildSparkExecution(Raw().dump()));
  EXPECT_EQ(e["driver_time_ns"], 5000000);
  EXPECT_EQ(e["executor_time_ns"], (442 + 20) * 1000000LL);  // the skipped stage adds nothing
  EXPECT_EQ(e["stats"]["executor_cpu_time_ns"], 168779656 + 1000000);
  EXPECT_EQ(e["stats"]["shuffle_write_bytes"], 364);
  EXPECT_EQ(e["stats"]["shuffle_read_bytes"], 364);
  EXPECT_EQ(e["stats"]["peak_execution_memory_bytes"], 524288);
  EXPECT_EQ(e["stats"]["tasks"], 3);
  EXPECT_EQ(e["stages"].size(), 3u);
  EXPECT_EQ(e["stages"][0]["executor_run_time_ns"], 442000000);
}

TEST(SparkExecution, AStageThatDidNotReportAValueLeavesItsTotalUnknown) {
  json raw = Raw();
  raw["stages"][1].erase("shuffle_read_bytes");
  const json e = json::parse(*BuildSparkExecution(raw.dump()));
  // an unknown part is not 0: the sum over the stages is unknown, with the reason
  EXPECT_TRUE(e["stats"]["shuffle_read_bytes"].is_null());
  EXPECT_EQ(e["reasons"]["shuffle_read_bytes"], "Spark did not report it for this action's stages");
  EXPECT_EQ(e["stats"]["shuffle_write_bytes"], 364);  // the others are still known
}

TEST(SparkExecution, UnreadableStoreLeavesTotalsUnknownWithAReason) {
  json raw = Raw();
  raw["executions"] = json::array();
  raw["jobs"] = json::array();
  raw["stages"] = json::array();
  raw["reasons"] = {"Spark's status store could not be read: stopped"};
  const json e = json::parse(*BuildSparkExecution(raw.dump()));
  EXPECT_TRUE(e["executor_time_ns"].is_null());
  EXPECT_EQ(e["reasons"]["executor_time_ns"], "Spark's status store could not be read: stopped");
  EXPECT_TRUE(e["stats"]["output_rows"].is_null());
  EXPECT_EQ(e["driver_time_ns"], 5000000);
}

TEST(SparkExecution, AnActionThatRanNoJobHasZeroExecutorTime) {
  json raw = Raw();
  raw["jobs"] = json::array();
  raw["stages"] = json::array();
  const json e = json::parse(*BuildSparkExecution(raw.dump()));
  EXPECT_EQ(e["executor_time_ns"], 0);
}

TEST(SparkExecution, RejectsWhatIsNotACapture) {
  EXPECT_FALSE(BuildSparkExecution("not json"));
  EXPECT_FALSE(BuildSparkExecution("[1]"));
}

TEST(SparkReport, LinksActionsToTheirLinesAndKeepsTimesApart) {
  const json exec = json::parse(*BuildSparkExecution(Raw().dump()));
  json e = exec;
  e["id"] = 1;
  json result = {{"spark",
                  {{"available", true},
                   {"reason", nullptr},
                   {"driver_time_ns", 5000000},
                   {"executor_time_ns", 462000000}}},
                 {"run", {{"spark_executions", json::array({e})}}}};
  json payload = {{"files", json::array({{{"path", "/w/other.py"}}, {{"path", "/w/job.py"}}})}};
  const json s = SparkReportSection(result, payload);
  ASSERT_TRUE(s.is_object());
  EXPECT_TRUE(s["available"].get<bool>());
  ASSERT_EQ(s["actions"].size(), 1u);
  EXPECT_EQ(s["actions"][0]["file"], 1);
  EXPECT_EQ(s["actions"][0]["line"], 7);
  EXPECT_EQ(s["by_line"]["1:7"], json::array({0}));
  EXPECT_EQ(s["driver_time_ns"], 5000000);
  EXPECT_EQ(s["executor_time_ns"], 462000000);
  EXPECT_EQ(s["actions"][0]["rows"], 7);
  EXPECT_TRUE(SparkReportSection(json::object(), payload).is_null());
}

}  // namespace
}  // namespace gpuprof::lines
