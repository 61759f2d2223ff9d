#include "lines/spark.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lines/json_fields.h"

namespace gpuprof::lines {
namespace {

using json_fields::AddParts;
using json_fields::Field;
using json_fields::J;
using json_fields::MaxParts;
using json_fields::OptInt;
using nlohmann::json;
using OptReal = std::optional<double>;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A leading decimal number ("1,234.5", "-3", "2.0E3" is not produced by Spark and not read);
// thousands separators are skipped. Sets *rest to the text after it.
OptReal LeadingNumber(std::string_view s, std::string_view* rest) {
  s = Trim(s);
  std::string digits;
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) digits += s[i++];
  bool any = false, dot = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits += c;
      any = true;
    } else if (c == ',' && any && !dot) {
      continue;
    } else if (c == '.' && !dot) {
      digits += c;
      dot = true;
    } else {
      break;
    }
  }
  if (!any) return std::nullopt;
  *rest = Trim(s.substr(i));
  try {
    return std::stod(digits);
  } catch (...) {
    return std::nullopt;
  }
}

// The multiplier of a size or duration unit; nullopt for an unknown unit.
OptReal SizeUnit(std::string_view u) {
  static const std::pair<const char*, double> kUnits[] = {{"B", 1.0},
                                                          {"KiB", 1024.0},
                                                          {"MiB", 1048576.0},
                                                          {"GiB", 1073741824.0},
                                                          {"TiB", 1099511627776.0},
                                                          {"PiB", 1125899906842624.0},
                                                          {"EiB", 1152921504606846976.0}};
  for (const auto& [name, mul] : kUnits)
    if (u == name) return mul;
  return std::nullopt;
}

OptReal DurationUnitNs(std::string_view u) {
  if (u == "ns") return 1.0;
  if (u == "us" || u == "\xc2\xb5s") return 1e3;
  if (u == "ms") return 1e6;
  if (u == "s") return 1e9;
  if (u == "m" || u == "min") return 60e9;
  if (u == "h") return 3600e9;
  return std::nullopt;
}

// One value of `unit` kind ("bytes", "ns", "count", ""): the number and, for bytes and ns,
// its unit suffix must be readable.
OptReal ParseValue(std::string_view unit, std::string_view text) {
  if (unit == "bytes") return ParseSparkSize(text);
  if (unit == "ns") return ParseSparkDuration(text);
  return ParseSparkCount(text);
}

std::string UnitOf(std::string_view metric_type) {
  if (metric_type == "size") return "bytes";
  if (metric_type == "timing" || metric_type == "nsTiming") return "ns";
  if (metric_type == "sum") return "count";
  return "";
}

// Splits "a, b, c (stage 1.0: task 3)" into its top-level comma-separated parts.
std::vector<std::string_view> TopLevelParts(std::string_view s) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')') --depth;
    if (s[i] == ',' && depth == 0 && i + 1 < s.size() && s[i + 1] == ' ') {
      parts.push_back(Trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  parts.push_back(Trim(s.substr(start)));
  return parts;
}

json Num(const OptReal& v, const std::string& unit) {
  if (!v) return nullptr;
  if (unit == "") return *v;
  return static_cast<int64_t>(std::llround(*v));
}

// ---- reading the raw capture -------------------------------------------------------------

OptInt I(const json& obj, const char* key) {
  const json& v = Field(obj, key);
  if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_float()) return static_cast<int64_t>(std::llround(v.get<double>()));
  return std::nullopt;
}

json S(const json& obj, const char* key) {
  const json& v = Field(obj, key);
  return v.is_string() ? v : json(nullptr);
}

const json& Arr(const json& obj, const char* key) {
  static const json kEmpty = json::array();
  const json& v = Field(obj, key);
  return v.is_array() ? v : kEmpty;
}

// ---- the operator tree -------------------------------------------------------------------

struct Node {
  int64_t id = 0;
  std::string name;
  std::string desc;
  OptInt cluster;  // the WholeStageCodegen cluster holding it
  bool is_cluster = false;
  json metrics = json::array();
  std::optional<int64_t> parent;  // after folding clusters in
  std::vector<int64_t> children;
};

json MetricsOf(const json& raw_node, const json& values) {
  json out = json::array();
  for (const json& m : Arr(raw_node, "metrics")) {
    const std::string type = S(m, "type").is_string() ? S(m, "type").get<std::string>() : "";
    const OptInt acc = I(m, "acc");
    json text = nullptr;
    if (acc && values.is_object()) {
      auto it = values.find(std::to_string(*acc));
      if (it != values.end() && it->is_string()) text = *it;
    }
    json jm = {{"name", S(m, "name")}, {"type", type}, {"text", text}};
    if (text.is_string()) {
      const SparkMetricValue v = ParseSparkMetric(type, text.get<std::string>());
      jm["unit"] = v.unit;
      jm["value"] = Num(v.total, v.unit);
      jm["min"] = Num(v.min, v.unit);
      jm["med"] = Num(v.med, v.unit);
      jm["max"] = Num(v.max, v.unit);
    } else {
      jm["unit"] = UnitOf(type);
      jm["value"] = jm["min"] = jm["med"] = jm["max"] = nullptr;
    }
    out.push_back(std::move(jm));
  }
  return out;
}

// The execution's plan graph -> a tree (roots first). A WholeStageCodegen cluster becomes
// the parent of its members that have no parent inside it, and takes their parent.
json OperatorTree(const json& execution) {
  const json& values = Field(execution, "metric_values");
  std::map<int64_t, Node> nodes;
  std::vector<int64_t> order;
  for (const json& rn : Arr(execution, "nodes")) {
    const OptInt id = I(rn, "id");
    if (!id || nodes.count(*id)) continue;
    Node n;
    n.id = *id;
    n.name = S(rn, "name").is_string() ? S(rn, "name").get<std::string>() : "";
    n.desc = S(rn, "desc").is_string() ? S(rn, "desc").get<std::string>() : "";
    n.cluster = I(rn, "cluster");
    n.is_cluster = Field(rn, "is_cluster").is_boolean() && Field(rn, "is_cluster").get<bool>();
    n.metrics = MetricsOf(rn, values);
    nodes.emplace(*id, std::move(n));
    order.push_back(*id);
  }
  std::map<int64_t, int64_t> plan_parent;  // child -> parent (operators only)
  for (const json& e : Arr(execution, "edges")) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_number() || !e[1].is_number()) continue;
    const int64_t from = e[0].get<int64_t>(), to = e[1].get<int64_t>();
    if (nodes.count(from) && nodes.count(to) && !plan_parent.count(from)) plan_parent[from] = to;
  }
  for (int64_t id : order) {
    Node& n = nodes[id];
    if (n.is_cluster) continue;
    auto p = plan_parent.find(id);
    const OptInt parent = p == plan_parent.end() ? OptInt() : OptInt(p->second);
    const bool cluster_ok = n.cluster && nodes.count(*n.cluster) && nodes[*n.cluster].is_cluster;
    if (cluster_ok && !(parent && nodes[*parent].cluster == n.cluster)) {
      // The topmost member of its cluster: under the cluster, which takes its parent.
      n.parent = *n.cluster;
      Node& c = nodes[*n.cluster];
      if (!c.parent && parent) c.parent = parent;
    } else {
      n.parent = parent;
    }
  }
  std::vector<int64_t> roots;
  for (int64_t id : order) {
    Node& n = nodes[id];
    if (n.parent && nodes.count(*n.parent) && *n.parent != id)
      nodes[*n.parent].children.push_back(id);
    else
      roots.push_back(id);
  }
  std::set<int64_t> visiting;  // a malformed graph with a cycle is cut, not followed
  std::function<json(int64_t)> build = [&](int64_t id) -> json {
    Node& n = nodes[id];
    json kids = json::array();
    if (visiting.insert(id).second) {
      for (int64_t c : n.children) kids.push_back(build(c));
      visiting.erase(id);
    }
    return {{"id", n.id},
            {"name", n.name},
            {"description", n.desc},
            {"codegen", n.is_cluster},
            {"metrics", n.metrics},
            {"children", std::move(kids)}};
  };
  json out = json::array();
  for (int64_t id : roots) {
    // A cluster without members has nothing to show under it.
    if (nodes[id].is_cluster && nodes[id].children.empty()) continue;
    out.push_back(build(id));
  }
  return out;
}

// The rows the action produced: the "number of output rows" of the first operator that has
// one, walking down from the root through single-child operators.
OptInt OutputRows(const json& operators) {
  const json* level = &operators;
  while (level->is_array() && level->size() == 1) {
    const json& op = (*level)[0];
    for (const json& m : op["metrics"])
      if (m["name"] == "number of output rows" && m["value"].is_number())
        return m["value"].get<int64_t>();
    level = &op["children"];
  }
  return std::nullopt;
}

size_t NodeCount(const json& execution) { return Arr(execution, "nodes").size(); }

}  // namespace

std::optional<double> ParseSparkCount(std::string_view text) {
  std::string_view rest;
  auto v = LeadingNumber(text, &rest);
  if (!v || !rest.empty()) return std::nullopt;
  return v;
}

std::optional<double> ParseSparkSize(std::string_view text) {
  std::string_view rest;
  auto v = LeadingNumber(text, &rest);
  if (!v) return std::nullopt;
  auto mul = SizeUnit(rest);
  if (!mul) return std::nullopt;
  return *v * *mul;
}

std::optional<double> ParseSparkDuration(std::string_view text) {
  std::string_view rest;
  auto v = LeadingNumber(text, &rest);
  if (!v) return std::nullopt;
  auto mul = DurationUnitNs(rest);
  if (!mul) return std::nullopt;
  return *v * *mul;
}

SparkMetricValue ParseSparkMetric(std::string_view metric_type, std::string_view text) {
  SparkMetricValue out;
  out.unit = UnitOf(metric_type);
  std::string_view body = Trim(text);
  // "total (min, med, max (stageId: taskId))\n<total> (<min>, <med>, <max> (stage s: task t))"
  if (auto nl = body.find('\n'); nl != std::string_view::npos) body = Trim(body.substr(nl + 1));
  std::string_view head = body, spread;
  if (auto open = body.find(" ("); open != std::string_view::npos && body.back() == ')') {
    head = Trim(body.substr(0, open));
    spread = body.substr(open + 2, body.size() - open - 3);
  }
  out.total = ParseValue(out.unit, head);
  if (!spread.empty()) {
    auto parts = TopLevelParts(spread);
    if (parts.size() == 3) {
      std::string_view last = parts[2];
      if (auto p = last.find(" ("); p != std::string_view::npos) last = last.substr(0, p);
      out.min = ParseValue(out.unit, parts[0]);
      out.med = ParseValue(out.unit, parts[1]);
      out.max = ParseValue(out.unit, last);
    }
  }
  return out;
}

Expected<std::string> BuildSparkExecution(std::string_view raw_json) {
  json raw;
  try {
    raw = json::parse(raw_json);
  } catch (const json::exception& e) {
    return Status::Error(std::string("linescope spark: the capture is not valid JSON: ") +
                         e.what());
  }
  if (!raw.is_object()) return Status::Error("linescope spark: the capture is not an object");
  try {
    std::vector<std::string> reasons;
    for (const json& r : Arr(raw, "reasons"))
      if (r.is_string()) reasons.push_back(r.get<std::string>());

    // The primary SQL execution (the one whose plan is shown): the largest plan graph; the
    // later one on a tie (an action's own query comes after the helper queries it ran).
    const json& executions = Arr(raw, "executions");
    const json* primary = nullptr;
    json sql_ids = json::array();
    for (const json& e : executions) {
      sql_ids.push_back(J(I(e, "id")));
      if (!primary || NodeCount(e) >= NodeCount(*primary)) primary = &e;
    }
    json operators = primary ? OperatorTree(*primary) : json::array();

    json plans = {
        {"parsed", nullptr}, {"analyzed", nullptr}, {"optimized", nullptr}, {"executed", nullptr}};
    for (const char* k : {"parsed", "analyzed", "optimized", "executed"})
      plans[k] = S(Field(raw, "plans"), k);
    if (primary && S(*primary, "physical_plan").is_string())
      plans["executed"] = S(*primary, "physical_plan");

    json jobs = json::array();
    for (const json& j : Arr(raw, "jobs")) {
      json ids = json::array();
      for (const json& s : Arr(j, "stage_ids"))
        if (s.is_number()) ids.push_back(s);
      jobs.push_back({{"id", J(I(j, "id"))},
                      {"status", S(j, "status")},
                      {"stage_ids", std::move(ids)},
                      {"num_tasks", J(I(j, "num_tasks"))}});
    }

    // Per-stage costs, and the action's totals over the stages that ran (skipped stages
    // reuse an earlier stage's output and cost nothing).
    json stages = json::array();
    // Sums over the stages that ran: known only where every one of them reported it.
    OptInt run_ns = 0, cpu_ns = 0, shuffle_read = 0, shuffle_write = 0, mem_spill = 0,
           disk_spill = 0, peak = 0, in_bytes = 0, in_records = 0, out_bytes = 0, tasks = 0;
    bool stage_values = false;
    for (const json& s : Arr(raw, "stages")) {
      const OptInt run_ms = I(s, "executor_run_time_ms");
      const OptInt run = run_ms ? OptInt(*run_ms * 1000000) : std::nullopt;
      json js = {{"id", J(I(s, "id"))},
                 {"attempt", J(I(s, "attempt"))},
                 {"name", S(s, "name")},
                 {"status", S(s, "status")},
                 {"num_tasks", J(I(s, "num_tasks"))},
                 {"executor_run_time_ns", J(run)},
                 {"executor_cpu_time_ns", J(I(s, "executor_cpu_time_ns"))},
                 {"shuffle_read_bytes", J(I(s, "shuffle_read_bytes"))},
                 {"shuffle_write_bytes", J(I(s, "shuffle_write_bytes"))},
                 {"memory_spilled_bytes", J(I(s, "memory_spilled_bytes"))},
                 {"disk_spilled_bytes", J(I(s, "disk_spilled_bytes"))},
                 {"peak_execution_memory_bytes", J(I(s, "peak_execution_memory_bytes"))},
                 {"input_bytes", J(I(s, "input_bytes"))},
                 {"input_records", J(I(s, "input_records"))},
                 {"output_bytes", J(I(s, "output_bytes"))},
                 {"output_records", J(I(s, "output_records"))},
                 {"failure_reason", S(s, "failure_reason")}};
      const bool skipped = js["status"] == "SKIPPED";
      if (!skipped) {
        stage_values = true;
        run_ns = AddParts(run_ns, run);
        cpu_ns = AddParts(cpu_ns, I(s, "executor_cpu_time_ns"));
        shuffle_read = AddParts(shuffle_read, I(s, "shuffle_read_bytes"));
        shuffle_write = AddParts(shuffle_write, I(s, "shuffle_write_bytes"));
        mem_spill = AddParts(mem_spill, I(s, "memory_spilled_bytes"));
        disk_spill = AddParts(disk_spill, I(s, "disk_spilled_bytes"));
        in_bytes = AddParts(in_bytes, I(s, "input_bytes"));
        in_records = AddParts(in_records, I(s, "input_records"));
        out_bytes = AddParts(out_bytes, I(s, "output_bytes"));
        tasks = AddParts(tasks, I(s, "num_tasks"));
        peak = MaxParts(peak, I(s, "peak_execution_memory_bytes"));
      }
      stages.push_back(std::move(js));
    }

    // Executor-side totals: known 0 when the status store saw the action and it ran no job;
    // unknown (null, with the reason) when the store could not be read.
    json stats_reasons = json::object();
    const bool store_read = reasons.empty();
    auto total = [&](OptInt v, const char* what) -> json {
      if (stage_values && v) return *v;
      if (stage_values) {
        stats_reasons[what] = "Spark did not report it for this action's stages";
        return nullptr;
      }
      if (store_read && jobs.empty()) return 0;
      stats_reasons[what] = reasons.empty() ? "the action's stages were not found in Spark's "
                                              "status store"
                                            : reasons.front();
      return nullptr;
    };
    json stats = {
        {"executor_time_ns", total(run_ns, "executor_time_ns")},
        {"executor_cpu_time_ns", total(cpu_ns, "executor_cpu_time_ns")},
        {"shuffle_read_bytes", total(shuffle_read, "shuffle_read_bytes")},
        {"shuffle_write_bytes", total(shuffle_write, "shuffle_write_bytes")},
        {"memory_spilled_bytes", total(mem_spill, "memory_spilled_bytes")},
        {"disk_spilled_bytes", total(disk_spill, "disk_spilled_bytes")},
        {"peak_execution_memory_bytes", total(peak, "peak_execution_memory_bytes")},
        {"input_bytes", total(in_bytes, "input_bytes")},
        {"input_records", total(in_records, "input_records")},
        {"output_bytes", total(out_bytes, "output_bytes")},
        {"tasks", total(tasks, "tasks")},
        {"jobs", jobs.size()},
        {"stages", stages.size()},
        {"output_rows", nullptr},
    };
    if (auto rows = OutputRows(operators)) {
      stats["output_rows"] = *rows;
    } else {
      stats_reasons["output_rows"] = primary ? "no operator of the executed plan reported "
                                               "\"number of output rows\""
                                             : "no SQL execution was recorded for the action";
    }
    std::string status = S(raw, "status").is_string() ? S(raw, "status").get<std::string>() : "";
    json error = S(raw, "error");
    if (status.empty()) status = "success";
    if (error.is_null() && primary && S(*primary, "error").is_string() &&
        !S(*primary, "error").get<std::string>().empty() && status == "failed")
      error = S(*primary, "error");

    json out = {
        {"name", S(raw, "name")},
        {"status", status},
        {"error", error},
        {"location", Field(raw, "location").is_object() ? Field(raw, "location") : json(nullptr)},
        {"driver_time_ns", J(I(raw, "driver_time_ns"))},
        {"executor_time_ns", stats["executor_time_ns"]},
        {"sql_execution_ids", std::move(sql_ids)},
        {"description", primary ? S(*primary, "description") : json(nullptr)},
        {"plans", std::move(plans)},
        {"operators", std::move(operators)},
        {"jobs", std::move(jobs)},
        {"stages", std::move(stages)},
        {"stats", std::move(stats)},
        {"reasons", std::move(stats_reasons)},
        {"diagnostics", reasons}};
    return out.dump();
  } catch (const json::exception& e) {
    return Status::Error(std::string("linescope spark: unexpected capture layout: ") + e.what());
  }
}

json SparkReportSection(const json& result, const json& payload) {
  const json& summary = Field(result, "spark");
  if (!summary.is_object()) return nullptr;
  std::map<std::string, int64_t> file_index;
  const json& files = Arr(payload, "files");
  for (size_t i = 0; i < files.size(); ++i)
    if (S(files[i], "path").is_string())
      file_index[files[i]["path"].get<std::string>()] = static_cast<int64_t>(i);

  json actions = json::array();
  json by_line = json::object();  // "<file index>:<line>" -> [action index]
  const json& runs = Arr(Field(result, "run"), "spark_executions");
  for (const json& e : runs) {
    const json& loc = Field(e, "location");
    const json path = S(loc, "filename");
    const OptInt line = I(loc, "line");
    json file = nullptr;
    if (path.is_string()) {
      auto it = file_index.find(path.get<std::string>());
      if (it != file_index.end()) file = it->second;
    }
    const size_t index = actions.size();
    if (file.is_number() && line)
      by_line[std::to_string(file.get<int64_t>()) + ":" + std::to_string(*line)].push_back(index);
    const json& stats = Field(e, "stats");
    actions.push_back({{"index", index},
                       {"id", Field(e, "id")},
                       {"name", S(e, "name")},
                       {"status", S(e, "status")},
                       {"error", S(e, "error")},
                       {"path", path},
                       {"file", file},
                       {"line", J(line)},
                       {"driver_time_ns", J(I(e, "driver_time_ns"))},
                       {"executor_time_ns", J(I(e, "executor_time_ns"))},
                       {"executor_cpu_time_ns", J(I(stats, "executor_cpu_time_ns"))},
                       {"rows", J(I(stats, "output_rows"))},
                       {"shuffle_read_bytes", J(I(stats, "shuffle_read_bytes"))},
                       {"shuffle_write_bytes", J(I(stats, "shuffle_write_bytes"))},
                       {"spill_bytes", J(AddParts(I(stats, "memory_spilled_bytes"),
                                                  I(stats, "disk_spilled_bytes")))},
                       {"peak_memory_bytes", J(I(stats, "peak_execution_memory_bytes"))},
                       {"description", S(e, "description")},
                       {"sql_execution_ids", Field(e, "sql_execution_ids")},
                       {"plans", Field(e, "plans")},
                       {"operators", Field(e, "operators")},
                       {"stages", Field(e, "stages")},
                       {"jobs", Field(e, "jobs")},
                       {"reasons", Field(e, "reasons")}});
  }
  return {
      {"available", Field(summary, "available").is_boolean() && summary["available"].get<bool>()},
      {"reason", S(summary, "reason")},
      // The session's totals (SparkCollection: known when every action's is).
      {"driver_time_ns", J(I(summary, "driver_time_ns"))},
      {"executor_time_ns", J(I(summary, "executor_time_ns"))},
      {"executor_time_note",
       "executor time is the sum of the tasks' run time on the executors (parallel, so it "
       "can exceed the driver time); driver time is how long the Python call blocked"},
      {"actions", std::move(actions)},
      {"by_line", std::move(by_line)}};
}

}  // namespace gpuprof::lines
