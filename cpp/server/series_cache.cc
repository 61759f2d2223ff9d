#include "server/series_cache.h"

#include <algorithm>
#include <climits>

namespace gpuprof::server {

std::shared_ptr<SeriesCache::Run> SeriesCache::RunOf(int64_t run_id) {
  std::lock_guard lock(mu_);
  auto& run = runs_[run_id];
  if (!run) run = std::make_shared<Run>();
  run->used = ++clock_;
  if (runs_.size() > kMaxRuns) {
    auto oldest = std::min_element(runs_.begin(), runs_.end(), [](const auto& a, const auto& b) {
      return a.second->used < b.second->used;
    });
    runs_.erase(oldest);
  }
  return run;
}

void SeriesCache::Add(Tier& t, int columns, const store::SeriesRow& r) {
  auto& series = t.by_gpu[r.gpu_index];
  if (series.empty()) series.resize(static_cast<size_t>(columns));
  const size_t bucket = static_cast<size_t>(std::max<int64_t>(0, r.ts_ns) / kBucketNs);
  for (int c = 0; c < columns; ++c) {
    if (!(r.known & (1u << c))) continue;
    auto& buckets = series[static_cast<size_t>(c)];
    if (buckets.size() <= bucket) buckets.resize(bucket + 1);
    Extremes& e = buckets[bucket];
    const double v = r.v[c];
    if (!e.any || v < e.min) {
      e.min = v;
      e.min_ts = r.ts_ns;
    }
    if (!e.any || v > e.max) {
      e.max = v;
      e.max_ts = r.ts_ns;
    }
    e.any = true;
  }
}

Status SeriesCache::Extend(store::RunStore& db, int64_t run_id, bool gpu,
                           std::optional<Tier>* tier) {
  const int columns = gpu ? store::kGpuSeriesColumns : store::kHostSeriesColumns;
  int64_t newest = -1;
  auto add = [&](const store::SeriesRow& r) {
    Add(**tier, columns, r);
    newest = std::max(newest, r.ts_ns);
  };
  if (!*tier) {
    tier->emplace();
    Status st = gpu ? db.ScanGpuSeries(run_id, std::nullopt, 0, INT64_MAX, add)
                    : db.ScanHostSeries(run_id, 0, INT64_MAX, add);
    if (!st.ok()) {
      tier->reset();
      return st;
    }
  } else {
    // The last bucket may have been partial: drop it and everything after, then rescan.
    const int64_t from = (*tier)->complete_to_ns;
    const size_t first = static_cast<size_t>(from / kBucketNs);
    for (auto& [index, series] : (*tier)->by_gpu) {
      for (auto& buckets : series) {
        if (buckets.size() > first) buckets.resize(first);
      }
    }
    std::vector<int64_t> gpus;
    for (const auto& [index, series] : (*tier)->by_gpu) gpus.push_back(index);
    Status st = Status::Ok();
    if (gpu) {
      for (int64_t g : gpus) {
        if (st = db.ScanGpuSeries(run_id, g, from, INT64_MAX, add); !st.ok()) break;
      }
    } else {
      st = db.ScanHostSeries(run_id, from, INT64_MAX, add);
    }
    if (!st.ok()) {
      tier->reset();
      return st;
    }
    if (newest < 0) newest = from;
  }
  if (newest >= 0) {
    (*tier)->complete_to_ns = std::max((*tier)->complete_to_ns, newest / kBucketNs * kBucketNs);
  }
  return Status::Ok();
}

void SeriesCache::Emit(const std::vector<Extremes>& buckets, int64_t from_ns, int64_t to_ns,
                       Points* out) {
  const size_t first = static_cast<size_t>(std::max<int64_t>(0, from_ns) / kBucketNs);
  const size_t last =
      std::min(buckets.size(), static_cast<size_t>(std::max<int64_t>(0, to_ns) / kBucketNs) + 1);
  auto keep = [&](int64_t t, double v) {
    if (t >= from_ns && t <= to_ns) out->emplace_back(t, v);
  };
  for (size_t b = first; b < last; ++b) {
    const Extremes& e = buckets[b];
    if (!e.any) continue;
    if (e.min_ts == e.max_ts) {
      keep(e.min_ts, e.max);
    } else if (e.min_ts < e.max_ts) {
      keep(e.min_ts, e.min);
      keep(e.max_ts, e.max);
    } else {
      keep(e.max_ts, e.max);
      keep(e.min_ts, e.min);
    }
  }
}

Status SeriesCache::GpuSeries(store::RunStore& db, int64_t run_id, std::optional<int64_t> gpu,
                              uint32_t columns, int64_t from_ns, int64_t to_ns,
                              std::map<int64_t, std::vector<Points>>* out) {
  auto run = RunOf(run_id);
  std::lock_guard lock(run->mu);
  if (Status st = Extend(db, run_id, true, &run->gpu); !st.ok()) return st;
  for (const auto& [index, series] : run->gpu->by_gpu) {
    if (gpu && index != *gpu) continue;
    auto& dest = (*out)[index];
    dest.resize(store::kGpuSeriesColumns);
    for (int c = 0; c < store::kGpuSeriesColumns; ++c) {
      if (columns & (1u << c)) Emit(series[static_cast<size_t>(c)], from_ns, to_ns, &dest[c]);
    }
  }
  return Status::Ok();
}

Status SeriesCache::HostSeries(store::RunStore& db, int64_t run_id, uint32_t columns,
                               int64_t from_ns, int64_t to_ns, std::vector<Points>* out) {
  auto run = RunOf(run_id);
  std::lock_guard lock(run->mu);
  if (Status st = Extend(db, run_id, false, &run->host); !st.ok()) return st;
  out->assign(store::kHostSeriesColumns, {});
  auto it = run->host->by_gpu.find(0);
  if (it == run->host->by_gpu.end()) return Status::Ok();
  for (int c = 0; c < store::kHostSeriesColumns; ++c) {
    if (columns & (1u << c)) Emit(it->second[static_cast<size_t>(c)], from_ns, to_ns, &(*out)[c]);
  }
  return Status::Ok();
}

void SeriesCache::Invalidate(int64_t run_id, int64_t oldest_ns) {
  std::shared_ptr<Run> run;
  {
    std::lock_guard lock(mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return;
    run = it->second;
  }
  std::lock_guard lock(run->mu);
  if (run->gpu && oldest_ns < run->gpu->complete_to_ns) run->gpu.reset();
  if (run->host && oldest_ns < run->host->complete_to_ns) run->host.reset();
}

}  // namespace gpuprof::server
