// Compute rules: is the device doing useful math for the time the step takes?
#include <algorithm>
#include <cctype>
#include <map>
#include <set>

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
    return RuleResult::Skip(
        "no phase timings recorded (auto mode times forward/backward/optimizer; with "
        "auto=False, open s.phase(\"forward\") etc. inside prof.step())");
  }
  if (!b.other_fraction) {
    return RuleResult::Skip(
        "dataloader wait not measured, so time outside the phases cannot be told apart from "
        "loader wait (iterate a torch DataLoader in auto mode, or wrap the loader: "
        "prof.wrap_dataloader(loader))");
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
  // Is it spread over the steps (launches, Python) or concentrated in a few (a checkpoint save
  // or an evaluation every N steps)? Spikes: steps whose outside time exceeds the median
  // outside time by more than a median step.
  const std::vector<StepOther> others = SteadyOtherTimes(view);
  std::vector<double> values, durations;
  for (const StepOther& o : others) {
    values.push_back(o.other_ns);
    durations.push_back(static_cast<double>(o.step->duration_ns));
  }
  const double median_other = Median(values).value_or(0.0);
  const double median_step = Median(durations).value_or(0.0);
  std::vector<int64_t> spike_steps;
  double spike_ns = 0;  // the spikes' outside time above the median
  for (const StepOther& o : others) {
    if (o.other_ns - median_other > median_step) {
      spike_steps.push_back(o.step->step);
      spike_ns += o.other_ns - median_other;
    }
  }
  const bool periodic = !spike_steps.empty() && b.other_total_ns > 0 &&
                        spike_ns >= kOverheadSpikeShare * b.other_total_ns;
  const double spike_fraction = b.other_duration_ns > 0 ? spike_ns / b.other_duration_ns : 0.0;
  // The rest as a share of the step time without the spikes' extra: what a typical step loses.
  const double rest_fraction =
      b.other_duration_ns - spike_ns > 0
          ? (b.other_total_ns - spike_ns) / (b.other_duration_ns - spike_ns)
          : 0.0;
  nlohmann::json evidence = {
      {"other_fraction", f},
      {"other_total_ns", b.other_total_ns},
      {"step_total_ns", b.other_duration_ns},
      {"steps", b.other_steps},
      {"mean_other_ns", per_step},
      {"median_other_ns", median_other},
      {"spike_steps", spike_steps.size()},
      {"first_spike_step", spike_steps.empty() ? nlohmann::json() : nlohmann::json(spike_steps[0])},
      {"spike_period", PeriodJson(spike_steps)},
      {"spike_other_ns", spike_ns},
      {"spike_fraction", spike_fraction},
      {"periodic_other", periodic},
      {"threshold", kOverheadFraction},
      {"threshold_spike_share", kOverheadSpikeShare},
  };
  std::string message =
      StrFormat("%s of step time (%s per step) is outside the loader wait and %s",
                FormatPercent(f).c_str(), FormatDuration(per_step).c_str(), names.c_str());
  if (!periodic) {
    return RuleResult::Fire(f >= kOverheadMedFraction ? Severity::kMed : Severity::kLow,
                            message + ": launch and Python overhead", std::move(evidence));
  }
  message += StrFormat(
      "; %s of it in %s, %s each above the median step's %s: periodic host work "
      "(checkpoint saves, logging, evaluation), not launch overhead",
      FormatPercent(spike_ns / b.other_total_ns).c_str(), FormatStepSet(spike_steps).c_str(),
      FormatDuration(spike_ns / static_cast<double>(spike_steps.size())).c_str(),
      FormatDuration(median_other).c_str());
  std::string fix = kPeriodicHostWorkFix;
  if (rest_fraction > kOverheadFraction) {
    message += StrFormat("; the rest, %s of the other step time, is launch and Python overhead",
                         FormatPercent(rest_fraction).c_str());
    fix += " For the rest: " + FindRule("kernel_launch_overhead")->fix;
  }
  const bool med = spike_fraction >= kVarianceMedShare || rest_fraction >= kOverheadMedFraction;
  RuleResult r = RuleResult::Fire(med ? Severity::kMed : Severity::kLow, std::move(message),
                                  std::move(evidence));
  r.insight->fix = std::move(fix);
  return r;
}

// Fires when MFU (flops.h) is below kLowMfu of the declared dtype's dense peak.
RuleResult LowMfu(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  const MfuResult r = ComputeMfu(view);
  if (!r.mfu) return RuleResult::Skip(r.reason);
  const Mfu& m = *r.mfu;  // at most 100%: ComputeMfu reports more as unknown
  if (m.value >= kLowMfu) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"mfu", m.value},
      {"achieved_tflops", m.achieved_tflops},
      {"peak_tflops", m.peak_tflops},
      {"dtype", DtypeName(m.dtype)},
      {"gpu", m.gpu_label},
      {"flops_per_step", m.flops_per_step},
      {"flops_method", m.flops_method ? nlohmann::json(*m.flops_method) : nlohmann::json()},
      {"step_ns", m.step_ns},
      {"threshold", kLowMfu},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("MFU %s of %s TFLOPs %s peak", FormatPercent(m.value, 1).c_str(),
                FormatCompact(m.peak_tflops).c_str(), std::string(DtypeName(m.dtype)).c_str()),
      std::move(evidence));
}

using namespace thresholds;

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// Fused attention kernels / ops: FlashAttention (flash_fwd_kernel, _flash_attention_forward),
// PyTorch's memory-efficient kernel (_efficient_attention_forward, fmha_cutlassF_*), cuDNN
// attention. PyTorch's "math" SDPA fallback runs bmm + softmax and has none of these names.
bool IsFusedAttention(const std::string& lower) {
  for (std::string_view p : {"flash", "efficient_attention", "fmha", "cudnn_attention"}) {
    if (Contains(lower, p)) return true;
  }
  return false;
}

std::string KernelsMissing(const RunView& view) {
  if (const auto* t = view.Telemetry("kernels"); t && !t->available && t->reason) {
    return "needs traced kernels: " + *t->reason;
  }
  if (view.IsCpuRun()) {
    return "needs traced steps: profile(trace_every_n_steps=N) records the CPU operators of a "
           "CPU run";
  }
  return "needs per-kernel GPU times: trace steps with profile(trace_every_n_steps=N), "
         "trace_range=(a, b) or continuous_traces_hz=1.0, or import an Nsight Systems capture "
         "(gpuprof nsys-import)";
}

}  // namespace

// Fires when the GPU is busy (mean NVML utilization over the steady state above
// kSmallBatchUtilPct) while MFU is below kSmallBatchMfu: kernels keep the device occupied but
// do little math each, the signature of small batches and unfused elementwise work.
RuleResult SmallBatch(const RunView& view, const RuleContext&) {
  const MfuResult r = ComputeMfu(view);
  if (!r.mfu) return RuleResult::Skip(r.reason);
  const GpuWindow w = SteadyGpuSeconds(view);
  const auto util = WeightedMeanOf(w.seconds, &store::GpuRollupRow::util_mean_pct,
                                   &store::GpuRollupRow::util_samples);
  if (!util) return RuleResult::Skip(GpuMissing(view, "GPU utilization"));
  if (*util <= kSmallBatchUtilPct || r.mfu->value >= kSmallBatchMfu) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"mean_util_pct", *util},
      {"mfu", r.mfu->value},
      {"threshold_util_pct", kSmallBatchUtilPct},
      {"threshold_mfu", kSmallBatchMfu},
      {"window", w.steady ? "steady" : "run"},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("The GPU is busy %s of the time yet MFU is only %s: it runs many small or "
                "memory-bound kernels instead of large matmuls",
                FormatPercent(*util / 100).c_str(), FormatPercent(r.mfu->value, 1).c_str()),
      std::move(evidence));
}

// Compares the backward / forward time ratio with the declared gradient checkpointing
// (runs.config_json key "grad_checkpoint", a boolean written by the Python layer from
// profile(arch=TransformerArch(grad_checkpoint=...)); absent without an arch). Backward
// runs at about 2× forward; with activation checkpointing it recomputes the forward, about 3×.
// Fires (MED) when the ratio is at least kCkptMinRatio but checkpointing is declared off, and
// (LOW) when it is at most kNoCkptMaxRatio but declared on. GPU times (CUDA events) are used
// when measured; wall times only on a CPU run, where they are the compute time.
RuleResult GradientCheckpointing(const RunView& view, const RuleContext&) {
  const char* kNotDeclared =
      "gradient checkpointing not declared: pass "
      "arch=gpuprof.TransformerArch(..., grad_checkpoint=True or False) to profile()";
  if (!view.run().config_json) return RuleResult::Skip(kNotDeclared);
  const nlohmann::json config = nlohmann::json::parse(*view.run().config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return RuleResult::Skip("runs.config_json is not a JSON object");
  }
  auto it = config.find("grad_checkpoint");
  if (it == config.end() || !it->is_boolean()) return RuleResult::Skip(kNotDeclared);
  const bool declared = it->get<bool>();
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const PhaseSummary* fwd = nullptr;
  const PhaseSummary* bwd = nullptr;
  for (const PhaseSummary& p : view.breakdown.phases) {
    if (p.name == "forward") fwd = &p;
    if (p.name == "backward") bwd = &p;
  }
  if (!fwd || !bwd) {
    return RuleResult::Skip(
        "forward and backward phase times not recorded (auto mode times them; with auto=False, "
        "open s.phase(\"forward\") and s.phase(\"backward\") inside prof.step())");
  }
  bool gpu = false;
  std::string basis;
  if (fwd->gpu_mean_ns && bwd->gpu_mean_ns) {
    gpu = true;
    basis = "GPU time";
  } else if (view.IsCpuRun()) {
    basis = "CPU time";
  } else {
    return RuleResult::Skip(
        "GPU time of forward/backward not measured (CUDA events off: profile(cuda_events=True) "
        "measures it); CPU-side times of GPU work are launch times");
  }
  // Medians over the steady steps that have both phases: one slow backward (a stall, a GC
  // pause) must not read as a recompute.
  std::vector<double> fs, bs, ratios;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    std::optional<double> sf, sb;
    for (const PhaseTime& p : view.steps[i].phases) {
      std::optional<double> v;
      if (gpu) {
        if (p.gpu_ns) v = static_cast<double>(*p.gpu_ns);
      } else {
        v = static_cast<double>(p.wall_ns);
      }
      if (p.name == "forward") sf = v;
      if (p.name == "backward") sb = v;
    }
    if (sf && sb && *sf > 0) {
      fs.push_back(*sf);
      bs.push_back(*sb);
      ratios.push_back(*sb / *sf);
    }
  }
  if (ratios.empty()) return RuleResult::Skip("forward time is 0");
  const double f = ComputeDurationStats(fs)->p50_ns;
  const double b = ComputeDurationStats(bs)->p50_ns;
  const double ratio = ComputeDurationStats(ratios)->p50_ns;
  nlohmann::json evidence = {
      {"ratio", ratio},
      {"forward_ns", f},
      {"backward_ns", b},
      {"basis", basis},
      {"declared", declared},
      {"no_ckpt_max_ratio", kNoCkptMaxRatio},
      {"ckpt_min_ratio", kCkptMinRatio},
  };
  const std::string times = StrFormat("%s %s vs %s, medians per step", basis.c_str(),
                                      FormatDuration(b).c_str(), FormatDuration(f).c_str());
  if (!declared && ratio >= kCkptMinRatio) {
    RuleResult r = RuleResult::Fire(
        Severity::kMed,
        StrFormat("Backward takes %s forward (%s), which implies activation checkpointing, but "
                  "the run declares grad_checkpoint=False",
                  FormatRatio(ratio).c_str(), times.c_str()),
        std::move(evidence));
    r.insight->fix =
        "If checkpointing is meant, declare it (grad_checkpoint=True in the arch) so the run "
        "records it (MFU counts model FLOPs, without the recompute, so checkpointing lowers "
        "it); if not, look for torch.utils.checkpoint or gradient_checkpointing_enable() in "
        "the model and remove it: the recomputed forward is a quarter of the step's compute.";
    return r;
  }
  if (declared && ratio <= kNoCkptMaxRatio) {
    RuleResult r = RuleResult::Fire(
        Severity::kLow,
        StrFormat("Backward takes only %s forward (%s), as without checkpointing, but the run "
                  "declares grad_checkpoint=True: checkpointing does not seem to be active",
                  FormatRatio(ratio).c_str(), times.c_str()),
        std::move(evidence));
    r.insight->fix =
        "Check the wrapping: torch.utils.checkpoint must wrap the blocks that actually run "
        "(Hugging Face: call model.gradient_checkpointing_enable() before training, with "
        "use_cache=False); or declare grad_checkpoint=False to match what runs.";
    return r;
  }
  return RuleResult::Pass();
}

// Fires when kernels whose names contain "softmax" and "bmm" together take more than
// kSdpaHotFraction of the GPU kernel time recorded in the kernels table and no fused attention
// kernel (flash / memory-efficient / cuDNN attention) ran at all: attention is computed as
// matmul-softmax-matmul.
RuleResult SdpaSuboptimal(const RunView& view, const RuleContext&) {
  const TracedTimes traced = CollectTracedTimes(view.data);
  if (traced.rows.empty()) return RuleResult::Skip(KernelsMissing(view));
  double total = 0, softmax = 0, bmm = 0;
  bool math_fallback = false;  // torch's SDPA ran, but took its unfused math path
  for (const auto& k : traced.rows) {
    const std::string name = Lower(*k.name);
    const double ns = static_cast<double>(k.ns);
    total += ns;
    if (IsFusedAttention(name)) return RuleResult::Pass();
    if (Contains(name, "scaled_dot_product_attention_math")) math_fallback = true;
    if (Contains(name, "softmax"))
      softmax += ns;
    else if (Contains(name, "bmm"))
      bmm += ns;
  }
  if (total <= 0) return RuleResult::Skip(std::string(traced.unit()) + " times are all 0");
  const double share = (softmax + bmm) / total;
  if (softmax <= 0 || bmm <= 0 || share <= kSdpaHotFraction) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"share", share},
      {"softmax_share", softmax / total},
      {"bmm_share", bmm / total},
      {traced.cpu ? "cpu_op_total_ns" : "kernel_total_ns", total},
      {"threshold", kSdpaHotFraction},
      {"basis", traced.cpu ? "cpu_ops" : "kernels"},
      {"sdpa_math_fallback", math_fallback},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("Softmax and bmm %ss take %s of %s (softmax %s, bmm %s) and no fused "
                "attention %s ran: attention is computed unfused%s",
                traced.unit(), FormatPercent(share).c_str(), traced.time(),
                FormatPercent(softmax / total).c_str(), FormatPercent(bmm / total).c_str(),
                traced.unit(),
                math_fallback ? " (scaled_dot_product_attention fell back to its math path)" : ""),
      std::move(evidence));
}

// Splits the kernel windows at the midpoint of the time they span. Fires when a kernel's mean
// time per window in the second half exceeds the first half's by more than kDriftGrowth, its
// time per call grew by as much (so a loop that merely runs more steps per window does not
// count), and the added time is at least kDriftMinShare of the mean kernel time per window.
// Reports the kernel that added the most time per window.
RuleResult KernelDrift(const RunView& view, const RuleContext&) {
  const TracedTimes traced = CollectTracedTimes(view.data);
  const auto& kernels = traced.rows;
  if (kernels.empty()) return RuleResult::Skip(KernelsMissing(view));
  int64_t lo = kernels.front().window_start_ns, hi = kernels.front().window_end_ns;
  std::set<std::pair<int64_t, int64_t>> windows;
  for (const auto& k : kernels) {
    lo = std::min(lo, k.window_start_ns);
    hi = std::max(hi, k.window_end_ns);
    windows.emplace(k.window_start_ns, k.window_end_ns);
  }
  const double mid = (static_cast<double>(lo) + static_cast<double>(hi)) / 2;
  auto second_half = [mid](int64_t start, int64_t end) {
    return (static_cast<double>(start) + static_cast<double>(end)) / 2 >= mid;
  };
  size_t n1 = 0, n2 = 0;
  for (const auto& [a, b] : windows) (second_half(a, b) ? n2 : n1) += 1;
  if (n1 < kDriftMinWindows || n2 < kDriftMinWindows) {
    return RuleResult::Skip(
        StrFormat("%s timings cover %zu window%s; drift needs at least %zu "
                  "in each half of the run",
                  traced.unit(), windows.size(), windows.size() == 1 ? "" : "s", kDriftMinWindows));
  }
  struct Acc {
    double ns[2] = {0, 0};
    double calls[2] = {0, 0};
  };
  std::map<std::string, Acc> by_name;
  double total = 0;
  for (const auto& k : kernels) {
    const int h = second_half(k.window_start_ns, k.window_end_ns) ? 1 : 0;
    Acc& a = by_name[*k.name];
    a.ns[h] += static_cast<double>(k.ns);
    a.calls[h] += static_cast<double>(k.calls);
    total += static_cast<double>(k.ns);
  }
  const double per_window_total = total / static_cast<double>(windows.size());
  const std::string* worst = nullptr;
  double worst_added = 0, worst_t1 = 0, worst_t2 = 0, worst_growth = 0;
  size_t drifting = 0;
  for (const auto& [name, a] : by_name) {
    const double t1 = a.ns[0] / static_cast<double>(n1);
    const double t2 = a.ns[1] / static_cast<double>(n2);
    if (t1 <= 0 || a.calls[0] <= 0 || a.calls[1] <= 0) continue;
    const double growth = t2 / t1 - 1;
    const double per_call_growth = (a.ns[1] / a.calls[1]) / (a.ns[0] / a.calls[0]) - 1;
    const double added = t2 - t1;
    if (growth <= kDriftGrowth || per_call_growth <= kDriftGrowth) continue;
    if (added < kDriftMinShare * per_window_total) continue;
    ++drifting;
    if (!worst || added > worst_added) {
      worst = &name;
      worst_added = added;
      worst_t1 = t1;
      worst_t2 = t2;
      worst_growth = growth;
    }
  }
  if (!worst) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"kernel", *worst},
      {"first_half_ns_per_window", worst_t1},
      {"second_half_ns_per_window", worst_t2},
      {"growth", worst_growth},
      {"windows_first_half", n1},
      {"windows_second_half", n2},
      {"drifting_kernels", drifting},
      {"threshold", kDriftGrowth},
      {"basis", traced.cpu ? "cpu_ops" : "kernels"},
  };
  std::string more;
  if (drifting > 1) {
    more =
        StrFormat("; %zu more %s%s drifted", drifting - 1, traced.unit(), drifting == 2 ? "" : "s");
  }
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("%s drift: %s added %s/window in the second half (%s → %s per window, +%s)%s",
                traced.cpu ? "CPU operator" : "Kernel", worst->c_str(),
                FormatDuration(worst_added).c_str(), FormatDuration(worst_t1).c_str(),
                FormatDuration(worst_t2).c_str(), FormatPercent(worst_growth).c_str(),
                more.c_str()),
      std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
