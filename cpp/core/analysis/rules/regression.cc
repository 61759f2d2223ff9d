// Regression rule: is this run slower (or faster) than the previous runs of the same name?
#include <algorithm>
#include <cmath>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {
namespace {

using namespace thresholds;

// "41% slower", "15.0× slower", "12% faster", "14.2× faster" for this run's time per step over
// the baseline's (a ratio beyond 2 reads better as a multiple).
std::string ChangeText(double ratio) {
  if (ratio >= 2) return FormatRatio(ratio) + " slower";
  if (ratio >= 1) return FormatPercent(ratio - 1) + " slower";
  if (ratio <= 0.5) return FormatRatio(1 / ratio) + " faster";
  return FormatPercent(1 - ratio) + " faster";
}

// A relative half-width as a band in log space, and back ("±12%").
double LogBand(double spread) { return std::log1p(std::max(0.0, spread)); }
std::string BandText(double log_band) { return "±" + FormatPercent(std::expm1(log_band)); }

}  // namespace

// Compares throughput: this run's steady-state wall time per step (loader wait included,
// MeasureThroughput) with the median of that of the kRegressionRuns newest earlier finished runs
// of the same run_name with at least kRegressionMinSteps steady-state steps
// (RuleContext::previous_runs, loaded by AnalyzeRun). Fires MED when this run is more than
// kRegressionSlower slower, INFO when more than kImprovementFaster faster, in both cases only
// when the change is beyond the noise band: this run's 95% interval and the baseline's (the
// median of its runs' intervals over √runs, or half the log-range of their means when that is
// wider), combined as independent errors in log space. Past the threshold but inside the band is
// "inconclusive" (not evaluated, with the numbers).
RuleResult Regression(const RunView& view, const RuleContext& context) {
  if (!context.previous_runs) {
    return RuleResult::Skip("previous runs not loaded (analysis without a store)");
  }
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const std::string& name = view.run().run_name;
  const std::optional<Throughput> current = MeasureThroughput(view);
  if (!current || current->mean_ns <= 0) {
    return RuleResult::Skip("steady-state time per step is 0");
  }
  std::vector<const PriorRun*> base;
  for (const PriorRun& p : *context.previous_runs) {
    if (base.size() == kRegressionRuns) break;
    if (p.steady_mean_ns && *p.steady_mean_ns > 0 && p.steady_steps >= kRegressionMinSteps) {
      base.push_back(&p);
    }
  }
  if (base.empty()) {
    const size_t n = context.previous_runs->size();
    if (n == 0) return RuleResult::Skip("no earlier finished run named '" + name + "' in this DB");
    return RuleResult::Skip(StrFormat(
        "the %zu earlier run%s named '%s' %s fewer than %zu steady-state steps, too few to "
        "compare; a run of %zu+ steps becomes the baseline",
        n, n == 1 ? "" : "s", name.c_str(), n == 1 ? "has" : "have", kRegressionMinSteps,
        kRegressionMinSteps + kWarmupSteps));
  }
  if (current->steps < kRegressionMinSteps) {
    return RuleResult::Skip(StrFormat(
        "inconclusive: only %s in this run; comparing throughput needs at least %zu (run %zu+ "
        "steps)",
        Plural(current->steps, "steady-state step", "steady-state steps").c_str(),
        kRegressionMinSteps, kRegressionMinSteps + kWarmupSteps));
  }

  std::vector<double> means, bands;
  nlohmann::json ids = nlohmann::json::array();
  std::string id_list;
  for (size_t i = 0; i < base.size(); ++i) {
    means.push_back(*base[i]->steady_mean_ns);
    // A baseline run without a spread (never the case for 10+ steady steps) adds none.
    bands.push_back(LogBand(base[i]->spread.value_or(0)));
    ids.push_back(base[i]->run_id);
    // Oldest first in the text: "runs 4, 5 and 6".
    const PriorRun* p = base[base.size() - 1 - i];
    id_list += (i == 0 ? "" : i + 1 == base.size() ? " and " : ", ") + std::to_string(p->run_id);
  }
  const double baseline = *Median(means);
  const double ratio = current->mean_ns / baseline;
  const double current_band = LogBand(current->spread.value_or(0));
  const auto [lo, hi] = std::minmax_element(means.begin(), means.end());
  const double between = (std::log(*hi) - std::log(*lo)) / 2;
  const double within = *Median(bands) / std::sqrt(static_cast<double>(base.size()));
  const double baseline_band = std::max(within, between);
  const double band = std::hypot(current_band, baseline_band);
  const bool slower = ratio > 1 + kRegressionSlower;
  const bool faster = ratio < 1 - kImprovementFaster;
  if (!slower && !faster) return RuleResult::Pass();

  const std::string runs_word = base.size() == 1 ? "run " : "runs ";
  const auto [now_text, base_text] = FormatDurations(current->mean_ns, baseline);
  if (std::fabs(std::log(ratio)) <= band) {
    return RuleResult::Skip(StrFormat(
        "inconclusive: %s per step vs %s in %s%s (%s), within the noise of %s (this run's time "
        "per step varies %s along the run, the baseline's %s); a longer run decides",
        now_text.c_str(), base_text.c_str(), runs_word.c_str(), id_list.c_str(),
        ChangeText(ratio).c_str(), BandText(band).c_str(), BandText(current_band).c_str(),
        BandText(baseline_band).c_str()));
  }
  std::string against;
  if (base.size() == 1) {
    against = StrFormat("the previous run of '%s' (run %lld)", name.c_str(),
                        static_cast<long long>(base[0]->run_id));
  } else {
    against = StrFormat("last %zu runs of '%s' (median)", base.size(), name.c_str());
  }
  nlohmann::json evidence = {
      {"measure", "steady-state wall time per step, loader wait included"},
      {"current_mean_ns", current->mean_ns},
      {"current_steps", current->steps},
      {"baseline_mean_ns", baseline},
      {"baseline_run_ids", ids},
      {"baseline_means_ns", means},
      {"ratio", ratio},
      {"change", ratio - 1},
      {"noise", std::expm1(band)},
      {"current_spread", std::expm1(current_band)},
      {"baseline_spread", std::expm1(baseline_band)},
      {"threshold_slower", kRegressionSlower},
      {"threshold_faster", kImprovementFaster},
  };
  const std::string message = StrFormat(
      "%s vs %s: %s per step vs %s (%s; steady-state time per step, loader wait "
      "included)",
      slower ? "Regression" : "Improvement", against.c_str(), now_text.c_str(), base_text.c_str(),
      ChangeText(ratio).c_str());
  RuleResult r =
      RuleResult::Fire(slower ? Severity::kMed : Severity::kInfo, message, std::move(evidence));
  if (slower) {
    r.insight->fix = "Diff this run against " + runs_word + id_list +
                     " (code, config, batch size, data, driver, GPU; `gpuprof insights DB RUN` "
                     "shows each one's breakdown); the other insights here show where the time "
                     "goes now.";
  } else {
    r.insight->fix =
        "Nothing to fix; note what changed since " + runs_word + id_list + " so the gain is kept.";
  }
  return r;
}

}  // namespace gpuprof::analysis::rules
