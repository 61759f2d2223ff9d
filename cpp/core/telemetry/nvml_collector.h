// NvmlCollector: GPU telemetry from the NVIDIA driver's management library, loaded with dlopen
// at run time (no build-time CUDA/NVML dependency). Each optional entry point is resolved on its
// own; one the library lacks makes only its field unavailable.
//
// Per device and Sample(): utilization (gpu, memory), memory used/total, device memory held by
// the given process tree, power, temperature, SM clock, clock event ("throttle") reasons, PCIe
// RX/TX throughput. Field policy:
//   - NVML_ERROR_NOT_SUPPORTED (or FUNCTION_NOT_FOUND): the field is switched off for that
//     device for the rest of the run (it is never asked again) and one note says so.
//   - any other error: the field is nullopt for that tick; a note the first time it happens.
//   - NVML_ERROR_GPU_IS_LOST from any read: the device is dropped for the rest of the run (no more
//     rows), with a note.
//   - every attempted read of a device failing in one tick: no row for that device this tick;
//     a note the first time.
//
// Opt-in (set_process_utilization): the SM utilization of the given process tree from
// nvmlDeviceGetProcessUtilization -> proc_util_pct. The driver keeps per-process samples at its
// own period (often ~1/6 s) and only for processes that were busy in that period, so "no sample
// for us" needs reading (per device and tick; kProcessUtilizationHoldNs = 1 s):
//   - new samples since the last one seen, ours among them: the sum over our pids of each pid's
//     latest smUtil.
//   - new samples of other processes only: the driver's period moved on and ours was idle in
//     it: 0. (In a nested pid namespace, only once one of our pids has been matched in a sample:
//     before that the pids may be host pids and ours unknown, with a note.)
//   - nothing new (NVML_ERROR_NOT_FOUND): the period has not moved on, or nobody was busy. The
//     device-wide utilization read in the same tick decides: 0 there means ours is 0 too;
//     otherwise the last value is kept for up to the hold after the driver last told us
//     something, then it is nullopt ("unknown", with a note) until a new sample comes: a busy
//     device with no per-process sample for that long means the driver does not report them
//     (it is not "idle").
//   - NOT_SUPPORTED / FUNCTION_NOT_FOUND (MIG, vGPU, many consumer GPUs): off for that device
//     with one note; other errors: nullopt for that tick (and the held value is dropped), a note
//     the first time; GPU_IS_LOST: the device is dropped, as for every field.
// Samples at or before the last one seen, or with smUtil > 100, are ignored (some drivers
// return them). The first read of a device only takes samples of the last hold (1 s), so
// what the process did before it does not count.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "telemetry/gpu_collector.h"
#include "telemetry/nvml_abi.h"
#include "util/status.h"

namespace gpuprof::telemetry {

// Environment variable naming the NVML library to load (overrides the default soname).
inline constexpr const char* kNvmlLibraryEnv = "GPUPROF_NVML_LIBRARY";
inline constexpr const char* kNvmlDefaultLibrary = "libnvidia-ml.so.1";

// The library NvmlCollector::Open loads for `configured`: configured if non-empty, else
// $GPUPROF_NVML_LIBRARY if set and non-empty, else "libnvidia-ml.so.1".
std::string ResolveNvmlLibraryPath(const std::string& configured);

// Whether this process lives in a nested pid namespace (a container), read from
// /proc/self/status NSpid. There the driver's process list may carry host pids that cannot be
// matched to ours, so process memory is reported as unknown rather than 0 when the list is
// non-empty and none of its pids match (an empty list still means 0).
bool InNestedPidNamespace();

class NvmlCollector final : public GpuCollector {
 public:
  // Per-device field slots; also the names used in notes and in the fake library's scenarios.
  enum Field : int {
    kUtil = 0,      // nvmlDeviceGetUtilizationRates -> util_pct, mem_util_pct
    kMemory,        // nvmlDeviceGetMemoryInfo -> mem_used_bytes, mem_total_bytes
    kProcMem,       // nvmlDeviceGetComputeRunningProcesses_v3/_v2/(v1) -> proc_mem_bytes
    kPower,         // nvmlDeviceGetPowerUsage -> power_mw
    kTemp,          // nvmlDeviceGetTemperature(GPU) -> temp_c
    kSmClock,       // nvmlDeviceGetClockInfo(SM) -> sm_clock_mhz
    kClockReasons,  // nvmlDeviceGetCurrentClocksEventReasons / ...ThrottleReasons -> clock_reasons
    kPcie,          // nvmlDeviceGetPcieThroughput(RX, TX) -> pcie_rx_bps, pcie_tx_bps (bytes/s)
    kProcUtil,      // nvmlDeviceGetProcessUtilization -> proc_util_pct (opt-in, see above)
    kFieldCount
  };
  static const char* FieldName(Field field);

  // Loads `library_path` (use ResolveNvmlLibraryPath), initialises NVML and enumerates the
  // devices with their static info. Cold path. Errors name the library and the failing step,
  // e.g. "cannot load libnvidia-ml.so.1: libnvidia-ml.so.1: cannot open shared object file: No
  // such file or directory" or "nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)". Zero
  // devices is not an error here (MakeGpuCollector decides). Devices whose handle cannot be had
  // are skipped with a note.
  static Expected<std::unique_ptr<NvmlCollector>> Open(const std::string& library_path);

  // PCIe throughput is read at most once per interval per device (default 1 s; 0 = every
  // tick): the driver call itself blocks for its ~20 ms measurement window.
  void set_pcie_interval_ns(int64_t ns) { pcie_interval_ns_ = ns; }

  // How long a per-process utilization is kept while the driver has no new sample (above).
  static constexpr int64_t kProcessUtilizationHoldNs = 1'000'000'000;
  // Reads the per-process utilization of Sample()'s pids into proc_util_pct (off by default:
  // gpuprof's recorder does not ask for it). Cold: call before the first Sample(). Turning it on
  // with a library that lacks nvmlDeviceGetProcessUtilization adds one note.
  void set_process_utilization(bool on);
  bool process_utilization() const { return process_utilization_; }

  ~NvmlCollector() override;  // nvmlShutdown + dlclose
  NvmlCollector(const NvmlCollector&) = delete;
  NvmlCollector& operator=(const NvmlCollector&) = delete;
  NvmlCollector(NvmlCollector&&) = delete;
  NvmlCollector& operator=(NvmlCollector&&) = delete;

  std::string backend() const override { return "nvml"; }
  const std::vector<GpuDevice>& devices() const override { return devices_; }
  // Clears *out, then appends one row per device that answered this tick. Returns false when no
  // device answered (all lost or all reads failed) or there are no devices. Sampler thread only.
  bool Sample(int64_t now_rel_ns, const std::vector<int64_t>& pids,
              std::vector<store::GpuSampleRow>* out) noexcept override;
  // Thread-safe; may be called from any thread while another samples.
  std::vector<std::string> TakeNotes() override;
  // The failed reads the notes name (a field's read failed, every read of a device failed in
  // one tick, a device lost), each when its note is added. Thread-safe, like TakeNotes.
  std::vector<GpuReadFailure> TakeFailures() override;

  const std::string& library_path() const { return library_path_; }
  // Whether `field` is still being read for the device at position `device_pos` of devices()
  // (false once it proved unsupported or the library lacks it, or the device was lost).
  bool FieldActive(size_t device_pos, Field field) const;

 private:
  struct Api;
  struct DeviceState;

  NvmlCollector();
  bool SampleDevice(DeviceState& dev, int64_t now_rel_ns, const std::vector<int64_t>& pids,
                    store::GpuSampleRow* row) noexcept;
  // Applies the error policy to one failed read. Returns true when the device is lost.
  bool OnFieldError(DeviceState& dev, Field field, nvml::Return r) noexcept;
  // One per-process utilization read (policy above). Returns kSuccess when the driver answered
  // (with or without samples), else its error for OnFieldError.
  nvml::Return ReadProcessUtilization(DeviceState& dev, int64_t now_rel_ns,
                                      const std::vector<int64_t>& pids,
                                      store::GpuSampleRow* row) noexcept;
  void AddNote(std::string note) noexcept;
  // Adds the note and records the failure it describes.
  void AddFailure(std::string note, GpuReadFailure failure) noexcept;
  std::string ErrorText(nvml::Return r) const;

  int64_t pcie_interval_ns_ = 1'000'000'000;
  bool process_utilization_ = false;
  std::string library_path_;
  void* handle_ = nullptr;
  bool initialized_ = false;
  std::unique_ptr<Api> api_;
  std::vector<GpuDevice> devices_;
  std::vector<DeviceState> states_;  // parallel to devices_
  bool pid_namespace_nested_ = false;

  std::mutex notes_mu_;  // guards notes_ and failures_
  std::vector<std::string> notes_;
  std::vector<GpuReadFailure> failures_;
};

}  // namespace gpuprof::telemetry
