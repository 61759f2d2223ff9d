// Measured GPU kernel time per source line: the join between telemetry::KernelTracer (CUPTI,
// exact kernel durations per tag) and the line sampler (which line each sampling interval was
// charged to).
//
// The tag of a launch is the index of the sampling interval it happened in: the tracer's
// tag_fn returns CurrentInterval(), a relaxed atomic read that is safe on any launching thread
// (the training thread, autograd's device threads, NCCL's). When the measured thread answers a
// sample it calls CloseInterval(file_id, line): the interval gets its line and the next one
// opens. So a kernel is charged to the line the measured thread was on when the kernel was
// launched, at the sampler's resolution (a launch from a line shorter than the interval goes
// to the line running at the next sample), and its device time is exact. A launching thread
// that knows its own line (the measured thread itself, see cpp/python/line_sampler.cc) tags
// with LineTag(file, line) instead: exact attribution, no interval involved.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "telemetry/cupti_tracer.h"

namespace gpuprof::lines {

struct LineKernelTotals {
  int64_t kernel_count = 0;
  int64_t kernel_ns = 0;       // sum of kernel durations (overlapping kernels each count)
  int64_t kernel_busy_ns = 0;  // union of kernel intervals within each sampling interval
  int64_t memcpy_ns = 0;
  int64_t memset_ns = 0;
};

class KernelLineMap {
 public:
  // `ring` intervals are remembered (rounded up to a power of two): a record whose interval is
  // older than that when it is resolved is counted as late, not attributed.
  explicit KernelLineMap(size_t ring = size_t{1} << 16);
  KernelLineMap(const KernelLineMap&) = delete;
  KernelLineMap& operator=(const KernelLineMap&) = delete;

  // Any thread, noexcept: the interval now open (a tag for KernelTracer).
  uint64_t CurrentInterval() const noexcept { return next_.load(std::memory_order_relaxed); }
  static uint64_t TagFn(void* self) noexcept {
    return static_cast<const KernelLineMap*>(self)->CurrentInterval();
  }
  // A tag naming the line directly (the launching thread knew its line): top bit set.
  static constexpr uint64_t kLineTagBit = uint64_t{1} << 63;
  static uint64_t LineTag(int32_t file_id, int32_t line) noexcept {
    return kLineTagBit | static_cast<uint64_t>(Key(file_id, line));
  }

  // Measured thread only: the open interval was charged to (file_id, line); file_id < 0 means
  // no recorded line (its kernels go to the unattributed total). noexcept, no allocation.
  void CloseInterval(int32_t file_id, int32_t line) noexcept;

  // Any one thread at a time (the drain thread, then the stopping thread): adds the records'
  // totals to their lines. Tags of intervals not closed yet are kept and resolved by a later
  // call; `final` resolves those to the unattributed total.
  void Resolve(const telemetry::KernelTraceTotals& totals, bool final = false);

  // Key = file_id << 32 | line. Read after the last Resolve.
  const std::unordered_map<int64_t, LineKernelTotals>& lines() const { return lines_; }
  const LineKernelTotals& unattributed() const { return unattributed_; }
  int64_t late_records() const { return late_; }
  static int64_t Key(int32_t file_id, int32_t line) {
    return (static_cast<int64_t>(file_id) << 32) | static_cast<uint32_t>(line);
  }

 private:
  struct Slot {
    std::atomic<uint64_t> seq{~uint64_t{0}};
    std::atomic<int64_t> key{-1};
  };
  void Add(LineKernelTotals& into, const telemetry::KernelTagTotals& t);

  size_t mask_;
  std::unique_ptr<Slot[]> ring_;
  std::atomic<uint64_t> next_{0};
  std::unordered_map<int64_t, LineKernelTotals> lines_;
  std::unordered_map<uint64_t, telemetry::KernelTagTotals> pending_;
  LineKernelTotals unattributed_;
  int64_t late_ = 0;
};

struct GpuCollectionSummary;

// Folds the kernel tracer's state into the GPU collection summary: with the tracer active GPU
// time is measured (method "cupti"); without it, why not (and that GPU time stays estimated).
// `error` is the tracer's Open error when it could not be had (nullopt when not attempted and
// not active).
void ApplyKernelTracing(GpuCollectionSummary& summary, bool active,
                        const std::optional<std::string>& error, const std::string& library,
                        uint32_t cupti_version, const LineKernelTotals& unattributed,
                        int64_t late_records, const std::vector<std::string>& notes);

}  // namespace gpuprof::lines
