// fake_cupti: CUPTI stand-in for tests. Behaviour and control functions: fake_cupti.h.
#include "telemetry/fake_cupti/fake_cupti.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "telemetry/cupti_abi.h"

#define FAKE_CUPTI_EXPORT extern "C" __attribute__((visibility("default")))

namespace cu = gpuprof::telemetry::cupti;

namespace {

constexpr uint32_t kVersion = 130000;
constexpr uint64_t kEpochNs = 1'000'000'000;
constexpr size_t kKernelRecordBytes = 224;
constexpr size_t kMemcpyRecordBytes = 96;
constexpr size_t kMemsetRecordBytes = 80;
static_assert(kKernelRecordBytes % cu::kRecordAlignment == 0 &&
              kKernelRecordBytes >= sizeof(cu::KernelRecordPrefix));
static_assert(kMemcpyRecordBytes % cu::kRecordAlignment == 0 &&
              kMemcpyRecordBytes >= sizeof(cu::MemcpyRecordPrefix));
static_assert(kMemsetRecordBytes % cu::kRecordAlignment == 0 &&
              kMemsetRecordBytes >= sizeof(cu::MemsetRecordPrefix));

struct SubscriberTag {};
SubscriberTag g_subscriber_object;
cu::SubscriberHandle SubscriberHandleValue() {
  return reinterpret_cast<cu::SubscriberHandle>(&g_subscriber_object);
}

struct State {
  std::mutex mu;
  bool subscribed = false;
  cu::CallbackFunc callback = nullptr;
  void* userdata = nullptr;
  std::set<std::pair<int, uint32_t>> callbacks;
  std::set<int> kinds;
  cu::BufferRequestedFunc requested = nullptr;
  cu::BufferCompletedFunc completed = nullptr;
  uint8_t* buffer = nullptr;
  size_t size = 0;
  size_t used = 0;
  uint64_t buffered = 0;
  std::map<uint32_t, uint64_t> stream_tail;
  std::map<std::string, int> failures;
  std::set<std::string> names;  // never cleared: record name pointers stay valid
};

State& S() {
  static State state;
  return state;
}

std::atomic<uint32_t> g_next_id{1};
std::atomic<uint64_t> g_dropped{0};

// mu held.
int Failure(const std::string& key) {
  auto it = S().failures.find(key);
  return it == S().failures.end() ? cu::kSuccess : it->second;
}

size_t RecordBytes(uint32_t kind) {
  switch (static_cast<int>(kind)) {
    case cu::kActivityKernel:
    case cu::kActivityConcurrentKernel:
      return kKernelRecordBytes;
    case cu::kActivityMemcpy:
      return kMemcpyRecordBytes;
    case cu::kActivityMemset:
      return kMemsetRecordBytes;
    default:
      return 0;
  }
}

// mu held. Hands the current buffer back to its owner.
void DeliverLocked() {
  State& s = S();
  if (s.buffer == nullptr) return;
  uint8_t* buffer = s.buffer;
  size_t size = s.size, used = s.used;
  s.buffer = nullptr;
  s.size = s.used = 0;
  s.buffered = 0;
  if (s.completed != nullptr) s.completed(nullptr, 0, buffer, size, used);
}

// mu held. Room for `bytes` more, or null (the record is dropped and counted).
uint8_t* ReserveLocked(size_t bytes) {
  State& s = S();
  if (s.buffer != nullptr && s.used + bytes > s.size) DeliverLocked();
  if (s.buffer == nullptr) {
    if (s.requested == nullptr) return nullptr;
    uint8_t* buffer = nullptr;
    size_t size = 0, max_records = 0;
    s.requested(&buffer, &size, &max_records);
    if (buffer == nullptr) return nullptr;
    if (size < bytes) {
      if (s.completed != nullptr) s.completed(nullptr, 0, buffer, size, 0);
      return nullptr;
    }
    s.buffer = buffer;
    s.size = size;
    s.used = 0;
  }
  uint8_t* at = s.buffer + s.used;
  std::memset(at, 0, bytes);
  s.used += bytes;
  ++s.buffered;
  return at;
}

// mu held. Start time on `stream`'s timeline.
uint64_t PlaceLocked(uint32_t stream, uint64_t start_ns, uint64_t duration_ns) {
  uint64_t& tail = S().stream_tail.try_emplace(stream, kEpochNs).first->second;
  uint64_t start = start_ns != 0 ? start_ns : tail;
  tail = std::max(tail, start + duration_ns);
  return start;
}

// Invokes the subscriber for one API call (enter, optionally a nested call, exit).
void Invoke(int domain, uint32_t cbid, int site, uint32_t id, const char* function,
            const char* symbol) {
  cu::CallbackFunc callback = nullptr;
  void* userdata = nullptr;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    if (!S().subscribed || S().callbacks.count({domain, cbid}) == 0) return;
    callback = S().callback;
    userdata = S().userdata;
  }
  uint64_t correlation_data = 0;
  int return_value = 0;
  cu::CallbackData data{};
  data.callbackSite = site;
  data.functionName = function;
  data.functionParams = nullptr;
  data.functionReturnValue = &return_value;
  data.symbolName = symbol;
  data.context = reinterpret_cast<cu::Context>(&g_subscriber_object);
  data.contextUid = 1;
  data.correlationData = &correlation_data;
  data.correlationId = id;
  callback(userdata, domain, cbid, &data);
}

void Call(int domain, uint32_t cbid, uint32_t id, const char* function, const char* symbol) {
  Invoke(domain, cbid, cu::kApiEnter, id, function, symbol);
  Invoke(domain, cbid, cu::kApiExit, id, function, symbol);
}

bool KernelKindEnabledLocked() {
  return S().kinds.count(cu::kActivityConcurrentKernel) != 0 ||
         S().kinds.count(cu::kActivityKernel) != 0;
}

// Where and how a simulated kernel runs (the record's deviceId, grid and block).
struct LaunchConfig {
  uint32_t device = 0;
  int32_t grid[3] = {1, 1, 1};
  int32_t block[3] = {128, 1, 1};
};

void EmitKernel(const char* name, uint64_t start_ns, uint64_t duration_ns, uint32_t stream,
                uint32_t id, bool timestamps, const LaunchConfig& config = {}) {
  std::lock_guard<std::mutex> lock(S().mu);
  uint64_t start = PlaceLocked(stream, start_ns, duration_ns);
  if (!KernelKindEnabledLocked()) return;
  uint8_t* at = ReserveLocked(kKernelRecordBytes);
  if (at == nullptr) {
    g_dropped.fetch_add(1);
    return;
  }
  const char* interned = S().names.insert(name != nullptr ? name : "").first->c_str();
  cu::KernelRecordPrefix k{};
  k.kind = S().kinds.count(cu::kActivityConcurrentKernel) != 0 ? cu::kActivityConcurrentKernel
                                                               : cu::kActivityKernel;
  k.start = timestamps ? start : 0;
  k.end = timestamps ? start + duration_ns : 0;
  k.completed = k.end;
  k.deviceId = config.device;
  k.contextId = 1;
  k.streamId = stream;
  k.gridX = config.grid[0];
  k.gridY = config.grid[1];
  k.gridZ = config.grid[2];
  k.blockX = config.block[0];
  k.blockY = config.block[1];
  k.blockZ = config.block[2];
  k.correlationId = id;
  k.gridId = id;
  k.name = interned;
  std::memcpy(at, &k, sizeof k);
}

template <typename Record>
void EmitCopy(int kind, uint64_t bytes, uint64_t duration_ns, uint32_t stream, uint32_t id) {
  std::lock_guard<std::mutex> lock(S().mu);
  uint64_t start = PlaceLocked(stream, 0, duration_ns);
  if (S().kinds.count(kind) == 0) return;
  uint8_t* at = ReserveLocked(RecordBytes(static_cast<uint32_t>(kind)));
  if (at == nullptr) {
    g_dropped.fetch_add(1);
    return;
  }
  Record r{};
  r.kind = static_cast<uint32_t>(kind);
  r.bytes = bytes;
  r.start = start;
  r.end = start + duration_ns;
  r.contextId = 1;
  r.streamId = stream;
  r.correlationId = id;
  std::memcpy(at, &r, sizeof r);
}

uint32_t NextId() { return g_next_id.fetch_add(1); }

}  // namespace

// ---- CUPTI entry points ---------------------------------------------------------------------

FAKE_CUPTI_EXPORT cu::Result cuptiGetResultString(cu::Result result, const char** str) {
  if (str == nullptr) return cu::kErrorInvalidParameter;
  const char* name = cu::ResultName(result);
  if (std::strcmp(name, "unknown CUPTI result") == 0) return cu::kErrorInvalidParameter;
  *str = name;
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiGetVersion(uint32_t* version) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (int f = Failure("cuptiGetVersion")) return f;
  if (version == nullptr) return cu::kErrorInvalidParameter;
  *version = kVersion;
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiSubscribe(cu::SubscriberHandle* subscriber,
                                            cu::CallbackFunc callback, void* userdata) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (int f = Failure("cuptiSubscribe")) return f;
  if (subscriber == nullptr) return cu::kErrorInvalidParameter;
  if (S().subscribed) return cu::kErrorMultipleSubscribersNotSupported;
  S().subscribed = true;
  S().callback = callback;
  S().userdata = userdata;
  *subscriber = SubscriberHandleValue();
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiUnsubscribe(cu::SubscriberHandle subscriber) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (!S().subscribed || subscriber != SubscriberHandleValue()) return cu::kErrorInvalidParameter;
  S().subscribed = false;
  S().callback = nullptr;
  S().userdata = nullptr;
  S().callbacks.clear();
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiEnableCallback(uint32_t enable, cu::SubscriberHandle subscriber,
                                                 cu::CallbackDomain domain, cu::CallbackId cbid) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (int f = Failure("cuptiEnableCallback")) return f;
  if (int f =
          Failure("cuptiEnableCallback:" + std::to_string(domain) + ":" + std::to_string(cbid))) {
    return f;
  }
  if (!S().subscribed || subscriber != SubscriberHandleValue()) return cu::kErrorInvalidParameter;
  if (domain != cu::kDomainDriverApi && domain != cu::kDomainRuntimeApi) {
    return cu::kErrorInvalidParameter;
  }
  if (enable != 0) {
    S().callbacks.insert({domain, cbid});
  } else {
    S().callbacks.erase({domain, cbid});
  }
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiActivityEnable(cu::ActivityKind kind) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (int f = Failure("cuptiActivityEnable")) return f;
  if (int f = Failure("cuptiActivityEnable:" + std::to_string(kind))) return f;
  if (kind <= cu::kActivityInvalid) return cu::kErrorInvalidKind;
  S().kinds.insert(kind);
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiActivityDisable(cu::ActivityKind kind) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (kind <= cu::kActivityInvalid) return cu::kErrorInvalidKind;
  S().kinds.erase(kind);
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiActivityRegisterCallbacks(cu::BufferRequestedFunc requested,
                                                            cu::BufferCompletedFunc completed) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (int f = Failure("cuptiActivityRegisterCallbacks")) return f;
  if (requested == nullptr || completed == nullptr) return cu::kErrorInvalidParameter;
  S().requested = requested;
  S().completed = completed;
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiActivityFlushAll(uint32_t) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (int f = Failure("cuptiActivityFlushAll")) return f;
  if (S().buffer != nullptr && S().used > 0) DeliverLocked();
  return cu::kSuccess;
}

// Lock-free: called from inside completion callbacks.
FAKE_CUPTI_EXPORT cu::Result cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid_size,
                                                        cu::Activity** record) {
  if (buffer == nullptr || record == nullptr) return cu::kErrorInvalidParameter;
  size_t offset = 0;
  if (*record != nullptr) {
    auto* current = reinterpret_cast<uint8_t*>(*record);
    if (current < buffer || current >= buffer + valid_size) return cu::kErrorInvalidParameter;
    size_t bytes = RecordBytes((*record)->kind);
    if (bytes == 0) return cu::kErrorInvalidKind;
    offset = static_cast<size_t>(current - buffer) + bytes;
  }
  if (offset + sizeof(cu::Activity) > valid_size) return cu::kErrorMaxLimitReached;
  *record = reinterpret_cast<cu::Activity*>(buffer + offset);
  return cu::kSuccess;
}

FAKE_CUPTI_EXPORT cu::Result cuptiActivityGetNumDroppedRecords(cu::Context, uint32_t,
                                                               size_t* dropped) {
  if (dropped == nullptr) return cu::kErrorInvalidParameter;
  *dropped = static_cast<size_t>(g_dropped.exchange(0));
  return cu::kSuccess;
}

// ---- control functions ----------------------------------------------------------------------

FAKE_CUPTI_EXPORT uint32_t fake_cupti_launch_via(const char* name, uint64_t start_ns,
                                                 uint64_t duration_ns, uint32_t stream, int via) {
  uint32_t id = 0;
  switch (via) {
    case FAKE_CUPTI_VIA_RUNTIME:
    case FAKE_CUPTI_VIA_RUNTIME_NO_TIMESTAMPS:
      id = NextId();
      Call(cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernel_v7000, id, "cudaLaunchKernel_v7000",
           name);
      break;
    case FAKE_CUPTI_VIA_DRIVER:
      id = NextId();
      Call(cu::kDomainDriverApi, cu::drv::kCuLaunchKernel, id, "cuLaunchKernel", name);
      break;
    case FAKE_CUPTI_VIA_RUNTIME_NESTED_DRIVER: {
      uint32_t outer = NextId();
      Invoke(cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernel_v7000, cu::kApiEnter, outer,
             "cudaLaunchKernel_v7000", name);
      id = NextId();
      Call(cu::kDomainDriverApi, cu::drv::kCuLaunchKernel, id, "cuLaunchKernel", name);
      Invoke(cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernel_v7000, cu::kApiExit, outer,
             "cudaLaunchKernel_v7000", name);
      break;
    }
    case FAKE_CUPTI_VIA_NONE:
      id = NextId();
      break;
    case FAKE_CUPTI_VIA_RUNTIME_EX:
      id = NextId();
      Call(cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernelExC_v11060, id,
           "cudaLaunchKernelExC_v11060", name);
      break;
    case FAKE_CUPTI_VIA_DRIVER_EX:
      id = NextId();
      Call(cu::kDomainDriverApi, cu::drv::kCuLaunchKernelEx, id, "cuLaunchKernelEx", name);
      break;
    case FAKE_CUPTI_VIA_GRAPH:
      id = NextId();
      Call(cu::kDomainRuntimeApi, cu::rt::kCudaGraphLaunch_v10000, id, "cudaGraphLaunch_v10000",
           nullptr);
      break;
    default:
      return 0;
  }
  EmitKernel(name, start_ns, duration_ns, stream, id, via != FAKE_CUPTI_VIA_RUNTIME_NO_TIMESTAMPS);
  return id;
}

FAKE_CUPTI_EXPORT uint32_t fake_cupti_launch(const char* name, uint64_t duration_ns,
                                             uint32_t stream) {
  return fake_cupti_launch_via(name, 0, duration_ns, stream, FAKE_CUPTI_VIA_RUNTIME);
}

FAKE_CUPTI_EXPORT uint32_t fake_cupti_launch_config(const char* name, uint64_t duration_ns,
                                                    uint32_t stream, uint32_t device,
                                                    const int32_t grid[3], const int32_t block[3]) {
  LaunchConfig config;
  config.device = device;
  if (grid != nullptr) std::copy(grid, grid + 3, config.grid);
  if (block != nullptr) std::copy(block, block + 3, config.block);
  uint32_t id = NextId();
  Call(cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernel_v7000, id, "cudaLaunchKernel_v7000", name);
  EmitKernel(name, 0, duration_ns, stream, id, true, config);
  return id;
}

FAKE_CUPTI_EXPORT uint32_t fake_cupti_memcpy(uint64_t bytes, uint64_t duration_ns,
                                             uint32_t stream) {
  uint32_t id = NextId();
  Call(cu::kDomainRuntimeApi, cu::rt::kCudaMemcpyAsync_v3020, id, "cudaMemcpyAsync_v3020", nullptr);
  EmitCopy<cu::MemcpyRecordPrefix>(cu::kActivityMemcpy, bytes, duration_ns, stream, id);
  return id;
}

FAKE_CUPTI_EXPORT uint32_t fake_cupti_memset(uint64_t bytes, uint64_t duration_ns,
                                             uint32_t stream) {
  uint32_t id = NextId();
  Call(cu::kDomainRuntimeApi, cu::rt::kCudaMemsetAsync_v3020, id, "cudaMemsetAsync_v3020", nullptr);
  EmitCopy<cu::MemsetRecordPrefix>(cu::kActivityMemset, bytes, duration_ns, stream, id);
  return id;
}

FAKE_CUPTI_EXPORT uint64_t fake_cupti_api_calls(int domain, uint32_t cbid, uint64_t n) {
  cu::CallbackFunc callback = nullptr;
  void* userdata = nullptr;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    if (!S().subscribed || S().callbacks.count({domain, cbid}) == 0) return 0;
    callback = S().callback;
    userdata = S().userdata;
  }
  uint64_t correlation_data = 0;
  cu::CallbackData data{};
  data.functionName = "fake_cupti_api_calls";
  data.symbolName = "k";
  data.context = reinterpret_cast<cu::Context>(&g_subscriber_object);
  data.contextUid = 1;
  data.correlationData = &correlation_data;
  for (uint64_t i = 0; i < n; ++i) {
    data.correlationId = NextId();
    data.callbackSite = cu::kApiEnter;
    callback(userdata, domain, cbid, &data);
    data.callbackSite = cu::kApiExit;
    callback(userdata, domain, cbid, &data);
  }
  return 2 * n;
}

FAKE_CUPTI_EXPORT void fake_cupti_drop(uint64_t n) { g_dropped.fetch_add(n); }

FAKE_CUPTI_EXPORT void fake_cupti_set_failure(const char* function, int result) {
  if (function == nullptr) return;
  std::lock_guard<std::mutex> lock(S().mu);
  if (result == cu::kSuccess) {
    S().failures.erase(function);
  } else {
    S().failures[function] = result;
  }
}

FAKE_CUPTI_EXPORT void fake_cupti_reset(void) {
  std::lock_guard<std::mutex> lock(S().mu);
  State& s = S();
  if (s.buffer != nullptr) {
    s.used = 0;
    DeliverLocked();  // back to its owner, without records
  }
  s.subscribed = false;
  s.callback = nullptr;
  s.userdata = nullptr;
  s.callbacks.clear();
  s.kinds.clear();
  s.requested = nullptr;
  s.completed = nullptr;
  s.stream_tail.clear();
  s.failures.clear();
  g_dropped.store(0);
}

FAKE_CUPTI_EXPORT int fake_cupti_subscribed(void) {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().subscribed ? 1 : 0;
}

FAKE_CUPTI_EXPORT int fake_cupti_callback_enabled(int domain, uint32_t cbid) {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().callbacks.count({domain, cbid}) != 0 ? 1 : 0;
}

FAKE_CUPTI_EXPORT int fake_cupti_activity_enabled(int kind) {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().kinds.count(kind) != 0 ? 1 : 0;
}

FAKE_CUPTI_EXPORT uint64_t fake_cupti_buffered_records(void) {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().buffered;
}
