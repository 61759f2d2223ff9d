#include "telemetry/cupti_tracer.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

namespace gpuprof::telemetry {

namespace cu = cupti;

namespace {

// One traced API entry point.
struct TracedCall {
  cu::CallbackDomain domain;
  cu::CallbackId cbid;
  const char* name;
  bool copy;  // a memcpy/memset entry point (only with options.memcpy)
};

// The entry points whose enter callback tags the call. Launches: every runtime and driver API
// that starts kernels (graph launches included: their kernels carry the launch's correlation
// id). Copies and sets: the runtime API only (PyTorch's copies and fills go through it).
constexpr std::array kTracedCalls = {
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunch_v3020, "cudaLaunch", false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunch_ptsz_v7000, "cudaLaunch_ptsz", false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernel_v7000, "cudaLaunchKernel", false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernel_ptsz_v7000, "cudaLaunchKernel_ptsz",
               false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunchCooperativeKernel_v9000,
               "cudaLaunchCooperativeKernel", false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunchCooperativeKernel_ptsz_v9000,
               "cudaLaunchCooperativeKernel_ptsz", false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunchCooperativeKernelMultiDevice_v9000,
               "cudaLaunchCooperativeKernelMultiDevice", false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaGraphLaunch_v10000, "cudaGraphLaunch", false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaGraphLaunch_ptsz_v10000, "cudaGraphLaunch_ptsz",
               false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernelExC_v11060, "cudaLaunchKernelExC",
               false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaLaunchKernelExC_ptsz_v11060,
               "cudaLaunchKernelExC_ptsz", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunch, "cuLaunch", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchGrid, "cuLaunchGrid", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchGridAsync, "cuLaunchGridAsync", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchKernel, "cuLaunchKernel", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchKernel_ptsz, "cuLaunchKernel_ptsz", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchCooperativeKernel,
               "cuLaunchCooperativeKernel", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchCooperativeKernel_ptsz,
               "cuLaunchCooperativeKernel_ptsz", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchCooperativeKernelMultiDevice,
               "cuLaunchCooperativeKernelMultiDevice", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuGraphLaunch, "cuGraphLaunch", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuGraphLaunch_ptsz, "cuGraphLaunch_ptsz", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchKernelEx, "cuLaunchKernelEx", false},
    TracedCall{cu::kDomainDriverApi, cu::drv::kCuLaunchKernelEx_ptsz, "cuLaunchKernelEx_ptsz",
               false},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpy_v3020, "cudaMemcpy", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpy2D_v3020, "cudaMemcpy2D", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpyAsync_v3020, "cudaMemcpyAsync", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpy2DAsync_v3020, "cudaMemcpy2DAsync", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpyPeer_v4000, "cudaMemcpyPeer", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpyPeerAsync_v4000, "cudaMemcpyPeerAsync",
               true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpy_ptds_v7000, "cudaMemcpy_ptds", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpy2D_ptds_v7000, "cudaMemcpy2D_ptds", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpyAsync_ptsz_v7000, "cudaMemcpyAsync_ptsz",
               true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemcpy2DAsync_ptsz_v7000,
               "cudaMemcpy2DAsync_ptsz", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemset_v3020, "cudaMemset", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemset2D_v3020, "cudaMemset2D", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemsetAsync_v3020, "cudaMemsetAsync", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemset2DAsync_v3020, "cudaMemset2DAsync", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemset_ptds_v7000, "cudaMemset_ptds", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemset2D_ptds_v7000, "cudaMemset2D_ptds", true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemsetAsync_ptsz_v7000, "cudaMemsetAsync_ptsz",
               true},
    TracedCall{cu::kDomainRuntimeApi, cu::rt::kCudaMemset2DAsync_ptsz_v7000,
               "cudaMemset2DAsync_ptsz", true},
};

constexpr const char* kDefaultLibraries[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12",
                                             "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"};

// Intervals are merged into the busy-time union once this many are pending.
constexpr size_t kSweepBatch = 16384;

// Activity buffers handed to CUPTI, kept for reuse: the request callback may run on an
// application thread, so steady state allocates nothing.
constexpr size_t kPoolSlots = 16;
std::array<std::atomic<uint8_t*>, kPoolSlots> g_pool{};
std::atomic<size_t> g_buffer_bytes{size_t{4} << 20};

void DrainPool() {
  for (auto& slot : g_pool) std::free(slot.exchange(nullptr));
}

uint8_t* TakeBuffer(size_t bytes) {
  for (auto& slot : g_pool) {
    if (uint8_t* p = slot.exchange(nullptr, std::memory_order_acquire)) return p;
  }
  return static_cast<uint8_t*>(std::aligned_alloc(cu::kRecordAlignment, bytes));
}

void ReturnBuffer(uint8_t* buffer, size_t size) {
  if (buffer == nullptr) return;
  if (size == g_buffer_bytes.load(std::memory_order_relaxed)) {
    for (auto& slot : g_pool) {
      uint8_t* expected = nullptr;
      if (slot.compare_exchange_strong(expected, buffer, std::memory_order_release)) return;
    }
  }
  std::free(buffer);
}

// The tracer the buffer callbacks feed (one per process). Held while a buffer is processed, so
// that Stop can unhook the tracer without a completion still running in it.
std::mutex g_active_mu;
KernelTracer* g_active = nullptr;
std::atomic<uint32_t> g_generation{0};

// Per launching thread: runtime calls in progress (for nested driver calls) and their tag.
struct ThreadLaunchState {
  uint32_t generation = 0;
  uint32_t depth = 0;
  uint64_t tag = kNoTag;
};
thread_local ThreadLaunchState t_launch;

template <typename Fn>
Fn Resolve(void* handle, const char* name) {
  return reinterpret_cast<Fn>(dlsym(handle, name));
}

size_t RoundUpPow2(size_t v) {
  size_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

std::vector<std::string> CuptiLibraryCandidates(const std::string& configured) {
  if (!configured.empty()) return {configured};
  const char* env = std::getenv(kCuptiLibraryEnv);
  if (env != nullptr && *env != '\0') return {env};
  return {std::begin(kDefaultLibraries), std::end(kDefaultLibraries)};
}

struct KernelTracer::Api {
  cu::GetResultStringFn result_string = nullptr;
  cu::GetVersionFn get_version = nullptr;
  cu::SubscribeFn subscribe = nullptr;
  cu::UnsubscribeFn unsubscribe = nullptr;
  cu::EnableCallbackFn enable_callback = nullptr;
  cu::ActivityEnableFn activity_enable = nullptr;
  cu::ActivityDisableFn activity_disable = nullptr;
  cu::ActivityRegisterCallbacksFn register_callbacks = nullptr;
  cu::ActivityFlushAllFn flush_all = nullptr;
  cu::ActivityGetNextRecordFn next_record = nullptr;
  cu::ActivityGetNumDroppedRecordsFn dropped_records = nullptr;
};

// One table entry. id 0 = empty or being written (CUPTI correlation ids start at 1).
struct KernelTracer::Slot {
  std::atomic<uint32_t> id{0};
  std::atomic<uint64_t> tag{kNoTag};
};

KernelTracer::KernelTracer() : api_(std::make_unique<Api>()) {}

KernelTracer::~KernelTracer() { Stop(); }

std::string KernelTracer::ErrorText(cu::Result r) const {
  const char* text = nullptr;
  if (api_->result_string == nullptr || api_->result_string(r, &text) != cu::kSuccess ||
      text == nullptr || *text == '\0') {
    text = cu::ResultName(r);
  }
  return std::string(text) + " (CUPTI error " + std::to_string(r) + ")";
}

void KernelTracer::AddNote(std::string note) {
  std::lock_guard<std::mutex> lock(notes_mu_);
  notes_.push_back(std::move(note));
}

Expected<std::unique_ptr<KernelTracer>> KernelTracer::Open(const std::string& library_path,
                                                           KernelTagFn tag_fn, void* ctx,
                                                           const KernelTracerOptions& options) {
  if (tag_fn == nullptr) return Status::Error("KernelTracer::Open needs a tag function");
  std::unique_ptr<KernelTracer> t(new KernelTracer());
  t->tag_fn_ = tag_fn;
  t->tag_ctx_ = ctx;
  t->options_ = options;
  t->options_.buffer_bytes =
      (std::max<size_t>(options.buffer_bytes, 4096) + cu::kRecordAlignment - 1) &
      ~(cu::kRecordAlignment - 1);
  size_t slots = RoundUpPow2(std::max<size_t>(options.tag_table_slots, 1024));
  t->slots_ = std::make_unique<Slot[]>(slots);
  t->mask_ = slots - 1;
  t->generation_ = g_generation.fetch_add(1) + 1;

  // Load: the first candidate that loads.
  const std::vector<std::string> candidates = CuptiLibraryCandidates(library_path);
  std::string tried;
  for (const std::string& candidate : candidates) {
    dlerror();
    t->handle_ = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (t->handle_ != nullptr) {
      t->library_path_ = candidate;
      break;
    }
    const char* why = dlerror();
    if (!tried.empty()) tried += "; ";
    tried += candidate + " (" + (why ? why : "dlopen failed") + ")";
  }
  if (t->handle_ == nullptr) {
    std::string hint = library_path.empty()
                           ? std::string(" - install the nvidia-cuda-cupti wheel, or set ") +
                                 kCuptiLibraryEnv + " to libcupti.so"
                           : "";
    return Status::Error("cannot load CUPTI: tried " + tried + hint);
  }
  const std::string& path = t->library_path_;

  Api& api = *t->api_;
  void* h = t->handle_;
  api.result_string = Resolve<cu::GetResultStringFn>(h, "cuptiGetResultString");
  api.get_version = Resolve<cu::GetVersionFn>(h, "cuptiGetVersion");
  api.subscribe = Resolve<cu::SubscribeFn>(h, "cuptiSubscribe");
  api.unsubscribe = Resolve<cu::UnsubscribeFn>(h, "cuptiUnsubscribe");
  api.enable_callback = Resolve<cu::EnableCallbackFn>(h, "cuptiEnableCallback");
  api.activity_enable = Resolve<cu::ActivityEnableFn>(h, "cuptiActivityEnable");
  api.activity_disable = Resolve<cu::ActivityDisableFn>(h, "cuptiActivityDisable");
  api.register_callbacks =
      Resolve<cu::ActivityRegisterCallbacksFn>(h, "cuptiActivityRegisterCallbacks");
  api.flush_all = Resolve<cu::ActivityFlushAllFn>(h, "cuptiActivityFlushAll");
  api.next_record = Resolve<cu::ActivityGetNextRecordFn>(h, "cuptiActivityGetNextRecord");
  api.dropped_records =
      Resolve<cu::ActivityGetNumDroppedRecordsFn>(h, "cuptiActivityGetNumDroppedRecords");
  const char* missing = api.subscribe == nullptr            ? "cuptiSubscribe"
                        : api.unsubscribe == nullptr        ? "cuptiUnsubscribe"
                        : api.enable_callback == nullptr    ? "cuptiEnableCallback"
                        : api.activity_enable == nullptr    ? "cuptiActivityEnable"
                        : api.activity_disable == nullptr   ? "cuptiActivityDisable"
                        : api.register_callbacks == nullptr ? "cuptiActivityRegisterCallbacks"
                        : api.flush_all == nullptr          ? "cuptiActivityFlushAll"
                        : api.next_record == nullptr        ? "cuptiActivityGetNextRecord"
                        : api.dropped_records == nullptr    ? "cuptiActivityGetNumDroppedRecords"
                                                            : nullptr;
  if (missing != nullptr) {
    return Status::Error(path + " is not a usable CUPTI library: it lacks " + missing);
  }
  if (api.get_version != nullptr) {
    uint32_t v = 0;
    if (api.get_version(&v) == cu::kSuccess) t->cupti_version_ = v;
  }

  // The process-wide slot: CUPTI's buffer callbacks have no user pointer.
  {
    std::lock_guard<std::mutex> lock(g_active_mu);
    if (g_active != nullptr) {
      return Status::Error(
          "cannot trace with " + path +
          ": another KernelTracer is already tracing in this process (CUPTI admits one "
          "subscriber); stop it first");
    }
    g_active = t.get();
    t->registered_active_ = true;
  }
  if (g_buffer_bytes.exchange(t->options_.buffer_bytes) != t->options_.buffer_bytes) DrainPool();

  cu::Result r =
      api.register_callbacks(&KernelTracer::OnBufferRequested, &KernelTracer::OnBufferCompleted);
  if (r != cu::kSuccess) {
    std::string why = t->ErrorText(r);
    t->Teardown();
    return Status::Error("cuptiActivityRegisterCallbacks failed for " + path + ": " + why);
  }

  r = api.subscribe(&t->subscriber_, &KernelTracer::OnApiCallback, t.get());
  if (r != cu::kSuccess) {
    t->subscriber_ = nullptr;
    std::string why = t->ErrorText(r);
    if (r == cu::kErrorMultipleSubscribersNotSupported) {
      why +=
          ": another CUPTI client (torch.profiler, Nsight Systems, Nsight Compute, a debugger) is "
          "already subscribed in this process";
    }
    t->Teardown();
    return Status::Error("cuptiSubscribe failed for " + path + ": " + why);
  }

  std::string refused;
  cu::Result refused_code = cu::kSuccess;
  bool runtime_launch = false, driver_launch = false;
  for (const TracedCall& call : kTracedCalls) {
    if (call.copy && !options.memcpy) continue;
    r = api.enable_callback(1, t->subscriber_, call.domain, call.cbid);
    if (r == cu::kSuccess) {
      if (call.cbid == cu::rt::kCudaLaunchKernel_v7000 && call.domain == cu::kDomainRuntimeApi) {
        runtime_launch = true;
      }
      if (call.cbid == cu::drv::kCuLaunchKernel && call.domain == cu::kDomainDriverApi) {
        driver_launch = true;
      }
      continue;
    }
    if (!refused.empty()) refused += ", ";
    refused += call.name;
    refused_code = r;
  }
  if (!runtime_launch && !driver_launch) {
    std::string why = t->ErrorText(refused_code);
    t->Teardown();
    return Status::Error("cuptiEnableCallback failed for " + path +
                         ": neither cudaLaunchKernel nor cuLaunchKernel can be traced: " + why);
  }
  if (!refused.empty()) {
    t->AddNote("CUPTI (" + path + ") refused callbacks for " + refused + " (" +
               t->ErrorText(refused_code) +
               "): GPU work started through them is counted as unattributed");
  }

  r = api.activity_enable(cu::kActivityConcurrentKernel);
  if (r != cu::kSuccess) {
    std::string why = t->ErrorText(r);
    t->Teardown();
    return Status::Error("cuptiActivityEnable(CONCURRENT_KERNEL) failed for " + path + ": " + why);
  }
  t->enabled_kinds_.push_back(cu::kActivityConcurrentKernel);
  if (options.memcpy) {
    for (auto [kind, name] :
         {std::pair{cu::kActivityMemcpy, "MEMCPY"}, std::pair{cu::kActivityMemset, "MEMSET"}}) {
      r = api.activity_enable(kind);
      if (r == cu::kSuccess) {
        t->enabled_kinds_.push_back(kind);
      } else {
        t->AddNote(std::string("cuptiActivityEnable(") + name + ") failed: " + t->ErrorText(r) +
                   "; " + (kind == cu::kActivityMemcpy ? "memcpy" : "memset") +
                   " time is not measured");
      }
    }
  }
  return t;
}

void KernelTracer::Teardown() {
  accepting_.store(false);
  if (subscriber_ != nullptr) {
    api_->unsubscribe(subscriber_);
    subscriber_ = nullptr;
  }
  // A launch callback that began before the unsubscribe may still be storing its tag.
  while (in_callback_.load() != 0) std::this_thread::yield();
  for (cu::ActivityKind kind : enabled_kinds_) api_->activity_disable(kind);
  enabled_kinds_.clear();
  if (registered_active_) {
    cu::Result r = api_->flush_all(cu::kActivityFlagFlushForced);
    if (r != cu::kSuccess) {
      AddNote("cuptiActivityFlushAll failed while stopping: " + ErrorText(r) +
              "; records still in CUPTI's buffers are lost");
    }
    std::lock_guard<std::mutex> lock(g_active_mu);
    if (g_active == this) g_active = nullptr;
    registered_active_ = false;
  }
}

void KernelTracer::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  Teardown();
}

Status KernelTracer::Flush() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return Status::Ok();  // Stop flushed
  }
  cu::Result r = api_->flush_all(cu::kActivityFlagFlushForced);
  if (r != cu::kSuccess) return Status::Error("cuptiActivityFlushAll failed: " + ErrorText(r));
  return Status::Ok();
}

// ---- launching threads -------------------------------------------------------------------

void KernelTracer::OnApiCallback(void* userdata, cu::CallbackDomain domain, cu::CallbackId,
                                 const void* cbdata) {
  if (cbdata == nullptr || userdata == nullptr) return;
  const auto& data = *static_cast<const cu::CallbackData*>(cbdata);
  if (data.callbackSite == cu::kApiExit) {
    // Only this thread's state: no access to the tracer, which may be stopping.
    if (domain == cu::kDomainRuntimeApi && t_launch.depth > 0) --t_launch.depth;
    return;
  }
  if (data.callbackSite != cu::kApiEnter) return;
  static_cast<KernelTracer*>(userdata)->TagCall(domain, data);
}

void KernelTracer::TagCall(cu::CallbackDomain domain, const cu::CallbackData& data) noexcept {
  in_callback_.fetch_add(1);
  if (!accepting_.load()) {
    in_callback_.fetch_sub(1, std::memory_order_release);
    return;
  }
  ThreadLaunchState& t = t_launch;
  if (t.generation != generation_) t = ThreadLaunchState{generation_, 0, kNoTag};
  uint64_t tag;
  if (domain == cu::kDomainDriverApi && t.depth > 0) {
    tag = t.tag;  // a driver call made by the runtime call in progress on this thread
  } else {
    tag = tag_fn_(tag_ctx_);
  }
  if (domain == cu::kDomainRuntimeApi) {
    ++t.depth;
    t.tag = tag;
  }
  Slot& slot = slots_[data.correlationId & mask_];
  slot.id.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.tag.store(tag, std::memory_order_relaxed);
  slot.id.store(data.correlationId, std::memory_order_release);
  tagged_calls_.fetch_add(1, std::memory_order_relaxed);
  in_callback_.fetch_sub(1, std::memory_order_release);
}

// ---- CUPTI buffer threads ----------------------------------------------------------------

void KernelTracer::OnBufferRequested(uint8_t** buffer, size_t* size, size_t* max_num_records) {
  size_t bytes = g_buffer_bytes.load(std::memory_order_relaxed);
  uint8_t* p = TakeBuffer(bytes);
  *buffer = p;
  *size = p != nullptr ? bytes : 0;  // no buffer: CUPTI drops the records (and counts them)
  *max_num_records = 0;
}

void KernelTracer::OnBufferCompleted(cu::Context context, uint32_t stream_id, uint8_t* buffer,
                                     size_t size, size_t valid_size) {
  {
    std::lock_guard<std::mutex> lock(g_active_mu);
    if (g_active != nullptr && buffer != nullptr) {
      g_active->ProcessBuffer(context, stream_id, buffer, valid_size);
    }
  }
  ReturnBuffer(buffer, size);
}

uint64_t KernelTracer::LookupTag(uint32_t correlation_id, int* reason) const noexcept {
  const Slot& slot = slots_[correlation_id & mask_];
  uint32_t before = slot.id.load(std::memory_order_acquire);
  if (correlation_id == 0 || before != correlation_id) {
    // A larger id in the slot: a later call reused it. Anything else: never tagged.
    *reason = before > correlation_id ? 3 : 2;
    return kNoTag;
  }
  uint64_t tag = slot.tag.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot.id.load(std::memory_order_relaxed) != correlation_id) {
    *reason = 3;  // overwritten while reading
    return kNoTag;
  }
  *reason = tag == kNoTag ? 1 : 0;
  return tag;
}

size_t KernelTracer::LaunchKeyHash::operator()(const LaunchKey& k) const noexcept {
  // Each field mixed in with a multiply (splitmix64's constant) and a final avalanche.
  auto mix = [](uint64_t h, uint64_t v) { return (h ^ v) * 0x9e3779b97f4a7c15ULL; };
  uint64_t h = mix(k.tag, (uint64_t{k.name} << 32) | k.device);
  h = mix(h, (uint64_t{k.stream} << 32) | static_cast<uint32_t>(k.grid[0]));
  h = mix(h, (uint64_t{static_cast<uint32_t>(k.grid[1])} << 32) | static_cast<uint32_t>(k.grid[2]));
  h = mix(h,
          (uint64_t{static_cast<uint32_t>(k.block[0])} << 32) | static_cast<uint32_t>(k.block[1]));
  h = mix(h, static_cast<uint32_t>(k.block[2]));
  return static_cast<size_t>(h ^ (h >> 32));
}

void KernelTracer::ProcessBuffer(cu::Context context, uint32_t stream_id, uint8_t* buffer,
                                 size_t valid_size) {
  std::lock_guard<std::mutex> lock(accum_mu_);
  enum Op { kKernel, kMemcpy, kMemset };
  // Consecutive records mostly share a tag and a kernel: remember the last lookups (map
  // element pointers stay valid while the lock is held).
  uint64_t last_tag = kNoTag;
  KernelTagTotals* last_totals = nullptr;
  const char* last_name = nullptr;
  size_t last_index = 0;
  auto account = [&](Op op, uint32_t id, uint64_t start, uint64_t end, uint64_t bytes,
                     const cu::KernelRecordPrefix* kernel) {
    if ((start == 0 && end == 0) || end < start) {
      ++invalid_;
      ++cum_invalid_;
      return;
    }
    ++records_;
    int reason = 0;
    uint64_t tag = LookupTag(id, &reason);
    KernelTagTotals* totals = &unattributed_;
    if (reason == 0) {
      if (last_totals == nullptr || tag != last_tag) {
        last_totals = &tags_[tag];
        last_totals->tag = tag;
        last_tag = tag;
      }
      totals = last_totals;
    } else if (reason == 1) {
      ++untagged_;
    } else if (reason == 2) {
      ++unmatched_;
      ++cum_unmatched_;
    } else {
      ++evicted_;
      ++cum_evicted_;
    }
    const uint64_t ns = end - start;
    switch (op) {
      case kKernel: {
        ++totals->kernel_count;
        totals->kernel_ns += ns;
        pending_.push_back(Interval{reason == 0 ? tag : kNoTag, start, end});
        max_start_seen_ = std::max(max_start_seen_, start);
        const char* key = kernel->name != nullptr ? kernel->name : "<unnamed kernel>";
        size_t index = last_index;  // same pointer within one buffer: the same kernel
        if (key != last_name) {
          // A pointer seen before names the same kernel unless its module was unloaded and
          // the address reused: confirm by content.
          auto it = name_ptr_index_.find(key);
          if (it != name_ptr_index_.end() && names_[it->second].name == key) {
            index = it->second;
          } else {
            auto [named, inserted] = name_index_.try_emplace(key, names_.size());
            if (inserted) names_.push_back(KernelNameTotals{key, 0, 0});
            index = named->second;
            name_ptr_index_[key] = index;
          }
        }
        last_name = key;
        last_index = index;
        ++names_[index].count;
        names_[index].ns += ns;
        if (options_.launch_detail && reason == 0) {
          const LaunchKey launch{tag,
                                 static_cast<uint32_t>(index),
                                 kernel->deviceId,
                                 kernel->streamId,
                                 {kernel->gridX, kernel->gridY, kernel->gridZ},
                                 {kernel->blockX, kernel->blockY, kernel->blockZ}};
          LaunchAcc& acc = launches_[launch];
          ++acc.count;
          acc.ns += ns;
          acc.min_ns = std::min(acc.min_ns, ns);
          acc.max_ns = std::max(acc.max_ns, ns);
        }
        break;
      }
      case kMemcpy:
        ++totals->memcpy_count;
        totals->memcpy_ns += ns;
        totals->memcpy_bytes += bytes;
        break;
      case kMemset:
        ++totals->memset_count;
        totals->memset_ns += ns;
        totals->memset_bytes += bytes;
        break;
    }
  };

  cu::Activity* record = nullptr;
  for (;;) {
    cu::Result r = api_->next_record(buffer, valid_size, &record);
    if (r == cu::kErrorMaxLimitReached) break;
    if (r != cu::kSuccess || record == nullptr) {
      if (!noted_bad_buffer_) {
        noted_bad_buffer_ = true;
        AddNote("cuptiActivityGetNextRecord failed: " + ErrorText(r) +
                "; the rest of that activity buffer was skipped (its GPU time is missing)");
      }
      break;
    }
    switch (static_cast<cu::ActivityKind>(record->kind)) {
      case cu::kActivityKernel:
      case cu::kActivityConcurrentKernel: {
        const auto* k = reinterpret_cast<const cu::KernelRecordPrefix*>(record);
        account(kKernel, k->correlationId, k->start, k->end, 0, k);
        break;
      }
      case cu::kActivityMemcpy: {
        const auto* m = reinterpret_cast<const cu::MemcpyRecordPrefix*>(record);
        account(kMemcpy, m->correlationId, m->start, m->end, m->bytes, nullptr);
        break;
      }
      case cu::kActivityMemset: {
        const auto* m = reinterpret_cast<const cu::MemsetRecordPrefix*>(record);
        account(kMemset, m->correlationId, m->start, m->end, m->bytes, nullptr);
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  if (api_->dropped_records(context, stream_id, &dropped) == cu::kSuccess && dropped > 0) {
    dropped_ += dropped;
    cum_dropped_ += dropped;
  }
  if (pending_.size() >= kSweepBatch) SweepBusy(false);
}

void KernelTracer::SweepBusy(bool all) {
  if (pending_.empty()) return;
  // The part left by the previous sweep is sorted: sort the new tail and merge.
  auto by_start = [](const Interval& a, const Interval& b) { return a.start < b.start; };
  auto mid = pending_.begin() + static_cast<std::ptrdiff_t>(pending_sorted_);
  if (!std::is_sorted(mid, pending_.end(), by_start)) std::sort(mid, pending_.end(), by_start);
  if (mid != pending_.begin() && mid != pending_.end() && by_start(*mid, *(mid - 1))) {
    std::inplace_merge(pending_.begin(), mid, pending_.end(), by_start);
  }
  uint64_t cutoff = ~uint64_t{0};
  if (!all) {
    cutoff = max_start_seen_ > options_.busy_order_window_ns
                 ? max_start_seen_ - options_.busy_order_window_ns
                 : 0;
  }
  size_t n = 0;
  for (; n < pending_.size() && (all || pending_[n].start < cutoff); ++n) {
    const Interval& iv = pending_[n];
    uint64_t& covered = covered_until_[iv.tag];
    uint64_t add = 0;
    if (iv.start >= covered) {
      add = iv.end - iv.start;
      covered = iv.end;
    } else if (iv.end > covered) {
      add = iv.end - covered;
      covered = iv.end;
    }
    KernelTagTotals& totals = iv.tag == kNoTag ? unattributed_ : tags_[iv.tag];
    totals.kernel_busy_ns += add;
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
  pending_sorted_ = pending_.size();
}

// ---- readers -----------------------------------------------------------------------------

KernelTraceTotals KernelTracer::TakeTotals() {
  std::lock_guard<std::mutex> lock(accum_mu_);
  SweepBusy(true);
  KernelTraceTotals out;
  out.tags.reserve(tags_.size());
  for (auto& [tag, totals] : tags_) out.tags.push_back(totals);
  std::sort(out.tags.begin(), out.tags.end(),
            [](const KernelTagTotals& a, const KernelTagTotals& b) { return a.tag < b.tag; });
  out.unattributed = unattributed_;
  out.unattributed.tag = kNoTag;
  out.unattributed_untagged = untagged_;
  out.unattributed_unmatched = unmatched_;
  out.unattributed_evicted = evicted_;
  out.launches.reserve(launches_.size());
  for (const auto& [key, acc] : launches_) {
    KernelLaunchTotals& l = out.launches.emplace_back();
    l.tag = key.tag;
    l.name = names_[key.name].name;
    l.device = key.device;
    l.stream = key.stream;
    std::copy(std::begin(key.grid), std::end(key.grid), l.grid);
    std::copy(std::begin(key.block), std::end(key.block), l.block);
    l.count = acc.count;
    l.ns = acc.ns;
    l.min_ns = acc.min_ns;
    l.max_ns = acc.max_ns;
  }
  std::sort(out.launches.begin(), out.launches.end(),
            [](const KernelLaunchTotals& a, const KernelLaunchTotals& b) {
              if (a.tag != b.tag) return a.tag < b.tag;
              if (a.ns != b.ns) return a.ns > b.ns;
              auto config = [](const KernelLaunchTotals& l) {
                return std::tuple(l.device, l.stream, l.grid[0], l.grid[1], l.grid[2], l.block[0],
                                  l.block[1], l.block[2]);
              };
              return a.name != b.name ? a.name < b.name : config(a) < config(b);
            });
  out.kernels = std::move(names_);
  std::sort(out.kernels.begin(), out.kernels.end(),
            [](const KernelNameTotals& a, const KernelNameTotals& b) {
              return a.ns != b.ns ? a.ns > b.ns : a.name < b.name;
            });
  out.records = records_;
  out.invalid_records = invalid_;
  out.dropped_records = dropped_;

  tags_.clear();
  unattributed_ = KernelTagTotals{};
  untagged_ = unmatched_ = evicted_ = 0;
  records_ = invalid_ = dropped_ = 0;
  names_.clear();
  name_index_.clear();
  name_ptr_index_.clear();
  launches_.clear();
  return out;
}

std::vector<std::string> KernelTracer::TakeNotes() {
  std::vector<std::string> fresh;
  {
    std::lock_guard<std::mutex> lock(accum_mu_);
    if (cum_dropped_ != noted_dropped_) {
      fresh.push_back("CUPTI dropped " + std::to_string(cum_dropped_) +
                      " activity records so far (no buffer space): their GPU time is missing "
                      "from every total");
      noted_dropped_ = cum_dropped_;
    }
    if (cum_evicted_ != noted_evicted_) {
      fresh.push_back(std::to_string(cum_evicted_) + " records so far arrived after more than " +
                      std::to_string(mask_ + 1) +
                      " later traced calls had reused their tag slot: counted as unattributed "
                      "(flush more often or raise tag_table_slots)");
      noted_evicted_ = cum_evicted_;
    }
    if (cum_unmatched_ != noted_unmatched_) {
      fresh.push_back(std::to_string(cum_unmatched_) +
                      " records so far belong to GPU work no traced API call started (launched "
                      "before tracing began, or through an entry point that is not traced): "
                      "counted as unattributed");
      noted_unmatched_ = cum_unmatched_;
    }
    if (cum_invalid_ != noted_invalid_) {
      fresh.push_back(std::to_string(cum_invalid_) +
                      " records so far carried no timestamps (CUPTI could not collect them): "
                      "they are in no total");
      noted_invalid_ = cum_invalid_;
    }
  }
  std::lock_guard<std::mutex> lock(notes_mu_);
  std::vector<std::string> out = std::move(notes_);
  notes_.clear();
  out.insert(out.end(), std::make_move_iterator(fresh.begin()),
             std::make_move_iterator(fresh.end()));
  return out;
}

}  // namespace gpuprof::telemetry
