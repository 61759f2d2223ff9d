// RunView: one stored run plus the statistics every rule and report reads. Built by a pure
// function from store::RunData (no I/O), so rules can be tested on in-memory runs.
//
// Conventions
//  * Every derived value that depends on something that may not have been measured is
//    std::optional; nullopt means "unknown", never 0.
//  * Step k spans [end of step k-1, end of step k]: its duration includes the dataloader
//    wait that preceded it. Durations are end_ns - start_ns.
//  * Steady state. The first steps of a run pay one-time costs (CUDA context, autotuning,
//    torch.compile). Steady-state statistics skip the first kWarmupSteps steps when at least
//    kMinSteadySteps steps remain after them; shorter runs with at least 2 steps skip only
//    step 0; a run with a single step has no steady state.
//  * Percentiles interpolate linearly between closest ranks (numpy's default), so p50 of an
//    even count is the mean of the two middle values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store/sqlite_store.h"

namespace gpuprof::analysis {

inline constexpr size_t kWarmupSteps = 3;
inline constexpr size_t kMinSteadySteps = 3;
// A steady-state step is an evaluation step (ExtraForwards) when it ran at least this many
// forward calls more than the typical step, and at least twice as many, with no more backward
// passes than the typical step.
inline constexpr int64_t kEvalExtraForwards = 3;

// Percentile q in [0, 1] of `sorted` (ascending, non-empty), linear interpolation.
double Percentile(const std::vector<double>& sorted, double q);
// Median of an unsorted list; nullopt when empty.
std::optional<double> Median(std::vector<double> values);

struct DurationStats {
  size_t count = 0;
  double total_ns = 0;
  double mean_ns = 0;
  double p50_ns = 0;
  double p99_ns = 0;
  double min_ns = 0;
  double max_ns = 0;
};
// nullopt for an empty list.
std::optional<DurationStats> ComputeDurationStats(const std::vector<double>& values_ns);

// The name of the phase BuildRunView derives from comm_buckets (see StepView::phases).
inline constexpr const char* kCommPhase = "comm";

struct PhaseTime {
  std::string name;
  int64_t wall_ns = 0;
  std::optional<int64_t> gpu_ns;
  int64_t calls = 0;
  bool derived = false;  // computed from comm_buckets, not recorded as a phase
};

struct StepView {
  int64_t step = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t duration_ns = 0;
  std::optional<int64_t> wait_ns;
  std::optional<std::string> wait_source;
  int64_t forward_calls = 0;   // outermost model calls (auto) or s.phase("forward") blocks
  int64_t backward_calls = 0;  // backward passes in the step (several: gradient accumulation)
  // iter(loader) calls in the step's loader wait and the time inside them (steps.loader_starts,
  // loader_start_ns); nullopt when the wait was not measured inside a loader (or an older file).
  std::optional<int64_t> loader_starts;
  std::optional<int64_t> loader_start_ns;
  // This step's phase rows, in stored order. A step with comm_buckets rows and no recorded
  // phase named "comm" gets a derived one last: wall = its exposed communication, the time from
  // its last gradient bucket being ready (the latest bucket start) to all its collectives having
  // finished (the latest bucket end), at least 0 and, when the step has a "backward" phase, at
  // most its wall, which loses as much (DDP waits for the collectives inside backward()); calls =
  // its bucket rows; GPU time unknown. The backward phase's GPU time is left as recorded.
  std::vector<PhaseTime> phases;
  int64_t phase_wall_ns = 0;  // sum of phases[].wall_ns (0 when there are none)
  // Time within the step when the process was held off the CPU (host_stalls overlapping it);
  // nullopt when the run had no stall watch.
  std::optional<int64_t> stalled_ns;
  // Run-queue wait of the training's threads within the step (cpu_waits, each stretch's wait
  // spread evenly over it, summed over threads), at most the step's duration; nullopt when the
  // CPU wait was not read.
  std::optional<int64_t> cpu_wait_ns;
  // The step's time the machine took rather than the training: held off the CPU plus queued
  // for one, at most its duration (0 when neither was watched).
  int64_t machine_ns() const {
    return std::min(duration_ns, stalled_ns.value_or(0) + cpu_wait_ns.value_or(0));
  }
};

// One phase name summed over the steady-state steps.
struct PhaseSummary {
  std::string name;
  size_t steps = 0;  // steady steps that have this phase
  int64_t calls = 0;
  double wall_total_ns = 0;
  double wall_fraction = 0;            // wall_total_ns / steady total step time
  size_t gpu_steps = 0;                // steady steps where GPU time was measured
  std::optional<double> gpu_total_ns;  // nullopt when never measured
  std::optional<double> gpu_mean_ns;   // per measured step
  bool derived = false;  // the comm phase derived from comm_buckets (PhaseTime::derived)
};

// Where steady-state step time goes, as fractions of step time.
struct Breakdown {
  double total_ns = 0;  // sum of steady step durations
  // Dataloader wait over the steady steps where it was measured: sum(wait) / sum(duration).
  size_t wait_steps = 0;
  double wait_total_ns = 0;
  double wait_duration_ns = 0;  // step time of those steps
  std::optional<double> wait_fraction;
  std::optional<std::string> wait_source;  // the most common source among those steps
  // Steps whose wait is a gap in a run whose loader wait was measured (a GAN's G step, the
  // second update on one batch): the loader was not called, so their loader wait is 0 and
  // their gap is host work ("other"), not loader time.
  size_t gap_steps_without_loader = 0;
  // Phases: forward, backward, optimizer first, then other names by first appearance.
  std::vector<PhaseSummary> phases;
  // Time in neither the wait nor any phase, over the steady steps that have both a measured
  // wait and at least one phase: sum(duration - wait - phases) / sum(duration). Negative when
  // phases overlap (nested manual phases).
  size_t other_steps = 0;
  double other_total_ns = 0;
  double other_duration_ns = 0;
  std::optional<double> other_fraction;
};

// Aggregates over every GPU sample of the run, computed from its per-second rollups
// (gpu_samples_1s) with the same result; each value over the non-null readings only.
struct GpuAggregates {
  size_t samples = 0;       // raw samples the rollups cover
  size_t gpus_sampled = 0;  // distinct gpu_index values
  std::optional<double> mean_util_pct;
  std::optional<double> max_util_pct;
  std::optional<double> peak_mem_used_bytes;
  std::optional<double> mem_total_bytes;    // largest total seen (samples or gpus table)
  std::optional<double> peak_mem_fraction;  // max over samples of used / total
  std::optional<double> peak_proc_mem_bytes;
  std::optional<double> max_temp_c;
  std::optional<double> mean_power_w;
  std::optional<double> max_power_w;
  std::optional<double> min_sm_clock_mhz;
  std::optional<double> max_sm_clock_mhz;
  std::optional<double> max_pcie_rx_bps;
  std::optional<double> max_pcie_tx_bps;
};

// Aggregates over every host sample of the run; each value over the non-null readings only.
struct HostAggregates {
  size_t samples = 0;
  std::optional<double> mean_cpu_pct;
  std::optional<double> max_cpu_pct;
  std::optional<double> ncores;
  std::optional<double> peak_mem_used_bytes;
  std::optional<double> mem_total_bytes;
  std::optional<double> peak_page_cache_bytes;
  std::optional<double> mean_swap_in_bps;
  std::optional<double> max_swap_in_bps;
  std::optional<double> mean_disk_read_bps;
  std::optional<double> max_disk_read_bps;
  std::optional<double> max_disk_read_iops;
  std::optional<double> mean_proc_cpu_pct;
  std::optional<double> peak_proc_rss_bytes;
};

// Steady-state steps that ran forward calls without backward passes beyond what the typical step
// runs: an evaluation loop (or rollouts) inside the training steps, which prof.evaluation()
// would have kept out. Their loader waits (the evaluation's loader) and time are not the
// training loop's: the loader rules and high_step_variance judge the other steps, and
// evaluation_in_steps reports them.
struct ExtraForwards {
  std::vector<int64_t> steps;     // step numbers, ascending
  int64_t typical_forwards = 0;   // median forward_calls of the steady steps
  int64_t typical_backwards = 0;  // median backward_calls of the steady steps
  bool Has(int64_t step) const { return std::binary_search(steps.begin(), steps.end(), step); }
};

// Whether some step of steps[begin..] had its loader wait measured inside the loader
// (DataLoader next() in auto mode, wrap_dataloader). Then a step whose wait is only a gap did not
// call the loader (several optimizer steps per batch): its loader wait is 0, its gap host work.
bool LoaderWaitMeasured(const std::vector<StepView>& steps, size_t begin);
// A step's loader wait as the breakdown counts it (`measured`: LoaderWaitMeasured); nullopt
// when the step has no wait.
std::optional<int64_t> LoaderWaitNs(const StepView& s, bool measured);

struct RunView {
  store::RunData data;          // the run as stored
  std::vector<StepView> steps;  // ordered by step number

  std::optional<DurationStats> all;  // over every step
  size_t steady_begin = 0;           // index into steps; == steps.size() when no steady state
  std::optional<DurationStats> steady;
  Breakdown breakdown;  // over the steady steps
  ExtraForwards evaluation_steps;
  // The breakdown over the steady steps without evaluation_steps (== breakdown without any):
  // the training loop's own shares.
  Breakdown training_breakdown;

  // Run length: runs.end_ns when recorded, else the end of the last step.
  std::optional<int64_t> duration_ns;
  bool duration_from_steps = false;

  GpuAggregates gpu;
  HostAggregates host;
  // Whether the stall watch ran (telemetry_status 'stalls' available): host_stalls then lists
  // every stall, and each step's stalled_ns is known.
  bool stalls_watched = false;
  // Whether the CPU wait was read (telemetry_status 'cpu_wait' available): each step's
  // cpu_wait_ns is known then.
  bool cpu_wait_watched = false;

  const store::RunInfo& run() const { return data.run; }
  size_t step_count() const { return steps.size(); }
  size_t steady_count() const { return steps.size() - steady_begin; }
  // True when the run executed on CPU only (device_kind is not "cuda" and no GPU model).
  bool IsCpuRun() const;
  // The telemetry_status row for `source` (gpu | host | cuda_events), or null.
  const store::TelemetryStatusRow* Telemetry(std::string_view source) const;
  // The gpus row of device `gpu_index`, or null.
  const store::GpuInfoRow* GpuInfo(int64_t gpu_index) const;
  // [start of the first steady-state step, end of the last step]; nullopt without a steady
  // state. Samples inside it describe the steady state.
  std::optional<std::pair<int64_t, int64_t>> SteadyWindow() const;
};

// Builds the view. Rows need not be sorted; steps are ordered by step number.
RunView BuildRunView(store::RunData data);

// What the user pays per step over the steady state, and how steady that is: for comparing runs
// (the regression rule). Step durations tile the timeline and include the loader wait before
// each step, so their mean is the steady window's wall time per step (the inverse of
// throughput), whatever the distribution looks like (a loader that delivers batches in pairs
// makes steps alternate between a long wait and none; their median says little).
struct Throughput {
  size_t steps = 0;    // steady-state steps
  double mean_ns = 0;  // steady-state wall time per step
  // The steady steps cut into `blocks` contiguous runs of steps (kThroughputBlocks at most, each
  // of at least kThroughputBlockSteps steps): the relative half-width of the 95% interval of
  // mean_ns from the spread of the blocks' time per step (batch means, Student's t with
  // blocks - 1 degrees of freedom). nullopt with fewer than 2 blocks.
  size_t blocks = 0;
  std::optional<double> spread;
};
inline constexpr size_t kThroughputBlocks = 5;
inline constexpr size_t kThroughputBlockSteps = 4;
// nullopt without a steady state.
std::optional<Throughput> MeasureThroughput(const RunView& view);

// The traced time the kernel rules and the report read: the kernels table (GPU time) when it
// has rows, else the cpu_ops table (self CPU time of a CPU run's traced operators). The two are
// never mixed. Rows point into `data`, which must outlive the result.
struct TracedRow {
  int64_t window_start_ns, window_end_ns;
  std::optional<int64_t> step;
  const std::string* name;
  const std::string* source;
  int64_t calls, ns;
};
struct TracedTimes {
  std::vector<TracedRow> rows;
  bool cpu = false;  // rows are CPU operators
  const char* unit() const { return cpu ? "operator" : "kernel"; }
  const char* time() const { return cpu ? "CPU operator self time" : "GPU kernel time"; }
};
TracedTimes CollectTracedTimes(const store::RunData& data);

}  // namespace gpuprof::analysis
