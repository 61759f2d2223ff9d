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
  // iter(loader) calls of a torch DataLoader in the step's wait that started its worker
  // processes (an epoch's start without persistent_workers, or the first one with them) and the
  // time inside them; nullopt when the step's wait was not measured inside a loader.
  std::optional<int64_t> loader_starts;
  std::optional<int64_t> loader_start_ns;
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
  // Not stored (no column in gpu_samples; the writer binds the columns above by name): the SM
  // utilization of the sampled process tree, percent, when the collector was asked for it
  // (NvmlCollector::set_process_utilization; linescope's sampler). Unknown: nullopt.
  std::optional<double> proc_util_pct;
};

// One GPU's raw samples within one second: table gpu_samples_1s, built by store::GpuRollup
// (store/rollup.h). ts_ns is the start of the second (a multiple of kGpuRollupNs, run-relative).
// Each aggregate is over the samples of that second where its field was measured and is
// nullopt when there was none; the *_samples counts say how many readings a mean covers, so
// seconds combine exactly (sum(mean * n) / sum(n)).
struct GpuRollupRow {
  int64_t ts_ns = 0;
  int64_t gpu_index = 0;
  int64_t samples = 0;  // raw samples (ticks) of this GPU in the second
  int64_t util_samples = 0;
  std::optional<double> util_mean_pct;
  std::optional<double> util_min_pct;
  std::optional<double> util_max_pct;
  std::optional<double> mem_util_mean_pct;
  std::optional<int64_t> mem_used_max_bytes;
  std::optional<int64_t> mem_total_bytes;  // largest total read in the second
  std::optional<int64_t> proc_mem_max_bytes;
  int64_t power_samples = 0;
  std::optional<double> power_mean_mw;
  std::optional<int64_t> power_max_mw;
  std::optional<double> temp_max_c;
  std::optional<int64_t> sm_clock_min_mhz;
  std::optional<int64_t> sm_clock_max_mhz;
  std::optional<int64_t> clock_reasons_or;  // bitwise OR of the clocks-event reasons read
  // Thermal throttling, judged per sample while rolling up (criteria in store/rollup.h):
  int64_t thermal_samples = 0;                        // samples where it could be judged
  int64_t throttled_samples = 0;                      // ...judged throttled
  int64_t throttled_by_reason_samples = 0;            // ...of which NVML gave a thermal reason bit
  std::optional<double> throttled_temp_max_c;         // over the throttled samples
  std::optional<int64_t> throttled_sm_clock_min_mhz;  // over the throttled samples
  int64_t pcie_rx_samples = 0;
  std::optional<double> pcie_rx_mean_bps;
  std::optional<double> pcie_rx_max_bps;
  int64_t pcie_rx_high_samples = 0;  // readings above kRollupPcieRxHighGBps
  std::optional<double> pcie_tx_max_bps;
};

struct HostSampleRow {
  int64_t ts_ns = 0;
  std::optional<double> cpu_pct;
  // Stored in host_core_samples (raw tier, kept in the retention windows only), not in
  // host_samples. Empty == not measured; SqliteStore::LoadRun leaves it empty.
  std::vector<double> cpu_per_core;
  std::optional<int64_t> ncores;
  std::optional<int64_t> mem_used_bytes;
  std::optional<int64_t> mem_total_bytes;
  std::optional<int64_t> page_cache_bytes;
  std::optional<double> swap_in_bps;
  std::optional<double> disk_read_bps;
  std::optional<double> disk_read_iops;
  std::optional<double> proc_cpu_pct;
  std::optional<int64_t> proc_rss_bytes;
  // The job's other ranks on this host with their children, percent of one core; nullopt when
  // this process is not known to be one of several ranks of a job on this host (HostSampler).
  std::optional<double> job_cpu_pct;
};

struct WorkerSampleRow {
  int64_t ts_ns = 0;
  int64_t pid = 0;
  std::string role;  // main | child
  std::optional<double> cpu_pct;
  std::optional<int64_t> rss_bytes;
};

// One process's worker_samples within a 10-second window: table worker_samples_10s, built by
// store::WorkerRollup. ts_ns is the window start (a multiple of kWorkerRollupNs).
struct WorkerRollupRow {
  int64_t ts_ns = 0;
  int64_t pid = 0;
  std::string role;  // main | child (the role of its latest sample)
  int64_t samples = 0;
  int64_t cpu_samples = 0;  // samples with cpu_pct
  std::optional<double> cpu_mean_pct;
  std::optional<double> cpu_max_pct;
  std::optional<int64_t> rss_max_bytes;
};

// Per-core CPU of one host sample, as stored in host_core_samples (raw tier). The writer
// stores HostSampleRow::cpu_per_core there; this is how it is read back.
struct HostCoreRow {
  int64_t ts_ns = 0;
  std::vector<double> cpu_per_core;
};

// Kernel time of one window: the kernels of one name and launch configuration that were
// launched in [window_start_ns, window_end_ns) (run-relative, by launch time). A traced step's
// window is its span (step set); a continuous-trace window is a fixed period (step null).
// gpu_ns is device time (sum of the kernels' durations). Table kernels; the launch columns
// (step .. max_ns) came after the first files were written and read as null there.
struct KernelRow {
  int64_t window_start_ns = 0;
  int64_t window_end_ns = 0;
  std::string name;
  int64_t calls = 0;
  int64_t gpu_ns = 0;
  std::string source;                // cupti | nsys | torch_profiler
  std::optional<int64_t> step;       // the traced step; null: a time window
  std::optional<int64_t> device;     // CUDA device ordinal
  std::optional<int64_t> stream;     // CUDA stream id (CUPTI's / nsys' numbering)
  std::optional<std::string> grid;   // "x,y,z"
  std::optional<std::string> block;  // "x,y,z"
  std::optional<int64_t> min_ns;     // shortest and longest single kernel
  std::optional<int64_t> max_ns;
};

// CPU time of one operator name in one traced window (torch.profiler's CPU activities on a run
// that has no GPU kernels to trace). self_cpu_ns excludes the operator's child operators,
// cpu_ns includes them; both are host time, never GPU time. Table cpu_ops.
struct CpuOpRow {
  int64_t window_start_ns = 0;
  int64_t window_end_ns = 0;
  std::optional<int64_t> step;
  std::string name;
  int64_t calls = 0;
  int64_t self_cpu_ns = 0;
  std::optional<int64_t> cpu_ns;
  std::string source;  // torch_profiler
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

// A stretch when the process was held off the CPU: the stall watch's thread
// (telemetry/stall_watch.h), asleep for a short tick, woke duration_ns later than asked (at
// least the watch's threshold). start_ns is when it should have woken (run-relative). Table
// host_stalls.
struct StallRow {
  int64_t start_ns = 0;
  int64_t duration_ns = 0;
};

// A stretch [start_ns, end_ns) (run-relative) in which the process's threads, gpuprof's own
// left out, waited wait_ns in the run queue for a CPU (telemetry/cpu_wait.h; summed over threads,
// so it may exceed end - start). Only stretches with at least the stall watch's minimum are
// kept. Table cpu_waits.
struct CpuWaitRow {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t wait_ns = 0;
};

// What the writer queue carries. Every row belongs to the run the writer was opened for.
using Row =
    std::variant<StepRow, PhaseRow, PhaseGpuRow, GpuInfoRow, GpuSampleRow, HostSampleRow,
                 WorkerSampleRow, KernelRow, CommBucketRow, TelemetryStatusRow, DiagnosticRow,
                 GpuRollupRow, WorkerRollupRow, StallRow, CpuWaitRow, CpuOpRow>;

}  // namespace gpuprof::store
