// The rule registry: every insight rule, its thresholds, and the text users read about it.
//
// Rules are pure functions of (RunView, RuleContext). The registry is the single source for
// `gpuprof rules`, docs/rules.md and the README rule table (generated from
// `gpuprof rules --markdown`): the "fires when" text is built from the same named constants
// the rules compare against, so the docs cannot drift from the code.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/insight.h"
#include "analysis/run_view.h"

namespace gpuprof::analysis {

// Named thresholds. Fractions are of step time unless stated otherwise.
namespace thresholds {
// dataloader_stall: loader wait above this share of step time fires...
inline constexpr double kStallFraction = 0.15;
// ...and is HIGH at or above this share (MED below).
inline constexpr double kStallHighFraction = 0.30;
// kernel_launch_overhead: time outside wait and phases above this share fires...
inline constexpr double kOverheadFraction = 0.10;
// ...and is MED at or above this share (LOW below).
inline constexpr double kOverheadMedFraction = 0.25;
// low_mfu: MFU below this fraction of the dtype peak fires (MED).
inline constexpr double kLowMfu = 0.30;
// compilation_warmup: step 0 longer than this multiple of the steady-state median fires.
inline constexpr double kWarmupRatio = 3.0;
// first_step_outlier: step 0 longer than this multiple of the median of steps 1..n-1 fires.
inline constexpr double kFirstStepRatio = 10.0;
// Both warmup rules need at least this many steps.
inline constexpr size_t kWarmupMinSteps = 3;
// high_step_variance: steady-state p99 / p50 above this ratio fires...
inline constexpr double kVarianceRatio = 2.0;
// ...evaluated only with at least this many steady-state steps (p99 of fewer is the max).
inline constexpr size_t kVarianceMinSteps = 10;
}  // namespace thresholds

using RuleFn = RuleResult (*)(const RunView&, const RuleContext&);

struct RuleThreshold {
  std::string name;   // the constant's name in thresholds::
  double value = 0;
  std::string meaning;
};

struct RuleSpec {
  std::string id;
  std::string family;      // data_pipeline | compute | warmup | cost
  Severity max_severity;   // the most severe level the rule can report
  std::string severity;    // how the level is chosen, e.g. "high ≥ 30%, else med"
  std::string fires_when;  // one line, with the thresholds' values
  std::string fix;         // default fix text
  std::string inputs;      // what must have been measured; otherwise "not evaluated"
  std::vector<RuleThreshold> thresholds;
  RuleFn evaluate = nullptr;
};

// Every rule, in evaluation and display order. The reference lives for the program.
const std::vector<RuleSpec>& Rules();
// The rule with that id, or null.
const RuleSpec* FindRule(std::string_view id);

// Runs one rule and completes a fired insight with rule_id, family and (unless the rule
// set one) the registry's fix text.
RuleResult EvaluateRule(const RuleSpec& spec, const RunView& view, const RuleContext& context);

// The registry as a Markdown table (id, family, severity, fires when, fix) followed by the
// thresholds table; stable output for docs generation.
std::string RulesMarkdown();
// The registry as plain text for a terminal.
std::string RulesText();

}  // namespace gpuprof::analysis
