// Memory & thermal rules: is the device close to out-of-memory, or slowed down by heat?
#include <algorithm>
#include <map>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {

using namespace thresholds;

// Fires when, on any GPU, device memory in use (all processes, NVML) exceeds kGpuMemPressure of
// the device's memory at some sample. Reads the per-second rollups: each second's peak use
// against its total, else the gpus table's.
RuleResult MemoryPressure(const RunView& view, const RuleContext&) {
  std::optional<double> peak;
  const store::GpuRollupRow* at = nullptr;
  double peak_total = 0;
  for (const auto& s : view.data.gpu_samples_1s) {
    if (!s.mem_used_max_bytes) continue;
    std::optional<int64_t> total = s.mem_total_bytes;
    if (!total) {
      if (const store::GpuInfoRow* info = view.GpuInfo(s.gpu_index)) {
        total = info->memory_total_bytes;
      }
    }
    if (!total || *total <= 0) continue;
    const double f = static_cast<double>(*s.mem_used_max_bytes) / static_cast<double>(*total);
    if (!peak || f > *peak) {
      peak = f;
      at = &s;
      peak_total = static_cast<double>(*total);
    }
  }
  if (!peak) return RuleResult::Skip(GpuMissing(view, "GPU memory use and total"));
  if (*peak <= kGpuMemPressure) return RuleResult::Pass();
  nlohmann::json evidence = {
      {"peak_fraction", *peak},
      {"peak_used_bytes", *at->mem_used_max_bytes},
      {"mem_total_bytes", peak_total},
      {"gpu_index", at->gpu_index},
      {"at_ns", at->ts_ns},  // the start of the second
      {"threshold", kGpuMemPressure},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("Peak GPU memory use was %s of %s (%s) on GPU %lld: close to out-of-memory, "
                "where the allocator frees and retries",
                FormatBytes(static_cast<double>(*at->mem_used_max_bytes)).c_str(),
                FormatBytes(peak_total).c_str(), FormatPercent(*peak).c_str(),
                static_cast<long long>(at->gpu_index)),
      std::move(evidence));
}

// A sample is throttled when NVML's clock-event reasons carry a thermal bit
// (kNvmlSwThermalSlowdown | kNvmlHwThermalSlowdown), or when the GPU is hotter than
// kThrottleTempC with its SM clock more than kThrottleClockDrop below the device maximum (the
// gpus table's sm_clock_max_mhz, else the highest clock seen so far on that GPU). Samples are
// judged while rolling up (store::GpuRollup); this rule sums the per-second counts. Fires when
// more than kThrottleSampleFraction of one GPU's evaluable samples are throttled; reports the
// GPU with the largest share.
RuleResult ThermalThrottling(const RunView& view, const RuleContext&) {
  struct PerGpu {
    int64_t evaluable = 0, throttled = 0, by_reason = 0;
    std::optional<double> max_temp;       // over throttled samples
    std::optional<int64_t> min_clock;     // over throttled samples
    std::optional<int64_t> observed_max;  // over all samples
  };
  std::map<int64_t, PerGpu> gpus;
  for (const auto& s : view.data.gpu_samples_1s) {
    PerGpu& g = gpus[s.gpu_index];
    if (s.sm_clock_max_mhz) {
      g.observed_max = std::max(g.observed_max.value_or(0), *s.sm_clock_max_mhz);
    }
    g.evaluable += s.thermal_samples;
    g.throttled += s.throttled_samples;
    g.by_reason += s.throttled_by_reason_samples;
    if (s.throttled_temp_max_c) {
      g.max_temp = std::max(g.max_temp.value_or(*s.throttled_temp_max_c), *s.throttled_temp_max_c);
    }
    if (s.throttled_sm_clock_min_mhz) {
      g.min_clock = std::min(g.min_clock.value_or(*s.throttled_sm_clock_min_mhz),
                             *s.throttled_sm_clock_min_mhz);
    }
  }
  std::map<int64_t, std::optional<int64_t>> max_clock;
  for (const auto& [index, g] : gpus) {
    const store::GpuInfoRow* info = view.GpuInfo(index);
    max_clock[index] = info && info->sm_clock_max_mhz ? info->sm_clock_max_mhz : g.observed_max;
  }
  int64_t worst = -1;
  double worst_share = -1;
  size_t evaluable = 0;
  for (const auto& [index, g] : gpus) {
    if (g.evaluable == 0) continue;
    evaluable += g.evaluable;
    const double share = static_cast<double>(g.throttled) / static_cast<double>(g.evaluable);
    if (share > worst_share) {
      worst_share = share;
      worst = index;
    }
  }
  if (evaluable == 0) {
    return RuleResult::Skip(
        GpuMissing(view, "GPU temperature with SM clock, or clock-event reasons"));
  }
  if (worst_share <= kThrottleSampleFraction) return RuleResult::Pass();
  const PerGpu& g = gpus[worst];
  const std::optional<int64_t>& max = max_clock[worst];
  std::vector<std::string> details;
  if (g.by_reason > 0) details.push_back("NVML reports thermal slowdown");
  if (g.max_temp) details.push_back(StrFormat("up to %.0f °C", *g.max_temp));
  if (g.min_clock) {
    std::string clock =
        StrFormat("SM clock down to %lld MHz", static_cast<long long>(*g.min_clock));
    if (max && *max > 0) {
      clock += StrFormat(", %s below its %lld MHz max",
                         FormatPercent(1 - static_cast<double>(*g.min_clock) / *max).c_str(),
                         static_cast<long long>(*max));
    }
    details.push_back(clock);
  }
  std::string detail;
  for (size_t i = 0; i < details.size(); ++i) detail += (i ? "; " : "") + details[i];
  nlohmann::json evidence = {
      {"gpu_index", worst},
      {"throttled_samples", g.throttled},
      {"samples", g.evaluable},
      {"throttled_fraction", worst_share},
      {"by_reason_samples", g.by_reason},
      {"max_temp_c", g.max_temp ? nlohmann::json(*g.max_temp) : nlohmann::json()},
      {"min_sm_clock_mhz", g.min_clock ? nlohmann::json(*g.min_clock) : nlohmann::json()},
      {"sm_clock_max_mhz", max ? nlohmann::json(*max) : nlohmann::json()},
      {"threshold", kThrottleSampleFraction},
  };
  return RuleResult::Fire(
      worst_share >= kThrottleHighFraction ? Severity::kHigh : Severity::kMed,
      StrFormat("GPU %lld was thermally throttled on %s of samples (%s)",
                static_cast<long long>(worst), FormatPercent(worst_share).c_str(), detail.c_str()),
      std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
