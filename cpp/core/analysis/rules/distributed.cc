// Distributed rules: collectives within one rank (comm_dominant) and across the ranks of a group
// (bucket_skew, rank_skew; see group.h).
#include <algorithm>
#include <map>
#include <tuple>

#include "analysis/format.h"
#include "analysis/group.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {

using namespace thresholds;

// Fires when, over the steady-state steps with comm_buckets rows, a collective is in flight for
// more than kCommFraction of step time (per step, the union of its bucket intervals, so
// concurrent buckets count once). A run that is not distributed (world_size NULL or 1) and has
// no collective rows passes: it has no communication.
RuleResult CommDominant(const RunView& view, const RuleContext&) {
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const std::optional<CommShare> share = MeasureCommShare(view);
  if (!share) {
    if (!view.data.comm_buckets.empty()) {
      return RuleResult::Skip("no collective timings on steady-state steps");
    }
    const auto& ws = view.run().world_size;
    if (!ws || *ws <= 1) return RuleResult::Pass();
    return RuleResult::Skip(StrFormat("rank of %lld: gpuprof does not time DDP's collectives "
                                      "yet; torch.profiler shows the NCCL / gloo kernels "
                                      "meanwhile",
                                      static_cast<long long>(*ws)));
  }
  const double f = share->fraction();
  if (f <= kCommFraction) return RuleResult::Pass();
  const double steps = static_cast<double>(share->steps);
  nlohmann::json evidence = {
      {"comm_fraction", f},          {"comm_total_ns", share->comm_ns},
      {"step_total_ns", share->step_ns}, {"steps", share->steps},
      {"buckets_per_step", share->buckets / steps}, {"threshold", kCommFraction},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("Collectives were in flight for %s of step time (%s of %s per step, %s buckets "
                "per step)",
                FormatPercent(f).c_str(), FormatDuration(share->comm_ns / steps).c_str(),
                FormatDuration(share->step_ns / steps).c_str(),
                FormatCompact(share->buckets / steps).c_str()),
      std::move(evidence));
}

// For every (step, bucket) timed on two or more ranks, the rank that started the collective
// last is "late" when it started more than kBucketLateMs after the median start of the other
// ranks. Start times are aligned across hosts with each run's start_unix_ns. Fires when one
// rank is late on the same bucket on at least kBucketLateFraction of that bucket's steps;
// reports the bucket with the highest share (then the largest p95 delta over its late steps).
RuleResult BucketSkew(const GroupView& group, const RuleContext&) {
  const size_t nranks = group.ranks.size();
  if (nranks < 2) {
    return RuleResult::Skip(StrFormat("needs at least 2 ranks; the group has %zu", nranks));
  }
  struct Row {
    int64_t step, bucket, start;
  };
  std::vector<std::vector<Row>> rows(nranks);
  size_t with_buckets = 0;
  for (size_t r = 0; r < nranks; ++r) {
    const RunView& v = group.ranks[r];
    for (const auto& b : v.data.comm_buckets) {
      rows[r].push_back({b.step, b.bucket, v.run().start_unix_ns + b.start_ns});
    }
    std::sort(rows[r].begin(), rows[r].end(), [](const Row& a, const Row& b) {
      return std::tie(a.step, a.bucket, a.start) < std::tie(b.step, b.bucket, b.start);
    });
    if (!rows[r].empty()) ++with_buckets;
  }
  if (with_buckets == 0) {
    return RuleResult::Skip("gpuprof does not time DDP's collectives yet; torch.profiler on two "
                            "ranks shows which one starts the NCCL / gloo kernels last");
  }
  if (with_buckets < 2) {
    return RuleResult::Skip(StrFormat("collective timings (comm_buckets) recorded on %zu of %zu "
                                      "ranks; needs at least 2",
                                      with_buckets, nranks));
  }
  struct BucketAcc {
    size_t steps = 0;
    std::map<size_t, std::vector<double>> late;  // rank index -> deltas on its late steps
  };
  std::map<int64_t, BucketAcc> buckets;
  std::vector<size_t> pos(nranks, 0);
  const double late_ns = kBucketLateMs * 1e6;
  std::vector<std::pair<size_t, int64_t>> here;  // (rank index, start) for the current key
  std::vector<double> others;
  while (true) {
    // The smallest (step, bucket) among the ranks' cursors.
    std::optional<std::pair<int64_t, int64_t>> key;
    for (size_t r = 0; r < nranks; ++r) {
      if (pos[r] >= rows[r].size()) continue;
      const Row& row = rows[r][pos[r]];
      const auto k = std::make_pair(row.step, row.bucket);
      if (!key || k < *key) key = k;
    }
    if (!key) break;
    here.clear();
    for (size_t r = 0; r < nranks; ++r) {
      bool first = true;
      while (pos[r] < rows[r].size() && rows[r][pos[r]].step == key->first &&
             rows[r][pos[r]].bucket == key->second) {
        if (first) here.emplace_back(r, rows[r][pos[r]].start);  // duplicates: the earliest
        first = false;
        ++pos[r];
      }
    }
    if (here.size() < 2) continue;
    BucketAcc& acc = buckets[key->second];
    ++acc.steps;
    size_t last = 0;
    for (size_t i = 1; i < here.size(); ++i) {
      if (here[i].second > here[last].second) last = i;
    }
    // Differences of int64 wall-clock ns: converting the absolute values to double first would
    // lose sub-microsecond precision (they are ~1.7e18).
    int64_t base = here[0].second;
    for (const auto& [r, start] : here) base = std::min(base, start);
    others.clear();
    for (size_t i = 0; i < here.size(); ++i) {
      if (i != last) others.push_back(static_cast<double>(here[i].second - base));
    }
    const double delta = static_cast<double>(here[last].second - base) - *Median(others);
    if (delta > late_ns) acc.late[here[last].first].push_back(delta);
  }
  bool evaluable = false;
  struct Finding {
    int64_t bucket = 0;
    size_t rank = 0;
    size_t late = 0, steps = 0;
    double share = 0, p95 = 0;
  };
  std::optional<Finding> worst;
  size_t findings = 0;
  for (auto& [bucket, acc] : buckets) {
    if (acc.steps < kBucketSkewMinSteps) continue;
    evaluable = true;
    for (auto& [rank, deltas] : acc.late) {
      const double share = static_cast<double>(deltas.size()) / static_cast<double>(acc.steps);
      if (share < kBucketLateFraction) continue;
      ++findings;
      std::sort(deltas.begin(), deltas.end());
      const Finding f{bucket, rank, deltas.size(), acc.steps, share, Percentile(deltas, 0.95)};
      if (!worst || f.share > worst->share || (f.share == worst->share && f.p95 > worst->p95)) {
        worst = f;
      }
    }
  }
  if (!evaluable) {
    return RuleResult::Skip(StrFormat("no bucket was timed on 2+ ranks on at least %zu steps",
                                      kBucketSkewMinSteps));
  }
  if (!worst) return RuleResult::Pass();
  const store::RunInfo& run = group.ranks[worst->rank].run();
  nlohmann::json evidence = {
      {"bucket", worst->bucket},
      {"rank", run.rank ? nlohmann::json(*run.rank) : nlohmann::json()},
      {"run_id", run.run_id},
      {"late_steps", worst->late},
      {"steps", worst->steps},
      {"late_fraction", worst->share},
      {"p95_delta_ns", worst->p95},
      {"findings", findings},
      {"threshold", kBucketLateFraction},
  };
  std::string more;
  if (findings > 1) {
    more = StrFormat("; %zu more bucket/rank pair%s the same", findings - 1,
                     findings == 2 ? " shows" : "s show");
  }
  return RuleResult::Fire(
      worst->share >= kBucketHighFraction ? Severity::kHigh : Severity::kMed,
      StrFormat("Bucket %lld: %s is late on %s of steps (p95 delta %s)%s",
                static_cast<long long>(worst->bucket), RankLabel(run).c_str(),
                FormatPercent(worst->share).c_str(), FormatDuration(worst->p95).c_str(),
                more.c_str()),
      std::move(evidence));
}

// Fires when one rank's steady-state median step exceeds the median of the other ranks'
// medians by more than kRankSkewFraction; reports the slowest such rank.
RuleResult RankSkew(const GroupView& group, const RuleContext&) {
  std::vector<std::pair<size_t, double>> medians;  // (rank index, steady p50)
  for (size_t i = 0; i < group.ranks.size(); ++i) {
    if (group.ranks[i].steady) medians.emplace_back(i, group.ranks[i].steady->p50_ns);
  }
  if (medians.size() < 2) {
    return RuleResult::Skip(StrFormat("needs at least 2 ranks with a steady state; the group has "
                                      "%zu",
                                      medians.size()));
  }
  std::optional<size_t> worst;
  double worst_frac = 0, worst_base = 0;
  for (size_t i = 0; i < medians.size(); ++i) {
    std::vector<double> others;
    for (size_t j = 0; j < medians.size(); ++j) {
      if (j != i) others.push_back(medians[j].second);
    }
    const double base = *Median(others);
    if (base <= 0) continue;
    const double frac = medians[i].second / base - 1;
    if (!worst || frac > worst_frac) {
      worst = i;
      worst_frac = frac;
      worst_base = base;
    }
  }
  if (!worst || worst_frac <= kRankSkewFraction) return RuleResult::Pass();
  const store::RunInfo& run = group.ranks[medians[*worst].first].run();
  const double mine = medians[*worst].second;
  std::string against;
  if (medians.size() == 2) {
    against = " on " + RankLabel(group.ranks[medians[1 - *worst].first].run());
  } else {
    against = StrFormat(", the median of the other %zu ranks", medians.size() - 1);
  }
  nlohmann::json evidence = {
      {"rank", run.rank ? nlohmann::json(*run.rank) : nlohmann::json()},
      {"run_id", run.run_id},
      {"median_ns", mine},
      {"others_median_ns", worst_base},
      {"slower_fraction", worst_frac},
      {"ranks", medians.size()},
      {"threshold", kRankSkewFraction},
  };
  return RuleResult::Fire(
      Severity::kMed,
      StrFormat("Rank skew: %s median step %s vs %s%s (%s slower)", RankLabel(run).c_str(),
                FormatDuration(mine).c_str(), FormatDuration(worst_base).c_str(),
                against.c_str(), FormatPercent(worst_frac).c_str()),
      std::move(evidence));
}

}  // namespace gpuprof::analysis::rules
