// Rule functions, one translation unit per family. Internal to analysis/: callers go through
// the registry (rules/registry.h). Each returns RuleResult::Pass, Fire or Skip.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analysis/insight.h"
#include "analysis/run_view.h"

namespace gpuprof::analysis {
struct GroupView;
}

namespace gpuprof::analysis::rules {

// data_pipeline.cc
RuleResult DataloaderStall(const RunView& view, const RuleContext& context);
RuleResult LoaderEpochStart(const RunView& view, const RuleContext& context);
RuleResult PrefetchQueueStarved(const RunView& view, const RuleContext& context);
RuleResult CpuBoundDataloader(const RunView& view, const RuleContext& context);
RuleResult IoBoundDataloader(const RunView& view, const RuleContext& context);
RuleResult ColdCache(const RunView& view, const RuleContext& context);
RuleResult CacheThrashing(const RunView& view, const RuleContext& context);
RuleResult PcieSaturation(const RunView& view, const RuleContext& context);
// host.cc
RuleResult WorkerImbalance(const RunView& view, const RuleContext& context);
RuleResult HostMemoryPressure(const RunView& view, const RuleContext& context);
RuleResult HostStalls(const RunView& view, const RuleContext& context);
RuleResult CpuContention(const RunView& view, const RuleContext& context);
// compute.cc
RuleResult KernelLaunchOverhead(const RunView& view, const RuleContext& context);
RuleResult LowMfu(const RunView& view, const RuleContext& context);
RuleResult SmallBatch(const RunView& view, const RuleContext& context);
RuleResult GradientCheckpointing(const RunView& view, const RuleContext& context);
RuleResult SdpaSuboptimal(const RunView& view, const RuleContext& context);
RuleResult KernelDrift(const RunView& view, const RuleContext& context);
// memory_thermal.cc
RuleResult MemoryPressure(const RunView& view, const RuleContext& context);
RuleResult ThermalThrottling(const RunView& view, const RuleContext& context);
// warmup.cc
RuleResult CompilationWarmup(const RunView& view, const RuleContext& context);
RuleResult FirstStepOutlier(const RunView& view, const RuleContext& context);
RuleResult HighStepVariance(const RunView& view, const RuleContext& context);
RuleResult EvaluationInSteps(const RunView& view, const RuleContext& context);
// distributed.cc
RuleResult CommDominant(const RunView& view, const RuleContext& context);
RuleResult PeerWait(const RunView& view, const RuleContext& context);
RuleResult BucketSkew(const GroupView& group, const RuleContext& context);
RuleResult RankSkew(const GroupView& group, const RuleContext& context);
// regression.cc
RuleResult Regression(const RunView& view, const RuleContext& context);
// cost.cc
RuleResult Cost(const RunView& view, const RuleContext& context);
// The rate the cost rule prices a run at: USD per GPU-hour (per machine-hour on a CPU run) and
// where it comes from ("GPUPROF_GPU_RATE", "option", "reference: <instance>", ...). nullopt
// with `why` set ("cost unknown: ...") when none applies.
struct CostRate {
  double usd_per_hour = 0;
  std::string source;
};
std::optional<CostRate> ResolveCostRate(const RunView& view, const RuleContext& context,
                                        std::string* why);

// Shared preconditions. Return a reason when the run has too few steps, else nullopt.
std::optional<std::string> NeedSteps(const RunView& view, size_t min_steps);
std::optional<std::string> NeedSteadyState(const RunView& view);

// Why GPU / host telemetry is missing, for "not evaluated" reasons: "<what> not sampled"
// followed by the cause when one is known (CPU run, the collector's recorded reason).
std::string GpuMissing(const RunView& view, const std::string& what);
std::string HostMissing(const RunView& view, const std::string& what);

// The host samples the data-pipeline rules read: those inside the steady-state window, or every
// sample of the run when none falls inside it (a short run sampled slowly). `steady` says which.
struct HostWindow {
  std::vector<const store::HostSampleRow*> samples;
  bool steady = false;
};
HostWindow SteadyHostSamples(const RunView& view);
// The load of processes other than the training's over a host window, in cores: per sample
// with the host's CPU, its core count and the training tree's CPU, host busy cores minus the
// tree's and, on a rank of a job with other ranks on this host, minus theirs (job_cpu_pct):
// the load from outside the job. The mean and the least over them; nullopt when no sample has
// the first three. job_mean_cores: the job's other ranks' mean over the samples that have it (the
// ranks may tell each other their pids only at the first step).
struct OtherLoad {
  double mean_cores = 0;
  double min_cores = 0;
  double ncores = 0;  // the machine's cores (the most seen)
  size_t samples = 0;
  double own_mean_cores = 0;  // the training tree's
  std::optional<double> job_mean_cores;
};
std::optional<OtherLoad> MeasureOtherLoad(const HostWindow& w);
// The training's threads' run-queue wait (StepView::cpu_wait_ns) over the steady-state steps as
// a share of their time; nullopt when the CPU wait was not read or there is no steady state.
std::optional<double> SteadyCpuWaitShare(const RunView& view);
// The same for GPU telemetry, read from the per-second rollups (gpu_samples_1s): the seconds
// that overlap the steady-state window, or every second of the run when none does.
struct GpuWindow {
  std::vector<const store::GpuRollupRow*> seconds;
  bool steady = false;
};
GpuWindow SteadyGpuSeconds(const RunView& view);

// Mean of one optional column over samples, skipping unmeasured values; nullopt if none.
template <typename Row, typename T>
std::optional<double> MeanOf(const std::vector<const Row*>& rows, std::optional<T> Row::*field) {
  double sum = 0;
  size_t n = 0;
  for (const Row* r : rows) {
    if (const auto& v = r->*field) {
      sum += static_cast<double>(*v);
      ++n;
    }
  }
  return n ? std::optional<double>(sum / static_cast<double>(n)) : std::nullopt;
}
// Mean over the readings behind per-row means (`mean` weighted by its count `n`), skipping rows
// without a reading; nullopt if none. Over rollup rows this is the mean over the raw samples.
template <typename Row, typename T>
std::optional<double> WeightedMeanOf(const std::vector<const Row*>& rows,
                                     std::optional<T> Row::*mean, int64_t Row::*n) {
  double sum = 0;
  int64_t count = 0;
  for (const Row* r : rows) {
    if (const auto& v = r->*mean; v && r->*n > 0) {
      sum += static_cast<double>(*v) * static_cast<double>(r->*n);
      count += r->*n;
    }
  }
  return count ? std::optional<double>(sum / static_cast<double>(count)) : std::nullopt;
}
// Median of one optional column over samples; nullopt if none.
template <typename Row, typename T>
std::optional<double> MedianOf(const std::vector<const Row*>& rows, std::optional<T> Row::*field) {
  std::vector<double> values;
  for (const Row* r : rows) {
    if (const auto& v = r->*field) values.push_back(static_cast<double>(*v));
  }
  return Median(std::move(values));
}

// The dataloader stall the cpu/io-bound rules build on: the steady-state wait fraction, or why
// it is unknown.
// The training loop's loader wait: over the steady steps without evaluation steps
// (RunView::evaluation_steps), whose waits are the evaluation's loader.
struct Stall {
  std::optional<double> fraction;
  std::string reason;                    // set when fraction is nullopt
  const Breakdown* breakdown = nullptr;  // the breakdown the fraction is from
  size_t evaluation_steps_left_out = 0;
  // "" or ", without the 5 evaluation steps" (for a message's parenthesis).
  std::string LeftOutText() const;
  bool stalled() const;       // fraction > kStallFraction
  Severity severity() const;  // HIGH at kStallHighFraction, else MED
};
Stall MeasureStall(const RunView& view);

// The loader's starts in the steady state (evaluation steps left out): the steps whose wait
// holds an iter(loader) that started worker processes (steps.loader_starts > 0: an epoch's start
// without persistent_workers), and their wait above the
// median wait of the other steps measured inside the loader. nullopt when no steady step's wait
// says whether it started the loader (not measured in a torch DataLoader, or an older file).
struct EpochStarts {
  std::vector<int64_t> steps;  // the steps that started the loader
  double excess_ns = 0;        // their waits above the other steps' median wait, summed
  double start_ns = 0;         // time inside iter(loader) in those steps, summed
  double median_wait_ns = 0;   // the other measured steps' median wait
  double wait_total_ns = 0;    // all measured steps' waits, summed
  double step_total_ns = 0;    // the steady steps' time (evaluation steps left out)
};
std::optional<EpochStarts> MeasureEpochStarts(const RunView& view);

// Each steady step's time in neither the loader wait nor a phase (the breakdown's "other"):
// duration - wait - phases, for the steps with a measured wait and at least one phase. A step
// whose wait is only a gap in a run whose loader wait was measured did not call the loader
// (Breakdown::gap_steps_without_loader): its gap counts as other time.
struct StepOther {
  const StepView* step = nullptr;
  double other_ns = 0;
};
std::vector<StepOther> SteadyOtherTimes(const RunView& view);
// The spacing of evenly spaced steps for evidence (StepPeriod), null when they are not.
nlohmann::json PeriodJson(const std::vector<int64_t>& steps);
// FormatStepSet as the subject of a sentence: "4 steps, every 25th (27, …, 102)," gets the
// comma that closes its apposition.
std::string StepSetSubject(const std::vector<int64_t>& steps);

// The steps gpuprof's own CPU-operator trace slowed: the traced steps (cpu_ops rows: torch's
// profiler on) and the step after each (stopping it and reading its operators). CUPTI's kernel
// capture records every step alike, so its traced steps are not among them.
std::set<int64_t> ProfiledSteps(const RunView& view);

// A rank's own leading finding: the first of its stored insights (its report's order) that is
// not about the job's communication (those describe the others' wait, not its cause) nor
// info. nullptr when none.
const store::InsightRow* LeadingFinding(const std::vector<store::InsightRow>& insights);
// "; <whose> own report leads with [HIGH] <message>" ("" without one; whose: "its",
// "rank 1's"), the fix that starts there ("Start with rank 1's own finding (rule): <fix>";
// nullopt without a fix), and its evidence ({rule_id, severity}; null without one).
std::string LeadText(const store::InsightRow* lead, const std::string& whose);
std::optional<std::string> LeadFix(const std::string& rank, const store::InsightRow* lead);
nlohmann::json LeadEvidence(const store::InsightRow* lead);

// Collective time over the steady-state steps that have comm_buckets rows: per step, the
// length of the union of its bucket intervals (time with any collective in flight).
struct CommShare {
  size_t steps = 0;    // steady steps with at least one bucket
  double comm_ns = 0;  // summed union length
  double step_ns = 0;  // summed duration of those steps
  double buckets = 0;  // bucket rows on those steps
  // Steps that reduced some bucket more than once (an all-reduce after each of several backward
  // passes), and the sum over the steps of the most times one bucket was reduced in them.
  size_t multi_sync_steps = 0;
  double syncs = 0;
  double backward_passes = 0;  // summed StepView::backward_calls of those steps
  double fraction() const { return step_ns > 0 ? comm_ns / step_ns : 0; }
};
std::optional<CommShare> MeasureCommShare(const RunView& view);

// This rank's time waiting for the other ranks of its job in the collectives (PeerWaits), over
// the steady-state steps that have comm_buckets rows and a bucket another rank timed too. A
// step's wait is capped at its time with a collective in flight (CommShare's union). nullopt
// when no such step exists.
struct PeerWaitShare {
  size_t steps = 0;         // steps compared
  size_t comm_steps = 0;    // steady-state steps with comm_buckets rows (CommShare::steps)
  double wait_ns = 0;       // summed wait over the compared steps
  double step_ns = 0;       // summed duration of the compared steps
  size_t waited_steps = 0;  // compared steps with a wait
  std::optional<std::string> slowest;  // the rank waited for on the most steps ("rank 1")
  size_t slowest_steps = 0;            // the steps it was the one waited for
  double fraction() const { return step_ns > 0 ? wait_ns / step_ns : 0; }
  // Enough of the collectives' steps were compared to speak for the run.
  bool representative() const { return 2 * steps >= comm_steps; }
};
std::optional<PeerWaitShare> MeasurePeerWait(const RunView& view, const PeerWaits& peers);

// "rank 3", or "run 17" when the run has no rank.
std::string RankLabel(const store::RunInfo& run);

}  // namespace gpuprof::analysis::rules
