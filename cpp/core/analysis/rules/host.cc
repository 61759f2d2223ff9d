// Host rules: the machine around the GPU (dataloader workers, RAM and swap).
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
    return RuleResult::Skip(StrFormat("only %zu dataloader worker with a CPU reading; imbalance "
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
      {"hottest_pid", hottest_pid}, {"hottest_cpu_pct", hottest},
      {"fair_share_cpu_pct", fair}, {"workers", by_pid.size()},
      {"ratio", ratio},             {"threshold", kWorkerImbalanceRatio},
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

}  // namespace gpuprof::analysis::rules
