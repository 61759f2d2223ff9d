#include "telemetry/gpu_collector.h"

#include <utility>

#include "telemetry/mock_collector.h"
#include "telemetry/nvml_collector.h"

namespace gpuprof::telemetry {

Expected<std::unique_ptr<GpuCollector>> MakeGpuCollector(const GpuCollectorOptions& options) {
  const std::string& backend = options.backend;
  if (backend == "auto" || backend == "nvml") {
    const bool asked = backend == "nvml";
    const std::string path = ResolveNvmlLibraryPath(options.nvml_library);
    auto nvml = NvmlCollector::Open(path);
    if (!nvml.ok()) {
      if (!asked) return Status::Error("NVML not available: " + nvml.error());
      return Status::Error(
          "gpu_backend='nvml' was requested but NVML could not be used: " + nvml.error() +
          ". Install the NVIDIA driver, or point " + kNvmlLibraryEnv + " at libnvidia-ml.so.1");
    }
    if (nvml.value()->devices().empty()) {
      if (!asked) return Status::Error("NVML found no GPUs (" + path + ")");
      return Status::Error("gpu_backend='nvml' was requested but NVML (" + path +
                           ") reports no usable GPU");
    }
    nvml.value()->set_pcie_interval_ns(int64_t{options.pcie_interval_ms} * 1'000'000);
    return std::unique_ptr<GpuCollector>(std::move(nvml).value().release());
  }
  if (backend == "mock") {
    if (options.mock_gpus < 1 || options.mock_gpus > 1024) {
      return Status::Error("mock_gpus must be between 1 and 1024, got " +
                           std::to_string(options.mock_gpus));
    }
    auto scenario = MockScenario::Parse(options.mock_scenario);
    if (!scenario.ok()) return Status::Error("invalid mock scenario: " + scenario.error());
    return std::unique_ptr<GpuCollector>(
        std::make_unique<MockCollector>(options.mock_gpus, std::move(scenario).value()));
  }
  if (backend == "none") return Status::Error("GPU telemetry disabled (gpu_backend='none')");
  return Status::Error("unknown gpu_backend '" + backend +
                       "' (valid values: auto, nvml, mock, none)");
}

}  // namespace gpuprof::telemetry
