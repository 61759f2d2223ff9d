#include "store/row_json.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

namespace gpuprof::store {
namespace {

using nlohmann::json;

// Each row type's columns, in schema order: Fields(row, f) calls f(name, member) per column.
// One list serves encoding and decoding.
template <typename F> void Fields(StepRow& r, F&& f) {
  f("step", r.step); f("start_ns", r.start_ns); f("end_ns", r.end_ns); f("wait_ns", r.wait_ns);
  f("wait_source", r.wait_source); f("forward_calls", r.forward_calls);
  f("backward_calls", r.backward_calls); f("optimizer_calls", r.optimizer_calls);
}
template <typename F> void Fields(PhaseRow& r, F&& f) {
  f("step", r.step); f("name", r.name); f("wall_ns", r.wall_ns); f("gpu_ns", r.gpu_ns);
  f("calls", r.calls);
}
template <typename F> void Fields(PhaseGpuRow& r, F&& f) {
  f("step", r.step); f("name", r.name); f("gpu_ns", r.gpu_ns);
}
template <typename F> void Fields(GpuInfoRow& r, F&& f) {
  f("gpu_index", r.gpu_index); f("name", r.name); f("uuid", r.uuid);
  f("memory_total_bytes", r.memory_total_bytes); f("sm_clock_max_mhz", r.sm_clock_max_mhz);
}
template <typename F> void Fields(GpuSampleRow& r, F&& f) {
  f("ts_ns", r.ts_ns); f("gpu_index", r.gpu_index); f("util_pct", r.util_pct);
  f("mem_util_pct", r.mem_util_pct); f("mem_used_bytes", r.mem_used_bytes);
  f("mem_total_bytes", r.mem_total_bytes); f("proc_mem_bytes", r.proc_mem_bytes);
  f("power_mw", r.power_mw); f("temp_c", r.temp_c); f("sm_clock_mhz", r.sm_clock_mhz);
  f("clock_reasons", r.clock_reasons); f("pcie_rx_bps", r.pcie_rx_bps);
  f("pcie_tx_bps", r.pcie_tx_bps);
}
template <typename F> void Fields(GpuRollupRow& r, F&& f) {
  f("ts_ns", r.ts_ns); f("gpu_index", r.gpu_index); f("samples", r.samples);
  f("util_samples", r.util_samples); f("util_mean_pct", r.util_mean_pct);
  f("util_min_pct", r.util_min_pct); f("util_max_pct", r.util_max_pct);
  f("mem_util_mean_pct", r.mem_util_mean_pct); f("mem_used_max_bytes", r.mem_used_max_bytes);
  f("mem_total_bytes", r.mem_total_bytes); f("proc_mem_max_bytes", r.proc_mem_max_bytes);
  f("power_samples", r.power_samples); f("power_mean_mw", r.power_mean_mw);
  f("power_max_mw", r.power_max_mw); f("temp_max_c", r.temp_max_c);
  f("sm_clock_min_mhz", r.sm_clock_min_mhz); f("sm_clock_max_mhz", r.sm_clock_max_mhz);
  f("clock_reasons_or", r.clock_reasons_or); f("thermal_samples", r.thermal_samples);
  f("throttled_samples", r.throttled_samples);
  f("throttled_by_reason_samples", r.throttled_by_reason_samples);
  f("throttled_temp_max_c", r.throttled_temp_max_c);
  f("throttled_sm_clock_min_mhz", r.throttled_sm_clock_min_mhz);
  f("pcie_rx_samples", r.pcie_rx_samples); f("pcie_rx_mean_bps", r.pcie_rx_mean_bps);
  f("pcie_rx_max_bps", r.pcie_rx_max_bps); f("pcie_rx_high_samples", r.pcie_rx_high_samples);
  f("pcie_tx_max_bps", r.pcie_tx_max_bps);
}
template <typename F> void Fields(HostSampleRow& r, F&& f) {
  f("ts_ns", r.ts_ns); f("cpu_pct", r.cpu_pct); f("cpu_per_core", r.cpu_per_core);
  f("ncores", r.ncores); f("mem_used_bytes", r.mem_used_bytes);
  f("mem_total_bytes", r.mem_total_bytes); f("page_cache_bytes", r.page_cache_bytes);
  f("swap_in_bps", r.swap_in_bps); f("disk_read_bps", r.disk_read_bps);
  f("disk_read_iops", r.disk_read_iops); f("proc_cpu_pct", r.proc_cpu_pct);
  f("proc_rss_bytes", r.proc_rss_bytes);
}
template <typename F> void Fields(WorkerSampleRow& r, F&& f) {
  f("ts_ns", r.ts_ns); f("pid", r.pid); f("role", r.role); f("cpu_pct", r.cpu_pct);
  f("rss_bytes", r.rss_bytes);
}
template <typename F> void Fields(WorkerRollupRow& r, F&& f) {
  f("ts_ns", r.ts_ns); f("pid", r.pid); f("role", r.role); f("samples", r.samples);
  f("cpu_samples", r.cpu_samples); f("cpu_mean_pct", r.cpu_mean_pct);
  f("cpu_max_pct", r.cpu_max_pct); f("rss_max_bytes", r.rss_max_bytes);
}
template <typename F> void Fields(KernelRow& r, F&& f) {
  f("window_start_ns", r.window_start_ns); f("window_end_ns", r.window_end_ns);
  f("name", r.name); f("calls", r.calls); f("gpu_ns", r.gpu_ns); f("source", r.source);
  f("step", r.step); f("device", r.device); f("stream", r.stream); f("grid", r.grid);
  f("block", r.block); f("min_ns", r.min_ns); f("max_ns", r.max_ns);
}
template <typename F> void Fields(CpuOpRow& r, F&& f) {
  f("window_start_ns", r.window_start_ns); f("window_end_ns", r.window_end_ns);
  f("step", r.step); f("name", r.name); f("calls", r.calls); f("self_cpu_ns", r.self_cpu_ns);
  f("cpu_ns", r.cpu_ns); f("source", r.source);
}
template <typename F> void Fields(CommBucketRow& r, F&& f) {
  f("step", r.step); f("bucket", r.bucket); f("start_ns", r.start_ns); f("end_ns", r.end_ns);
  f("bytes", r.bytes);
}
template <typename F> void Fields(TelemetryStatusRow& r, F&& f) {
  f("source", r.source); f("available", r.available); f("backend", r.backend);
  f("reason", r.reason);
}
template <typename F> void Fields(DiagnosticRow& r, F&& f) {
  f("ts_ns", r.ts_ns); f("level", r.level); f("source", r.source); f("message", r.message);
}
template <typename F> void Fields(StallRow& r, F&& f) {
  f("start_ns", r.start_ns); f("duration_ns", r.duration_ns);
}
template <typename F> void Fields(CpuWaitRow& r, F&& f) {
  f("start_ns", r.start_ns); f("end_ns", r.end_ns); f("wait_ns", r.wait_ns);
}
template <typename F> void Fields(InsightRow& r, F&& f) {
  f("ordinal", r.ordinal); f("rule_id", r.rule_id); f("family", r.family);
  f("severity", r.severity); f("message", r.message); f("fix", r.fix);
  f("evidence_json", r.evidence_json);
}
template <typename F> void Fields(RunInfo& r, F&& f) {
  f("run_name", r.run_name); f("group_id", r.group_id); f("rank", r.rank);
  f("world_size", r.world_size); f("hostname", r.hostname); f("pid", r.pid);
  f("start_unix_ns", r.start_unix_ns); f("start_mono_ns", r.start_mono_ns);
  f("end_ns", r.end_ns); f("status", r.status); f("error", r.error);
  f("device_kind", r.device_kind); f("gpu_backend", r.gpu_backend); f("gpu_model", r.gpu_model);
  f("gpu_count", r.gpu_count); f("dtype", r.dtype); f("flops_per_step", r.flops_per_step);
  f("flops_method", r.flops_method); f("sample_hz", r.sample_hz);
  f("gpuprof_version", r.gpuprof_version); f("python_version", r.python_version);
  f("torch_version", r.torch_version); f("config_json", r.config_json);
}

// The JSON table key per Row alternative, in variant order.
constexpr const char* kTables[] = {
    "steps",        "phases",           "phase_gpu_times", "gpus",
    "gpu_samples",  "host_samples",     "worker_samples",  "kernels",
    "comm_buckets", "telemetry_status", "diagnostics",     "gpu_samples_1s",
    "worker_samples_10s", "host_stalls", "cpu_waits", "cpu_ops"};
static_assert(std::size(kTables) == std::variant_size_v<Row>);

template <typename T> struct IsOptional : std::false_type {};
template <typename T> struct IsOptional<std::optional<T>> : std::true_type {};

void Put(json& j, const char* name, int64_t v) { j[name] = v; }
void Put(json& j, const char* name, double v) {
  j[name] = std::isfinite(v) ? json(v) : json(nullptr);
}
void Put(json& j, const char* name, bool v) { j[name] = v; }
void Put(json& j, const char* name, const std::string& v) { j[name] = v; }
void Put(json& j, const char* name, const std::vector<double>& v) {
  if (!v.empty()) j[name] = v;
}
template <typename T>
void Put(json& j, const char* name, const std::optional<T>& v) {
  if (v) {
    Put(j, name, *v);
  } else {
    j[name] = nullptr;
  }
}

// Reads one value; an error message (without the location) when it has the wrong type.
std::optional<std::string> Get(const json& v, int64_t& out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return "integer out of range";
    }
    out = v.get<int64_t>();
    return std::nullopt;
  }
  return "expected an integer, got " + std::string(v.type_name());
}
std::optional<std::string> Get(const json& v, double& out) {
  if (v.is_number()) {
    out = v.get<double>();
    return std::nullopt;
  }
  return "expected a number, got " + std::string(v.type_name());
}
std::optional<std::string> Get(const json& v, bool& out) {
  if (v.is_boolean()) {
    out = v.get<bool>();
    return std::nullopt;
  }
  return "expected true or false, got " + std::string(v.type_name());
}
std::optional<std::string> Get(const json& v, std::string& out) {
  if (v.is_string()) {
    out = v.get<std::string>();
    if (out.find('\0') != std::string::npos) return "a string holding a NUL character";
    return std::nullopt;
  }
  return "expected a string, got " + std::string(v.type_name());
}
std::optional<std::string> Get(const json& v, std::vector<double>& out) {
  if (!v.is_array()) return "expected an array of numbers, got " + std::string(v.type_name());
  out.clear();
  for (const json& x : v) {
    if (!x.is_number()) return "expected an array of numbers";
    out.push_back(x.get<double>());
  }
  return std::nullopt;
}
template <typename T>
std::optional<std::string> Get(const json& v, std::optional<T>& out) {
  if (v.is_null()) {
    out.reset();
    return std::nullopt;
  }
  T value{};
  if (auto why = Get(v, value)) return why;
  out = std::move(value);
  return std::nullopt;
}

template <typename T>
json Encode(const T& row) {
  json j = json::object();
  Fields(const_cast<T&>(row), [&](const char* name, const auto& member) { Put(j, name, member); });
  return j;
}

// Decodes one object into `row`; where() is "table[i]" for messages (built only for one).
// The hot path of a team server's ingest: no allocation beyond the row's own strings.
template <typename T, typename Where>
Status DecodeWith(const json& j, const Where& where, T& row) {
  if (!j.is_object()) return Status::Error(where() + ": expected an object, got " + j.type_name());
  Status st;
  size_t found = 0;
  Fields(row, [&](const char* name, auto& member) {
    if (!st.ok()) return;
    using M = std::decay_t<decltype(member)>;
    auto it = j.find(name);
    if (it == j.end()) {
      // Optional columns and a host sample's per-core list may be left out.
      if constexpr (!IsOptional<M>::value && !std::is_same_v<M, std::vector<double>>) {
        st = Status::Error(where() + "." + name + ": missing (required)");
      }
      return;
    }
    ++found;
    if (auto why = Get(*it, member)) st = Status::Error(where() + "." + name + ": " + *why);
  });
  if (!st.ok()) return st;
  if (found < j.size()) {  // a key that is no column: name it
    std::set<std::string> known;
    T probe{};
    Fields(probe, [&](const char* name, auto&) { known.insert(name); });
    for (const auto& [key, value] : j.items()) {
      if (!known.count(key)) return Status::Error(where() + ": unknown column '" + key + "'");
    }
  }
  return Status::Ok();
}
template <typename T>
Status Decode(const json& j, const std::string& where, T& row) {
  return DecodeWith(j, [&] { return where; }, row);
}

// The variant alternative at `index`, decoded from `j`.
template <size_t I = 0, typename Where>
Status DecodeAt(size_t index, const json& j, const Where& where, Row* out) {
  if constexpr (I < std::variant_size_v<Row>) {
    if (index == I) {
      std::variant_alternative_t<I, Row> row{};
      Status st = DecodeWith(j, where, row);
      if (st.ok()) *out = std::move(row);
      return st;
    }
    return DecodeAt<I + 1>(index, j, where, out);
  } else {
    return Status::Error(where() + ": no such table");
  }
}

}  // namespace

const char* RowJsonTable(const Row& row) { return kTables[row.index()]; }

json RowsToJson(const std::vector<Row>& rows) {
  json doc = json::object();
  for (const Row& row : rows) {
    std::visit([&](const auto& r) { doc[RowJsonTable(row)].push_back(Encode(r)); }, row);
  }
  return doc;
}

Expected<std::vector<Row>> RowsFromJson(const json& doc, size_t max_rows) {
  if (!doc.is_object()) {
    return Status::Error(std::string("rows: expected an object of tables, got ") +
                         doc.type_name());
  }
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < std::size(kTables); ++i) index_of[kTables[i]] = i;
  std::vector<Row> rows;
  for (const auto& [table, list] : doc.items()) {
    auto it = index_of.find(table);
    if (it == index_of.end()) {
      std::string names;
      for (const char* t : kTables) names += std::string(names.empty() ? "" : ", ") + t;
      return Status::Error("rows: unknown table '" + table + "' (tables: " + names + ")");
    }
    if (!list.is_array()) {
      return Status::Error("rows." + table + ": expected an array, got " + list.type_name());
    }
    if (rows.size() + list.size() > max_rows) {
      return Status::Error("rows: more than " + std::to_string(max_rows) +
                           " rows in one batch; send smaller batches");
    }
    rows.reserve(rows.size() + list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      Row row;
      const std::string& name = table;  // (clang 14 cannot capture a structured binding)
      const auto where = [&] { return name + "[" + std::to_string(i) + "]"; };
      Status st = DecodeAt(it->second, list[i], where, &row);
      if (!st.ok()) return st;
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

json InsightsToJson(const std::vector<InsightRow>& insights) {
  json list = json::array();
  for (const InsightRow& r : insights) list.push_back(Encode(r));
  return list;
}

Expected<std::vector<InsightRow>> InsightsFromJson(const json& list) {
  if (!list.is_array()) {
    return Status::Error(std::string("insights: expected an array, got ") + list.type_name());
  }
  std::vector<InsightRow> out;
  std::set<int64_t> ordinals;  // the insights table's key: a repeat would fail in the store
  for (size_t i = 0; i < list.size(); ++i) {
    InsightRow r;
    Status st = Decode(list[i], "insights[" + std::to_string(i) + "]", r);
    if (!st.ok()) return st;
    if (!ordinals.insert(r.ordinal).second) {
      return Status::Error("insights[" + std::to_string(i) + "].ordinal: " +
                           std::to_string(r.ordinal) + " is given twice (ordinals are unique)");
    }
    out.push_back(std::move(r));
  }
  return out;
}

json RunInfoToJson(const RunInfo& info) { return Encode(info); }

Expected<RunInfo> RunInfoFromJson(const json& doc) {
  RunInfo info;
  Status st = Decode(doc, "run", info);
  if (!st.ok()) return st;
  if (info.status != "running" && info.status != "ok" && info.status != "failed") {
    return Status::Error("run.status: '" + info.status + "' is not running, ok or failed");
  }
  return info;
}

}  // namespace gpuprof::store
