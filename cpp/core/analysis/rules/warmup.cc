// Warmup & tail rules: one-time costs at the start and spikes in the steady state.
#include <algorithm>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {
namespace {

// "step 0" or "steps 0–2" for the warmup steps (those before steady_begin).
std::string WarmupRange(const RunView& view) {
  const int64_t first = view.steps.front().step;
  const int64_t last = view.steps[view.steady_begin - 1].step;
  if (first == last) return StrFormat("step %lld", static_cast<long long>(first));
  return StrFormat("steps %lld–%lld", static_cast<long long>(first),
                   static_cast<long long>(last));
}

}  // namespace

// Fires when the first step is longer than kWarmupRatio × the steady-state median.
RuleResult CompilationWarmup(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteps(view, kWarmupMinSteps)) return RuleResult::Skip(*why);
  const double median = view.steady->p50_ns;
  if (median <= 0) return RuleResult::Skip("steady-state median step time is 0");
  const double first = static_cast<double>(view.steps.front().duration_ns);
  const double ratio = first / median;
  if (ratio <= kWarmupRatio) return RuleResult::Pass();
  // A step 0 beyond first_step_outlier's threshold is that rule's finding: say it once.
  std::vector<double> rest;
  for (size_t i = 1; i < view.steps.size(); ++i) {
    rest.push_back(static_cast<double>(view.steps[i].duration_ns));
  }
  if (auto rest_median = Median(rest); rest_median && *rest_median > 0 &&
                                       first / *rest_median > kFirstStepRatio) {
    return RuleResult::Pass();
  }
  double excess = 0;
  for (size_t i = 0; i < view.steady_begin; ++i) {
    excess += std::max(0.0, view.steps[i].duration_ns - median);
  }
  nlohmann::json evidence = {
      {"first_step_ns", first},        {"steady_median_ns", median},
      {"ratio", ratio},                {"warmup_steps", view.steady_begin},
      {"warmup_excess_ns", excess},    {"threshold", kWarmupRatio},
  };
  return RuleResult::Fire(
      Severity::kLow,
      StrFormat("Step %lld took %s, %s the steady-state median of %s; warmup (%s) cost %s "
                "over steady pace",
                static_cast<long long>(view.steps.front().step), FormatDuration(first).c_str(),
                FormatRatio(ratio).c_str(), FormatDuration(median).c_str(),
                WarmupRange(view).c_str(), FormatDuration(excess).c_str()),
      std::move(evidence));
}

// Fires when step 0 is longer than kFirstStepRatio × the median of all the other steps.
RuleResult FirstStepOutlier(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteps(view, kWarmupMinSteps)) return RuleResult::Skip(*why);
  std::vector<double> rest;
  double rest_total = 0;
  for (size_t i = 1; i < view.steps.size(); ++i) {
    rest.push_back(static_cast<double>(view.steps[i].duration_ns));
    rest_total += rest.back();
  }
  const double median = *Median(rest);
  if (median <= 0) return RuleResult::Skip("median step time of steps after step 0 is 0");
  const double first = static_cast<double>(view.steps.front().duration_ns);
  const double ratio = first / median;
  if (ratio <= kFirstStepRatio) return RuleResult::Pass();
  const double mean_rest = rest_total / static_cast<double>(rest.size());
  nlohmann::json evidence = {
      {"first_step_ns", first},           {"median_rest_ns", median},
      {"ratio", ratio},                   {"mean_all_ns", view.all->mean_ns},
      {"mean_rest_ns", mean_rest},        {"threshold", kFirstStepRatio},
  };
  return RuleResult::Fire(
      Severity::kLow,
      StrFormat("Step %lld (%s) is %s the median of the other %zu steps (%s); it lifts the mean "
                "step time from %s to %s",
                static_cast<long long>(view.steps.front().step), FormatDuration(first).c_str(),
                FormatRatio(ratio).c_str(), rest.size(), FormatDuration(median).c_str(),
                FormatDuration(mean_rest).c_str(), FormatDuration(view.all->mean_ns).c_str()),
      std::move(evidence));
}

// Fires when the steady-state p99 step time is more than kVarianceRatio × the p50.
RuleResult HighStepVariance(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  if (view.steady_count() < kVarianceMinSteps) {
    return RuleResult::Skip(StrFormat(
        "only %s; p99 needs at least %zu",
        Plural(view.steady_count(), "steady-state step", "steady-state steps").c_str(),
        kVarianceMinSteps));
  }
  const DurationStats& s = *view.steady;
  if (s.p50_ns <= 0) return RuleResult::Skip("steady-state median step time is 0");
  const double ratio = s.p99_ns / s.p50_ns;
  if (ratio <= kVarianceRatio) return RuleResult::Pass();
  size_t spikes = 0;
  double lost = 0;
  double steady_total = 0;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    const double d = static_cast<double>(view.steps[i].duration_ns);
    steady_total += d;
    if (d > kVarianceRatio * s.p50_ns) {
      ++spikes;
      lost += d - s.p50_ns;
    }
  }
  if (spikes < kVarianceMinSpikes) return RuleResult::Pass();
  const double lost_share = steady_total > 0 ? lost / steady_total : 0.0;
  nlohmann::json evidence = {
      {"p50_ns", s.p50_ns}, {"p99_ns", s.p99_ns},         {"ratio", ratio},
      {"spikes", spikes},   {"steady_steps", s.count},    {"spike_excess_ns", lost},
      {"threshold", kVarianceRatio}, {"lost_share", lost_share},
  };
  return RuleResult::Fire(
      lost_share >= kVarianceMedShare ? Severity::kMed : Severity::kLow,
      StrFormat("Step time p99 is %s p50 (%s vs %s); %zu of %zu steady-state steps took over %s "
                "the median",
                FormatRatio(ratio).c_str(), FormatDuration(s.p99_ns).c_str(),
                FormatDuration(s.p50_ns).c_str(), spikes, s.count,
                (FormatCompact(kVarianceRatio) + "×").c_str()),
      std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
