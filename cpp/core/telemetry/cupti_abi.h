// The slice of the CUDA Profiling Tools Interface (CUPTI) C ABI that gpuprof uses, declared here
// so that nothing at build time depends on the CUDA toolkit. Written from the documented ABI
// (cupti_result.h, cupti_callbacks.h, cupti_activity.h, cupti_runtime_cbid.h and
// cupti_driver_cbid.h of CUDA 11.x..13.x): the numeric values and record layouts below are the
// vendor's and must not change. Shared by KernelTracer (the caller) and fake_cupti (a stand-in
// used by the tests); the static_asserts pin the layouts on x86-64 and aarch64 Linux (LP64).
//
// Activity records: CUPTI hands out the newest record version of each kind its release defines
// (CUpti_ActivityKernel4 .. Kernel11+, Memcpy5/6/7, Memset4/5). Each version only ever appended
// fields, so the prefixes declared here (up to the kernel's name, the copy's and set's
// correlation id) are identical in every version and are all gpuprof reads. The real records are
// longer; only CUPTI knows their size, which is why records are walked with
// cuptiActivityGetNextRecord and never by sizeof.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpuprof::telemetry::cupti {

// CUptiResult. Every CUPTI entry point returns one of these.
using Result = int;
inline constexpr Result kSuccess = 0;
inline constexpr Result kErrorInvalidParameter = 1;
inline constexpr Result kErrorInvalidDevice = 2;
inline constexpr Result kErrorInvalidContext = 3;
inline constexpr Result kErrorInvalidOperation = 7;
inline constexpr Result kErrorOutOfMemory = 8;
inline constexpr Result kErrorApiNotImplemented = 11;
inline constexpr Result kErrorMaxLimitReached = 12;  // also: no more records in the buffer
inline constexpr Result kErrorNotReady = 13;
inline constexpr Result kErrorNotCompatible = 14;
inline constexpr Result kErrorNotInitialized = 15;
inline constexpr Result kErrorInvalidKind = 21;
inline constexpr Result kErrorDisabled = 23;
inline constexpr Result kErrorNotSupported = 27;
inline constexpr Result kErrorVirtualizedDeviceNotSupported = 33;
inline constexpr Result kErrorInsufficientPrivileges = 35;
inline constexpr Result kErrorMultipleSubscribersNotSupported = 39;
inline constexpr Result kErrorConfidentialComputingNotSupported = 41;
inline constexpr Result kErrorUnknown = 999;

// A short name for a result code, for messages when the library offers no
// cuptiGetResultString (or before it is loaded). Never null.
inline const char* ResultName(Result r) {
  switch (r) {
    case kSuccess:
      return "CUPTI_SUCCESS";
    case kErrorInvalidParameter:
      return "CUPTI_ERROR_INVALID_PARAMETER";
    case kErrorInvalidDevice:
      return "CUPTI_ERROR_INVALID_DEVICE";
    case kErrorInvalidContext:
      return "CUPTI_ERROR_INVALID_CONTEXT";
    case kErrorInvalidOperation:
      return "CUPTI_ERROR_INVALID_OPERATION";
    case kErrorOutOfMemory:
      return "CUPTI_ERROR_OUT_OF_MEMORY";
    case kErrorApiNotImplemented:
      return "CUPTI_ERROR_API_NOT_IMPLEMENTED";
    case kErrorMaxLimitReached:
      return "CUPTI_ERROR_MAX_LIMIT_REACHED";
    case kErrorNotReady:
      return "CUPTI_ERROR_NOT_READY";
    case kErrorNotCompatible:
      return "CUPTI_ERROR_NOT_COMPATIBLE";
    case kErrorNotInitialized:
      return "CUPTI_ERROR_NOT_INITIALIZED";
    case kErrorInvalidKind:
      return "CUPTI_ERROR_INVALID_KIND";
    case kErrorDisabled:
      return "CUPTI_ERROR_DISABLED";
    case kErrorNotSupported:
      return "CUPTI_ERROR_NOT_SUPPORTED";
    case kErrorVirtualizedDeviceNotSupported:
      return "CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED";
    case kErrorInsufficientPrivileges:
      return "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES";
    case kErrorMultipleSubscribersNotSupported:
      return "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
    case kErrorConfidentialComputingNotSupported:
      return "CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED";
    case kErrorUnknown:
      return "CUPTI_ERROR_UNKNOWN";
    default:
      return "unknown CUPTI result";
  }
}

// Opaque handles.
struct ContextOpaque;  // CUcontext
using Context = ContextOpaque*;
struct SubscriberOpaque;  // CUpti_SubscriberHandle
using SubscriberHandle = SubscriberOpaque*;

// CUpti_CallbackDomain.
using CallbackDomain = int;
inline constexpr CallbackDomain kDomainInvalid = 0;
inline constexpr CallbackDomain kDomainDriverApi = 1;
inline constexpr CallbackDomain kDomainRuntimeApi = 2;

// CUpti_CallbackId: a cbid from the runtime or driver table below, depending on the domain.
using CallbackId = uint32_t;

// CUpti_ApiCallbackSite.
inline constexpr int kApiEnter = 0;
inline constexpr int kApiExit = 1;

// CUpti_CallbackData: what a runtime- or driver-API callback receives as `cbdata`. Valid only
// during the callback.
struct CallbackData {
  int32_t callbackSite;  // kApiEnter / kApiExit
  const char* functionName;
  const void* functionParams;
  void* functionReturnValue;
  const char* symbolName;  // the kernel's name for launch callbacks
  Context context;
  uint32_t contextUid;
  uint64_t* correlationData;
  // Equals the correlationId of the activity records (API, kernel, memcpy, memset) of this call.
  uint32_t correlationId;
};
static_assert(offsetof(CallbackData, functionName) == 8 &&
              offsetof(CallbackData, symbolName) == 32 && offsetof(CallbackData, context) == 40 &&
              offsetof(CallbackData, contextUid) == 48 &&
              offsetof(CallbackData, correlationData) == 56 &&
              offsetof(CallbackData, correlationId) == 64 && sizeof(CallbackData) == 72);

// Runtime-API callback ids (CUpti_runtime_api_trace_cbid) used by KernelTracer.
namespace rt {
inline constexpr CallbackId kCudaLaunch_v3020 = 13;
inline constexpr CallbackId kCudaMemcpy_v3020 = 31;
inline constexpr CallbackId kCudaMemcpy2D_v3020 = 32;
inline constexpr CallbackId kCudaMemcpyAsync_v3020 = 41;
inline constexpr CallbackId kCudaMemcpy2DAsync_v3020 = 44;
inline constexpr CallbackId kCudaMemset_v3020 = 49;
inline constexpr CallbackId kCudaMemset2D_v3020 = 50;
inline constexpr CallbackId kCudaMemsetAsync_v3020 = 51;
inline constexpr CallbackId kCudaMemset2DAsync_v3020 = 52;
inline constexpr CallbackId kCudaMemcpyPeer_v4000 = 160;
inline constexpr CallbackId kCudaMemcpyPeerAsync_v4000 = 161;
inline constexpr CallbackId kCudaLaunchKernel_v7000 = 211;
inline constexpr CallbackId kCudaLaunch_ptsz_v7000 = 213;
inline constexpr CallbackId kCudaLaunchKernel_ptsz_v7000 = 214;
inline constexpr CallbackId kCudaMemcpy_ptds_v7000 = 215;
inline constexpr CallbackId kCudaMemcpy2D_ptds_v7000 = 216;
inline constexpr CallbackId kCudaMemcpyAsync_ptsz_v7000 = 225;
inline constexpr CallbackId kCudaMemcpy2DAsync_ptsz_v7000 = 228;
inline constexpr CallbackId kCudaMemset_ptds_v7000 = 233;
inline constexpr CallbackId kCudaMemset2D_ptds_v7000 = 234;
inline constexpr CallbackId kCudaMemsetAsync_ptsz_v7000 = 235;
inline constexpr CallbackId kCudaMemset2DAsync_ptsz_v7000 = 236;
inline constexpr CallbackId kCudaLaunchCooperativeKernel_v9000 = 269;
inline constexpr CallbackId kCudaLaunchCooperativeKernel_ptsz_v9000 = 270;
inline constexpr CallbackId kCudaLaunchCooperativeKernelMultiDevice_v9000 = 272;
inline constexpr CallbackId kCudaGraphLaunch_v10000 = 311;
inline constexpr CallbackId kCudaGraphLaunch_ptsz_v10000 = 312;
inline constexpr CallbackId kCudaLaunchKernelExC_v11060 = 430;
inline constexpr CallbackId kCudaLaunchKernelExC_ptsz_v11060 = 431;
}  // namespace rt

// Driver-API callback ids (CUpti_driver_api_trace_cbid) used by KernelTracer.
namespace drv {
inline constexpr CallbackId kCuLaunch = 115;
inline constexpr CallbackId kCuLaunchGrid = 116;
inline constexpr CallbackId kCuLaunchGridAsync = 117;
inline constexpr CallbackId kCuLaunchKernel = 307;
inline constexpr CallbackId kCuLaunchKernel_ptsz = 442;
inline constexpr CallbackId kCuLaunchCooperativeKernel = 477;
inline constexpr CallbackId kCuLaunchCooperativeKernel_ptsz = 478;
inline constexpr CallbackId kCuLaunchCooperativeKernelMultiDevice = 480;
inline constexpr CallbackId kCuGraphLaunch = 514;
inline constexpr CallbackId kCuGraphLaunch_ptsz = 515;
inline constexpr CallbackId kCuLaunchKernelEx = 652;
inline constexpr CallbackId kCuLaunchKernelEx_ptsz = 653;
}  // namespace drv

// CUpti_ActivityKind (the kinds gpuprof enables or recognises).
using ActivityKind = int;
inline constexpr ActivityKind kActivityInvalid = 0;
inline constexpr ActivityKind kActivityMemcpy = 1;
inline constexpr ActivityKind kActivityMemset = 2;
inline constexpr ActivityKind kActivityKernel = 3;  // serialises kernels: not used
inline constexpr ActivityKind kActivityDriver = 4;
inline constexpr ActivityKind kActivityRuntime = 5;
inline constexpr ActivityKind kActivityConcurrentKernel = 10;

// CUpti_ActivityFlag for cuptiActivityFlushAll: also deliver buffers that are not full yet.
inline constexpr uint32_t kActivityFlagFlushForced = 1u << 0;

// Activity records are 8-byte aligned (ACTIVITY_RECORD_ALIGNMENT).
inline constexpr size_t kRecordAlignment = 8;

// CUpti_Activity: the common head of every record.
struct Activity {
  uint32_t kind;
};

// The common prefix of CUpti_ActivityKernel4 .. Kernel11 (kinds KERNEL and CONCURRENT_KERNEL).
// Timestamps are ns on CUPTI's clock (cuptiGetTimestamp); start == end == 0 means CUPTI could not
// collect them.
struct KernelRecordPrefix {
  uint32_t kind;
  uint8_t cacheConfig;
  uint8_t sharedMemoryConfig;
  uint16_t registersPerThread;
  uint32_t partitionedGlobalCacheRequested;
  uint32_t partitionedGlobalCacheExecuted;
  uint64_t start;
  uint64_t end;
  uint64_t completed;
  uint32_t deviceId;
  uint32_t contextId;
  uint32_t streamId;
  int32_t gridX, gridY, gridZ;
  int32_t blockX, blockY, blockZ;
  int32_t staticSharedMemory;
  int32_t dynamicSharedMemory;
  uint32_t localMemoryPerThread;
  uint32_t localMemoryTotal;
  uint32_t correlationId;  // the correlationId of the launching API call
  int64_t gridId;
  const char* name;  // owned by CUPTI, shared by every record of the same kernel
};
static_assert(offsetof(KernelRecordPrefix, start) == 16 &&
              offsetof(KernelRecordPrefix, end) == 24 &&
              offsetof(KernelRecordPrefix, deviceId) == 40 &&
              offsetof(KernelRecordPrefix, streamId) == 48 &&
              offsetof(KernelRecordPrefix, gridX) == 52 &&
              offsetof(KernelRecordPrefix, blockX) == 64 &&
              offsetof(KernelRecordPrefix, correlationId) == 92 &&
              offsetof(KernelRecordPrefix, gridId) == 96 &&
              offsetof(KernelRecordPrefix, name) == 104 && sizeof(KernelRecordPrefix) == 112);

// The common prefix of CUpti_ActivityMemcpy3 .. Memcpy7 (kind MEMCPY).
struct MemcpyRecordPrefix {
  uint32_t kind;
  uint8_t copyKind;
  uint8_t srcKind;
  uint8_t dstKind;
  uint8_t flags;
  uint64_t bytes;
  uint64_t start;
  uint64_t end;
  uint32_t deviceId;
  uint32_t contextId;
  uint32_t streamId;
  uint32_t correlationId;
};
static_assert(offsetof(MemcpyRecordPrefix, bytes) == 8 &&
              offsetof(MemcpyRecordPrefix, start) == 16 &&
              offsetof(MemcpyRecordPrefix, deviceId) == 32 &&
              offsetof(MemcpyRecordPrefix, correlationId) == 44 &&
              sizeof(MemcpyRecordPrefix) == 48);

// The common prefix of CUpti_ActivityMemset2 .. Memset5 (kind MEMSET).
struct MemsetRecordPrefix {
  uint32_t kind;
  uint32_t value;
  uint64_t bytes;
  uint64_t start;
  uint64_t end;
  uint32_t deviceId;
  uint32_t contextId;
  uint32_t streamId;
  uint32_t correlationId;
};
static_assert(offsetof(MemsetRecordPrefix, bytes) == 8 &&
              offsetof(MemsetRecordPrefix, start) == 16 &&
              offsetof(MemsetRecordPrefix, deviceId) == 32 &&
              offsetof(MemsetRecordPrefix, correlationId) == 44 &&
              sizeof(MemsetRecordPrefix) == 48);

// Entry point and callback signatures (all C calling convention).
extern "C" {
using CallbackFunc = void (*)(void* userdata, CallbackDomain domain, CallbackId cbid,
                              const void* cbdata);
// CUPTI asks for an empty buffer: set *buffer (8-byte aligned) and *size; *max_num_records 0
// means "as many as fit". A null buffer makes CUPTI drop the records it wanted to write.
using BufferRequestedFunc = void (*)(uint8_t** buffer, size_t* size, size_t* max_num_records);
// CUPTI returns a buffer holding valid_size bytes of records; the callee owns it again.
using BufferCompletedFunc = void (*)(Context context, uint32_t stream_id, uint8_t* buffer,
                                     size_t size, size_t valid_size);

using GetResultStringFn = Result (*)(Result result, const char** str);
using GetVersionFn = Result (*)(uint32_t* version);
using SubscribeFn = Result (*)(SubscriberHandle* subscriber, CallbackFunc callback, void* userdata);
using UnsubscribeFn = Result (*)(SubscriberHandle subscriber);
using EnableCallbackFn = Result (*)(uint32_t enable, SubscriberHandle subscriber,
                                    CallbackDomain domain, CallbackId cbid);
using ActivityEnableFn = Result (*)(ActivityKind kind);
using ActivityDisableFn = Result (*)(ActivityKind kind);
using ActivityRegisterCallbacksFn = Result (*)(BufferRequestedFunc requested,
                                               BufferCompletedFunc completed);
using ActivityFlushAllFn = Result (*)(uint32_t flag);
// Returns kErrorMaxLimitReached when the buffer holds no further record.
using ActivityGetNextRecordFn = Result (*)(uint8_t* buffer, size_t valid_size, Activity** record);
// The records dropped for (context, stream) since the previous call (the count then resets).
using ActivityGetNumDroppedRecordsFn = Result (*)(Context context, uint32_t stream_id,
                                                  size_t* dropped);
}

}  // namespace gpuprof::telemetry::cupti
