// Warmup & tail rules: one-time costs at the start and spikes in the steady state.
#include <algorithm>
#include <map>

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
  return StrFormat("steps %lld–%lld", static_cast<long long>(first), static_cast<long long>(last));
}

// A step's own work: its duration without the loader wait before it, when that wait was
// measured (the DataLoader's iter()/next(), wrap_dataloader, or the inter-step gap), and without
// the machine's time: the process held off the CPU (stall watch) or its threads queued for one
// (CPU wait). Step 0's gap wait is unknown, so all of it counts. Worker start-up and a first
// batch that takes long to build are the loader's warmup: dataloader_stall and
// prefetch_queue_starved judge those; the machine's time is host_stalls' and cpu_contention's.
double WorkNs(const StepView& s) {
  double work = static_cast<double>(s.duration_ns);
  if (s.wait_ns) work -= static_cast<double>(*s.wait_ns);
  work -= static_cast<double>(s.machine_ns());
  return std::max(0.0, work);
}

bool AnyWait(const RunView& view) {
  return std::any_of(view.steps.begin(), view.steps.end(),
                     [](const StepView& s) { return s.wait_ns && *s.wait_ns > 0; });
}

bool AnyMachineTime(const RunView& view) {
  return std::any_of(view.steps.begin(), view.steps.end(),
                     [](const StepView& s) { return s.machine_ns() > 0; });
}

// "Step 0 took 1.62 s" or, when loader waits or the machine's time were left out, "Step 0 ran
// for 1.62 s outside the loader" / "... outside the loader and time without a CPU" / "...
// outside time without a CPU".
std::string StepTook(const RunView& view, const std::string& time) {
  const long long step = static_cast<long long>(view.steps.front().step);
  const bool wait = AnyWait(view), stall = AnyMachineTime(view);
  if (!wait && !stall) return StrFormat("Step %lld took %s", step, time.c_str());
  return StrFormat("Step %lld ran for %s outside %s", step, time.c_str(),
                   wait && stall ? "the loader and time without a CPU"
                                 : (wait ? "the loader" : "time without a CPU"));
}

}  // namespace

// Fires when the first step's work (outside the loader wait) is longer than kWarmupRatio × the
// steady-state median work, and the warmup steps' work above that median is at least
// kWarmupMinShare of the run's step time (a few ms of first-call overhead in a long run is not
// worth a line).
RuleResult CompilationWarmup(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteps(view, kWarmupMinSteps)) return RuleResult::Skip(*why);
  std::vector<double> steady;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    steady.push_back(WorkNs(view.steps[i]));
  }
  const double median = *Median(steady);
  if (median <= 0) return RuleResult::Skip("steady-state median step time is 0");
  const double first = WorkNs(view.steps.front());
  const double ratio = first / median;
  if (ratio <= kWarmupRatio) return RuleResult::Pass();
  double excess = 0;
  for (size_t i = 0; i < view.steady_begin; ++i) {
    excess += std::max(0.0, WorkNs(view.steps[i]) - median);
  }
  const double run_total = view.all->total_ns;
  const double share = run_total > 0 ? excess / run_total : 0.0;
  if (share < kWarmupMinShare) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"first_step_ns", static_cast<double>(view.steps.front().duration_ns)},
      {"first_step_work_ns", first},
      {"steady_median_work_ns", median},
      {"ratio", ratio},
      {"warmup_steps", view.steady_begin},
      {"warmup_excess_ns", excess},
      {"warmup_share", share},
      {"threshold", kWarmupRatio},
      {"threshold_share", kWarmupMinShare},
  };
  const auto [first_text, median_text] = FormatDurations(first, median);
  return RuleResult::Fire(
      Severity::kLow,
      StrFormat("%s, %s the steady-state median of %s; warmup (%s) cost %s over steady pace "
                "(%s of step time)",
                StepTook(view, first_text).c_str(), FormatRatio(ratio).c_str(), median_text.c_str(),
                WarmupRange(view).c_str(), FormatDuration(excess).c_str(),
                FormatPercent(share).c_str()),
      std::move(evidence));
}

// Fires when step 0's work (outside the loader wait) is longer than kFirstStepRatio × the median
// work of all the other steps, and it lifts the run's mean step time by at least
// kFirstStepMinLift.
RuleResult FirstStepOutlier(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteps(view, kWarmupMinSteps)) return RuleResult::Skip(*why);
  std::vector<double> rest;
  double rest_total = 0;
  for (size_t i = 1; i < view.steps.size(); ++i) {
    rest.push_back(WorkNs(view.steps[i]));
    rest_total += static_cast<double>(view.steps[i].duration_ns);
  }
  const double median = *Median(rest);
  if (median <= 0) return RuleResult::Skip("median step time of steps after step 0 is 0");
  const double first = WorkNs(view.steps.front());
  const double ratio = first / median;
  if (ratio <= kFirstStepRatio) return RuleResult::Pass();
  const double mean_rest = rest_total / static_cast<double>(rest.size());
  const double mean_all = view.all->mean_ns;
  const double lift = mean_rest > 0 ? mean_all / mean_rest - 1 : 0.0;
  if (lift < kFirstStepMinLift) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"first_step_ns", static_cast<double>(view.steps.front().duration_ns)},
      {"first_step_work_ns", first},
      {"median_rest_work_ns", median},
      {"ratio", ratio},
      {"mean_all_ns", mean_all},
      {"mean_rest_ns", mean_rest},
      {"mean_lift", lift},
      {"threshold", kFirstStepRatio},
      {"threshold_lift", kFirstStepMinLift},
  };
  const auto [first_text, median_text] = FormatDurations(first, median);
  const auto [rest_text, all_text] = FormatDurations(mean_rest, mean_all);
  // "+12%", or a multiple once the mean more than doubles ("44.1×").
  const std::string lift_text = lift >= 1 ? FormatRatio(1 + lift) : "+" + FormatPercent(lift);
  return RuleResult::Fire(
      Severity::kLow,
      StrFormat("%s, %s the median of the other %zu steps (%s); it lifts the mean step time "
                "from %s to %s (%s)",
                StepTook(view, first_text).c_str(), FormatRatio(ratio).c_str(), rest.size(),
                median_text.c_str(), rest_text.c_str(), all_text.c_str(), lift_text.c_str()),
      std::move(evidence));
}

// Fires when the steady-state p99 step time is more than kVarianceRatio × the p50. The steps
// gpuprof's own CPU-operator trace slowed (ProfiledSteps) are left out: their time is the
// profiler's, not the training's.
RuleResult HighStepVariance(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const std::set<int64_t> profiled = ProfiledSteps(view);
  std::vector<const StepView*> steps;  // the steady-state steps judged
  std::vector<double> durations;
  size_t left_out = 0, evaluations_left_out = 0;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    if (profiled.count(view.steps[i].step)) {
      ++left_out;
      continue;
    }
    if (view.evaluation_steps.Has(view.steps[i].step)) {
      ++evaluations_left_out;
      continue;
    }
    steps.push_back(&view.steps[i]);
    durations.push_back(static_cast<double>(view.steps[i].duration_ns));
  }
  if (steps.size() < kVarianceMinSteps) {
    std::string outside;
    if (left_out) {
      outside += StrFormat("the traced steps and the steps after them (%zu)", left_out);
    }
    if (evaluations_left_out) {
      outside +=
          StrFormat("%sthe evaluation steps (%zu)", left_out ? " and " : "", evaluations_left_out);
    }
    return RuleResult::Skip(
        StrFormat("only %s%s; p99 needs at least %zu",
                  Plural(steps.size(), "steady-state step", "steady-state steps").c_str(),
                  outside.empty() ? "" : (" outside " + outside).c_str(), kVarianceMinSteps));
  }
  const DurationStats s = *ComputeDurationStats(durations);
  if (s.p50_ns <= 0) return RuleResult::Skip("steady-state median step time is 0");
  const double ratio = s.p99_ns / s.p50_ns;
  if (ratio <= kVarianceRatio) return RuleResult::Pass();
  size_t spikes = 0;
  double lost = 0;
  double steady_total = 0;
  std::vector<int64_t> spike_steps;
  for (const StepView* st : steps) {
    const double d = static_cast<double>(st->duration_ns);
    steady_total += d;
    if (d > kVarianceRatio * s.p50_ns) {
      ++spikes;
      lost += d - s.p50_ns;
      spike_steps.push_back(st->step);
    }
  }
  if (spikes < kVarianceMinSpikes) return RuleResult::Pass();
  const double lost_share = steady_total > 0 ? lost / steady_total : 0.0;
  // How much of the spikes' extra time is loader wait: per spike, its wait measured inside the
  // loader (DataLoader next(), wrap_dataloader) above the steady-state median of such waits.
  // Inter-step gaps do not count: they also hold logging and checkpoints.
  std::vector<double> loader_waits;
  for (const StepView* step : steps) {
    const StepView& st = *step;
    if (st.wait_ns && st.wait_source && *st.wait_source != "gap") {
      loader_waits.push_back(static_cast<double>(*st.wait_ns));
    }
  }
  std::optional<double> loader_share;
  if (const auto median_wait = Median(loader_waits); median_wait && lost > 0) {
    double loader_excess = 0;
    for (const StepView* step : steps) {
      const StepView& st = *step;
      const double d = static_cast<double>(st.duration_ns);
      if (d <= kVarianceRatio * s.p50_ns || !st.wait_ns || !st.wait_source ||
          *st.wait_source == "gap") {
        continue;
      }
      loader_excess +=
          std::clamp(static_cast<double>(*st.wait_ns) - *median_wait, 0.0, d - s.p50_ns);
    }
    loader_share = loader_excess / lost;
  }
  // How much of it was the machine's: per spike, the time the process was held off the CPU
  // (stall watch) and the time its threads queued for one (CPU wait), each above its
  // steady-state median, together at most the spike's extra time.
  std::optional<double> stall_share, cpu_wait_share, machine_share;
  if ((view.stalls_watched || view.cpu_wait_watched) && lost > 0) {
    std::vector<double> stalled, waited;
    for (const StepView* st : steps) {
      stalled.push_back(static_cast<double>(st->stalled_ns.value_or(0)));
      waited.push_back(static_cast<double>(st->cpu_wait_ns.value_or(0)));
    }
    const double median_stalled = Median(stalled).value_or(0.0);
    const double median_waited = Median(waited).value_or(0.0);
    double stall_excess = 0, wait_excess = 0, machine_excess = 0;
    for (const StepView* step : steps) {
      const StepView& st = *step;
      const double d = static_cast<double>(st.duration_ns);
      if (d <= kVarianceRatio * s.p50_ns) continue;
      const double extra = d - s.p50_ns;
      const double st_ex =
          std::clamp(static_cast<double>(st.stalled_ns.value_or(0)) - median_stalled, 0.0, extra);
      const double wt_ex =
          std::clamp(static_cast<double>(st.cpu_wait_ns.value_or(0)) - median_waited, 0.0, extra);
      stall_excess += st_ex;
      wait_excess += wt_ex;
      machine_excess += std::min(extra, st_ex + wt_ex);
    }
    if (view.stalls_watched) stall_share = stall_excess / lost;
    if (view.cpu_wait_watched) cpu_wait_share = wait_excess / lost;
    machine_share = machine_excess / lost;
  }
  // How much of it was host work outside the loader and the phases (checkpoint saves, logging):
  // per spike, its time in neither (StepOtherNs) above the steady-state median of that.
  std::optional<double> other_share;
  {
    std::map<int64_t, double> others;
    std::vector<double> values;
    for (const StepOther& o : SteadyOtherTimes(view)) {
      others[o.step->step] = o.other_ns;
      values.push_back(o.other_ns);
    }
    if (const auto median_other = Median(values); median_other && lost > 0) {
      double other_excess = 0;
      for (const StepView* st : steps) {
        const double d = static_cast<double>(st->duration_ns);
        auto it = others.find(st->step);
        if (d <= kVarianceRatio * s.p50_ns || it == others.end()) continue;
        other_excess += std::clamp(it->second - *median_other, 0.0, d - s.p50_ns);
      }
      other_share = other_excess / lost;
    }
  }
  const bool machine_caused = machine_share && *machine_share >= kVarianceStallShare;
  // Which of the two took more of it: the finding that explains the variance.
  const bool stall_caused = machine_caused && stall_share.value_or(0) >= cpu_wait_share.value_or(0);
  const bool cpu_wait_caused = machine_caused && !stall_caused;
  // A loader that waited while the process had no CPU is not slow itself.
  const bool loader_caused =
      !machine_caused && loader_share && *loader_share >= kVarianceLoaderShare;
  const bool other_caused =
      !machine_caused && !loader_caused && other_share && *other_share >= kVarianceOtherShare;
  nlohmann::json evidence = {
      {"p50_ns", s.p50_ns},
      {"p99_ns", s.p99_ns},
      {"ratio", ratio},
      {"spikes", spikes},
      {"steady_steps", s.count},
      {"traced_steps_left_out", left_out},
      {"evaluation_steps_left_out", evaluations_left_out},
      {"first_spike_step", spike_steps.empty() ? nlohmann::json() : nlohmann::json(spike_steps[0])},
      {"spike_period", PeriodJson(spike_steps)},
      {"spike_excess_ns", lost},
      {"threshold", kVarianceRatio},
      {"lost_share", lost_share},
      {"loader_share", loader_share ? nlohmann::json(*loader_share) : nlohmann::json()},
      {"loader_caused", loader_caused},
      {"stall_share", stall_share ? nlohmann::json(*stall_share) : nlohmann::json()},
      {"cpu_wait_share", cpu_wait_share ? nlohmann::json(*cpu_wait_share) : nlohmann::json()},
      {"machine_share", machine_share ? nlohmann::json(*machine_share) : nlohmann::json()},
      {"stall_caused", stall_caused},
      {"cpu_wait_caused", cpu_wait_caused},
      {"other_share", other_share ? nlohmann::json(*other_share) : nlohmann::json()},
      {"other_caused", other_caused},
      // For the fold under kernel_launch_overhead: the same cause when both say so.
      {"periodic_other", other_caused},
  };
  const auto [p99_text, p50_text] = FormatDurations(s.p99_ns, s.p50_ns);
  std::string message = StrFormat(
      "Step time p99 is %s p50 (%s vs %s); %zu of %zu steady-state steps took over %s the median",
      FormatRatio(ratio).c_str(), p99_text.c_str(), p50_text.c_str(), spikes, s.count,
      (FormatCompact(kVarianceRatio) + "×").c_str());
  if (const auto period = StepPeriod(spike_steps)) {
    message += StrFormat(", every %s step from step %lld", Ordinal(*period).c_str(),
                         static_cast<long long>(spike_steps[0]));
  }
  if (loader_caused) {
    message += StrFormat(", %s of their extra time waiting on the loader",
                         FormatPercent(*loader_share).c_str());
  } else if (stall_caused) {
    message += StrFormat(", %s of their extra time with the process held off the CPU%s",
                         FormatPercent(*machine_share).c_str(),
                         cpu_wait_share.value_or(0) > 0 ? " or queued for one" : "");
  } else if (cpu_wait_caused) {
    message += StrFormat(", %s of their extra time with its threads queued for a CPU",
                         FormatPercent(*machine_share).c_str());
  } else if (other_caused) {
    message += StrFormat(", %s of their extra time outside the loader wait and the phases",
                         FormatPercent(*other_share).c_str());
  }
  RuleResult r = RuleResult::Fire(lost_share >= kVarianceMedShare ? Severity::kMed : Severity::kLow,
                                  std::move(message), std::move(evidence));
  if (stall_caused) {
    r.insight->fix =
        std::string("The slow steps are the machine's, not the training's. ") + kHostStallFix;
  } else if (cpu_wait_caused) {
    r.insight->fix =
        std::string("The slow steps are the machine's, not the training's. ") + kCpuContentionFix;
  } else if (other_caused) {
    r.insight->fix = kPeriodicHostWorkFix;
  } else if (loader_caused) {
    r.insight->fix =
        "The slow steps wait for batches that the loader delivers in bursts (workers finishing "
        "together, uneven samples): keep the prefetch queue full with more num_workers and a "
        "larger prefetch_factor, and even out the per-sample cost.";
  }
  return r;
}

// Fires when the evaluation steps (RunView::evaluation_steps: extra forward calls without
// backward passes) take at least kEvalMinShare of the steady-state step time above what a
// typical step takes (the median of the other steady steps).
RuleResult EvaluationInSteps(const RunView& view, const RuleContext&) {
  using namespace thresholds;
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const ExtraForwards& x = view.evaluation_steps;
  if (x.steps.empty()) return RuleResult::Pass();
  std::vector<double> rest;
  std::vector<double> forwards, backwards;
  double total = 0, evaluation_total = 0, evaluation_wait = 0;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    const StepView& st = view.steps[i];
    const double d = static_cast<double>(st.duration_ns);
    total += d;
    if (x.Has(st.step)) {
      evaluation_total += d;
      evaluation_wait += static_cast<double>(st.wait_ns.value_or(0));
      forwards.push_back(static_cast<double>(st.forward_calls));
      backwards.push_back(static_cast<double>(st.backward_calls));
    } else {
      rest.push_back(d);
    }
  }
  const auto typical = Median(rest);
  if (!typical || total <= 0) return RuleResult::Pass();
  const double n = static_cast<double>(x.steps.size());
  const double extra = std::max(0.0, evaluation_total - n * *typical);
  const double share = extra / total;
  if (share < kEvalMinShare) return RuleResult::Pass();
  const double median_forwards = *Median(forwards);
  const double median_backwards = *Median(backwards);
  nlohmann::json evidence = {
      {"evaluation_steps", x.steps.size()},
      {"first_step", x.steps.front()},
      {"step_period", PeriodJson(x.steps)},
      {"median_forward_calls", median_forwards},
      {"median_backward_calls", median_backwards},
      {"typical_forward_calls", x.typical_forwards},
      {"typical_backward_calls", x.typical_backwards},
      {"typical_step_ns", *typical},
      {"extra_ns", extra},
      {"loader_wait_ns", evaluation_wait},
      {"share", share},
      {"threshold", kEvalMinShare},
  };
  const bool one = x.steps.size() == 1;
  const std::string which = StepSetSubject(x.steps);
  return RuleResult::Fire(
      share >= kEvalMedShare ? Severity::kMed : Severity::kLow,
      StrFormat(
          "An evaluation inside the training steps? %s ran %s forward calls%s with %s backward "
          "%s (a typical step: %lld and %lld) and took %s more%s than a typical step's %s: "
          "%s of steady-state step time",
          which.c_str(), FormatCompact(median_forwards).c_str(), one ? "" : " each",
          FormatCompact(median_backwards).c_str(), median_backwards == 1 ? "pass" : "passes",
          static_cast<long long>(x.typical_forwards), static_cast<long long>(x.typical_backwards),
          FormatDuration(extra / n).c_str(), one ? "" : " each", FormatDuration(*typical).c_str(),
          FormatPercent(share).c_str()),
      std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
