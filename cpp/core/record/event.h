// Events the training thread hands to the recorder. Fixed size, trivially copyable: a push is
// a clock read plus a 24-byte store into the ring.
#pragma once

#include <cstdint>

namespace gpuprof::record {

enum class EventKind : uint16_t {
  // Auto-instrumentation (outermost calls only; depth is tracked by the hook).
  kForwardBegin = 1,
  kForwardEnd,
  kBackwardBegin,
  kBackwardEnd,
  kOptimizerBegin,
  kOptimizerEnd,
  // Manual API. kStepBegin/End: value = the user's step index.
  kStepBegin,
  kStepEnd,
  // Named phases (manual s.phase(name)): arg = phase name id (PhaseNames).
  kPhaseBegin,
  kPhaseEnd,
  // Explicit dataloader wait around next() in wrap_dataloader.
  kWaitBegin,
  kWaitEnd,
  // A resolved GPU interval: ts_ns = CPU timestamp of the interval's begin event (maps it to
  // its step), arg = phase name id, value = GPU ns measured by CUDA events.
  kGpuPhase,
  // A stretch kept out of the training steps (prof.evaluation(), a trainer's validation loop):
  // the activity between them is counted, not made into or added to a step. arg: 0.
  kExcludeBegin,
  kExcludeEnd,
};

struct Event {
  int64_t ts_ns;  // monotonic (clock::NowNs)
  int64_t value;
  uint32_t arg;
  EventKind kind;
  uint16_t reserved;
};
static_assert(sizeof(Event) == 24);

}  // namespace gpuprof::record
