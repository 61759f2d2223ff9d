#include "analysis/pricing.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "analysis/flops.h"
#include "analysis/format.h"

namespace gpuprof::analysis {
namespace {

constexpr std::array kRates = {
    GpuRateEntry{"H100", 12.29, "AWS p5.48xlarge on-demand $98.32/h ÷ 8 GPUs"},
    GpuRateEntry{"A100 80GB", 5.12, "AWS p4de.24xlarge on-demand $40.97/h ÷ 8 GPUs"},
    GpuRateEntry{"A100", 4.10, "AWS p4d.24xlarge on-demand $32.77/h ÷ 8 GPUs"},
    GpuRateEntry{"L40S", 1.86, "AWS g6e.xlarge on-demand (1 GPU)"},
    GpuRateEntry{"L4", 0.80, "AWS g6.xlarge on-demand (1 GPU)"},
    GpuRateEntry{"A10G", 1.01, "AWS g5.xlarge on-demand (1 GPU)"},
    GpuRateEntry{"V100", 3.06, "AWS p3.2xlarge on-demand (1 GPU)"},
    GpuRateEntry{"T4", 0.53, "AWS g4dn.xlarge on-demand (1 GPU)"},
};

}  // namespace

std::span<const GpuRateEntry> GpuRateTable() { return kRates; }

const GpuRateEntry* FindGpuRate(std::string_view gpu_name) {
  for (const GpuRateEntry& e : kRates) {
    if (GpuNameMatches(gpu_name, e.match)) return &e;
  }
  return nullptr;
}

std::string GpuRatesMarkdown() {
  std::string out = "| Matches words | USD per GPU-hour | Reference |\n|---|---|---|\n";
  for (const GpuRateEntry& e : kRates) {
    out += "| `" + std::string(e.match) + "` | " + StrFormat("%.2f", e.usd_per_gpu_hour) + " | " +
           std::string(e.source) + " |\n";
  }
  return out;
}

std::optional<double> ParseRate(std::string_view text) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (i < s.size() && s[i] == '$') ++i;
  if (i >= s.size()) return std::nullopt;
  const char* begin = s.c_str() + i;
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || *end != '\0' || !std::isfinite(v) || v < 0) return std::nullopt;
  return v;
}

}  // namespace gpuprof::analysis
