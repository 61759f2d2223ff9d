#include "traces/trace_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace gpuprof::traces {

Expected<TracePlan> TracePlan::Make(const TraceOptions& o) {
  if (o.every_n_steps < 0) {
    return Status::Error("trace_every_n_steps must be >= 1, got " +
                         std::to_string(o.every_n_steps));
  }
  if (o.range_begin.has_value() != o.range_end.has_value()) {
    return Status::Error("trace_range needs both ends: (first step, step after the last)");
  }
  if (o.range_begin) {
    if (*o.range_begin < 0 || *o.range_begin > kMaxStep || *o.range_end > kMaxStep) {
      return Status::Error("trace_range steps must be in 0..2**62, got (" +
                           std::to_string(*o.range_begin) + ", " + std::to_string(*o.range_end) +
                           ")");
    }
    if (*o.range_end <= *o.range_begin) {
      return Status::Error("trace_range=(a, b) traces steps a..b-1 and needs b > a, got (" +
                           std::to_string(*o.range_begin) + ", " + std::to_string(*o.range_end) +
                           ")");
    }
  }
  if (!std::isfinite(o.continuous_hz) || o.continuous_hz < 0 ||
      o.continuous_hz > kMaxContinuousHz) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", o.continuous_hz);
    return Status::Error("continuous_traces_hz must be in (0, 100] (windows per second), got " +
                         std::string(buf));
  }
  TracePlan plan;
  plan.options_ = o;
  if (o.continuous_hz > 0) {
    plan.window_ns_ = std::max<int64_t>(1, std::llround(1e9 / o.continuous_hz));
  }
  return plan;
}

bool TracePlan::StepTraced(int64_t step) const {
  if (step < 0) return false;
  if (options_.range_begin && step >= *options_.range_begin && step < *options_.range_end) {
    return true;
  }
  const int64_t n = options_.every_n_steps;
  if (n <= 0) return false;
  if (step % n == 0) return true;
  for (int64_t w : kWarmupSteps) {
    if (step == w) return true;
  }
  return false;
}

std::string TracePlan::Describe() const {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : "; ") + part; };
  if (options_.every_n_steps > 0) {
    add(options_.every_n_steps == 1
            ? std::string("every step")
            : "steps 0, 1, 5 and every " + std::to_string(options_.every_n_steps) + "th step");
  }
  if (options_.range_begin) {
    add("steps " + std::to_string(*options_.range_begin) + ".." +
        std::to_string(*options_.range_end - 1));
  }
  if (continuous()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g s windows", static_cast<double>(window_ns_) / 1e9);
    add(buf);
  }
  return out.empty() ? "nothing" : out;
}

}  // namespace gpuprof::traces
