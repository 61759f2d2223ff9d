#include "analysis/run_loader.h"

#include <set>

#include "analysis/format.h"
#include "analysis/group.h"
#include "analysis/rules/registry.h"
#include "analysis/run_view.h"

namespace gpuprof::analysis {

Expected<std::vector<PriorRun>> LoadPriorRuns(store::RunStore& store, const store::RunInfo& run) {
  auto previous = store.PreviousRunsNamed(run.run_name, run.run_id,
                                          static_cast<int>(thresholds::kRegressionLookback));
  if (!previous) return previous.status();
  std::vector<PriorRun> out;
  size_t comparable = 0;
  for (const store::RunInfo& info : *previous) {
    if (comparable == thresholds::kRegressionRuns) break;
    auto steps = store.LoadSteps(info.run_id);
    if (!steps) return steps.status();
    store::RunData d;
    d.run = info;
    d.steps = std::move(steps).value();
    const RunView v = BuildRunView(std::move(d));
    PriorRun p;
    p.run_id = info.run_id;
    p.status = info.status;
    p.steps = v.steps.size();
    if (const auto t = MeasureThroughput(v)) {
      p.steady_steps = t->steps;
      p.steady_mean_ns = t->mean_ns;
      p.spread = t->spread;
      if (t->steps >= thresholds::kRegressionMinSteps) ++comparable;
    }
    out.push_back(std::move(p));
  }
  return out;
}

Expected<std::vector<store::RunData>> LoadGroupRuns(store::RunStore& store,
                                                    const std::string& group_id) {
  auto runs = store.ListRuns();
  if (!runs) return runs.status();
  std::vector<store::RunData> out;
  for (store::RunInfo& info : *runs) {
    if (!info.group_id || *info.group_id != group_id) continue;
    store::RunData d;
    d.run = std::move(info);
    auto steps = store.LoadSteps(d.run.run_id);
    if (!steps) return steps.status();
    d.steps = std::move(steps).value();
    auto comm = store.LoadCommBuckets(d.run.run_id);
    if (!comm) return comm.status();
    d.comm_buckets = std::move(comm).value();
    // Each rank's own findings, as its report stored them: rank_skew quotes the straggler's.
    auto insights = store.LoadInsights(d.run.run_id);
    if (!insights) return insights.status();
    d.insights = std::move(insights).value();
    out.push_back(std::move(d));
  }
  return out;
}

std::optional<PeerWaits> LoadPeerWaits(store::RunStore& store, const store::RunData& self) {
  const store::RunInfo& run = self.run;
  if (!run.world_size || *run.world_size <= 1) return std::nullopt;
  PeerWaits none;
  none.group_id = run.group_id.value_or("");
  if (!run.group_id) {
    none.reason = "the run has no group id, so its job's other ranks cannot be found";
    return none;
  }
  auto runs = store.ListRuns();
  if (!runs) {
    none.reason = "the other ranks could not be read: " + runs.status().message();
    return none;
  }
  std::vector<store::RunData> others;
  std::set<int64_t> other_ranks;
  for (store::RunInfo& info : *runs) {
    if (info.run_id == run.run_id || info.group_id != run.group_id) continue;
    if (info.rank && info.rank != run.rank) other_ranks.insert(*info.rank);
    store::RunData d;
    d.run = std::move(info);
    others.push_back(std::move(d));
  }
  none.other_ranks = other_ranks.size();
  const size_t rows = self.comm_buckets.size() * others.size();
  if (rows > thresholds::kPeerWaitMaxRows) {
    none.reason = StrFormat(
        "its %zu bucket rows times the job's %zu other run%s is more than a run's own report "
        "compares (%zu); gpuprof insights --group %s compares the ranks",
        self.comm_buckets.size(), others.size(), others.size() == 1 ? "" : "s",
        thresholds::kPeerWaitMaxRows, run.group_id->c_str());
    return none;
  }
  if (!self.comm_buckets.empty()) {
    for (store::RunData& d : others) {
      auto comm = store.LoadCommBuckets(d.run.run_id);
      if (!comm) {
        none.other_ranks.reset();
        none.reason =
            StrFormat("the bucket timings of run %lld could not be read: %s",
                      static_cast<long long>(d.run.run_id), comm.status().message().c_str());
        return none;
      }
      d.comm_buckets = std::move(comm).value();
      // Its own findings so far (stored when it ended): peer_wait quotes the rank waited for.
      if (auto insights = store.LoadInsights(d.run.run_id)) d.insights = std::move(*insights);
    }
  }
  PeerWaits waits = MeasurePeerWaits(self, std::move(others));
  waits.other_ranks = other_ranks.size();
  return waits;
}

Expected<std::vector<std::string>> ListGroupIds(store::RunStore& store) {
  auto runs = store.ListRuns();
  if (!runs) return runs.status();
  std::set<std::string> ids;
  for (const auto& r : *runs) {
    if (r.group_id) ids.insert(*r.group_id);
  }
  return std::vector<std::string>(ids.begin(), ids.end());
}

}  // namespace gpuprof::analysis
