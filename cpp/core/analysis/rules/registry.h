// The rule registry: every insight rule, its thresholds, and the text users read about it.
//
// Rules are pure functions of (RunView, RuleContext). The registry is the single source for
// `gpuprof rules`, docs/rules.md and the README rule table (generated from
// `gpuprof rules --markdown`): the "fires when" text is built from the same named constants
// the rules compare against, so the docs cannot drift from the code.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/insight.h"
#include "analysis/run_view.h"
#include "store/rollup.h"
#include "telemetry/stall_watch.h"

namespace gpuprof::analysis {

// Named thresholds. Fractions are of step time unless stated otherwise. A rule fires when its
// measured value is strictly beyond the threshold ("> 15%"), never at it.
namespace thresholds {
// ---- data pipeline
// dataloader_stall: loader wait above this share of step time fires...
inline constexpr double kStallFraction = 0.15;
// ...and is HIGH at or above this share (MED below).
inline constexpr double kStallHighFraction = 0.30;
// prefetch_queue_starved: a steady-state wrap_dataloader wait longer than this starves a step...
inline constexpr double kStarvedWaitMs = 30.0;
// ...and the rule fires when at least this share of the measured steps starved...
inline constexpr double kStarvedStepFraction = 0.20;
// ...HIGH at or above this share.
inline constexpr double kStarvedHighFraction = 0.50;
// cpu_bound_dataloader: mean host CPU (all cores, 0-100) above this during a stall fires...
inline constexpr double kCpuBoundPct = 80.0;
// ...unless the training's own process tree, when sampled (host_samples.proc_cpu_pct), is busy
// below this share of the cores it can use (one per process, at most the machine's) at its
// busiest (its highest reading: a new worker joins the tree only at the sampler's next rescan,
// so the readings of a short run may mostly undercount it): then other processes peg the
// CPU, not the loader...
inline constexpr double kCpuBoundTreeBusy = 0.5;
// ...when the disk is idle: mean read below this many MB/s (1e6 bytes) and, when IOPS were
// sampled, below kDiskIdleIops.
inline constexpr double kDiskIdleMBps = 50.0;
inline constexpr double kDiskIdleIops = 500.0;
// io_bound_dataloader: during a stall, mean disk read above this many MB/s or above this many
// IOPS fires...
inline constexpr double kIoBoundMBps = 500.0;
inline constexpr double kIoBoundIops = 5000.0;
// ...when the CPU has headroom: mean host CPU below this.
inline constexpr double kIoCpuHeadroomPct = 60.0;
// cpu_bound_dataloader and io_bound_dataloader decide only from at least this many host CPU
// readings in the steady state (or the run, when none falls in it)...
inline constexpr size_t kHostMinSamples = 5;
// ...covering at least this many seconds (a reading is the rate since the previous sample).
inline constexpr double kHostMinCoverageS = 1.0;
// cold_cache: mean disk read in the first third of the steady state at least this multiple of
// the last third's...
inline constexpr double kColdCacheReadRatio = 3.0;
// ...and at least this many MB/s (a few MB/s falling to nothing is not a cold cache)...
inline constexpr double kColdCacheMinMBps = 50.0;
// ...while the median step of the first third is this much slower than the last third's.
inline constexpr double kColdCacheSpeedup = 0.10;
// cold_cache needs this many steady-state steps (three per third).
inline constexpr size_t kColdCacheMinSteps = 9;
// cache_thrashing: page cache peak at least this share of RAM...
inline constexpr double kThrashCacheFraction = 0.40;
// ...while the median steady-state disk read stays above this many MB/s.
inline constexpr double kThrashReadMBps = 100.0;
// pcie_saturation: peak host-to-device PCIe throughput above this many GB/s (1e9 bytes) fires.
// The same criterion counts gpu_samples_1s.pcie_rx_high_samples while rolling up.
inline constexpr double kPcieRxGBps = store::kRollupPcieRxHighGBps;
// ---- host
// worker_imbalance: the hottest dataloader worker above this multiple of the workers' mean
// (fair share) fires...
inline constexpr double kWorkerImbalanceRatio = 2.5;
// ...if it is busy at all: its mean CPU is at least this (percent of one core).
inline constexpr double kWorkerMinCpuPct = 10.0;
// host_memory_pressure: mean swap-in above this many MB/s fires.
inline constexpr double kSwapInMBps = 1.0;
// host_stalls: the process held off the CPU (stall watch: a wake-up at least
// telemetry::kStallWatchThreshold late) for at least this share of steady-state step time...
inline constexpr double kHostStallShare = 0.02;
// ...in at least this many stalls (one pause is an accident, not a condition of the host)...
inline constexpr size_t kHostStallMinCount = 2;
// ...med at or above this share, else low.
inline constexpr double kHostStallMedShare = 0.10;
// cpu_contention: the training's threads queued for a CPU (run-queue wait, telemetry/cpu_wait.h)
// for at least this share of steady-state step time fires...
inline constexpr double kCpuWaitShare = 0.15;
// ...med at or above this share, high at or above kCpuWaitHighShare, else low.
inline constexpr double kCpuWaitMedShare = 0.25;
inline constexpr double kCpuWaitHighShare = 0.5;
// Other processes' load (host busy cores minus the training's process tree, the least over the
// steady-state host samples): at or above this many cores they take CPU the training waits for
// (cpu_contention says so, and cpu_bound_dataloader does not blame the loader for a host they
// peg); below it, the queueing is the training's own threads and processes.
inline constexpr double kOtherLoadCores = 0.5;
// high_step_variance and the slow steps: the host's doing when at least this share of their
// time above the median is the machine's (the process held off the CPU, or its threads queued
// for one); host_stalls or cpu_contention, whichever took more, explains it then.
inline constexpr double kVarianceStallShare = 0.5;
// What to do about stalls (host_stalls' fix, and high_step_variance's when its slow steps are
// stalls).
inline constexpr const char* kHostStallFix =
    "Find what takes the CPU from the training: other jobs on the host (top), CPU steal on a "
    "shared VM (top's 'st'; a dedicated or larger instance), a container CPU limit (cpu.max, "
    "docker --cpus, Kubernetes limits), swapping, or more busy threads than cores (DataLoader "
    "workers plus torch threads: lower num_workers or torch.set_num_threads).";
// What to do about CPU contention (cpu_contention's fix, and high_step_variance's when its slow
// steps are the threads queueing for a CPU).
inline constexpr const char* kCpuContentionFix =
    "Give the training's threads the cores they need: stop or move other jobs on the host "
    "(top), reserve cores for the training (taskset -c, a cgroup cpuset, Kubernetes guaranteed "
    "CPUs), and keep torch's threads plus DataLoader workers within the cores it has "
    "(torch.set_num_threads or OMP_NUM_THREADS, num_workers).";
// ...when other processes take the cores, when the job's other ranks on the host do, and when
// the training's own threads outnumber them.
inline constexpr const char* kCpuContentionOthersFix =
    "Other processes take the cores the training's threads wait for: run it where they are not "
    "(or stop them), or reserve its cores (taskset -c, a cgroup cpuset, Kubernetes guaranteed "
    "CPUs); until then, torch.set_num_threads(n) with n = the cores left keeps torch's threads "
    "from queueing behind them.";
inline constexpr const char* kCpuContentionJobFix =
    "The job's ranks on this host, with their threads and loader workers, want more cores than "
    "it has: give each rank its share (torch.set_num_threads or OMP_NUM_THREADS = cores / ranks "
    "on the host, fewer DataLoader num_workers per rank), or run fewer ranks per host.";
inline constexpr const char* kCpuContentionOwnFix =
    "The training runs more busy threads than it has cores: lower torch.set_num_threads (or "
    "OMP_NUM_THREADS) and DataLoader num_workers until torch's threads plus the workers fit "
    "the cores (nproc, or the container's CPU limit).";
// ---- compute
// kernel_launch_overhead: time outside wait and phases above this share fires...
inline constexpr double kOverheadFraction = 0.10;
// ...and is MED at or above this share (LOW below).
inline constexpr double kOverheadMedFraction = 0.25;
// The time outside is periodic host work, not launch overhead, when at least this share of it
// lies in steps whose own outside time exceeds the steps' median by more than a median step
// (then MED when that part is at least kVarianceMedShare of step time).
inline constexpr double kOverheadSpikeShare = 0.5;
// The fix for periodic host work between steps (kernel_launch_overhead's spikes, and
// high_step_variance's slow steps when their extra time is outside the loader and the phases).
inline constexpr const char* kPeriodicHostWorkFix =
    "Find what runs on those steps outside the model: save checkpoints asynchronously "
    "(torch.distributed.checkpoint.async_save) or less often, log and sync metrics (.item(), "
    "print, wandb.log) less often, wrap evaluations in `with prof.evaluation():` so they stay "
    "out of the training steps, and rule out Python GC pauses (gc.freeze() after setup).";
// low_mfu: MFU below this fraction of the dtype peak fires (MED).
inline constexpr double kLowMfu = 0.30;
// small_batch: mean GPU utilization above this (percent)...
inline constexpr double kSmallBatchUtilPct = 60.0;
// ...with MFU below this fires.
inline constexpr double kSmallBatchMfu = 0.25;
// gradient_checkpointing_detected: backward / forward time. Plain training runs backward at
// about 2x forward (gradients w.r.t. inputs and weights); activation checkpointing recomputes
// the forward inside backward, about 3x. At or below kNoCkptMaxRatio means "not
// checkpointing", at or above kCkptMinRatio means "checkpointing"; in between is ambiguous and
// never fires.
inline constexpr double kNoCkptMaxRatio = 2.3;
inline constexpr double kCkptMinRatio = 2.7;
// sdpa_suboptimal: softmax + bmm kernels above this share of GPU kernel time, with no fused
// attention kernel, fires.
inline constexpr double kSdpaHotFraction = 0.20;
// kernel_drift: a kernel's mean time per window grew by more than this between the halves of
// the run (and its time per call by as much)...
inline constexpr double kDriftGrowth = 0.50;
// ...adding at least this share of the mean total kernel time per window...
inline constexpr double kDriftMinShare = 0.01;
// ...with at least this many kernel windows in each half.
inline constexpr size_t kDriftMinWindows = 2;
// ---- memory & thermals
// memory_pressure: peak device memory in use above this share of the device's memory fires.
inline constexpr double kGpuMemPressure = 0.90;
// thermal_throttling: a sample is throttled when NVML reports a thermal clock-event reason, or
// when the GPU is hotter than kThrottleTempC with the SM clock more than kThrottleClockDrop
// below its maximum. Samples are judged while rolling up into gpu_samples_1s, by these same
// criteria (store/rollup.h)...
inline constexpr double kThrottleTempC = store::kRollupHotTempC;
inline constexpr double kThrottleClockDrop = store::kRollupClockDrop;
// ...and the rule fires when more than this share of one GPU's samples are throttled...
inline constexpr double kThrottleSampleFraction = 0.05;
// ...HIGH at or above this share.
inline constexpr double kThrottleHighFraction = 0.50;
// NVML clocks-event reason bits (nvmlClocksEventReason*, nvml.h): SW and HW thermal slowdown.
inline constexpr int64_t kNvmlSwThermalSlowdown = 0x20;
inline constexpr int64_t kNvmlHwThermalSlowdown = 0x40;
static_assert((kNvmlSwThermalSlowdown | kNvmlHwThermalSlowdown) == store::kRollupThermalReasonBits);
// ---- warmup & tail
// Both warmup rules judge a step by its work: its time outside the loader wait before it (a
// worker start-up or a slow first batch is the loader's, not a compile).
// compilation_warmup: step 0's work longer than this multiple of the steady-state median fires...
inline constexpr double kWarmupRatio = 3.0;
// ...when the warmup steps' work above that median is at least this share of the run's step time.
inline constexpr double kWarmupMinShare = 0.05;
// first_step_outlier: step 0's work longer than this multiple of the median of steps 1..n-1...
inline constexpr double kFirstStepRatio = 10.0;
// ...lifting the run's mean step time by at least this share fires.
inline constexpr double kFirstStepMinLift = 0.05;
// Both warmup rules need at least this many steps.
inline constexpr size_t kWarmupMinSteps = 3;
// high_step_variance: steady-state p99 / p50 above this ratio fires...
inline constexpr double kVarianceRatio = 2.0;
// ...evaluated only with at least this many steady-state steps (p99 of fewer is the max).
inline constexpr size_t kVarianceMinSteps = 10;
// ...and only when at least this many steady-state steps exceed kVarianceRatio × p50: with few
// steps p99 is the maximum, and one hiccup is not variance.
inline constexpr size_t kVarianceMinSpikes = 2;
// ...med when the spikes' time above the median is at least this share of steady-state time,
// else low.
inline constexpr double kVarianceMedShare = 0.05;
// The slow steps are the loader's doing when at least this share of their time above the median
// is loader wait (measured inside the loader, above its median): the insight then says so and
// gives the loader's fix, and a loader rule that fires too explains it (precedence).
inline constexpr double kVarianceLoaderShare = 0.5;
// The slow steps are host work outside the loader and the phases (checkpoint saves, logging)
// when at least this share of their time above the median is such time, above its median: the
// insight then says so and gives kPeriodicHostWorkFix, and kernel_launch_overhead's periodic
// finding explains it.
inline constexpr double kVarianceOtherShare = 0.5;
// loader_epoch_start: the steps that started the loader (iter(loader)) waiting, above the other
// steps' median wait, at least this share of steady-state step time fires (HIGH at
// kStallHighFraction)...
inline constexpr double kEpochStartShare = 0.05;
// ...and it explains dataloader_stall when that extra wait is at least this share of the stall.
inline constexpr double kEpochStartStallShare = 0.5;
// evaluation_in_steps: the evaluation steps (RunView::evaluation_steps) taking at least this
// share of steady-state step time above the typical step's fires...
inline constexpr double kEvalMinShare = 0.02;
// ...MED at or above this share, else LOW.
inline constexpr double kEvalMedShare = 0.10;
// ---- distributed
// comm_dominant: collectives in flight for more than this share of step time fires.
inline constexpr double kCommFraction = 0.20;
// comm_dominant's fix: in general, and when the steps accumulate gradients (several backward
// passes a step): with an all-reduce after each pass (most steps reduce a bucket more than once),
// or already with one a step (no_sync() in use).
inline constexpr const char* kCommDominantFix =
    "Shrink or overlap communication: tune DDP bucket_cap_mb, set gradient_as_bucket_view=True, "
    "use no_sync() on gradient-accumulation steps, FSDP or a compression comm hook for large "
    "models; check the interconnect (NVLink vs PCIe / Ethernet).";
inline constexpr const char* kCommDominantNoSyncFix =
    "Reduce once a step: run every backward pass of a step but its last inside model.no_sync() "
    "(DDP then all-reduces the accumulated gradients once, not after each pass); then, if the "
    "collectives still dominate, tune bucket_cap_mb or use a compression comm hook.";
inline constexpr const char* kCommDominantAccumulatingFix =
    "The steps already reduce once per several backward passes: accumulate more micro-batches "
    "per step (the collectives are paid once a step), tune DDP bucket_cap_mb, set "
    "gradient_as_bucket_view=True, use a compression comm hook (fp16/bf16, PowerSGD) or FSDP "
    "for large models; check the interconnect (NVLink vs PCIe / Ethernet).";
// peer_wait: this rank waited for the other ranks in its collectives for more than this share
// of step time fires (and explains comm_dominant when the collectives' time without that wait
// is at most kCommFraction).
inline constexpr double kPeerWaitFraction = 0.20;
// The most bucket rows a run's own analysis compares with its peers' (its rows times the other
// ranks' runs): a longer job's ranks are compared by gpuprof insights --group instead, so that
// the summary at the end of every rank stays quick.
inline constexpr size_t kPeerWaitMaxRows = 1'000'000;
// bucket_skew: a rank is late on a step's bucket when it starts that collective more than this
// many ms after the median start of the other ranks (and after every other rank)...
inline constexpr double kBucketLateMs = 1.0;
// ...and the rule fires when one rank is late on the same bucket on at least this share of
// the steps where that bucket was timed on 2+ ranks...
inline constexpr double kBucketLateFraction = 0.60;
// ...HIGH at or above this share...
inline constexpr double kBucketHighFraction = 0.90;
// ...evaluated for buckets timed on 2+ ranks on at least this many steps.
inline constexpr size_t kBucketSkewMinSteps = 5;
// A rank late (as above) on at least this share of the evaluated buckets is late on "every"
// bucket: the cause is the rank's work as a whole (rank_skew's finding, which then explains
// bucket_skew); late on fewer, the cause is the work before those buckets (bucket_skew's
// finding, which then explains rank_skew of the same rank).
inline constexpr double kBucketRankWideFraction = 0.80;
// rank_skew: a rank whose steady-state median work time (step time minus its wait for the other
// ranks in the collectives, when comm_buckets of 2+ ranks say so; else its step time) exceeds
// the median of the other ranks' medians by more than this fires.
inline constexpr double kRankSkewFraction = 0.20;
// ---- regression
// A run is compared by its throughput: the steady-state wall time per step, loader wait
// included (analysis::Throughput). The baseline is the median of that of up to this many
// previous finished runs of the same run_name...
inline constexpr size_t kRegressionRuns = 3;
// ...looking back at most this many runs (runs too short to compare are passed over)...
inline constexpr size_t kRegressionLookback = 10;
// ...each, like this run, with at least this many steady-state steps (fewer: inconclusive).
inline constexpr size_t kRegressionMinSteps = 10;
// More than this much slower than the baseline fires MED...
inline constexpr double kRegressionSlower = 0.10;
// ...more than this much faster is reported as INFO...
inline constexpr double kImprovementFaster = 0.10;
// ...when the change is also beyond the noise: the 95% intervals of this run's time per step
// and of the baseline's (its runs' own intervals, and how far apart their means lie), combined
// in log space. A change past the threshold but inside the noise is "inconclusive".
}  // namespace thresholds

struct GroupView;  // group.h

using RuleFn = RuleResult (*)(const RunView&, const RuleContext&);
// A group rule sees every rank of a multi-rank run (gpuprof insights --group).
using GroupRuleFn = RuleResult (*)(const GroupView&, const RuleContext&);

struct RuleThreshold {
  std::string name;  // the constant's name in thresholds::
  double value = 0;
  std::string meaning;
  // A quantity (cores, ...) rather than a share: a value below 1 is not shown as a percentage.
  bool quantity = false;
};

// Precedence between rules. A rule that names a cause explains the general findings that cause
// also produces (cpu_bound_dataloader explains dataloader_stall). When both fire, the explained
// finding is folded under the one that explains it (Report::explained) instead of being reported
// on its own: the report leads with the specific diagnosis and its fix, and never prints the
// general finding's contradicting advice beside it. `when` names a boolean evidence key of the
// explained insight that must be true for the fold (empty: always), for a general rule whose
// finding is only sometimes the same cause (high_step_variance's "loader_caused"). `same` names
// an evidence key both findings must hold with equal values (empty: none), for findings that
// are one cause only when they are about the same thing ("run_id": the same rank). The relation
// is acyclic except for a pair of rules that explain each other under conditions that exclude
// each other (bucket_skew and rank_skew: "bucket_local" and "rank_wide" of one rank), so at most
// one direction folds; chains resolve to the first finding that nothing explains.
struct RuleExplains {
  std::string rule_id;
  std::string when;
  std::string when_text;  // `when` for a reader ("its slow steps are mostly loader wait")
  std::string same;
};

struct RuleSpec {
  std::string id;
  // data_pipeline | host | compute | memory_thermal | warmup | distributed | regression | cost
  std::string family;
  Severity max_severity;   // the most severe level the rule can report
  std::string severity;    // how the level is chosen, e.g. "high ≥ 30%, else med"
  std::string fires_when;  // one line, with the thresholds' values
  std::string fix;         // default fix text
  std::string inputs;      // what must have been measured; otherwise "not evaluated"
  std::vector<RuleThreshold> thresholds;
  std::vector<RuleExplains> explains;    // precedence (see RuleExplains)
  RuleFn evaluate = nullptr;             // per-run rules
  GroupRuleFn evaluate_group = nullptr;  // group rules (exactly one of the two is set)
  bool group() const { return evaluate_group != nullptr; }
};

// Every rule, in evaluation and display order. The reference lives for the program.
const std::vector<RuleSpec>& Rules();
// The rule with that id, or null.
const RuleSpec* FindRule(std::string_view id);

// Runs one rule and completes a fired insight with rule_id, family and (unless the rule
// set one) the registry's fix text. A group rule given one run, or a per-run rule given a
// group, is "not evaluated".
RuleResult EvaluateRule(const RuleSpec& spec, const RunView& view, const RuleContext& context);
RuleResult EvaluateGroupRule(const RuleSpec& spec, const GroupView& group,
                             const RuleContext& context);

// The registry as a Markdown table (id, family, severity, fires when, fix; group rules are
// marked "(group)" after the id) followed by the thresholds, inputs and precedence tables;
// stable output for docs generation.
std::string RulesMarkdown();
// "`dataloader_stall`, `high_step_variance` (when its slow steps are mostly loader wait)".
std::string ExplainsText(const RuleSpec& spec);
// The registry as plain text for a terminal.
std::string RulesText();

}  // namespace gpuprof::analysis
