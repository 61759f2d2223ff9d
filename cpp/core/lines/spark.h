// linescope's Spark view (`profile(spark=True)`): the numbers behind one recorded PySpark
// action, and the report section that shows them.
//
// The Python layer (python/linescope/_spark.py) only reads Spark's objects over py4j and hands
// what it read here as one "raw capture" JSON document per action; everything that turns those
// readings into numbers and decides what they mean is here:
//   - ParseSparkMetric: Spark's formatted SQL metric strings ("1,000", "8.2 MiB", "12 ms",
//     "total (min, med, max (stageId: taskId))\n336.0 B (168.0 B, 168.0 B, 168.0 B (stage 0.0:
//     task 0))") -> numbers in one unit per kind (nanoseconds, bytes, counts);
//   - BuildSparkExecution: a raw capture -> the execution as the result holds it (operator
//     tree of the executed plan with parsed metrics, jobs, stages, per-action totals);
//   - AddSparkReportSection: the report payload's "spark" section.
//
// Driver wall time (how long the user's call blocked the Python driver) and executor time (the
// sum of the tasks' executor run time) are different quantities and are never added. Unknown
// values are null with a reason, never 0. Pure functions: no I/O, any thread.
//
// Raw capture (linescope-spark-raw/1), written by _spark.py; every field may be null:
//   {"name": "collect", "status": "success"|"failed", "error": str,
//    "driver_time_ns": int, "location": {"filename": str, "line": int, "function": str},
//    "plans": {"parsed"|"analyzed"|"optimized"|"executed": str}, "reasons": [str],
//    "executions": [{"id": int, "description": str, "physical_plan": str, "error": str,
//                    "nodes": [{"id": int, "name": str, "desc": str, "cluster": int|null,
//                               "is_cluster": bool,
//                               "metrics": [{"name": str, "acc": int, "type": str}]}],
//                    "edges": [[from_id, to_id]],   // from = child, to = parent
//                    "metric_values": {"<acc>": str}, "job_ids": [int]}],
//    "jobs": [{"id", "status", "stage_ids": [int], "num_tasks"}],
//    "stages": [{"id", "attempt", "name", "status", "num_tasks", "executor_run_time_ms",
//                "executor_cpu_time_ns", "shuffle_read_bytes", "shuffle_write_bytes",
//                "memory_spilled_bytes", "disk_spilled_bytes", "peak_execution_memory_bytes",
//                "input_bytes", "input_records", "output_bytes", "output_records",
//                "failure_reason"}]}
// The built execution's layout is documented in docs/linescope.md ("Spark").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "util/status.h"

namespace gpuprof::lines {

// A SQL metric's value in its kind's unit: "ns" (timing, nsTiming), "bytes" (size), "count"
// (sum) or "" (average and unknown types: a plain number). `total` is the metric's value (the
// sum over tasks for multi-task metrics); min/med/max are the per-task spread when Spark
// printed one. nullopt: not in the text, or the text could not be read.
struct SparkMetricValue {
  std::optional<double> total;
  std::optional<double> min;
  std::optional<double> med;
  std::optional<double> max;
  std::string unit;
};

// `metric_type` is Spark's SQLMetric type ("sum", "size", "timing", "nsTiming", "average";
// anything else is read as a plain number). Never throws.
SparkMetricValue ParseSparkMetric(std::string_view metric_type, std::string_view text);

// One formatted value: "336.0 B" / "8.2 MiB" -> bytes; "12 ms" / "1.5 s" / "2.0 m" / "1.00 h"
// -> ns; "1,000" -> 1000. nullopt when the text is not such a value.
std::optional<double> ParseSparkSize(std::string_view text);
std::optional<double> ParseSparkDuration(std::string_view text);
std::optional<double> ParseSparkCount(std::string_view text);

// A raw capture (above) -> the execution (compact JSON). Errors name the problem.
Expected<std::string> BuildSparkExecution(std::string_view raw_json);

// The report's "spark" section from a linescope-result/1 document: null unless the result has
// a Spark collection (`result["spark"]`). `payload` is the report payload built so far (its
// "files" link an action to its source view).
nlohmann::json SparkReportSection(const nlohmann::json& result, const nlohmann::json& payload);

}  // namespace gpuprof::lines
