// Preconditions and measurements shared by several rule families (rules.h).
#include <algorithm>
#include <cctype>
#include <map>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"
#include "store/rollup.h"

namespace gpuprof::analysis::rules {
namespace {

template <typename Row>
std::vector<const Row*> InWindow(const std::vector<Row>& rows,
                                 const std::optional<std::pair<int64_t, int64_t>>& window,
                                 bool* steady) {
  std::vector<const Row*> out;
  if (window) {
    for (const Row& r : rows) {
      if (r.ts_ns >= window->first && r.ts_ns <= window->second) out.push_back(&r);
    }
  }
  *steady = !out.empty();
  if (out.empty()) {
    for (const Row& r : rows) out.push_back(&r);
  }
  return out;
}

std::string WithCause(const std::string& what, const store::TelemetryStatusRow* row) {
  if (row && !row->available) {
    return what + " (telemetry unavailable: " + row->reason.value_or("no reason recorded") + ")";
  }
  return what;
}

}  // namespace

std::optional<std::string> NeedSteps(const RunView& view, size_t min_steps) {
  if (view.steps.empty()) return std::string("no steps recorded");
  if (view.steps.size() < min_steps) {
    return StrFormat("only %zu step%s recorded; needs at least %zu (run more steps)",
                     view.steps.size(), view.steps.size() == 1 ? "" : "s", min_steps);
  }
  return std::nullopt;
}

std::optional<std::string> NeedSteadyState(const RunView& view) {
  if (view.steps.empty()) return std::string("no steps recorded");
  if (view.steady_count() == 0) {
    return std::string("only 1 step recorded; the steady state needs at least 2 (run more steps)");
  }
  return std::nullopt;
}

std::string GpuMissing(const RunView& view, const std::string& what) {
  if (view.IsCpuRun()) return what + " not sampled: a CPU run has no GPU telemetry";
  return WithCause(what + " not sampled", view.Telemetry("gpu"));
}

std::string HostMissing(const RunView& view, const std::string& what) {
  return WithCause(what + " not sampled", view.Telemetry("host"));
}

HostWindow SteadyHostSamples(const RunView& view) {
  HostWindow w;
  w.samples = InWindow(view.data.host_samples, view.SteadyWindow(), &w.steady);
  return w;
}

std::optional<OtherLoad> MeasureOtherLoad(const HostWindow& w) {
  OtherLoad o;
  double sum = 0;
  double job_sum = 0;
  double own_sum = 0;
  size_t job_samples = 0;
  for (const store::HostSampleRow* r : w.samples) {
    if (!r->cpu_pct || !r->ncores || !r->proc_cpu_pct || *r->ncores <= 0) continue;
    const double n = static_cast<double>(*r->ncores);
    const double job = r->job_cpu_pct.value_or(0) / 100;
    const double others = std::max(0.0, *r->cpu_pct / 100 * n - *r->proc_cpu_pct / 100 - job);
    o.min_cores = o.samples == 0 ? others : std::min(o.min_cores, others);
    o.ncores = std::max(o.ncores, n);
    sum += others;
    own_sum += *r->proc_cpu_pct / 100;
    ++o.samples;
    if (r->job_cpu_pct) {
      job_sum += job;
      ++job_samples;
    }
  }
  if (o.samples == 0) return std::nullopt;
  o.mean_cores = sum / static_cast<double>(o.samples);
  o.own_mean_cores = own_sum / static_cast<double>(o.samples);
  if (job_samples > 0) o.job_mean_cores = job_sum / static_cast<double>(job_samples);
  return o;
}

std::optional<double> SteadyCpuWaitShare(const RunView& view) {
  if (!view.cpu_wait_watched || !view.steady || view.steady_count() == 0) return std::nullopt;
  if (view.breakdown.total_ns <= 0) return std::nullopt;
  double waited = 0;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    waited += static_cast<double>(view.steps[i].cpu_wait_ns.value_or(0));
  }
  return waited / view.breakdown.total_ns;
}

GpuWindow SteadyGpuSeconds(const RunView& view) {
  GpuWindow w;
  const auto& rows = view.data.gpu_samples_1s;
  if (const auto window = view.SteadyWindow()) {
    for (const auto& r : rows) {
      // The second [ts, ts + 1 s) overlaps [first, second].
      if (r.ts_ns <= window->second && r.ts_ns + store::kGpuRollupNs > window->first) {
        w.seconds.push_back(&r);
      }
    }
  }
  w.steady = !w.seconds.empty();
  if (w.seconds.empty()) {
    for (const auto& r : rows) w.seconds.push_back(&r);
  }
  return w;
}

bool Stall::stalled() const { return fraction && *fraction > thresholds::kStallFraction; }

Severity Stall::severity() const {
  return fraction && *fraction >= thresholds::kStallHighFraction ? Severity::kHigh : Severity::kMed;
}

std::string Stall::LeftOutText() const {
  if (evaluation_steps_left_out == 0) return "";
  return ", without the " +
         Plural(evaluation_steps_left_out, "evaluation step", "evaluation steps");
}

Stall MeasureStall(const RunView& view) {
  Stall s;
  s.breakdown = &view.training_breakdown;
  s.evaluation_steps_left_out = view.evaluation_steps.steps.size();
  if (auto why = NeedSteadyState(view)) {
    s.reason = *why;
  } else if (!view.training_breakdown.wait_fraction) {
    s.reason =
        "dataloader wait not measured on any steady-state step (iterate a torch DataLoader in "
        "auto mode, or wrap the loader: prof.wrap_dataloader(loader))";
  } else {
    s.fraction = view.training_breakdown.wait_fraction;
  }
  return s;
}

namespace {

// One steady-state step's collectives: the length of the union of its bucket intervals (time
// with any collective in flight) and its bucket rows.
struct StepComm {
  const StepView* step = nullptr;
  int64_t union_ns = 0;
  size_t rows = 0;
  size_t syncs = 0;  // the most rows one bucket has in the step (1: reduced once)
};

// The steady-state steps that have comm_buckets rows, in step order.
std::vector<StepComm> SteadyStepComm(const RunView& view) {
  std::vector<StepComm> out;
  if (view.data.comm_buckets.empty() || view.steady_count() == 0) return out;
  struct StepSpans {
    std::vector<std::pair<int64_t, int64_t>> spans;
    size_t rows = 0;
    std::map<int64_t, size_t> per_bucket;
  };
  std::map<int64_t, StepSpans> by_step;
  for (const auto& b : view.data.comm_buckets) {
    StepSpans& ss = by_step[b.step];
    ++ss.rows;
    ++ss.per_bucket[b.bucket];
    if (b.end_ns > b.start_ns) ss.spans.emplace_back(b.start_ns, b.end_ns);
  }
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    const StepView& s = view.steps[i];
    auto it = by_step.find(s.step);
    if (it == by_step.end()) continue;
    auto& spans = it->second.spans;
    std::sort(spans.begin(), spans.end());
    int64_t union_ns = 0, cur_start = 0, cur_end = 0;
    bool open = false;
    for (const auto& [a, b] : spans) {
      if (!open || a > cur_end) {
        if (open) union_ns += cur_end - cur_start;
        cur_start = a;
        cur_end = b;
        open = true;
      } else {
        cur_end = std::max(cur_end, b);
      }
    }
    if (open) union_ns += cur_end - cur_start;
    size_t syncs = 0;
    for (const auto& [bucket, n] : it->second.per_bucket) syncs = std::max(syncs, n);
    out.push_back(StepComm{&s, union_ns, it->second.rows, syncs});
  }
  return out;
}

}  // namespace

const store::InsightRow* LeadingFinding(const std::vector<store::InsightRow>& insights) {
  for (const store::InsightRow& in : insights) {
    if (in.family != "distributed" && in.severity != "info") return &in;
  }
  return nullptr;
}

std::string LeadText(const store::InsightRow* lead, const std::string& whose) {
  if (!lead) return "";
  std::string tag = lead->severity;
  for (char& c : tag) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return "; " + whose + " own report leads with [" + tag + "] " + lead->message;
}

nlohmann::json LeadEvidence(const store::InsightRow* lead) {
  if (!lead) return nlohmann::json();
  return {{"rule_id", lead->rule_id}, {"severity", lead->severity}};
}

std::optional<std::string> LeadFix(const std::string& rank, const store::InsightRow* lead) {
  if (!lead || !lead->fix) return std::nullopt;
  return StrFormat("Start with %s's own finding (%s): %s", rank.c_str(), lead->rule_id.c_str(),
                   lead->fix->c_str());
}

std::optional<EpochStarts> MeasureEpochStarts(const RunView& view) {
  EpochStarts e;
  bool measured = false;
  std::vector<double> other_waits;
  std::vector<const StepView*> starts;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    const StepView& s = view.steps[i];
    if (view.evaluation_steps.Has(s.step)) continue;
    e.step_total_ns += static_cast<double>(s.duration_ns);
    if (!s.loader_starts || !s.wait_ns) continue;
    measured = true;
    e.wait_total_ns += static_cast<double>(*s.wait_ns);
    if (*s.loader_starts > 0) {
      starts.push_back(&s);
    } else {
      other_waits.push_back(static_cast<double>(*s.wait_ns));
    }
  }
  if (!measured) return std::nullopt;
  e.median_wait_ns = Median(other_waits).value_or(0.0);
  for (const StepView* s : starts) {
    e.steps.push_back(s->step);
    e.excess_ns += std::max(0.0, static_cast<double>(*s->wait_ns) - e.median_wait_ns);
    e.start_ns += static_cast<double>(s->loader_start_ns.value_or(0));
  }
  return e;
}

std::vector<StepOther> SteadyOtherTimes(const RunView& view) {
  std::vector<StepOther> out;
  const bool measured = LoaderWaitMeasured(view.steps, view.steady_begin);
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    const StepView& s = view.steps[i];
    const auto wait = LoaderWaitNs(s, measured);
    if (!wait || s.phases.empty()) continue;
    out.push_back({&s, static_cast<double>(s.duration_ns - *wait - s.phase_wall_ns)});
  }
  return out;
}

nlohmann::json PeriodJson(const std::vector<int64_t>& steps) {
  const auto period = StepPeriod(steps);
  return period ? nlohmann::json(*period) : nlohmann::json();
}

std::string StepSetSubject(const std::vector<int64_t>& steps) {
  std::string which = FormatStepSet(steps);
  if (which.find(", every") != std::string::npos) which += ",";  // "4 steps, every 25th (…),"
  return which;
}

std::set<int64_t> ProfiledSteps(const RunView& view) {
  std::set<int64_t> out;
  for (const auto& op : view.data.cpu_ops) {
    if (!op.step) continue;
    out.insert(*op.step);
    out.insert(*op.step + 1);
  }
  return out;
}

std::optional<CommShare> MeasureCommShare(const RunView& view) {
  CommShare share;
  for (const StepComm& c : SteadyStepComm(view)) {
    ++share.steps;
    share.comm_ns += static_cast<double>(c.union_ns);
    share.step_ns += static_cast<double>(c.step->duration_ns);
    share.buckets += static_cast<double>(c.rows);
    share.syncs += static_cast<double>(c.syncs);
    share.backward_passes += static_cast<double>(c.step->backward_calls);
    if (c.syncs > 1) ++share.multi_sync_steps;
  }
  if (share.steps == 0) return std::nullopt;
  return share;
}

std::optional<PeerWaitShare> MeasurePeerWait(const RunView& view, const PeerWaits& peers) {
  PeerWaitShare share;
  std::vector<size_t> last_counts(peers.peers.size(), 0);
  for (const StepComm& c : SteadyStepComm(view)) {
    ++share.comm_steps;
    auto it = peers.steps.find(c.step->step);
    if (it == peers.steps.end()) continue;
    ++share.steps;
    // Waiting happens inside the collectives: never more than the step had one in flight.
    const int64_t wait = std::clamp<int64_t>(it->second.wait_ns, 0, c.union_ns);
    share.wait_ns += static_cast<double>(wait);
    share.step_ns += static_cast<double>(c.step->duration_ns);
    const int last = it->second.last_peer;
    if (wait > 0 && last >= 0 && static_cast<size_t>(last) < last_counts.size()) {
      ++share.waited_steps;
      ++last_counts[static_cast<size_t>(last)];
    }
  }
  if (share.steps == 0) return std::nullopt;
  const auto top = std::max_element(last_counts.begin(), last_counts.end());
  if (top != last_counts.end() && *top > 0) {
    share.slowest = peers.peers[static_cast<size_t>(top - last_counts.begin())];
    share.slowest_steps = *top;
  }
  return share;
}

std::string RankLabel(const store::RunInfo& run) {
  if (run.rank) return StrFormat("rank %lld", static_cast<long long>(*run.rank));
  return StrFormat("run %lld", static_cast<long long>(run.run_id));
}

}  // namespace gpuprof::analysis::rules
