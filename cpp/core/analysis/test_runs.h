// Test-only builders of in-memory runs (store::RunData) for the analysis tests. Scenarios
// are described in step shapes; expected numbers in the tests are computed from the same
// shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
  // recorder cannot know it) unless the source is "explicit".
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
    data_.telemetry.push_back(
        store::TelemetryStatusRow{std::move(source), available, std::move(backend),
                                  std::move(reason)});
    return *this;
  }
  RunBuilder& GpuSample(store::GpuSampleRow row) {
    data_.gpu_samples.push_back(std::move(row));
    return *this;
  }
  RunBuilder& HostSample(store::HostSampleRow row) {
    data_.host_samples.push_back(std::move(row));
    return *this;
  }
  int64_t end_ns() const { return end_; }
  store::RunData Build() const { return data_; }

 private:
  store::RunData data_;
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

}  // namespace gpuprof::analysis::testing
