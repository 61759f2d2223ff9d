#include "record/recorder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace gpuprof::record {
namespace {
// The sampling period for a rate, within [kMinPeriod, kMaxPeriod]: a rate below one sample an
// hour samples once an hour (1e9 / 1e-10 Hz would overflow the nanosecond count and spin).
std::chrono::nanoseconds PeriodFor(double hz) {
  const double ns = 1e9 / hz;
  if (!(ns < static_cast<double>(kMaxSamplePeriod.count()))) return kMaxSamplePeriod;
  return std::max(std::chrono::nanoseconds(static_cast<int64_t>(ns)), kMinSamplePeriod);
}
}  // namespace

Recorder::Recorder(RecorderOptions options, clock::Anchor anchor, store::StoreWriter* writer,
                   const PhaseNames* names, std::unique_ptr<telemetry::GpuCollector> gpu,
                   std::unique_ptr<telemetry::HostSampler> host,
                   std::unique_ptr<telemetry::CpuWaitReader> cpu_wait)
    : options_(options),
      anchor_(anchor),
      writer_(writer),
      ring_(options.ring_capacity),
      assembler_(names, anchor.mono_ns,
                 [this](store::Row&& row) {
                   if (step_observer_) {
                     if (const auto* s = std::get_if<store::StepRow>(&row)) step_observer_(*s);
                   }
                   writer_->Push(std::move(row));
                 }),
      gpu_(std::move(gpu)),
      host_(std::move(host)) {
  pids_.push_back(static_cast<int64_t>(getpid()));
  if (gpu_) {
    for (const auto& d : gpu_->devices()) gpu_rollup_.SetMaxClock(d.index, d.sm_clock_max_mhz);
  }
  if (host_ && options_.host_hz > 0) {
    stall_watch_ = std::make_unique<telemetry::StallWatch>(
        options_.stall_tick, options_.stall_threshold,
        [this](int64_t start_ns, int64_t duration_ns) {
          writer_->Push(store::StallRow{start_ns - anchor_.mono_ns, duration_ns});
        });
    if (cpu_wait) {
      stall_watch_->WatchCpuWait(
          std::move(cpu_wait), options_.cpu_wait_every_ticks, options_.cpu_wait_min,
          [this](int64_t start_ns, int64_t end_ns, int64_t wait_ns) {
            writer_->Push(
                store::CpuWaitRow{start_ns - anchor_.mono_ns, end_ns - anchor_.mono_ns, wait_ns});
          });
    }
  }
}

Recorder::~Recorder() { Stop(); }

void Recorder::Start() {
  if (started_) return;
  started_ = true;
  drain_thread_.Start(
      std::chrono::milliseconds(options_.drain_interval_ms), [this] { Drain(); }, {},
      "gpuprof-drain");
  if (gpu_ && options_.sample_hz > 0) {
    gpu_thread_.Start(
        PeriodFor(options_.sample_hz), [this] { GpuTick(); }, {}, "gpuprof-gpu");
  }
  if (host_ && options_.host_hz > 0) {
    host_thread_.Start(
        PeriodFor(options_.host_hz), [this] { HostTick(); }, {}, "gpuprof-host");
  }
  if (stall_watch_) stall_watch_->Start();
}

void Recorder::Stop() {
  if (stopped_) return;
  stopped_ = true;
  gpu_thread_.Stop();
  host_thread_.Stop();
  if (stall_watch_) stall_watch_->Stop();
  drain_thread_.Stop();
  // Everything the training thread emitted before Stop() is in the ring now: the caller
  // guarantees no concurrent Emit() once it calls Stop(). A bucket reported later is dropped.
  {
    std::lock_guard lock(comm_mu_);
    comm_closed_ = true;
  }
  Drain();
  assembler_.Finish(clock::NowNs());
  // One last telemetry tick so that short runs have at least one sample of each kind.
  if (gpu_ && gpu_ticks_.load() == 0 && options_.sample_hz > 0) GpuTick();
  if (host_ && host_ticks_.load() < 2 && options_.host_hz > 0) HostTick();
  // The sampler threads are joined: close the open rollup rows (the last, partial second).
  try {
    gpu_rollup_rows_.clear();
    gpu_rollup_.Flush(&gpu_rollup_rows_);
    for (auto& row : gpu_rollup_rows_) writer_->Push(std::move(row));
    std::vector<store::WorkerRollupRow> workers;
    worker_rollup_.Flush(&workers);
    for (auto& row : workers) writer_->Push(std::move(row));
  } catch (...) {
  }
}

void Recorder::AddCommBucket(const store::CommBucketRow& mono) {
  std::lock_guard lock(comm_mu_);
  if (comm_closed_ || comm_.size() >= kMaxPendingComm) {
    dropped_comm_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  comm_.push_back(mono);
}

void Recorder::Drain() noexcept {
  // The buckets are taken before the ring is read: every event emitted before a bucket was
  // reported (the forward that opened its step) is then in the ring, and placed first.
  std::vector<store::CommBucketRow> comm;
  {
    std::lock_guard lock(comm_mu_);
    comm.swap(comm_);
  }
  Event e;
  try {
    while (ring_.Pop(&e)) assembler_.OnEvent(e);
  } catch (...) {
    // Allocation failure inside the assembler: drop this event, keep the thread alive.
    dropped_events_.fetch_add(1, std::memory_order_relaxed);
  }
  for (const auto& c : comm) {
    try {
      assembler_.OnCommBucket(c);
    } catch (...) {
      dropped_comm_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void Recorder::GpuTick() noexcept {
  try {
    std::vector<int64_t> pids;
    {
      std::lock_guard lock(pids_mu_);
      pids = pids_;
    }
    gpu_rows_.clear();
    gpu_->Sample(RelNow(), pids, &gpu_rows_);
    gpu_rollup_rows_.clear();
    for (const auto& row : gpu_rows_) gpu_rollup_.Add(row, &gpu_rollup_rows_);
    for (auto& row : gpu_rollup_rows_) writer_->Push(std::move(row));
    for (auto& row : gpu_rows_) writer_->Push(std::move(row));
    for (auto& note : gpu_->TakeNotes()) {
      writer_->Push(store::DiagnosticRow{RelNow(), "warning", "gpu", std::move(note)});
    }
    gpu_ticks_.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
  }
}

void Recorder::HostTick() noexcept {
  try {
    store::HostSampleRow host;
    std::vector<store::WorkerSampleRow> workers;
    if (host_->Sample(RelNow(), &host, &workers)) {
      writer_->Push(std::move(host));
      std::vector<store::WorkerRollupRow> rollups;
      for (const auto& w : workers) worker_rollup_.Add(w, &rollups);
      for (auto& r : rollups) writer_->Push(std::move(r));
      for (auto& w : workers) writer_->Push(std::move(w));
    }
    for (auto& note : host_->TakeNotes()) {
      writer_->Push(store::DiagnosticRow{RelNow(), "warning", "host", std::move(note)});
    }
    {
      std::lock_guard lock(pids_mu_);
      if (!host_->tree_pids().empty()) pids_ = host_->tree_pids();
    }
    host_ticks_.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
  }
}

}  // namespace gpuprof::record
