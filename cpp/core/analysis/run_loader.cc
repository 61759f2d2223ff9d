#include "analysis/run_loader.h"

#include <set>

#include "analysis/format.h"
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
    out.push_back(std::move(d));
  }
  return out;
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
