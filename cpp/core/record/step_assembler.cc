#include "record/step_assembler.h"

#include <algorithm>
#include <string>

namespace gpuprof::record {
namespace {
constexpr size_t kRecentSteps = 1024;      // closed steps kept for GPU times that resolve late
constexpr int64_t kMaxIndexNotes = 100;    // diagnostics about remapped step(i) indices per run
constexpr size_t kMaxCommPerStep = 65536;  // bucket timings held for one open step
}  // namespace

StepAssembler::StepAssembler(const PhaseNames* names, int64_t anchor_mono_ns, Sink sink)
    : names_(names), anchor_(anchor_mono_ns), sink_(std::move(sink)) {}

void StepAssembler::OpenCommon(OpenStep* s, int64_t ts) {
  if (prev_end_) {
    s->start_ns = *prev_end_;
    s->gap_wait_ns = std::max<int64_t>(0, ts - *prev_end_);
  } else {
    s->start_ns = carry_wait_start_ ? std::min(*carry_wait_start_, ts) : ts;
  }
  if (carry_wait_start_) {
    s->explicit_wait_ns = carry_wait_ns_;
    s->has_explicit_wait = true;
    s->wait_wrapped = carry_wait_wrapped_;
    s->loader_starts = carry_loader_starts_;
    s->loader_start_ns = carry_loader_start_ns_;
  }
  carry_wait_ns_ = 0;
  carry_wait_start_.reset();
  carry_wait_wrapped_ = false;
  carry_loader_starts_ = carry_loader_start_ns_ = 0;
  s->comm = std::move(comm_waiting_);
  comm_waiting_.clear();
}

void StepAssembler::OpenAuto(int64_t ts) {
  OpenStep s;
  s.manual = false;
  s.index = next_index_;
  OpenCommon(&s, ts);
  open_ = std::move(s);
}

void StepAssembler::OpenManual(int64_t index, int64_t ts) {
  OpenStep s;
  s.manual = true;
  // Every prof.step() is a step: an index that does not advance takes the next free number.
  s.index = (!last_step_ || index > *last_step_) ? index : *last_step_ + 1;
  const int64_t offset = s.index - index;
  if (offset != manual_offset_) {
    manual_offset_ = offset;
    if (index_notes_ < kMaxIndexNotes) {
      std::string msg =
          "prof.step(" + std::to_string(index) + ") is stored as step " + std::to_string(s.index);
      if (offset == 0) {
        msg += ": indices advance again; from here on the stored step is the index";
      } else {
        msg +=
            " (step numbers increase in run order; an index at or below the last stored "
            "step takes the next free number): from here on stored step = index + " +
            std::to_string(offset) + " until the next such note";
      }
      sink_(store::DiagnosticRow{ts - anchor_, "info", "steps", std::move(msg)});
    } else if (index_notes_ == kMaxIndexNotes) {
      sink_(store::DiagnosticRow{ts - anchor_, "info", "steps",
                                 "more prof.step() indices were renumbered; not noted further"});
    }
    ++index_notes_;
  }
  OpenCommon(&s, ts);
  open_ = std::move(s);
}

StepAssembler::PhaseAcc& StepAssembler::Phase(uint32_t id) {
  for (auto& p : open_->phases) {
    if (p.id == id) return p;
  }
  open_->phases.push_back(PhaseAcc{id, 0, 0, std::nullopt});
  return open_->phases.back();
}

bool StepAssembler::UserPhaseOpen(uint32_t id) const {
  return std::any_of(phase_stack_.begin(), phase_stack_.end(),
                     [&](const auto& p) { return p.first == id; });
}

bool StepAssembler::AutoPhaseOpen(uint32_t id) const {
  if (id == PhaseNames::kForward) return fwd_begin_.has_value();
  if (id == PhaseNames::kBackward) return bwd_begin_.has_value();
  if (id == PhaseNames::kOptimizer) return opt_begin_.has_value();
  return false;
}

void StepAssembler::AddPhase(uint32_t id, int64_t wall_ns) {
  if (!open_) {
    ++unmatched_events_;
    return;
  }
  PhaseAcc& p = Phase(id);
  p.wall_ns += std::max<int64_t>(0, wall_ns);
  p.calls += 1;
}

void StepAssembler::Close(int64_t end_ns) {
  OpenStep& s = *open_;
  store::StepRow row;
  row.step = s.index;
  row.start_ns = s.start_ns - anchor_;
  row.end_ns = std::max(end_ns, s.start_ns) - anchor_;
  if (s.has_explicit_wait) {
    row.wait_ns = s.explicit_wait_ns;
    row.wait_source = s.wait_wrapped ? "explicit" : "dataloader";
    row.loader_starts = s.loader_starts;
    row.loader_start_ns = s.loader_start_ns;
  } else if (s.gap_wait_ns) {
    row.wait_ns = s.gap_wait_ns;
    row.wait_source = "gap";
  }
  row.forward_calls = std::max(s.forward_calls, s.named_phase_calls[PhaseNames::kForward]);
  row.backward_calls = std::max(s.backward_calls, s.named_phase_calls[PhaseNames::kBackward]);
  row.optimizer_calls = std::max(s.optimizer_calls, s.named_phase_calls[PhaseNames::kOptimizer]);
  sink_(std::move(row));
  for (const PhaseAcc& p : s.phases) {
    store::PhaseRow pr;
    pr.step = s.index;
    pr.name = names_->Name(p.id);
    pr.wall_ns = p.wall_ns;
    pr.gpu_ns = p.gpu_ns;
    pr.calls = p.calls;
    sink_(std::move(pr));
  }
  for (store::CommBucketRow& c : s.comm) StoreComm(s.index, std::move(c));
  recent_.push_back(ClosedSpan{s.index, s.start_ns, std::max(end_ns, s.start_ns)});
  if (recent_.size() > kRecentSteps) recent_.pop_front();
  ++steps_emitted_;
  next_index_ = s.index + 1;
  last_step_ = s.index;
  prev_end_ = std::max(end_ns, s.start_ns);
  open_.reset();
  pending_close_ = false;
}

void StepAssembler::CloseIfPending() {
  if (pending_close_ && open_ && !open_->manual) Close(last_opt_end_);
  pending_close_ = false;
}

void StepAssembler::StoreComm(int64_t step, store::CommBucketRow row) {
  row.step = step;
  row.start_ns -= anchor_;
  row.end_ns -= anchor_;
  sink_(std::move(row));
}

void StepAssembler::OnCommBucket(const store::CommBucketRow& mono) {
  const int64_t t = mono.start_ns;
  if (open_ && t >= open_->start_ns && !(pending_close_ && !open_->manual && t > last_opt_end_)) {
    if (open_->comm.size() < kMaxCommPerStep) {
      open_->comm.push_back(mono);
    } else {
      ++unmatched_comm_;
    }
    return;
  }
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
    if (t >= it->start_ns && t <= it->end_ns) {
      StoreComm(it->index, mono);
      return;
    }
  }
  // Between steps (after the last one closed, or after a pending auto step's optimizer): the
  // next step's, which starts where the last one ended.
  const bool after_last = (open_ && t >= open_->start_ns) || (prev_end_ && t >= *prev_end_);
  if (after_last && comm_waiting_.size() < kMaxCommPerStep) {
    comm_waiting_.push_back(mono);
    return;
  }
  ++unmatched_comm_;
}

void StepAssembler::DiscardAutoAccumulation() {
  if (open_ && !open_->manual) {
    unmatched_comm_ += static_cast<int64_t>(open_->comm.size());
    orphan_calls_ += open_->forward_calls + open_->backward_calls;
    open_.reset();
  }
}

void StepAssembler::OnGpuPhase(const Event& e) {
  // Attribute to the step whose span contains the interval's CPU begin timestamp.
  if (open_ && e.ts_ns >= open_->start_ns) {
    PhaseAcc& p = Phase(e.arg);
    p.gpu_ns = p.gpu_ns.value_or(0) + e.value;
    return;
  }
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
    if (e.ts_ns >= it->start_ns && e.ts_ns <= it->end_ns) {
      store::PhaseGpuRow row;
      row.step = it->index;
      row.name = names_->Name(e.arg);
      row.gpu_ns = e.value;
      sink_(std::move(row));
      return;
    }
  }
  ++unmatched_events_;
}

void StepAssembler::OnEvent(const Event& e) {
  const int64_t ts = e.ts_ns;
  if (e.kind == EventKind::kExcludeBegin) {
    if (exclude_depth_++ == 0) {
      CloseIfPending();  // the training step before the evaluation ends at its optimizer
      exclude_begin_ = ts;
      fwd_begin_.reset();
      bwd_begin_.reset();
      wait_begin_.reset();
    }
    return;
  }
  if (e.kind == EventKind::kExcludeEnd) {
    if (exclude_depth_ == 0) {
      ++unmatched_events_;
      return;
    }
    if (--exclude_depth_ == 0) {
      excluded_ns_ += std::max<int64_t>(0, ts - exclude_begin_);
      ++excluded_spans_;
      // The next step starts after it: the evaluation is in no step, not even as a gap.
      if (!open_) prev_end_ = std::max(prev_end_.value_or(ts), ts);
      fwd_begin_.reset();
      bwd_begin_.reset();
      wait_begin_.reset();
    }
    return;
  }
  if (exclude_depth_ > 0 && e.kind != EventKind::kGpuPhase) {
    if (e.kind == EventKind::kForwardBegin) ++excluded_forwards_;
    return;  // evaluation activity: counted, in no step
  }
  switch (e.kind) {
    case EventKind::kForwardBegin:
    case EventKind::kBackwardBegin: {
      if (opt_begin_ && !opt_nested_begin_) {
        // Closure-style step (optimizer.step(closure): LBFGS, Lightning's automatic
        // optimization): the forward / backward run inside the optimizer step. The iteration
        // began with that optimizer call, so a pending step closes at its last optimizer end
        // and the new one starts at this optimizer's begin; the nested time is the step's
        // forward / backward, not the optimizer's.
        if (pending_close_ && open_ && !open_->manual && *opt_begin_ >= last_opt_end_) {
          CloseIfPending();
          opened_by_optimizer_ = true;
        }
        opt_nested_begin_ = ts;
      }
      CloseIfPending();
      if (!open_) OpenAuto(opened_by_optimizer_ ? *opt_begin_ : ts);
      opened_by_optimizer_ = false;
      (e.kind == EventKind::kForwardBegin ? fwd_begin_ : bwd_begin_) = ts;
      break;
    }
    case EventKind::kForwardEnd:
    case EventKind::kBackwardEnd: {
      const bool fwd = e.kind == EventKind::kForwardEnd;
      auto& begin = fwd ? fwd_begin_ : bwd_begin_;
      if (!begin || !open_) {
        ++unmatched_events_;
        begin.reset();
        break;
      }
      const uint32_t id = fwd ? PhaseNames::kForward : PhaseNames::kBackward;
      if (!UserPhaseOpen(id)) AddPhase(id, ts - *begin);
      (fwd ? open_->forward_calls : open_->backward_calls) += 1;
      begin.reset();
      if (opt_nested_begin_ && !fwd_begin_ && !bwd_begin_) {  // back in the optimizer's own work
        opt_nested_ns_ += std::max<int64_t>(0, ts - *opt_nested_begin_);
        opt_nested_begin_.reset();
      }
      break;
    }
    case EventKind::kOptimizerBegin:
      // A second optimizer after the first one's end is part of the same iteration: no close
      // (unless a forward / backward follows inside it: a closure-style step, see above).
      if (!open_) OpenAuto(ts);
      opt_begin_ = ts;
      opt_nested_ns_ = 0;
      opt_nested_begin_.reset();
      break;
    case EventKind::kOptimizerEnd: {
      if (!opt_begin_ || !open_) {
        ++unmatched_events_;
        opt_begin_.reset();
        break;
      }
      if (opt_nested_begin_) {  // a forward / backward still open: its time is not ours
        opt_nested_ns_ += std::max<int64_t>(0, ts - *opt_nested_begin_);
        opt_nested_begin_.reset();
      }
      const int64_t own = std::max<int64_t>(0, ts - *opt_begin_ - opt_nested_ns_);
      opt_nested_ns_ = 0;
      if (!UserPhaseOpen(PhaseNames::kOptimizer)) AddPhase(PhaseNames::kOptimizer, own);
      open_->optimizer_calls += 1;
      opt_begin_.reset();
      if (!open_->manual) {
        pending_close_ = true;
        last_opt_end_ = ts;
      }
      break;
    }
    case EventKind::kStepBegin:
      CloseIfPending();
      if (open_ && open_->manual) Close(ts);  // step(i) entered twice without exit
      DiscardAutoAccumulation();
      OpenManual(e.value, ts);
      break;
    case EventKind::kStepEnd:
      if (open_ && open_->manual) {
        Close(ts);
      } else {
        ++unmatched_events_;
      }
      break;
    case EventKind::kPhaseBegin:
      phase_stack_.emplace_back(e.arg, ts);
      break;
    case EventKind::kPhaseEnd: {
      auto it = std::find_if(phase_stack_.rbegin(), phase_stack_.rend(),
                             [&](const auto& p) { return p.first == e.arg; });
      if (it == phase_stack_.rend()) {
        ++unmatched_events_;
        break;
      }
      const int64_t begin = it->second;
      phase_stack_.erase(std::next(it).base());
      if (UserPhaseOpen(e.arg) || AutoPhaseOpen(e.arg)) break;  // the outer one counts it
      if (open_ && e.arg <= PhaseNames::kOptimizer) open_->named_phase_calls[e.arg] += 1;
      AddPhase(e.arg, ts - begin);
      break;
    }
    case EventKind::kWaitBegin:
      CloseIfPending();
      wait_begin_ = ts;
      wait_wrapped_ = e.value == 0;
      wait_starts_loader_ = e.value == 2;
      break;
    case EventKind::kWaitEnd: {
      if (!wait_begin_) {
        ++unmatched_events_;
        break;
      }
      const int64_t d = std::max<int64_t>(0, ts - *wait_begin_);
      if (open_) {
        open_->explicit_wait_ns += d;
        open_->has_explicit_wait = true;
        open_->wait_wrapped = open_->wait_wrapped || wait_wrapped_;
        if (wait_starts_loader_) {
          ++open_->loader_starts;
          open_->loader_start_ns += d;
        }
      } else {
        if (!carry_wait_start_) carry_wait_start_ = *wait_begin_;
        carry_wait_ns_ += d;
        carry_wait_wrapped_ = carry_wait_wrapped_ || wait_wrapped_;
        if (wait_starts_loader_) {
          ++carry_loader_starts_;
          carry_loader_start_ns_ += d;
        }
      }
      wait_begin_.reset();
      break;
    }
    case EventKind::kGpuPhase:
      OnGpuPhase(e);
      break;
    case EventKind::kExcludeBegin:
    case EventKind::kExcludeEnd:
      break;  // handled above
  }
}

void StepAssembler::Finish(int64_t now_mono_ns) {
  CloseIfPending();
  if (open_ && open_->manual) Close(now_mono_ns);
  DiscardAutoAccumulation();
  unmatched_comm_ += static_cast<int64_t>(comm_waiting_.size());
  comm_waiting_.clear();
}

}  // namespace gpuprof::record
