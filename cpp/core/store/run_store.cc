#include "store/run_store.h"

namespace gpuprof::store {

std::optional<SeriesColumn> SeriesMetric(const std::string& metric) {
  if (metric == "gpu_util") return SeriesColumn{"gpu_samples_1s", "util_mean_pct", true};
  if (metric == "gpu_mem") return SeriesColumn{"gpu_samples_1s", "mem_used_max_bytes", true};
  if (metric == "gpu_power") return SeriesColumn{"gpu_samples_1s", "power_mean_mw", true};
  if (metric == "gpu_temp") return SeriesColumn{"gpu_samples_1s", "temp_max_c", true};
  if (metric == "host_cpu") return SeriesColumn{"host_samples", "cpu_pct", false};
  return std::nullopt;
}

const char* MetricNames() { return "gpu_util, gpu_mem, gpu_power, gpu_temp, host_cpu"; }

}  // namespace gpuprof::store
