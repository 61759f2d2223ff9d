// Data-pipeline rules: is the GPU (or CPU) starving for input?
#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {
namespace {

std::string WaitSourceLabel(const std::optional<std::string>& source) {
  if (!source) return "source unknown";
  if (*source == "gap") return "inter-step gap";
  if (*source == "explicit") return "wrap_dataloader";
  return *source;
}

}  // namespace

// Fires when the steady-state dataloader wait exceeds kStallFraction of step time.
// Wait is measured per step (gap: previous step end -> first model call; explicit: time
// inside wrap_dataloader's next()). Steps without a measured wait (step 0's gap) are left
// out of both numerator and denominator.
RuleResult DataloaderStall(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const Breakdown& b = view.breakdown;
  if (!b.wait_fraction) {
    return RuleResult::Skip(
        "dataloader wait not measured on any steady-state step (no inter-step gap or "
        "wrap_dataloader timing)");
  }
  const double f = *b.wait_fraction;
  if (f <= kStallFraction) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"wait_fraction", f},
      {"wait_total_ns", b.wait_total_ns},
      {"step_total_ns", b.wait_duration_ns},
      {"steps", b.wait_steps},
      {"mean_wait_ns", b.wait_total_ns / static_cast<double>(b.wait_steps)},
      {"wait_source", b.wait_source ? nlohmann::json(*b.wait_source) : nlohmann::json()},
      {"threshold", kStallFraction},
  };
  const Severity severity = f >= kStallHighFraction ? Severity::kHigh : Severity::kMed;
  return RuleResult::Fire(severity,
                          StrFormat("%s of step time waiting on the loader (%s)",
                                    FormatPercent(f).c_str(),
                                    WaitSourceLabel(b.wait_source).c_str()),
                          std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
