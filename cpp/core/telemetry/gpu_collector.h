// GPU telemetry collectors. One interface, several backends:
//   NvmlCollector   - the NVIDIA driver's libnvidia-ml.so.1, loaded with dlopen at run time
//   NeuronCollector - AWS Neuron (Trainium/Inferentia) NeuronCores, from the neuron-monitor tool
//                     run as a child process (one "device" per NeuronCore)
//   MockCollector   - N fake GPUs with scripted curves (demos, dashboards, tests)
// A collector is driven by one sampler thread: Sample() is never called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "store/rows.h"
#include "util/status.h"

namespace gpuprof::telemetry {

struct GpuDevice {
  int64_t index = 0;
  std::optional<std::string> name;  // e.g. "NVIDIA H100 80GB HBM3"
  std::optional<std::string> uuid;
  std::optional<int64_t> memory_total_bytes;
  std::optional<int64_t> sm_clock_max_mhz;
};

// A read that failed while sampling, as data for callers that decide from it (a summary
// naming the driver's error); the collector's notes say the same in words. Recorded once per
// device and kind (and field), the first time it happens, in the order it happened.
struct GpuReadFailure {
  enum class Kind : uint8_t {
    kField,       // one field's read failed; the field is left empty while it fails
    kDeviceRead,  // every read of the device failed in one tick: no row for it that tick
    kDeviceLost,  // the device is gone: no further rows from it
  };
  Kind kind = Kind::kField;
  int64_t gpu_index = 0;
  std::string device;  // the collector's label of the device, as in its notes ("gpu0")
  std::string field;   // kField: the field's name, as in the notes ("util", "proc_mem")
  std::string error;   // the driver's error, e.g. "Unknown Error (NVML error 999)"
};

class GpuCollector {
 public:
  virtual ~GpuCollector() = default;
  virtual std::string backend() const = 0;  // "nvml" | "neuron" | "mock"
  virtual const std::vector<GpuDevice>& devices() const = 0;
  // Reads every device once. Fields the device does not support, or whose read failed, stay
  // nullopt. Returns false only when the whole read failed (e.g. the driver went away).
  // `now_rel_ns` is stamped into each row; `pids` are the process tree whose device memory
  // goes into proc_mem_bytes. noexcept: never throws on the sampler thread.
  virtual bool Sample(int64_t now_rel_ns, const std::vector<int64_t>& pids,
                      std::vector<store::GpuSampleRow>* out) noexcept = 0;
  // Human-readable notes gathered while sampling (first failure of each field, fields that
  // became unsupported mid-run). Drained by the caller into the diagnostics table.
  virtual std::vector<std::string> TakeNotes() { return {}; }
  // The read failures recorded since the last call (see GpuReadFailure); thread-safe where
  // TakeNotes is. Collectors that record none return nothing.
  virtual std::vector<GpuReadFailure> TakeFailures() { return {}; }
};

struct GpuCollectorOptions {
  // "auto" (NVML if it loads and finds devices; else Neuron if neuron-monitor is found and
  // /dev/neuron0 exists; else none), "nvml", "neuron", "mock", "none".
  std::string backend = "auto";
  // For nvml: the library to dlopen. Empty = $GPUPROF_NVML_LIBRARY or "libnvidia-ml.so.1".
  std::string nvml_library;
  // For nvml: PCIe throughput is read at most this often (ms; 0 = every tick), because the
  // driver call blocks for its measurement window.
  int pcie_interval_ms = 1000;
  // For nvml: also read this process tree's own SM utilization into proc_util_pct
  // (NvmlCollector::set_process_utilization). Off for gpuprof's recorder; linescope's sampler
  // turns it on. Other backends ignore it.
  bool process_utilization = false;
  // For neuron: the neuron-monitor executable. Empty = $GPUPROF_NEURON_MONITOR, else
  // neuron-monitor on $PATH, else /opt/aws/neuron/bin/neuron-monitor.
  std::string neuron_monitor;
  // For neuron: the report period asked of neuron-monitor, whole seconds (>= 1).
  int neuron_period_s = 1;
  // For auto: the device node whose presence lets auto start neuron-monitor (tests point it
  // elsewhere); without it no child process is spawned.
  std::string neuron_device_node = "/dev/neuron0";
  // For mock: device count and scenario (see MockScenario::Parse).
  int mock_gpus = 1;
  std::string mock_scenario;
};

// Creates the collector the options ask for. When none can be had, returns the reason
// (e.g. "NVML not available: libnvidia-ml.so.1: cannot open shared object file; AWS Neuron not
// available: neuron-monitor not found (...)") — the caller records it as
// telemetry_status(gpu, available=0, reason) and the run continues.
Expected<std::unique_ptr<GpuCollector>> MakeGpuCollector(const GpuCollectorOptions& options);

}  // namespace gpuprof::telemetry
