// Compute rules: is the device doing useful math for the time the step takes?
#include "analysis/flops.h"
#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {

// Fires when the steady-state time that is neither dataloader wait nor inside any phase
// exceeds kOverheadFraction of step time. That remainder is host work between the phases:
// kernel launches outside modules, zero_grad, Python bookkeeping, logging, syncs.
RuleResult KernelLaunchOverhead(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const Breakdown& b = view.breakdown;
  if (b.phases.empty()) {
    return RuleResult::Skip("no phase timings recorded (forward/backward/optimizer)");
  }
  if (!b.other_fraction) {
    return RuleResult::Skip(
        "dataloader wait not measured, so time outside the phases cannot be told apart from "
        "loader wait");
  }
  const double f = *b.other_fraction;
  if (f <= kOverheadFraction) return RuleResult::Pass();
  std::string names;
  for (size_t i = 0; i < b.phases.size(); ++i) {
    if (i == 4) {
      names += "/…";
      break;
    }
    names += (i ? "/" : "") + b.phases[i].name;
  }
  const double per_step = b.other_total_ns / static_cast<double>(b.other_steps);
  nlohmann::json evidence = {
      {"other_fraction", f},
      {"other_total_ns", b.other_total_ns},
      {"step_total_ns", b.other_duration_ns},
      {"steps", b.other_steps},
      {"mean_other_ns", per_step},
      {"threshold", kOverheadFraction},
  };
  const Severity severity = f >= kOverheadMedFraction ? Severity::kMed : Severity::kLow;
  return RuleResult::Fire(
      severity,
      StrFormat("%s of step time (%s per step) is outside the loader wait and %s: launch and "
                "Python overhead",
                FormatPercent(f).c_str(), FormatDuration(per_step).c_str(), names.c_str()),
      std::move(evidence));
}

// Fires when MFU (flops.h) is below kLowMfu of the declared dtype's dense peak.
RuleResult LowMfu(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  const MfuResult r = ComputeMfu(view);
  if (!r.mfu) return RuleResult::Skip(r.reason);
  const Mfu& m = *r.mfu;
  if (m.value > 1.0) {
    return RuleResult::Skip(StrFormat(
        "MFU unknown: computes to %s of one %s's peak, so flops_per_step likely counts more "
        "than this process's GPU work",
        FormatPercent(m.value, 1).c_str(), m.gpu_label.c_str()));
  }
  if (m.value >= kLowMfu) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"mfu", m.value},
      {"achieved_tflops", m.achieved_tflops},
      {"peak_tflops", m.peak_tflops},
      {"dtype", DtypeName(m.dtype)},
      {"gpu", m.gpu_label},
      {"flops_per_step", m.flops_per_step},
      {"step_ns", m.step_ns},
      {"threshold", kLowMfu},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("MFU %s of %s TFLOPs %s peak", FormatPercent(m.value, 1).c_str(),
                FormatCompact(m.peak_tflops).c_str(), std::string(DtypeName(m.dtype)).c_str()),
      std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
