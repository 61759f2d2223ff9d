// Per-tick cost of the telemetry samplers (built with -DGPUPROF_BUILD_BENCH=ON):
//   BM_NvmlSampleFake4   NvmlCollector::Sample over the fake NVML library, 4 devices, every
//                        field scripted, our pid on each device (the dlsym'd call path; a real
//                        driver adds its own ioctl cost on top)
//   BM_HostSample/0      HostSampler::Sample on the real /proc for this process's tree,
//                        scanning every process each tick
//   BM_HostSample/1000   the same at 10 Hz with the default 1 s tree rescan
// Run: build/<dir>/cpp/core/telemetry/telemetry_benchmark
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "telemetry/host_sampler.h"
#include "telemetry/nvml_collector.h"

namespace gpuprof::telemetry {
namespace {

void BM_NvmlSampleFake4(benchmark::State& state) {
  char path[] = "/tmp/gpuprof_bench_scenario_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    state.SkipWithError("mkstemp failed");
    return;
  }
  close(fd);
  std::ofstream(path) << "devices 4\n"
                         "gpu * util 10..90\ngpu * mem_used 1..1000000\ngpu * power 300000\n"
                         "gpu * temp 60\ngpu * pcie_rx 100\ngpu * pcie_tx 100\n"
                         "gpu * process self 1000\ngpu * process_fill 8 10\n";
  setenv("GPUPROF_FAKE_NVML_SCENARIO", path, 1);
  const char* dir = std::getenv("GPUPROF_FAKE_NVML_DIR");
  std::string lib = std::string(dir ? dir : GPUPROF_FAKE_NVML_DIR_DEFAULT) + "/libnvidia-ml.so.1";
  auto c = NvmlCollector::Open(lib);
  if (!c.ok()) {
    state.SkipWithError(c.error().c_str());
    unlink(path);
    return;
  }
  const std::vector<int64_t> pids = {getpid()};
  std::vector<store::GpuSampleRow> rows;
  int64_t t = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.value()->Sample(++t, pids, &rows));
  }
  unlink(path);
}
BENCHMARK(BM_NvmlSampleFake4);

// state.range(0): tree rescan interval in ms of sample time (0 = full /proc scan every tick);
// ticks are 100 ms of sample time apart (10 Hz).
void BM_HostSample(benchmark::State& state) {
  HostSampler sampler(getpid());
  sampler.set_tree_rescan_interval_ns(state.range(0) * 1000000);
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;
  int64_t t = 0;
  for (auto _ : state) {
    t += 100000000;
    benchmark::DoNotOptimize(sampler.Sample(t, &host, &workers));
  }
  state.counters["tree_pids"] = static_cast<double>(sampler.tree_pids().size());
}
BENCHMARK(BM_HostSample)->Arg(0)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gpuprof::telemetry

BENCHMARK_MAIN();
