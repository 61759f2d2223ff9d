#include "analysis/run_view.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

namespace gpuprof::analysis {
namespace {

// Running min / max / mean over optional readings; nullopt readings are skipped.
class OptStat {
 public:
  template <typename T>
  void Add(const std::optional<T>& v) {
    if (v) Add(static_cast<double>(*v));
  }
  void Add(double v) {
    if (!std::isfinite(v)) return;
    if (count_ == 0 || v < min_) min_ = v;
    if (count_ == 0 || v > max_) max_ = v;
    sum_ += v;
    ++count_;
  }
  std::optional<double> mean() const {
    return count_ ? std::optional<double>(sum_ / count_) : std::nullopt;
  }
  std::optional<double> min() const { return count_ ? std::optional<double>(min_) : std::nullopt; }
  std::optional<double> max() const { return count_ ? std::optional<double>(max_) : std::nullopt; }

 private:
  size_t count_ = 0;
  double sum_ = 0, min_ = 0, max_ = 0;
};

int PhaseOrder(const std::string& name) {
  if (name == "forward") return 0;
  if (name == "backward") return 1;
  if (name == "optimizer") return 2;
  return 3;
}

// Mean of per-row means weighted by their reading counts: the mean over every reading.
class WeightedMean {
 public:
  void Add(const std::optional<double>& mean, int64_t n) {
    if (!mean || n <= 0 || !std::isfinite(*mean)) return;
    sum_ += *mean * static_cast<double>(n);
    n_ += n;
  }
  std::optional<double> mean() const {
    return n_ ? std::optional<double>(sum_ / static_cast<double>(n_)) : std::nullopt;
  }

 private:
  double sum_ = 0;
  int64_t n_ = 0;
};

// From the per-second rollups (gpu_samples_1s): the same values as over the raw samples,
// since every mean carries its reading count and every extreme is an extreme of extremes.
// peak_mem_fraction divides each second's peak use by its (largest) total.
GpuAggregates AggregateGpu(const store::RunData& d) {
  GpuAggregates g;
  OptStat util_max, mem_used, mem_total, mem_frac, proc_mem, temp, power_max, clock_min, clock_max,
      rx, tx;
  WeightedMean util, power;
  std::set<int64_t> indices;
  for (const auto& s : d.gpu_samples_1s) {
    g.samples += static_cast<size_t>(std::max<int64_t>(0, s.samples));
    indices.insert(s.gpu_index);
    util.Add(s.util_mean_pct, s.util_samples);
    util_max.Add(s.util_max_pct);
    mem_used.Add(s.mem_used_max_bytes);
    mem_total.Add(s.mem_total_bytes);
    if (s.mem_used_max_bytes && s.mem_total_bytes && *s.mem_total_bytes > 0) {
      mem_frac.Add(static_cast<double>(*s.mem_used_max_bytes) / *s.mem_total_bytes);
    }
    proc_mem.Add(s.proc_mem_max_bytes);
    temp.Add(s.temp_max_c);
    if (s.power_mean_mw) power.Add(*s.power_mean_mw / 1000.0, s.power_samples);
    if (s.power_max_mw) power_max.Add(*s.power_max_mw / 1000.0);
    clock_min.Add(s.sm_clock_min_mhz);
    clock_max.Add(s.sm_clock_max_mhz);
    rx.Add(s.pcie_rx_max_bps);
    tx.Add(s.pcie_tx_max_bps);
  }
  for (const auto& info : d.gpus) mem_total.Add(info.memory_total_bytes);
  g.gpus_sampled = indices.size();
  g.mean_util_pct = util.mean();
  g.max_util_pct = util_max.max();
  g.peak_mem_used_bytes = mem_used.max();
  g.mem_total_bytes = mem_total.max();
  g.peak_mem_fraction = mem_frac.max();
  g.peak_proc_mem_bytes = proc_mem.max();
  g.max_temp_c = temp.max();
  g.mean_power_w = power.mean();
  g.max_power_w = power_max.max();
  g.min_sm_clock_mhz = clock_min.min();
  g.max_sm_clock_mhz = clock_max.max();
  g.max_pcie_rx_bps = rx.max();
  g.max_pcie_tx_bps = tx.max();
  return g;
}

HostAggregates AggregateHost(const store::RunData& d) {
  HostAggregates h;
  OptStat cpu, ncores, mem_used, mem_total, cache, swap, disk, iops, proc_cpu, rss;
  for (const auto& s : d.host_samples) {
    ++h.samples;
    cpu.Add(s.cpu_pct);
    ncores.Add(s.ncores);
    mem_used.Add(s.mem_used_bytes);
    mem_total.Add(s.mem_total_bytes);
    cache.Add(s.page_cache_bytes);
    swap.Add(s.swap_in_bps);
    disk.Add(s.disk_read_bps);
    iops.Add(s.disk_read_iops);
    proc_cpu.Add(s.proc_cpu_pct);
    rss.Add(s.proc_rss_bytes);
  }
  h.mean_cpu_pct = cpu.mean();
  h.max_cpu_pct = cpu.max();
  h.ncores = ncores.max();
  h.peak_mem_used_bytes = mem_used.max();
  h.mem_total_bytes = mem_total.max();
  h.peak_page_cache_bytes = cache.max();
  h.mean_swap_in_bps = swap.mean();
  h.max_swap_in_bps = swap.max();
  h.mean_disk_read_bps = disk.mean();
  h.max_disk_read_bps = disk.max();
  h.max_disk_read_iops = iops.max();
  h.mean_proc_cpu_pct = proc_cpu.mean();
  h.peak_proc_rss_bytes = rss.max();
  return h;
}

}  // namespace

bool LoaderWaitMeasured(const std::vector<StepView>& steps, size_t begin) {
  return std::any_of(steps.begin() + static_cast<std::ptrdiff_t>(std::min(begin, steps.size())),
                     steps.end(), [](const StepView& s) {
                       return s.wait_ns && s.wait_source &&
                              (*s.wait_source == "dataloader" || *s.wait_source == "explicit");
                     });
}

std::optional<int64_t> LoaderWaitNs(const StepView& s, bool measured) {
  if (!s.wait_ns) return std::nullopt;
  const bool no_loader_call = measured && s.wait_source && *s.wait_source == "gap";
  return no_loader_call ? 0 : *s.wait_ns;
}

namespace {

// Lower median of counts (0 when empty).
int64_t MedianCount(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

ExtraForwards FindEvaluationSteps(const std::vector<StepView>& steps, size_t begin) {
  ExtraForwards x;
  if (begin >= steps.size()) return x;
  std::vector<int64_t> forwards, backwards;
  for (size_t i = begin; i < steps.size(); ++i) {
    forwards.push_back(steps[i].forward_calls);
    backwards.push_back(steps[i].backward_calls);
  }
  x.typical_forwards = MedianCount(std::move(forwards));
  x.typical_backwards = MedianCount(std::move(backwards));
  const int64_t need = x.typical_forwards + std::max(kEvalExtraForwards, x.typical_forwards);
  for (size_t i = begin; i < steps.size(); ++i) {
    if (steps[i].forward_calls >= need && steps[i].backward_calls <= x.typical_backwards) {
      x.steps.push_back(steps[i].step);
    }
  }
  return x;
}

// Over steps[begin..], leaving out the steps in `leave_out` (when given).
Breakdown ComputeBreakdown(const std::vector<StepView>& steps, size_t begin,
                           const ExtraForwards* leave_out = nullptr) {
  Breakdown b;
  std::map<std::string, size_t> source_counts;
  std::unordered_map<std::string, size_t> index;  // phase name -> position in b.phases
  const bool measured = LoaderWaitMeasured(steps, begin);
  for (size_t i = begin; i < steps.size(); ++i) {
    const StepView& s = steps[i];
    if (leave_out && leave_out->Has(s.step)) continue;
    b.total_ns += s.duration_ns;
    if (const auto loader_wait = LoaderWaitNs(s, measured)) {
      const int64_t wait = *loader_wait;
      const bool no_loader_call = measured && s.wait_source && *s.wait_source == "gap";
      ++b.wait_steps;
      b.wait_total_ns += wait;
      b.wait_duration_ns += s.duration_ns;
      if (no_loader_call) {
        ++b.gap_steps_without_loader;
      } else if (s.wait_source) {
        ++source_counts[*s.wait_source];
      }
      if (!s.phases.empty()) {
        ++b.other_steps;
        b.other_total_ns += static_cast<double>(s.duration_ns - wait - s.phase_wall_ns);
        b.other_duration_ns += s.duration_ns;
      }
    }
    for (const PhaseTime& p : s.phases) {
      auto [it, inserted] = index.try_emplace(p.name, b.phases.size());
      if (inserted) {
        PhaseSummary fresh;
        fresh.name = p.name;
        fresh.derived = p.derived;
        b.phases.push_back(std::move(fresh));
      }
      PhaseSummary& ps = b.phases[it->second];
      ++ps.steps;
      ps.calls += p.calls;
      ps.wall_total_ns += p.wall_ns;
      if (p.gpu_ns) {
        ++ps.gpu_steps;
        ps.gpu_total_ns = ps.gpu_total_ns.value_or(0) + *p.gpu_ns;
      }
    }
  }
  for (PhaseSummary& ps : b.phases) {
    ps.wall_fraction = b.total_ns > 0 ? ps.wall_total_ns / b.total_ns : 0;
    if (ps.gpu_total_ns && ps.gpu_steps > 0) ps.gpu_mean_ns = *ps.gpu_total_ns / ps.gpu_steps;
  }
  // Canonical phases first; the rest keep their order of first appearance (stable sort).
  std::stable_sort(b.phases.begin(), b.phases.end(), [](const auto& a, const auto& c) {
    return PhaseOrder(a.name) < PhaseOrder(c.name);
  });
  if (b.wait_steps > 0 && b.wait_duration_ns > 0) {
    b.wait_fraction = b.wait_total_ns / b.wait_duration_ns;
    size_t best = 0;
    for (const auto& [source, n] : source_counts) {
      if (n > best) {
        best = n;
        b.wait_source = source;
      }
    }
  }
  if (b.other_steps > 0 && b.other_duration_ns > 0) {
    b.other_fraction = b.other_total_ns / b.other_duration_ns;
  }
  return b;
}

}  // namespace

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.size() == 1) return sorted[0];
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

std::optional<double> Median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  return Percentile(values, 0.5);
}

std::optional<DurationStats> ComputeDurationStats(const std::vector<double>& values_ns) {
  if (values_ns.empty()) return std::nullopt;
  std::vector<double> sorted = values_ns;
  std::sort(sorted.begin(), sorted.end());
  DurationStats s;
  s.count = sorted.size();
  for (double v : sorted) s.total_ns += v;
  s.mean_ns = s.total_ns / static_cast<double>(s.count);
  s.p50_ns = Percentile(sorted, 0.50);
  s.p99_ns = Percentile(sorted, 0.99);
  s.min_ns = sorted.front();
  s.max_ns = sorted.back();
  return s;
}

bool RunView::IsCpuRun() const {
  const auto& kind = data.run.device_kind;
  if (kind && *kind == "cuda") return false;
  if (kind && *kind == "cpu") return true;
  return !data.run.gpu_model && !(data.run.gpu_count && *data.run.gpu_count > 0);
}

const store::TelemetryStatusRow* RunView::Telemetry(std::string_view source) const {
  for (const auto& t : data.telemetry) {
    if (t.source == source) return &t;
  }
  return nullptr;
}

const store::GpuInfoRow* RunView::GpuInfo(int64_t gpu_index) const {
  for (const auto& g : data.gpus) {
    if (g.gpu_index == gpu_index) return &g;
  }
  return nullptr;
}

std::optional<std::pair<int64_t, int64_t>> RunView::SteadyWindow() const {
  if (steady_count() == 0) return std::nullopt;
  return std::make_pair(steps[steady_begin].start_ns, steps.back().end_ns);
}

// The derived comm phase of each step with comm_buckets rows and no recorded "comm" phase
// (StepView::phases).
static void DeriveCommPhases(const std::vector<store::CommBucketRow>& buckets,
                             const std::unordered_map<int64_t, size_t>& by_step,
                             std::vector<StepView>* steps) {
  struct Acc {
    int64_t last_start = 0, last_end = 0, rows = 0;
  };
  std::map<int64_t, Acc> per_step;
  for (const auto& b : buckets) {
    auto [it, inserted] = per_step.try_emplace(b.step, Acc{b.start_ns, b.end_ns, 0});
    Acc& a = it->second;
    a.last_start = std::max(a.last_start, b.start_ns);
    a.last_end = std::max(a.last_end, b.end_ns);
    ++a.rows;
  }
  for (const auto& [step, a] : per_step) {
    auto at = by_step.find(step);
    if (at == by_step.end()) continue;  // buckets of a step that was never closed
    StepView& s = (*steps)[at->second];
    const auto named = [&](const char* name) {
      return std::find_if(s.phases.begin(), s.phases.end(),
                          [&](const PhaseTime& p) { return p.name == name; });
    };
    if (named(kCommPhase) != s.phases.end()) continue;  // recorded: it wins
    int64_t exposed = std::max<int64_t>(0, a.last_end - a.last_start);
    if (auto backward = named("backward"); backward != s.phases.end()) {
      exposed = std::min(exposed, std::max<int64_t>(0, backward->wall_ns));
      backward->wall_ns -= exposed;
      s.phase_wall_ns -= exposed;
    }
    s.phases.push_back(PhaseTime{kCommPhase, exposed, std::nullopt, a.rows, true});
    s.phase_wall_ns += exposed;
  }
}

// Each step's overlap with the stalls (steps tile the timeline in step order; stalls are
// sorted here, and one may span several steps).
static void AssignStalls(std::vector<store::StallRow> stalls, std::vector<StepView>* steps) {
  std::sort(stalls.begin(), stalls.end(),
            [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  size_t first = 0;  // the first stall that may still reach the current step
  for (StepView& s : *steps) {
    int64_t stalled = 0;
    while (first < stalls.size() &&
           stalls[first].start_ns + std::max<int64_t>(0, stalls[first].duration_ns) <= s.start_ns) {
      ++first;
    }
    for (size_t i = first; i < stalls.size() && stalls[i].start_ns < s.end_ns; ++i) {
      const int64_t begin = std::max(stalls[i].start_ns, s.start_ns);
      const int64_t end = std::min(stalls[i].start_ns + stalls[i].duration_ns, s.end_ns);
      stalled += std::max<int64_t>(0, end - begin);
    }
    s.stalled_ns = stalled;
  }
}

// Each step's share of the CPU waits: a stretch's wait spread evenly over [start, end), the
// step taking the part that overlaps it, capped at the step's duration (the wait is summed over
// threads and may exceed wall time).
static void AssignCpuWaits(std::vector<store::CpuWaitRow> waits, std::vector<StepView>* steps) {
  std::sort(waits.begin(), waits.end(),
            [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  size_t first = 0;
  for (StepView& s : *steps) {
    double wait = 0;
    while (first < waits.size() && waits[first].end_ns <= s.start_ns) ++first;
    for (size_t i = first; i < waits.size() && waits[i].start_ns < s.end_ns; ++i) {
      const store::CpuWaitRow& w = waits[i];
      const int64_t span = w.end_ns - w.start_ns;
      const int64_t begin = std::max(w.start_ns, s.start_ns);
      const int64_t end = std::min(w.end_ns, s.end_ns);
      if (span <= 0) {  // a stretch of no length: all of it where it lies
        if (w.start_ns >= s.start_ns && w.start_ns < s.end_ns) {
          wait += static_cast<double>(w.wait_ns);
        }
        continue;
      }
      if (end > begin) {
        wait += static_cast<double>(w.wait_ns) * static_cast<double>(end - begin) /
                static_cast<double>(span);
      }
    }
    s.cpu_wait_ns = std::min<int64_t>(static_cast<int64_t>(wait), s.duration_ns);
  }
}

RunView BuildRunView(store::RunData data) {
  RunView v;
  v.data = std::move(data);
  const store::RunData& d = v.data;

  std::vector<store::StepRow> step_rows = d.steps;
  std::stable_sort(step_rows.begin(), step_rows.end(),
                   [](const auto& a, const auto& b) { return a.step < b.step; });
  std::unordered_map<int64_t, size_t> by_step;
  v.steps.reserve(step_rows.size());
  for (const auto& r : step_rows) {
    if (by_step.count(r.step)) continue;  // duplicate step numbers: keep the first
    by_step[r.step] = v.steps.size();
    StepView s;
    s.step = r.step;
    s.start_ns = r.start_ns;
    s.end_ns = r.end_ns;
    s.duration_ns = std::max<int64_t>(0, r.end_ns - r.start_ns);
    s.wait_ns = r.wait_ns;
    s.wait_source = r.wait_source;
    s.forward_calls = r.forward_calls;
    s.loader_starts = r.loader_starts;
    s.loader_start_ns = r.loader_start_ns;
    s.backward_calls = r.backward_calls;
    v.steps.push_back(std::move(s));
  }
  for (const auto& p : d.phases) {
    auto it = by_step.find(p.step);
    if (it == by_step.end()) continue;  // phase of a step that was never closed
    StepView& s = v.steps[it->second];
    s.phases.push_back(PhaseTime{p.name, p.wall_ns, p.gpu_ns, p.calls});
    s.phase_wall_ns += p.wall_ns;
  }
  DeriveCommPhases(d.comm_buckets, by_step, &v.steps);

  const size_t n = v.steps.size();
  if (n >= kWarmupSteps + kMinSteadySteps) {
    v.steady_begin = kWarmupSteps;
  } else if (n >= 2) {
    v.steady_begin = 1;
  } else {
    v.steady_begin = n;
  }
  std::vector<double> all, steady;
  all.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    all.push_back(static_cast<double>(v.steps[i].duration_ns));
    if (i >= v.steady_begin) steady.push_back(all.back());
  }
  v.all = ComputeDurationStats(all);
  v.steady = ComputeDurationStats(steady);
  v.breakdown = ComputeBreakdown(v.steps, v.steady_begin);
  v.evaluation_steps = FindEvaluationSteps(v.steps, v.steady_begin);
  v.training_breakdown = v.evaluation_steps.steps.empty()
                             ? v.breakdown
                             : ComputeBreakdown(v.steps, v.steady_begin, &v.evaluation_steps);

  if (d.run.end_ns) {
    v.duration_ns = *d.run.end_ns;
  } else if (!v.steps.empty()) {
    int64_t last = 0;
    for (const auto& s : v.steps) last = std::max(last, s.end_ns);
    v.duration_ns = last;
    v.duration_from_steps = true;
  }
  v.gpu = AggregateGpu(d);
  v.host = AggregateHost(d);
  const store::TelemetryStatusRow* watch = v.Telemetry("stalls");
  v.stalls_watched = watch != nullptr && watch->available;
  if (v.stalls_watched) AssignStalls(d.stalls, &v.steps);
  const store::TelemetryStatusRow* wait = v.Telemetry("cpu_wait");
  v.cpu_wait_watched = wait != nullptr && wait->available;
  if (v.cpu_wait_watched) AssignCpuWaits(d.cpu_waits, &v.steps);
  return v;
}

std::optional<Throughput> MeasureThroughput(const RunView& view) {
  if (!view.steady || view.steady_count() == 0) return std::nullopt;
  Throughput t;
  t.steps = view.steady_count();
  t.mean_ns = view.steady->mean_ns;
  t.blocks = std::min(kThroughputBlocks, t.steps / kThroughputBlockSteps);
  if (t.blocks < 2 || t.mean_ns <= 0) {
    t.blocks = 0;
    return t;
  }
  // Block b holds steady steps [b*n/B, (b+1)*n/B): sizes differ by at most one.
  std::vector<double> block_means;
  for (size_t b = 0; b < t.blocks; ++b) {
    const size_t lo = view.steady_begin + b * t.steps / t.blocks;
    const size_t hi = view.steady_begin + (b + 1) * t.steps / t.blocks;
    double sum = 0;
    for (size_t i = lo; i < hi; ++i) sum += static_cast<double>(view.steps[i].duration_ns);
    block_means.push_back(sum / static_cast<double>(hi - lo));
  }
  double mean = 0;
  for (double m : block_means) mean += m;
  mean /= static_cast<double>(t.blocks);
  double var = 0;
  for (double m : block_means) var += (m - mean) * (m - mean);
  var /= static_cast<double>(t.blocks - 1);
  // Two-sided 95% Student's t for 1..4 degrees of freedom (kThroughputBlocks - 1 at most).
  static constexpr double kT975[] = {12.706, 4.303, 3.182, 2.776};
  static_assert(kThroughputBlocks - 1 <= sizeof kT975 / sizeof kT975[0]);
  const double se = std::sqrt(var / static_cast<double>(t.blocks));
  t.spread = kT975[t.blocks - 2] * se / t.mean_ns;
  return t;
}

TracedTimes CollectTracedTimes(const store::RunData& data) {
  TracedTimes t;
  if (!data.kernels.empty()) {
    t.rows.reserve(data.kernels.size());
    for (const store::KernelRow& k : data.kernels) {
      t.rows.push_back(
          {k.window_start_ns, k.window_end_ns, k.step, &k.name, &k.source, k.calls, k.gpu_ns});
    }
    return t;
  }
  t.cpu = true;
  t.rows.reserve(data.cpu_ops.size());
  for (const store::CpuOpRow& o : data.cpu_ops) {
    t.rows.push_back(
        {o.window_start_ns, o.window_end_ns, o.step, &o.name, &o.source, o.calls, o.self_cpu_ns});
  }
  return t;
}

}  // namespace gpuprof::analysis
