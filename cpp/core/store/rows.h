// Row types of store schema v1 (store/schema.sql, docs/schema.md). These are the unit of
// exchange between the recorder, the samplers and the store writer; RunView loads them back.
// std::optional<> == SQL NULL == "not measured".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace gpuprof::store {

inline constexpr int kSchemaVersion = 1;

struct RunInfo {
  int64_t run_id = 0;  // assigned by the store on BeginRun
  std::string run_name;
  std::optional<std::string> group_id;
  std::optional<int64_t> rank;
  std::optional<int64_t> world_size;
  std::string hostname;
  int64_t pid = 0;
  int64_t start_unix_ns = 0;
  int64_t start_mono_ns = 0;
  std::optional<int64_t> end_ns;
  std::string status = "running";  // running | ok | failed
  std::optional<std::string> error;
  std::optional<std::string> device_kind;
  std::optional<std::string> gpu_backend;
  std::optional<std::string> gpu_model;
  std::optional<int64_t> gpu_count;
  std::optional<std::string> dtype;
  std::optional<double> flops_per_step;
  std::optional<std::string> flops_method;
  std::optional<double> sample_hz;
  std::string gpuprof_version;
  std::optional<std::string> python_version;
  std::optional<std::string> torch_version;
  std::optional<std::string> config_json;
};

struct StepRow {
  int64_t step = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  std::optional<int64_t> wait_ns;
  std::optional<std::string> wait_source;  // gap | explicit
  int64_t forward_calls = 0;
  int64_t backward_calls = 0;
  int64_t optimizer_calls = 0;
};

struct PhaseRow {
  int64_t step = 0;
  std::string name;
  int64_t wall_ns = 0;
  std::optional<int64_t> gpu_ns;
  int64_t calls = 0;
};

// Adds GPU time to an existing (or future) phase row: gpu_ns = coalesce(gpu_ns, 0) + delta.
// CUDA-event times resolve after their step was written.
struct PhaseGpuRow {
  int64_t step = 0;
  std::string name;
  int64_t gpu_ns = 0;
};

struct GpuInfoRow {
  int64_t gpu_index = 0;
  std::optional<std::string> name;
  std::optional<std::string> uuid;
  std::optional<int64_t> memory_total_bytes;
  std::optional<int64_t> sm_clock_max_mhz;
};

struct GpuSampleRow {
  int64_t ts_ns = 0;
  int64_t gpu_index = 0;
  std::optional<double> util_pct;
  std::optional<double> mem_util_pct;
  std::optional<int64_t> mem_used_bytes;
  std::optional<int64_t> mem_total_bytes;
  std::optional<int64_t> proc_mem_bytes;
  std::optional<int64_t> power_mw;
  std::optional<double> temp_c;
  std::optional<int64_t> sm_clock_mhz;
  std::optional<int64_t> clock_reasons;
  std::optional<double> pcie_rx_bps;
  std::optional<double> pcie_tx_bps;
};

struct HostSampleRow {
  int64_t ts_ns = 0;
  std::optional<double> cpu_pct;
  std::vector<double> cpu_per_core;  // empty == not measured
  std::optional<int64_t> ncores;
  std::optional<int64_t> mem_used_bytes;
  std::optional<int64_t> mem_total_bytes;
  std::optional<int64_t> page_cache_bytes;
  std::optional<double> swap_in_bps;
  std::optional<double> disk_read_bps;
  std::optional<double> disk_read_iops;
  std::optional<double> proc_cpu_pct;
  std::optional<int64_t> proc_rss_bytes;
};

struct WorkerSampleRow {
  int64_t ts_ns = 0;
  int64_t pid = 0;
  std::string role;  // main | child
  std::optional<double> cpu_pct;
  std::optional<int64_t> rss_bytes;
};

struct KernelRow {
  int64_t window_start_ns = 0;
  int64_t window_end_ns = 0;
  std::string name;
  int64_t calls = 0;
  int64_t gpu_ns = 0;
  std::string source;
};

struct CommBucketRow {
  int64_t step = 0;
  int64_t bucket = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  std::optional<int64_t> bytes;
};

struct TelemetryStatusRow {
  std::string source;  // gpu | host | cuda_events
  bool available = false;
  std::optional<std::string> backend;
  std::optional<std::string> reason;
};

struct InsightRow {
  int64_t ordinal = 0;
  std::string rule_id;
  std::string family;
  std::string severity;  // high | med | low | info
  std::string message;
  std::optional<std::string> fix;
  std::optional<std::string> evidence_json;
};

struct DiagnosticRow {
  std::optional<int64_t> ts_ns;
  std::string level;  // info | warning | error
  std::string source;
  std::string message;
};

// What the writer queue carries. Every row belongs to the run the writer was opened for.
using Row = std::variant<StepRow, PhaseRow, PhaseGpuRow, GpuInfoRow, GpuSampleRow, HostSampleRow,
                         WorkerSampleRow, KernelRow, CommBucketRow, TelemetryStatusRow,
                         DiagnosticRow>;

}  // namespace gpuprof::store
