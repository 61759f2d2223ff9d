// Host rules: the machine around the GPU (dataloader workers, RAM and swap, the CPU itself).
#include <algorithm>
#include <map>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {

using namespace thresholds;

// Fires when the busiest dataloader worker (worker samples with role 'child') averages more
// than kWorkerImbalanceRatio × the workers' mean CPU (their fair share) and at least
// kWorkerMinCpuPct of a core. Each worker's CPU is the mean over its own samples (from the 10 s
// rollups, weighted by their reading counts), so workers restarted every epoch
// (persistent_workers=False) count as separate workers.
RuleResult WorkerImbalance(const RunView& view, const RuleContext&) {
  struct Acc {
    double sum = 0;
    int64_t n = 0;
  };
  std::map<int64_t, Acc> by_pid;
  int64_t child_rows = 0;
  for (const auto& w : view.data.worker_samples_10s) {
    if (w.role != "child") continue;
    child_rows += w.samples;
    if (!w.cpu_mean_pct || w.cpu_samples <= 0) continue;
    Acc& a = by_pid[w.pid];
    a.sum += *w.cpu_mean_pct * static_cast<double>(w.cpu_samples);
    a.n += w.cpu_samples;
  }
  if (child_rows == 0) {
    if (view.data.host_samples.empty()) {
      return RuleResult::Skip(HostMissing(view, "dataloader worker processes"));
    }
    return RuleResult::Skip(
        "no dataloader worker processes sampled (num_workers=0, or the workers were not "
        "children of the training process)");
  }
  if (by_pid.size() < 2) {
    return RuleResult::Skip(
        StrFormat("only %zu dataloader worker with a CPU reading; imbalance "
                  "needs at least 2 (num_workers >= 2, sampled for 1 s+)",
                  by_pid.size()));
  }
  double total = 0, hottest = -1;
  int64_t hottest_pid = 0;
  for (const auto& [pid, a] : by_pid) {
    const double mean = a.sum / static_cast<double>(a.n);
    total += mean;
    if (mean > hottest) {
      hottest = mean;
      hottest_pid = pid;
    }
  }
  const double fair = total / static_cast<double>(by_pid.size());
  if (hottest < kWorkerMinCpuPct || fair <= 0) return RuleResult::Pass();
  const double ratio = hottest / fair;
  if (ratio <= kWorkerImbalanceRatio) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"hottest_pid", hottest_pid},
      {"hottest_cpu_pct", hottest},
      {"fair_share_cpu_pct", fair},
      {"workers", by_pid.size()},
      {"ratio", ratio},
      {"threshold", kWorkerImbalanceRatio},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("Dataloader worker pid %lld averages %s of a core, %s its fair share (%s across "
                "%zu workers): one worker does most of the loading",
                static_cast<long long>(hottest_pid), FormatPercent(hottest / 100).c_str(),
                FormatRatio(ratio).c_str(), FormatPercent(fair / 100).c_str(), by_pid.size()),
      std::move(evidence));
}

// Fires when the host swaps in more than kSwapInMBps on average over the run.
RuleResult HostMemoryPressure(const RunView& view, const RuleContext&) {
  const HostAggregates& h = view.host;
  if (!h.mean_swap_in_bps) return RuleResult::Skip(HostMissing(view, "swap-in rate"));
  if (*h.mean_swap_in_bps <= kSwapInMBps * 1e6) return RuleResult::Pass();
  std::string ram;
  if (h.peak_mem_used_bytes && h.mem_total_bytes && *h.mem_total_bytes > 0) {
    ram = StrFormat(" with up to %s of %s RAM in use (%s)",
                    FormatBytes(*h.peak_mem_used_bytes).c_str(),
                    FormatBytes(*h.mem_total_bytes).c_str(),
                    FormatPercent(*h.peak_mem_used_bytes / *h.mem_total_bytes).c_str());
  }
  auto opt = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json();
  };
  nlohmann::json evidence = {
      {"mean_swap_in_bps", *h.mean_swap_in_bps},
      {"max_swap_in_bps", opt(h.max_swap_in_bps)},
      {"peak_mem_used_bytes", opt(h.peak_mem_used_bytes)},
      {"mem_total_bytes", opt(h.mem_total_bytes)},
      {"threshold_mbps", kSwapInMBps},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("The host swapped in %s on average (peak %s)%s: the OS is paging memory back "
                "from disk",
                FormatBandwidth(*h.mean_swap_in_bps).c_str(),
                FormatBandwidth(h.max_swap_in_bps.value_or(*h.mean_swap_in_bps)).c_str(),
                ram.c_str()),
      std::move(evidence));
}

// Fires when, over the steady-state steps, the process was held off the CPU (stall watch) for at
// least kHostStallShare of step time in at least kHostStallMinCount stalls. A stall is counted
// in the steady state by its overlap with the steady window.
RuleResult HostStalls(const RunView& view, const RuleContext&) {
  if (!view.stalls_watched) {
    const store::TelemetryStatusRow* t = view.Telemetry("stalls");
    if (t && t->reason) return RuleResult::Skip("no stall watch: " + *t->reason);
    return RuleResult::Skip(
        "no stall watch in this run (host telemetry off, or recorded by a gpuprof before the "
        "watch)");
  }
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const auto window = view.SteadyWindow();
  if (!window) return RuleResult::Skip("no steady state");
  const auto [from, to] = *window;
  size_t count = 0;
  int64_t longest = 0;
  for (const store::StallRow& st : view.data.stalls) {
    const int64_t begin = std::max(st.start_ns, from);
    const int64_t end = std::min(st.start_ns + st.duration_ns, to);
    if (end <= begin) continue;
    ++count;
    longest = std::max(longest, st.duration_ns);
  }
  double stalled = 0;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    stalled += static_cast<double>(view.steps[i].stalled_ns.value_or(0));
  }
  const double total = view.breakdown.total_ns;
  if (total <= 0) return RuleResult::Skip("steady-state step time is 0");
  const double share = stalled / total;
  if (count < kHostStallMinCount || share < kHostStallShare) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"stalls", count},
      {"stalled_ns", stalled},
      {"longest_ns", longest},
      {"steady_total_ns", total},
      {"share", share},
      {"threshold_share", kHostStallShare},
      {"threshold_min_count", kHostStallMinCount},
      {"watch_threshold_ns", static_cast<double>(telemetry::kStallWatchThreshold.count())},
      {"mean_host_cpu_pct",
       view.host.mean_cpu_pct ? nlohmann::json(*view.host.mean_cpu_pct) : nlohmann::json()},
  };
  return RuleResult::Fire(
      share >= kHostStallMedShare ? Severity::kMed : Severity::kLow,
      StrFormat("The process was held off the CPU %zu times in the steady state, %s in all (%s "
                "of step time; longest %s): those steps were slow whatever its code did",
                count, FormatDuration(stalled).c_str(), FormatPercent(share).c_str(),
                FormatDuration(static_cast<double>(longest)).c_str()),
      std::move(evidence));
}

// Fires when, over the steady-state steps, the training's threads queued for a CPU (CPU wait:
// run-queue time of its threads, gpuprof's own left out) for at least kCpuWaitShare of step
// time. Says whose load it is from the host samples: other processes' (MeasureOtherLoad, the
// least over the window at least kOtherLoadCores), else the job's other ranks' on this host
// (their mean at least kOtherLoadCores), else the training's own threads, and gives the fix for
// that case.
RuleResult CpuContention(const RunView& view, const RuleContext&) {
  if (!view.cpu_wait_watched) {
    const store::TelemetryStatusRow* t = view.Telemetry("cpu_wait");
    if (t && t->reason) return RuleResult::Skip("CPU wait not read: " + *t->reason);
    return RuleResult::Skip(
        "CPU wait not read in this run (host telemetry off, or recorded by a gpuprof before it "
        "read it)");
  }
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const auto measured = SteadyCpuWaitShare(view);
  if (!measured) return RuleResult::Skip("steady-state step time is 0");
  const double share = *measured;
  if (share < kCpuWaitShare) return RuleResult::Pass();
  const double total = view.breakdown.total_ns;
  const double waited = share * total;
  const StepView* worst = &view.steps[view.steady_begin];
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    const StepView& st = view.steps[i];
    if (st.cpu_wait_ns.value_or(0) > worst->cpu_wait_ns.value_or(0)) worst = &st;
  }
  const auto others = MeasureOtherLoad(SteadyHostSamples(view));
  // Whose load: processes outside the job, else the job's other ranks on this host, else the
  // training's own threads.
  const bool others_load = others && others->min_cores >= kOtherLoadCores;
  const bool job_load = others && !others_load && others->job_mean_cores &&
                        *others->job_mean_cores >= kOtherLoadCores;
  const bool own_threads = others && !others_load && !job_load;
  std::string whose;
  std::string job_too;
  if (others && others->job_mean_cores) {
    job_too = StrFormat(" (besides the job's other ranks on this host, about %s)",
                        FormatCompact(*others->job_mean_cores).c_str());
  }
  if (others_load) {
    whose = StrFormat(": other processes kept about %s of the host's %s cores busy%s",
                      FormatCompact(others->mean_cores).c_str(),
                      FormatCompact(others->ncores).c_str(), job_too.c_str());
  } else if (job_load) {
    whose = StrFormat(
        ": the job's other ranks on this host kept about %s of its %s cores busy, this rank "
        "about %s (processes outside the job under %s of a core)",
        FormatCompact(*others->job_mean_cores).c_str(), FormatCompact(others->ncores).c_str(),
        FormatCompact(others->own_mean_cores).c_str(), FormatCompact(kOtherLoadCores).c_str());
  } else if (own_threads) {
    whose = StrFormat(
        ": the training's own threads and processes outnumber the host's %s "
        "cores (other processes used under %s of a core)",
        FormatCompact(others->ncores).c_str(), FormatCompact(kOtherLoadCores).c_str());
  }
  nlohmann::json evidence = {
      {"cpu_wait_ns", waited},
      {"steady_total_ns", total},
      {"share", share},
      {"worst_step", worst->step},
      {"worst_step_wait_ns", worst->cpu_wait_ns.value_or(0)},
      {"worst_step_duration_ns", worst->duration_ns},
      {"other_load_mean_cores", others ? nlohmann::json(others->mean_cores) : nlohmann::json()},
      {"other_load_min_cores", others ? nlohmann::json(others->min_cores) : nlohmann::json()},
      {"ncores", others ? nlohmann::json(others->ncores) : nlohmann::json()},
      {"job_load_mean_cores", others && others->job_mean_cores
                                  ? nlohmann::json(*others->job_mean_cores)
                                  : nlohmann::json()},
      {"other_load", others_load},
      {"job_load", job_load},
      {"own_threads", own_threads},
      {"threshold_share", kCpuWaitShare},
      {"threshold_other_load_cores", kOtherLoadCores},
  };
  const Severity severity = share >= kCpuWaitHighShare  ? Severity::kHigh
                            : share >= kCpuWaitMedShare ? Severity::kMed
                                                        : Severity::kLow;
  RuleResult r = RuleResult::Fire(
      severity,
      StrFormat("The training's threads queued %s for a CPU in the steady state (%s of step "
                "time; step %lld waited %s of its %s)%s",
                FormatDuration(waited).c_str(), FormatPercent(share).c_str(),
                static_cast<long long>(worst->step),
                FormatDuration(static_cast<double>(worst->cpu_wait_ns.value_or(0))).c_str(),
                FormatDuration(static_cast<double>(worst->duration_ns)).c_str(), whose.c_str()),
      std::move(evidence));
  if (others_load) r.insight->fix = kCpuContentionOthersFix;
  if (job_load) r.insight->fix = kCpuContentionJobFix;
  if (own_threads) r.insight->fix = kCpuContentionOwnFix;
  return r;
}

}  // namespace gpuprof::analysis::rules
