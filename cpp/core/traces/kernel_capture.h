// KernelCapture: the kernels of a run's traced steps and continuous windows (TracePlan),
// measured by the CUPTI KernelTracer and written as rows of the kernels table.
//
// Tagging. Every kernel launch is tagged on the launching thread (KernelTracer's tag_fn) with
// (traced step, continuous window): the step comes from an atomic that the training thread
// keeps current through OnEvent (one relaxed store per step edge, no lock, no allocation), the
// window from the launch's clock reading. Step numbering follows the StepAssembler's: auto mode
// advances at the first forward / backward / loader wait after an optimizer step (so several
// optimizers or gradient accumulation make one step); manual mode takes prof.step(i)'s index
// (or, for an index not above the last one, the next free number) and tags nothing between
// step blocks. Kernels between an optimizer step and the next forward (zero_grad, logging)
// count to the step that just ended. Kernels inside an excluded stretch (prof.evaluation(), a
// trainer's validation loop) belong to no step, and its forwards advance nothing.
//
// Aggregation and writing. A poll thread (1 s) flushes CUPTI and adds each tagged kernel to its
// step's and window's aggregates, per kernel name and launch configuration (device, stream,
// grid, block): calls, summed / shortest / longest duration. A traced step is written once its
// StepRow is known (OnStepRow, from the recorder thread: the window is exactly the step's span)
// and settle_ns has passed since its end, so that kernels still running on the GPU are in;
// a continuous window settle_ns after it ends. Each window keeps its max_rows largest entries
// and folds the rest into one "(N other kernels)" row, so memory and rows stay bounded for any
// run length. Records that arrive for an already written step or window become extra rows of
// the same window (sums over a window stay right) and are counted (late_rows).
//
// Costs. With any mode on, CUPTI records every kernel (concurrent-kernel activity); records of
// untraced steps are discarded at delivery. The launch callback adds an atomic load (and, in
// continuous mode, a clock read) per launch.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "store/rows.h"
#include "telemetry/cupti_tracer.h"
#include "traces/trace_plan.h"
#include "util/periodic_thread.h"
#include "util/status.h"

namespace gpuprof::traces {

// What the training thread reports (a subset of record::EventKind, kept separate so that this
// library does not depend on the recorder).
enum class StepEdge {
  kForwardBegin,
  kBackwardBegin,
  kWaitBegin,
  kOptimizerEnd,
  kStepBegin,
  kStepEnd,
  kExcludeBegin,
  kExcludeEnd
};

struct KernelCaptureOptions {
  TracePlan plan;
  std::string cupti_library;          // "" = KernelTracer's default candidates
  size_t max_rows_per_window = 64;    // then one "(N other kernels)" row
  int64_t settle_ns = 2'000'000'000;  // how long after a window ends its rows are written
  std::chrono::milliseconds poll_period{1000};
  telemetry::KernelTracerOptions tracer;  // launch_detail is forced on; memcpy off by default
};

class KernelCapture {
 public:
  using RowSink = std::function<void(std::vector<store::Row>&&)>;
  using NowFn = int64_t (*)();  // monotonic ns (clock::NowNs in production)

  // Opens CUPTI and starts the poll thread. anchor_mono_ns: the run's time 0. sink receives
  // KernelRows (from the poll thread, and from Stop on the caller's thread).
  static Expected<std::unique_ptr<KernelCapture>> Open(KernelCaptureOptions options,
                                                       int64_t anchor_mono_ns, RowSink sink,
                                                       NowFn now = nullptr);
  ~KernelCapture();  // Stop()
  KernelCapture(const KernelCapture&) = delete;
  KernelCapture& operator=(const KernelCapture&) = delete;

  // Training thread: a step edge (value: prof.step's index for kStepBegin). O(1), lock-free.
  void OnEvent(StepEdge edge, int64_t value = 0) noexcept;
  // Recorder thread: a step row as stored (its span is the traced step's window).
  void OnStepRow(const store::StepRow& step);
  // Writes what is pending now (settle_ns not waited for), e.g. for tests.
  void Poll(bool all);
  // Flushes CUPTI, writes everything pending, stops tracing. Idempotent. Call after the
  // device was synchronised (so that the last kernels are delivered) and after the recorder
  // stored the last step. Kernels of a traced step that has no stored step row (it never
  // closed) are counted in unplaced_kernels, not written.
  void Stop();

  struct Stats {
    uint64_t rows = 0;            // kernels rows written
    uint64_t late_rows = 0;       // rows for a window already written
    uint64_t traced_kernels = 0;  // kernel records of traced steps or windows
    uint64_t untraced_kernels = 0;
    uint64_t dropped_records = 0;
    uint64_t unplaced_kernels = 0;
  };
  Stats stats() const;
  // The tracer's notes (library version, drops, ...) since the previous call.
  std::vector<std::string> TakeNotes();
  const std::string& library_path() const { return library_path_; }

 private:
  struct Key {
    std::string name;
    uint32_t device, stream;
    int32_t grid[3], block[3];
    auto Tie() const {
      return std::tie(name, device, stream, grid[0], grid[1], grid[2], block[0], block[1],
                      block[2]);
    }
    bool operator<(const Key& o) const { return Tie() < o.Tie(); }
  };
  struct Acc {
    uint64_t calls = 0, ns = 0, min_ns = ~uint64_t{0}, max_ns = 0;
  };
  struct Pending {
    std::map<Key, Acc> kernels;
    bool written = false;  // rows already went out once
  };

  KernelCapture(KernelCaptureOptions options, int64_t anchor, RowSink sink, NowFn now);
  static uint64_t TagFn(void* self) noexcept;
  void SetStep(int64_t step) noexcept;
  void Drain();  // flush + merge the tracer's totals into pending_ (mu_ held)
  void Emit(std::vector<store::Row>* out, const std::map<Key, Acc>& kernels, int64_t start,
            int64_t end, std::optional<int64_t> step);

  KernelCaptureOptions options_;
  int64_t anchor_;
  RowSink sink_;
  NowFn now_;
  std::unique_ptr<telemetry::KernelTracer> tracer_;
  std::string library_path_;
  util::PeriodicThread poll_;

  // Training thread state (written by OnEvent only).
  int64_t step_ = 0;
  int64_t last_manual_ = -1;
  bool manual_ = false;
  bool advance_pending_ = false;
  int exclude_depth_ = 0;  // inside prof.evaluation(): kernels belong to no step
  bool in_manual_step_ = false;
  // Read by TagFn on any launching thread: traced step + 1, or 0.
  std::atomic<uint64_t> step_tag_{0};

  mutable std::mutex mu_;               // everything below (poll thread, recorder thread, Stop)
  std::map<int64_t, Pending> steps_;    // traced step -> kernels
  std::map<int64_t, Pending> windows_;  // continuous window -> kernels
  std::map<int64_t, std::pair<int64_t, int64_t>> step_spans_;  // step -> (start, end) rel ns
  Stats stats_;
  bool stopped_ = false;
};

}  // namespace gpuprof::traces
