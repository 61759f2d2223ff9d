#include "store/run_store.h"

#include <algorithm>

namespace gpuprof::store {

std::optional<SeriesColumn> SeriesMetric(const std::string& metric) {
  if (metric == "gpu_util") return SeriesColumn{"gpu_samples_1s", "util_mean_pct", true};
  if (metric == "gpu_mem") return SeriesColumn{"gpu_samples_1s", "mem_used_max_bytes", true};
  if (metric == "gpu_power") return SeriesColumn{"gpu_samples_1s", "power_mean_mw", true};
  if (metric == "gpu_temp") return SeriesColumn{"gpu_samples_1s", "temp_max_c", true};
  if (metric == "host_cpu") return SeriesColumn{"host_samples", "cpu_pct", false};
  if (metric == "host_mem") return SeriesColumn{"host_samples", "mem_used_bytes", false};
  if (metric == "host_disk_read") return SeriesColumn{"host_samples", "disk_read_bps", false};
  if (metric == "proc_cpu") return SeriesColumn{"host_samples", "proc_cpu_pct", false};
  if (metric == "proc_rss") return SeriesColumn{"host_samples", "proc_rss_bytes", false};
  if (metric == "job_cpu") return SeriesColumn{"host_samples", "job_cpu_pct", false};
  return std::nullopt;
}

const char* MetricNames() {
  return "gpu_util, gpu_mem, gpu_power, gpu_temp, host_cpu, host_mem, host_disk_read, proc_cpu, "
         "proc_rss, job_cpu";
}

std::vector<std::pair<size_t, size_t>> UrlPasswordSpans(const std::string& url) {
  std::vector<std::pair<size_t, size_t>> spans;
  const size_t scheme = url.find("://");
  if (scheme != std::string::npos) {
    const size_t start = scheme + 3;
    const size_t at = url.find('@', start);
    const size_t slash = url.find('/', start);
    const size_t colon = url.find(':', start);
    if (at != std::string::npos && (slash == std::string::npos || at < slash) &&
        colon != std::string::npos && colon < at) {
      spans.emplace_back(colon + 1, at);
    }
  }
  const size_t query = url.find('?');
  for (size_t k = query; k != std::string::npos && k < url.size();) {
    k = url.find("password=", k);
    if (k == std::string::npos) break;
    // The key is password or sslpassword (the client key's passphrase), not a longer name.
    const size_t key = url.find_last_of("?&", k);
    const std::string name = url.substr(key + 1, k + 8 - key - 1);
    const bool whole_key = name == "password" || name == "sslpassword";
    k += 9;
    const size_t end = std::min(url.find('&', k), url.size());
    if (whole_key) spans.emplace_back(k, end);
    k = end;
  }
  return spans;
}

}  // namespace gpuprof::store
