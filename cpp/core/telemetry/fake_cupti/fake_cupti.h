/* fake_cupti: a stand-in for NVIDIA's CUPTI library (libcupti.so) that speaks the subset of the
 * C ABI that gpuprof's KernelTracer uses (telemetry/cupti_abi.h), so tests load the tracer's real
 * dlopen/dlsym path without a GPU. Built as <build>/fake_cupti/libcupti.so (CMake target
 * fake_cupti; under `pip install` with tests on: build/py/fake_cupti/libcupti.so).
 *
 * CUPTI entry points (behave like CUPTI's, with the deviations noted):
 *   cuptiGetResultString, cuptiGetVersion (returns 130000), cuptiSubscribe (one subscriber: a
 *   second returns 39 MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED), cuptiUnsubscribe, cuptiEnableCallback
 *   (accepts any cbid), cuptiActivityEnable/Disable, cuptiActivityRegisterCallbacks,
 *   cuptiActivityFlushAll (delivers the current buffer if it holds records, on the calling
 *   thread, forced or not), cuptiActivityGetNextRecord, cuptiActivityGetNumDroppedRecords (the
 *   drops since the previous call, whatever the context/stream arguments).
 *
 * GPU work is simulated by the control functions below. A simulated API call invokes the
 * subscriber's callback on the calling thread (enter, then exit) only if that (domain, cbid) was
 * enabled with cuptiEnableCallback, each call with a new correlation id (ids count up from 1 for
 * the life of the library). Its activity record is written only if its kind is enabled
 * (CONCURRENT_KERNEL or KERNEL for kernels, MEMCPY, MEMSET), into the current buffer obtained
 * from the registered request callback. A record that does not fit completes the buffer: the
 * completion callback runs on the calling thread (the fake's lock held: a completion callback
 * may call cuptiActivityGetNextRecord and cuptiActivityGetNumDroppedRecords, nothing else of the
 * fake) and a new buffer is requested. No buffer (no callbacks registered, or the request
 * callback returned none or one too small for the record) drops the record and counts it, as
 * CUPTI does. Records are longer than the documented prefixes (kernel 224 bytes, memcpy 96,
 * memset 80) and zero past them; kernel names are interned (stable pointers). Kernel records
 * carry deviceId 0, grid (1, 1, 1) and block (128, 1, 1) unless fake_cupti_launch_config says
 * otherwise; contextId is always 1.
 *
 * Time: each stream has its own timeline starting at 1'000'000'000 ns; work with start_ns == 0
 * starts where the stream's previous work ended (so work on one stream runs back to back and
 * work on different streams overlaps); an explicit start_ns is used as given. Timelines are per
 * stream number, whatever the device.
 *
 * Control functions (C linkage; also meant for ctypes):
 */
#pragma once

#include <stdint.h>

/* How fake_cupti_launch_via starts a kernel. */
#define FAKE_CUPTI_VIA_RUNTIME 0 /* runtime cudaLaunchKernel (cbid 211) */
#define FAKE_CUPTI_VIA_DRIVER 1  /* driver cuLaunchKernel (cbid 307) */
/* runtime cudaLaunchKernel whose enter callback is followed (before its exit) by a nested driver
 * cuLaunchKernel with its own correlation id; the record carries the driver call's id. */
#define FAKE_CUPTI_VIA_RUNTIME_NESTED_DRIVER 2
#define FAKE_CUPTI_VIA_NONE 3       /* no API callback: no traced call saw the record's id */
#define FAKE_CUPTI_VIA_RUNTIME_EX 4 /* runtime cudaLaunchKernelExC (cbid 430) */
#define FAKE_CUPTI_VIA_DRIVER_EX 5  /* driver cuLaunchKernelEx (cbid 652) */
#define FAKE_CUPTI_VIA_GRAPH 6      /* runtime cudaGraphLaunch (cbid 311) */
#define FAKE_CUPTI_VIA_RUNTIME_NO_TIMESTAMPS 7 /* as RUNTIME, but the record's start = end = 0 */

#ifdef __cplusplus
extern "C" {
#endif

/* One kernel through the runtime API on `stream`, lasting duration_ns, starting where the
 * stream's previous work ended. Returns the record's correlation id. */
uint32_t fake_cupti_launch(const char* name, uint64_t duration_ns, uint32_t stream);
/* One kernel started as `via` says (FAKE_CUPTI_VIA_*); start_ns 0 = where the stream's previous
 * work ended. Returns the record's correlation id, 0 for an unknown `via`. */
uint32_t fake_cupti_launch_via(const char* name, uint64_t start_ns, uint64_t duration_ns,
                               uint32_t stream, int via);
/* As fake_cupti_launch, with the record's launch configuration chosen: deviceId `device`,
 * gridX/Y/Z = grid[0..2], blockX/Y/Z = block[0..2] (a null grid or block keeps the defaults
 * above). Returns the record's correlation id. */
uint32_t fake_cupti_launch_config(const char* name, uint64_t duration_ns, uint32_t stream,
                                  uint32_t device, const int32_t grid[3], const int32_t block[3]);
/* One cudaMemcpyAsync (cbid 41) / cudaMemsetAsync (cbid 51) of `bytes`. Returns the id. */
uint32_t fake_cupti_memcpy(uint64_t bytes, uint64_t duration_ns, uint32_t stream);
uint32_t fake_cupti_memset(uint64_t bytes, uint64_t duration_ns, uint32_t stream);
/* Simulates n calls of one API entry point (domain 1 driver / 2 runtime, a cbid): enter and
 * exit callbacks with new correlation ids, no activity records, no locking per call. For
 * measuring a subscriber's callback cost. Returns the callbacks delivered (2n, or 0 when that
 * callback is not enabled). */
uint64_t fake_cupti_api_calls(int domain, uint32_t cbid, uint64_t n);
/* Adds n to the dropped-record count the next cuptiActivityGetNumDroppedRecords reports. */
void fake_cupti_drop(uint64_t n);
/* Makes an entry point return `result` (a CUptiResult; 0 clears). `function` is an entry point
 * name ("cuptiSubscribe", "cuptiEnableCallback", "cuptiActivityEnable",
 * "cuptiActivityRegisterCallbacks", "cuptiActivityFlushAll", "cuptiGetVersion"), or
 * "cuptiEnableCallback:<domain>:<cbid>" / "cuptiActivityEnable:<kind>" for one argument only. */
void fake_cupti_set_failure(const char* function, int result);
/* Forgets failures, the subscriber, enabled callbacks and kinds, registered buffer callbacks
 * (the current buffer is first handed back through the completion callback with no records),
 * pending drops and stream timelines. Correlation ids keep counting up. */
void fake_cupti_reset(void);
/* State queries. */
int fake_cupti_subscribed(void);
int fake_cupti_callback_enabled(int domain, uint32_t cbid);
int fake_cupti_activity_enabled(int kind);
uint64_t fake_cupti_buffered_records(void); /* written but not yet delivered */

#ifdef __cplusplus
}
#endif
