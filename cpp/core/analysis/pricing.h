// Reference prices for the cost estimate, in USD per GPU-hour.
//
// These are REFERENCE values, not quotes: AWS on-demand list prices (us-east-1, Linux) of
// the instance type named in `source`, divided by the GPUs per instance. A single-GPU
// instance's price includes its host. Real prices differ by provider, region, commitment
// and date; GPUPROF_GPU_RATE (or AnalysisOptions::gpu_rate_usd_per_hour) overrides them.
// Matching uses GpuNameMatches (whole words, most specific entry first).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace gpuprof::analysis {

struct GpuRateEntry {
  std::string_view match;  // words that must all appear in the GPU name
  double usd_per_gpu_hour = 0;
  std::string_view source;  // where the reference number comes from
};

std::span<const GpuRateEntry> GpuRateTable();
// First entry matching the GPU name, or null.
const GpuRateEntry* FindGpuRate(std::string_view gpu_name);

// The rate table as Markdown (matched words, USD per GPU-hour, source).
std::string GpuRatesMarkdown();

// Parses a rate given by a user ("12.29", "$12.29"); must be a finite number >= 0.
std::optional<double> ParseRate(std::string_view text);

}  // namespace gpuprof::analysis
