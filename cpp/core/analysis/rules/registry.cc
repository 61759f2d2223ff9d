#include "analysis/rules/registry.h"

#include "analysis/format.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis {
namespace {

using namespace thresholds;

std::string Pct(double f) { return FormatPercent(f); }
std::string Times(double r) { return FormatCompact(r) + "×"; }

std::string Num(double v) { return FormatCompact(v); }

// A loader rule explains high_step_variance when the slow steps are mostly loader wait.
const RuleExplains kLoaderVariance{"high_step_variance", "loader_caused",
                                   "its slow steps are mostly loader wait", ""};

RuleSpec StallSpec() {
  return RuleSpec{
      .id = "dataloader_stall",
      .family = "data_pipeline",
      .max_severity = Severity::kHigh,
      .severity = "high ≥ " + Pct(kStallHighFraction) + " of step time, else med",
      .fires_when =
          "dataloader wait (measured in DataLoader next() or wrap_dataloader, else the "
          "inter-step gap) > " +
          Pct(kStallFraction) + " of steady-state step time",
      .fix =
          "Feed the loop faster: raise DataLoader num_workers and prefetch_factor, set "
          "pin_memory=True and persistent_workers=True, and move heavy augmentations to "
          "the GPU.",
      .inputs = "steps.wait_ns on steady-state steps",
      .thresholds = {{"kStallFraction", kStallFraction, "fires above this share of step time"},
                     {"kStallHighFraction", kStallHighFraction, "high at or above this share"}},
      .explains = {{"prefetch_queue_starved", "", "", ""}, kLoaderVariance},
      .evaluate = rules::DataloaderStall,
  };
}

void AddDataPipeline(std::vector<RuleSpec>& r) {
  r.push_back(StallSpec());
  r.push_back(RuleSpec{
      .id = "loader_epoch_start",
      .family = "data_pipeline",
      .max_severity = Severity::kHigh,
      .severity = "high ≥ " + Pct(kStallHighFraction) + " of step time, else med",
      .fires_when = "the steady-state steps whose loader wait holds an iter(loader) that "
                    "starts worker processes (an epoch's start without persistent_workers) "
                    "wait, above the other steps' median wait, ≥ " +
                    Pct(kEpochStartShare) + " of steady-state step time",
      .fix = "Start the workers once, not every epoch: DataLoader(..., "
             "persistent_workers=True) keeps them, so iter(loader) no longer starts new "
             "processes and waits for their first batches; keep their start-up cheap (a light "
             "Dataset to pickle, files opened lazily in each worker, a quick worker_init_fn).",
      .inputs = "steps.loader_starts, loader_start_ns and wait_ns (auto mode, torch DataLoader) "
                "on steady-state steps",
      .thresholds = {{"kEpochStartShare", kEpochStartShare,
                      "fires when the epoch starts' extra wait is at least this share of step "
                      "time"},
                     {"kEpochStartStallShare", kEpochStartStallShare,
                      "explains dataloader_stall when that extra wait is at least this share of "
                      "the loader wait"}},
      .explains = {{"dataloader_stall", "epoch_start_caused",
                    "most of its wait is the epochs' starts", ""}},
      .evaluate = rules::LoaderEpochStart,
  });
  r.push_back(RuleSpec{
      .id = "prefetch_queue_starved",
      .family = "data_pipeline",
      .max_severity = Severity::kHigh,
      .severity = "high on ≥ " + Pct(kStarvedHighFraction) + " of steps, else med",
      .fires_when = "measured loader wait > " + Num(kStarvedWaitMs) + " ms on ≥ " +
                    Pct(kStarvedStepFraction) + " of steady-state steps",
      .fix = "Keep the prefetch queue full: raise prefetch_factor and num_workers, set "
             "persistent_workers=True (no worker restart each epoch) and pin_memory=True.",
      .inputs = "steps.wait_ns with wait_source 'dataloader' (torch DataLoader next(), auto "
                "mode) or 'explicit' (prof.wrap_dataloader) on steady-state steps",
      .thresholds = {{"kStarvedWaitMs", kStarvedWaitMs,
                      "a wait longer than this (ms) starves "
                      "the step"},
                     {"kStarvedStepFraction", kStarvedStepFraction,
                      "fires at or above this share of steps"},
                     {"kStarvedHighFraction", kStarvedHighFraction, "high at or above this share"}},
      .explains = {kLoaderVariance},
      .evaluate = rules::PrefetchQueueStarved,
  });
  r.push_back(RuleSpec{
      .id = "cpu_bound_dataloader",
      .family = "data_pipeline",
      .max_severity = Severity::kHigh,
      .severity = "as dataloader_stall (high ≥ " + Pct(kStallHighFraction) + ", else med)",
      .fires_when = "dataloader stall + mean host CPU > " + Num(kCpuBoundPct) +
                    "% with the disk idle (< " + Num(kDiskIdleMBps) + " MB/s and < " +
                    Num(kDiskIdleIops) +
                    " IOPS), and the training's own processes busy "
                    "(peak ≥ " +
                    Pct(kCpuBoundTreeBusy) +
                    " of their usable cores) when sampled; "
                    "not while processes outside the job hold ≥ " +
                    Num(kOtherLoadCores) +
                    " core and the "
                    "training's threads queue for a CPU (cpu_contention)",
      .fix = "The workers are CPU-bound, so more num_workers won't help: move augmentations to "
             "the GPU (torchvision.transforms.v2 or kornia on CUDA tensors, NVIDIA DALI), decode "
             "less (smaller or pre-resized images), or pre-process the dataset offline.",
      .inputs = "steps.wait_ns; host_samples.cpu_pct and disk_read_bps (disk_read_iops when "
                "sampled) in the steady state, at least " +
                std::to_string(kHostMinSamples) + " CPU readings covering " +
                Num(kHostMinCoverageS) +
                " s; host_samples.proc_cpu_pct and worker_samples_10s when sampled",
      .thresholds = {{"kCpuBoundPct", kCpuBoundPct, "fires above this mean host CPU (%)"},
                     {"kDiskIdleMBps", kDiskIdleMBps, "disk idle below this mean read (MB/s)"},
                     {"kDiskIdleIops", kDiskIdleIops, "disk idle below this mean IOPS"},
                     {"kCpuBoundTreeBusy", kCpuBoundTreeBusy,
                      "...and, when the process tree's CPU was sampled, only with its peak at or "
                      "above this share of its usable cores (one per process, at most the "
                      "machine's)"},
                     {"kOtherLoadCores", kOtherLoadCores,
                      "...not when other processes' load (host busy cores minus the training's, "
                      "the least over the window) is at least this many cores and the training's "
                      "threads queue for a CPU (≥ kCpuWaitShare of step time): the host is "
                      "contended, which says nothing of the loader",
                      true},
                     {"kHostMinSamples", static_cast<double>(kHostMinSamples),
                      "evaluated from at least this many host CPU readings (also "
                      "io_bound_dataloader)"},
                     {"kHostMinCoverageS", kHostMinCoverageS,
                      "...covering at least this many seconds"}},
      .explains = {{"dataloader_stall", "", "", ""},
                   {"prefetch_queue_starved", "", "", ""},
                   kLoaderVariance,
                   {"cpu_contention", "own_threads",
                    "the training's threads queue behind its own CPU-bound loading", ""}},
      .evaluate = rules::CpuBoundDataloader,
  });
  r.push_back(RuleSpec{
      .id = "io_bound_dataloader",
      .family = "data_pipeline",
      .max_severity = Severity::kHigh,
      .severity = "as dataloader_stall (high ≥ " + Pct(kStallHighFraction) + ", else med)",
      .fires_when = "dataloader stall + mean disk read > " + Num(kIoBoundMBps) + " MB/s or > " +
                    FormatCount(kIoBoundIops) + " IOPS, with host CPU < " + Num(kIoCpuHeadroomPct) +
                    "%",
      .fix = "Read fewer, larger files: pack samples into shards (WebDataset, FFCV, TFRecord), "
             "cache the dataset in RAM or on local NVMe, or move it to a faster storage tier.",
      .inputs = "steps.wait_ns; host_samples.disk_read_bps or disk_read_iops, and cpu_pct, in "
                "the steady state, at least " +
                std::to_string(kHostMinSamples) + " CPU readings covering " +
                Num(kHostMinCoverageS) + " s",
      .thresholds = {{"kIoBoundMBps", kIoBoundMBps, "fires above this mean read (MB/s)"},
                     {"kIoBoundIops", kIoBoundIops, "...or above this mean IOPS"},
                     {"kIoCpuHeadroomPct", kIoCpuHeadroomPct,
                      "only with mean host CPU below this (%)"}},
      .explains = {{"dataloader_stall", "", "", ""},
                   {"prefetch_queue_starved", "", "", ""},
                   kLoaderVariance},
      .evaluate = rules::IoBoundDataloader,
  });
  r.push_back(RuleSpec{
      .id = "cold_cache",
      .family = "data_pipeline",
      .max_severity = Severity::kLow,
      .severity = "low",
      .fires_when = "disk read in the first third of the steady state ≥ " +
                    Times(kColdCacheReadRatio) + " the last third's (and ≥ " +
                    Num(kColdCacheMinMBps) + " MB/s) + median step > " + Pct(kColdCacheSpeedup) +
                    " slower in the first third",
      .fix = "Warm the page cache before timing (one pass over the data, or vmtouch), or "
             "pre-stage the dataset to local disk; compare runs only once the cache is warm.",
      .inputs = "at least " + std::to_string(kColdCacheMinSteps) +
                " steady-state steps; host_samples.disk_read_bps in their first and last "
                "thirds",
      .thresholds = {{"kColdCacheReadRatio", kColdCacheReadRatio,
                      "first-third read at least this multiple of the last third's"},
                     {"kColdCacheMinMBps", kColdCacheMinMBps,
                      "first-third read at least this (MB/s)"},
                     {"kColdCacheSpeedup", kColdCacheSpeedup,
                      "first-third median step slower than the last third's by more than this"},
                     {"kColdCacheMinSteps", static_cast<double>(kColdCacheMinSteps),
                      "evaluated with at least this many steady-state steps"}},
      .evaluate = rules::ColdCache,
  });
  r.push_back(RuleSpec{
      .id = "cache_thrashing",
      .family = "data_pipeline",
      .max_severity = Severity::kMed,
      .severity = "med with a dataloader stall, else low",
      .fires_when = "page cache ≥ " + Pct(kThrashCacheFraction) +
                    " of RAM + median steady-state disk read > " + Num(kThrashReadMBps) + " MB/s",
      .fix = "The working set is larger than RAM: shard the dataset so each node reads its own "
             "part, stream it sequentially (WebDataset), compress it, or add RAM.",
      .inputs = "host_samples.page_cache_bytes, mem_total_bytes and disk_read_bps",
      .thresholds = {{"kThrashCacheFraction", kThrashCacheFraction,
                      "page cache peak at or above this share of RAM"},
                     {"kThrashReadMBps", kThrashReadMBps, "median disk read above this (MB/s)"}},
      .evaluate = rules::CacheThrashing,
  });
  r.push_back(RuleSpec{
      .id = "pcie_saturation",
      .family = "data_pipeline",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "PCIe host-to-device (RX) peak > " + Num(kPcieRxGBps) + " GB/s",
      .fix = "Move fewer bytes over PCIe: send uint8 images and normalize/augment on the GPU, "
             "keep tensors resident instead of copying back and forth, use pinned memory with "
             "non_blocking=True; between GPUs, prefer NVLink.",
      .inputs = "gpu_samples_1s.pcie_rx_max_bps (per-second rollup of gpu_samples.pcie_rx_bps)",
      .thresholds = {{"kPcieRxGBps", kPcieRxGBps, "fires above this peak (GB/s)"}},
      .evaluate = rules::PcieSaturation,
  });
}

void AddHost(std::vector<RuleSpec>& r) {
  r.push_back(RuleSpec{
      .id = "worker_imbalance",
      .family = "host",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "hottest dataloader worker > " + Times(kWorkerImbalanceRatio) +
                    " the workers' mean CPU (fair share) and ≥ " + Num(kWorkerMinCpuPct) +
                    "% of a core",
      .fix = "Spread the loading: with an IterableDataset, split the stream per worker with "
             "torch.utils.data.get_worker_info() (worker_init_fn), balance shard sizes, or use a "
             "map-style Dataset with a Sampler.",
      .inputs = "worker_samples_10s.cpu_mean_pct of at least 2 child processes (dataloader "
                "workers)",
      .thresholds = {{"kWorkerImbalanceRatio", kWorkerImbalanceRatio,
                      "fires above this multiple of the fair share"},
                     {"kWorkerMinCpuPct", kWorkerMinCpuPct,
                      "the hottest worker averages at least this (% of one core)"}},
      .evaluate = rules::WorkerImbalance,
  });
  r.push_back(RuleSpec{
      .id = "host_memory_pressure",
      .family = "host",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "mean swap-in > " + Num(kSwapInMBps) + " MB/s",
      .fix = "Use less host memory: fewer DataLoader workers or a lower prefetch_factor (each "
             "worker holds prefetch_factor batches), share the dataset between workers "
             "(memory-mapped arrays instead of Python lists copied per worker), or add RAM.",
      .inputs = "host_samples.swap_in_bps",
      .thresholds = {{"kSwapInMBps", kSwapInMBps, "fires above this mean swap-in (MB/s)"}},
      .evaluate = rules::HostMemoryPressure,
  });
  r.push_back(RuleSpec{
      .id = "host_stalls",
      .family = "host",
      .max_severity = Severity::kMed,
      .severity = "med ≥ " + Pct(kHostStallMedShare) + " of step time, else low",
      .fires_when =
          "the process was held off the CPU (no wake-up for ≥ " +
          Num(std::chrono::duration<double, std::milli>(telemetry::kStallWatchThreshold).count()) +
          " ms) for ≥ " + Pct(kHostStallShare) + " of steady-state step time, in ≥ " +
          std::to_string(kHostStallMinCount) + " stalls",
      .fix = kHostStallFix,
      .inputs = "host_stalls (the stall watch, on with host telemetry) over the steady-state "
                "steps",
      .thresholds = {{"kHostStallShare", kHostStallShare,
                      "fires at or above this share of steady-state step time"},
                     {"kHostStallMinCount", static_cast<double>(kHostStallMinCount),
                      "stalls needed to fire"},
                     {"kHostStallMedShare", kHostStallMedShare, "med at or above this share"}},
      .explains = {{"high_step_variance", "stall_caused",
                    "its slow steps are mostly time the process was held off the CPU", ""}},
      .evaluate = rules::HostStalls,
  });
  r.push_back(RuleSpec{
      .id = "cpu_contention",
      .family = "host",
      .max_severity = Severity::kHigh,
      .severity = "high ≥ " + Pct(kCpuWaitHighShare) + " of step time, med ≥ " +
                  Pct(kCpuWaitMedShare) + ", else low",
      .fires_when = "the training's threads queued for a CPU (run-queue wait, gpuprof's threads "
                    "left out) for ≥ " +
                    Pct(kCpuWaitShare) + " of steady-state step time",
      .fix = kCpuContentionFix,
      .inputs = "cpu_waits (read by the stall watch from /proc schedstat, with host telemetry) "
                "over the steady-state steps; host_samples.cpu_pct, ncores, proc_cpu_pct and "
                "(a rank with other ranks on its host) job_cpu_pct say whose load it is",
      .thresholds = {{"kCpuWaitShare", kCpuWaitShare,
                      "fires at or above this share of steady-state step time"},
                     {"kCpuWaitMedShare", kCpuWaitMedShare, "med at or above this share"},
                     {"kCpuWaitHighShare", kCpuWaitHighShare, "high at or above this share"},
                     {"kOtherLoadCores", kOtherLoadCores,
                      "load from outside the job (the least over the steady-state host "
                      "samples) at or above this many cores: the fix says to move it; below, "
                      "the job's other ranks on the host (their mean at or above this) or else "
                      "the training's own threads outnumber the cores",
                      true}},
      .explains = {{"high_step_variance", "cpu_wait_caused",
                    "its slow steps are mostly its threads queueing for a CPU", ""}},
      .evaluate = rules::CpuContention,
  });
}

void AddCompute(std::vector<RuleSpec>& r) {
  r.push_back(RuleSpec{
      .id = "low_mfu",
      .family = "compute",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "MFU < " + Pct(kLowMfu) + " of the declared dtype's dense peak",
      .fix = "Give the GPU bigger, fused work: raise the batch size, use bf16 autocast, "
             "FlashAttention / F.scaled_dot_product_attention, and torch.compile.",
      .inputs = "runs.flops_per_step (from arch=, flops_per_step= or the automatic count), "
                "runs.dtype, runs.gpu_model (with a listed peak) and step times",
      .thresholds = {{"kLowMfu", kLowMfu, "fires below this MFU"}},
      .evaluate = rules::LowMfu,
  });
  r.push_back(RuleSpec{
      .id = "small_batch",
      .family = "compute",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "mean GPU utilization > " + Num(kSmallBatchUtilPct) + "% but MFU < " +
                    Pct(kSmallBatchMfu),
      .fix = "The kernels are too small: raise the batch size (or micro-batch, with fewer "
             "accumulation steps), fuse elementwise ops with torch.compile, and use bf16 so "
             "matmuls run on tensor cores.",
      .inputs = "MFU (as low_mfu) and gpu_samples_1s.util_mean_pct",
      .thresholds = {{"kSmallBatchUtilPct", kSmallBatchUtilPct,
                      "fires above this mean GPU utilization (%)"},
                     {"kSmallBatchMfu", kSmallBatchMfu, "...with MFU below this"}},
      .explains = {{"low_mfu", "", "", ""}},
      .evaluate = rules::SmallBatch,
  });
  r.push_back(RuleSpec{
      .id = "kernel_launch_overhead",
      .family = "compute",
      .max_severity = Severity::kMed,
      .severity = "med ≥ " + Pct(kOverheadMedFraction) + " of step time, or periodic host work ≥ " +
                  Pct(kVarianceMedShare) + ", else low",
      .fires_when = "step time minus loader wait exceeds the sum of phase times by > " +
                    Pct(kOverheadFraction) +
                    " of step time; periodic host work (not launch "
                    "overhead, with its own fix) when ≥ " +
                    Pct(kOverheadSpikeShare) +
                    " of that time is in steps whose own exceeds the median by a median step",
      .fix = "Cut per-step host work: torch.compile (mode=\"reduce-overhead\") or CUDA graphs "
             "to batch kernel launches; move logging, .item() syncs and metric updates out of "
             "the hot loop.",
      .inputs = "phases.wall_ns and steps.wait_ns on steady-state steps",
      .thresholds = {{"kOverheadFraction", kOverheadFraction,
                      "fires above this share of step time"},
                     {"kOverheadMedFraction", kOverheadMedFraction, "med at or above this share"},
                     {"kOverheadSpikeShare", kOverheadSpikeShare,
                      "periodic host work when at least this share of the time outside lies in "
                      "the slow steps (then kPeriodicHostWorkFix)"}},
      .explains = {{"high_step_variance", "other_caused",
                    "its slow steps' extra time is outside the loader and the phases",
                    "periodic_other"}},
      .evaluate = rules::KernelLaunchOverhead,
  });
  r.push_back(RuleSpec{
      .id = "gradient_checkpointing_detected",
      .family = "compute",
      .max_severity = Severity::kMed,
      .severity = "med when checkpointing runs undeclared, low when declared but not seen",
      .fires_when = "backward/forward (median over steady steps) ≥ " + Num(kCkptMinRatio) +
                    " (checkpointing) with grad_checkpoint=False, or ≤ " + Num(kNoCkptMaxRatio) +
                    " (none) with grad_checkpoint=True",
      .fix = "Make the declared grad_checkpoint match what runs, or fix the checkpoint "
             "wrapping; MFU counts model FLOPs without the recompute, so checkpointing costs "
             "MFU.",
      .inputs = "runs.config_json \"grad_checkpoint\" (bool); forward and backward phases.gpu_ns "
                "(wall_ns on a CPU run)",
      .thresholds = {{"kCkptMinRatio", kCkptMinRatio,
                      "backward/forward at or above this means checkpointing"},
                     {"kNoCkptMaxRatio", kNoCkptMaxRatio,
                      "at or below this means no checkpointing"}},
      .evaluate = rules::GradientCheckpointing,
  });
  r.push_back(RuleSpec{
      .id = "sdpa_suboptimal",
      .family = "compute",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "softmax + bmm kernels > " + Pct(kSdpaHotFraction) +
                    " of kernel time with no flash / memory-efficient attention kernel",
      .fix = "Use torch.nn.functional.scaled_dot_product_attention instead of "
             "matmul-softmax-matmul, and keep it on a fused backend (4-D (batch, heads, seq, "
             "head_dim) inputs, fp16/bf16 on GPU, a supported head dim, is_causal=True "
             "instead of a dense mask); or install FlashAttention.",
      .inputs = "kernels (names and gpu_ns); on a CPU run cpu_ops (names and self_cpu_ns)",
      .thresholds = {{"kSdpaHotFraction", kSdpaHotFraction,
                      "fires above this share of kernel time"}},
      .evaluate = rules::SdpaSuboptimal,
  });
  r.push_back(RuleSpec{
      .id = "kernel_drift",
      .family = "compute",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "a kernel's time per window (and per call) grew > " + Pct(kDriftGrowth) +
                    " between the halves of the run, adding ≥ " + Pct(kDriftMinShare) +
                    " of kernel time per window",
      .fix = "Look for memory fragmentation (torch.cuda.memory_stats: num_alloc_retries; try "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), cuBLAS/cuDNN autotune cache "
             "invalidation from changing shapes, or clocks dropping (see thermal_throttling).",
      .inputs = "kernels (on a CPU run cpu_ops) with at least " + std::to_string(kDriftMinWindows) +
                " windows in each half of the run",
      .thresholds = {{"kDriftGrowth", kDriftGrowth, "fires above this growth"},
                     {"kDriftMinShare", kDriftMinShare,
                      "added time at least this share of kernel time per window"},
                     {"kDriftMinWindows", static_cast<double>(kDriftMinWindows),
                      "evaluated with at least this many windows per half"}},
      .evaluate = rules::KernelDrift,
  });
}

void AddMemoryThermal(std::vector<RuleSpec>& r) {
  r.push_back(RuleSpec{
      .id = "memory_pressure",
      .family = "memory_thermal",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "peak GPU memory in use > " + Pct(kGpuMemPressure) + " of the device's",
      .fix = "Free device memory: gradient checkpointing, bf16 activations (autocast), a smaller "
             "micro-batch with gradient accumulation, or sharded optimizer state (ZeRO / FSDP); "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation.",
      .inputs = "gpu_samples_1s.mem_used_max_bytes with mem_total_bytes (or "
                "gpus.memory_total_bytes)",
      .thresholds = {{"kGpuMemPressure", kGpuMemPressure,
                      "fires above this share of device memory"}},
      .evaluate = rules::MemoryPressure,
  });
  r.push_back(RuleSpec{
      .id = "thermal_throttling",
      .family = "memory_thermal",
      .max_severity = Severity::kHigh,
      .severity = "high on ≥ " + Pct(kThrottleHighFraction) + " of samples, else med",
      .fires_when = "> " + Pct(kThrottleSampleFraction) + " of a GPU's samples at > " +
                    Num(kThrottleTempC) + " °C with the SM clock > " + Pct(kThrottleClockDrop) +
                    " below max, or with NVML thermal slowdown reasons",
      .fix = "Cool the GPU: check fans and airflow, inlet temperature, blanking panels and dust; "
             "compare `nvidia-smi -q -d PERFORMANCE,TEMPERATURE` across GPUs and report a GPU "
             "that throttles alone.",
      .inputs = "gpu_samples_1s throttled_samples of thermal_samples, judged per raw sample from "
                "clock_reasons, or temp_c with sm_clock_mhz (max from gpus.sm_clock_max_mhz, else "
                "the highest so far)",
      .thresholds = {{"kThrottleTempC", kThrottleTempC, "hotter than this (°C)..."},
                     {"kThrottleClockDrop", kThrottleClockDrop,
                      "...with the SM clock more than this below max"},
                     {"kNvmlSwThermalSlowdown", static_cast<double>(kNvmlSwThermalSlowdown),
                      "NVML clocks-event reason bit 0x20: SW thermal slowdown"},
                     {"kNvmlHwThermalSlowdown", static_cast<double>(kNvmlHwThermalSlowdown),
                      "NVML clocks-event reason bit 0x40: HW thermal slowdown"},
                     {"kThrottleSampleFraction", kThrottleSampleFraction,
                      "fires above this share of a GPU's samples"},
                     {"kThrottleHighFraction", kThrottleHighFraction,
                      "high at or above this share"}},
      .evaluate = rules::ThermalThrottling,
  });
}

void AddWarmup(std::vector<RuleSpec>& r) {
  r.push_back(RuleSpec{
      .id = "compilation_warmup",
      .family = "warmup",
      .max_severity = Severity::kLow,
      .severity = "low",
      .fires_when = "step 0's time outside the loader wait > " + Times(kWarmupRatio) +
                    " the steady-state median (the same, loader waits left out), the warmup "
                    "steps' excess being ≥ " +
                    Pct(kWarmupMinShare) + " of the run's step time",
      .fix = "Leave the warmup steps out of throughput numbers (gpuprof's steady-state stats "
             "already skip them); with torch.compile, warm up before timing and avoid "
             "recompiles (e.g. mark dynamic shapes).",
      .inputs = "at least " + std::to_string(kWarmupMinSteps) + " steps",
      .thresholds = {{"kWarmupRatio", kWarmupRatio, "fires above this multiple"},
                     {"kWarmupMinShare", kWarmupMinShare,
                      "...when the warmup's excess is at least this share of the run's step time"},
                     {"kWarmupMinSteps", static_cast<double>(kWarmupMinSteps),
                      "evaluated with at least this many steps"}},
      .evaluate = rules::CompilationWarmup,
  });
  r.push_back(RuleSpec{
      .id = "first_step_outlier",
      .family = "warmup",
      .max_severity = Severity::kLow,
      .severity = "low",
      .fires_when = "step 0's time outside the loader wait > " + Times(kFirstStepRatio) +
                    " the other steps' median (the same), lifting the mean step time by ≥ " +
                    Pct(kFirstStepMinLift),
      .fix = "Step 0 pays one-time costs (CUDA context, cuBLAS/cuDNN autotuning, torch.compile "
             "graph capture): filter it out of benchmarks and averages; it is not a "
             "steady-state problem.",
      .inputs = "at least " + std::to_string(kWarmupMinSteps) + " steps",
      .thresholds = {{"kFirstStepRatio", kFirstStepRatio, "fires above this multiple"},
                     {"kFirstStepMinLift", kFirstStepMinLift,
                      "...lifting the mean step time by at least this share"},
                     {"kWarmupMinSteps", static_cast<double>(kWarmupMinSteps),
                      "evaluated with at least this many steps"}},
      .explains = {{"compilation_warmup", "", "", ""}},
      .evaluate = rules::FirstStepOutlier,
  });
  r.push_back(RuleSpec{
      .id = "high_step_variance",
      .family = "warmup",
      .max_severity = Severity::kMed,
      .severity = "med when the slow steps cost ≥ " + FormatPercent(kVarianceMedShare) +
                  " of steady-state time, else low",
      .fires_when = "steady-state p99 / p50 step time > " + FormatCompact(kVarianceRatio) +
                    " with at least " + std::to_string(kVarianceMinSpikes) + " steps over " +
                    Times(kVarianceRatio) + " the median",
      .fix = "Find what runs on the slow steps: periodic logging or checkpoint saves, .item() / "
             "print syncs, evaluation, Python GC pauses (gc.freeze() after setup), or "
             "dataloader workers being descheduled.",
      .inputs = "at least " + std::to_string(kVarianceMinSteps) +
                " steady-state steps, leaving out the steps gpuprof's CPU-operator trace slowed "
                "(cpu_ops: each traced step and the one after it)",
      .thresholds = {{"kVarianceRatio", kVarianceRatio, "fires above this p99/p50"},
                     {"kVarianceMinSteps", static_cast<double>(kVarianceMinSteps),
                      "evaluated with at least this many steady-state steps"},
                     {"kVarianceMinSpikes", static_cast<double>(kVarianceMinSpikes),
                      "slow steps needed to fire"},
                     {"kVarianceMedShare", kVarianceMedShare,
                      "med at or above this share of steady-state time lost to slow steps"},
                     {"kVarianceLoaderShare", kVarianceLoaderShare,
                      "the slow steps are the loader's when at least this share of their extra "
                      "time is loader wait (then the loader's fix; a firing loader rule "
                      "explains it)"},
                     {"kVarianceStallShare", kVarianceStallShare,
                      "the slow steps are the machine's when at least this share of their extra "
                      "time the process was held off the CPU or its threads queued for one (then "
                      "host_stalls' or cpu_contention's fix, whichever took more; that rule "
                      "explains it when it fires)"},
                     {"kVarianceOtherShare", kVarianceOtherShare,
                      "the slow steps are host work between steps when at least this share of "
                      "their extra time is outside the loader wait and the phases (then the "
                      "periodic host work fix; kernel_launch_overhead's periodic finding "
                      "explains it)"}},
      .evaluate = rules::HighStepVariance,
  });
  r.push_back(RuleSpec{
      .id = "evaluation_in_steps",
      .family = "warmup",
      .max_severity = Severity::kMed,
      .severity = "med ≥ " + Pct(kEvalMedShare) + " of steady-state step time, else low",
      .fires_when = "steady-state steps with ≥ " + std::to_string(kEvalExtraForwards) +
                    " more forward calls than the typical step (and at least twice as many) "
                    "and no more backward passes take ≥ " +
                    Pct(kEvalMinShare) +
                    " of steady-state step time above the typical step; the loader rules and "
                    "high_step_variance leave those steps out",
      .fix = "If it is a validation loop, wrap it in `with prof.evaluation():` (the Lightning, "
             "Hugging Face and DeepSpeed integrations do) so its forwards, loader waits and time "
             "stay out of the training steps; if these forwards are part of training (RL "
             "rollouts, a frozen teacher), this is what they cost: run them less often or in "
             "larger batches.",
      .inputs = "steps.forward_calls and steps.backward_calls on steady-state steps",
      .thresholds = {{"kEvalExtraForwards", static_cast<double>(kEvalExtraForwards),
                      "extra forward calls (and at least 2× the typical count) that make an "
                      "evaluation step",
                      true},
                     {"kEvalMinShare", kEvalMinShare,
                      "fires when the evaluation steps' time above the typical step is at least "
                      "this share"},
                     {"kEvalMedShare", kEvalMedShare, "med at or above this share"}},
      .evaluate = rules::EvaluationInSteps,
  });
}

void AddDistributed(std::vector<RuleSpec>& r) {
  r.push_back(RuleSpec{
      .id = "comm_dominant",
      .family = "distributed",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "collectives in flight > " + Pct(kCommFraction) + " of steady-state step time",
      .fix = kCommDominantFix,
      .inputs = "comm_buckets on steady-state steps (a run that is not distributed passes); "
                "steps.backward_calls and a bucket reduced more than once a step pick the fix "
                "for gradient accumulation",
      .thresholds = {{"kCommFraction", kCommFraction, "fires above this share of step time"}},
      .evaluate = rules::CommDominant,
  });
  r.push_back(RuleSpec{
      .id = "peer_wait",
      .family = "distributed",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "this rank waits for the other ranks in its collectives > " +
                    Pct(kPeerWaitFraction) + " of steady-state step time",
      .fix = "Make the rank it waits for faster, not the communication: gpuprof insights "
             "--group compares the ranks, and that rank's own report names its bottleneck (its "
             "host's CPU load or dataloader, its GPU's clocks or thermals, uneven data "
             "sharding).",
      .inputs = "comm_buckets of this rank and of the job's other ranks (same group_id) in the "
                "same store, on at least half of its steady-state steps with collectives; up to " +
                std::to_string(kPeerWaitMaxRows / 1'000'000) +
                " M bucket rows compared (a run that is not distributed passes); the stored "
                "insights of the rank waited for name its own leading finding",
      .thresholds = {{"kPeerWaitFraction", kPeerWaitFraction,
                      "fires above this share of step time; explains comm_dominant when the "
                      "collectives' share without the wait is at most kCommFraction"}},
      .explains = {{"comm_dominant", "mostly_peer_wait",
                    "its collectives are mostly this rank waiting for the others", ""}},
      .evaluate = rules::PeerWait,
  });
  r.push_back(RuleSpec{
      .id = "bucket_skew",
      .family = "distributed",
      .max_severity = Severity::kHigh,
      .severity = "high on ≥ " + Pct(kBucketHighFraction) + " of steps, else med",
      .fires_when = "one rank starts the same bucket's collective last (> " + Num(kBucketLateMs) +
                    " ms after the others' median) on ≥ " + Pct(kBucketLateFraction) + " of steps",
      .fix = "One collective waits on one rank: check that rank's host and GPU (thermals, "
             "clocks, CPU load, its own dataloader), its NIC / NVLink topology, and uneven work "
             "before that bucket (data-dependent layers, unbalanced shards).",
      .inputs = "comm_buckets on at least 2 ranks, for buckets timed on " +
                std::to_string(kBucketSkewMinSteps) +
                "+ steps; hosts aligned by each run's "
                "start_unix_ns minus its measured clock offset (runs.config_json "
                "distributed.clock_offset_ns; the wall clock as it is without one)",
      .thresholds = {{"kBucketLateMs", kBucketLateMs,
                      "late: starts more than this (ms) after the others' median"},
                     {"kBucketLateFraction", kBucketLateFraction,
                      "fires at or above this share of the bucket's steps"},
                     {"kBucketHighFraction", kBucketHighFraction, "high at or above this share"},
                     {"kBucketSkewMinSteps", static_cast<double>(kBucketSkewMinSteps),
                      "a bucket is judged on at least this many steps"},
                     {"kBucketRankWideFraction", kBucketRankWideFraction,
                      "late on at least this share of the judged buckets: the rank's work as a "
                      "whole (rank_skew explains it), else the work before those buckets (it "
                      "explains rank_skew of that rank)"}},
      .explains = {{"rank_skew", "bucket_local",
                    "the same rank is late before only some buckets: uneven work before them",
                    "run_id"}},
      .evaluate_group = rules::BucketSkew,
  });
  r.push_back(RuleSpec{
      .id = "rank_skew",
      .family = "distributed",
      .max_severity = Severity::kMed,
      .severity = "med",
      .fires_when = "a rank's steady-state median work time (step time minus its wait for the "
                    "other ranks in the collectives, from comm_buckets on 2+ ranks; else its "
                    "step time) > " +
                    Pct(kRankSkewFraction) + " above the median of the other ranks' medians",
      .fix = "Find what differs on that rank: its host (CPU load, dataloader, page cache; read "
             "its own report with gpuprof insights DB RUN), its GPU (clocks, thermals, PCIe / "
             "NVLink topology), or uneven data sharding.",
      .inputs = "steps of at least 2 ranks with a steady state (comm_buckets on 2+ of them for "
                "the work-time comparison); the slow rank's stored insights name its own "
                "leading finding",
      .thresholds = {{"kRankSkewFraction", kRankSkewFraction,
                      "fires above this share over the others"}},
      .explains = {{"bucket_skew", "rank_wide",
                    "the same rank is late on almost every bucket: its work as a whole", "run_id"}},
      .evaluate_group = rules::RankSkew,
  });
}

std::vector<RuleSpec> BuildRules() {
  std::vector<RuleSpec> r;
  AddDataPipeline(r);
  AddHost(r);
  AddCompute(r);
  AddMemoryThermal(r);
  AddWarmup(r);
  AddDistributed(r);
  r.push_back(RuleSpec{
      .id = "regression",
      .family = "regression",
      .max_severity = Severity::kMed,
      .severity = "med when slower, info when faster",
      .fires_when = "steady-state time per step (loader wait included) > " +
                    Pct(kRegressionSlower) + " slower (or > " + Pct(kImprovementFaster) +
                    " faster) than the median of the last " + std::to_string(kRegressionRuns) +
                    " runs with the same run_name, and beyond the noise of both (95% intervals "
                    "from blocks of steps; else inconclusive)",
      .fix = "Diff this run against the baseline runs (code, config, batch size, data, driver, "
             "GPU); the other insights show where the time goes.",
      .inputs = "an earlier finished run with the same run_name and at least " +
                std::to_string(kRegressionMinSteps) +
                " steady-state steps, in the same DB; as many in this run",
      .thresholds = {{"kRegressionSlower", kRegressionSlower, "med above this slowdown"},
                     {"kImprovementFaster", kImprovementFaster, "info above this speed-up"},
                     {"kRegressionRuns", static_cast<double>(kRegressionRuns),
                      "baseline: median of up to this many previous runs"},
                     {"kRegressionLookback", static_cast<double>(kRegressionLookback),
                      "looking back at most this many runs"},
                     {"kRegressionMinSteps", static_cast<double>(kRegressionMinSteps),
                      "steady-state steps each run needs (fewer: inconclusive)"}},
      .evaluate = rules::Regression,
  });
  r.push_back(RuleSpec{
      .id = "cost",
      .family = "cost",
      .max_severity = Severity::kLow,
      .severity = "low (reported whenever it can be computed)",
      .fires_when = "always, when a rate is known: run duration × GPU count × USD per GPU-hour; "
                    "with MFU known, the idle share cost × (1 − MFU)",
      .fix = "Recover idle capacity first (see the other insights). The rate is a reference "
             "on-demand price; set GPUPROF_GPU_RATE=<USD per GPU-hour> for your own.",
      .inputs = "run duration, runs.gpu_model with a reference rate (or GPUPROF_GPU_RATE) and "
                "runs.gpu_count; a CPU run needs GPUPROF_GPU_RATE (priced per machine)",
      .thresholds = {},
      .evaluate = rules::Cost,
  });
  return r;
}

}  // namespace

std::string ExplainsText(const RuleSpec& spec) {
  std::string out;
  for (size_t i = 0; i < spec.explains.size(); ++i) {
    const RuleExplains& e = spec.explains[i];
    out += (i ? ", " : "") + ("`" + e.rule_id + "`");
    if (!e.when.empty()) out += " (when " + e.when_text + ")";
  }
  return out;
}

namespace {

std::string EscapePipes(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string_view SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kHigh:
      return "high";
    case Severity::kMed:
      return "med";
    case Severity::kLow:
      return "low";
    case Severity::kInfo:
      return "info";
  }
  return "info";
}

std::string_view SeverityTag(Severity severity) {
  switch (severity) {
    case Severity::kHigh:
      return "HIGH";
    case Severity::kMed:
      return "MED";
    case Severity::kLow:
      return "LOW";
    case Severity::kInfo:
      return "INFO";
  }
  return "INFO";
}

std::optional<Severity> ParseSeverity(std::string_view name) {
  for (Severity s : {Severity::kHigh, Severity::kMed, Severity::kLow, Severity::kInfo}) {
    if (name == SeverityName(s)) return s;
  }
  return std::nullopt;
}

const std::vector<RuleSpec>& Rules() {
  static const std::vector<RuleSpec> kRules = BuildRules();
  return kRules;
}

const RuleSpec* FindRule(std::string_view id) {
  for (const RuleSpec& spec : Rules()) {
    if (spec.id == id) return &spec;
  }
  return nullptr;
}

namespace {
RuleResult Complete(const RuleSpec& spec, RuleResult result) {
  if (result.insight) {
    result.insight->rule_id = spec.id;
    result.insight->family = spec.family;
    if (result.insight->fix.empty()) result.insight->fix = spec.fix;
  }
  return result;
}
}  // namespace

RuleResult EvaluateRule(const RuleSpec& spec, const RunView& view, const RuleContext& context) {
  if (!spec.evaluate) {
    return RuleResult::Skip("a group rule: run gpuprof insights DB --group NAME");
  }
  return Complete(spec, spec.evaluate(view, context));
}

RuleResult EvaluateGroupRule(const RuleSpec& spec, const GroupView& group,
                             const RuleContext& context) {
  if (!spec.evaluate_group) return RuleResult::Skip("not a group rule");
  return Complete(spec, spec.evaluate_group(group, context));
}

std::string RulesMarkdown() {
  std::string out;
  out += "| Rule | Family | Severity | Fires when | Fix |\n";
  out += "|---|---|---|---|---|\n";
  for (const RuleSpec& s : Rules()) {
    out += "| `" + s.id + "`" + (s.group() ? " (group)" : "") + " | " + s.family + " | " +
           EscapePipes(s.severity) + " | " + EscapePipes(s.fires_when) + " | " +
           EscapePipes(s.fix) + " |\n";
  }
  out += "\n| Rule | Threshold | Value | Meaning |\n";
  out += "|---|---|---|---|\n";
  for (const RuleSpec& s : Rules()) {
    for (const RuleThreshold& t : s.thresholds) {
      // A fraction is a share, also shown as a percentage; a quantity (cores) is not.
      const bool share = t.value > 0 && t.value < 1 && !t.quantity;
      out += "| `" + s.id + "` | `" + t.name + "` | " + StrFormat("%g", t.value) +
             (share ? " (" + FormatPercent(t.value) + ")" : "") + " | " + EscapePipes(t.meaning) +
             " |\n";
    }
  }
  out += "\n| Rule | Needs (else \"not evaluated\") |\n";
  out += "|---|---|\n";
  for (const RuleSpec& s : Rules()) {
    out += "| `" + s.id + "` | " + EscapePipes(s.inputs) + " |\n";
  }
  out += "\n| Rule | Explains (when both fire, reported under it) |\n";
  out += "|---|---|\n";
  for (const RuleSpec& s : Rules()) {
    if (!s.explains.empty()) out += "| `" + s.id + "` | " + EscapePipes(ExplainsText(s)) + " |\n";
  }
  return out;
}

std::string RulesText() {
  std::string out = StrFormat("%zu rules\n", Rules().size());
  std::string family;
  for (const RuleSpec& s : Rules()) {
    if (s.family != family) {
      family = s.family;
      out += "\n" + family + "\n";
    }
    out += "  " + s.id + (s.group() ? " (group)" : "") + "  [" + s.severity + "]\n";
    out += "    fires when: " + s.fires_when + "\n";
    out += "    needs:      " + s.inputs + "\n";
    out += "    fix:        " + s.fix + "\n";
    if (!s.explains.empty()) out += "    explains:   " + ExplainsText(s) + "\n";
  }
  return out;
}

}  // namespace gpuprof::analysis
