// KernelTracer: exact GPU time per caller-defined tag (linescope: per Python line) through
// CUPTI, loaded with dlopen at run time (no build-time CUDA dependency; ABI in cupti_abi.h).
//
// Mechanism. Open subscribes to CUPTI's runtime- and driver-API callbacks for the launch entry
// points (kLaunchCallbacks in cupti_tracer.cc, listed in docs/telemetry.md) and, with
// options.memcpy, the runtime memcpy/memset entry points. On each API *enter*, on the launching
// thread, it calls tag_fn(ctx) and stores correlationId -> tag in a fixed, lock-free,
// direct-mapped table (no allocation, no lock). CUPTI's activity API delivers one record per
// kernel (CONCURRENT_KERNEL), memcpy and memset in buffers, later, on a CUPTI thread (or on the
// thread calling Flush); each record's correlationId is looked up in the table and its
// device-side duration (end - start, ns on CUPTI's clock) is added to that tag's totals.
//
// What is measured, per tag (KernelTagTotals):
//   kernel_ns       the sum of the kernels' durations. Kernels of one tag that overlap on
//                   different streams (or GPUs) each count in full, so a tag's kernel_ns may
//                   exceed the wall time it spanned, and the sum over tags may exceed the
//                   GPU's busy time.
//   kernel_busy_ns  the length of the union of the tag's kernel intervals (all streams and
//                   GPUs together): the time during which at least one kernel of the tag ran.
//                   Exact when a tag's overlapping kernels are delivered within
//                   options.busy_order_window_ns of each other (see TakeTotals).
//   memcpy_* / memset_*  the same sums for copies and sets issued through the runtime API
//                   (copy-engine time, kept apart from kernel time).
// Per kernel name (KernelNameTotals, over all tags): count and summed duration. With
// options.launch_detail, per tag, kernel name and launch configuration (KernelLaunchTotals: the
// record's deviceId, streamId, grid and block): count and summed, shortest and longest duration,
// for tagged kernels only (a kernel of a CUDA graph carries its own configuration). Both live
// in hash maps: their memory is bounded by the number of distinct names and (tag, name,
// configuration) keys seen between two TakeTotals calls (about 100 bytes per launch key), a
// record costs one lookup in each and allocates only the first time its key is seen.
// A kernel launched with a nested driver call (runtime -> driver) is tagged once: the nested
// driver callback reuses the runtime call's tag without calling tag_fn again.
//
// Threads. tag_fn runs on whichever thread launches: the training thread, but also autograd
// or NCCL worker threads; it must be noexcept, must not block and must not launch CUDA work.
// Records are accumulated on CUPTI's threads under an internal mutex. Flush, TakeTotals,
// TakeNotes and Stop may be called from any thread, but never from inside tag_fn. Stop waits
// for tag_fn calls in progress: never call it while holding a lock tag_fn may wait for (from
// Python: release the GIL around Stop if tag_fn could ever take it).
//
// One tracer per process: CUPTI admits one callback subscriber and one pair of buffer callbacks.
// Open fails while another KernelTracer is running, and when another CUPTI client (torch.profiler,
// Nsight Systems, ...) holds the subscription (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED).
//
// The CUPTI library is never dlclose'd: its worker threads and the callbacks it registered
// outlive the tracer; opening it again returns the same handle.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "telemetry/cupti_abi.h"
#include "util/status.h"

namespace gpuprof::telemetry {

// Environment variable naming the CUPTI library to load (used when no path is passed).
inline constexpr const char* kCuptiLibraryEnv = "GPUPROF_CUPTI_LIBRARY";

// The libraries KernelTracer::Open tries, in order, for `configured`: {configured} if non-empty,
// else {$GPUPROF_CUPTI_LIBRARY} if set and non-empty, else libcupti.so, libcupti.so.13,
// libcupti.so.12 (found through the dynamic linker's search path, e.g. LD_LIBRARY_PATH) and
// /usr/local/cuda/extras/CUPTI/lib64/libcupti.so. The Python caller passes the path of the
// nvidia-cuda-cupti wheel's library when that wheel is installed.
std::vector<std::string> CuptiLibraryCandidates(const std::string& configured);

// The tag a tag_fn returns for "no tag": such launches go to the unattributed bucket.
inline constexpr uint64_t kNoTag = ~uint64_t{0};

// Called on every traced API enter on the launching thread; returns the tag for that launch.
// Must be noexcept and cheap (it runs once per kernel launch).
using KernelTagFn = uint64_t (*)(void* ctx);

struct KernelTracerOptions {
  // Also trace memcpy and memset (activity kinds MEMCPY, MEMSET; runtime-API memcpy/memset
  // callbacks). Copies issued straight through the driver API count as unattributed.
  bool memcpy = true;
  // Size of each activity buffer handed to CUPTI (rounded up to a multiple of 8; min 4 KiB).
  size_t buffer_bytes = size_t{4} << 20;
  // Slots of the correlationId -> tag table (rounded up to a power of two; min 1024). A record
  // delivered after more than this many later API calls were tagged finds its slot reused and
  // is unattributed (counted as evicted, with a note). 16 bytes per slot.
  size_t tag_table_slots = size_t{1} << 20;
  // Busy-time ordering window: delivered kernel intervals wait this long (in CUPTI time, behind
  // the latest start seen) before they are merged into the per-tag union, so that intervals
  // delivered out of start order are still merged exactly. TakeTotals merges everything pending.
  uint64_t busy_order_window_ns = 1'000'000'000;
  // Also keep per tag, per kernel name and launch configuration (device, stream, grid, block)
  // the count, summed / shortest / longest duration (KernelTraceTotals::launches). Tagged
  // kernel records only (unattributed ones are in `unattributed` as before).
  bool launch_detail = false;
};

// Totals of one tag (or of the unattributed bucket, tag == kNoTag). Durations in ns.
struct KernelTagTotals {
  uint64_t tag = kNoTag;
  uint64_t kernel_count = 0;
  uint64_t kernel_ns = 0;       // sum of kernel durations
  uint64_t kernel_busy_ns = 0;  // union of kernel intervals (<= kernel_ns)
  uint64_t memcpy_count = 0;
  uint64_t memcpy_ns = 0;
  uint64_t memcpy_bytes = 0;
  uint64_t memset_count = 0;
  uint64_t memset_ns = 0;
  uint64_t memset_bytes = 0;
};

// Totals of one kernel name (as CUPTI reports it: usually mangled), over all tags.
struct KernelNameTotals {
  std::string name;
  uint64_t count = 0;
  uint64_t ns = 0;
};

// Totals of one (tag, kernel name, launch configuration): kernels of one tag with the same name,
// launched on the same device and stream with the same grid and block dimensions. Durations in ns.
struct KernelLaunchTotals {
  uint64_t tag = kNoTag;
  std::string name;     // as CUPTI reports it (usually mangled)
  uint32_t device = 0;  // CUPTI deviceId
  uint32_t stream = 0;  // CUPTI streamId
  int32_t grid[3] = {0, 0, 0};
  int32_t block[3] = {0, 0, 0};
  uint64_t count = 0;
  uint64_t ns = 0;  // sum of durations
  uint64_t min_ns = 0;
  uint64_t max_ns = 0;
};

// Everything accumulated between two TakeTotals calls.
struct KernelTraceTotals {
  std::vector<KernelTagTotals> tags;         // ascending tag; only tags that received records
  KernelTagTotals unattributed;              // records with no tag (tag == kNoTag); reasons below
  uint64_t unattributed_untagged = 0;        // launched while tag_fn returned kNoTag
  uint64_t unattributed_unmatched = 0;       // no traced launch callback saw the correlation id
  uint64_t unattributed_evicted = 0;         // the id's table slot was reused before delivery
  std::vector<KernelNameTotals> kernels;     // descending ns
  std::vector<KernelLaunchTotals> launches;  // with options.launch_detail: ascending tag, then
                                             // descending ns
  uint64_t records = 0;                      // kernel + memcpy + memset records with timestamps
  uint64_t invalid_records = 0;              // records without usable timestamps: in no total
  uint64_t dropped_records = 0;              // records CUPTI reported as dropped (buffers full)
};

class KernelTracer {
 public:
  // Loads CUPTI (CuptiLibraryCandidates(library_path), first that loads), registers the buffer
  // callbacks, subscribes, enables the launch callbacks and the activity kinds. Cold path.
  // Errors name the library and the failing step, e.g. "cannot load CUPTI: tried libcupti.so
  // (libcupti.so: cannot open shared object file: No such file or directory); ..." or
  // "cuptiSubscribe failed
  // for /x/libcupti.so: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (CUPTI error 39): another
  // CUPTI client ...". Everything set up before a failing step is undone.
  static Expected<std::unique_ptr<KernelTracer>> Open(const std::string& library_path,
                                                      KernelTagFn tag_fn, void* ctx,
                                                      const KernelTracerOptions& options = {});

  ~KernelTracer();  // Stop()
  KernelTracer(const KernelTracer&) = delete;
  KernelTracer& operator=(const KernelTracer&) = delete;
  KernelTracer(KernelTracer&&) = delete;
  KernelTracer& operator=(KernelTracer&&) = delete;

  // cuptiActivityFlushAll: delivers every buffer, also partly filled ones, and processes their
  // records before returning. Records of work still running on the GPU come with a later
  // Flush (synchronize the device first for a complete picture). Not from inside tag_fn.
  Status Flush();

  // The totals accumulated since the previous TakeTotals (or Open), then resets them. Does not
  // flush: call Flush() first. Busy time merges all pending intervals here; an interval
  // delivered later that starts before the latest merged end of its tag only adds the part past
  // that end (it may under-count a gap it would have filled).
  KernelTraceTotals TakeTotals();

  // Idempotent: stops tagging (unsubscribe), disables the activity kinds, flushes (the records
  // delivered are processed and stay available to TakeTotals) and releases the process-wide
  // slot. Waits for launch callbacks in progress to return.
  void Stop();

  // Diagnostics since the previous call (library version, entry points CUPTI refused, dropped
  // and evicted records, malformed buffers). Thread-safe.
  std::vector<std::string> TakeNotes();

  const std::string& library_path() const { return library_path_; }
  uint32_t cupti_version() const { return cupti_version_; }  // cuptiGetVersion; 0 unknown
  bool stopped() const { return stopped_.load(); }
  // API-enter callbacks that stored a tag (one per traced launch/copy/set; nested driver calls
  // count too). For tests and overhead figures.
  uint64_t tagged_calls() const { return tagged_calls_.load(std::memory_order_relaxed); }

 private:
  struct Api;
  struct Slot;
  struct Interval {
    uint64_t tag;
    uint64_t start;
    uint64_t end;
  };
  // A KernelLaunchTotals key; `name` indexes names_.
  struct LaunchKey {
    uint64_t tag;
    uint32_t name;
    uint32_t device;
    uint32_t stream;
    int32_t grid[3];
    int32_t block[3];
    bool operator==(const LaunchKey&) const = default;
  };
  struct LaunchKeyHash {
    size_t operator()(const LaunchKey& k) const noexcept;
  };
  struct LaunchAcc {
    uint64_t count = 0;
    uint64_t ns = 0;
    uint64_t min_ns = ~uint64_t{0};
    uint64_t max_ns = 0;
  };

  KernelTracer();

  // CUPTI callbacks (static: the buffer callbacks carry no user pointer).
  static void OnApiCallback(void* userdata, cupti::CallbackDomain domain, cupti::CallbackId cbid,
                            const void* cbdata);
  static void OnBufferRequested(uint8_t** buffer, size_t* size, size_t* max_num_records);
  static void OnBufferCompleted(cupti::Context context, uint32_t stream_id, uint8_t* buffer,
                                size_t size, size_t valid_size);

  void TagCall(cupti::CallbackDomain domain, const cupti::CallbackData& data) noexcept;
  // Looks the id up; *reason: 0 found, 1 untagged, 2 unmatched, 3 evicted.
  uint64_t LookupTag(uint32_t correlation_id, int* reason) const noexcept;
  void ProcessBuffer(cupti::Context context, uint32_t stream_id, uint8_t* buffer,
                     size_t valid_size);
  void SweepBusy(bool all);  // accum_mu_ held
  void AddNote(std::string note);
  std::string ErrorText(cupti::Result r) const;
  void Teardown();  // undoes what Open set up; used by Stop and by a failing Open

  std::string library_path_;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  uint32_t cupti_version_ = 0;
  KernelTagFn tag_fn_ = nullptr;
  void* tag_ctx_ = nullptr;
  KernelTracerOptions options_;
  uint32_t generation_ = 0;  // distinguishes this tracer's per-thread launch state

  // correlationId -> tag, direct-mapped by id & mask_.
  std::unique_ptr<Slot[]> slots_;
  uint64_t mask_ = 0;

  cupti::SubscriberHandle subscriber_ = nullptr;
  std::vector<cupti::ActivityKind> enabled_kinds_;
  bool registered_active_ = false;  // holds the process-wide slot
  std::atomic<bool> stopped_{false};
  std::mutex stop_mu_;

  std::atomic<bool> accepting_{true};
  std::atomic<int> in_callback_{0};
  std::atomic<uint64_t> tagged_calls_{0};

  // Accumulation (CUPTI threads, TakeTotals).
  std::mutex accum_mu_;
  std::unordered_map<uint64_t, KernelTagTotals> tags_;
  KernelTagTotals unattributed_;
  uint64_t untagged_ = 0, unmatched_ = 0, evicted_ = 0;
  uint64_t records_ = 0, invalid_ = 0, dropped_ = 0;
  std::vector<KernelNameTotals> names_;
  std::unordered_map<std::string, size_t> name_index_;
  std::unordered_map<const char*, size_t> name_ptr_index_;
  std::unordered_map<LaunchKey, LaunchAcc, LaunchKeyHash> launches_;  // options_.launch_detail
  std::vector<Interval> pending_;  // [0, pending_sorted_) is in start order
  size_t pending_sorted_ = 0;
  std::unordered_map<uint64_t, uint64_t> covered_until_;  // per tag: end of the merged union
  uint64_t max_start_seen_ = 0;
  // Since Open (never reset), and the values already reported in notes.
  uint64_t cum_dropped_ = 0, cum_evicted_ = 0, cum_unmatched_ = 0, cum_invalid_ = 0;
  uint64_t noted_dropped_ = 0, noted_evicted_ = 0, noted_unmatched_ = 0, noted_invalid_ = 0;
  bool noted_bad_buffer_ = false;

  std::mutex notes_mu_;
  std::vector<std::string> notes_;
};

}  // namespace gpuprof::telemetry
