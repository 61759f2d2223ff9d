// Turns the event stream of the training thread into step and phase rows.
//
// Auto mode (patched torch): a step ends at the end of the last optimizer step before the
// next forward/backward/dataloader wait, so gradient accumulation (several forward+backward
// per optimizer.step) and several optimizers stepping in one iteration each make ONE step.
// A closure-style step (optimizer.step(closure): the forward and backward run inside the
// optimizer step, as LBFGS and Lightning's automatic optimization do) starts at that
// optimizer's begin, and its optimizer phase is the optimizer's own time, without the nested
// forward / backward (which are the step's forward and backward phases).
// Manual mode: prof.step(i) brackets the step, and every bracket is a step. Step numbers
// increase in run order: step(i) is stored as step i when i is above the last stored step,
// otherwise (an epoch loop restarting enumerate() at 0, a repeated index) as the next free
// number; each change of the offset (stored step - i) is noted as an info diagnostic
// (source "steps"), so the user's indices stay recoverable. A manual step's forward_calls /
// backward_calls / optimizer_calls count its s.phase("forward"/"backward"/"optimizer") blocks
// (or the hooked calls with auto=True, whichever is larger). In both modes steps tile the
// timeline: step k starts where step k-1 ended, so its duration includes the dataloader wait
// before its first forward. Step 0 starts at the first activity (or the first measured wait)
// and has no gap wait.
//
// Excluded stretches (kExcludeBegin/End: prof.evaluation(), a trainer's validation loop): a
// pending auto step closes at its last optimizer end when one begins; forwards, backwards,
// optimizer calls and loader waits inside are counted (excluded_*) and belong to no step; the
// next step starts where the stretch ended, so its time is neither a step's nor a gap wait.
//
// Dataloader wait of a step: the time measured inside the loader (kWaitBegin/End; value 0 =
// wrap_dataloader's next(), stored as wait_source "explicit"; 1 = torch DataLoader iter()/next()
// patched in auto mode, "dataloader") when the step has any, else the inter-step gap ("gap").
// A measured wait leaves the rest of the gap (logging, zero_grad, host work between steps) to
// the step's time outside the phases, not to the loader.
//
// Runs on the recorder thread only. Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "record/event.h"
#include "record/phase_names.h"
#include "store/rows.h"

namespace gpuprof::record {

class StepAssembler {
 public:
  using Sink = std::function<void(store::Row&&)>;

  // anchor_mono_ns: the run's start; rows carry timestamps relative to it.
  StepAssembler(const PhaseNames* names, int64_t anchor_mono_ns, Sink sink);

  void OnEvent(const Event& e);
  // One collective of a DDP gradient bucket (start: its comm hook was called; end: the collective
  // finished), monotonic ns. It belongs to the step whose span holds its start: the open step
  // (stored when that step closes; dropped with it when an auto step is discarded), a recently
  // closed one (a late report: a CUDA event resolved later), or the next step when it starts
  // between steps. Older than the recent steps, or before the first step: unmatched.
  void OnCommBucket(const store::CommBucketRow& mono);
  // End of run: closes a pending auto step at its last optimizer end and an open manual step
  // at `now_mono_ns`. Activity after the last optimizer step is not a step (counted).
  void Finish(int64_t now_mono_ns);

  int64_t steps_emitted() const { return steps_emitted_; }
  // Forward/backward calls that ended up in no step (e.g. after the last optimizer.step(),
  // or an inference-only loop in auto mode).
  int64_t orphan_calls() const { return orphan_calls_; }
  // Events that could not be placed (phase end without begin, GPU time of an unknown step).
  int64_t unmatched_events() const { return unmatched_events_; }
  // Bucket timings placed in no stored step (see OnCommBucket).
  int64_t unmatched_comm() const { return unmatched_comm_; }
  // Stretches kept out of the steps (kExcludeBegin/End: evaluation loops), their summed wall
  // time, and the forward calls inside them.
  int64_t excluded_spans() const { return excluded_spans_; }
  int64_t excluded_ns() const { return excluded_ns_; }
  int64_t excluded_forwards() const { return excluded_forwards_; }

 private:
  struct PhaseAcc {
    uint32_t id = 0;
    int64_t wall_ns = 0;
    int64_t calls = 0;
    std::optional<int64_t> gpu_ns;
  };
  struct OpenStep {
    bool manual = false;
    int64_t index = 0;
    int64_t start_ns = 0;
    std::optional<int64_t> gap_wait_ns;
    int64_t explicit_wait_ns = 0;
    bool has_explicit_wait = false;
    bool wait_wrapped = false;  // some of the wait was measured by wrap_dataloader
    int64_t loader_starts = 0, loader_start_ns = 0;  // iter(loader) waits in it
    int64_t forward_calls = 0, backward_calls = 0, optimizer_calls = 0;
    // Manual s.phase() blocks named forward / backward / optimizer (PhaseNames ids 0..2).
    int64_t named_phase_calls[3] = {0, 0, 0};
    std::vector<PhaseAcc> phases;
    std::vector<store::CommBucketRow> comm;  // monotonic times; stored at Close
  };
  struct ClosedSpan {
    int64_t index, start_ns, end_ns;
  };

  void OpenAuto(int64_t ts);
  void OpenManual(int64_t index, int64_t ts);
  void OpenCommon(OpenStep* s, int64_t ts);
  void Close(int64_t end_ns);
  void StoreComm(int64_t step, store::CommBucketRow row);
  void CloseIfPending();
  PhaseAcc& Phase(uint32_t id);
  void AddPhase(uint32_t id, int64_t wall_ns);
  // Whether a phase of the same name encloses the one that just ended: a user's
  // s.phase("forward") around the model call (auto mode times the forward too), or the same
  // name nested. Its time is then counted once, by the outer one.
  bool UserPhaseOpen(uint32_t id) const;
  bool AutoPhaseOpen(uint32_t id) const;
  void OnGpuPhase(const Event& e);
  void DiscardAutoAccumulation();

  const PhaseNames* names_;
  const int64_t anchor_;
  Sink sink_;

  std::optional<OpenStep> open_;
  std::optional<int64_t> prev_end_;
  int64_t next_index_ = 0;
  std::optional<int64_t> last_step_;  // number of the last emitted step
  int64_t manual_offset_ = 0;         // stored step - user's index of the last manual step
  int64_t index_notes_ = 0;           // diagnostics written about remapped indices
  bool pending_close_ = false;
  int64_t last_opt_end_ = 0;
  std::optional<int64_t> fwd_begin_, bwd_begin_, opt_begin_, wait_begin_;
  // Closure-style steps: the forward / backward time inside the open optimizer step (taken out
  // of the optimizer phase), the start of the nested stretch being timed, and whether the step
  // being opened began at the optimizer's begin.
  int64_t opt_nested_ns_ = 0;
  std::optional<int64_t> opt_nested_begin_;
  bool opened_by_optimizer_ = false;
  // Excluded stretches (evaluation): nesting depth, the open one's start, totals.
  int exclude_depth_ = 0;
  int64_t exclude_begin_ = 0;
  int64_t excluded_spans_ = 0, excluded_ns_ = 0, excluded_forwards_ = 0;
  std::vector<std::pair<uint32_t, int64_t>> phase_stack_;  // manual phases: (id, begin)
  // Explicit dataloader wait seen while no step was open; belongs to the next step.
  int64_t carry_wait_ns_ = 0;
  std::optional<int64_t> carry_wait_start_;
  bool carry_wait_wrapped_ = false;
  int64_t carry_loader_starts_ = 0, carry_loader_start_ns_ = 0;
  bool wait_wrapped_ = false;                       // the open wait's source (kWaitBegin value 0)
  bool wait_starts_loader_ = false;                 // the open wait is iter(loader) (value 2)
  std::deque<ClosedSpan> recent_;                   // for late GPU times
  std::vector<store::CommBucketRow> comm_waiting_;  // started between steps: the next one's
  int64_t unmatched_comm_ = 0;
  int64_t steps_emitted_ = 0;
  int64_t orphan_calls_ = 0;
  int64_t unmatched_events_ = 0;
};

}  // namespace gpuprof::record
