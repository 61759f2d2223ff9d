// Sampling for linescope: a background thread that paces samples of ONE measured thread and
// integrates host memory (RSS) and GPU telemetry between them, and the per-line aggregation of
// the resulting intervals. No Python.h: the binding (cpp/python/line_sampler.cc) decides which
// source line the measured thread is on when it answers a request.
//
// How a sample works:
//   1. The sampler thread asks the measured thread for a sample every `interval_ns` by calling
//      `request(ctx)`, with at most one request outstanding: while the measured thread is
//      inside a long call, nothing more is asked (only `remind`, if given, every interval; with
//      neither memory, GPU nor remind the thread sleeps until the answer).
//   2. Independently, it reads RSS every `memory_interval_ns` (memory on: the timeline and the
//      peak of the open interval) and the GPU collector every `gpu_interval_ns` (GPU on).
//   3. The measured thread answers with TakeInterval(): the wall time since its previous
//      answer, its own CPU time over that wall time, the RSS change and peak, and the GPU busy
//      time (the last read utilization x time, integrated exactly between reads) and device
//      memory peak. The binding attributes that interval to the line the thread is on.
// A thread that is inside a long call (C extension, I/O, sleep) answers when the call returns,
// so the whole call is attributed to the line that made it.
//
// With a line source (SetLineSource: a tracer that publishes the measured thread's current
// line at every line change, see LineAggregator::PublishTo), RSS needs no answer: every
// reading charges the RSS change since the previous reading, and the reading as a peak
// candidate, to the line current at that moment, so memory that a long C call allocates lands
// on the line that made the call, within one memory interval.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lines/line_model.h"
#include "telemetry/gpu_collector.h"
#include "util/status.h"

namespace gpuprof::lines {

// A bounded series of (t_ns, value) points. When full, neighbouring points are merged pairwise
// (each pair keeps its higher value and that value's time) and every later point covers twice
// as many raw samples, so the series stays within `capacity` points, spans the whole run
// evenly, and never loses a peak. Not thread-safe (one writer; read after it stopped).
class BoundedTimeline {
 public:
  explicit BoundedTimeline(size_t capacity = 2048);
  void Add(int64_t t_ns, int64_t value) noexcept;  // no allocation after construction
  // The merged points, the open (partially filled) one last.
  std::vector<std::pair<int64_t, int64_t>> Points() const;
  int64_t samples_per_point() const { return stride_; }
  int64_t raw_samples() const { return raw_; }

 private:
  void Compact() noexcept;
  size_t capacity_;
  std::vector<std::pair<int64_t, int64_t>> points_;
  std::pair<int64_t, int64_t> open_{0, 0};
  int64_t open_count_ = 0;
  int64_t stride_ = 1;
  int64_t raw_ = 0;
};

// Reads this process's resident set size from /proc/self/statm (one pread on a descriptor
// opened once). Any thread; noexcept after Open().
class RssReader {
 public:
  RssReader() = default;
  ~RssReader();
  RssReader(const RssReader&) = delete;
  RssReader& operator=(const RssReader&) = delete;
  Status Open();
  std::optional<int64_t> Read() const noexcept;

 private:
  int fd_ = -1;
  int64_t page_size_ = 4096;
};

// What the measured thread receives per answered sample. Unknown stays nullopt.
struct SampleInterval {
  int64_t wall_ns = 0;                  // since the previous answer (or the start)
  std::optional<int64_t> cpu_ns;        // the measured thread's CPU time over that wall time
  std::optional<int64_t> rss_delta;     // RSS now minus RSS at the previous answer (memory on)
  std::optional<int64_t> rss_peak;      // highest RSS seen during the interval (memory on)
  std::optional<int64_t> gpu_busy_ns;   // sum over used GPUs of utilization x time (GPU on)
  std::optional<int64_t> gpu_mem_peak;  // highest per-process device memory seen (GPU on)
};

struct SamplerOptions {
  int64_t interval_ns = 1'000'000;  // samples: 1 kHz
  bool memory = false;              // read RSS (timeline + per-line deltas and peaks)
  int64_t memory_interval_ns = 1'000'000;
  // GPU telemetry read on the sampler thread every `gpu_interval_ns` (not owned; must
  // outlive the sampler). nullptr = no GPU collection.
  telemetry::GpuCollector* gpu = nullptr;
  int64_t gpu_interval_ns = 10'000'000;
  int64_t pid = 0;  // whose device memory counts (0 = this process)
  size_t timeline_capacity = 2048;
};

// What the GPU side saw over the whole session (for the collection summary).
struct GpuSamplingSummary {
  int64_t ticks = 0;               // GPU reads attempted
  int64_t failed_ticks = 0;        // reads where no device answered
  int64_t util_readings = 0;       // device readings with a utilization value (either kind)
  int64_t proc_util_readings = 0;  // ...of which this process's own (per-process utilization)
  int64_t proc_mem_readings = 0;   // device readings with a per-process memory value
  std::optional<int64_t> proc_mem_peak;
  bool used_devices_known = false;    // the process held memory on some device (by NVML)
  std::vector<int64_t> used_devices;  // NVML indexes where this process held memory
};

// The driver reported this process's device memory, and it was none on every GPU: with
// device-wide utilization no GPU counts for this process (see LineSampler::SampleGpu).
inline bool HeldNoGpuMemory(const GpuSamplingSummary& g) {
  return g.proc_mem_readings > 0 && !g.used_devices_known;
}

// Host memory charged to one published line (see LineSampler::SetLineSource).
struct SourceLineMemory {
  uint64_t key = 0;       // the published line key
  int64_t rss_delta = 0;  // sum of the RSS changes of the readings charged to it
  int64_t rss_peak = 0;   // highest RSS read while it was current
  int64_t readings = 0;
};

// When the request after one made at `now` is due: on the grid of the rate (`deadline` is when
// the one just made was due), so a late wake-up does not lower the rate; more than an interval
// behind (a long answer), the grid restarts from `now`. One request is outstanding at a time,
// so there is never a burst.
constexpr int64_t NextRequestDeadline(int64_t deadline, int64_t now, int64_t interval) noexcept {
  const int64_t next = deadline + interval;
  return next > now ? next : now + interval;
}

// Owns the sampler thread. Start/Stop from one controlling thread; TakeInterval from the
// measured thread only (it is the only method that thread calls, and it never blocks).
class LineSampler {
 public:
  // Called on the sampler thread; returns false when the request could not be made (it is
  // counted and retried an interval later).
  using RequestFn = bool (*)(void* ctx) noexcept;

  // `remind`, when set, is called every interval while a request is outstanding (a request
  // that can be lost, e.g. a flag another thread may clear, is repeated that way); without it
  // the thread sleeps until the answer.
  LineSampler(SamplerOptions options, RequestFn request, void* ctx, RequestFn remind = nullptr);
  ~LineSampler();  // Stop()
  LineSampler(const LineSampler&) = delete;
  LineSampler& operator=(const LineSampler&) = delete;

  // Cold. Must be called on the measured thread (its CPU clock is taken from the caller).
  Status Start();
  void Stop();  // idempotent; joins the thread (also from Pause()d)
  // Between Start() and Stop(): true also while paused.
  bool running() const { return thread_.joinable() || paused_; }

  // Around os.fork(), from the controlling thread: Pause() joins the sampler thread and, on
  // Linux, waits (at most ~50 ms) until the kernel no longer counts it among the process's
  // threads (pthread_join can return a moment before), so the process is single-threaded
  // again as far as this sampler goes; nothing is read, requested or reset while paused, and
  // the open interval simply goes on. Resume() starts a fresh thread on the same state, its
  // request and read deadlines counted from now. Both are no-ops when not applicable
  // (Pause when not running or already paused, Resume when not paused).
  void Pause();
  Status Resume();
  bool paused() const { return paused_; }

  // Measured thread: closes the current interval, opens the next, and lets the sampler
  // thread request again. noexcept, no allocation.
  SampleInterval TakeInterval() noexcept;

  int64_t start_ns() const { return start_ns_; }
  int64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  int64_t failed_requests() const { return failed_requests_.load(std::memory_order_relaxed); }
  // How often the sampler thread woke up (requests, reads, answers): its own cost.
  int64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  // Read after Stop().
  const BoundedTimeline& rss_timeline() const { return timeline_; }
  std::optional<int64_t> rss_start() const { return rss_start_; }
  std::optional<int64_t> rss_peak() const { return rss_peak_total_; }
  std::optional<int64_t> rss_end() const { return rss_end_; }
  const GpuSamplingSummary& gpu_summary() const { return gpu_summary_; }
  // The sampler's own notes (e.g. RSS unreadable); the GPU collector keeps its own.
  std::vector<std::string> TakeNotes();

  // Before Start(): RSS readings are charged to the line key `source` holds at reading time
  // (0: no line; not charged). `source` must outlive the sampler's thread (Stop()).
  void SetLineSource(const std::atomic<uint64_t>* source) noexcept { source_ = source; }
  // After Stop(): the lines that were current at some reading.
  std::vector<SourceLineMemory> SourceLines() const;

 private:
  void Loop() noexcept;
  void JoinThread();  // asks the thread to stop and joins it (it must be joinable)
  void ReadRss(int64_t now) noexcept;
  void ChargeSourceLine(int64_t rss) noexcept;
  void SampleGpu(int64_t now) noexcept;
  void Request(int64_t now) noexcept;
  static void AtomicMax(std::atomic<int64_t>& a, int64_t v) noexcept;

  SamplerOptions options_;
  RequestFn request_;
  void* ctx_;
  RequestFn remind_;
  std::thread thread_;
  bool paused_ = false;                 // controlling thread only
  int64_t loop_start_ns_ = 0;           // the deadlines of a (re)started thread count from here
  std::atomic<int64_t> thread_tid_{0};  // the sampler thread's kernel id (Linux), 0 unknown
  std::mutex mu_;  // guards stop_ and the waits (the measured thread only notifies)
  std::condition_variable cv_;
  bool stop_ = false;
  RssReader rss_;
  bool rss_ok_ = false;
  int64_t start_ns_ = 0;

  // Sampler thread <-> measured thread.
  std::atomic<bool> pending_{false};          // a request is outstanding
  std::atomic<bool> awaiting_answer_{false};  // the sampler thread sleeps until the answer
  std::atomic<int64_t> rss_last_{-1};
  std::atomic<int64_t> rss_peak_open_{-1};  // peak within the open interval
  std::atomic<int64_t> gpu_mem_last_{-1};   // latest per-process device memory
  std::atomic<int64_t> gpu_mem_peak_open_{-1};
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> failed_requests_{0};
  std::atomic<int64_t> wakeups_{0};
  // GPU busy accounting, exact for a utilization that is constant between reads: busy time
  // accrues at util_ppm from since_ns on; both sides settle it under the lock (the GPU read at
  // its interval, the measured thread once per sample).
  std::mutex gpu_mu_;
  int64_t gpu_util_ppm_ = -1;  // latest summed utilization (1e6 = one GPU busy); -1 unknown
  int64_t gpu_since_ns_ = 0;
  int64_t gpu_busy_open_ = 0;
  bool gpu_busy_known_ = false;  // some utilization was known during the open interval

  // Measured thread only.
  int64_t last_take_ns_ = 0;
  int64_t last_cpu_ns_ = -1;
  int64_t rss_at_last_take_ = -1;

  // Sampler thread only (read after Stop).
  const std::atomic<uint64_t>* source_ = nullptr;
  int64_t source_prev_rss_ = -1;
  std::unordered_map<uint64_t, SourceLineMemory> source_lines_;
  BoundedTimeline timeline_;
  std::optional<int64_t> rss_start_, rss_peak_total_, rss_end_;
  GpuSamplingSummary gpu_summary_;
  std::vector<store::GpuSampleRow> gpu_rows_;
  std::vector<int64_t> pids_;

  std::mutex notes_mu_;
  std::vector<std::string> notes_;
};

// How the GPU side of a sampling session went, in words a user can act on: what produced the
// per-line GPU values, whether GPU time and GPU peak memory are available, and why not.
struct GpuCollectionSummary {
  std::optional<std::string> method;  // "<collector>-sampled" (e.g. "nvml-sampled"); none: null
  bool time_available = false;
  bool memory_available = false;
  std::optional<std::string> time_reason;    // set when time is unavailable
  std::optional<std::string> memory_reason;  // set when memory is unavailable
  // "process": GPU time comes from this process's own utilization (per-process NVML samples,
  // for at least kProcessScopeShare of the readings); "device": from device-wide utilization,
  // which can include other processes; empty: no collector, or GPU time measured (CUPTI).
  std::string utilization_scope;
  std::vector<std::string> diagnostics;
  // Diagnostics that report measurements lost mid-run by an earlier step (kernel records
  // CUPTI dropped): FinishGpuCollection makes them warnings too.
  std::vector<std::string> losses;
  // What the user must see in result.warnings, each once (FinishGpuCollection): why GPU time
  // or peak memory is missing, reads that failed mid-run, and that device-wide utilization
  // can include other processes' work.
  std::vector<std::string> warnings;
};

// The share of utilization readings that must be per-process for utilization_scope "process".
inline constexpr double kProcessScopeShare = 0.9;

// Said once in result.warnings when GPU time comes from device-wide utilization (except for
// neuron-sampled: its cores are those this process's runtime holds memory on, which a runtime
// owns). linescope's `scalene` adapter says the same text.
inline constexpr const char* kDeviceWideGpuWarning =
    "GPU utilization is device-wide (per-process utilization is not available), so attributed "
    "GPU time can include other processes' work on the same GPUs";

// Said instead when the utilization is device-wide but the driver reports per-process memory
// and this process held none on any GPU (HeldNoGpuMemory): no GPU's utilization was charged
// to its lines.
inline constexpr const char* kNoDeviceMemoryGpuWarning =
    "this process held no memory on any GPU during the run, so no GPU's utilization was "
    "charged to its lines (GPU time 0): work that other processes ran on the GPUs is not "
    "counted";

// Said first in result.warnings when the collector is gpuprof's mock (GPUPROF_GPU_BACKEND=mock):
// its values are simulated, no device was measured.
inline constexpr const char* kMockGpuWarning =
    "GPU values are simulated: GPUPROF_GPU_BACKEND=mock selected gpuprof's mock GPU collector "
    "(for demos and tests), so no device was measured; unset it to measure a real GPU";

// The reasons GPU values are unavailable on an Apple host (no NVIDIA driver there; MPS would
// need PyTorch instrumentation), in place of the collector's error.
inline constexpr const char* kMpsUnavailable =
    "Apple MPS metrics are unavailable: per-process MPS timing needs additional PyTorch "
    "instrumentation";

// A GPU collection is summarized in three pure steps:
//   SummarizeGpuCollection -> lines::ApplyKernelTracing (kernel_lines.h) -> FinishGpuCollection

// `collector_error` is MakeGpuCollector's error when no collector could be had; `backend` the
// collector's name otherwise; `notes` what the collector noted while sampling; `failures` the
// reads that failed (GpuCollector::TakeFailures): a reason for missing GPU time or memory names
// the driver's error when reads failed, e.g. "every GPU utilization read failed (gpu0: Unknown
// Error (NVML error 999)); GPU time cannot be estimated".
GpuCollectionSummary SummarizeGpuCollection(
    const std::optional<std::string>& collector_error, const std::string& backend,
    size_t device_count, const GpuSamplingSummary& sampled, const std::vector<std::string>& notes,
    const std::vector<telemetry::GpuReadFailure>& failures = {});

// The last step, on the summary as kernel tracing left it (GPU time may be measured now):
// reads that failed mid-run become diagnostics (how many of the readings, and the driver's
// error), and `warnings` is filled (with those failures and `losses` among them).
// `apple_host`: the host is macOS, where no collector means kMpsUnavailable is the reason.
void FinishGpuCollection(GpuCollectionSummary& summary, size_t device_count,
                         const GpuSamplingSummary& sampled,
                         const std::vector<telemetry::GpuReadFailure>& failures,
                         bool apple_host = false);

// One sampled line. Unknown stays nullopt (a sampler never knows hit counts).
struct SampledLine {
  int32_t file_id = -1;
  int32_t line = 0;
  int64_t samples = 0;
  int64_t wall_ns = 0;
  std::optional<int64_t> cpu_ns;
  std::optional<int64_t> rss_delta;
  std::optional<int64_t> rss_peak;
  std::optional<int64_t> gpu_busy_ns;
  std::optional<int64_t> gpu_mem_peak;
};

// Per-function totals from sampled stacks: `own` counts intervals where the function was the
// innermost recorded frame, `total` those where it was anywhere on the stack (once per
// interval, also under recursion).
struct SampledFunction {
  int32_t file_id = -1;
  std::string qualname;
  int32_t first_line = 0;
  int64_t own_ns = 0;
  int64_t total_ns = 0;
  int64_t own_samples = 0;
};

// Aggregates intervals per (file, line) and per function. Measured thread only; the maps
// grow only when a new line or function is seen.
class SampleAggregator {
 public:
  int32_t InternFile(std::string_view path);
  const std::vector<std::string>& files() const { return files_; }
  int32_t AddFunction(int32_t file_id, std::string qualname, int32_t first_line);

  void AddLine(int32_t file_id, int32_t line, const SampleInterval& s);
  void AddOwn(int32_t function, const SampleInterval& s) noexcept;
  void AddTotal(int32_t function, const SampleInterval& s) noexcept;
  // Time that no recorded frame was on the stack for (counted, not attributed).
  void AddUnattributed(const SampleInterval& s) noexcept;

  std::vector<SampledLine> Lines() const;  // sorted by file, line
  const std::vector<SampledFunction>& functions() const { return functions_; }
  int64_t unattributed_ns() const { return unattributed_ns_; }
  int64_t unattributed_samples() const { return unattributed_samples_; }
  int64_t total_samples() const { return total_samples_; }

 private:
  std::vector<std::string> files_;
  std::unordered_map<std::string, int32_t> file_ids_;
  std::unordered_map<int64_t, SampledLine> lines_;  // key = file_id << 32 | line
  std::vector<SampledFunction> functions_;
  int64_t unattributed_ns_ = 0;
  int64_t unattributed_samples_ = 0;
  int64_t total_samples_ = 0;
};

}  // namespace gpuprof::lines
