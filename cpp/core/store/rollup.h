// Rollups of raw telemetry into the aggregate tier of the store (docs/schema.md, "Retention"):
//   GpuRollup    - gpu_samples    -> gpu_samples_1s     (per GPU and second)
//   WorkerRollup - worker_samples -> worker_samples_10s (per process and 10-second window)
// The recorder feeds them on its sampler threads; the analysis reads only the rollups, so the
// raw rows can be kept for bounded windows. Test fixtures and the long-run benchmark use the
// same classes, so what they store is what a real run stores.
//
// Not thread-safe: one owner thread (the sampler that produces the rows). Add/Flush allocate
// only when a new GPU / process appears or a row is emitted; callers on a hot path catch.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "store/rows.h"

namespace gpuprof::store {

inline constexpr int64_t kGpuRollupNs = 1'000'000'000;      // gpu_samples_1s row width
inline constexpr int64_t kWorkerRollupNs = 10'000'000'000;  // worker_samples_10s row width

// Per-sample criteria applied while rolling up. They are part of the definition of the
// gpu_samples_1s columns (changing one changes what stored rows mean, so it is a schema
// change); the analysis thresholds of the thermal_throttling and pcie_saturation rules are
// defined as these constants.
//
// A sample is *throttled* when its clocks-event reasons carry a thermal bit
// (kRollupThermalReasonBits), or when it is hotter than kRollupHotTempC with its SM clock more
// than kRollupClockDrop below the GPU's maximum. It can be *judged* (thermal_samples) when the
// reasons were read, or the temperature and SM clock were read and the maximum is known.
inline constexpr double kRollupHotTempC = 82.0;
inline constexpr double kRollupClockDrop = 0.15;
inline constexpr int64_t kRollupThermalReasonBits = 0x20 | 0x40;  // SW | HW thermal slowdown
// pcie_rx_high_samples counts readings strictly above this.
inline constexpr double kRollupPcieRxHighGBps = 20.0;

// Row start for a timestamp: floor(ts / width) * width, also for negative ts.
int64_t RollupStart(int64_t ts_ns, int64_t width_ns);

class GpuRollup {
 public:
  // The maximum SM clock of a GPU, for the temperature criterion (gpus.sm_clock_max_mhz). Without
  // one, the highest SM clock read so far on that GPU (this sample included) is used.
  void SetMaxClock(int64_t gpu_index, std::optional<int64_t> mhz);
  // Adds one raw sample. When it falls in a later second than its GPU's open row, the open row
  // is appended to `out` first. A sample of an earlier second (never produced by a single
  // sampler thread) is counted into the open row.
  void Add(const GpuSampleRow& sample, std::vector<GpuRollupRow>* out);
  // Appends every open row (ordered by gpu_index) and closes them: the end of a run.
  void Flush(std::vector<GpuRollupRow>* out);

 private:
  struct Acc {
    bool open = false;
    GpuRollupRow row;
    size_t mem_util_n = 0;
    double util_sum = 0, mem_util_sum = 0, power_sum = 0, pcie_rx_sum = 0;
  };
  struct Gpu {
    int64_t index = 0;
    std::optional<int64_t> max_clock;       // SetMaxClock
    std::optional<int64_t> observed_clock;  // highest read so far
    Acc acc;
  };
  Gpu& Find(int64_t gpu_index);
  static void Close(Acc& acc, std::vector<GpuRollupRow>* out);

  std::vector<Gpu> gpus_;  // a handful of devices: linear search
};

class WorkerRollup {
 public:
  // Adds one raw worker sample. Samples of a later window close the open window: its rows (one
  // per pid, ordered by pid) are appended to `out`.
  void Add(const WorkerSampleRow& sample, std::vector<WorkerRollupRow>* out);
  // Appends the open window's rows and closes it.
  void Flush(std::vector<WorkerRollupRow>* out);

 private:
  struct Acc {
    WorkerRollupRow row;
    double cpu_sum = 0;
  };
  bool open_ = false;
  int64_t window_ = 0;
  std::vector<Acc> pids_;  // the open window's processes, sorted by pid
};

// Test and benchmark helpers: the rollup of a whole list of samples (any order; sorted by
// timestamp first, as a sampler thread produces them). `gpus` gives the maximum SM clocks.
std::vector<GpuRollupRow> RollupGpuSamples(std::vector<GpuSampleRow> samples,
                                           const std::vector<GpuInfoRow>& gpus);
std::vector<WorkerRollupRow> RollupWorkerSamples(std::vector<WorkerSampleRow> samples);

}  // namespace gpuprof::store
