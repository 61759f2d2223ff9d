// The SQL of store schema v1 shared by every backend (SQLite: sqlite_store.cc, PostgreSQL:
// pg_store.cc): per Row alternative the write statement and its bind order, the run columns, and
// the reads of one run. Written in the common subset of both dialects, with `?` placeholders
// (PgStore numbers them). Templates over the backend's binder and reader:
//   Binder: Int(int64_t | optional), Real(double | optional), Text(string | optional), Null()
//           bind parameters 1, 2, 3, ... in call order (nullopt binds NULL);
//   Reader: Int(), Real(), Text(), OptInt(), OptReal(), OptText() read columns 0, 1, 2, ...
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/rows.h"
#include "store/run_store.h"
#include "util/status.h"

namespace gpuprof::store::sql {

// ---- row types -> SQL ------------------------------------------------------------------------
// One RowTraits<T> per alternative of Row: the statement (parameter 1 is always run_id) and how
// to bind a row. Upserts on primary keys make a re-write replace the earlier row.

// The nullable reads of a backend's reader (CRTP), from its IsNull(), Int(), Real(), Text() and
// Skip() (passes over the current column): SQL NULL reads as std::nullopt.
template <class Derived>
class NullableReads {
 public:
  std::optional<int64_t> OptInt() { return Read(&Derived::Int); }
  std::optional<double> OptReal() { return Read(&Derived::Real); }
  std::optional<std::string> OptText() { return Read(&Derived::Text); }

 private:
  template <typename T>
  std::optional<T> Read(T (Derived::*read)()) {
    Derived& self = static_cast<Derived&>(*this);
    if (self.IsNull()) {
      self.Skip();
      return std::nullopt;
    }
    return (self.*read)();
  }
};

template <typename T>
struct RowTraits;

template <>
struct RowTraits<StepRow> {
  static constexpr const char* kPurpose = "upsert into steps";
  static constexpr const char* kSql =
      "INSERT INTO steps(run_id, step, start_ns, end_ns, wait_ns, wait_source, forward_calls,"
      " backward_calls, optimizer_calls) VALUES(?,?,?,?,?,?,?,?,?)"
      " ON CONFLICT(run_id, step) DO UPDATE SET start_ns = excluded.start_ns,"
      " end_ns = excluded.end_ns, wait_ns = excluded.wait_ns, wait_source = excluded.wait_source,"
      " forward_calls = excluded.forward_calls, backward_calls = excluded.backward_calls,"
      " optimizer_calls = excluded.optimizer_calls";
  template <class B>
  static void Bind(B& b, const StepRow& r) {
    b.Int(r.step).Int(r.start_ns).Int(r.end_ns).Int(r.wait_ns).Text(r.wait_source);
    b.Int(r.forward_calls).Int(r.backward_calls).Int(r.optimizer_calls);
  }
};

template <>
struct RowTraits<PhaseRow> {
  static constexpr const char* kPurpose = "upsert into phases";
  // A re-write replaces wall_ns and calls. gpu_ns: a NULL in the new row keeps the stored
  // value (GPU time added by PhaseGpuRow); over a placeholder made by PhaseGpuRow (calls 0)
  // the new row's GPU time is added to the deltas already there; otherwise it replaces.
  static constexpr const char* kSql =
      "INSERT INTO phases(run_id, step, name, wall_ns, gpu_ns, calls) VALUES(?,?,?,?,?,?)"
      " ON CONFLICT(run_id, step, name) DO UPDATE SET wall_ns = excluded.wall_ns,"
      " gpu_ns = CASE WHEN excluded.gpu_ns IS NULL THEN phases.gpu_ns"
      " WHEN phases.calls = 0 THEN coalesce(phases.gpu_ns, 0) + excluded.gpu_ns"
      " ELSE excluded.gpu_ns END,"
      " calls = excluded.calls";
  template <class B>
  static void Bind(B& b, const PhaseRow& r) {
    b.Int(r.step).Text(r.name).Int(r.wall_ns).Int(r.gpu_ns).Int(r.calls);
  }
};

template <>
struct RowTraits<PhaseGpuRow> {
  static constexpr const char* kPurpose = "add gpu_ns to phases";
  // Creates a placeholder phase row (wall_ns 0, calls 0) when the CPU side is not written yet.
  static constexpr const char* kSql =
      "INSERT INTO phases(run_id, step, name, wall_ns, gpu_ns, calls) VALUES(?,?,?,0,?,0)"
      " ON CONFLICT(run_id, step, name) DO UPDATE SET"
      " gpu_ns = coalesce(phases.gpu_ns, 0) + excluded.gpu_ns";
  template <class B>
  static void Bind(B& b, const PhaseGpuRow& r) { b.Int(r.step).Text(r.name).Int(r.gpu_ns); }
};

template <>
struct RowTraits<GpuInfoRow> {
  static constexpr const char* kPurpose = "upsert into gpus";
  static constexpr const char* kSql =
      "INSERT INTO gpus(run_id, gpu_index, name, uuid, memory_total_bytes, sm_clock_max_mhz)"
      " VALUES(?,?,?,?,?,?) ON CONFLICT(run_id, gpu_index) DO UPDATE SET name = excluded.name,"
      " uuid = excluded.uuid, memory_total_bytes = excluded.memory_total_bytes,"
      " sm_clock_max_mhz = excluded.sm_clock_max_mhz";
  template <class B>
  static void Bind(B& b, const GpuInfoRow& r) {
    b.Int(r.gpu_index).Text(r.name).Text(r.uuid).Int(r.memory_total_bytes).Int(r.sm_clock_max_mhz);
  }
};

template <>
struct RowTraits<GpuSampleRow> {
  static constexpr const char* kPurpose = "insert into gpu_samples";
  static constexpr const char* kSql =
      "INSERT INTO gpu_samples(run_id, ts_ns, gpu_index, util_pct, mem_util_pct, mem_used_bytes,"
      " mem_total_bytes, proc_mem_bytes, power_mw, temp_c, sm_clock_mhz, clock_reasons,"
      " pcie_rx_bps, pcie_tx_bps) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  template <class B>
  static void Bind(B& b, const GpuSampleRow& r) {
    b.Int(r.ts_ns).Int(r.gpu_index).Real(r.util_pct).Real(r.mem_util_pct).Int(r.mem_used_bytes);
    b.Int(r.mem_total_bytes).Int(r.proc_mem_bytes).Int(r.power_mw).Real(r.temp_c);
    b.Int(r.sm_clock_mhz).Int(r.clock_reasons).Real(r.pcie_rx_bps).Real(r.pcie_tx_bps);
  }
};

// cpu_per_core is stored as JSON array text in host_core_samples; an empty vector (not
// measured) stores no row there.
inline std::optional<std::string> CoresToJson(const std::vector<double>& cores) {
  if (cores.empty()) return std::nullopt;
  return nlohmann::json(cores).dump();
}

template <>
struct RowTraits<HostSampleRow> {
  static constexpr const char* kPurpose = "insert into host_samples";
  static constexpr const char* kSql =
      "INSERT INTO host_samples(run_id, ts_ns, cpu_pct, ncores, mem_used_bytes,"
      " mem_total_bytes, page_cache_bytes, swap_in_bps, disk_read_bps, disk_read_iops,"
      " proc_cpu_pct, proc_rss_bytes) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)";
  template <class B>
  static void Bind(B& b, const HostSampleRow& r) {
    b.Int(r.ts_ns).Real(r.cpu_pct).Int(r.ncores).Int(r.mem_used_bytes);
    b.Int(r.mem_total_bytes).Int(r.page_cache_bytes).Real(r.swap_in_bps).Real(r.disk_read_bps);
    b.Real(r.disk_read_iops).Real(r.proc_cpu_pct).Int(r.proc_rss_bytes);
  }
  static constexpr const char* kCorePurpose = "insert into host_core_samples";
  static constexpr const char* kCoreSql =
      "INSERT INTO host_core_samples(run_id, ts_ns, cpu_per_core) VALUES(?,?,?)";
};

template <>
struct RowTraits<GpuRollupRow> {
  static constexpr const char* kPurpose = "upsert into gpu_samples_1s";
  static constexpr const char* kSql =
      "INSERT INTO gpu_samples_1s(run_id, ts_ns, gpu_index, samples, util_samples, util_mean_pct,"
      " util_min_pct, util_max_pct, mem_util_mean_pct, mem_used_max_bytes, mem_total_bytes,"
      " proc_mem_max_bytes, power_samples, power_mean_mw, power_max_mw, temp_max_c,"
      " sm_clock_min_mhz, sm_clock_max_mhz, clock_reasons_or, thermal_samples, throttled_samples,"
      " throttled_by_reason_samples, throttled_temp_max_c, throttled_sm_clock_min_mhz,"
      " pcie_rx_samples, pcie_rx_mean_bps, pcie_rx_max_bps, pcie_rx_high_samples,"
      " pcie_tx_max_bps) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
      " ON CONFLICT(run_id, ts_ns, gpu_index) DO UPDATE SET samples = excluded.samples,"
      " util_samples = excluded.util_samples, util_mean_pct = excluded.util_mean_pct,"
      " util_min_pct = excluded.util_min_pct, util_max_pct = excluded.util_max_pct,"
      " mem_util_mean_pct = excluded.mem_util_mean_pct,"
      " mem_used_max_bytes = excluded.mem_used_max_bytes,"
      " mem_total_bytes = excluded.mem_total_bytes,"
      " proc_mem_max_bytes = excluded.proc_mem_max_bytes,"
      " power_samples = excluded.power_samples, power_mean_mw = excluded.power_mean_mw,"
      " power_max_mw = excluded.power_max_mw, temp_max_c = excluded.temp_max_c,"
      " sm_clock_min_mhz = excluded.sm_clock_min_mhz, sm_clock_max_mhz = excluded.sm_clock_max_mhz,"
      " clock_reasons_or = excluded.clock_reasons_or, thermal_samples = excluded.thermal_samples,"
      " throttled_samples = excluded.throttled_samples,"
      " throttled_by_reason_samples = excluded.throttled_by_reason_samples,"
      " throttled_temp_max_c = excluded.throttled_temp_max_c,"
      " throttled_sm_clock_min_mhz = excluded.throttled_sm_clock_min_mhz,"
      " pcie_rx_samples = excluded.pcie_rx_samples, pcie_rx_mean_bps = excluded.pcie_rx_mean_bps,"
      " pcie_rx_max_bps = excluded.pcie_rx_max_bps,"
      " pcie_rx_high_samples = excluded.pcie_rx_high_samples,"
      " pcie_tx_max_bps = excluded.pcie_tx_max_bps";
  template <class B>
  static void Bind(B& b, const GpuRollupRow& r) {
    b.Int(r.ts_ns).Int(r.gpu_index).Int(r.samples).Int(r.util_samples).Real(r.util_mean_pct);
    b.Real(r.util_min_pct).Real(r.util_max_pct).Real(r.mem_util_mean_pct);
    b.Int(r.mem_used_max_bytes).Int(r.mem_total_bytes).Int(r.proc_mem_max_bytes);
    b.Int(r.power_samples).Real(r.power_mean_mw).Int(r.power_max_mw).Real(r.temp_max_c);
    b.Int(r.sm_clock_min_mhz).Int(r.sm_clock_max_mhz).Int(r.clock_reasons_or);
    b.Int(r.thermal_samples).Int(r.throttled_samples).Int(r.throttled_by_reason_samples);
    b.Real(r.throttled_temp_max_c).Int(r.throttled_sm_clock_min_mhz);
    b.Int(r.pcie_rx_samples).Real(r.pcie_rx_mean_bps).Real(r.pcie_rx_max_bps);
    b.Int(r.pcie_rx_high_samples).Real(r.pcie_tx_max_bps);
  }
};

template <>
struct RowTraits<WorkerRollupRow> {
  static constexpr const char* kPurpose = "upsert into worker_samples_10s";
  static constexpr const char* kSql =
      "INSERT INTO worker_samples_10s(run_id, ts_ns, pid, role, samples, cpu_samples,"
      " cpu_mean_pct, cpu_max_pct, rss_max_bytes) VALUES(?,?,?,?,?,?,?,?,?)"
      " ON CONFLICT(run_id, ts_ns, pid) DO UPDATE SET role = excluded.role,"
      " samples = excluded.samples, cpu_samples = excluded.cpu_samples,"
      " cpu_mean_pct = excluded.cpu_mean_pct, cpu_max_pct = excluded.cpu_max_pct,"
      " rss_max_bytes = excluded.rss_max_bytes";
  template <class B>
  static void Bind(B& b, const WorkerRollupRow& r) {
    b.Int(r.ts_ns).Int(r.pid).Text(r.role).Int(r.samples).Int(r.cpu_samples);
    b.Real(r.cpu_mean_pct).Real(r.cpu_max_pct).Int(r.rss_max_bytes);
  }
};

template <>
struct RowTraits<WorkerSampleRow> {
  static constexpr const char* kPurpose = "insert into worker_samples";
  static constexpr const char* kSql =
      "INSERT INTO worker_samples(run_id, ts_ns, pid, role, cpu_pct, rss_bytes)"
      " VALUES(?,?,?,?,?,?)";
  template <class B>
  static void Bind(B& b, const WorkerSampleRow& r) {
    b.Int(r.ts_ns).Int(r.pid).Text(r.role).Real(r.cpu_pct).Int(r.rss_bytes);
  }
};

template <>
struct RowTraits<KernelRow> {
  static constexpr const char* kPurpose = "insert into kernels";
  static constexpr const char* kSql =
      "INSERT INTO kernels(run_id, window_start_ns, window_end_ns, name, calls, gpu_ns, source,"
      " step, device, stream, grid, block, min_ns, max_ns) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  template <class B>
  static void Bind(B& b, const KernelRow& r) {
    b.Int(r.window_start_ns).Int(r.window_end_ns).Text(r.name).Int(r.calls).Int(r.gpu_ns);
    b.Text(r.source).Int(r.step).Int(r.device).Int(r.stream).Text(r.grid).Text(r.block);
    b.Int(r.min_ns).Int(r.max_ns);
  }
};

template <>
struct RowTraits<CpuOpRow> {
  static constexpr const char* kPurpose = "insert into cpu_ops";
  static constexpr const char* kSql =
      "INSERT INTO cpu_ops(run_id, window_start_ns, window_end_ns, step, name, calls,"
      " self_cpu_ns, cpu_ns, source) VALUES(?,?,?,?,?,?,?,?,?)";
  template <class B>
  static void Bind(B& b, const CpuOpRow& r) {
    b.Int(r.window_start_ns).Int(r.window_end_ns).Int(r.step).Text(r.name).Int(r.calls);
    b.Int(r.self_cpu_ns).Int(r.cpu_ns).Text(r.source);
  }
};

template <>
struct RowTraits<CommBucketRow> {
  static constexpr const char* kPurpose = "insert into comm_buckets";
  static constexpr const char* kSql =
      "INSERT INTO comm_buckets(run_id, step, bucket, start_ns, end_ns, bytes) VALUES(?,?,?,?,?,?)";
  template <class B>
  static void Bind(B& b, const CommBucketRow& r) {
    b.Int(r.step).Int(r.bucket).Int(r.start_ns).Int(r.end_ns).Int(r.bytes);
  }
};

template <>
struct RowTraits<StallRow> {
  static constexpr const char* kPurpose = "insert into host_stalls";
  static constexpr const char* kSql =
      "INSERT INTO host_stalls(run_id, start_ns, duration_ns) VALUES(?,?,?)";
  template <class B>
  static void Bind(B& b, const StallRow& r) { b.Int(r.start_ns).Int(r.duration_ns); }
};

template <>
struct RowTraits<CpuWaitRow> {
  static constexpr const char* kPurpose = "insert into cpu_waits";
  static constexpr const char* kSql =
      "INSERT INTO cpu_waits(run_id, start_ns, end_ns, wait_ns) VALUES(?,?,?,?)";
  template <class B>
  static void Bind(B& b, const CpuWaitRow& r) {
    b.Int(r.start_ns).Int(r.end_ns).Int(r.wait_ns);
  }
};

template <>
struct RowTraits<TelemetryStatusRow> {
  static constexpr const char* kPurpose = "upsert into telemetry_status";
  static constexpr const char* kSql =
      "INSERT INTO telemetry_status(run_id, source, available, backend, reason) VALUES(?,?,?,?,?)"
      " ON CONFLICT(run_id, source) DO UPDATE SET available = excluded.available,"
      " backend = excluded.backend, reason = excluded.reason";
  template <class B>
  static void Bind(B& b, const TelemetryStatusRow& r) {
    b.Text(r.source).Int(int64_t{r.available ? 1 : 0}).Text(r.backend).Text(r.reason);
  }
};

template <>
struct RowTraits<DiagnosticRow> {
  static constexpr const char* kPurpose = "insert into diagnostics";
  static constexpr const char* kSql =
      "INSERT INTO diagnostics(run_id, ts_ns, level, source, message) VALUES(?,?,?,?,?)";
  template <class B>
  static void Bind(B& b, const DiagnosticRow& r) {
    b.Int(r.ts_ns).Text(r.level).Text(r.source).Text(r.message);
  }
};

// ---- runs ------------------------------------------------------------------------------------

inline constexpr const char* kRunColumns =
    "run_id, run_name, group_id, rank, world_size, hostname, pid, start_unix_ns, start_mono_ns,"
    " end_ns, status, error, device_kind, gpu_backend, gpu_model, gpu_count, dtype,"
    " flops_per_step, flops_method, sample_hz, gpuprof_version, python_version, torch_version,"
    " config_json";

template <class R>
RunInfo ReadRunInfo(R& c) {
  RunInfo r;
  r.run_id = c.Int();
  r.run_name = c.Text();
  r.group_id = c.OptText();
  r.rank = c.OptInt();
  r.world_size = c.OptInt();
  r.hostname = c.OptText().value_or("");
  r.pid = c.OptInt().value_or(0);
  r.start_unix_ns = c.Int();
  r.start_mono_ns = c.Int();
  r.end_ns = c.OptInt();
  r.status = c.Text();
  r.error = c.OptText();
  r.device_kind = c.OptText();
  r.gpu_backend = c.OptText();
  r.gpu_model = c.OptText();
  r.gpu_count = c.OptInt();
  r.dtype = c.OptText();
  r.flops_per_step = c.OptReal();
  r.flops_method = c.OptText();
  r.sample_hz = c.OptReal();
  r.gpuprof_version = c.Text();
  r.python_version = c.OptText();
  r.torch_version = c.OptText();
  r.config_json = c.OptText();
  return r;
}

inline constexpr const char* kInsertRunSql =
    "INSERT INTO runs(run_name, group_id, rank, world_size, hostname, pid,"
    " start_unix_ns, start_mono_ns, end_ns, status, error, device_kind,"
    " gpu_backend, gpu_model, gpu_count, dtype, flops_per_step, flops_method,"
    " sample_hz, gpuprof_version, python_version, torch_version, config_json)"
    " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
template <class B>
void BindRunInsert(B& b, const RunInfo& info, const std::string& version) {
  b.Text(info.run_name).Text(info.group_id).Int(info.rank).Int(info.world_size);
  b.Text(info.hostname).Int(info.pid).Int(info.start_unix_ns).Int(info.start_mono_ns);
  b.Int(info.end_ns).Text(info.status).Text(info.error).Text(info.device_kind);
  b.Text(info.gpu_backend).Text(info.gpu_model).Int(info.gpu_count).Text(info.dtype);
  b.Real(info.flops_per_step).Text(info.flops_method).Real(info.sample_hz).Text(version);
  b.Text(info.python_version).Text(info.torch_version).Text(info.config_json);
}

inline constexpr const char* kFinishRunSql =
    "UPDATE runs SET status = ?, end_ns = ?, error = ? WHERE run_id = ?";

inline constexpr const char* kUpdateRunSql =
    "UPDATE runs SET group_id = ?, rank = ?, world_size = ?, device_kind = ?,"
    " gpu_backend = ?, gpu_model = ?, gpu_count = ?, dtype = ?,"
    " flops_per_step = ?, flops_method = ?, sample_hz = ?,"
    " python_version = ?, torch_version = ?, config_json = ?"
    " WHERE run_id = ?";
template <class B>
void BindRunUpdate(B& b, const RunInfo& info) {
  b.Text(info.group_id).Int(info.rank).Int(info.world_size).Text(info.device_kind);
  b.Text(info.gpu_backend).Text(info.gpu_model).Int(info.gpu_count).Text(info.dtype);
  b.Real(info.flops_per_step).Text(info.flops_method).Real(info.sample_hz);
  b.Text(info.python_version).Text(info.torch_version).Text(info.config_json).Int(info.run_id);
}

// Parameters: run_name, before_run_id, Limit(limit).
inline const std::string kPreviousRunsSql =
    std::string("SELECT ") + kRunColumns +
    " FROM runs WHERE run_name = ? AND run_id < ? AND status <> 'running'"
    " ORDER BY run_id DESC LIMIT ?";

inline constexpr const char* kDeleteInsightsSql = "DELETE FROM insights WHERE run_id = ?";
inline constexpr const char* kInsertInsightSql =
    "INSERT INTO insights(run_id, ordinal, rule_id, family, severity, message,"
    " fix, evidence_json) VALUES(?,?,?,?,?,?,?,?)";
template <class B>
void BindInsight(B& b, int64_t run_id, const InsightRow& r) {
  b.Int(run_id).Int(r.ordinal).Text(r.rule_id).Text(r.family).Text(r.severity);
  b.Text(r.message).Text(r.fix).Text(r.evidence_json);
}

// A team server's bookkeeping.
inline constexpr const char* kIngestRunIdSql = "SELECT run_id FROM ingest_runs WHERE run_uuid = ?";
inline constexpr const char* kInsertIngestRunSql =
    "INSERT INTO ingest_runs(run_uuid, run_id) VALUES(?, ?)";
inline constexpr const char* kIngestBatchSeenSql =
    "SELECT 1 FROM ingest_batches WHERE run_id = ? AND batch_id = ?";
inline constexpr const char* kInsertIngestBatchSql =
    "INSERT INTO ingest_batches(run_id, batch_id, row_count, received_unix_ns) VALUES(?, ?, ?, ?)";

// Row readers shared by LoadRun and the light per-table loads.
inline constexpr const char* kStepsSql =
    "SELECT step, start_ns, end_ns, wait_ns, wait_source, forward_calls, backward_calls,"
    " optimizer_calls FROM steps WHERE run_id = ? ORDER BY step";
inline constexpr const char* kPhasesSql =
    "SELECT step, name, wall_ns, gpu_ns, calls FROM phases WHERE run_id = ?"
    " ORDER BY step, name";
template <class R>
PhaseRow ReadPhase(R& c) {
  PhaseRow r;
  r.step = c.Int();
  r.name = c.Text();
  r.wall_ns = c.Int();
  r.gpu_ns = c.OptInt();
  r.calls = c.Int();
  return r;
}
inline constexpr const char* kCommBucketsSql =
    "SELECT step, bucket, start_ns, end_ns, bytes FROM comm_buckets WHERE run_id = ?"
    " ORDER BY step, bucket, start_ns";

template <class R>
StepRow ReadStep(R& c) {
  StepRow r;
  r.step = c.Int();
  r.start_ns = c.Int();
  r.end_ns = c.Int();
  r.wait_ns = c.OptInt();
  r.wait_source = c.OptText();
  r.forward_calls = c.Int();
  r.backward_calls = c.Int();
  r.optimizer_calls = c.Int();
  return r;
}

template <class R>
CommBucketRow ReadCommBucket(R& c) {
  CommBucketRow r;
  r.step = c.Int();
  r.bucket = c.Int();
  r.start_ns = c.Int();
  r.end_ns = c.Int();
  r.bytes = c.OptInt();
  return r;
}

// A run's kernel windows (parameter: run_id), LoadRun's order. kKernelsSql reads a file older
// than the launch columns (LoadDialect::has_kernel_launch_columns false).
inline constexpr const char* kKernelsSql =
    "SELECT window_start_ns, window_end_ns, name, calls, gpu_ns, source, step, device, stream,"
    " grid, block, min_ns, max_ns FROM kernels"
    " WHERE run_id = ? ORDER BY window_start_ns, name, source";
inline constexpr const char* kKernelsOldSql =
    "SELECT window_start_ns, window_end_ns, name, calls, gpu_ns, source FROM kernels"
    " WHERE run_id = ? ORDER BY window_start_ns, name, source";
template <class R>
KernelRow ReadKernel(R& c, bool launch_columns = true) {
  KernelRow r;
  r.window_start_ns = c.Int();
  r.window_end_ns = c.Int();
  r.name = c.Text();
  r.calls = c.Int();
  r.gpu_ns = c.Int();
  r.source = c.Text();
  if (!launch_columns) return r;
  r.step = c.OptInt();
  r.device = c.OptInt();
  r.stream = c.OptInt();
  r.grid = c.OptText();
  r.block = c.OptText();
  r.min_ns = c.OptInt();
  r.max_ns = c.OptInt();
  return r;
}

// Columns added to kernels after the first files were written (name, type). A writer opening an
// older file or database adds them (and creates tables it lacks) before writing.
inline constexpr std::pair<const char*, const char*> kKernelLaunchColumns[] = {
    {"step", "BIGINT"}, {"device", "BIGINT"}, {"stream", "BIGINT"}, {"grid", "TEXT"},
    {"block", "TEXT"},  {"min_ns", "BIGINT"}, {"max_ns", "BIGINT"}};

// A run's CPU operator windows (parameter: run_id).
inline constexpr const char* kCpuOpsSql =
    "SELECT window_start_ns, window_end_ns, step, name, calls, self_cpu_ns, cpu_ns, source"
    " FROM cpu_ops WHERE run_id = ? ORDER BY window_start_ns, name";
template <class R>
CpuOpRow ReadCpuOp(R& c) {
  CpuOpRow r;
  r.window_start_ns = c.Int();
  r.window_end_ns = c.Int();
  r.step = c.OptInt();
  r.name = c.Text();
  r.calls = c.Int();
  r.self_cpu_ns = c.Int();
  r.cpu_ns = c.OptInt();
  r.source = c.Text();
  return r;
}

// LatestGpuSecond's query (parameters: run_id twice) and its row.
inline constexpr const char* kLatestGpuSecondSql =
    "SELECT ts_ns, gpu_index, util_mean_pct, mem_used_max_bytes, power_mean_mw, temp_max_c"
    " FROM gpu_samples_1s WHERE run_id = ? AND ts_ns = (SELECT max(ts_ns) FROM gpu_samples_1s"
    " WHERE run_id = ?) ORDER BY gpu_index";
template <class R>
GpuRollupRow ReadLatestGpu(R& c) {
  GpuRollupRow r;
  r.ts_ns = c.Int();
  r.gpu_index = c.Int();
  r.util_mean_pct = c.OptReal();
  r.mem_used_max_bytes = c.OptInt();
  r.power_mean_mw = c.OptReal();
  r.temp_max_c = c.OptReal();
  return r;
}

// ScanGpuSeries' query (parameters: run_id, from_ns, to_ns, and gpu_index when `one_gpu`);
// its rows read with ReadSeriesRow(c, true, 4). The index gpu_samples_1s_series covers it.
inline std::string GpuSeriesSql(bool one_gpu) {
  return std::string(
             "SELECT ts_ns, gpu_index, util_mean_pct, mem_used_max_bytes, power_mean_mw,"
             " temp_max_c FROM gpu_samples_1s WHERE run_id = ? AND ts_ns BETWEEN ? AND ?") +
         (one_gpu ? " AND gpu_index = ?" : "") + " ORDER BY gpu_index, ts_ns";
}

// ScanHostSeries' query (parameters: run_id, from_ns, to_ns); rows: ReadSeriesRow(c, false, 5).
inline constexpr const char* kHostSeriesSql =
    "SELECT ts_ns, cpu_pct, mem_used_bytes, disk_read_bps, proc_cpu_pct, proc_rss_bytes"
    " FROM host_samples WHERE run_id = ? AND ts_ns BETWEEN ? AND ? ORDER BY ts_ns";
template <class R>
SeriesRow ReadSeriesRow(R& c, bool gpu, int values) {
  SeriesRow r;
  r.ts_ns = c.Int();
  if (gpu) r.gpu_index = c.Int();
  for (int i = 0; i < values; ++i) {
    if (const std::optional<double> v = c.OptReal()) {
      r.v[i] = *v;
      r.known |= 1u << i;
    }
  }
  return r;
}

// ScanStepBreakdown for a backend whose query(sql, purpose, bind, row) calls row(reader) per
// result row: the phases as (step, kind, wall, gpu) numbers first, then the comm_buckets summed
// per step, then the steps in order, merged. A step with comm_buckets rows and no recorded
// "comm" phase gets the one analysis::BuildRunView derives (run_view.h): its exposed
// communication, max(end_ns) - max(start_ns) of its buckets, at least 0 and at most its backward
// phase's wall, which loses as much.
template <class QueryFn>
Status ScanStepBreakdownWith(QueryFn query, int64_t run_id, const StepBreakdownFn& each) {
  struct Phase {
    int64_t step, wall, gpu;
    int kind;  // 0-3: forward, backward, optimizer, comm; 4: another name
    bool has_gpu;
  };
  std::vector<Phase> phases;
  Status st = query(
      "SELECT step, CASE name WHEN 'forward' THEN 0 WHEN 'backward' THEN 1"
      " WHEN 'optimizer' THEN 2 WHEN 'comm' THEN 3 ELSE 4 END, wall_ns, gpu_ns"
      " FROM phases WHERE run_id = ? ORDER BY step",
      "scan phases", [&](auto& b) { b.Int(run_id); },
      [&](auto& c) {
        Phase p{};
        p.step = c.Int();
        p.kind = static_cast<int>(c.Int());
        p.wall = c.Int();
        const std::optional<int64_t> gpu = c.OptInt();
        p.gpu = gpu.value_or(0);
        p.has_gpu = gpu.has_value();
        phases.push_back(p);
        return Status::Ok();
      });
  if (!st.ok()) return st;
  struct Comm {
    int64_t step, exposed;
  };
  std::vector<Comm> comms;
  st = query(
      "SELECT step, MAX(end_ns) - MAX(start_ns) FROM comm_buckets WHERE run_id = ?"
      " GROUP BY step ORDER BY step",
      "scan comm_buckets", [&](auto& b) { b.Int(run_id); },
      [&](auto& c) {
        Comm m{};
        m.step = c.Int();
        m.exposed = c.Int();
        comms.push_back(m);
        return Status::Ok();
      });
  if (!st.ok()) return st;
  size_t k = 0, m = 0;
  return query(
      "SELECT step, end_ns - start_ns, wait_ns FROM steps WHERE run_id = ? ORDER BY step",
      "scan steps", [&](auto& b) { b.Int(run_id); },
      [&](auto& c) {
        StepBreakdownRow r;
        r.step = c.Int();
        r.duration_ns = c.Int();
        r.wait_ns = c.OptInt();
        bool backward = false;
        while (k < phases.size() && phases[k].step < r.step) ++k;
        for (; k < phases.size() && phases[k].step == r.step; ++k) {
          const Phase& p = phases[k];
          if (p.kind < 4) {
            r.phase_ns[p.kind] += p.wall;
          } else {
            r.other_phase_ns += p.wall;
          }
          r.comm = r.comm || p.kind == 3;
          backward = backward || p.kind == 1;
          if (p.has_gpu) {
            r.gpu_ns += p.gpu;
            r.gpu_known = true;
          }
        }
        while (m < comms.size() && comms[m].step < r.step) ++m;
        if (m < comms.size() && comms[m].step == r.step && !r.comm) {
          int64_t exposed = std::max<int64_t>(0, comms[m].exposed);
          if (backward) {
            exposed = std::min(exposed, std::max<int64_t>(0, r.phase_ns[1]));
            r.phase_ns[1] -= exposed;
          }
          r.phase_ns[3] = exposed;
          r.comm = true;
        }
        each(r);
        return Status::Ok();
      });
}

// LoadRunProgress' two queries: the counts and newest times (parameters: run_id five times),
// and the headline insight (parameter: run_id).
inline constexpr const char* kRunProgressSql =
    "SELECT (SELECT count(*) FROM steps WHERE run_id = ?),"
    " (SELECT max(step) FROM steps WHERE run_id = ?),"
    " (SELECT max(end_ns) FROM steps WHERE run_id = ?),"
    " (SELECT max(ts_ns) FROM gpu_samples_1s WHERE run_id = ?),"
    " (SELECT max(ts_ns) FROM host_samples WHERE run_id = ?)";
template <class R>
RunProgress ReadRunProgress(R& c) {
  RunProgress p;
  p.steps = c.Int();
  p.last_step = c.OptInt();
  p.last_step_end_ns = c.OptInt();
  const std::optional<int64_t> gpu = c.OptInt();
  const std::optional<int64_t> host = c.OptInt();
  p.last_sample_ns = gpu && host ? std::max(*gpu, *host) : gpu ? gpu : host;
  return p;
}
// A run's insights in ordinal order (parameter: run_id), read with ReadInsight; LIMIT 1 of it
// is the headline (LoadRunProgress).
inline constexpr const char* kInsightsSql =
    "SELECT ordinal, rule_id, family, severity, message, fix, evidence_json FROM insights"
    " WHERE run_id = ? ORDER BY ordinal";
inline const std::string kHeadlineSql = std::string(kInsightsSql) + " LIMIT 1";
template <class R>
InsightRow ReadInsight(R& c) {
  InsightRow r;
  r.ordinal = c.Int();
  r.rule_id = c.Text();
  r.family = c.Text();
  r.severity = c.Text();
  r.message = c.Text();
  r.fix = c.OptText();
  r.evidence_json = c.OptText();
  return r;
}

// LIMIT's operand for "at most `limit` rows, all when negative" (both dialects take a bound).
inline int64_t Limit(int limit) { return limit < 0 ? INT64_MAX : int64_t{limit}; }

// One series metric's (ts_ns, value) rows of a run in [from, to]: parameters run_id, from_ns,
// to_ns and, per GPU, gpu_index.
inline std::string SeriesSql(const SeriesColumn& c) {
  return std::string("SELECT ts_ns, ") + c.column + " FROM " + c.table +
         " WHERE run_id = ? AND ts_ns BETWEEN ? AND ? AND " + c.column + " IS NOT NULL" +
         (c.per_gpu ? " AND gpu_index = ?" : "") + " ORDER BY ts_ns";
}

// What differs between the backends in LoadRunTables.
struct LoadDialect {
  // Whether host_stalls and cpu_waits exist (a read-only SQLite file may predate them).
  bool has_stalls_tables = true;
  // Whether cpu_ops exists and kernels has the launch columns (step .. max_ns).
  bool has_cpu_ops_table = true;
  bool has_kernel_launch_columns = true;
  // The column that orders rows inserted with equal keys (SQLite's rowid, Postgres' seq).
  std::string insertion_order = "rowid";
};

// Loads every table of RunData but `run` into *d, through the backend's
//   query(sql, purpose, bind(Binder&), each(Reader&) -> Status) -> Status
// with LoadRun's orderings (sqlite_store.h). The first error wins.
template <class QueryFn>
Status LoadRunTables(QueryFn&& query, int64_t run_id, const LoadDialect& dialect, RunData& d) {
  Status st;
  auto by_run = [run_id](auto& b) { b.Int(run_id); };
  auto ok = [] { return Status::Ok(); };
  // One (sql, reader) pair per table; the first error wins.
  auto load = [&](const std::string& sql, const char* purpose, auto each) {
    if (st.ok()) st = query(sql, purpose, by_run, each);
  };
  // Sizes the long tables first (an indexed count), so that a long run's rows are not copied
  // through doubling vectors: that would briefly hold up to three times their memory.
  auto reserve = [&](auto& rows, const char* table) {
    if (!st.ok()) return;
    st = query(
        std::string("SELECT count(*) FROM ") + table + " WHERE run_id = ?",
        std::string("count ") + table, by_run, [&](auto& c) {
          rows.reserve(static_cast<size_t>(c.Int()));
          return ok();
        });
  };
  reserve(d.steps, "steps");
  reserve(d.phases, "phases");
  reserve(d.gpu_samples_1s, "gpu_samples_1s");
  reserve(d.host_samples, "host_samples");
  reserve(d.worker_samples_10s, "worker_samples_10s");
  load(kStepsSql, "load steps", [&](auto& c) {
    d.steps.push_back(ReadStep(c));
    return ok();
  });
  load(kPhasesSql, "load phases", [&](auto& c) {
    d.phases.push_back(ReadPhase(c));
    return ok();
  });
  load(
      "SELECT gpu_index, name, uuid, memory_total_bytes, sm_clock_max_mhz FROM gpus"
      " WHERE run_id = ? ORDER BY gpu_index",
      "load gpus", [&](auto& c) {
        GpuInfoRow& r = d.gpus.emplace_back();
        r.gpu_index = c.Int();
        r.name = c.OptText();
        r.uuid = c.OptText();
        r.memory_total_bytes = c.OptInt();
        r.sm_clock_max_mhz = c.OptInt();
        return ok();
      });
  load(
      "SELECT ts_ns, gpu_index, samples, util_samples, util_mean_pct, util_min_pct,"
      " util_max_pct, mem_util_mean_pct, mem_used_max_bytes, mem_total_bytes,"
      " proc_mem_max_bytes, power_samples, power_mean_mw, power_max_mw, temp_max_c,"
      " sm_clock_min_mhz, sm_clock_max_mhz, clock_reasons_or, thermal_samples,"
      " throttled_samples, throttled_by_reason_samples, throttled_temp_max_c,"
      " throttled_sm_clock_min_mhz, pcie_rx_samples, pcie_rx_mean_bps, pcie_rx_max_bps,"
      " pcie_rx_high_samples, pcie_tx_max_bps"
      " FROM gpu_samples_1s WHERE run_id = ? ORDER BY ts_ns, gpu_index",
      "load gpu_samples_1s", [&](auto& c) {
        GpuRollupRow& r = d.gpu_samples_1s.emplace_back();
        r.ts_ns = c.Int();
        r.gpu_index = c.Int();
        r.samples = c.Int();
        r.util_samples = c.Int();
        r.util_mean_pct = c.OptReal();
        r.util_min_pct = c.OptReal();
        r.util_max_pct = c.OptReal();
        r.mem_util_mean_pct = c.OptReal();
        r.mem_used_max_bytes = c.OptInt();
        r.mem_total_bytes = c.OptInt();
        r.proc_mem_max_bytes = c.OptInt();
        r.power_samples = c.Int();
        r.power_mean_mw = c.OptReal();
        r.power_max_mw = c.OptInt();
        r.temp_max_c = c.OptReal();
        r.sm_clock_min_mhz = c.OptInt();
        r.sm_clock_max_mhz = c.OptInt();
        r.clock_reasons_or = c.OptInt();
        r.thermal_samples = c.Int();
        r.throttled_samples = c.Int();
        r.throttled_by_reason_samples = c.Int();
        r.throttled_temp_max_c = c.OptReal();
        r.throttled_sm_clock_min_mhz = c.OptInt();
        r.pcie_rx_samples = c.Int();
        r.pcie_rx_mean_bps = c.OptReal();
        r.pcie_rx_max_bps = c.OptReal();
        r.pcie_rx_high_samples = c.Int();
        r.pcie_tx_max_bps = c.OptReal();
        return ok();
      });
  load(
      "SELECT ts_ns, cpu_pct, ncores, mem_used_bytes, mem_total_bytes, page_cache_bytes,"
      " swap_in_bps, disk_read_bps, disk_read_iops, proc_cpu_pct, proc_rss_bytes"
      " FROM host_samples WHERE run_id = ? ORDER BY ts_ns",
      "load host_samples", [&](auto& c) {
        HostSampleRow& r = d.host_samples.emplace_back();
        r.ts_ns = c.Int();
        r.cpu_pct = c.OptReal();
        r.ncores = c.OptInt();
        r.mem_used_bytes = c.OptInt();
        r.mem_total_bytes = c.OptInt();
        r.page_cache_bytes = c.OptInt();
        r.swap_in_bps = c.OptReal();
        r.disk_read_bps = c.OptReal();
        r.disk_read_iops = c.OptReal();
        r.proc_cpu_pct = c.OptReal();
        r.proc_rss_bytes = c.OptInt();
        return ok();
      });
  load(
      "SELECT ts_ns, pid, role, samples, cpu_samples, cpu_mean_pct, cpu_max_pct, rss_max_bytes"
      " FROM worker_samples_10s WHERE run_id = ? ORDER BY ts_ns, pid",
      "load worker_samples_10s", [&](auto& c) {
        WorkerRollupRow& r = d.worker_samples_10s.emplace_back();
        r.ts_ns = c.Int();
        r.pid = c.Int();
        r.role = c.Text();
        r.samples = c.Int();
        r.cpu_samples = c.Int();
        r.cpu_mean_pct = c.OptReal();
        r.cpu_max_pct = c.OptReal();
        r.rss_max_bytes = c.OptInt();
        return ok();
      });
  load(dialect.has_kernel_launch_columns ? kKernelsSql : kKernelsOldSql, "load kernels",
       [&](auto& c) {
         d.kernels.push_back(ReadKernel(c, dialect.has_kernel_launch_columns));
         return ok();
       });
  if (dialect.has_cpu_ops_table) {
    load(kCpuOpsSql, "load cpu_ops", [&](auto& c) {
      d.cpu_ops.push_back(ReadCpuOp(c));
      return ok();
    });
  }
  load(kCommBucketsSql, "load comm_buckets", [&](auto& c) {
    d.comm_buckets.push_back(ReadCommBucket(c));
    return ok();
  });
  if (dialect.has_stalls_tables) {
    load("SELECT start_ns, duration_ns FROM host_stalls WHERE run_id = ? ORDER BY start_ns",
         "load host_stalls", [&](auto& c) {
           StallRow& r = d.stalls.emplace_back();
           r.start_ns = c.Int();
           r.duration_ns = c.Int();
           return ok();
         });
  }
  if (dialect.has_stalls_tables) {
    load("SELECT start_ns, end_ns, wait_ns FROM cpu_waits WHERE run_id = ? ORDER BY start_ns",
         "load cpu_waits", [&](auto& c) {
           CpuWaitRow& r = d.cpu_waits.emplace_back();
           r.start_ns = c.Int();
           r.end_ns = c.Int();
           r.wait_ns = c.Int();
           return ok();
         });
  }
  load(
      "SELECT source, available, backend, reason FROM telemetry_status WHERE run_id = ?"
      " ORDER BY source",
      "load telemetry_status", [&](auto& c) {
        TelemetryStatusRow& r = d.telemetry.emplace_back();
        r.source = c.Text();
        r.available = c.Int() != 0;
        r.backend = c.OptText();
        r.reason = c.OptText();
        return ok();
      });
  load(
      // Rows without a timestamp come first; equal timestamps keep insertion order.
      std::string("SELECT ts_ns, level, source, message FROM diagnostics WHERE run_id = ?"
                  " ORDER BY ts_ns NULLS FIRST, ") + dialect.insertion_order,
      "load diagnostics", [&](auto& c) {
        DiagnosticRow& r = d.diagnostics.emplace_back();
        r.ts_ns = c.OptInt();
        r.level = c.Text();
        r.source = c.Text();
        r.message = c.Text();
        return ok();
      });
  load(kInsightsSql, "load insights", [&](auto& c) {
    d.insights.push_back(ReadInsight(c));
    return ok();
  });
  return st;
}

}  // namespace gpuprof::store::sql
