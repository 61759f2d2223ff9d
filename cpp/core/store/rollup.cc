#include "store/rollup.h"

#include <algorithm>
#include <cmath>

namespace gpuprof::store {
namespace {

// A double reading counts only when finite (NaN is "no value", as in the store).
bool Has(const std::optional<double>& v) { return v && std::isfinite(*v); }

template <typename T>
void Max(std::optional<T>& into, T v) {
  if (!into || v > *into) into = v;
}
template <typename T>
void Min(std::optional<T>& into, T v) {
  if (!into || v < *into) into = v;
}

}  // namespace

int64_t RollupStart(int64_t ts_ns, int64_t width_ns) {
  int64_t q = ts_ns / width_ns;
  if (ts_ns % width_ns < 0) --q;
  return q * width_ns;
}

// ---- GpuRollup -------------------------------------------------------------------------------

GpuRollup::Gpu& GpuRollup::Find(int64_t gpu_index) {
  for (Gpu& g : gpus_) {
    if (g.index == gpu_index) return g;
  }
  Gpu& g = gpus_.emplace_back();
  g.index = gpu_index;
  return g;
}

void GpuRollup::SetMaxClock(int64_t gpu_index, std::optional<int64_t> mhz) {
  Find(gpu_index).max_clock = mhz;
}

void GpuRollup::Close(Acc& acc, std::vector<GpuRollupRow>* out) {
  if (!acc.open) return;
  GpuRollupRow& r = acc.row;
  if (r.util_samples > 0) r.util_mean_pct = acc.util_sum / static_cast<double>(r.util_samples);
  if (acc.mem_util_n > 0) {
    r.mem_util_mean_pct = acc.mem_util_sum / static_cast<double>(acc.mem_util_n);
  }
  if (r.power_samples > 0) r.power_mean_mw = acc.power_sum / static_cast<double>(r.power_samples);
  if (r.pcie_rx_samples > 0) {
    r.pcie_rx_mean_bps = acc.pcie_rx_sum / static_cast<double>(r.pcie_rx_samples);
  }
  out->push_back(std::move(r));
  acc = Acc{};
}

void GpuRollup::Add(const GpuSampleRow& s, std::vector<GpuRollupRow>* out) {
  Gpu& g = Find(s.gpu_index);
  Acc& a = g.acc;
  const int64_t start = RollupStart(s.ts_ns, kGpuRollupNs);
  if (a.open && start > a.row.ts_ns) Close(a, out);
  if (!a.open) {
    a.open = true;
    a.row.ts_ns = start;
    a.row.gpu_index = s.gpu_index;
  }
  GpuRollupRow& r = a.row;
  ++r.samples;
  if (Has(s.util_pct)) {
    ++r.util_samples;
    a.util_sum += *s.util_pct;
    Min(r.util_min_pct, *s.util_pct);
    Max(r.util_max_pct, *s.util_pct);
  }
  if (Has(s.mem_util_pct)) {
    ++a.mem_util_n;
    a.mem_util_sum += *s.mem_util_pct;
  }
  if (s.mem_used_bytes) Max(r.mem_used_max_bytes, *s.mem_used_bytes);
  if (s.mem_total_bytes) Max(r.mem_total_bytes, *s.mem_total_bytes);
  if (s.proc_mem_bytes) Max(r.proc_mem_max_bytes, *s.proc_mem_bytes);
  if (s.power_mw) {
    ++r.power_samples;
    a.power_sum += static_cast<double>(*s.power_mw);
    Max(r.power_max_mw, *s.power_mw);
  }
  const bool temp = Has(s.temp_c);
  if (temp) Max(r.temp_max_c, *s.temp_c);
  if (s.sm_clock_mhz) {
    Min(r.sm_clock_min_mhz, *s.sm_clock_mhz);
    Max(r.sm_clock_max_mhz, *s.sm_clock_mhz);
    Max(g.observed_clock, *s.sm_clock_mhz);
  }
  if (s.clock_reasons) r.clock_reasons_or = r.clock_reasons_or.value_or(0) | *s.clock_reasons;

  // Thermal throttling of this sample.
  const std::optional<int64_t> max_clock = g.max_clock ? g.max_clock : g.observed_clock;
  const bool by_temp_known = temp && s.sm_clock_mhz && max_clock && *max_clock > 0;
  if (s.clock_reasons || by_temp_known) {
    ++r.thermal_samples;
    const bool by_reason = s.clock_reasons && (*s.clock_reasons & kRollupThermalReasonBits) != 0;
    const bool by_temp = by_temp_known && *s.temp_c > kRollupHotTempC &&
                         static_cast<double>(*s.sm_clock_mhz) <
                             (1 - kRollupClockDrop) * static_cast<double>(*max_clock);
    if (by_reason || by_temp) {
      ++r.throttled_samples;
      if (by_reason) ++r.throttled_by_reason_samples;
      if (temp) Max(r.throttled_temp_max_c, *s.temp_c);
      if (s.sm_clock_mhz) Min(r.throttled_sm_clock_min_mhz, *s.sm_clock_mhz);
    }
  }

  if (Has(s.pcie_rx_bps)) {
    ++r.pcie_rx_samples;
    a.pcie_rx_sum += *s.pcie_rx_bps;
    Max(r.pcie_rx_max_bps, *s.pcie_rx_bps);
    if (*s.pcie_rx_bps > kRollupPcieRxHighGBps * 1e9) ++r.pcie_rx_high_samples;
  }
  if (Has(s.pcie_tx_bps)) Max(r.pcie_tx_max_bps, *s.pcie_tx_bps);
}

void GpuRollup::Flush(std::vector<GpuRollupRow>* out) {
  std::vector<Gpu*> order;
  for (Gpu& g : gpus_) order.push_back(&g);
  std::sort(order.begin(), order.end(),
            [](const Gpu* a, const Gpu* b) { return a->index < b->index; });
  for (Gpu* g : order) Close(g->acc, out);
}

// ---- WorkerRollup ----------------------------------------------------------------------------

void WorkerRollup::Flush(std::vector<WorkerRollupRow>* out) {
  for (Acc& a : pids_) {
    if (a.row.cpu_samples > 0) {
      a.row.cpu_mean_pct = a.cpu_sum / static_cast<double>(a.row.cpu_samples);
    }
    out->push_back(std::move(a.row));
  }
  pids_.clear();
  open_ = false;
}

void WorkerRollup::Add(const WorkerSampleRow& s, std::vector<WorkerRollupRow>* out) {
  const int64_t start = RollupStart(s.ts_ns, kWorkerRollupNs);
  if (open_ && start > window_) Flush(out);
  if (!open_) {
    open_ = true;
    window_ = start;
  }
  auto it = std::lower_bound(pids_.begin(), pids_.end(), s.pid,
                             [](const Acc& a, int64_t pid) { return a.row.pid < pid; });
  if (it == pids_.end() || it->row.pid != s.pid) {
    it = pids_.insert(it, Acc{});
    it->row.ts_ns = window_;
    it->row.pid = s.pid;
  }
  WorkerRollupRow& r = it->row;
  r.role = s.role;
  ++r.samples;
  if (Has(s.cpu_pct)) {
    ++r.cpu_samples;
    it->cpu_sum += *s.cpu_pct;
    Max(r.cpu_max_pct, *s.cpu_pct);
  }
  if (s.rss_bytes) Max(r.rss_max_bytes, *s.rss_bytes);
}

// ---- whole-list helpers ----------------------------------------------------------------------

std::vector<GpuRollupRow> RollupGpuSamples(std::vector<GpuSampleRow> samples,
                                           const std::vector<GpuInfoRow>& gpus) {
  std::stable_sort(samples.begin(), samples.end(),
                   [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  GpuRollup rollup;
  for (const GpuInfoRow& g : gpus) rollup.SetMaxClock(g.gpu_index, g.sm_clock_max_mhz);
  std::vector<GpuRollupRow> out;
  for (const GpuSampleRow& s : samples) rollup.Add(s, &out);
  rollup.Flush(&out);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.ts_ns != b.ts_ns ? a.ts_ns < b.ts_ns : a.gpu_index < b.gpu_index;
  });
  return out;
}

std::vector<WorkerRollupRow> RollupWorkerSamples(std::vector<WorkerSampleRow> samples) {
  std::stable_sort(samples.begin(), samples.end(),
                   [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  WorkerRollup rollup;
  std::vector<WorkerRollupRow> out;
  for (const WorkerSampleRow& s : samples) rollup.Add(s, &out);
  rollup.Flush(&out);
  return out;
}

}  // namespace gpuprof::store
