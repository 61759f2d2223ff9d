// NvmlCollector through the real dlopen/dlsym path, against the scenario-driven fake library
// (fake_nvml/fake_nvml.cc). Each test writes a scenario, points the collector at the fake, and
// checks the rows and notes.
#include "telemetry/nvml_collector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/gpu_collector.h"
#include "telemetry/telemetry_test_util.h"

namespace gpuprof::telemetry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

constexpr const char* kScenarioEnv = "GPUPROF_FAKE_NVML_SCENARIO";

std::string FakeDir() {
  const char* env = std::getenv("GPUPROF_FAKE_NVML_DIR");
  return env != nullptr && *env != '\0' ? env : GPUPROF_FAKE_NVML_DIR_DEFAULT;
}
std::string FakeLibrary() { return FakeDir() + "/libnvidia-ml.so.1"; }
std::string LegacyFakeLibrary() {
  return std::string(GPUPROF_FAKE_NVML_LEGACY_DIR) + "/libnvidia-ml.so.1";
}

class NvmlCollectorTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv(kScenarioEnv);
    unsetenv(kNvmlLibraryEnv);
  }

  // Writes the scenario and selects it for the next nvmlInit.
  void UseScenario(const std::string& text) {
    std::string path = dir_.Write("scenario.txt", text);
    setenv(kScenarioEnv, path.c_str(), 1);
  }

  std::unique_ptr<NvmlCollector> OpenFake(const std::string& library = FakeLibrary()) {
    auto c = NvmlCollector::Open(library);
    EXPECT_TRUE(c.ok()) << c.error();
    if (!c.ok()) return nullptr;
    c.value()->set_pcie_interval_ns(0);  // every tick reads every field (decimation: own test)
    return std::move(c).value();
  }

  // Samples once with the given pids and returns the rows.
  static std::vector<store::GpuSampleRow> Tick(GpuCollector& c, int64_t ts,
                                               const std::vector<int64_t>& pids = {}) {
    std::vector<store::GpuSampleRow> rows;
    c.Sample(ts, pids, &rows);
    return rows;
  }

  testing::TempDir dir_;
};

TEST_F(NvmlCollectorTest, GivenFullScenario_WhenSampled_ThenEveryFieldCarriesTheScriptedValue) {
  // GIVEN two devices with every field scripted, util ramping 40..90 over 10 samples
  UseScenario(R"(# two H100s
devices 2
gpu * name NVIDIA H100 80GB HBM3
gpu 1 uuid GPU-11111111-2222-3333-4444-555555555555
gpu * mem_total 85520809984
gpu * mem_used 1000000000..2000000000
gpu * util 40..90
gpu * mem_util 30
gpu * power 250000
gpu 1 power 310000..410000/2
gpu * temp 65
gpu * sm_clock 1755
gpu * sm_clock_max 1980
gpu 1 clock_reasons 0x40
gpu * pcie_rx 1000
gpu * pcie_tx 500
)");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);

  // THEN the device info is the scripted one
  ASSERT_THAT(c->devices(), SizeIs(2));
  EXPECT_EQ(c->backend(), "nvml");
  EXPECT_EQ(c->devices()[0].index, 0);
  EXPECT_EQ(c->devices()[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(c->devices()[0].uuid, "GPU-fa4e0000-0000-4000-8000-000000000000");
  EXPECT_EQ(c->devices()[1].uuid, "GPU-11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(c->devices()[1].memory_total_bytes, 85520809984);
  EXPECT_EQ(c->devices()[1].sm_clock_max_mhz, 1980);

  // WHEN sampled three times
  auto t0 = Tick(*c, 1000);
  auto t1 = Tick(*c, 2000);
  auto t2 = Tick(*c, 3000);

  // THEN every field of every device is present with the curve's value at that sample
  ASSERT_THAT(t0, SizeIs(2));
  ASSERT_THAT(t2, SizeIs(2));
  const store::GpuSampleRow& a = t0[0];
  EXPECT_EQ(a.ts_ns, 1000);
  EXPECT_EQ(a.gpu_index, 0);
  EXPECT_EQ(a.util_pct, 40.0);
  EXPECT_EQ(a.mem_util_pct, 30.0);
  EXPECT_EQ(a.mem_used_bytes, 1000000000);
  EXPECT_EQ(a.mem_total_bytes, 85520809984);
  EXPECT_EQ(a.power_mw, 250000);
  EXPECT_EQ(a.temp_c, 65.0);
  EXPECT_EQ(a.sm_clock_mhz, 1755);
  EXPECT_EQ(a.clock_reasons, 0);
  EXPECT_EQ(a.pcie_rx_bps, 1000.0 * 1024);
  EXPECT_EQ(a.pcie_tx_bps, 500.0 * 1024);
  EXPECT_FALSE(a.proc_mem_bytes.has_value());  // no pids given: not measured
  EXPECT_EQ(t1[0].util_pct, 45.0);
  EXPECT_EQ(t1[0].mem_used_bytes, 1100000000);
  EXPECT_EQ(t2[0].util_pct, 50.0);
  EXPECT_EQ(t2[0].ts_ns, 3000);
  EXPECT_EQ(t0[1].gpu_index, 1);
  EXPECT_EQ(t0[1].clock_reasons, 0x40);
  EXPECT_EQ(t0[1].power_mw, 310000);
  EXPECT_EQ(t1[1].power_mw, 360000);
  EXPECT_EQ(t2[1].power_mw, 410000);
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
}

TEST_F(NvmlCollectorTest, GivenUnsupportedFields_WhenSampled_ThenTheyStayEmptyWithOneNoteEach) {
  // GIVEN a device without power readings and a second without PCIe counters
  UseScenario(R"(devices 2
gpu * power 200000
gpu 0 not_supported power
gpu 1 not_supported pcie
gpu * pcie_rx 10
gpu * pcie_tx 20
)");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);

  // WHEN sampled repeatedly
  std::vector<std::string> notes;
  std::vector<std::vector<store::GpuSampleRow>> ticks;
  for (int i = 0; i < 4; ++i) {
    ticks.push_back(Tick(*c, i));
    for (std::string& n : c->TakeNotes()) notes.push_back(std::move(n));
  }

  // THEN the unsupported fields are empty on every tick, the rest present
  for (const auto& rows : ticks) {
    ASSERT_THAT(rows, SizeIs(2));
    EXPECT_FALSE(rows[0].power_mw.has_value());
    EXPECT_EQ(rows[0].pcie_rx_bps, 10.0 * 1024);
    EXPECT_EQ(rows[1].power_mw, 200000);
    EXPECT_FALSE(rows[1].pcie_rx_bps.has_value());
    EXPECT_FALSE(rows[1].pcie_tx_bps.has_value());
  }
  // AND exactly one note per unsupported field, and the collector stopped asking
  EXPECT_THAT(notes, ElementsAre("gpu0: power not supported by this device",
                                 "gpu1: pcie not supported by this device"));
  EXPECT_FALSE(c->FieldActive(0, NvmlCollector::kPower));
  EXPECT_TRUE(c->FieldActive(1, NvmlCollector::kPower));
  EXPECT_FALSE(c->FieldActive(1, NvmlCollector::kPcie));
}

TEST_F(NvmlCollectorTest, GivenFieldFailingMidRun_WhenSampled_ThenValuesBeforeEmptyAfterOneNote) {
  // GIVEN temperature that fails with an unknown error from the third sample on
  UseScenario(R"(gpu 0 temp 70..80/2
gpu 0 util 55
gpu 0 fail temp after 2
)");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);

  // WHEN sampled five times
  std::vector<store::GpuSampleRow> rows;
  for (int i = 0; i < 5; ++i) {
    auto t = Tick(*c, i);
    ASSERT_THAT(t, SizeIs(1));
    rows.push_back(t[0]);
  }

  // THEN temperature is present before the failure and empty after; other fields unaffected
  EXPECT_EQ(rows[0].temp_c, 70.0);
  EXPECT_EQ(rows[1].temp_c, 75.0);
  for (int i = 2; i < 5; ++i) {
    EXPECT_FALSE(rows[i].temp_c.has_value()) << "tick " << i;
    EXPECT_EQ(rows[i].util_pct, 55.0) << "tick " << i;
  }
  // AND one note names the field and the error; the field is still tried (errors may pass)
  auto notes = c->TakeNotes();
  ASSERT_THAT(notes, SizeIs(1));
  EXPECT_THAT(notes[0], HasSubstr("gpu0: temp read failed: Unknown Error (NVML error 999)"));
  EXPECT_TRUE(c->FieldActive(0, NvmlCollector::kTemp));
}

TEST_F(NvmlCollectorTest, GivenDeviceLostMidRun_WhenSampled_ThenItsRowsStopWithANote) {
  // GIVEN two devices, the second falling off the bus after two samples
  UseScenario(R"(devices 2
gpu * util 90
gpu 1 lost after 2
)");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);

  // WHEN sampled four times
  std::vector<std::vector<store::GpuSampleRow>> ticks;
  std::vector<bool> ok;
  for (int i = 0; i < 4; ++i) {
    std::vector<store::GpuSampleRow> rows;
    ok.push_back(c->Sample(i, {}, &rows));
    ticks.push_back(rows);
  }

  // THEN both devices report before the loss, only gpu0 after, and the tick still succeeds
  EXPECT_THAT(ticks[0], SizeIs(2));
  EXPECT_THAT(ticks[1], SizeIs(2));
  ASSERT_THAT(ticks[2], SizeIs(1));
  EXPECT_EQ(ticks[2][0].gpu_index, 0);
  EXPECT_EQ(ticks[2][0].util_pct, 90.0);
  EXPECT_THAT(ticks[3], SizeIs(1));
  EXPECT_EQ(ok, (std::vector<bool>{true, true, true, true}));
  auto notes = c->TakeNotes();
  ASSERT_THAT(notes, SizeIs(1));
  EXPECT_THAT(notes[0], HasSubstr("gpu1: device lost (GPU is lost (NVML error 15))"));
  EXPECT_FALSE(c->FieldActive(1, NvmlCollector::kUtil));
}

TEST_F(NvmlCollectorTest, GivenEveryDeviceLost_WhenSampled_ThenSampleReportsFailure) {
  UseScenario("devices 1\ngpu 0 lost after 1\n");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  std::vector<store::GpuSampleRow> rows;
  EXPECT_TRUE(c->Sample(1, {}, &rows));
  EXPECT_THAT(rows, SizeIs(1));
  EXPECT_FALSE(c->Sample(2, {}, &rows));
  EXPECT_THAT(rows, IsEmpty());
}

TEST_F(NvmlCollectorTest, GivenEveryReadFailingOneTick_WhenSampled_ThenNoRowForThatDeviceAndANote) {
  // GIVEN gpu0 whose every per-tick read fails from the second sample on (not lost, just broken)
  UseScenario(R"(devices 2
gpu 0 fail util after 1 10
gpu 0 fail memory after 1 10
gpu 0 fail power after 1 10
gpu 0 fail temp after 1 10
gpu 0 fail sm_clock after 1 10
gpu 0 fail clock_reasons after 1 10
gpu 0 fail pcie after 1 10
gpu 0 fail proc_mem after 1 10
)");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(Tick(*c, 1, {getpid()}), SizeIs(2));
  c->TakeNotes();

  // WHEN sampled again
  auto rows = Tick(*c, 2, {getpid()});

  // THEN only gpu1 has a row, and a note says gpu0's read failed
  ASSERT_THAT(rows, SizeIs(1));
  EXPECT_EQ(rows[0].gpu_index, 1);
  auto notes = c->TakeNotes();
  EXPECT_THAT(notes, ::testing::Contains(HasSubstr("gpu0: device read failed (Timeout (NVML "
                                                   "error 10)); no sample this tick")));
}

TEST_F(NvmlCollectorTest, GivenProcessesOnTheDevice_WhenSampledWithPids_ThenTheirMemoryIsSummed) {
  // GIVEN our process, our parent, an unrelated process, and enough filler processes to
  // overflow the collector's initial buffer (forcing the Insufficient Size path)
  UseScenario(R"(devices 2
gpu 0 process self 123456789
gpu 0 process parent 1000
gpu 0 process 3999999 5555
gpu 0 process_fill 100 7
gpu 1 process 3999999 42
)");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  const int64_t self = getpid();
  const int64_t parent = getppid();

  // WHEN sampled with our pid, then with our pid and the parent's, then with none
  auto only_self = Tick(*c, 1, {self});
  auto with_parent = Tick(*c, 2, {self, parent});
  auto no_pids = Tick(*c, 3, {});

  // THEN only the given pids' memory is summed, per device
  ASSERT_THAT(only_self, SizeIs(2));
  EXPECT_EQ(only_self[0].proc_mem_bytes, 123456789);
  EXPECT_EQ(with_parent[0].proc_mem_bytes, 123456789 + 1000);
  EXPECT_FALSE(no_pids[0].proc_mem_bytes.has_value());
  if (!InNestedPidNamespace()) {
    // A device that lists none of our processes holds 0 bytes of ours (measured, not unknown).
    EXPECT_EQ(only_self[1].proc_mem_bytes, 0);
  }
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
}

TEST_F(NvmlCollectorTest, GivenDriverCannotTellProcessMemory_WhenSampled_ThenProcMemIsUnknown) {
  UseScenario("gpu 0 process self na\n");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  auto rows = Tick(*c, 1, {getpid()});
  ASSERT_THAT(rows, SizeIs(1));
  EXPECT_FALSE(rows[0].proc_mem_bytes.has_value());
}

TEST_F(NvmlCollectorTest,
       GivenOldDriverSymbolSet_WhenOpened_ThenFallbacksAreUsedAndMissingOnesNoted) {
  // GIVEN the legacy fake: unversioned init/count/handle, the v1 (two-field) process list,
  // clocks *throttle* reasons, and no PCIe throughput entry point
  UseScenario(R"(gpu 0 util 12
gpu 0 clock_reasons 0x4
gpu 0 process self 4096
gpu 0 process_fill 40 1
gpu 0 pcie_rx 1
)");
  auto c = OpenFake(LegacyFakeLibrary());
  ASSERT_NE(c, nullptr);

  // WHEN sampled
  auto rows = Tick(*c, 7, {getpid()});

  // THEN the fallback entry points deliver the values and PCIe is unavailable with a note
  ASSERT_THAT(rows, SizeIs(1));
  EXPECT_EQ(rows[0].util_pct, 12.0);
  EXPECT_EQ(rows[0].clock_reasons, 0x4);
  EXPECT_EQ(rows[0].proc_mem_bytes, 4096);
  EXPECT_FALSE(rows[0].pcie_rx_bps.has_value());
  EXPECT_THAT(c->TakeNotes(),
              ElementsAre("NVML library lacks nvmlDeviceGetPcieThroughput: pcie unavailable on "
                          "every GPU"));
}

TEST_F(NvmlCollectorTest, GivenInitFailure_WhenMakingCollector_ThenErrorCarriesTheReason) {
  // GIVEN a driver that is not loaded
  UseScenario("init_error 9\n");
  GpuCollectorOptions auto_opts;
  auto_opts.nvml_library = FakeLibrary();
  GpuCollectorOptions nvml_opts = auto_opts;
  nvml_opts.backend = "nvml";

  // WHEN asked for auto and for nvml explicitly
  auto a = MakeGpuCollector(auto_opts);
  auto n = MakeGpuCollector(nvml_opts);

  // THEN both fail with the NVML reason; the explicit request says what was asked
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.error(), HasSubstr("NVML not available: nvmlInit_v2 failed: Driver Not Loaded"));
  EXPECT_THAT(a.error(), HasSubstr("(NVML error 9)"));
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.error(), HasSubstr("gpu_backend='nvml' was requested"));
  EXPECT_THAT(n.error(), HasSubstr("Driver Not Loaded"));
}

TEST_F(NvmlCollectorTest, GivenNoScenario_WhenOpened_ThenInitFailsSayingSo) {
  unsetenv(kScenarioEnv);
  auto c = NvmlCollector::Open(FakeLibrary());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error(), HasSubstr("Driver Not Loaded"));
  EXPECT_THAT(c.error(), HasSubstr("GPUPROF_FAKE_NVML_SCENARIO is not set"));
}

TEST_F(NvmlCollectorTest, GivenMalformedScenario_WhenOpened_ThenErrorNamesTheLine) {
  UseScenario("devices 1\ngpu 0 utilisation 5\n");
  auto c = NvmlCollector::Open(FakeLibrary());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error(), HasSubstr("scenario.txt:2: unknown device key 'utilisation'"));
}

TEST_F(NvmlCollectorTest, GivenMissingLibrary_WhenMakingCollector_ThenErrorNamesTheLibrary) {
  // GIVEN a library path that does not exist, once as an option and once from the environment
  const std::string missing = dir_.path() + "/nowhere/libnvidia-ml.so.1";
  GpuCollectorOptions opts;
  opts.nvml_library = missing;
  auto by_option = MakeGpuCollector(opts);
  setenv(kNvmlLibraryEnv, missing.c_str(), 1);
  auto by_env = MakeGpuCollector(GpuCollectorOptions());

  // THEN the error names the library and the loader's reason
  ASSERT_FALSE(by_option.ok());
  EXPECT_THAT(by_option.error(), HasSubstr("NVML not available: cannot load " + missing));
  EXPECT_THAT(by_option.error(), HasSubstr("No such file or directory"));
  ASSERT_FALSE(by_env.ok());
  EXPECT_THAT(by_env.error(), HasSubstr("cannot load " + missing));
  EXPECT_EQ(ResolveNvmlLibraryPath(""), missing);
  EXPECT_EQ(ResolveNvmlLibraryPath("/x/libnvidia-ml.so.1"), "/x/libnvidia-ml.so.1");
  unsetenv(kNvmlLibraryEnv);
  EXPECT_EQ(ResolveNvmlLibraryPath(""), "libnvidia-ml.so.1");
}

TEST_F(NvmlCollectorTest,
       GivenLibraryWithoutNvmlSymbols_WhenOpened_ThenErrorNamesTheMissingEntryPoint) {
  // libdl-style: any shared library that is not NVML (the C library itself).
  auto c = NvmlCollector::Open("libc.so.6");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error(), HasSubstr("libc.so.6 is not a usable NVML library: it lacks nvmlInit_v2"));
}

TEST_F(NvmlCollectorTest, GivenZeroDevices_WhenMakingCollector_ThenAutoReportsNoGpus) {
  UseScenario("devices 0\n");
  GpuCollectorOptions opts;
  opts.nvml_library = FakeLibrary();
  auto a = MakeGpuCollector(opts);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.error(), HasSubstr("NVML found no GPUs"));
}

TEST_F(NvmlCollectorTest, GivenWorkingFake_WhenMakingAutoCollector_ThenNvmlBackendIsChosen) {
  UseScenario("devices 3\ngpu * util 33\n");
  GpuCollectorOptions opts;
  opts.nvml_library = FakeLibrary();
  auto c = MakeGpuCollector(opts);
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c.value()->backend(), "nvml");
  EXPECT_THAT(c.value()->devices(), SizeIs(3));
  std::vector<store::GpuSampleRow> rows;
  EXPECT_TRUE(c.value()->Sample(5, {}, &rows));
  ASSERT_THAT(rows, SizeIs(3));
  EXPECT_EQ(rows[2].util_pct, 33.0);
}

TEST(MakeGpuCollectorTest, GivenNoneOrUnknownBackend_WhenMade_ThenErrorsExplain) {
  GpuCollectorOptions none;
  none.backend = "none";
  auto n = MakeGpuCollector(none);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error(), "GPU telemetry disabled (gpu_backend='none')");

  GpuCollectorOptions bad;
  bad.backend = "cuda";
  auto b = MakeGpuCollector(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error(), "unknown gpu_backend 'cuda' (valid values: auto, nvml, neuron, mock, none)");
}

TEST_F(NvmlCollectorTest, GivenFourFakeDevices_WhenSampledManyTimes_ThenPerTickCostIsReported) {
  // GIVEN four devices with every field scripted and our process on each
  UseScenario(R"(devices 4
gpu * util 10..90
gpu * mem_used 1..1000000
gpu * power 300000
gpu * temp 60
gpu * clock_reasons 0
gpu * pcie_rx 100
gpu * pcie_tx 100
gpu * process self 1000
)");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  const std::vector<int64_t> pids = {getpid()};
  std::vector<store::GpuSampleRow> rows;
  rows.reserve(4);

  // WHEN sampled 20000 times
  constexpr int kTicks = 20000;
  auto start = std::chrono::steady_clock::now();
  int ok = 0;
  for (int i = 0; i < kTicks; ++i) ok += c->Sample(i, pids, &rows) ? 1 : 0;
  auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();

  // THEN every tick produced four full rows; the cost is printed for the record
  EXPECT_EQ(ok, kTicks);
  ASSERT_THAT(rows, SizeIs(4));
  EXPECT_EQ(rows[3].util_pct, 90.0);
  EXPECT_EQ(rows[3].proc_mem_bytes, 1000);
  std::printf("[telemetry cost] NvmlCollector::Sample, fake NVML, 4 devices: %.2f us/tick\n",
              static_cast<double>(ns) / kTicks / 1000.0);
}

TEST_F(NvmlCollectorTest, GivenDefaultInterval_WhenSampledAt100Hz_ThenPcieIsReadOncePerSecond) {
  // GIVEN a device with PCIe counters and the default 1 s PCIe interval
  UseScenario("devices 1\ngpu 0 pcie_rx 10\ngpu 0 pcie_tx 20\ngpu 0 util 50\n");
  auto opened = NvmlCollector::Open(FakeLibrary());
  ASSERT_TRUE(opened.ok()) << opened.error();
  NvmlCollector& c = *opened.value();
  // WHEN sampled every 10 ms for 2.5 s
  int with_pcie = 0, with_util = 0;
  for (int i = 0; i < 250; ++i) {
    auto rows = Tick(c, int64_t{i} * 10'000'000);
    ASSERT_THAT(rows, SizeIs(1));
    with_pcie += rows[0].pcie_rx_bps.has_value();
    with_util += rows[0].util_pct.has_value();
    // THEN a tick without the PCIe read leaves it unmeasured, never zero
    if (rows[0].pcie_rx_bps) EXPECT_EQ(*rows[0].pcie_rx_bps, 10.0 * 1024);
  }
  // THEN PCIe was read at 0 s, 1 s and 2 s while the other fields were read every tick
  EXPECT_EQ(with_pcie, 3);
  EXPECT_EQ(with_util, 250);
}

// ---- Per-process utilization (opt-in) -------------------------------------------------------

class NvmlProcessUtilizationTest : public NvmlCollectorTest {
 protected:
  // Opens the fake with per-process utilization on.
  std::unique_ptr<NvmlCollector> OpenWithProcessUtilization(
      const std::string& library = FakeLibrary()) {
    auto c = OpenFake(library);
    if (c) c->set_process_utilization(true);
    return c;
  }
  static constexpr int64_t kMs = 1'000'000;
  const std::vector<int64_t> self_{getpid()};
};

TEST_F(NvmlProcessUtilizationTest, GivenTheDefault_WhenSampled_ThenNoPerProcessUtilizationIsRead) {
  // GIVEN a device with this process busy on it, and the collector as gpuprof's recorder opens it
  UseScenario("gpu 0 util 90\ngpu 0 process_util self 30\n");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  // WHEN sampled
  auto rows = Tick(*c, 1, self_);
  // THEN the row is as before: no per-process utilization, no note
  ASSERT_THAT(rows, SizeIs(1));
  EXPECT_EQ(rows[0].util_pct, 90.0);
  EXPECT_FALSE(rows[0].proc_util_pct.has_value());
  EXPECT_FALSE(c->process_utilization());
  EXPECT_FALSE(c->FieldActive(0, NvmlCollector::kProcUtil));
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
}

TEST_F(NvmlProcessUtilizationTest, GivenSeveralBusyProcesses_WhenSampled_ThenOnlyOursAreSummed) {
  // GIVEN a device at 90% where this process runs at 30%, its parent at 10% and a stranger at 50%
  UseScenario(R"(gpu 0 util 90
gpu 0 process_util self 30
gpu 0 process_util parent 10
gpu 0 process_util 4242 50
)");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->FieldActive(0, NvmlCollector::kProcUtil));
  // WHEN sampled for this process alone, then for the process and its parent
  auto mine = Tick(*c, 1 * kMs, self_);
  auto tree = Tick(*c, 2 * kMs, {getpid(), getppid()});
  // THEN the per-process value is ours (the stranger does not count), the device value stays
  ASSERT_THAT(mine, SizeIs(1));
  EXPECT_EQ(mine[0].proc_util_pct, 30.0);
  EXPECT_EQ(mine[0].util_pct, 90.0);
  ASSERT_THAT(tree, SizeIs(1));
  EXPECT_EQ(tree[0].proc_util_pct, 40.0);
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
}

TEST_F(NvmlProcessUtilizationTest, GivenARampingProcess_WhenSampled_ThenEachTickTakesTheNewSample) {
  UseScenario("gpu 0 util 80\ngpu 0 process_util self 10..50/4\n");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  std::vector<double> seen;
  for (int i = 0; i < 3; ++i) {
    auto rows = Tick(*c, (i + 1) * kMs, self_);
    ASSERT_THAT(rows, SizeIs(1));
    ASSERT_TRUE(rows[0].proc_util_pct.has_value());
    seen.push_back(*rows[0].proc_util_pct);
  }
  EXPECT_THAT(seen, ElementsAre(10.0, 20.0, 30.0));
}

TEST_F(NvmlProcessUtilizationTest,
       GivenNotSupportedOnOneDevice_WhenSampled_ThenOffThereWithOneNote) {
  // GIVEN two devices; the first does not support per-process utilization (as with MIG or vGPU)
  UseScenario(R"(devices 2
gpu * util 60
gpu * process_util self 25
gpu 0 not_supported proc_util
)");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  // WHEN sampled twice
  auto t0 = Tick(*c, 1 * kMs, self_);
  auto t1 = Tick(*c, 2 * kMs, self_);
  // THEN device 0 has no per-process value (its other fields are read), device 1 has it
  ASSERT_THAT(t1, SizeIs(2));
  EXPECT_FALSE(t0[0].proc_util_pct.has_value());
  EXPECT_FALSE(t1[0].proc_util_pct.has_value());
  EXPECT_EQ(t1[0].util_pct, 60.0);
  EXPECT_EQ(t1[1].proc_util_pct, 25.0);
  // AND it was switched off there with one note
  EXPECT_FALSE(c->FieldActive(0, NvmlCollector::kProcUtil));
  EXPECT_TRUE(c->FieldActive(1, NvmlCollector::kProcUtil));
  EXPECT_THAT(c->TakeNotes(), ElementsAre("gpu0: proc_util not supported by this device"));
}

TEST_F(NvmlProcessUtilizationTest,
       GivenOthersSampledButNotUs_WhenSampled_ThenOursIsIdleNotUnknown) {
  // GIVEN this process busy at 40% for one driver period, then idle while a stranger runs on
  UseScenario(R"(gpu 0 util 50
gpu 0 process_util self 40..0/1
gpu 0 process_util 4242 50
)");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  auto busy = Tick(*c, 1 * kMs, self_);
  auto idle = Tick(*c, 2 * kMs, self_);
  // THEN the new period without a sample of ours means ours was idle in it: 0, not unknown
  EXPECT_EQ(busy[0].proc_util_pct, 40.0);
  EXPECT_EQ(idle[0].proc_util_pct, 0.0);
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
}

TEST_F(NvmlProcessUtilizationTest,
       GivenOnlyStrangersEverSampled_WhenSampled_ThenZeroUnlessInAContainer) {
  // GIVEN a stranger busy on the device and this process never sampled
  UseScenario("gpu 0 util 50\ngpu 0 process_util 4242 50\n");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  auto rows = Tick(*c, 1 * kMs, self_);
  ASSERT_THAT(rows, SizeIs(1));
  // THEN ours is idle (0) - unless this runs in a nested pid namespace, where the driver's pids
  // may be host pids: unknown then, with a note
  if (InNestedPidNamespace()) {
    EXPECT_FALSE(rows[0].proc_util_pct.has_value());
    EXPECT_THAT(c->TakeNotes(), ElementsAre(HasSubstr("nested pid namespace")));
  } else {
    EXPECT_EQ(rows[0].proc_util_pct, 0.0);
    EXPECT_THAT(c->TakeNotes(), IsEmpty());
  }
}

TEST_F(NvmlProcessUtilizationTest, GivenAnIdleDeviceWithoutSamples_WhenSampled_ThenOursIsZero) {
  // GIVEN nobody busy: the driver has no per-process sample (NOT_FOUND) and the device is at 0%
  UseScenario("gpu 0 util 0\ngpu 0 process self 1000\n");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  auto rows = Tick(*c, 1 * kMs, self_);
  // THEN an idle device means an idle process: 0
  ASSERT_THAT(rows, SizeIs(1));
  EXPECT_EQ(rows[0].proc_util_pct, 0.0);
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
}

TEST_F(NvmlProcessUtilizationTest, GivenNoNewSampleOnABusyDevice_WhenSampled_ThenHeldForOneSecond) {
  // GIVEN this process at 40% on a busy device, after which the driver has no new sample
  // (NVML_ERROR_NOT_FOUND = 6 from the third read on)
  UseScenario(R"(gpu 0 util 80
gpu 0 process_util self 40
gpu 0 fail proc_util after 2 6
)");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  auto at = [&](int64_t ms) { return Tick(*c, ms * kMs, self_).at(0).proc_util_pct; };
  EXPECT_EQ(at(0), 40.0);
  EXPECT_EQ(at(100), 40.0);  // the driver's last word about us
  // WHEN nothing new comes: THEN the value is held for up to 1 s after it...
  EXPECT_EQ(at(500), 40.0);
  EXPECT_EQ(at(1100), 40.0);
  EXPECT_THAT(c->TakeNotes(), IsEmpty());  // NOT_FOUND is not a failure
  // ...and then unknown (a busy device, no sample: the driver is not telling), with one note
  EXPECT_FALSE(at(1101).has_value());
  EXPECT_FALSE(at(2000).has_value());
  EXPECT_THAT(c->TakeNotes(), ElementsAre(HasSubstr("gpu0: proc_util unknown")));
  EXPECT_TRUE(c->FieldActive(0, NvmlCollector::kProcUtil));  // still asked every tick
}

TEST_F(NvmlProcessUtilizationTest,
       GivenABusyDeviceWithNoSamplesAtAll_WhenSampled_ThenUnknownNotZero) {
  // GIVEN a device at 70% but no per-process sample for anyone (a driver that does not report)
  UseScenario("gpu 0 util 70\ngpu 0 process self 1000\n");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  auto first = Tick(*c, 0, self_);
  auto later = Tick(*c, 1500 * kMs, self_);
  // THEN per-process utilization is unknown (never guessed as 0), with one note
  EXPECT_FALSE(first.at(0).proc_util_pct.has_value());
  EXPECT_FALSE(later.at(0).proc_util_pct.has_value());
  EXPECT_EQ(later.at(0).util_pct, 70.0);
  // AND the note says how long the driver has been silent (since collection began, 1.5 s
  // before the read that noticed), and comes once
  (void)Tick(*c, 1700 * kMs, self_);
  EXPECT_THAT(c->TakeNotes(),
              ElementsAre(HasSubstr("no per-process utilization sample since collection began "
                                    "1500 ms earlier")));
}

TEST_F(NvmlProcessUtilizationTest, GivenAShortRunWithoutSamples_ThenTheNoteSaysSinceWhen) {
  // GIVEN a busy device whose driver never reports per-process samples, sampled for 50 ms
  UseScenario("gpu 0 util 70\ngpu 0 process self 1000\n");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  (void)Tick(*c, 0, self_);
  auto row = Tick(*c, 50 * kMs, self_);
  // THEN unknown, and the note does not claim a silence longer than the run
  EXPECT_FALSE(row.at(0).proc_util_pct.has_value());
  auto notes = c->TakeNotes();
  ASSERT_THAT(notes, SizeIs(1));
  EXPECT_THAT(notes[0], HasSubstr("since collection began 50 ms earlier"));
  EXPECT_THAT(notes[0], Not(HasSubstr("over 1 s")));
}

TEST_F(NvmlProcessUtilizationTest, GivenReadsFailingMidRun_WhenSampled_ThenEmptyAfterWithOneNote) {
  // GIVEN per-process reads failing from the third on (999) while the rest keeps working
  UseScenario(R"(gpu 0 util 80
gpu 0 process_util self 35
gpu 0 fail proc_util after 2
)");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  std::vector<std::optional<double>> values;
  for (int i = 0; i < 4; ++i) {
    auto rows = Tick(*c, i * kMs, self_);
    ASSERT_THAT(rows, SizeIs(1));  // the device still answers
    EXPECT_EQ(rows[0].util_pct, 80.0);
    values.push_back(rows[0].proc_util_pct);
  }
  // THEN the value before, nothing held after (a failed read is not "no new sample")
  EXPECT_THAT(values, ElementsAre(35.0, 35.0, std::nullopt, std::nullopt));
  EXPECT_THAT(c->TakeNotes(), ElementsAre("gpu0: proc_util read failed: Unknown Error (NVML "
                                          "error 999); left empty while it fails"));
  EXPECT_TRUE(c->FieldActive(0, NvmlCollector::kProcUtil));
}

TEST_F(NvmlProcessUtilizationTest, GivenManyBusyProcessesLater_WhenSampled_ThenTheBufferGrows) {
  // GIVEN this process alone at first, then 60 more busy processes (more than the buffer the
  // first size query asked for)
  std::string scenario = "gpu 0 util 100\ngpu 0 process_util self 20\n";
  for (int i = 0; i < 60; ++i)
    scenario += "gpu 0 process_util " + std::to_string(5000000 + i) + " 0..1/1\n";
  UseScenario(scenario);
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  auto alone = Tick(*c, 1 * kMs, self_);
  auto crowded = Tick(*c, 2 * kMs, self_);
  // THEN ours is found among them
  EXPECT_EQ(alone.at(0).proc_util_pct, 20.0);
  EXPECT_EQ(crowded.at(0).proc_util_pct, 20.0);
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
}

TEST_F(NvmlProcessUtilizationTest, GivenImplausibleSamples_WhenSampled_ThenTheyAreIgnored) {
  // GIVEN a driver reporting 150% for this process (some drivers return such samples)
  UseScenario("gpu 0 util 50\ngpu 0 process_util self 150\n");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  // THEN it is not taken as ours
  EXPECT_FALSE(Tick(*c, 1 * kMs, self_).at(0).proc_util_pct.has_value());
}

TEST_F(NvmlProcessUtilizationTest,
       GivenADriverSamplePeriod_WhenSampledWithinIt_ThenTheValueIsKept) {
  // GIVEN a driver that records per-process samples every 400 ms, this process ramping
  UseScenario(R"(gpu 0 util 90
gpu 0 process_util self 10..90/8
gpu 0 process_util_period 400
)");
  auto c = OpenWithProcessUtilization();
  ASSERT_NE(c, nullptr);
  // Start just after a period boundary so that the next two reads fall within one period.
  const auto period = std::chrono::milliseconds(400);
  auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  std::this_thread::sleep_for(period - since_epoch % period + std::chrono::milliseconds(5));
  // WHEN read twice within the period, then after the next boundary
  auto first = Tick(*c, 1 * kMs, self_);
  auto same = Tick(*c, 2 * kMs, self_);
  std::this_thread::sleep_for(period);
  auto next = Tick(*c, 3 * kMs, self_);
  // THEN the second read finds nothing new and keeps the value; the next period brings the
  // value of the ramp at that (third) call
  EXPECT_EQ(first.at(0).proc_util_pct, 10.0);
  EXPECT_EQ(same.at(0).proc_util_pct, 10.0);
  EXPECT_EQ(next.at(0).proc_util_pct, 30.0);
}

TEST_F(NvmlProcessUtilizationTest, GivenALibraryWithoutTheEntryPoint_WhenTurnedOn_ThenOneNote) {
  // GIVEN the legacy fake, which lacks nvmlDeviceGetProcessUtilization
  UseScenario("gpu 0 util 12\ngpu 0 process_util self 5\n");
  auto c = OpenFake(LegacyFakeLibrary());
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(c->TakeNotes(), ElementsAre(HasSubstr("lacks nvmlDeviceGetPcieThroughput")));
  // WHEN turned on and sampled
  c->set_process_utilization(true);
  auto rows = Tick(*c, 1, self_);
  // THEN the rest is read, per-process utilization is unavailable, and one note says why
  ASSERT_THAT(rows, SizeIs(1));
  EXPECT_EQ(rows[0].util_pct, 12.0);
  EXPECT_FALSE(rows[0].proc_util_pct.has_value());
  EXPECT_FALSE(c->FieldActive(0, NvmlCollector::kProcUtil));
  EXPECT_THAT(c->TakeNotes(), ElementsAre("NVML library lacks nvmlDeviceGetProcessUtilization: "
                                          "proc_util unavailable on every GPU"));
}

TEST_F(NvmlProcessUtilizationTest, GivenTheOption_WhenMakingTheCollector_ThenRowsCarryIt) {
  UseScenario("gpu 0 util 90\ngpu 0 process_util self 30\n");
  GpuCollectorOptions opts;
  opts.backend = "nvml";
  opts.nvml_library = FakeLibrary();
  opts.process_utilization = true;
  auto c = MakeGpuCollector(opts);
  ASSERT_TRUE(c.ok()) << c.error();
  std::vector<store::GpuSampleRow> rows;
  ASSERT_TRUE(c.value()->Sample(1, self_, &rows));
  ASSERT_THAT(rows, SizeIs(1));
  EXPECT_EQ(rows[0].proc_util_pct, 30.0);
}

// The failed reads as data (GpuReadFailure), beside the notes that say them in words.
TEST_F(NvmlCollectorTest, GivenFailingReads_WhenSampled_ThenTheFailuresAreRecordedAsData) {
  // GIVEN gpu0 whose utilization read fails from the 2nd tick on, whose power is not supported
  // and whose every read fails from the 3rd tick on (Timeout), and gpu1 that is lost at the 2nd
  UseScenario(R"(devices 2
gpu * util 50
gpu 0 not_supported power
gpu 0 fail util after 1
gpu 0 fail memory after 2 10
gpu 0 fail temp after 2 10
gpu 0 fail sm_clock after 2 10
gpu 0 fail clock_reasons after 2 10
gpu 0 fail pcie after 2 10
gpu 1 lost after 1
)");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(Tick(*c, 1), SizeIs(2));
  EXPECT_THAT(c->TakeFailures(), IsEmpty());  // (not supported is not a failure)

  // WHEN sampled three more times
  auto second = Tick(*c, 2);
  Tick(*c, 3);
  Tick(*c, 4);

  // THEN the 2nd tick records gpu0's utilization and gpu1's loss, with NVML's words; the 3rd
  // gpu0's other fields and then its failing device read; each once, in order, and the same
  // as the notes say
  ASSERT_THAT(second, SizeIs(1));
  EXPECT_FALSE(second[0].util_pct.has_value());
  auto failures = c->TakeFailures();
  ASSERT_THAT(failures, SizeIs(8));
  EXPECT_EQ(failures[0].kind, GpuReadFailure::Kind::kField);
  EXPECT_EQ(failures[0].gpu_index, 0);
  EXPECT_EQ(failures[0].device, "gpu0");
  EXPECT_EQ(failures[0].field, "util");
  EXPECT_EQ(failures[0].error, "Unknown Error (NVML error 999)");
  EXPECT_EQ(failures[1].kind, GpuReadFailure::Kind::kDeviceLost);
  EXPECT_EQ(failures[1].gpu_index, 1);
  EXPECT_EQ(failures[1].device, "gpu1");
  EXPECT_EQ(failures[1].field, "");
  EXPECT_EQ(failures[1].error, "GPU is lost (NVML error 15)");
  std::vector<std::string> fields;
  for (size_t i = 2; i < 7; ++i) {
    EXPECT_EQ(failures[i].kind, GpuReadFailure::Kind::kField);
    EXPECT_EQ(failures[i].device, "gpu0");
    EXPECT_EQ(failures[i].error, "Timeout (NVML error 10)");
    fields.push_back(failures[i].field);
  }
  EXPECT_EQ(fields,
            (std::vector<std::string>{"memory", "temp", "sm_clock", "clock_reasons", "pcie"}));
  EXPECT_EQ(failures[7].kind, GpuReadFailure::Kind::kDeviceRead);
  EXPECT_EQ(failures[7].gpu_index, 0);
  EXPECT_EQ(failures[7].device, "gpu0");
  EXPECT_EQ(failures[7].error, "Timeout (NVML error 10)");
  auto notes = c->TakeNotes();
  EXPECT_THAT(notes, ::testing::Contains(
                         "gpu0: util read failed: Unknown Error (NVML error 999); left empty "
                         "while it fails"));
  EXPECT_THAT(notes, ::testing::Contains(
                         "gpu1: device lost (GPU is lost (NVML error 15)); no further samples "
                         "from it"));
  EXPECT_THAT(notes, ::testing::Contains(
                         "gpu0: device read failed (Timeout (NVML error 10)); no sample this "
                         "tick"));
  EXPECT_THAT(c->TakeFailures(), IsEmpty());  // taken once
}

}  // namespace
}  // namespace gpuprof::telemetry
