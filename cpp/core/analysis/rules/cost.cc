// Cost rule: what the run cost at a reference (or user-given) hourly rate.
#include "analysis/flops.h"
#include "analysis/format.h"
#include "analysis/pricing.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {

std::optional<CostRate> ResolveCostRate(const RunView& view, const RuleContext& context,
                                        std::string* why) {
  const store::RunInfo& run = view.run();
  if (context.gpu_rate_error) {
    *why = "cost unknown: " + *context.gpu_rate_error;
    return std::nullopt;
  }
  // Simulated GPUs are never priced, also when the training itself ran on the CPU (the run
  // is then a CPU run that a rate would price per machine).
  if (run.gpu_backend && *run.gpu_backend == "mock") {
    *why = "cost unknown: the GPUs are simulated (gpu=\"mock\")";
    return std::nullopt;
  }
  if (context.gpu_rate_usd_per_hour) {
    return CostRate{*context.gpu_rate_usd_per_hour,
                    context.gpu_rate_source.empty() ? "override" : context.gpu_rate_source};
  }
  if (view.IsCpuRun()) {
    *why =
        "cost unknown: CPU run and no rate given (set GPUPROF_GPU_RATE=<USD per machine-hour> "
        "for the run, or pass --gpu-rate USD to gpuprof insights)";
    return std::nullopt;
  }
  if (!run.gpu_model) {
    *why =
        "cost unknown: GPU model unknown and no rate given (set GPUPROF_GPU_RATE=<USD per "
        "GPU-hour> for the run, or pass --gpu-rate USD to gpuprof insights)";
    return std::nullopt;
  }
  if (const GpuRateEntry* entry = FindGpuRate(*run.gpu_model)) {
    return CostRate{entry->usd_per_gpu_hour, "reference: " + std::string(entry->source)};
  }
  *why = "cost unknown: no reference rate for '" + *run.gpu_model +
         "' (set GPUPROF_GPU_RATE=<USD per GPU-hour> for the run, or pass --gpu-rate USD to "
         "gpuprof insights)";
  return std::nullopt;
}

// Always fires (LOW) when evaluable: cost = run duration × GPUs × USD per GPU-hour. The rate
// is ResolveCostRate's: the RuleContext override when given (--gpu-rate, the rate stored with
// the run, $GPUPROF_GPU_RATE), else the reference table for the GPU model. A CPU run is priced
// only with an override, as one machine. When MFU is known, the share of the cost not turned
// into model FLOPs is reported as idle capacity: cost × (1 − MFU).
RuleResult Cost(const RunView& view, const RuleContext& context) {
  const store::RunInfo& run = view.run();
  if (!view.duration_ns || *view.duration_ns <= 0) {
    return RuleResult::Skip("cost unknown: run duration not recorded");
  }
  const bool cpu = view.IsCpuRun();
  std::string why;
  const std::optional<CostRate> resolved = ResolveCostRate(view, context, &why);
  if (!resolved) return RuleResult::Skip(why);
  const double rate = resolved->usd_per_hour;
  const std::string& rate_source = resolved->source;
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
      {"usd", usd},
      {"duration_ns", ns},
      {"units", units},
      {"unit", unit_name},
      {"usd_per_unit_hour", rate},
      {"rate_source", rate_source},
      {"duration_from_steps", view.duration_from_steps},
  };
  const MfuResult mfu = ComputeMfu(view);
  if (mfu.mfu) {
    const double idle = usd * (1.0 - mfu.mfu->value);
    const std::string idle_text = FormatUsd(idle);  // "<$0.01" is approximate already
    message +=
        StrFormat("; %s%s of that is idle capacity (MFU %s)", idle_text.starts_with('<') ? "" : "~",
                  idle_text.c_str(), FormatPercent(mfu.mfu->value, 1).c_str());
    evidence["idle_usd"] = idle;
    evidence["mfu"] = mfu.mfu->value;
  }
  RuleResult r = RuleResult::Fire(Severity::kLow, std::move(message), std::move(evidence));
  if (!rate_source.starts_with("reference")) {
    r.insight->fix = StrFormat(
        "Recover idle capacity first (see the other insights). Priced at "
        "your rate, $%.2f per %s-hour (%s); `gpuprof insights --gpu-rate "
        "USD` re-prices the run.",
        rate, unit_name.c_str(), rate_source.c_str());
  }
  return r;
}

}  // namespace gpuprof::analysis::rules
