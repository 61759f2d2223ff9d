// TracePlan: which steps and time windows of a run get their kernels (or, on a CPU run, their
// CPU operators) traced. Built from profile(trace_every_n_steps=, trace_range=,
// continuous_traces_hz=); pure and cheap to query from any thread (immutable after
// construction).
//
// Modes (any combination):
//   every_n_steps N   steps 0, N, 2N, ... plus the warm-up steps 0, 1 and 5 (the first steps
//                     show compilation, autotuning and allocator growth that later steps do not);
//   range [a, b)      steps a .. b-1, as Python's range(a, b);
//   continuous_hz f   every kernel of the run, aggregated per window of 1/f seconds (by launch
//                     time), for the whole run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace gpuprof::traces {

inline constexpr int64_t kWarmupSteps[] = {0, 1, 5};
inline constexpr double kMaxContinuousHz = 100.0;
inline constexpr int64_t kMaxStep = int64_t{1} << 62;

struct TraceOptions {
  int64_t every_n_steps = 0;           // 0: off
  std::optional<int64_t> range_begin;  // with range_end: steps [begin, end)
  std::optional<int64_t> range_end;
  double continuous_hz = 0;  // 0: off
};

class TracePlan {
 public:
  // Errors name the option: "trace_every_n_steps must be >= 1, got 0".
  static Expected<TracePlan> Make(const TraceOptions& options);
  TracePlan() = default;  // traces nothing

  bool enabled() const { return step_mode() || continuous(); }
  bool step_mode() const { return options_.every_n_steps > 0 || options_.range_begin.has_value(); }
  bool continuous() const { return options_.continuous_hz > 0; }
  const TraceOptions& options() const { return options_; }

  // Whether step `step` (>= 0) is a traced step.
  bool StepTraced(int64_t step) const;
  // Continuous mode: the window length and the window holding run-relative time t (>= 0).
  int64_t window_ns() const { return window_ns_; }
  int64_t WindowOf(int64_t rel_ns) const { return rel_ns < 0 ? 0 : rel_ns / window_ns_; }
  // "steps 0, 1, 5 and every 100th step; steps 10..19; 1 s windows" ("nothing" when off).
  std::string Describe() const;

 private:
  TraceOptions options_;
  int64_t window_ns_ = 1'000'000'000;
};

}  // namespace gpuprof::traces
