// A minute-level summary of each run's series, kept in memory by the server, for windows too
// wide for the 1 s tier: a 24 h window of 8 GPUs is 691,200 rollup rows (~0.4 s to scan on a
// small machine) but 11,520 one-minute buckets. Each bucket keeps, per series, its lowest and
// highest reading with their times, so a window drawn from buckets keeps every peak and dip
// (LTTB then runs over those extremes). The summary is built on a run's first wide read and
// extended incrementally: later reads scan only the rows after the last complete minute (the
// index (run_id, gpu_index, ts_ns) for GPUs, (run_id, ts_ns) for the host). A write of rows
// older than what a summary covers (a spool drained late) drops it (Invalidate). Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "store/run_store.h"
#include "util/status.h"

namespace gpuprof::server {

namespace series_cache_detail {
// Outside SeriesCache: clang cannot default-construct a nested class with member initializers
// (std::optional<Tier>::emplace()) while the enclosing class is incomplete.
struct Extremes {
  int64_t min_ts = 0, max_ts = 0;
  double min = 0, max = 0;
  bool any = false;
};
// One source's buckets: per series (GPU x column, or host column), bucket index -> extremes.
struct Tier {
  int64_t complete_to_ns = 0;                                    // buckets before this are final
  std::map<int64_t, std::vector<std::vector<Extremes>>> by_gpu;  // [gpu][column][bucket]
};
}  // namespace series_cache_detail

class SeriesCache {
 public:
  static constexpr int64_t kBucketNs = 60'000'000'000;  // one minute
  using Points = std::vector<std::pair<int64_t, double>>;

  // Whether a window of `span_ns` drawn at `points` is better served from minute buckets
  // (two readings a bucket still give at least `points` of them).
  static bool Wide(int64_t span_ns, int64_t points) {
    return span_ns / kBucketNs >= points / 2 && span_ns >= 2 * 3600 * 1'000'000'000LL;
  }

  // Per GPU (every GPU, or `gpu`), per column of ScanGpuSeries (0-3: util, mem, power, temp;
  // those whose bit is set in `columns`), the extremes of each bucket with readings in
  // [from_ns, to_ns], in time order; brings the run's summary up to date from `db` first.
  Status GpuSeries(store::RunStore& db, int64_t run_id, std::optional<int64_t> gpu,
                   uint32_t columns, int64_t from_ns, int64_t to_ns,
                   std::map<int64_t, std::vector<Points>>* out);
  // Likewise the host columns (0 .. kHostSeriesColumns-1: ScanHostSeries' order), out[column].
  Status HostSeries(store::RunStore& db, int64_t run_id, uint32_t columns, int64_t from_ns,
                    int64_t to_ns, std::vector<Points>* out);
  static constexpr size_t kMaxRuns = 64;  // summaries kept (the least recently read go)
  // Rows with ts_ns <= `oldest_ns` were written to `run_id` after its summary was built.
  void Invalidate(int64_t run_id, int64_t oldest_ns);

 private:
  using Extremes = series_cache_detail::Extremes;
  using Tier = series_cache_detail::Tier;
  struct Run {
    std::mutex mu;  // one reader extends a run's summary at a time
    std::optional<Tier> gpu, host;
    uint64_t used = 0;
  };
  std::shared_ptr<Run> RunOf(int64_t run_id);
  // Brings `tier` up to date: rescans from its last (partial) bucket on.
  static Status Extend(store::RunStore& db, int64_t run_id, bool gpu, std::optional<Tier>* tier);
  static void Add(Tier& t, int columns, const store::SeriesRow& r);
  static void Emit(const std::vector<Extremes>& buckets, int64_t from_ns, int64_t to_ns,
                   Points* out);

  std::mutex mu_;
  std::map<int64_t, std::shared_ptr<Run>> runs_;
  uint64_t clock_ = 0;
};

}  // namespace gpuprof::server
