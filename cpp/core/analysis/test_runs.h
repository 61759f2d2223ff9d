// Test-only builders of in-memory runs (store::RunData) for the analysis tests. Scenarios
// are described in step shapes; expected numbers in the tests are computed from the same
// shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/insight.h"
#include "store/rollup.h"
#include "store/sqlite_store.h"

namespace gpuprof::analysis::testing {

inline constexpr int64_t kMs = 1'000'000;
inline constexpr int64_t kSec = 1'000'000'000;

// One step: its total duration and how it splits. Durations in ns.
struct StepShape {
  int64_t duration_ns = 100 * kMs;
  std::optional<int64_t> wait_ns = 5 * kMs;  // nullopt = not measured
  std::string wait_source = "gap";
  // (name, wall_ns, gpu_ns) per phase; default: forward 30 ms, backward 50 ms, optimizer 10 ms
  // -> 5 ms outside wait and phases (5%).
  struct Phase {
    std::string name;
    int64_t wall_ns;
    std::optional<int64_t> gpu_ns;
  };
  std::vector<Phase> phases = {
      {"forward", 30 * kMs, std::nullopt},
      {"backward", 50 * kMs, std::nullopt},
      {"optimizer", 10 * kMs, std::nullopt},
  };
};

// Healthy defaults: a CUDA run on one H100, steps tiled from t = 0, status ok.
class RunBuilder {
 public:
  RunBuilder() {
    auto& r = data_.run;
    r.run_id = 1;
    r.run_name = "exp";
    r.hostname = "node-1";
    r.pid = 4242;
    r.start_unix_ns = 1714564800LL * kSec;  // 2024-05-01 12:00:00 UTC
    r.start_mono_ns = 5 * kSec;
    r.status = "ok";
    r.device_kind = "cuda";
    r.gpu_backend = "nvml";
    r.gpu_model = "NVIDIA H100 80GB HBM3";
    r.gpu_count = 1;
    r.gpuprof_version = "0.1.0";
  }

  store::RunInfo& run() { return data_.run; }
  store::RunData& data() { return data_; }

  RunBuilder& Name(std::string name) {
    data_.run.run_name = std::move(name);
    return *this;
  }
  RunBuilder& Cpu() {
    data_.run.device_kind = "cpu";
    data_.run.gpu_backend = "none";
    data_.run.gpu_model.reset();
    data_.run.gpu_count.reset();
    return *this;
  }
  RunBuilder& Gpu(std::string model, int64_t count) {
    data_.run.device_kind = "cuda";
    data_.run.gpu_model = std::move(model);
    data_.run.gpu_count = count;
    return *this;
  }
  RunBuilder& Flops(double per_step, std::string dtype) {
    data_.run.flops_per_step = per_step;
    data_.run.flops_method = "declared";
    data_.run.dtype = std::move(dtype);
    return *this;
  }
  // Appends one step after the previous one. Step 0's gap wait is forced to nullopt (the
  // recorder cannot know it) unless the wait was measured ("explicit", "dataloader").
  RunBuilder& Step(const StepShape& shape) {
    store::StepRow s;
    s.step = static_cast<int64_t>(data_.steps.size());
    s.start_ns = end_;
    s.end_ns = end_ + shape.duration_ns;
    s.wait_ns = shape.wait_ns;
    if (s.wait_ns) s.wait_source = shape.wait_source;
    if (s.step == 0 && shape.wait_source == "gap") {
      s.wait_ns.reset();
      s.wait_source.reset();
    }
    s.forward_calls = s.backward_calls = s.optimizer_calls = 1;
    if (s.wait_source == "dataloader") s.loader_starts = s.loader_start_ns = 0;  // next() only
    for (const auto& p : shape.phases) {
      data_.phases.push_back(store::PhaseRow{s.step, p.name, p.wall_ns, p.gpu_ns, 1});
    }
    end_ = s.end_ns;
    data_.steps.push_back(std::move(s));
    data_.run.end_ns = end_;
    return *this;
  }
  RunBuilder& Steps(size_t n, const StepShape& shape) {
    for (size_t i = 0; i < n; ++i) Step(shape);
    return *this;
  }
  RunBuilder& Telemetry(std::string source, bool available, std::optional<std::string> backend,
                        std::optional<std::string> reason) {
    data_.telemetry.push_back(store::TelemetryStatusRow{std::move(source), available,
                                                        std::move(backend), std::move(reason)});
    return *this;
  }
  // Raw GPU and worker samples are kept here and rolled up by Build() with the recorder's
  // rollup code (store/rollup.h), as a real run stores them.
  RunBuilder& GpuSample(store::GpuSampleRow row) {
    gpu_samples_.push_back(std::move(row));
    return *this;
  }
  RunBuilder& HostSample(store::HostSampleRow row) {
    data_.host_samples.push_back(std::move(row));
    return *this;
  }
  RunBuilder& WorkerSample(store::WorkerSampleRow row) {
    worker_samples_.push_back(std::move(row));
    return *this;
  }
  RunBuilder& Kernel(int64_t window_start_ns, int64_t window_end_ns, std::string name,
                     int64_t calls, int64_t gpu_ns) {
    data_.kernels.push_back(store::KernelRow{window_start_ns, window_end_ns, std::move(name), calls,
                                             gpu_ns, "torch_profiler"});
    return *this;
  }
  // A CPU operator of a traced step (cpu_ops: torch.profiler on a CPU run).
  RunBuilder& CpuOp(int64_t window_start_ns, int64_t window_end_ns, std::optional<int64_t> step,
                    std::string name, int64_t calls, int64_t self_cpu_ns) {
    data_.cpu_ops.push_back(store::CpuOpRow{window_start_ns, window_end_ns, step, std::move(name),
                                            calls, self_cpu_ns, std::nullopt, "torch_profiler"});
    return *this;
  }
  RunBuilder& CommBucket(int64_t step, int64_t bucket, int64_t start_ns, int64_t end_ns,
                         std::optional<int64_t> bytes = std::nullopt) {
    data_.comm_buckets.push_back(store::CommBucketRow{step, bucket, start_ns, end_ns, bytes});
    return *this;
  }
  // The stall watch ran (telemetry_status 'stalls'); Stall() adds one stall.
  RunBuilder& StallWatch() { return Telemetry("stalls", true, "watch thread", std::nullopt); }
  RunBuilder& Stall(int64_t start_ns, int64_t duration_ns) {
    data_.stalls.push_back(store::StallRow{start_ns, duration_ns});
    return *this;
  }
  // A stall of `duration_ns` at the start of step `step` (already added).
  RunBuilder& StallInStep(size_t step, int64_t duration_ns) {
    return Stall(data_.steps.at(step).start_ns, duration_ns);
  }
  // The CPU wait was read (telemetry_status 'cpu_wait'); CpuWait() adds one stretch.
  RunBuilder& CpuWaitWatch() { return Telemetry("cpu_wait", true, "schedstat", std::nullopt); }
  RunBuilder& CpuWait(int64_t start_ns, int64_t end_ns, int64_t wait_ns) {
    data_.cpu_waits.push_back(store::CpuWaitRow{start_ns, end_ns, wait_ns});
    return *this;
  }
  // `wait_ns` of CPU wait spread over step `step` (already added).
  RunBuilder& CpuWaitInStep(size_t step, int64_t wait_ns) {
    return CpuWait(data_.steps.at(step).start_ns, data_.steps.at(step).end_ns, wait_ns);
  }
  RunBuilder& GpuInfo(int64_t index, std::optional<int64_t> memory_total_bytes,
                      std::optional<int64_t> sm_clock_max_mhz) {
    data_.gpus.push_back(store::GpuInfoRow{index, data_.run.gpu_model, std::nullopt,
                                           memory_total_bytes, sm_clock_max_mhz});
    return *this;
  }
  RunBuilder& Config(std::string json) {
    data_.run.config_json = std::move(json);
    return *this;
  }
  RunBuilder& Rank(std::string group, int64_t rank, int64_t world_size) {
    data_.run.group_id = std::move(group);
    data_.run.rank = rank;
    data_.run.world_size = world_size;
    return *this;
  }
  // One host sample every `period_ns` from t = 0 to the end of the last step, filled by `fill`
  // (which gets the sample time).
  RunBuilder& HostEvery(int64_t period_ns,
                        const std::function<void(int64_t, store::HostSampleRow&)>& fill) {
    for (int64_t t = 0; t <= end_; t += period_ns) {
      store::HostSampleRow row;
      row.ts_ns = t;
      fill(t, row);
      data_.host_samples.push_back(std::move(row));
    }
    return *this;
  }
  // The same for GPU samples of GPU 0..gpus-1.
  RunBuilder& GpuEvery(int64_t period_ns,
                       const std::function<void(int64_t, store::GpuSampleRow&)>& fill,
                       int64_t gpus = 1) {
    for (int64_t t = 0; t <= end_; t += period_ns) {
      for (int64_t g = 0; g < gpus; ++g) {
        store::GpuSampleRow row;
        row.ts_ns = t;
        row.gpu_index = g;
        fill(t, row);
        gpu_samples_.push_back(std::move(row));
      }
    }
    return *this;
  }
  const std::vector<store::StepRow>& steps() const { return data_.steps; }
  // An insight as the run's own report stored it (ordinal order: the order of the calls).
  RunBuilder& StoredInsight(std::string rule_id, std::string family, std::string severity,
                            std::string message, std::optional<std::string> fix) {
    data_.insights.push_back(store::InsightRow{
        static_cast<int64_t>(data_.insights.size()), std::move(rule_id), std::move(family),
        std::move(severity), std::move(message), std::move(fix), std::nullopt});
    return *this;
  }
  // Step `step`'s (its index) loader wait started the loader (iter(loader)) `starts` times,
  // for `start_ns` in all.
  RunBuilder& LoaderStart(size_t step, int64_t starts, int64_t start_ns) {
    data_.steps.at(step).loader_starts = starts;
    data_.steps.at(step).loader_start_ns = start_ns;
    return *this;
  }
  // Step `step` (its index) ran these forward calls and backward passes.
  RunBuilder& Calls(size_t step, int64_t forwards, int64_t backwards) {
    data_.steps.at(step).forward_calls = forwards;
    data_.steps.at(step).backward_calls = backwards;
    return *this;
  }
  // Every step ran n backward passes (gradient accumulation).
  RunBuilder& BackwardPasses(int64_t n) {
    for (auto& s : data_.steps) s.forward_calls = s.backward_calls = n;
    return *this;
  }
  int64_t end_ns() const { return end_; }
  // The raw samples given so far (what the run's raw tier would hold).
  const std::vector<store::GpuSampleRow>& gpu_samples() const { return gpu_samples_; }
  const std::vector<store::WorkerSampleRow>& worker_samples() const { return worker_samples_; }
  // The run as LoadRun returns it: raw GPU and worker samples rolled up into gpu_samples_1s
  // (maximum SM clocks from the gpus rows) and worker_samples_10s.
  store::RunData Build() const {
    store::RunData d = data_;
    for (auto& r : store::RollupGpuSamples(gpu_samples_, d.gpus)) {
      d.gpu_samples_1s.push_back(std::move(r));
    }
    for (auto& r : store::RollupWorkerSamples(worker_samples_)) {
      d.worker_samples_10s.push_back(std::move(r));
    }
    // In the order LoadRun gives them (by source).
    std::stable_sort(d.telemetry.begin(), d.telemetry.end(),
                     [](const auto& a, const auto& b) { return a.source < b.source; });
    return d;
  }

 private:
  store::RunData data_;
  std::vector<store::GpuSampleRow> gpu_samples_;
  std::vector<store::WorkerSampleRow> worker_samples_;
  int64_t end_ = 0;
};

// A run with nothing to flag: 50 steps of the default shape (5% wait, 5% other), step 0 at
// 1.5× the rest, and MFU 50% of the H100 bf16 peak.
inline RunBuilder HealthyRun() {
  RunBuilder b;
  StepShape first;
  first.duration_ns = 150 * kMs;
  b.Step(first).Steps(49, StepShape{});
  b.Flops(0.5 * 989e12 * 0.100, "bf16");
  return b;
}

// Healthy host telemetry: 30% CPU of 16 cores, 20 MB/s and 200 IOPS of disk reads, page cache
// at 10% of 64 GiB, no swap.
inline void HealthyHost(int64_t, store::HostSampleRow& h) {
  h.cpu_pct = 30;
  h.ncores = 16;
  h.mem_total_bytes = 64LL << 30;
  h.mem_used_bytes = 20LL << 30;
  h.page_cache_bytes = static_cast<int64_t>(0.1 * (64LL << 30));
  h.swap_in_bps = 0;
  h.disk_read_bps = 20e6;
  h.disk_read_iops = 200;
  h.proc_cpu_pct = 250;
  h.proc_rss_bytes = 8LL << 30;
}

// Healthy GPU telemetry on an 80 GiB, 1980 MHz device: 85% busy, half the memory, 70 °C at
// the full clock, no clock-event reasons, 2 GB/s of PCIe reads.
inline void HealthyGpu(int64_t, store::GpuSampleRow& g) {
  g.util_pct = 85;
  g.mem_util_pct = 50;
  g.mem_used_bytes = 40LL << 30;
  g.mem_total_bytes = 80LL << 30;
  g.proc_mem_bytes = 38LL << 30;
  g.power_mw = 600'000;
  g.temp_c = 70;
  g.sm_clock_mhz = 1980;
  g.clock_reasons = 0;
  g.pcie_rx_bps = 2e9;
  g.pcie_tx_bps = 0.5e9;
}

// HealthyRun with every input a rule can use, all of it healthy: GPU and host telemetry every
// 100 ms, four evenly busy dataloader workers, CUDA-event phase times with backward at 2×
// forward (grad_checkpoint declared false), kernel windows with fused attention and no drift,
// and waits of 5 ms in a torch DataLoader (auto mode), one iter(loader) each epoch of 10 steps
// that waits no longer. Not distributed, so comm_dominant passes.
inline RunBuilder HealthyFullRun() {
  RunBuilder b;
  StepShape first;
  first.duration_ns = 150 * kMs;
  first.wait_source = "dataloader";
  first.phases = {{"forward", 30 * kMs, 30 * kMs},
                  {"backward", 50 * kMs, 60 * kMs},
                  {"optimizer", 10 * kMs, std::nullopt}};
  StepShape step = first;
  step.duration_ns = 100 * kMs;
  b.Step(first).Steps(49, step);
  for (size_t epoch = 0; epoch < 5; ++epoch) b.LoaderStart(epoch * 10, 1, 1 * kMs);
  b.Flops(0.5 * 989e12 * 0.100, "bf16");
  b.Config(R"({"grad_checkpoint": false, "sample_hz": 10})");
  b.Telemetry("gpu", true, "nvml", std::nullopt).Telemetry("host", true, "procfs", std::nullopt);
  b.StallWatch().Stall(20 * kMs, 12 * kMs);                 // one short stall during step 0
  b.CpuWaitWatch().CpuWait(300 * kMs, 320 * kMs, 2 * kMs);  // a little queueing, once
  b.GpuInfo(0, 80LL << 30, 1980);
  b.GpuEvery(100 * kMs, HealthyGpu).HostEvery(100 * kMs, HealthyHost);
  for (int64_t t = 0; t <= b.end_ns(); t += 100 * kMs) {
    b.WorkerSample({t, 100, "main", 100.0, 4LL << 30});
    for (int64_t w = 0; w < 4; ++w) b.WorkerSample({t, 200 + w, "child", 40.0 + w, 1LL << 30});
  }
  for (int64_t win = 0; win < 5; ++win) {
    const int64_t a = win * kSec, z = (win + 1) * kSec;
    b.Kernel(a, z, "ampere_bf16_s16816gemm_bf16_128x128", 1000, 400 * kMs)
        .Kernel(a, z, "flash_fwd_kernel", 240, 80 * kMs)
        .Kernel(a, z, "flash_bwd_kernel", 240, 160 * kMs)
        .Kernel(a, z, "vectorized_elementwise_kernel", 5000, 60 * kMs);
  }
  return b;
}

// A RuleContext whose previous runs of the same name ran at `mean_ms` per step over 47 steady
// steps, each with a spread (relative half-width of its 95% interval) of `spread`.
inline RuleContext WithPreviousRuns(std::vector<double> mean_ms, int64_t first_id = 100,
                                    double spread = 0.02) {
  RuleContext ctx;
  ctx.previous_runs.emplace();
  for (size_t i = 0; i < mean_ms.size(); ++i) {
    PriorRun p;
    p.run_id = first_id - static_cast<int64_t>(i);  // newest first
    p.status = "ok";
    p.steps = 50;
    p.steady_steps = 47;
    p.steady_mean_ns = mean_ms[i] * kMs;
    p.spread = spread;
    ctx.previous_runs->push_back(p);
  }
  return ctx;
}

}  // namespace gpuprof::analysis::testing
