// Regression rule: is this run slower (or faster) than the previous runs of the same name?
#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {

using namespace thresholds;

// Baseline: the median of the steady-state median step times of the kRegressionRuns newest
// earlier finished runs with the same run_name that have a steady state
// (RuleContext::previous_runs, loaded by AnalyzeRun). Fires MED when this run's steady-state
// median is more than kRegressionSlower above the baseline, INFO when it is more than
// kImprovementFaster below.
RuleResult Regression(const RunView& view, const RuleContext& context) {
  if (!context.previous_runs) {
    return RuleResult::Skip("previous runs not loaded (analysis without a store)");
  }
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const std::string& name = view.run().run_name;
  std::vector<const PriorRun*> base;
  for (const PriorRun& p : *context.previous_runs) {
    if (base.size() == kRegressionRuns) break;
    if (p.steady_median_ns && *p.steady_median_ns > 0) base.push_back(&p);
  }
  if (base.empty()) {
    if (context.previous_runs->empty()) {
      return RuleResult::Skip("no earlier finished run named '" + name + "' in this DB");
    }
    return RuleResult::Skip(StrFormat("the %zu earlier run%s named '%s' have no steady-state "
                                      "step time",
                                      context.previous_runs->size(),
                                      context.previous_runs->size() == 1 ? "" : "s",
                                      name.c_str()));
  }
  std::vector<double> medians;
  nlohmann::json ids = nlohmann::json::array();
  std::string id_list;
  for (size_t i = 0; i < base.size(); ++i) {
    medians.push_back(*base[i]->steady_median_ns);
    ids.push_back(base[i]->run_id);
    // Oldest first in the text: "runs 4, 5 and 6".
    const PriorRun* p = base[base.size() - 1 - i];
    id_list += (i == 0 ? "" : i + 1 == base.size() ? " and " : ", ") + std::to_string(p->run_id);
  }
  const double baseline = *Median(medians);
  const double current = view.steady->p50_ns;
  const double slower = current / baseline - 1;
  const double faster = 1 - current / baseline;
  std::string against;
  if (base.size() == 1) {
    against = StrFormat("the previous run of '%s' (run %lld)", name.c_str(),
                        static_cast<long long>(base[0]->run_id));
  } else {
    against = StrFormat("last %zu runs of '%s' (median)", base.size(), name.c_str());
  }
  nlohmann::json evidence = {
      {"current_median_ns", current},  {"baseline_median_ns", baseline},
      {"baseline_run_ids", ids},       {"baseline_medians_ns", medians},
      {"change", current / baseline - 1}, {"threshold_slower", kRegressionSlower},
      {"threshold_faster", kImprovementFaster},
  };
  const std::string runs_word = base.size() == 1 ? "run " : "runs ";
  if (slower > kRegressionSlower) {
    RuleResult r = RuleResult::Fire(
        Severity::kMed,
        StrFormat("Regression vs %s: step time %s vs %s (%s slower)", against.c_str(),
                  FormatDuration(current).c_str(), FormatDuration(baseline).c_str(),
                  FormatPercent(slower).c_str()),
        std::move(evidence));
    r.insight->fix = "Diff this run against " + runs_word + id_list +
                     " (code, config, batch size, data, driver, GPU; `gpuprof insights DB RUN` "
                     "shows each one's breakdown); the other insights here show where the time "
                     "goes now.";
    return r;
  }
  if (faster > kImprovementFaster) {
    RuleResult r = RuleResult::Fire(
        Severity::kInfo,
        StrFormat("Improvement vs %s: step time %s vs %s (%s faster)", against.c_str(),
                  FormatDuration(current).c_str(), FormatDuration(baseline).c_str(),
                  FormatPercent(faster).c_str()),
        std::move(evidence));
    r.insight->fix = "Nothing to fix; note what changed since " + runs_word + id_list +
                     " so the gain is kept.";
    return r;
  }
  return RuleResult::Pass();
}

}  // namespace gpuprof::analysis::rules
