// Cost rule: what the run cost at a reference (or user-given) hourly rate.
#include "analysis/flops.h"
#include "analysis/format.h"
#include "analysis/pricing.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {

// Always fires (LOW) when evaluable: cost = run duration × GPUs × USD per GPU-hour. The rate
// is the RuleContext override when given, else the reference table for the GPU model. A CPU
// run is priced only with an override, as one machine. When MFU is known, the share of the
// cost not turned into model FLOPs is reported as idle capacity: cost × (1 − MFU).
RuleResult Cost(const RunView& view, const RuleContext& context) {
  const store::RunInfo& run = view.run();
  if (context.gpu_rate_error) return RuleResult::Skip("cost unknown: " + *context.gpu_rate_error);
  if (!view.duration_ns || *view.duration_ns <= 0) {
    return RuleResult::Skip("cost unknown: run duration not recorded");
  }
  const bool cpu = view.IsCpuRun();
  // Simulated GPUs are never priced, also when the training itself ran on the CPU (the run
  // is then a CPU run that a rate would price per machine).
  if (run.gpu_backend && *run.gpu_backend == "mock") {
    return RuleResult::Skip("cost unknown: the GPUs are simulated (gpu=\"mock\")");
  }
  double rate = 0;
  std::string rate_source;
  if (context.gpu_rate_usd_per_hour) {
    rate = *context.gpu_rate_usd_per_hour;
    rate_source = context.gpu_rate_source.empty() ? "override" : context.gpu_rate_source;
  } else if (cpu) {
    return RuleResult::Skip(
        "cost unknown: CPU run and no rate given (set GPUPROF_GPU_RATE=<USD per hour>)");
  } else if (!run.gpu_model) {
    return RuleResult::Skip(
        "cost unknown: GPU model unknown and no rate given (set GPUPROF_GPU_RATE=<USD per "
        "GPU-hour>)");
  } else if (const GpuRateEntry* entry = FindGpuRate(*run.gpu_model)) {
    rate = entry->usd_per_gpu_hour;
    rate_source = "reference: " + std::string(entry->source);
  } else {
    return RuleResult::Skip("cost unknown: no reference rate for '" + *run.gpu_model +
                            "' (set GPUPROF_GPU_RATE=<USD per GPU-hour>)");
  }
  int64_t units = 1;
  std::string unit_name = "machine";
  if (!cpu) {
    if (!run.gpu_count || *run.gpu_count <= 0) {
      return RuleResult::Skip("cost unknown: GPU count not recorded");
    }
    units = *run.gpu_count;
    unit_name = "GPU";
  }
  const double ns = static_cast<double>(*view.duration_ns);
  const double usd = ns / 3600e9 * static_cast<double>(units) * rate;
  std::string basis;
  if (cpu) {
    basis = StrFormat("%s · 1 machine @ $%.2f/h", FormatMinutes(ns).c_str(), rate);
  } else if (units == 1) {
    basis = StrFormat("%s · $%.2f/h", FormatMinutes(ns).c_str(), rate);
  } else {
    basis = StrFormat("%s · %lld× GPU @ $%.2f/h", FormatMinutes(ns).c_str(),
                      static_cast<long long>(units), rate);
  }
  std::string message = StrFormat("Estimated cost: %s (%s)", FormatUsd(usd).c_str(), basis.c_str());
  nlohmann::json evidence = {
      {"usd", usd},          {"duration_ns", ns},           {"units", units},
      {"unit", unit_name},   {"usd_per_unit_hour", rate},   {"rate_source", rate_source},
      {"duration_from_steps", view.duration_from_steps},
  };
  const MfuResult mfu = ComputeMfu(view);
  if (mfu.mfu) {
    const double idle = usd * (1.0 - mfu.mfu->value);
    const std::string idle_text = FormatUsd(idle);  // "<$0.01" is approximate already
    message += StrFormat("; %s%s of that is idle capacity (MFU %s)",
                         idle_text.starts_with('<') ? "" : "~", idle_text.c_str(),
                         FormatPercent(mfu.mfu->value, 1).c_str());
    evidence["idle_usd"] = idle;
    evidence["mfu"] = mfu.mfu->value;
  }
  return RuleResult::Fire(Severity::kLow, std::move(message), std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
