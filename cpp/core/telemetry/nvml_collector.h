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
  void AddNote(std::string note) noexcept;
  std::string ErrorText(nvml::Return r) const;

  int64_t pcie_interval_ns_ = 1'000'000'000;
  std::string library_path_;
  void* handle_ = nullptr;
  bool initialized_ = false;
  std::unique_ptr<Api> api_;
  std::vector<GpuDevice> devices_;
  std::vector<DeviceState> states_;  // parallel to devices_
  bool pid_namespace_nested_ = false;

  std::mutex notes_mu_;
  std::vector<std::string> notes_;
};

}  // namespace gpuprof::telemetry
