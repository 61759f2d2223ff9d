#include "telemetry/gpu_collector.h"

#include <sys/stat.h>

#include <utility>

#include "telemetry/mock_collector.h"
#include "telemetry/neuron_collector.h"
#include "telemetry/nvml_collector.h"

namespace gpuprof::telemetry {

namespace {

Expected<std::unique_ptr<GpuCollector>> MakeNvml(const GpuCollectorOptions& options, bool asked) {
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
  if (options.process_utilization) nvml.value()->set_process_utilization(true);
  return std::unique_ptr<GpuCollector>(std::move(nvml).value().release());
}

Expected<std::unique_ptr<GpuCollector>> OpenNeuron(const GpuCollectorOptions& options,
                                                   std::string path) {
  NeuronCollectorOptions o;
  o.monitor_path = std::move(path);
  o.period_s = options.neuron_period_s;
  auto neuron = NeuronCollector::Open(std::move(o));
  if (!neuron.ok()) return neuron.status();
  return std::unique_ptr<GpuCollector>(std::move(neuron).value().release());
}

}  // namespace

Expected<std::unique_ptr<GpuCollector>> MakeGpuCollector(const GpuCollectorOptions& options) {
  const std::string& backend = options.backend;
  if (backend == "nvml") return MakeNvml(options, /*asked=*/true);
  if (backend == "auto") {
    auto nvml = MakeNvml(options, /*asked=*/false);
    if (nvml.ok()) return nvml;
    // Neuron only where there is a Neuron device and the tool to read it: elsewhere (every
    // CPU machine) auto stays quick and spawns nothing.
    auto path = ResolveNeuronMonitorPath(options.neuron_monitor);
    struct stat st {};
    const bool node = stat(options.neuron_device_node.c_str(), &st) == 0;
    std::string neuron_reason;
    if (!node) {
      neuron_reason = options.neuron_device_node + " does not exist (no Neuron device)";
      if (!path.ok()) neuron_reason += "; " + path.error();
    } else if (!path.ok()) {
      neuron_reason = path.error();
    } else {
      auto neuron = OpenNeuron(options, std::move(path).value());
      if (neuron.ok()) return neuron;
      neuron_reason = neuron.error();
    }
    return Status::Error(nvml.error() + "; AWS Neuron not available: " + neuron_reason);
  }
  if (backend == "neuron") {
    if (options.neuron_period_s < 1) {
      return Status::Error("neuron_period_s must be at least 1, got " +
                           std::to_string(options.neuron_period_s));
    }
    auto path = ResolveNeuronMonitorPath(options.neuron_monitor);
    if (!path.ok()) return Status::Error("gpu_backend='neuron' was requested but " + path.error());
    auto neuron = OpenNeuron(options, std::move(path).value());
    if (!neuron.ok()) {
      return Status::Error(
          "gpu_backend='neuron' was requested but AWS Neuron telemetry could "
          "not be used: " +
          neuron.error());
    }
    return neuron;
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
                       "' (valid values: auto, nvml, neuron, mock, none)");
}

}  // namespace gpuprof::telemetry
