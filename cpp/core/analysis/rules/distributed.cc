// Distributed rules: collectives within one rank (comm_dominant) and across the ranks of a group
// (bucket_skew, rank_skew; see group.h).
#include <algorithm>
#include <map>
#include <unordered_map>

#include "analysis/format.h"
#include "analysis/group.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis::rules {

using namespace thresholds;

namespace {

// Why a distributed rank has no collective timings: gpuprof times DDP's buckets with a comm
// hook it installs itself, and it cannot in these cases.
constexpr const char* kNoCommHook =
    "no collective timings: the DDP comm hook was not installed (no DistributedDataParallel "
    "model in auto mode, FSDP/DeepSpeed, or a comm hook registered before profile() started; "
    "see the run's diagnostics)";

// Every (step, bucket) of the group: the ranks that timed it and when each started it, on the
// common clock (GroupView::AlignedNs). A rank with several rows of one key counts once, by its
// earliest start.
using BucketKey = std::pair<int64_t, int64_t>;  // (step, bucket)
struct BucketStarts {
  std::map<BucketKey, std::vector<std::pair<size_t, int64_t>>> starts;  // (rank index, start)
  size_t ranks_with_buckets = 0;
};

BucketStarts CollectStarts(const GroupView& group) {
  BucketStarts out;
  for (size_t r = 0; r < group.ranks.size(); ++r) {
    const auto& rows = group.ranks[r].data.comm_buckets;
    if (!rows.empty()) ++out.ranks_with_buckets;
    for (const auto& b : rows) {
      auto& here = out.starts[{b.step, b.bucket}];
      const int64_t at = group.AlignedNs(r, b.start_ns);
      // The ranks are visited in turn: this rank's entry, if any, is the last one.
      if (here.empty() || here.back().first != r) {
        here.emplace_back(r, at);
      } else {
        here.back().second = std::min(here.back().second, at);
      }
    }
  }
  return out;
}

// bucket_skew's measurement, which rank_skew reads too (precedence between the two).
struct BucketLateness {
  struct Finding {
    int64_t bucket = 0;
    size_t rank = 0;  // index into GroupView::ranks
    size_t late = 0, steps = 0;
    double share = 0, p95 = 0;
  };
  size_t ranks_with_buckets = 0;
  size_t buckets_evaluated = 0;      // buckets timed on 2+ ranks on kBucketSkewMinSteps+ steps
  std::vector<Finding> findings;     // (bucket, rank) pairs late on kBucketLateFraction+ steps
  std::vector<size_t> late_buckets;  // per rank index: the evaluated buckets it is late on
  std::optional<Finding> worst;      // the highest share, then the largest p95
  // Late on (almost) every evaluated bucket: the rank, not the work before one bucket.
  bool RankWide(size_t rank) const {
    const size_t late = late_buckets[rank];
    return late > 0 && static_cast<double>(late) >=
                           kBucketRankWideFraction * static_cast<double>(buckets_evaluated);
  }
};

BucketLateness MeasureBucketLateness(const GroupView& group, const BucketStarts& all) {
  BucketLateness out;
  out.ranks_with_buckets = all.ranks_with_buckets;
  out.late_buckets.assign(group.ranks.size(), 0);
  struct BucketAcc {
    size_t steps = 0;
    std::map<size_t, std::vector<double>> late;  // rank index -> deltas on its late steps
  };
  std::map<int64_t, BucketAcc> buckets;
  const double late_ns = kBucketLateMs * 1e6;
  std::vector<double> others;
  for (const auto& [key, here] : all.starts) {
    if (here.size() < 2) continue;
    BucketAcc& acc = buckets[key.second];
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
  for (auto& [bucket, acc] : buckets) {
    if (acc.steps < kBucketSkewMinSteps) continue;
    ++out.buckets_evaluated;
    for (auto& [rank, deltas] : acc.late) {
      const double share = static_cast<double>(deltas.size()) / static_cast<double>(acc.steps);
      if (share < kBucketLateFraction) continue;
      ++out.late_buckets[rank];
      std::sort(deltas.begin(), deltas.end());
      const BucketLateness::Finding f{bucket,    rank,  deltas.size(),
                                      acc.steps, share, Percentile(deltas, 0.95)};
      out.findings.push_back(f);
      const auto& w = out.worst;
      if (!w || f.share > w->share || (f.share == w->share && f.p95 > w->p95)) out.worst = f;
    }
  }
  return out;
}

// Per rank index, its steady-state steps' work time: the step's duration minus the time it
// waited for the other ranks in the collectives. Per step, that wait is the largest, over the
// step's buckets timed on 2+ ranks, of how much later than this rank the last rank started the
// bucket (0 when this rank was last); the fast ranks of a synchronous job spend it blocked in
// the collectives. Steps without such a bucket are left out; a rank without any has none.
std::vector<std::vector<double>> WorkTimes(const GroupView& group, const BucketStarts& all) {
  std::vector<std::unordered_map<int64_t, int64_t>> wait(group.ranks.size());
  for (const auto& [key, here] : all.starts) {
    if (here.size() < 2) continue;
    int64_t latest = here[0].second;
    for (const auto& [r, at] : here) latest = std::max(latest, at);
    for (const auto& [r, at] : here) {
      int64_t& w = wait[r].try_emplace(key.first, 0).first->second;
      w = std::max(w, latest - at);
    }
  }
  std::vector<std::vector<double>> out(group.ranks.size());
  for (size_t r = 0; r < group.ranks.size(); ++r) {
    const RunView& v = group.ranks[r];
    for (size_t i = v.steady_begin; i < v.steps.size(); ++i) {
      auto it = wait[r].find(v.steps[i].step);
      if (it == wait[r].end()) continue;
      out[r].push_back(
          static_cast<double>(std::max<int64_t>(0, v.steps[i].duration_ns - it->second)));
    }
  }
  return out;
}

}  // namespace

// This rank's wait for the other ranks, when enough of its collectives' steps were compared.
std::optional<PeerWaitShare> RepresentativePeerWait(const RunView& view,
                                                    const RuleContext& context) {
  if (!context.peer_waits || context.peer_waits->peers.empty()) return std::nullopt;
  auto share = MeasurePeerWait(view, *context.peer_waits);
  if (!share || !share->representative()) return std::nullopt;
  return share;
}

// Fires when, over the steady-state steps with comm_buckets rows, a collective is in flight for
// more than kCommFraction of step time (per step, the union of its bucket intervals, so
// concurrent buckets count once). A run that is not distributed (world_size NULL or 1) and has
// no collective rows passes: it has no communication. When the other ranks' timings were
// compared (RuleContext::peer_waits), the message says how much of that time this rank waited
// for them, and "mostly_peer_wait" marks a finding whose collectives are mostly that wait
// (peer_wait explains it then). Steps that accumulate gradients get their own fix: no_sync()
// when most of them reduced a bucket more than once (after every backward pass), more
// micro-batches per step when they already reduce once per several passes.
RuleResult CommDominant(const RunView& view, const RuleContext& context) {
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const std::optional<CommShare> share = MeasureCommShare(view);
  if (!share) {
    if (!view.data.comm_buckets.empty()) {
      return RuleResult::Skip("no collective timings on steady-state steps");
    }
    const auto& ws = view.run().world_size;
    if (!ws || *ws <= 1) return RuleResult::Pass();
    return RuleResult::Skip(kNoCommHook);
  }
  const double f = share->fraction();
  if (f <= kCommFraction) return RuleResult::Pass();
  const double steps = static_cast<double>(share->steps);
  nlohmann::json evidence = {
      {"comm_fraction", f},
      {"comm_total_ns", share->comm_ns},
      {"step_total_ns", share->step_ns},
      {"steps", share->steps},
      {"buckets_per_step", share->buckets / steps},
      {"threshold", kCommFraction},
      {"peer_wait_fraction", nullptr},
      {"mostly_peer_wait", false},
      {"syncs_per_step", share->syncs / steps},
      {"multi_sync_steps", share->multi_sync_steps},
      {"backward_passes_per_step", share->backward_passes / steps},
  };
  std::string waiting;
  if (const auto wait = RepresentativePeerWait(view, context)) {
    const double w = std::min(wait->fraction(), f);
    evidence["peer_wait_fraction"] = w;
    evidence["mostly_peer_wait"] = w > kPeerWaitFraction && f - w <= kCommFraction;
    waiting = StrFormat("; %s of step time waiting for the other ranks to start them",
                        FormatPercent(w).c_str());
  }
  // Gradient accumulation: most steps reduced a bucket more than once (an all-reduce after
  // each backward pass), or the steps run several passes and reduce once (no_sync() in use).
  const bool every_pass = 2 * share->multi_sync_steps > share->steps;
  const bool accumulating = !every_pass && share->backward_passes / steps >= 1.5;
  std::string syncs;
  if (every_pass) {
    syncs = StrFormat(
        ": each bucket was all-reduced %s times a step, after each of its %s "
        "backward passes",
        FormatCompact(share->syncs / steps).c_str(),
        FormatCompact(share->backward_passes / steps).c_str());
  } else if (accumulating) {
    syncs = StrFormat(": one all-reduce per %s backward passes",
                      FormatCompact(share->backward_passes / steps).c_str());
  }
  const std::string buckets_text = FormatCompact(share->buckets / steps);
  RuleResult r = RuleResult::Fire(
      Severity::kMed,
      StrFormat("Collectives were in flight for %s of step time (%s of %s per step, %s %s per "
                "step%s)%s",
                FormatPercent(f).c_str(), FormatDuration(share->comm_ns / steps).c_str(),
                FormatDuration(share->step_ns / steps).c_str(), buckets_text.c_str(),
                buckets_text == "1" ? "bucket" : "buckets", waiting.c_str(), syncs.c_str()),
      std::move(evidence));
  if (every_pass) r.insight->fix = kCommDominantNoSyncFix;
  if (accumulating) r.insight->fix = kCommDominantAccumulatingFix;
  return r;
}

// Fires when, over the steady-state steps whose buckets another rank of the job timed too, this
// rank waited for the others in its collectives for more than kPeerWaitFraction of step time
// (RuleContext::peer_waits: per step, how much later than this rank the last rank started a
// bucket, capped at the step's time with a collective in flight). Names the rank it waited for
// on the most steps. A run that is not distributed passes.
RuleResult PeerWait(const RunView& view, const RuleContext& context) {
  if (auto why = NeedSteadyState(view)) return RuleResult::Skip(*why);
  const auto& ws = view.run().world_size;
  if (!ws || *ws <= 1) return RuleResult::Pass();
  if (!context.peer_waits) {
    return RuleResult::Skip(
        "needs the other ranks' bucket timings from the store the job wrote (this analysis "
        "read the run alone)");
  }
  const PeerWaits& peers = *context.peer_waits;
  if (peers.peers.empty()) return RuleResult::Skip(peers.reason);
  if (view.data.comm_buckets.empty()) return RuleResult::Skip(kNoCommHook);
  const auto share = MeasurePeerWait(view, peers);
  if (!share) {
    return RuleResult::Skip(StrFormat(
        "no steady-state step whose buckets another rank timed too (%s compared: their bucket "
        "timings are not in the store yet, or they timed other steps)",
        peers.peers.size() == 1 ? peers.peers[0].c_str()
                                : StrFormat("%zu ranks", peers.peers.size()).c_str()));
  }
  if (!share->representative()) {
    return RuleResult::Skip(StrFormat(
        "only %zu of the %zu steady-state steps with collectives were timed by another rank "
        "too (the others' timings are not all in the store yet)",
        share->steps, share->comm_steps));
  }
  const double f = share->fraction();
  if (f <= kPeerWaitFraction) return RuleResult::Pass();
  const double steps = static_cast<double>(share->steps);
  const std::string who = share->slowest.value_or("the other ranks");
  const double who_share = share->waited_steps ? static_cast<double>(share->slowest_steps) /
                                                     static_cast<double>(share->waited_steps)
                                               : 0.0;
  nlohmann::json evidence = {
      {"peer_wait_fraction", f},
      {"wait_total_ns", share->wait_ns},
      {"step_total_ns", share->step_ns},
      {"steps", share->steps},
      {"comm_steps", share->comm_steps},
      {"waited_steps", share->waited_steps},
      {"slowest", share->slowest ? nlohmann::json(*share->slowest) : nlohmann::json(nullptr)},
      {"slowest_share", who_share},
      {"group_id", peers.group_id},
      {"ranks_compared", peers.peers.size()},
      {"threshold", kPeerWaitFraction},
  };
  // What the rank waited for found in its own report, when it stored one in this file.
  const auto found =
      share->slowest ? peers.peer_leads.find(*share->slowest) : peers.peer_leads.end();
  const store::InsightRow* lead = found != peers.peer_leads.end() ? &found->second : nullptr;
  evidence["slowest_insight"] = LeadEvidence(lead);
  const std::string its_own = LeadText(lead, who + "'s");
  RuleResult r = RuleResult::Fire(
      Severity::kMed,
      StrFormat("This rank waited %s of step time (%s of %s per step) in its collectives for "
                "%s, the last to start them on %s of the steps it waited: the job runs at that "
                "rank's pace%s",
                FormatPercent(f).c_str(), FormatDuration(share->wait_ns / steps).c_str(),
                FormatDuration(share->step_ns / steps).c_str(), who.c_str(),
                FormatPercent(who_share).c_str(), its_own.c_str()),
      std::move(evidence));
  if (auto fix = LeadFix(who, lead)) {
    r.insight->fix = *fix;
    return r;
  }
  r.insight->fix = StrFormat(
      "Make %s faster, not the communication: gpuprof insights --group %s compares the ranks, "
      "and that rank's own report names its bottleneck (its host's CPU load or dataloader, its "
      "GPU's clocks or thermals, uneven data sharding).",
      who.c_str(), peers.group_id.c_str());
  return r;
}

// For every (step, bucket) timed on two or more ranks, the rank that started the collective
// last is "late" when it started more than kBucketLateMs after the median start of the other
// ranks. Start times are put on one clock with each run's start_unix_ns minus the rank's
// measured clock offset (GroupView::AlignedNs). Fires when one rank is late on the same bucket
// on at least kBucketLateFraction of that bucket's steps; reports the bucket with the highest
// share (then the largest p95 delta over its late steps). The evidence says whether that rank is
// late on (almost) every evaluated bucket ("rank_wide": rank_skew's cause, which explains it).
RuleResult BucketSkew(const GroupView& group, const RuleContext&) {
  const size_t nranks = group.ranks.size();
  if (nranks < 2) {
    return RuleResult::Skip(StrFormat("needs at least 2 ranks; the group has %zu", nranks));
  }
  const BucketStarts all = CollectStarts(group);
  if (all.ranks_with_buckets == 0) return RuleResult::Skip(kNoCommHook);
  if (all.ranks_with_buckets < 2) {
    return RuleResult::Skip(
        StrFormat("collective timings (comm_buckets) recorded on %zu of %zu "
                  "ranks; needs at least 2",
                  all.ranks_with_buckets, nranks));
  }
  const BucketLateness m = MeasureBucketLateness(group, all);
  if (m.buckets_evaluated == 0) {
    return RuleResult::Skip(
        StrFormat("no bucket was timed on 2+ ranks on at least %zu steps", kBucketSkewMinSteps));
  }
  if (!m.worst) return RuleResult::Pass();
  const BucketLateness::Finding& worst = *m.worst;
  const store::RunInfo& run = group.ranks[worst.rank].run();
  const size_t findings = m.findings.size();
  nlohmann::json evidence = {
      {"bucket", worst.bucket},
      {"rank", run.rank ? nlohmann::json(*run.rank) : nlohmann::json()},
      {"run_id", run.run_id},
      {"late_steps", worst.late},
      {"steps", worst.steps},
      {"late_fraction", worst.share},
      {"p95_delta_ns", worst.p95},
      {"findings", findings},
      {"late_buckets", m.late_buckets[worst.rank]},
      {"buckets_evaluated", m.buckets_evaluated},
      {"rank_wide", m.RankWide(worst.rank)},
      {"aligned_ranks", group.AlignedRanks()},
      {"threshold", kBucketLateFraction},
  };
  std::string more;
  if (findings > 1) {
    more = StrFormat("; %zu more bucket/rank pair%s the same", findings - 1,
                     findings == 2 ? " shows" : "s show");
  }
  return RuleResult::Fire(worst.share >= kBucketHighFraction ? Severity::kHigh : Severity::kMed,
                          StrFormat("Bucket %lld: %s is late on %s of steps (p95 delta %s)%s",
                                    static_cast<long long>(worst.bucket), RankLabel(run).c_str(),
                                    FormatPercent(worst.share).c_str(),
                                    FormatDuration(worst.p95).c_str(), more.c_str()),
                          std::move(evidence));
}

// In synchronous data-parallel training every rank's step takes as long as the slowest rank's
// (the others wait for it in the collectives), so step times cannot tell the slow rank. With
// comm_buckets on 2+ ranks the ranks are compared by their work time (WorkTimes: step time minus
// the wait for the others); else by step time. Fires when one rank's steady-state median
// exceeds the median of the other ranks' medians by more than kRankSkewFraction; reports the
// slowest such rank. The evidence says whether bucket_skew finds that rank late before only
// some buckets ("bucket_local": bucket_skew's cause, which explains it). The message ends with
// the slow rank's own leading finding when its report is stored, and the fix starts there.
RuleResult RankSkew(const GroupView& group, const RuleContext&) {
  const BucketStarts all = CollectStarts(group);
  const std::vector<std::vector<double>> work = WorkTimes(group, all);
  std::vector<std::pair<size_t, double>> by_work, by_step;  // (rank index, steady median)
  for (size_t i = 0; i < group.ranks.size(); ++i) {
    if (!group.ranks[i].steady) continue;
    by_step.emplace_back(i, group.ranks[i].steady->p50_ns);
    if (auto m = Median(work[i])) by_work.emplace_back(i, *m);
  }
  const bool work_basis = by_work.size() >= 2;
  const std::vector<std::pair<size_t, double>>& medians = work_basis ? by_work : by_step;
  if (medians.size() < 2) {
    return RuleResult::Skip(
        StrFormat("needs at least 2 ranks with a steady state; the group has "
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
  const size_t index = medians[*worst].first;
  const store::RunInfo& run = group.ranks[index].run();
  const double mine = medians[*worst].second;
  std::string against;
  if (medians.size() == 2) {
    against = " on " + RankLabel(group.ranks[medians[1 - *worst].first].run());
  } else {
    against = StrFormat(", the median of the other %zu ranks", medians.size() - 1);
  }
  const BucketLateness buckets = MeasureBucketLateness(group, all);
  const size_t late_buckets = buckets.late_buckets[index];
  nlohmann::json evidence = {
      {"basis", work_basis ? "work_time" : "step_time"},
      {"rank", run.rank ? nlohmann::json(*run.rank) : nlohmann::json()},
      {"run_id", run.run_id},
      {"median_ns", mine},
      {"others_median_ns", worst_base},
      {"step_median_ns", group.ranks[index].steady->p50_ns},
      {"slower_fraction", worst_frac},
      {"ranks", medians.size()},
      {"late_buckets", late_buckets},
      {"buckets_evaluated", buckets.buckets_evaluated},
      {"bucket_local", late_buckets > 0 && !buckets.RankWide(index)},
      {"aligned_ranks", group.AlignedRanks()},
      {"threshold", kRankSkewFraction},
  };
  // What the straggler's own report found: usually the reason it is slow.
  const store::InsightRow* lead = LeadingFinding(group.ranks[index].data.insights);
  evidence["straggler_insight"] = LeadEvidence(lead);
  const std::string its_own = LeadText(lead, "its");
  std::string message;
  if (work_basis) {
    evidence["work_steps"] = work[index].size();
    message = StrFormat(
        "Rank skew: %s works %s per step vs %s%s (%s slower; the others wait for it in the "
        "collectives)%s",
        RankLabel(run).c_str(), FormatDuration(mine).c_str(), FormatDuration(worst_base).c_str(),
        against.c_str(), FormatPercent(worst_frac).c_str(), its_own.c_str());
  } else {
    message =
        StrFormat("Rank skew: %s median step %s vs %s%s (%s slower)%s", RankLabel(run).c_str(),
                  FormatDuration(mine).c_str(), FormatDuration(worst_base).c_str(), against.c_str(),
                  FormatPercent(worst_frac).c_str(), its_own.c_str());
  }
  RuleResult r = RuleResult::Fire(Severity::kMed, std::move(message), std::move(evidence));
  if (auto fix = LeadFix(RankLabel(run), lead)) r.insight->fix = *fix;
  return r;
}

}  // namespace gpuprof::analysis::rules
