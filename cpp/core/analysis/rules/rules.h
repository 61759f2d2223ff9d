// Rule functions, one translation unit per family. Internal to analysis/: callers go through
// the registry (rules/registry.h). Each returns RuleResult::Pass, Fire or Skip.
#pragma once

#include "analysis/insight.h"
#include "analysis/run_view.h"

namespace gpuprof::analysis::rules {

// data_pipeline.cc
RuleResult DataloaderStall(const RunView& view, const RuleContext& context);
// compute.cc
RuleResult KernelLaunchOverhead(const RunView& view, const RuleContext& context);
RuleResult LowMfu(const RunView& view, const RuleContext& context);
// warmup.cc
RuleResult CompilationWarmup(const RunView& view, const RuleContext& context);
RuleResult FirstStepOutlier(const RunView& view, const RuleContext& context);
RuleResult HighStepVariance(const RunView& view, const RuleContext& context);
// cost.cc
RuleResult Cost(const RunView& view, const RuleContext& context);

// Shared preconditions. Return a reason when the run has too few steps, else nullopt.
std::optional<std::string> NeedSteps(const RunView& view, size_t min_steps);
std::optional<std::string> NeedSteadyState(const RunView& view);

}  // namespace gpuprof::analysis::rules
