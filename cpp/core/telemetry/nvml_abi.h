// The slice of the NVIDIA Management Library's C ABI that gpuprof uses, declared here so that
// nothing at build time depends on the CUDA toolkit or the driver. Written from the documented
// ABI (nvml.h of the R470..R570 drivers): the numeric values and struct layouts below are the
// vendor's and must not change. Shared by NvmlCollector (the caller) and fake_nvml (a
// scenario-driven stand-in used by the tests); the static_asserts pin the layouts on x86-64 and
// aarch64 Linux (LP64).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpuprof::telemetry::nvml {

// nvmlReturn_t. Every NVML entry point returns one of these.
using Return = int;
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorAlreadyInitialized = 5;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorInsufficientPower = 8;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorTimeout = 10;
inline constexpr Return kErrorIrqIssue = 11;
inline constexpr Return kErrorLibraryNotFound = 12;
inline constexpr Return kErrorFunctionNotFound = 13;
inline constexpr Return kErrorCorruptedInforom = 14;
inline constexpr Return kErrorGpuIsLost = 15;
inline constexpr Return kErrorResetRequired = 16;
inline constexpr Return kErrorOperatingSystem = 17;
inline constexpr Return kErrorLibRmVersionMismatch = 18;
inline constexpr Return kErrorInUse = 19;
inline constexpr Return kErrorMemory = 20;
inline constexpr Return kErrorNoData = 21;
inline constexpr Return kErrorVgpuEccNotSupported = 22;
inline constexpr Return kErrorInsufficientResources = 23;
inline constexpr Return kErrorFreqNotSupported = 24;
inline constexpr Return kErrorArgumentVersionMismatch = 25;
inline constexpr Return kErrorDeprecated = 26;
inline constexpr Return kErrorNotReady = 27;
inline constexpr Return kErrorGpuNotFound = 28;
inline constexpr Return kErrorInvalidState = 29;
inline constexpr Return kErrorUnknown = 999;

// Human-readable name of a return code, for messages when the library offers no
// nvmlErrorString (or before it is loaded). Never null.
inline const char* ReturnName(Return r) {
  switch (r) {
    case kSuccess:
      return "Success";
    case kErrorUninitialized:
      return "Uninitialized";
    case kErrorInvalidArgument:
      return "Invalid Argument";
    case kErrorNotSupported:
      return "Not Supported";
    case kErrorNoPermission:
      return "Insufficient Permissions";
    case kErrorAlreadyInitialized:
      return "Already Initialized";
    case kErrorNotFound:
      return "Not Found";
    case kErrorInsufficientSize:
      return "Insufficient Size";
    case kErrorInsufficientPower:
      return "Insufficient External Power";
    case kErrorDriverNotLoaded:
      return "Driver Not Loaded";
    case kErrorTimeout:
      return "Timeout";
    case kErrorIrqIssue:
      return "Interrupt request issue";
    case kErrorLibraryNotFound:
      return "NVML Shared Library Not Found";
    case kErrorFunctionNotFound:
      return "Function Not Found";
    case kErrorCorruptedInforom:
      return "Corrupted infoROM";
    case kErrorGpuIsLost:
      return "GPU is lost";
    case kErrorResetRequired:
      return "GPU requires restart";
    case kErrorOperatingSystem:
      return "The operating system has blocked the request";
    case kErrorLibRmVersionMismatch:
      return "RM has detected an NVML/RM version mismatch";
    case kErrorInUse:
      return "In use by another client";
    case kErrorMemory:
      return "Insufficient Memory";
    case kErrorNoData:
      return "No data";
    case kErrorVgpuEccNotSupported:
      return "ECC is not supported for vGPU";
    case kErrorInsufficientResources:
      return "Insufficient resources";
    case kErrorFreqNotSupported:
      return "Frequency not supported";
    case kErrorArgumentVersionMismatch:
      return "Argument version mismatch";
    case kErrorDeprecated:
      return "Deprecated";
    case kErrorNotReady:
      return "Not ready";
    case kErrorGpuNotFound:
      return "GPU not found";
    case kErrorInvalidState:
      return "Invalid state";
    default:
      return "Unknown Error";
  }
}

// nvmlDevice_t: an opaque handle owned by the library, valid between init and shutdown.
struct DeviceOpaque;
using Device = DeviceOpaque*;

// nvmlClockType_t
inline constexpr int kClockGraphics = 0;
inline constexpr int kClockSm = 1;
inline constexpr int kClockMem = 2;
inline constexpr int kClockVideo = 3;

// nvmlTemperatureSensors_t
inline constexpr int kTemperatureGpu = 0;

// nvmlPcieUtilCounter_t. nvmlDeviceGetPcieThroughput reports KB/s (1 KB = 1024 bytes), sampled
// by the driver over a ~20 ms window.
inline constexpr int kPcieUtilTxBytes = 0;
inline constexpr int kPcieUtilRxBytes = 1;

// Buffer sizes the vendor guarantees to be enough (the *_V2_BUFFER_SIZE constants).
inline constexpr unsigned kDeviceNameBufferSize = 96;
inline constexpr unsigned kDeviceUuidBufferSize = 96;

// usedGpuMemory value meaning "the driver cannot tell" (e.g. under WDDM or without permission).
inline constexpr unsigned long long kValueNotAvailable = ~0ULL;

// Clock event ("throttle") reason bits of nvmlDeviceGetCurrentClocksEventReasons. A bitmask:
// several may be set at once; 0 means the clocks run as high as the application asked.
inline constexpr uint64_t kClocksEventGpuIdle = 0x1;
inline constexpr uint64_t kClocksEventApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kClocksEventSwPowerCap = 0x4;
inline constexpr uint64_t kClocksEventHwSlowdown = 0x8;
inline constexpr uint64_t kClocksEventSyncBoost = 0x10;
inline constexpr uint64_t kClocksEventSwThermalSlowdown = 0x20;
inline constexpr uint64_t kClocksEventHwThermalSlowdown = 0x40;
inline constexpr uint64_t kClocksEventHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kClocksEventDisplayClockSetting = 0x100;

// nvmlMemory_t (bytes).
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(Memory) == 24);

// nvmlUtilization_t (percent of the last sample period, 0..100).
struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};
static_assert(sizeof(Utilization) == 8);

// nvmlProcessInfo_v1_t: the element type of the unversioned
// nvmlDeviceGetComputeRunningProcesses.
struct ProcessInfoV1 {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
static_assert(sizeof(ProcessInfoV1) == 16 && offsetof(ProcessInfoV1, usedGpuMemory) == 8);

// nvmlProcessInfo_v2_t: the element type of nvmlDeviceGetComputeRunningProcesses_v2 and _v3
// (the drivers' _v3 kept this four-field layout). The instance ids are 0xFFFFFFFF without MIG.
struct ProcessInfoV2 {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
static_assert(sizeof(ProcessInfoV2) == 24 && offsetof(ProcessInfoV2, usedGpuMemory) == 8 &&
              offsetof(ProcessInfoV2, gpuInstanceId) == 16 &&
              offsetof(ProcessInfoV2, computeInstanceId) == 20);

// nvmlEnableState_t (e.g. the accounting mode).
inline constexpr int kFeatureDisabled = 0;
inline constexpr int kFeatureEnabled = 1;

// nvmlAccountingStats_t: what the driver keeps per process while accounting mode is enabled.
struct AccountingStats {
  unsigned int gpuUtilization;        // percent of the process's sample periods with a kernel
  unsigned int memoryUtilization;     // percent
  unsigned long long maxMemoryUsage;  // bytes, or kValueNotAvailable
  unsigned long long time;            // ms the process has run
  unsigned long long startTime;       // CPU timestamp in us
  unsigned int isRunning;
  unsigned int reserved[5];
};
static_assert(sizeof(AccountingStats) == 56 && offsetof(AccountingStats, maxMemoryUsage) == 8 &&
              offsetof(AccountingStats, isRunning) == 32);

// nvmlProcessUtilizationSample_t: one element of nvmlDeviceGetProcessUtilization. The driver
// keeps a ring of per-process samples, one per process that had non-zero utilization in one of
// its own sample periods (often ~1/6 s), stamped with the CPU time (microseconds since the Unix
// epoch) at which the period was recorded. Utilizations are percent of that period.
struct ProcessUtilizationSample {
  unsigned int pid;
  unsigned long long timeStamp;  // us, CPU (wall) clock
  unsigned int smUtil;
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
};
static_assert(sizeof(ProcessUtilizationSample) == 32 &&
              offsetof(ProcessUtilizationSample, timeStamp) == 8 &&
              offsetof(ProcessUtilizationSample, smUtil) == 16 &&
              offsetof(ProcessUtilizationSample, memUtil) == 20 &&
              offsetof(ProcessUtilizationSample, encUtil) == 24 &&
              offsetof(ProcessUtilizationSample, decUtil) == 28);

// Entry point signatures (all C calling convention).
extern "C" {
using InitFn = Return (*)();
using ShutdownFn = Return (*)();
using ErrorStringFn = const char* (*)(Return);
using DeviceGetCountFn = Return (*)(unsigned int* count);
using DeviceGetHandleByIndexFn = Return (*)(unsigned int index, Device* device);
using DeviceGetNameFn = Return (*)(Device device, char* name, unsigned int length);
using DeviceGetUuidFn = Return (*)(Device device, char* uuid, unsigned int length);
using DeviceGetMemoryInfoFn = Return (*)(Device device, Memory* memory);
using DeviceGetUtilizationRatesFn = Return (*)(Device device, Utilization* utilization);
using DeviceGetPowerUsageFn = Return (*)(Device device, unsigned int* milliwatts);
using DeviceGetTemperatureFn = Return (*)(Device device, int sensor, unsigned int* celsius);
using DeviceGetClockInfoFn = Return (*)(Device device, int clock_type, unsigned int* mhz);
using DeviceGetClocksReasonsFn = Return (*)(Device device, unsigned long long* reasons);
using DeviceGetPcieThroughputFn = Return (*)(Device device, int counter, unsigned int* kb_per_s);
using DeviceGetProcessesV2Fn = Return (*)(Device device, unsigned int* count, ProcessInfoV2* infos);
using DeviceGetProcessesV1Fn = Return (*)(Device device, unsigned int* count, ProcessInfoV1* infos);
using InitWithFlagsFn = Return (*)(unsigned int flags);
using DeviceGetAccountingModeFn = Return (*)(Device device, int* mode);
using DeviceGetAccountingStatsFn = Return (*)(Device device, unsigned int pid,
                                              AccountingStats* stats);
// samples == nullptr: a size query (NVML_ERROR_INSUFFICIENT_SIZE with *count = entries needed).
// Otherwise *count is the buffer's capacity in, the entries written out. Only samples newer than
// last_seen_us are returned (0 = all the driver keeps); none: NVML_ERROR_NOT_FOUND.
using DeviceGetProcessUtilizationFn = Return (*)(Device device, ProcessUtilizationSample* samples,
                                                 unsigned int* count,
                                                 unsigned long long last_seen_us);
}

}  // namespace gpuprof::telemetry::nvml
