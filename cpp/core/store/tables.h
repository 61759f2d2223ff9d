// The column list of every table the store writes rows into: one Table<T> per row type of
// store/rows.h, a compile-time list of {column name, member pointer, role}. Everything that
// names the columns of a table is made from it:
//   - the INSERT / upsert statement, its bind order, the SELECT list and the read code
//     (store/table_sql.h, for every backend: SQLite and PostgreSQL),
//   - the JSON form of a row (store/row_json.cc: what a client pushes and the server decodes).
// store/schema.sql stays the DDL (types, NOT NULL, keys, indexes, comments); the test
// "EveryDescriptorMatchesTheSchema" (sqlite_store_test.cc, and pg_store_test.cc on PostgreSQL)
// compares each Table<T> with the columns of a freshly created store, so the two cannot drift.
//
// Adding a column: the member in rows.h, one Col(...) line here and the column in schema.sql
// (at the same place: the test checks the order too). Existing files lack it: mark it
// Col<kAdded>, and a writer's Open adds it (ALTER TABLE ... ADD COLUMN, SQLite and PostgreSQL)
// and a read-only LoadRun of an older file reads it as its default (LoadDialect::old_tables).
//
// Columns are listed in schema.sql's order; a row's `run_id` (every table but `runs`) is not a
// member: the writer binds it first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "store/rows.h"

namespace gpuprof::store {

// A column's role, a bit set (a template argument, so that walkers decide at compile time).
enum ColumnFlag : unsigned {
  kKey = 1u << 0,        // part of the primary key after run_id: the upsert's conflict target
  kAssigned = 1u << 1,   // assigned by the store (runs.run_id): read back, never written or sent
  kNotStored = 1u << 2,  // in the row and its JSON, not a column of this table
                         // (host_samples' cpu_per_core goes to host_core_samples)
  kMutable = 1u << 3,    // runs: rewritten by UpdateRunFields
  kAdded = 1u << 4,      // added after the first files: an older file or database lacks it
};

// One column held in member `member` of row type R. `on_conflict` (upserts only) is the SET
// expression when the row's key is already stored; nullptr: excluded.<name> (the new value).
template <class R, class M, unsigned Flags>
struct Column {
  using Row = R;
  using Member = M;
  static constexpr unsigned kFlags = Flags;
  const char* name;
  M R::*member;
  const char* on_conflict = nullptr;
};

// A column that a row type writes as a constant (SQL literal `value`) and never reads: the
// placeholder phase row of PhaseGpuRow (wall_ns 0, calls 0). An upsert leaves it as stored.
struct FixedColumn {
  const char* name;
  const char* value;
};

template <unsigned Flags = 0, class R, class M>
constexpr Column<R, M, Flags> Col(const char* name, M R::*member,
                                  const char* on_conflict = nullptr) {
  return {name, member, on_conflict};
}
constexpr FixedColumn Fixed(const char* name, const char* value) { return {name, value}; }

// What a table's Table<T> may leave out.
struct TableDefaults {
  static constexpr bool kUpsert = false;  // INSERT ... ON CONFLICT(run_id, keys) DO UPDATE
  static constexpr bool kPerRun = true;   // rows belong to a run: run_id is the first column
};

// Per row type: kName (the table), kColumns, TableDefaults' members where they differ, and
// optionally kPurpose (what its write is called in errors; default "insert into <kName>" or
// "upsert into <kName>") and kJsonName (its key in row_json's batches; default kName).
template <class T>
struct Table;

template <>
struct Table<RunInfo> : TableDefaults {
  static constexpr const char* kName = "runs";
  static constexpr bool kPerRun = false;
  static constexpr auto kColumns =
      std::tuple{Col<kAssigned>("run_id", &RunInfo::run_id),
                 Col("run_name", &RunInfo::run_name),
                 Col<kMutable>("group_id", &RunInfo::group_id),
                 Col<kMutable>("rank", &RunInfo::rank),
                 Col<kMutable>("world_size", &RunInfo::world_size),
                 Col("hostname", &RunInfo::hostname),  // NULL reads as ""
                 Col("pid", &RunInfo::pid),            // NULL reads as 0
                 Col("start_unix_ns", &RunInfo::start_unix_ns),
                 Col("start_mono_ns", &RunInfo::start_mono_ns),
                 Col("end_ns", &RunInfo::end_ns),
                 Col("status", &RunInfo::status),
                 Col("error", &RunInfo::error),
                 Col<kMutable>("device_kind", &RunInfo::device_kind),
                 Col<kMutable>("gpu_backend", &RunInfo::gpu_backend),
                 Col<kMutable>("gpu_model", &RunInfo::gpu_model),
                 Col<kMutable>("gpu_count", &RunInfo::gpu_count),
                 Col<kMutable>("dtype", &RunInfo::dtype),
                 Col<kMutable>("flops_per_step", &RunInfo::flops_per_step),
                 Col<kMutable>("flops_method", &RunInfo::flops_method),
                 Col<kMutable>("sample_hz", &RunInfo::sample_hz),
                 Col("gpuprof_version", &RunInfo::gpuprof_version),
                 Col<kMutable>("python_version", &RunInfo::python_version),
                 Col<kMutable>("torch_version", &RunInfo::torch_version),
                 Col<kMutable>("config_json", &RunInfo::config_json)};
};

template <>
struct Table<StepRow> : TableDefaults {
  static constexpr const char* kName = "steps";
  static constexpr bool kUpsert = true;
  static constexpr auto kColumns =
      std::tuple{Col<kKey>("step", &StepRow::step),
                 Col("start_ns", &StepRow::start_ns),
                 Col("end_ns", &StepRow::end_ns),
                 Col("wait_ns", &StepRow::wait_ns),
                 Col("wait_source", &StepRow::wait_source),
                 Col("forward_calls", &StepRow::forward_calls),
                 Col("backward_calls", &StepRow::backward_calls),
                 Col("optimizer_calls", &StepRow::optimizer_calls),
                 Col<kAdded>("loader_starts", &StepRow::loader_starts),
                 Col<kAdded>("loader_start_ns", &StepRow::loader_start_ns)};
};

template <>
struct Table<PhaseRow> : TableDefaults {
  static constexpr const char* kName = "phases";
  static constexpr bool kUpsert = true;
  // A re-write replaces wall_ns and calls. gpu_ns: a NULL in the new row keeps the stored
  // value (GPU time added by PhaseGpuRow); over a placeholder made by PhaseGpuRow (calls 0)
  // the new row's GPU time is added to the deltas already there; otherwise it replaces.
  static constexpr auto kColumns =
      std::tuple{Col<kKey>("step", &PhaseRow::step), Col<kKey>("name", &PhaseRow::name),
                 Col("wall_ns", &PhaseRow::wall_ns),
                 Col("gpu_ns", &PhaseRow::gpu_ns,
                     "CASE WHEN excluded.gpu_ns IS NULL THEN phases.gpu_ns"
                     " WHEN phases.calls = 0 THEN coalesce(phases.gpu_ns, 0) + excluded.gpu_ns"
                     " ELSE excluded.gpu_ns END"),
                 Col("calls", &PhaseRow::calls)};
};

// GPU time added to a phase row; a placeholder row (wall_ns 0, calls 0) when the CPU side is
// not written yet. Writes only; reads are PhaseRow's.
template <>
struct Table<PhaseGpuRow> : TableDefaults {
  static constexpr const char* kName = "phases";
  static constexpr const char* kPurpose = "add gpu_ns to phases";
  static constexpr const char* kJsonName = "phase_gpu_times";  // its JSON table (row_json.h)
  static constexpr bool kUpsert = true;
  static constexpr auto kColumns = std::tuple{
      Col<kKey>("step", &PhaseGpuRow::step), Col<kKey>("name", &PhaseGpuRow::name),
      Fixed("wall_ns", "0"),
      Col("gpu_ns", &PhaseGpuRow::gpu_ns, "coalesce(phases.gpu_ns, 0) + excluded.gpu_ns"),
      Fixed("calls", "0")};
};

template <>
struct Table<GpuInfoRow> : TableDefaults {
  static constexpr const char* kName = "gpus";
  static constexpr bool kUpsert = true;
  static constexpr auto kColumns = std::tuple{
      Col<kKey>("gpu_index", &GpuInfoRow::gpu_index), Col("name", &GpuInfoRow::name),
      Col("uuid", &GpuInfoRow::uuid), Col("memory_total_bytes", &GpuInfoRow::memory_total_bytes),
      Col("sm_clock_max_mhz", &GpuInfoRow::sm_clock_max_mhz)};
};

// GpuSampleRow::proc_util_pct is not stored (and not sent).
template <>
struct Table<GpuSampleRow> : TableDefaults {
  static constexpr const char* kName = "gpu_samples";
  static constexpr auto kColumns =
      std::tuple{Col("ts_ns", &GpuSampleRow::ts_ns),
                 Col("gpu_index", &GpuSampleRow::gpu_index),
                 Col("util_pct", &GpuSampleRow::util_pct),
                 Col("mem_util_pct", &GpuSampleRow::mem_util_pct),
                 Col("mem_used_bytes", &GpuSampleRow::mem_used_bytes),
                 Col("mem_total_bytes", &GpuSampleRow::mem_total_bytes),
                 Col("proc_mem_bytes", &GpuSampleRow::proc_mem_bytes),
                 Col("power_mw", &GpuSampleRow::power_mw),
                 Col("temp_c", &GpuSampleRow::temp_c),
                 Col("sm_clock_mhz", &GpuSampleRow::sm_clock_mhz),
                 Col("clock_reasons", &GpuSampleRow::clock_reasons),
                 Col("pcie_rx_bps", &GpuSampleRow::pcie_rx_bps),
                 Col("pcie_tx_bps", &GpuSampleRow::pcie_tx_bps)};
};

template <>
struct Table<GpuRollupRow> : TableDefaults {
  static constexpr const char* kName = "gpu_samples_1s";
  static constexpr bool kUpsert = true;
  static constexpr auto kColumns =
      std::tuple{Col<kKey>("ts_ns", &GpuRollupRow::ts_ns),
                 Col<kKey>("gpu_index", &GpuRollupRow::gpu_index),
                 Col("samples", &GpuRollupRow::samples),
                 Col("util_samples", &GpuRollupRow::util_samples),
                 Col("util_mean_pct", &GpuRollupRow::util_mean_pct),
                 Col("util_min_pct", &GpuRollupRow::util_min_pct),
                 Col("util_max_pct", &GpuRollupRow::util_max_pct),
                 Col("mem_util_mean_pct", &GpuRollupRow::mem_util_mean_pct),
                 Col("mem_used_max_bytes", &GpuRollupRow::mem_used_max_bytes),
                 Col("mem_total_bytes", &GpuRollupRow::mem_total_bytes),
                 Col("proc_mem_max_bytes", &GpuRollupRow::proc_mem_max_bytes),
                 Col("power_samples", &GpuRollupRow::power_samples),
                 Col("power_mean_mw", &GpuRollupRow::power_mean_mw),
                 Col("power_max_mw", &GpuRollupRow::power_max_mw),
                 Col("temp_max_c", &GpuRollupRow::temp_max_c),
                 Col("sm_clock_min_mhz", &GpuRollupRow::sm_clock_min_mhz),
                 Col("sm_clock_max_mhz", &GpuRollupRow::sm_clock_max_mhz),
                 Col("clock_reasons_or", &GpuRollupRow::clock_reasons_or),
                 Col("thermal_samples", &GpuRollupRow::thermal_samples),
                 Col("throttled_samples", &GpuRollupRow::throttled_samples),
                 Col("throttled_by_reason_samples", &GpuRollupRow::throttled_by_reason_samples),
                 Col("throttled_temp_max_c", &GpuRollupRow::throttled_temp_max_c),
                 Col("throttled_sm_clock_min_mhz", &GpuRollupRow::throttled_sm_clock_min_mhz),
                 Col("pcie_rx_samples", &GpuRollupRow::pcie_rx_samples),
                 Col("pcie_rx_mean_bps", &GpuRollupRow::pcie_rx_mean_bps),
                 Col("pcie_rx_max_bps", &GpuRollupRow::pcie_rx_max_bps),
                 Col("pcie_rx_high_samples", &GpuRollupRow::pcie_rx_high_samples),
                 Col("pcie_tx_max_bps", &GpuRollupRow::pcie_tx_max_bps)};
};

// cpu_per_core is written to host_core_samples (raw tier), as JSON array text: one row when
// measured (non-empty). The JSON form of a row carries it as "cpu_per_core".
template <>
struct Table<HostSampleRow> : TableDefaults {
  static constexpr const char* kName = "host_samples";
  static constexpr auto kColumns =
      std::tuple{Col("ts_ns", &HostSampleRow::ts_ns),
                 Col("cpu_pct", &HostSampleRow::cpu_pct),
                 Col<kNotStored>("cpu_per_core", &HostSampleRow::cpu_per_core),
                 Col("ncores", &HostSampleRow::ncores),
                 Col("mem_used_bytes", &HostSampleRow::mem_used_bytes),
                 Col("mem_total_bytes", &HostSampleRow::mem_total_bytes),
                 Col("page_cache_bytes", &HostSampleRow::page_cache_bytes),
                 Col("swap_in_bps", &HostSampleRow::swap_in_bps),
                 Col("disk_read_bps", &HostSampleRow::disk_read_bps),
                 Col("disk_read_iops", &HostSampleRow::disk_read_iops),
                 Col("proc_cpu_pct", &HostSampleRow::proc_cpu_pct),
                 Col("proc_rss_bytes", &HostSampleRow::proc_rss_bytes),
                 Col<kAdded>("job_cpu_pct", &HostSampleRow::job_cpu_pct)};
};

template <>
struct Table<WorkerSampleRow> : TableDefaults {
  static constexpr const char* kName = "worker_samples";
  static constexpr auto kColumns =
      std::tuple{Col("ts_ns", &WorkerSampleRow::ts_ns), Col("pid", &WorkerSampleRow::pid),
                 Col("role", &WorkerSampleRow::role), Col("cpu_pct", &WorkerSampleRow::cpu_pct),
                 Col("rss_bytes", &WorkerSampleRow::rss_bytes)};
};

template <>
struct Table<WorkerRollupRow> : TableDefaults {
  static constexpr const char* kName = "worker_samples_10s";
  static constexpr bool kUpsert = true;
  static constexpr auto kColumns =
      std::tuple{Col<kKey>("ts_ns", &WorkerRollupRow::ts_ns),
                 Col<kKey>("pid", &WorkerRollupRow::pid),
                 Col("role", &WorkerRollupRow::role),
                 Col("samples", &WorkerRollupRow::samples),
                 Col("cpu_samples", &WorkerRollupRow::cpu_samples),
                 Col("cpu_mean_pct", &WorkerRollupRow::cpu_mean_pct),
                 Col("cpu_max_pct", &WorkerRollupRow::cpu_max_pct),
                 Col("rss_max_bytes", &WorkerRollupRow::rss_max_bytes)};
};

// The launch columns (step .. max_ns) came after the first files were written.
template <>
struct Table<KernelRow> : TableDefaults {
  static constexpr const char* kName = "kernels";
  static constexpr auto kColumns = std::tuple{Col("window_start_ns", &KernelRow::window_start_ns),
                                              Col("window_end_ns", &KernelRow::window_end_ns),
                                              Col("name", &KernelRow::name),
                                              Col("calls", &KernelRow::calls),
                                              Col("gpu_ns", &KernelRow::gpu_ns),
                                              Col("source", &KernelRow::source),
                                              Col<kAdded>("step", &KernelRow::step),
                                              Col<kAdded>("device", &KernelRow::device),
                                              Col<kAdded>("stream", &KernelRow::stream),
                                              Col<kAdded>("grid", &KernelRow::grid),
                                              Col<kAdded>("block", &KernelRow::block),
                                              Col<kAdded>("min_ns", &KernelRow::min_ns),
                                              Col<kAdded>("max_ns", &KernelRow::max_ns)};
};

template <>
struct Table<CpuOpRow> : TableDefaults {
  static constexpr const char* kName = "cpu_ops";
  static constexpr auto kColumns = std::tuple{Col("window_start_ns", &CpuOpRow::window_start_ns),
                                              Col("window_end_ns", &CpuOpRow::window_end_ns),
                                              Col("step", &CpuOpRow::step),
                                              Col("name", &CpuOpRow::name),
                                              Col("calls", &CpuOpRow::calls),
                                              Col("self_cpu_ns", &CpuOpRow::self_cpu_ns),
                                              Col("cpu_ns", &CpuOpRow::cpu_ns),
                                              Col("source", &CpuOpRow::source)};
};

template <>
struct Table<CommBucketRow> : TableDefaults {
  static constexpr const char* kName = "comm_buckets";
  static constexpr auto kColumns =
      std::tuple{Col("step", &CommBucketRow::step), Col("bucket", &CommBucketRow::bucket),
                 Col("start_ns", &CommBucketRow::start_ns), Col("end_ns", &CommBucketRow::end_ns),
                 Col("bytes", &CommBucketRow::bytes)};
};

template <>
struct Table<StallRow> : TableDefaults {
  static constexpr const char* kName = "host_stalls";
  static constexpr auto kColumns =
      std::tuple{Col("start_ns", &StallRow::start_ns), Col("duration_ns", &StallRow::duration_ns)};
};

template <>
struct Table<CpuWaitRow> : TableDefaults {
  static constexpr const char* kName = "cpu_waits";
  static constexpr auto kColumns =
      std::tuple{Col("start_ns", &CpuWaitRow::start_ns), Col("end_ns", &CpuWaitRow::end_ns),
                 Col("wait_ns", &CpuWaitRow::wait_ns)};
};

// available is stored as 0/1.
template <>
struct Table<TelemetryStatusRow> : TableDefaults {
  static constexpr const char* kName = "telemetry_status";
  static constexpr bool kUpsert = true;
  static constexpr auto kColumns = std::tuple{Col<kKey>("source", &TelemetryStatusRow::source),
                                              Col("available", &TelemetryStatusRow::available),
                                              Col("backend", &TelemetryStatusRow::backend),
                                              Col("reason", &TelemetryStatusRow::reason)};
};

template <>
struct Table<DiagnosticRow> : TableDefaults {
  static constexpr const char* kName = "diagnostics";
  static constexpr auto kColumns =
      std::tuple{Col("ts_ns", &DiagnosticRow::ts_ns), Col("level", &DiagnosticRow::level),
                 Col("source", &DiagnosticRow::source), Col("message", &DiagnosticRow::message)};
};

// Written whole by ReplaceInsights (delete, then insert: a repeated ordinal is an error).
template <>
struct Table<InsightRow> : TableDefaults {
  static constexpr const char* kName = "insights";
  static constexpr auto kColumns = std::tuple{Col<kKey>("ordinal", &InsightRow::ordinal),
                                              Col("rule_id", &InsightRow::rule_id),
                                              Col("family", &InsightRow::family),
                                              Col("severity", &InsightRow::severity),
                                              Col("message", &InsightRow::message),
                                              Col("fix", &InsightRow::fix),
                                              Col("evidence_json", &InsightRow::evidence_json)};
};

// ---- walkers ---------------------------------------------------------------------------------

template <class C>
struct IsFixed : std::is_same<C, FixedColumn> {};

template <class C>
constexpr bool HasFlag(unsigned flag) {
  if constexpr (IsFixed<C>::value) {
    return false;
  } else {
    return (C::kFlags & flag) != 0;
  }
}

// f(column) for every entry of Table<T>::kColumns (Column<...> or FixedColumn), in order.
template <class T, class F>
constexpr void ForEachColumn(F&& f) {
  std::apply([&](const auto&... c) { (f(c), ...); }, Table<T>::kColumns);
}

// f(std::type_identity<T>{}) for every row type with a Table<T>: the Row alternatives (in
// variant order), then InsightRow and RunInfo.
template <class F>
void ForEachTable(F&& f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (f(std::type_identity<std::variant_alternative_t<I, Row>>{}), ...);
  }
  (std::make_index_sequence<std::variant_size_v<Row>>{});
  f(std::type_identity<InsightRow>{});
  f(std::type_identity<RunInfo>{});
}

// f(name, member) for every column of `row` that its JSON form carries (all but kAssigned and
// the fixed ones), in order. `row` may be const.
template <class T, class F>
void ForEachField(T& row, F&& f) {
  using Plain = std::remove_const_t<T>;
  ForEachColumn<Plain>([&](const auto& c) {
    using C = std::decay_t<decltype(c)>;
    if constexpr (!IsFixed<C>::value) {
      if constexpr (!HasFlag<C>(kAssigned)) f(c.name, row.*c.member);
    }
  });
}

}  // namespace gpuprof::store
