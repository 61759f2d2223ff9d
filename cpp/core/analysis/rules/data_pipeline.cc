// Data-pipeline rules: is the GPU (or CPU) starving for input, and why?
#include <algorithm>
#include <cmath>
#include <map>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"
#include "store/rollup.h"

namespace gpuprof::analysis::rules {
namespace {

using namespace thresholds;

// "95% average across 16 cores" / "95% average".
std::string CpuText(double pct, const std::optional<double>& ncores) {
  std::string out = FormatPercent(pct / 100) + " average";
  if (ncores) out += StrFormat(" across %.0f cores", *ncores);
  return out;
}

std::optional<double> MaxNcores(const std::vector<const store::HostSampleRow*>& rows) {
  std::optional<double> n;
  for (const auto* r : rows) {
    if (r->ncores) n = std::max(n.value_or(0), static_cast<double>(*r->ncores));
  }
  return n;
}

// Samples in [begin, end] (run-relative ns).
std::vector<const store::HostSampleRow*> HostBetween(const RunView& view, int64_t begin,
                                                     int64_t end) {
  std::vector<const store::HostSampleRow*> out;
  for (const auto& r : view.data.host_samples) {
    if (r.ts_ns >= begin && r.ts_ns <= end) out.push_back(&r);
  }
  return out;
}

// Whether the host CPU readings of a window are enough to judge the machine by: at least
// kHostMinSamples of them, covering at least kHostMinCoverageS (a reading is the rate over the
// interval since the previous host sample). nullopt when enough, else the "not evaluated"
// reason.
std::optional<std::string> NeedHostCoverage(const RunView& view, const HostWindow& w) {
  const auto& all = view.data.host_samples;
  size_t readings = 0;
  int64_t covered_ns = 0;
  for (const auto* r : w.samples) {
    if (!r->cpu_pct) continue;
    ++readings;
    const size_t i = static_cast<size_t>(r - all.data());
    if (i > 0 && i < all.size() && r->ts_ns > all[i - 1].ts_ns) {
      covered_ns += r->ts_ns - all[i - 1].ts_ns;
    }
  }
  if (readings >= kHostMinSamples && static_cast<double>(covered_ns) >= kHostMinCoverageS * 1e9) {
    return std::nullopt;
  }
  const char* where = w.steady ? "in the steady state" : "in the run";
  if (readings >= kHostMinSamples) {  // enough readings: the span is what is short
    return StrFormat(
        "the %zu host CPU readings cover only %s %s; deciding needs them to "
        "cover at least %s (run longer)",
        readings, FormatDuration(static_cast<double>(covered_ns)).c_str(), where,
        FormatDuration(kHostMinCoverageS * 1e9).c_str());
  }
  return StrFormat(
      "only %zu host CPU reading%s covering %s %s; deciding needs at least %zu "
      "covering %s (run longer, or raise profile(host_hz=))",
      readings, readings == 1 ? "" : "s", FormatDuration(static_cast<double>(covered_ns)).c_str(),
      where, kHostMinSamples, FormatDuration(kHostMinCoverageS * 1e9).c_str());
}

// The training's process tree over a host window: its CPU at its busiest (the highest
// proc_cpu_pct reading, in cores: workers join the sampled tree only at the sampler's next
// rescan, so in a short run most readings may undercount it) and the cores it can use: one per
// process (the mean number of its processes alive, from the worker rollups), or as many as it used
// (threads), at most the machine's. nullopt when the tree's CPU was not sampled.
struct TreeCpu {
  double busy_cores = 0;  // the highest proc_cpu_pct / 100
  double usable_cores = 1;
  double processes = 1;
  bool workers = false;  // child processes (DataLoader workers) were sampled
  double busy_fraction() const { return usable_cores > 0 ? busy_cores / usable_cores : 1; }
};

std::optional<TreeCpu> MeasureTreeCpu(const RunView& view, const HostWindow& w,
                                      const std::optional<double>& ncores) {
  std::vector<double> cores;
  int64_t lo = 0, hi = 0;
  for (const auto* r : w.samples) {
    if (!r->proc_cpu_pct) continue;
    if (cores.empty() || r->ts_ns < lo) lo = r->ts_ns;
    if (cores.empty() || r->ts_ns > hi) hi = r->ts_ns;
    cores.push_back(*r->proc_cpu_pct / 100);
  }
  if (cores.empty()) return std::nullopt;
  TreeCpu t;
  t.busy_cores = *std::max_element(cores.begin(), cores.end());
  // Processes alive on average in a 10 s worker window: the samples of all its pids over the
  // main process's (alive throughout), so workers restarted every epoch are not counted twice.
  std::map<int64_t, std::pair<int64_t, int64_t>> windows;  // ts -> (all samples, main samples)
  for (const auto& row : view.data.worker_samples_10s) {
    if (row.ts_ns > hi || row.ts_ns + store::kWorkerRollupNs <= lo) continue;
    auto& [all, main] = windows[row.ts_ns];
    all += row.samples;
    if (row.role == "main") main = std::max(main, row.samples);
    if (row.role == "child") t.workers = true;
  }
  for (const auto& [ts, counts] : windows) {
    if (counts.second > 0) {
      t.processes = std::max(
          t.processes, static_cast<double>(counts.first) / static_cast<double>(counts.second));
    }
  }
  t.usable_cores = std::max(t.processes, t.busy_cores);
  if (ncores) t.usable_cores = std::min(t.usable_cores, std::max(1.0, *ncores));
  return t;
}

}  // namespace

// Fires when the steady-state dataloader wait exceeds kStallFraction of step time.
// Wait is measured per step (gap: previous step end -> first model call; explicit: time
// inside wrap_dataloader's next()). Steps without a measured wait (step 0's gap) are left
// out of both numerator and denominator.
RuleResult DataloaderStall(const RunView& view, const RuleContext&) {
  const Stall stall = MeasureStall(view);
  if (!stall.fraction) return RuleResult::Skip(stall.reason);
  if (!stall.stalled()) return RuleResult::Pass();
  const Breakdown& b = *stall.breakdown;
  const double f = *stall.fraction;
  // How much of the wait is the loader starting at each epoch (loader_epoch_start explains the
  // stall when that is most of it).
  std::optional<double> epoch_start_share;
  if (const auto starts = MeasureEpochStarts(view); starts && b.wait_total_ns > 0) {
    epoch_start_share = std::min(1.0, starts->excess_ns / b.wait_total_ns);
  }
  nlohmann::json evidence = {
      {"wait_fraction", f},
      {"epoch_start_share",
       epoch_start_share ? nlohmann::json(*epoch_start_share) : nlohmann::json()},
      {"epoch_start_caused", epoch_start_share && *epoch_start_share >= kEpochStartStallShare},
      {"evaluation_steps_left_out", stall.evaluation_steps_left_out},
      {"wait_total_ns", b.wait_total_ns},
      {"step_total_ns", b.wait_duration_ns},
      {"steps", b.wait_steps},
      {"mean_wait_ns", b.wait_total_ns / static_cast<double>(b.wait_steps)},
      {"wait_source", b.wait_source ? nlohmann::json(*b.wait_source) : nlohmann::json()},
      {"gap_steps_without_loader", b.gap_steps_without_loader},
      {"threshold", kStallFraction},
  };
  return RuleResult::Fire(
      stall.severity(),
      StrFormat("%s of step time waiting on the loader (%s%s)", FormatPercent(f).c_str(),
                WaitSourceLabel(b.wait_source).c_str(), stall.LeftOutText().c_str()),
      std::move(evidence));
}

// Fires when the steady-state steps that started the loader's worker processes (an epoch's
// iter(loader) without persistent_workers: MeasureEpochStarts) waited, above the other steps'
// median wait, at least kEpochStartShare of steady-state step time in all.
RuleResult LoaderEpochStart(const RunView& view, const RuleContext&) {
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const auto e = MeasureEpochStarts(view);
  if (!e) {
    return RuleResult::Skip(
        "no steady-state wait measured inside a torch DataLoader (auto mode measures its iter() "
        "and next(); wrap_dataloader and older files do not say which waits started the "
        "loader)");
  }
  if (e->steps.empty() || e->step_total_ns <= 0) return RuleResult::Pass();
  const double share = e->excess_ns / e->step_total_ns;
  if (share < kEpochStartShare) return RuleResult::Pass();
  const double n = static_cast<double>(e->steps.size());
  const double loader_share = e->wait_total_ns > 0 ? e->excess_ns / e->wait_total_ns : 0.0;
  nlohmann::json evidence = {
      {"starts", e->steps.size()},
      {"first_start_step", e->steps.front()},
      {"start_period", PeriodJson(e->steps)},
      {"excess_ns", e->excess_ns},
      {"mean_excess_ns", e->excess_ns / n},
      {"mean_iter_ns", e->start_ns / n},
      {"median_wait_ns", e->median_wait_ns},
      {"share", share},
      {"loader_wait_share", loader_share},
      {"threshold", kEpochStartShare},
  };
  const std::string which = StepSetSubject(e->steps);
  return RuleResult::Fire(
      share >= kStallHighFraction ? Severity::kHigh : Severity::kMed,
      StrFormat("Each epoch's start waits for the loader: %s waited %s more%s than the other "
                "steps' median %s (%s of it inside iter(loader), starting its worker processes; "
                "the rest for their first batch): %s of step time, %s of the loader wait",
                which.c_str(), FormatDuration(e->excess_ns / n).c_str(),
                e->steps.size() == 1 ? "" : " each", FormatDuration(e->median_wait_ns).c_str(),
                FormatDuration(e->start_ns / n).c_str(), FormatPercent(share).c_str(),
                FormatPercent(loader_share).c_str()),
      std::move(evidence));
}

// Fires when, over the steady-state steps whose wait was measured inside the loader (torch
// DataLoader next() in auto mode, or wrap_dataloader), at least kStarvedStepFraction waited
// longer than kStarvedWaitMs: the prefetch queue was empty when the loop asked for the next
// batch. Gap waits do not count (they include anything between steps); only measured waits
// say the loader itself had nothing ready.
RuleResult PrefetchQueueStarved(const RunView& view, const RuleContext&) {
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  size_t measured = 0, starved = 0;
  std::vector<double> starved_waits;
  const double limit_ns = kStarvedWaitMs * 1e6;
  for (size_t i = view.steady_begin; i < view.steps.size(); ++i) {
    const StepView& s = view.steps[i];
    if (!s.wait_ns || !s.wait_source ||
        (*s.wait_source != "explicit" && *s.wait_source != "dataloader")) {
      continue;
    }
    ++measured;
    if (static_cast<double>(*s.wait_ns) > limit_ns) {
      ++starved;
      starved_waits.push_back(static_cast<double>(*s.wait_ns));
    }
  }
  if (measured == 0) {
    return RuleResult::Skip(
        "no wait measured inside the loader on steady-state steps (a torch DataLoader is "
        "measured in auto mode; wrap any other loader: prof.wrap_dataloader(loader))");
  }
  const double share = static_cast<double>(starved) / static_cast<double>(measured);
  if (share < kStarvedStepFraction) return RuleResult::Pass();
  const double median_wait = *Median(starved_waits);
  nlohmann::json evidence = {
      {"starved_steps", starved},
      {"measured_steps", measured},
      {"starved_fraction", share},
      {"median_starved_wait_ns", median_wait},
      {"wait_threshold_ms", kStarvedWaitMs},
      {"threshold", kStarvedStepFraction},
  };
  return RuleResult::Fire(
      share >= kStarvedHighFraction ? Severity::kHigh : Severity::kMed,
      StrFormat("the loader's next() waited over %s for a batch on %s of steps (%zu of %zu, "
                "median %s): the prefetch queue runs dry",
                FormatDuration(limit_ns).c_str(), FormatPercent(share).c_str(), starved, measured,
                FormatDuration(median_wait).c_str()),
      std::move(evidence));
}

// Fires on a dataloader stall while the host CPU averages above kCpuBoundPct over the steady
// state and the disk is idle (mean read below kDiskIdleMBps and, if sampled, IOPS below
// kDiskIdleIops): the loader workers are busy computing, not waiting on storage. Decided only
// from enough host readings (NeedHostCoverage). When the training's process tree was sampled,
// it must itself be busy (TreeCpu::busy_fraction() at least kCpuBoundTreeBusy): a machine
// pegged by other processes while the training's processes idle says nothing about its loader,
// so the rule passes and dataloader_stall reports the stall alone. Likewise when processes
// outside the job keep at least kOtherLoadCores busy throughout (MeasureOtherLoad's least; the
// job's other ranks on the host are the job's own load) and the training's threads queue for a
// CPU (at least kCpuWaitShare of step time): the host is contended, and the training's own CPU
// may be torch's threads spinning while they wait, not loading; cpu_contention reports that.
RuleResult CpuBoundDataloader(const RunView& view, const RuleContext&) {
  const Stall stall = MeasureStall(view);
  if (!stall.fraction) return RuleResult::Skip(stall.reason);
  if (!stall.stalled()) return RuleResult::Pass();
  const HostWindow w = SteadyHostSamples(view);
  const auto cpu = MeanOf(w.samples, &store::HostSampleRow::cpu_pct);
  if (!cpu) return RuleResult::Skip(HostMissing(view, "host CPU"));
  const auto disk = MeanOf(w.samples, &store::HostSampleRow::disk_read_bps);
  if (!disk) return RuleResult::Skip(HostMissing(view, "disk reads"));
  if (auto why = NeedHostCoverage(view, w)) return RuleResult::Skip(*why);
  const auto iops = MeanOf(w.samples, &store::HostSampleRow::disk_read_iops);
  if (*cpu <= kCpuBoundPct) return RuleResult::Pass();
  if (*disk >= kDiskIdleMBps * 1e6 || (iops && *iops >= kDiskIdleIops)) return RuleResult::Pass();
  const auto ncores = MaxNcores(w.samples);
  const auto tree = MeasureTreeCpu(view, w, ncores);
  if (tree && tree->busy_fraction() < kCpuBoundTreeBusy) return RuleResult::Pass();
  const auto others = MeasureOtherLoad(w);
  const auto cpu_wait = SteadyCpuWaitShare(view);
  if (others && others->min_cores >= kOtherLoadCores && cpu_wait && *cpu_wait >= kCpuWaitShare) {
    return RuleResult::Pass();
  }
  std::string cpu_text = CpuText(*cpu, ncores);
  const char* who = "the loader workers are CPU-bound";
  if (tree) {
    cpu_text += StrFormat("; the training's processes busy on up to %s cores",
                          FormatCompact(tree->busy_cores).c_str());
    if (!tree->workers) {
      who =
          "the loading runs in the training process (no worker processes seen) and is "
          "CPU-bound";
    }
  }
  nlohmann::json evidence = {
      {"wait_fraction", *stall.fraction},
      {"mean_cpu_pct", *cpu},
      {"ncores", ncores ? nlohmann::json(*ncores) : nlohmann::json()},
      {"mean_disk_read_bps", *disk},
      {"mean_disk_read_iops", iops ? nlohmann::json(*iops) : nlohmann::json()},
      {"tree_busy_cores_peak", tree ? nlohmann::json(tree->busy_cores) : nlohmann::json()},
      {"tree_usable_cores", tree ? nlohmann::json(tree->usable_cores) : nlohmann::json()},
      {"tree_processes", tree ? nlohmann::json(tree->processes) : nlohmann::json()},
      {"tree_workers", tree ? nlohmann::json(tree->workers) : nlohmann::json()},
      {"other_load_min_cores", others ? nlohmann::json(others->min_cores) : nlohmann::json()},
      {"cpu_wait_share", cpu_wait ? nlohmann::json(*cpu_wait) : nlohmann::json()},
      {"evaluation_steps_left_out", stall.evaluation_steps_left_out},
      {"window", w.steady ? "steady" : "run"},
      {"threshold_cpu_pct", kCpuBoundPct},
      {"threshold_tree_busy", kCpuBoundTreeBusy},
  };
  return RuleResult::Fire(
      stall.severity(),
      StrFormat("Dataloader stall (%s of step time%s) with the host CPU pegged (%s) and the "
                "disk idle (%s): %s",
                FormatPercent(*stall.fraction).c_str(), stall.LeftOutText().c_str(),
                cpu_text.c_str(), FormatBandwidth(*disk).c_str(), who),
      std::move(evidence));
}

// Fires on a dataloader stall while the disk reads more than kIoBoundMBps or kIoBoundIops on
// average over the steady state and the host CPU has headroom (mean below kIoCpuHeadroomPct):
// the loader waits on storage. Decided only from enough host readings (NeedHostCoverage).
RuleResult IoBoundDataloader(const RunView& view, const RuleContext&) {
  const Stall stall = MeasureStall(view);
  if (!stall.fraction) return RuleResult::Skip(stall.reason);
  if (!stall.stalled()) return RuleResult::Pass();
  const HostWindow w = SteadyHostSamples(view);
  const auto disk = MeanOf(w.samples, &store::HostSampleRow::disk_read_bps);
  const auto iops = MeanOf(w.samples, &store::HostSampleRow::disk_read_iops);
  if (!disk && !iops) return RuleResult::Skip(HostMissing(view, "disk reads"));
  const auto cpu = MeanOf(w.samples, &store::HostSampleRow::cpu_pct);
  if (!cpu) return RuleResult::Skip(HostMissing(view, "host CPU"));
  if (auto why = NeedHostCoverage(view, w)) return RuleResult::Skip(*why);
  const bool busy_bw = disk && *disk > kIoBoundMBps * 1e6;
  const bool busy_iops = iops && *iops > kIoBoundIops;
  if (!busy_bw && !busy_iops) return RuleResult::Pass();
  if (*cpu >= kIoCpuHeadroomPct) return RuleResult::Pass();
  std::string reads = disk ? FormatBandwidth(*disk) : std::string("throughput not sampled");
  if (iops) reads += ", " + FormatCount(*iops) + " IOPS";
  nlohmann::json evidence = {
      {"wait_fraction", *stall.fraction},
      {"mean_disk_read_bps", disk ? nlohmann::json(*disk) : nlohmann::json()},
      {"mean_disk_read_iops", iops ? nlohmann::json(*iops) : nlohmann::json()},
      {"mean_cpu_pct", *cpu},
      {"evaluation_steps_left_out", stall.evaluation_steps_left_out},
      {"window", w.steady ? "steady" : "run"},
      {"threshold_mbps", kIoBoundMBps},
      {"threshold_iops", kIoBoundIops},
  };
  return RuleResult::Fire(
      stall.severity(),
      StrFormat("Dataloader stall (%s of step time%s) while the disk reads %s on average and "
                "the host CPU has headroom (%s average): the input pipeline is I/O-bound",
                FormatPercent(*stall.fraction).c_str(), stall.LeftOutText().c_str(), reads.c_str(),
                FormatPercent(*cpu / 100).c_str()),
      std::move(evidence));
}

// Fires when the steady state's first third read at least kColdCacheReadRatio × the disk
// throughput of its last third (and at least kColdCacheMinMBps), while its median step was
// more than kColdCacheSpeedup slower: the first pass over the data came from cold storage and
// later passes from the page cache.
RuleResult ColdCache(const RunView& view, const RuleContext&) {
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const size_t n = view.steady_count();
  if (n < kColdCacheMinSteps) {
    return RuleResult::Skip(StrFormat("only %s; comparing thirds needs at least %zu",
                                      Plural(n, "steady-state step", "steady-state steps").c_str(),
                                      kColdCacheMinSteps));
  }
  const size_t third = n / 3;
  const size_t first_begin = view.steady_begin, first_end = view.steady_begin + third;
  const size_t last_begin = view.steps.size() - third, last_end = view.steps.size();
  const auto first_reads =
      HostBetween(view, view.steps[first_begin].start_ns, view.steps[first_end - 1].end_ns);
  const auto last_reads =
      HostBetween(view, view.steps[last_begin].start_ns, view.steps[last_end - 1].end_ns);
  const auto read_first = MeanOf(first_reads, &store::HostSampleRow::disk_read_bps);
  const auto read_last = MeanOf(last_reads, &store::HostSampleRow::disk_read_bps);
  if (!read_first || !read_last) {
    if (view.data.host_samples.empty()) return RuleResult::Skip(HostMissing(view, "disk reads"));
    return RuleResult::Skip(
        "disk reads not sampled in both the first and the last third of the "
        "steady state");
  }
  std::vector<double> d_first, d_last;
  for (size_t i = first_begin; i < first_end; ++i) d_first.push_back(view.steps[i].duration_ns);
  for (size_t i = last_begin; i < last_end; ++i) d_last.push_back(view.steps[i].duration_ns);
  const double step_first = *Median(d_first), step_last = *Median(d_last);
  if (*read_first < kColdCacheMinMBps * 1e6) return RuleResult::Pass();
  if (*read_first < kColdCacheReadRatio * *read_last) return RuleResult::Pass();
  if (step_last <= 0 || step_first <= (1 + kColdCacheSpeedup) * step_last) {
    return RuleResult::Pass();
  }
  nlohmann::json evidence = {
      {"first_third_read_bps", *read_first},
      {"last_third_read_bps", *read_last},
      {"first_third_median_ns", step_first},
      {"last_third_median_ns", step_last},
      {"steps_per_third", third},
      {"threshold_ratio", kColdCacheReadRatio},
  };
  return RuleResult::Fire(
      Severity::kLow,
      StrFormat("Disk reads fell from %s in the first third of the run to %s in the last while "
                "the median step sped up from %s to %s: the first pass read from a cold cache",
                FormatBandwidth(*read_first).c_str(), FormatBandwidth(*read_last).c_str(),
                FormatDuration(step_first).c_str(), FormatDuration(step_last).c_str()),
      std::move(evidence));
}

// Fires when the page cache peaks at kThrashCacheFraction of RAM or more while the median
// steady-state disk read stays above kThrashReadMBps: the cache is full and the data is still
// read from disk, so the working set does not fit in memory. MED when the loader also stalls,
// else LOW (the reads are not yet costing step time).
RuleResult CacheThrashing(const RunView& view, const RuleContext&) {
  std::optional<double> frac;
  const store::HostSampleRow* peak = nullptr;
  for (const auto& r : view.data.host_samples) {
    if (!r.page_cache_bytes || !r.mem_total_bytes || *r.mem_total_bytes <= 0) continue;
    const double f = static_cast<double>(*r.page_cache_bytes) / *r.mem_total_bytes;
    if (!frac || f > *frac) {
      frac = f;
      peak = &r;
    }
  }
  if (!frac) return RuleResult::Skip(HostMissing(view, "page cache or total RAM"));
  const HostWindow w = SteadyHostSamples(view);
  const auto reads = MedianOf(w.samples, &store::HostSampleRow::disk_read_bps);
  if (!reads) return RuleResult::Skip(HostMissing(view, "disk reads"));
  if (*frac < kThrashCacheFraction || *reads <= kThrashReadMBps * 1e6) return RuleResult::Pass();
  const Stall stall = MeasureStall(view);
  nlohmann::json evidence = {
      {"peak_page_cache_bytes", *peak->page_cache_bytes},
      {"mem_total_bytes", *peak->mem_total_bytes},
      {"page_cache_fraction", *frac},
      {"median_disk_read_bps", *reads},
      {"stalled", stall.stalled()},
      {"window", w.steady ? "steady" : "run"},
  };
  return RuleResult::Fire(
      stall.stalled() ? Severity::kMed : Severity::kLow,
      StrFormat("The page cache fills %s of RAM (%s of %s) yet the disk still reads %s (median) "
                "in the steady state: the data's working set does not fit in memory",
                FormatPercent(*frac).c_str(),
                FormatBytes(static_cast<double>(*peak->page_cache_bytes)).c_str(),
                FormatBytes(static_cast<double>(*peak->mem_total_bytes)).c_str(),
                FormatBandwidth(*reads).c_str()),
      std::move(evidence));
}

// Fires when the peak PCIe host-to-device (RX) throughput of any GPU exceeds kPcieRxGBps. Reads
// the per-second rollups: the peak is the largest per-second maximum, the mean is over every
// reading, and the readings above the threshold were counted while rolling up
// (pcie_rx_high_samples; kPcieRxGBps is that rollup criterion).
RuleResult PcieSaturation(const RunView& view, const RuleContext&) {
  const store::GpuRollupRow* peak = nullptr;
  double sum = 0;
  int64_t n = 0, above = 0;
  for (const auto& s : view.data.gpu_samples_1s) {
    if (!s.pcie_rx_max_bps) continue;
    if (s.pcie_rx_mean_bps && s.pcie_rx_samples > 0) {
      sum += *s.pcie_rx_mean_bps * static_cast<double>(s.pcie_rx_samples);
      n += s.pcie_rx_samples;
    }
    above += s.pcie_rx_high_samples;
    if (!peak || *s.pcie_rx_max_bps > *peak->pcie_rx_max_bps) peak = &s;
  }
  if (!peak) return RuleResult::Skip(GpuMissing(view, "PCIe throughput"));
  if (*peak->pcie_rx_max_bps <= kPcieRxGBps * 1e9) return RuleResult::Pass();
  const double mean = n > 0 ? sum / static_cast<double>(n) : *peak->pcie_rx_max_bps;
  const double share = n > 0 ? static_cast<double>(above) / static_cast<double>(n) : 0;
  nlohmann::json evidence = {
      {"peak_rx_bps", *peak->pcie_rx_max_bps},
      {"gpu_index", peak->gpu_index},
      {"mean_rx_bps", mean},
      {"samples_above", above},
      {"samples", n},
      {"threshold_gbps", kPcieRxGBps},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("PCIe host-to-device traffic peaked at %s on GPU %lld (mean %s; above %s on %s "
                "of samples): input copies are bandwidth-bound",
                FormatBandwidth(*peak->pcie_rx_max_bps).c_str(),
                static_cast<long long>(peak->gpu_index), FormatBandwidth(mean).c_str(),
                FormatBandwidth(kPcieRxGBps * 1e9).c_str(), FormatPercent(share).c_str()),
      std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
