#include "analysis/rules/registry.h"

#include "analysis/format.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis {
namespace {

using namespace thresholds;

std::string Pct(double f) { return FormatPercent(f); }
std::string Times(double r) { return FormatCompact(r) + "×"; }

std::vector<RuleSpec> BuildRules() {
  std::vector<RuleSpec> r;
  r.push_back(RuleSpec{
      .id = "dataloader_stall",
      .family = "data_pipeline",
      .max_severity = Severity::kHigh,
      .severity = "high ≥ " + Pct(kStallHighFraction) + " of step time, else med",
      .fires_when = "dataloader wait (inter-step gap or wrap_dataloader) > " +
                    Pct(kStallFraction) + " of steady-state step time",
      .fix = "Feed the loop faster: raise DataLoader num_workers and prefetch_factor, set "
             "pin_memory=True and persistent_workers=True, and move heavy augmentations to "
             "the GPU.",
      .inputs = "steps.wait_ns on steady-state steps",
      .thresholds = {{"kStallFraction", kStallFraction, "fires above this share of step time"},
                     {"kStallHighFraction", kStallHighFraction, "high at or above this share"}},
      .evaluate = rules::DataloaderStall,
  });
  r.push_back(RuleSpec{
      .id = "kernel_launch_overhead",
      .family = "compute",
      .max_severity = Severity::kMed,
      .severity = "med ≥ " + Pct(kOverheadMedFraction) + " of step time, else low",
      .fires_when = "step time minus loader wait exceeds the sum of phase times by > " +
                    Pct(kOverheadFraction) + " of step time",
      .fix = "Cut per-step host work: torch.compile (mode=\"reduce-overhead\") or CUDA graphs "
             "to batch kernel launches; move logging, .item() syncs and metric updates out of "
             "the hot loop.",
      .inputs = "phases.wall_ns and steps.wait_ns on steady-state steps",
      .thresholds = {{"kOverheadFraction", kOverheadFraction,
                      "fires above this share of step time"},
                     {"kOverheadMedFraction", kOverheadMedFraction, "med at or above this share"}},
      .evaluate = rules::KernelLaunchOverhead,
  });
  r.push_back(RuleSpec{
      .id = "low_mfu",
      .family = "compute",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "MFU < " + Pct(kLowMfu) + " of the declared dtype's dense peak",
      .fix = "Give the GPU bigger, fused work: raise the batch size, use bf16 autocast, "
             "FlashAttention / F.scaled_dot_product_attention, and torch.compile.",
      .inputs = "runs.flops_per_step, runs.dtype, runs.gpu_model (with a listed peak) and step "
                "times",
      .thresholds = {{"kLowMfu", kLowMfu, "fires below this MFU"}},
      .evaluate = rules::LowMfu,
  });
  r.push_back(RuleSpec{
      .id = "compilation_warmup",
      .family = "warmup",
      .max_severity = Severity::kLow,
      .severity = "low",
      .fires_when = "first step > " + Times(kWarmupRatio) + " the steady-state median step time",
      .fix = "Leave the warmup steps out of throughput numbers (gpuprof's steady-state stats "
             "already skip them); with torch.compile, warm up before timing and avoid "
             "recompiles (e.g. mark dynamic shapes).",
      .inputs = "at least " + std::to_string(kWarmupMinSteps) + " steps",
      .thresholds = {{"kWarmupRatio", kWarmupRatio, "fires above this multiple"},
                     {"kWarmupMinSteps", static_cast<double>(kWarmupMinSteps),
                      "evaluated with at least this many steps"}},
      .evaluate = rules::CompilationWarmup,
  });
  r.push_back(RuleSpec{
      .id = "first_step_outlier",
      .family = "warmup",
      .max_severity = Severity::kLow,
      .severity = "low",
      .fires_when = "step 0 > " + Times(kFirstStepRatio) + " the median of the other steps",
      .fix = "Step 0 pays one-time costs (CUDA context, cuBLAS/cuDNN autotuning, torch.compile "
             "graph capture): filter it out of benchmarks and averages; it is not a "
             "steady-state problem.",
      .inputs = "at least " + std::to_string(kWarmupMinSteps) + " steps",
      .thresholds = {{"kFirstStepRatio", kFirstStepRatio, "fires above this multiple"},
                     {"kWarmupMinSteps", static_cast<double>(kWarmupMinSteps),
                      "evaluated with at least this many steps"}},
      .evaluate = rules::FirstStepOutlier,
  });
  r.push_back(RuleSpec{
      .id = "high_step_variance",
      .family = "warmup",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "steady-state p99 / p50 step time > " + FormatCompact(kVarianceRatio),
      .fix = "Find what runs on the slow steps: periodic logging or checkpoint saves, .item() / "
             "print syncs, evaluation, Python GC pauses (gc.freeze() after setup), or "
             "dataloader workers being descheduled.",
      .inputs = "at least " + std::to_string(kVarianceMinSteps) + " steady-state steps",
      .thresholds = {{"kVarianceRatio", kVarianceRatio, "fires above this p99/p50"},
                     {"kVarianceMinSteps", static_cast<double>(kVarianceMinSteps),
                      "evaluated with at least this many steady-state steps"}},
      .evaluate = rules::HighStepVariance,
  });
  r.push_back(RuleSpec{
      .id = "cost",
      .family = "cost",
      .max_severity = Severity::kLow,
      .severity = "low (reported whenever it can be computed)",
      .fires_when = "always, when a rate is known: run duration × GPU count × USD per GPU-hour",
      .fix = "Recover idle capacity first (see the other insights). The rate is a reference "
             "on-demand price; set GPUPROF_GPU_RATE=<USD per GPU-hour> for your own.",
      .inputs = "run duration, runs.gpu_model with a reference rate (or GPUPROF_GPU_RATE) and "
                "runs.gpu_count; a CPU run needs GPUPROF_GPU_RATE (priced per machine)",
      .thresholds = {},
      .evaluate = rules::Cost,
  });
  return r;
}

std::string EscapePipes(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else out += c;
  }
  return out;
}

}  // namespace

namespace rules {

std::optional<std::string> NeedSteps(const RunView& view, size_t min_steps) {
  if (view.steps.empty()) return std::string("no steps recorded");
  if (view.steps.size() < min_steps) {
    return StrFormat("only %zu step%s recorded; needs at least %zu", view.steps.size(),
                     view.steps.size() == 1 ? "" : "s", min_steps);
  }
  return std::nullopt;
}

std::optional<std::string> NeedSteadyState(const RunView& view) {
  if (view.steps.empty()) return std::string("no steps recorded");
  if (view.steady_count() == 0) {
    return std::string("only 1 step recorded; the steady state needs at least 2");
  }
  return std::nullopt;
}

}  // namespace rules

std::string_view SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kHigh: return "high";
    case Severity::kMed: return "med";
    case Severity::kLow: return "low";
    case Severity::kInfo: return "info";
  }
  return "info";
}

std::string_view SeverityTag(Severity severity) {
  switch (severity) {
    case Severity::kHigh: return "HIGH";
    case Severity::kMed: return "MED";
    case Severity::kLow: return "LOW";
    case Severity::kInfo: return "INFO";
  }
  return "INFO";
}

std::optional<Severity> ParseSeverity(std::string_view name) {
  for (Severity s : {Severity::kHigh, Severity::kMed, Severity::kLow, Severity::kInfo}) {
    if (name == SeverityName(s)) return s;
  }
  return std::nullopt;
}

const std::vector<RuleSpec>& Rules() {
  static const std::vector<RuleSpec> kRules = BuildRules();
  return kRules;
}

const RuleSpec* FindRule(std::string_view id) {
  for (const RuleSpec& spec : Rules()) {
    if (spec.id == id) return &spec;
  }
  return nullptr;
}

RuleResult EvaluateRule(const RuleSpec& spec, const RunView& view, const RuleContext& context) {
  RuleResult result = spec.evaluate(view, context);
  if (result.insight) {
    result.insight->rule_id = spec.id;
    result.insight->family = spec.family;
    if (result.insight->fix.empty()) result.insight->fix = spec.fix;
  }
  return result;
}

std::string RulesMarkdown() {
  std::string out;
  out += "| Rule | Family | Severity | Fires when | Fix |\n";
  out += "|---|---|---|---|---|\n";
  for (const RuleSpec& s : Rules()) {
    out += "| `" + s.id + "` | " + s.family + " | " + EscapePipes(s.severity) + " | " +
           EscapePipes(s.fires_when) + " | " + EscapePipes(s.fix) + " |\n";
  }
  out += "\n| Rule | Threshold | Value | Meaning |\n";
  out += "|---|---|---|---|\n";
  for (const RuleSpec& s : Rules()) {
    for (const RuleThreshold& t : s.thresholds) {
      out += "| `" + s.id + "` | `" + t.name + "` | " + StrFormat("%g", t.value) +
             (t.value > 0 && t.value < 1 ? " (" + FormatPercent(t.value) + ")" : "") + " | " +
             EscapePipes(t.meaning) + " |\n";
    }
  }
  out += "\n| Rule | Needs (else \"not evaluated\") |\n";
  out += "|---|---|\n";
  for (const RuleSpec& s : Rules()) {
    out += "| `" + s.id + "` | " + EscapePipes(s.inputs) + " |\n";
  }
  return out;
}

std::string RulesText() {
  std::string out = StrFormat("%zu rules\n", Rules().size());
  std::string family;
  for (const RuleSpec& s : Rules()) {
    if (s.family != family) {
      family = s.family;
      out += "\n" + family + "\n";
    }
    out += "  " + s.id + "  [" + s.severity + "]\n";
    out += "    fires when: " + s.fires_when + "\n";
    out += "    needs:      " + s.inputs + "\n";
    out += "    fix:        " + s.fix + "\n";
  }
  return out;
}

}  // namespace gpuprof::analysis
