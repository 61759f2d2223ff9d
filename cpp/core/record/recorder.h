// The recorder: owns the event ring's consumer side and the background threads of a run
//   drain thread - pops training-thread events, assembles steps, pushes rows to the writer
//   gpu thread   - samples the GpuCollector at sample_hz; pushes the raw rows and their
//                  per-second rollups (store::GpuRollup -> gpu_samples_1s)
//   host thread  - samples /proc at host_hz (and tells the gpu thread the process tree);
//                  pushes host rows, raw worker rows and their 10 s rollups
//   stall thread - the stall watch (telemetry/stall_watch.h), with host telemetry: pushes the
//                  stretches when the process got no CPU (host_stalls) and, every few ticks,
//                  how long its threads queued for a CPU (cpu_waits)
// Raw rows are pruned to the retention windows by the StoreWriter (store::RawRetention).
// Start() once, Stop() idempotent; the destructor stops. Emit() is the only member the
// training thread calls.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "clock/clock.h"
#include "record/event.h"
#include "record/phase_names.h"
#include "record/spsc_ring.h"
#include "record/step_assembler.h"
#include "store/rollup.h"
#include "store/sqlite_store.h"
#include "telemetry/gpu_collector.h"
#include "telemetry/host_sampler.h"
#include "telemetry/stall_watch.h"
#include "util/periodic_thread.h"

namespace gpuprof::record {

// Sampling periods are kept within these bounds whatever the rate asked for: sample_hz /
// host_hz below one sample an hour sample once an hour.
inline constexpr std::chrono::nanoseconds kMinSamplePeriod{1000};               // 1 µs
inline constexpr std::chrono::nanoseconds kMaxSamplePeriod{3'600'000'000'000};  // 1 h
// Bucket timings reported between two drains (every drain_interval_ms) at most.
inline constexpr size_t kMaxPendingComm = 1 << 16;

struct RecorderOptions {
  double sample_hz = 100.0;  // GPU telemetry; <= 0 disables the thread
  double host_hz = 5.0;      // host telemetry; <= 0 disables the thread
  size_t ring_capacity = 1 << 16;
  int drain_interval_ms = 5;
  // The stall watch runs beside the host thread (host telemetry on): its tick and threshold.
  std::chrono::nanoseconds stall_tick = telemetry::kStallWatchTick;
  std::chrono::nanoseconds stall_threshold = telemetry::kStallWatchThreshold;
  // ...and how often it reads the CPU wait (in ticks), and the least wait a period must have.
  int cpu_wait_every_ticks = telemetry::kCpuWaitEveryTicks;
  std::chrono::nanoseconds cpu_wait_min = telemetry::kCpuWaitMin;
};

class Recorder {
 public:
  // Borrowed: writer and names must outlive the recorder. gpu/host may be null (unavailable);
  // cpu_wait is read by the stall watch, which runs only with host.
  Recorder(RecorderOptions options, clock::Anchor anchor, store::StoreWriter* writer,
           const PhaseNames* names, std::unique_ptr<telemetry::GpuCollector> gpu,
           std::unique_ptr<telemetry::HostSampler> host,
           std::unique_ptr<telemetry::CpuWaitReader> cpu_wait = nullptr);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void Start();
  // Stops the samplers, drains the ring, closes the last step. Idempotent.
  void Stop();

  // Training thread (the single producer) only. O(1): a clock read and a ring push; drops and
  // counts when the ring is full.
  void Emit(EventKind kind, uint32_t arg = 0, int64_t value = 0) noexcept {
    EmitAt(clock::NowNs(), kind, arg, value);
  }
  void EmitAt(int64_t ts_ns, EventKind kind, uint32_t arg, int64_t value) noexcept {
    if (!ring_.Push(Event{ts_ns, value, arg, kind, 0})) {
      dropped_events_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // From any thread (the DDP comm hook's callbacks run on the backend's threads): one bucket's
  // collective, monotonic ns; placed in its step on the drain thread (StepAssembler::
  // OnCommBucket). Ignored once Stop() has drained.
  void AddCommBucket(const store::CommBucketRow& mono);

  // From any thread: the job's other ranks on this host (HostSampler::SetJobRoots); nothing
  // without host telemetry.
  void SetJobPids(std::vector<int64_t> pids) {
    if (host_) host_->SetJobRoots(std::move(pids));
  }

  uint64_t dropped_events() const { return dropped_events_.load(std::memory_order_relaxed); }
  // Bucket timings not stored: reported after Stop(), over kMaxPendingComm, or placed in no
  // step (before the first step, in a discarded accumulation, older than the recent steps).
  // Read it after Stop().
  uint64_t dropped_comm() const {
    return dropped_comm_.load(std::memory_order_relaxed) +
           static_cast<uint64_t>(assembler_.unmatched_comm());
  }
  uint64_t gpu_ticks() const { return gpu_ticks_.load(std::memory_order_relaxed); }
  uint64_t host_ticks() const { return host_ticks_.load(std::memory_order_relaxed); }
  // Whether the stall watch runs (host telemetry on); its stalls so far.
  bool watching_stalls() const { return stall_watch_ != nullptr; }
  uint64_t stalls() const { return stall_watch_ ? stall_watch_->stalls() : 0; }
  // Whether the CPU wait is read (stall watch on and a reader given); its total so far (ns).
  bool watching_cpu_wait() const { return stall_watch_ && stall_watch_->watching_cpu_wait(); }
  int64_t cpu_wait_ns() const { return stall_watch_ ? stall_watch_->cpu_wait_ns() : 0; }
  const StepAssembler& assembler() const { return assembler_; }
  // Called on the recorder thread with every step row as it is stored (kernel traces take
  // their traced steps' spans from it). Set before Start().
  void SetStepObserver(std::function<void(const store::StepRow&)> fn) {
    step_observer_ = std::move(fn);
  }
  telemetry::GpuCollector* gpu() { return gpu_.get(); }

 private:
  void Drain() noexcept;
  void GpuTick() noexcept;
  void HostTick() noexcept;
  int64_t RelNow() const { return clock::NowNs() - anchor_.mono_ns; }

  const RecorderOptions options_;
  const clock::Anchor anchor_;
  store::StoreWriter* writer_;
  SpscRing<Event> ring_;
  StepAssembler assembler_;
  std::function<void(const store::StepRow&)> step_observer_;
  std::unique_ptr<telemetry::GpuCollector> gpu_;
  std::unique_ptr<telemetry::HostSampler> host_;
  std::mutex comm_mu_;
  std::vector<store::CommBucketRow> comm_;  // guarded by comm_mu_
  bool comm_closed_ = false;                // guarded by comm_mu_
  std::mutex pids_mu_;
  std::vector<int64_t> pids_;  // process tree, updated by the host thread
  std::atomic<uint64_t> dropped_events_{0};
  std::atomic<uint64_t> dropped_comm_{0};
  std::atomic<uint64_t> gpu_ticks_{0};
  std::atomic<uint64_t> host_ticks_{0};
  std::vector<store::GpuSampleRow> gpu_rows_;         // gpu thread scratch
  store::GpuRollup gpu_rollup_;                       // gpu thread (Stop() once it is joined)
  std::vector<store::GpuRollupRow> gpu_rollup_rows_;  // gpu thread scratch
  store::WorkerRollup worker_rollup_;                 // host thread (Stop() once it is joined)
  util::PeriodicThread drain_thread_, gpu_thread_, host_thread_;
  std::unique_ptr<telemetry::StallWatch> stall_watch_;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace gpuprof::record
