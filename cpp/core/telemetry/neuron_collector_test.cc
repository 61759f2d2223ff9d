// NeuronCollector: the report parser and row mapping on literal reports, then the whole
// child-process path against the scripted fake neuron-monitor (fake_neuron/neuron-monitor):
// values, per-process memory, malformed lines, the child exiting, a missing tool, reaping.
#include "telemetry/neuron_collector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
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
using ::testing::SizeIs;

constexpr const char* kFakeMonitor = GPUPROF_FAKE_NEURON_MONITOR;

// A report in neuron-monitor's format: two runtimes on a one-device, four-core instance. Ours
// (pid 100) has cores 0 and 1, a stranger (pid 200) core 2; core 3 is idle.
constexpr const char* kTwoRuntimes = R"({
  "neuron_runtime_data": [
    {"pid": 100, "address": "", "neuron_runtime_tag": "100", "error": "",
     "report": {
       "neuroncore_counters": {"period": 1.0001, "error": "",
         "neuroncores_in_use": {
           "0": {"neuroncore_utilization": 42.5, "flops": 1000},
           "1": {"neuroncore_utilization": 17.25, "flops": 1000}}},
       "memory_used": {"period": 1.0, "error": "", "loaded_models": [],
         "neuron_runtime_used_bytes": {"host": 5000, "neuron_device": 3000,
           "usage_breakdown": {
             "host": {"application_memory": 5000, "constants": 0, "dma_buffers": 0, "tensors": 0},
             "neuroncore_memory_usage": {
               "0": {"constants": 1000, "model_code": 200, "model_shared_scratchpad": 0,
                     "runtime_memory": 0, "tensors": 300},
               "1": {"constants": 1000, "model_code": 200, "model_shared_scratchpad": 0,
                     "runtime_memory": 0, "tensors": 300}}}}}}},
    {"pid": 200, "address": "", "neuron_runtime_tag": "job2", "error": "",
     "report": {
       "neuroncore_counters": {"period": 1.0, "error": "",
         "neuroncores_in_use": {"2": {"neuroncore_utilization": 88.0, "flops": 7}}},
       "memory_used": {"period": 1.0, "error": "",
         "neuron_runtime_used_bytes": {"host": 1, "neuron_device": 7000,
           "usage_breakdown": {"neuroncore_memory_usage": {
             "2": {"constants": 7000, "model_code": 0, "tensors": 0}}}}}}}
  ],
  "system_data": {"memory_info": {"period": 1.0, "memory_total_bytes": 1, "error": ""}},
  "instance_info": {"instance_type": "trn1.2xlarge", "error": ""},
  "neuron_hardware_info": {"neuron_device_type": "trainium", "neuron_device_version": "v2",
    "neuroncore_version": "v2", "neuron_device_count": 1,
    "neuron_device_memory_size": 34359738368, "neuroncore_per_device_count": 4, "error": ""}
})";

std::string OneLine(std::string json) {
  for (char& ch : json)
    if (ch == '\n') ch = ' ';
  return json;
}

NeuronReport Parse(const std::string& text) {
  auto r = ParseNeuronReport(OneLine(text));
  EXPECT_TRUE(r.ok()) << r.error();
  return r.ok() ? std::move(r).value() : NeuronReport{};
}

std::vector<store::GpuSampleRow> Rows(const NeuronReport& r, int64_t cores,
                                      const std::vector<int64_t>& pids) {
  std::vector<store::GpuSampleRow> rows;
  NeuronReportRows(r, cores, 77, pids, &rows);
  return rows;
}

// ---- parsing and mapping --------------------------------------------------------------------

TEST(NeuronReportTest, GivenTheDocumentedFormat_WhenParsed_ThenHardwareAndRuntimesAreRead) {
  // GIVEN a report with hardware info and two runtimes
  // WHEN it is parsed
  NeuronReport r = Parse(kTwoRuntimes);

  // THEN the hardware info carries the layout
  ASSERT_TRUE(r.hardware.has_value());
  EXPECT_EQ(r.hardware->device_count, 1);
  EXPECT_EQ(r.hardware->cores_per_device, 4);
  EXPECT_EQ(r.hardware->device_memory_bytes, 34359738368);
  EXPECT_EQ(r.hardware->core_version, "v2");
  EXPECT_EQ(r.hardware->device_type, "trainium");
  EXPECT_EQ(r.hardware->error, "");
  // AND each runtime its per-core utilization and memory (the breakdown categories summed)
  ASSERT_THAT(r.runtimes, SizeIs(2));
  EXPECT_EQ(r.runtimes[0].pid, 100);
  EXPECT_TRUE(r.runtimes[0].util_known);
  EXPECT_THAT(r.runtimes[0].core_util, ElementsAre(std::pair<int64_t, double>{0, 42.5},
                                                   std::pair<int64_t, double>{1, 17.25}));
  EXPECT_TRUE(r.runtimes[0].mem_known);
  EXPECT_THAT(r.runtimes[0].core_mem, ElementsAre(std::pair<int64_t, int64_t>{0, 1500},
                                                  std::pair<int64_t, int64_t>{1, 1500}));
  EXPECT_EQ(r.runtimes[1].pid, 200);
  EXPECT_THAT(r.runtimes[1].core_mem, ElementsAre(std::pair<int64_t, int64_t>{2, 7000}));
  EXPECT_THAT(r.problems, IsEmpty());
}

TEST(NeuronReportTest, GivenTwoRuntimes_WhenMappedToRows_ThenProcessMemoryIsOursOnly) {
  NeuronReport r = Parse(kTwoRuntimes);

  // WHEN rows are made for our process (pid 100)
  auto rows = Rows(r, 4, {100, 101});

  // THEN there is one row per NeuronCore, stamped
  ASSERT_THAT(rows, SizeIs(4));
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(rows[c].gpu_index, c);
    EXPECT_EQ(rows[c].ts_ns, 77);
  }
  // AND utilization is per core, an idle core reading 0
  EXPECT_EQ(rows[0].util_pct, 42.5);
  EXPECT_EQ(rows[1].util_pct, 17.25);
  EXPECT_EQ(rows[2].util_pct, 88.0);
  EXPECT_EQ(rows[3].util_pct, 0.0);
  // AND process memory counts our runtime only; memory used counts every runtime
  EXPECT_EQ(rows[0].proc_mem_bytes, 1500);
  EXPECT_EQ(rows[1].proc_mem_bytes, 1500);
  EXPECT_EQ(rows[2].proc_mem_bytes, 0);
  EXPECT_EQ(rows[3].proc_mem_bytes, 0);
  EXPECT_EQ(rows[2].mem_used_bytes, 7000);
  EXPECT_EQ(rows[3].mem_used_bytes, 0);
  // AND what neuron-monitor does not report stays unknown
  for (const auto& row : rows) {
    EXPECT_FALSE(row.mem_total_bytes.has_value());
    EXPECT_FALSE(row.power_mw.has_value());
    EXPECT_FALSE(row.temp_c.has_value());
    EXPECT_FALSE(row.mem_util_pct.has_value());
  }

  // WHEN no pids are given, or only a stranger's
  auto no_pids = Rows(r, 4, {});
  auto stranger = Rows(r, 4, {200});
  // THEN process memory is unknown without pids, and the stranger's own with its pid
  EXPECT_FALSE(no_pids[0].proc_mem_bytes.has_value());
  EXPECT_EQ(stranger[0].proc_mem_bytes, 0);
  EXPECT_EQ(stranger[2].proc_mem_bytes, 7000);
}

TEST(NeuronReportTest, GivenNoBreakdown_WhenMapped_ThenTheTotalGoesOnTheRuntimesFirstCore) {
  // GIVEN a runtime on cores 3 and 2 that reports only its device total, and one whose total
  // exceeds its per-core breakdown
  NeuronReport r = Parse(R"({"neuron_runtime_data": [
    {"pid": 5, "error": "", "report": {
      "neuroncore_counters": {"error": "", "neuroncores_in_use": {
        "3": {"neuroncore_utilization": 10}, "2": {"neuroncore_utilization": 20}}},
      "memory_used": {"error": "", "neuron_runtime_used_bytes": {"neuron_device": 9000}}}},
    {"pid": 6, "error": "", "report": {
      "neuroncore_counters": {"error": "", "neuroncores_in_use": {
        "1": {"neuroncore_utilization": 30}}},
      "memory_used": {"error": "", "neuron_runtime_used_bytes": {"neuron_device": 500,
        "usage_breakdown": {"neuroncore_memory_usage": {"1": {"tensors": 300}}}}}}}],
    "neuron_hardware_info": {"neuron_device_count": 1, "neuroncore_per_device_count": 4}})");

  // WHEN mapped for both processes
  auto rows = Rows(r, 4, {5, 6});

  // THEN each total sits on its runtime's lowest in-use core, the remainder included
  ASSERT_THAT(rows, SizeIs(4));
  EXPECT_EQ(rows[0].proc_mem_bytes, 0);
  EXPECT_EQ(rows[1].proc_mem_bytes, 500);
  EXPECT_EQ(rows[2].proc_mem_bytes, 9000);
  EXPECT_EQ(rows[3].proc_mem_bytes, 0);
  // AND the sum over cores is the runtimes' device memory, counted once
  int64_t sum = 0;
  for (const auto& row : rows) sum += row.proc_mem_bytes.value_or(0);
  EXPECT_EQ(sum, 9500);
}

TEST(NeuronReportTest, GivenTrn2NestedCores_WhenParsed_ThenTheLogicalCoreValueIsUsed) {
  // GIVEN a Trn2 report where each logical core nests its physical cores' utilization
  NeuronReport r = Parse(R"({"neuron_runtime_data": [{"pid": 9, "error": "", "report": {
      "neuroncore_counters": {"error": "", "neuroncores_in_use": {
        "0": {"neuroncore_utilization": 42.01, "flops": 1,
              "v3d": {"nc_v3.0": {"neuroncore_utilization": 21.01},
                      "nc_v3.1": {"neuroncore_utilization": 63.01}}}}}}}],
    "neuron_hardware_info": {"neuroncore_version": "v3d", "neuron_device_count": 16,
      "neuroncore_per_device_count": 4, "logical_neuroncore_config": 2}})");

  // THEN the logical core's own utilization counts, and memory without the group is unknown
  ASSERT_THAT(r.runtimes, SizeIs(1));
  EXPECT_THAT(r.runtimes[0].core_util, ElementsAre(std::pair<int64_t, double>{0, 42.01}));
  EXPECT_FALSE(r.runtimes[0].mem_known);
  auto rows = Rows(r, 64, {9});
  ASSERT_THAT(rows, SizeIs(64));
  EXPECT_EQ(rows[0].util_pct, 42.01);
  EXPECT_EQ(rows[63].util_pct, 0.0);
  EXPECT_FALSE(rows[0].proc_mem_bytes.has_value());
  EXPECT_FALSE(rows[0].mem_used_bytes.has_value());
}

TEST(NeuronReportTest, GivenErrorsInTheReport_WhenMapped_ThenAffectedValuesAreUnknown) {
  // GIVEN one runtime whose entry failed and one whose counters failed
  NeuronReport r = Parse(R"({"neuron_runtime_data": [
    {"pid": 1, "error": "cannot connect to runtime", "report": {}},
    {"pid": 2, "error": "", "report": {
      "neuroncore_counters": {"error": "counters unavailable", "neuroncores_in_use": {}},
      "memory_used": {"error": "", "neuron_runtime_used_bytes": {"neuron_device": 10,
        "usage_breakdown": {"neuroncore_memory_usage": {"1": {"tensors": 10}}}}}}}],
    "neuron_hardware_info": {"neuron_device_count": 1, "neuroncore_per_device_count": 2,
      "error": ""}})");

  // THEN the problems are listed for notes
  EXPECT_THAT(r.problems, ElementsAre("runtime 1: cannot connect to runtime",
                                      "runtime 2: neuroncore_counters: counters unavailable"));
  // AND utilization is unknown everywhere (which cores they use is unknown); the failed runtime
  // makes device memory unknown, but pid 2's own memory is still known to pid 2
  auto rows = Rows(r, 2, {2});
  ASSERT_THAT(rows, SizeIs(2));
  EXPECT_FALSE(rows[0].util_pct.has_value());
  EXPECT_FALSE(rows[1].util_pct.has_value());
  EXPECT_FALSE(rows[1].mem_used_bytes.has_value());
  EXPECT_EQ(rows[1].proc_mem_bytes, 10);
  // AND for the process whose runtime failed, its memory is unknown rather than 0
  auto failed = Rows(r, 2, {1});
  EXPECT_FALSE(failed[0].proc_mem_bytes.has_value());
}

TEST(NeuronReportTest, GivenNoRuntimeDataMember_WhenMapped_ThenEveryReadingIsUnknown) {
  NeuronReport r = Parse(R"({"neuron_hardware_info": {"neuron_device_count": 1,
    "neuroncore_per_device_count": 2}})");
  auto rows = Rows(r, 2, {1});
  ASSERT_THAT(rows, SizeIs(2));
  EXPECT_FALSE(rows[0].util_pct.has_value());
  EXPECT_FALSE(rows[0].proc_mem_bytes.has_value());
}

TEST(NeuronReportTest, GivenACoreBeyondTheLayout_WhenMapped_ThenItIsDroppedAndNamed) {
  NeuronReport r = Parse(R"({"neuron_runtime_data": [{"pid": 1, "error": "", "report": {
      "neuroncore_counters": {"error": "", "neuroncores_in_use": {
        "0": {"neuroncore_utilization": 5}, "7": {"neuroncore_utilization": 9}}}}}]})");
  std::vector<store::GpuSampleRow> rows;
  int64_t dropped = -1;
  NeuronReportRows(r, 2, 0, {1}, &rows, &dropped);
  ASSERT_THAT(rows, SizeIs(2));
  EXPECT_EQ(rows[0].util_pct, 5.0);
  EXPECT_EQ(dropped, 7);
}

TEST(NeuronReportTest, GivenLinesThatAreNotReports_WhenParsed_ThenTheyFailWithAReason) {
  auto broken = ParseNeuronReport(R"({"neuron_runtime_data": [ this is not json)");
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.error(), HasSubstr("parse error"));
  auto array = ParseNeuronReport("[1, 2]");
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.error(), "not a JSON object");
  // Mistyped members are unknown values, not failures.
  auto odd = ParseNeuronReport(R"({"neuron_runtime_data": {"pid": 1},
    "neuron_hardware_info": {"neuron_device_count": "two"}})");
  ASSERT_TRUE(odd.ok()) << odd.error();
  EXPECT_FALSE(odd.value().has_runtime_data);
  EXPECT_FALSE(odd.value().hardware->device_count.has_value());
}

// ---- the child process, against the fake neuron-monitor -------------------------------------

bool WaitFor(const std::function<bool()>& done, int timeout_ms = 10000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Whether `pid` is still our unreaped child (running or a zombie).
bool IsOurChild(int64_t pid) {
  siginfo_t info{};
  const int r = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
  return !(r < 0 && errno == ECHILD);
}

bool ProcessExists(int64_t pid) { return std::filesystem::exists("/proc/" + std::to_string(pid)); }

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The pid the fake wrote to GPUPROF_FAKE_NEURON_PID_FILE, or -1.
int64_t ReadPid(const std::string& path) {
  const std::string text = ReadFile(path);
  return text.empty() ? -1 : std::stoll(text);
}

class NeuronCollectorTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& name : set_) unsetenv(name.c_str());
  }

  void Env(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    set_.push_back(name);
  }
  void Fake(const std::string& key, const std::string& value) {
    Env("GPUPROF_FAKE_NEURON_" + key, value);
  }

  NeuronCollectorOptions Options() const {
    NeuronCollectorOptions o;
    o.monitor_path = kFakeMonitor;
    o.stop_grace_ms = 2000;
    return o;
  }

  std::unique_ptr<NeuronCollector> OpenFake(NeuronCollectorOptions o) {
    auto c = NeuronCollector::Open(std::move(o));
    EXPECT_TRUE(c.ok()) << c.error();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<NeuronCollector> OpenFake() { return OpenFake(Options()); }

  static std::vector<store::GpuSampleRow> Tick(GpuCollector& c, const std::vector<int64_t>& pids,
                                               bool* ok = nullptr) {
    std::vector<store::GpuSampleRow> rows;
    const bool r = c.Sample(1, pids, &rows);
    if (ok != nullptr) *ok = r;
    return rows;
  }

  const std::vector<int64_t> me_{static_cast<int64_t>(getpid())};
  testing::TempDir dir_;
  std::vector<std::string> set_;
};

TEST_F(NeuronCollectorTest, GivenTheFakeMonitor_WhenSampled_ThenRowsCarryItsReportedValues) {
  // GIVEN an instance of 2 devices x 2 cores; this process runs a runtime on cores 0-1 with
  // utilization ramping on core 0, and a stranger (pid 4242) uses core 2
  Fake("DEVICES", "2");
  Fake("CORES", "2");
  Fake("RUNTIMES",
       "pid=parent,cores=0+1,util=10..70+25,mem=1000000+3000000;"
       "pid=4242,cores=2,util=90,mem=8000000");
  const std::string copy = dir_.path() + "/config-copy.json";
  Fake("CONFIG_COPY", copy);

  // WHEN the collector is opened
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);

  // THEN the config asked for the groups we read at a one-second period
  const std::string config = ReadFile(copy);
  EXPECT_THAT(config, HasSubstr("\"period\": \"1s\""));
  EXPECT_THAT(config, HasSubstr("neuroncore_counters"));
  EXPECT_THAT(config, HasSubstr("memory_used"));
  EXPECT_EQ(ReadFile(c->config_path()), config);
  // AND there is one device per NeuronCore, named with the core version and index
  EXPECT_EQ(c->backend(), "neuron");
  ASSERT_THAT(c->devices(), SizeIs(4));
  EXPECT_EQ(c->devices()[0].name, "AWS NeuronCore-v2 0");
  EXPECT_EQ(c->devices()[3].name, "AWS NeuronCore-v2 3");
  EXPECT_EQ(c->devices()[3].index, 3);
  EXPECT_FALSE(c->devices()[0].memory_total_bytes.has_value());
  EXPECT_EQ(c->hardware().device_memory_bytes, int64_t{32} << 30);

  // AND once the ramp has reached its end, a sample carries the latest report's values
  ASSERT_TRUE(WaitFor([&] { return c->reports() >= 12; }));
  bool ok = false;
  auto rows = Tick(*c, me_, &ok);
  EXPECT_TRUE(ok);
  ASSERT_THAT(rows, SizeIs(4));
  EXPECT_DOUBLE_EQ(*rows[0].util_pct, 70.0);
  EXPECT_DOUBLE_EQ(*rows[1].util_pct, 25.0);
  EXPECT_DOUBLE_EQ(*rows[2].util_pct, 90.0);
  EXPECT_DOUBLE_EQ(*rows[3].util_pct, 0.0);
  // AND process memory is this process's runtime only, per core
  EXPECT_EQ(rows[0].proc_mem_bytes, 1000000);
  EXPECT_EQ(rows[1].proc_mem_bytes, 3000000);
  EXPECT_EQ(rows[2].proc_mem_bytes, 0);
  EXPECT_EQ(rows[2].mem_used_bytes, 8000000);
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
}

TEST_F(NeuronCollectorTest, GivenRepeatedSamples_WhenTimed_ThenSampleNeverWaitsOnTheChild) {
  // GIVEN a 16-core instance with our runtime on every core
  Fake("DEVICES", "8");
  Fake("RUNTIMES",
       "pid=parent,cores=0+1+2+3+4+5+6+7+8+9+10+11+12+13+14+15,"
       "util=50+50+50+50+50+50+50+50+50+50+50+50+50+50+50+50,"
       "mem=1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);

  // WHEN sampled 20000 times back to back while reports keep arriving
  constexpr int kTicks = 20000;
  std::vector<store::GpuSampleRow> rows;
  int good = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kTicks; ++i) good += c->Sample(i, me_, &rows) ? 1 : 0;
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
      kTicks;

  // THEN every tick had rows, and a tick costs microseconds, not a report period
  EXPECT_EQ(good, kTicks);
  EXPECT_THAT(rows, SizeIs(16));
  std::printf("[ cost     ] NeuronCollector::Sample, 16 cores: %.0f ns per tick\n", ns);
  EXPECT_LT(ns, 200000.0);
}

TEST_F(NeuronCollectorTest, GivenAMalformedLine_WhenRead_ThenItIsNotedOnceAndSkipped) {
  // GIVEN a monitor whose 2nd and 4th lines are broken
  Fake("RUNTIMES", "pid=parent,cores=0,util=33,mem=4096");
  Fake("MALFORMED_AT", "1,3");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);

  // WHEN later reports arrive
  ASSERT_TRUE(WaitFor([&] { return c->reports() >= 6; }));

  // THEN sampling goes on with the good reports
  bool ok = false;
  auto rows = Tick(*c, me_, &ok);
  EXPECT_TRUE(ok);
  ASSERT_THAT(rows, SizeIs(2));
  EXPECT_EQ(rows[0].util_pct, 33.0);
  EXPECT_EQ(rows[0].proc_mem_bytes, 4096);
  // AND one note names the first bad line; the total is noted at stop
  auto notes = c->TakeNotes();
  ASSERT_THAT(notes, SizeIs(1));
  EXPECT_THAT(notes[0], HasSubstr("neuron-monitor: skipped a malformed report line"));
  EXPECT_THAT(notes[0], HasSubstr("this is not json"));
  c->Stop();
  EXPECT_THAT(c->TakeNotes(),
              ElementsAre("neuron-monitor: 2 malformed report lines were skipped in total"));
}

TEST_F(NeuronCollectorTest, GivenTheChildExits_WhenSampledAfter_ThenNoteAndFalseForever) {
  // GIVEN a monitor that exits with status 3 after five reports, saying why on stderr
  Fake("RUNTIMES", "pid=parent,cores=0,util=20,mem=100");
  Fake("EXIT_AFTER", "5");
  Fake("EXIT_MESSAGE", "nrt: lost connection to the Neuron driver");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  const int64_t pid = c->child_pid();
  ASSERT_GT(pid, 0);

  // WHEN it has gone
  ASSERT_TRUE(WaitFor([&] { return c->child_gone(); }));

  // THEN every later sample fails
  for (int i = 0; i < 3; ++i) {
    bool ok = true;
    auto rows = Tick(*c, me_, &ok);
    EXPECT_FALSE(ok);
    EXPECT_THAT(rows, IsEmpty());
  }
  // AND one note gives its exit status and last stderr line
  EXPECT_THAT(c->TakeNotes(),
              ElementsAre("neuron-monitor exited (exit status 3; stderr: nrt: lost connection to "
                          "the Neuron driver); no Neuron readings from now on"));
  // AND the child was reaped by the reader already: no zombie
  EXPECT_EQ(c->child_pid(), -1);
  EXPECT_FALSE(IsOurChild(pid));
}

TEST_F(NeuronCollectorTest, GivenARunningChild_WhenStopped_ThenItIsReapedAndCleanedUp) {
  Fake("RUNTIMES", "pid=parent,cores=0,util=20,mem=100");
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  const int64_t pid = c->child_pid();
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(IsOurChild(pid));
  const std::string config_dir = std::filesystem::path(c->config_path()).parent_path();
  ASSERT_TRUE(std::filesystem::exists(config_dir));

  // WHEN stopped (twice: idempotent)
  c->Stop();
  c->Stop();

  // THEN the child is gone and reaped (not a zombie), its temp directory removed
  EXPECT_EQ(c->child_pid(), -1);
  EXPECT_FALSE(IsOurChild(pid));
  EXPECT_FALSE(ProcessExists(pid));
  EXPECT_FALSE(std::filesystem::exists(config_dir));
  // AND sampling is over, a stop is not an exit to note, and it cannot start again
  bool ok = true;
  Tick(*c, me_, &ok);
  EXPECT_FALSE(ok);
  EXPECT_THAT(c->TakeNotes(), IsEmpty());
  EXPECT_FALSE(c->Start().ok());
}

TEST_F(NeuronCollectorTest, GivenAChildIgnoringSigterm_WhenStopped_ThenSigkillEndsIt) {
  // GIVEN a monitor that ignores SIGTERM
  Fake("IGNORE_SIGTERM", "1");
  NeuronCollectorOptions o = Options();
  o.stop_grace_ms = 300;
  auto c = OpenFake(o);
  ASSERT_NE(c, nullptr);
  const int64_t pid = c->child_pid();

  // WHEN stopped
  const auto t0 = std::chrono::steady_clock::now();
  c->Stop();
  const auto took = std::chrono::steady_clock::now() - t0;

  // THEN it was killed after the grace period and reaped
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_FALSE(IsOurChild(pid));
  EXPECT_FALSE(ProcessExists(pid));
}

TEST_F(NeuronCollectorTest, GivenACollector_WhenDestroyed_ThenTheChildIsReaped) {
  auto c = OpenFake();
  ASSERT_NE(c, nullptr);
  const int64_t pid = c->child_pid();
  c.reset();
  EXPECT_FALSE(IsOurChild(pid));
  EXPECT_FALSE(ProcessExists(pid));
}

TEST_F(NeuronCollectorTest, GivenReportsStop_WhenSampledLater_ThenStaleReadingsAreRefused) {
  // GIVEN a monitor that goes silent (but keeps running) after three reports
  Fake("RUNTIMES", "pid=parent,cores=0,util=20,mem=100");
  Fake("PAUSE_AFTER", "3");
  NeuronCollectorOptions o = Options();
  o.stale_after_ms = 250;
  auto c = OpenFake(o);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(WaitFor([&] { return c->reports() >= 3; }));

  // WHEN sampled until the last report is older than the limit
  std::vector<store::GpuSampleRow> rows;
  ASSERT_TRUE(WaitFor([&] { return !c->Sample(1, me_, &rows); }));

  // THEN no rows, one note
  EXPECT_THAT(rows, IsEmpty());
  EXPECT_THAT(c->TakeNotes(), ElementsAre("neuron-monitor sent no report for more than 250 ms; no "
                                          "Neuron readings until it reports again"));
}

TEST_F(NeuronCollectorTest, GivenNoDevice_WhenOpened_ThenTheMonitorsErrorIsTheReason) {
  Fake("HW_ERROR", "Neuron driver is not loaded");
  auto c = NeuronCollector::Open(Options());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error(),
            "neuron-monitor reports no usable Neuron device: Neuron driver is not loaded");
}

TEST_F(NeuronCollectorTest, GivenAMonitorThatDiesAtOnce_WhenOpened_ThenTheErrorSaysHow) {
  Fake("EXIT_AFTER", "0");
  Fake("EXIT_CODE", "7");
  Fake("EXIT_MESSAGE", "neuron-monitor: permission denied on /dev/neuron0");
  const std::string pid_file = dir_.path() + "/pid";
  Fake("PID_FILE", pid_file);
  auto c = NeuronCollector::Open(Options());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error(), std::string("neuron-monitor (") + kFakeMonitor +
                           ") exited before its first report (exit status 7; stderr: "
                           "neuron-monitor: permission denied on /dev/neuron0)");
  const int64_t pid = ReadPid(pid_file);
  ASSERT_GT(pid, 0);
  EXPECT_FALSE(IsOurChild(pid));
}

TEST_F(NeuronCollectorTest, GivenASilentMonitor_WhenOpened_ThenItTimesOutAndIsReaped) {
  Fake("DELAY_FIRST_MS", "30000");
  const std::string pid_file = dir_.path() + "/pid";
  Fake("PID_FILE", pid_file);
  NeuronCollectorOptions o = Options();
  // Long enough for the fake's interpreter to start and write its pid on a loaded machine.
  o.first_report_timeout_ms = 1500;
  auto c = NeuronCollector::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error(),
            std::string("neuron-monitor (") + kFakeMonitor + ") sent no report within 1500 ms");
  const int64_t pid = ReadPid(pid_file);
  ASSERT_GT(pid, 0);
  EXPECT_FALSE(IsOurChild(pid));
  EXPECT_FALSE(ProcessExists(pid));
}

TEST_F(NeuronCollectorTest, GivenAConfigTheMonitorRejects_WhenOpened_ThenItsStderrIsShown) {
  // GIVEN a monitor that refuses its config, saying so on stderr (as the real tool and the
  // fake do); THEN its last stderr line reaches the error text
  const std::string script =
      dir_.Write("bin/neuron-monitor", "#!/bin/sh\necho \"bad config: $2\" >&2\nexit 2\n");
  chmod(script.c_str(), 0755);
  NeuronCollectorOptions o = Options();
  o.monitor_path = script;
  auto c = NeuronCollector::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error(), HasSubstr("exited before its first report (exit status 2; stderr: bad "
                                   "config: /"));
  EXPECT_THAT(c.error(), HasSubstr("/monitor.json)"));
}

TEST_F(NeuronCollectorTest, GivenPathChoices_WhenResolved_ThenOptionEnvPathAndDefaultAreTried) {
  // GIVEN a directory on PATH holding an executable neuron-monitor
  const std::string bin = dir_.path() + "/bin";
  std::filesystem::create_directories(bin);
  std::filesystem::copy_file(kFakeMonitor, bin + "/neuron-monitor");
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  unsetenv(kNeuronMonitorEnv);

  // THEN an explicit option wins and is the only one tried
  EXPECT_EQ(ResolveNeuronMonitorPath(kFakeMonitor).value(), kFakeMonitor);
  auto missing = ResolveNeuronMonitorPath(dir_.path() + "/nowhere/neuron-monitor");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error(), "neuron-monitor not found (tried " + dir_.path() +
                                 "/nowhere/neuron-monitor): install aws-neuronx-tools");
  // AND the environment comes next, then PATH
  Env(kNeuronMonitorEnv, dir_.path() + "/nope");
  auto bad_env = ResolveNeuronMonitorPath("");
  ASSERT_FALSE(bad_env.ok());
  EXPECT_EQ(bad_env.error(), "neuron-monitor not found (tried " + dir_.path() +
                                 "/nope from $GPUPROF_NEURON_MONITOR): install aws-neuronx-tools");
  unsetenv(kNeuronMonitorEnv);
  setenv("PATH", ("/nonexistent:" + bin).c_str(), 1);
  auto on_path = ResolveNeuronMonitorPath("");
  // AND a file that is not executable does not count
  chmod((bin + "/neuron-monitor").c_str(), 0644);
  auto not_exec = ResolveNeuronMonitorPath("");
  setenv("PATH", "/nonexistent", 1);
  auto nowhere = ResolveNeuronMonitorPath("");
  setenv("PATH", saved.c_str(), 1);
  ASSERT_TRUE(on_path.ok()) << on_path.error();
  EXPECT_EQ(on_path.value(), bin + "/neuron-monitor");
  if (!std::filesystem::exists(kNeuronMonitorDefaultPath)) {
    ASSERT_FALSE(not_exec.ok());
    ASSERT_FALSE(nowhere.ok());
    EXPECT_EQ(nowhere.error(),
              "neuron-monitor not found (tried 'neuron-monitor' on $PATH and "
              "/opt/aws/neuron/bin/neuron-monitor): install aws-neuronx-tools");
  }
}

TEST_F(NeuronCollectorTest, GivenTheFakeViaEnv_WhenMakingNeuronCollector_ThenNeuronIsUsed) {
  // GIVEN $GPUPROF_NEURON_MONITOR naming the fake
  Env(kNeuronMonitorEnv, kFakeMonitor);
  Fake("RUNTIMES", "pid=parent,cores=1,util=64,mem=2048");
  GpuCollectorOptions opts;
  opts.backend = "neuron";

  // WHEN made through the factory
  auto c = MakeGpuCollector(opts);

  // THEN it is the Neuron backend with the fake's cores and values
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c.value()->backend(), "neuron");
  ASSERT_THAT(c.value()->devices(), SizeIs(2));
  auto rows = Tick(*c.value(), me_);
  ASSERT_THAT(rows, SizeIs(2));
  EXPECT_EQ(rows[1].util_pct, 64.0);
  EXPECT_EQ(rows[1].proc_mem_bytes, 2048);
}

TEST_F(NeuronCollectorTest, GivenNoMonitor_WhenNeuronIsRequested_ThenTheErrorSaysWhatToInstall) {
  Env(kNeuronMonitorEnv, dir_.path() + "/missing/neuron-monitor");
  GpuCollectorOptions opts;
  opts.backend = "neuron";
  auto c = MakeGpuCollector(opts);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error(), "gpu_backend='neuron' was requested but neuron-monitor not found (tried " +
                           dir_.path() +
                           "/missing/neuron-monitor from $GPUPROF_NEURON_MONITOR): install "
                           "aws-neuronx-tools");

  GpuCollectorOptions zero = opts;
  zero.neuron_period_s = 0;
  EXPECT_EQ(MakeGpuCollector(zero).error(), "neuron_period_s must be at least 1, got 0");
}

TEST_F(NeuronCollectorTest, GivenNoNeuronDevice_WhenAuto_ThenNothingIsSpawnedAndBothReasonsShow) {
  // GIVEN no NVML, a (fake) neuron-monitor installed, but no Neuron device node
  Env(kNeuronMonitorEnv, kFakeMonitor);
  const std::string pid_file = dir_.path() + "/pid";
  Fake("PID_FILE", pid_file);
  GpuCollectorOptions opts;
  opts.nvml_library = dir_.path() + "/no/libnvidia-ml.so.1";
  opts.neuron_device_node = dir_.path() + "/neuron0";

  // WHEN auto picks a backend
  auto c = MakeGpuCollector(opts);

  // THEN there is none, the error gives both reasons, and neuron-monitor never ran
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error(), HasSubstr("NVML not available: cannot load " + opts.nvml_library));
  EXPECT_THAT(c.error(), HasSubstr("; AWS Neuron not available: " + opts.neuron_device_node +
                                   " does not exist (no Neuron device)"));
  EXPECT_FALSE(std::filesystem::exists(pid_file));

  // AND with neither the device nor the tool, both Neuron reasons are given
  Env(kNeuronMonitorEnv, dir_.path() + "/none");
  auto neither = MakeGpuCollector(opts);
  ASSERT_FALSE(neither.ok());
  EXPECT_THAT(neither.error(), HasSubstr("does not exist (no Neuron device); neuron-monitor not "
                                         "found (tried " +
                                         dir_.path() + "/none"));
}

TEST_F(NeuronCollectorTest, GivenANeuronDeviceNode_WhenAuto_ThenNeuronIsChosenAfterNvml) {
  // GIVEN no NVML, the fake monitor, and a device node that exists
  Env(kNeuronMonitorEnv, kFakeMonitor);
  Fake("RUNTIMES", "pid=parent,cores=0,util=12,mem=1");
  GpuCollectorOptions opts;
  opts.nvml_library = dir_.path() + "/no/libnvidia-ml.so.1";
  opts.neuron_device_node = dir_.Write("neuron0", "");

  // WHEN auto picks a backend
  auto c = MakeGpuCollector(opts);

  // THEN it is Neuron
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c.value()->backend(), "neuron");
  EXPECT_EQ(Tick(*c.value(), me_).at(0).util_pct, 12.0);

  // AND a device node with a monitor that fails gives the monitor's reason after NVML's
  Fake("HW_ERROR", "driver not loaded");
  auto failing = MakeGpuCollector(opts);
  ASSERT_FALSE(failing.ok());
  EXPECT_THAT(failing.error(), HasSubstr("; AWS Neuron not available: neuron-monitor reports no "
                                         "usable Neuron device: driver not loaded"));
}

}  // namespace
}  // namespace gpuprof::telemetry
