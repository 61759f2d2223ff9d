#include "traces/perfetto_export.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/test_runs.h"

namespace gpuprof::traces {
namespace {

using analysis::testing::kMs;
using analysis::testing::kSec;
using analysis::testing::RunBuilder;
using analysis::testing::StepShape;
using nlohmann::json;

int64_t Ns(const json& us) { return std::llround(us.get<double>() * 1000.0); }

// A parsed trace with its events by track name.
struct Trace {
  json doc;
  std::map<int64_t, std::string> thread_names;  // tid -> name
  std::string process_name;

  const json& events() const { return doc["traceEvents"]; }

  // The events of phase `ph` on the thread named `track`.
  std::vector<json> On(const std::string& track, const std::string& ph = "X") const {
    std::vector<json> out;
    for (const auto& e : events()) {
      if (e["ph"] != ph || !e.contains("tid")) continue;
      auto it = thread_names.find(e["tid"].get<int64_t>());
      if (it != thread_names.end() && it->second == track) out.push_back(e);
    }
    return out;
  }
  // The points of counter `name`.
  std::vector<json> Counter(const std::string& name) const {
    std::vector<json> out;
    for (const auto& e : events()) {
      if (e["ph"] == "C" && e["name"] == name) out.push_back(e);
    }
    return out;
  }
  std::set<std::string> CounterNames() const {
    std::set<std::string> out;
    for (const auto& e : events()) {
      if (e["ph"] == "C") out.insert(e["name"].get<std::string>());
    }
    return out;
  }
};

// Parses the export of `data` and checks what every trace must satisfy: the object format,
// the fields each phase needs, and that the slices of each thread nest.
void CheckTrace(const store::RunData& data, Trace* out) {
  Trace& t = *out;
  ASSERT_TRUE(t.doc.is_object());
  ASSERT_TRUE(t.doc["traceEvents"].is_array());
  EXPECT_EQ(t.doc["displayTimeUnit"], "ms");
  EXPECT_EQ(t.doc["otherData"]["start_unix_ns"], data.run.start_unix_ns);
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> slices;
  for (const auto& e : t.doc["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e;
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e;
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e;
    const std::string ph = e["ph"];
    ASSERT_TRUE(ph == "M" || ph == "X" || ph == "C" || ph == "i") << e;
    if (ph != "M") {
      ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e;
    }
    if (ph == "M") {
      if (e["name"] == "thread_name") t.thread_names[e["tid"]] = e["args"]["name"];
      if (e["name"] == "process_name") t.process_name = e["args"]["name"];
    }
    if (ph == "X") {
      ASSERT_TRUE(e.contains("tid") && e["dur"].is_number()) << e;
      EXPECT_GE(e["dur"].get<double>(), 0) << e;
      slices[e["tid"]].push_back({Ns(e["ts"]), Ns(e["ts"]) + Ns(e["dur"])});
    }
    if (ph == "C") {
      ASSERT_TRUE(e["args"].is_object() && e["args"].size() == 1) << e;
      for (const auto& [k, v] : e["args"].items()) {
        ASSERT_TRUE(v.is_number()) << e;
      }
    }
    if (ph == "i") {
      ASSERT_TRUE(e.contains("tid")) << e;
    }
  }
  for (auto& [tid, list] : slices) {
    EXPECT_TRUE(t.thread_names.count(tid)) << "unnamed thread " << tid;
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<int64_t> open;  // ends of the enclosing slices
    for (const auto& [start, end] : list) {
      while (!open.empty() && open.back() <= start) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(end, open.back())
            << "partial overlap on " << t.thread_names[tid] << " at " << start;
      }
      open.push_back(end);
    }
  }
}

Trace Export(const store::RunData& data) {
  Trace t;
  t.doc = json::parse(PerfettoTraceJson(data));  // throws (fails the test) on invalid JSON
  CheckTrace(data, &t);
  return t;
}

TEST(PerfettoExport, StepsPhasesAndWaitsOnTheirTracks) {
  RunBuilder b;
  StepShape shape;
  shape.wait_source = "dataloader";
  shape.phases = {{"optimizer", 10 * kMs, std::nullopt},
                  {"forward", 30 * kMs, 25 * kMs},
                  {"backward", 50 * kMs, 70 * kMs}};
  b.Steps(3, shape);
  const Trace t = Export(b.Build());

  EXPECT_EQ(t.process_name, "gpuprof exp (run 1)");
  const auto steps = t.On("steps");
  ASSERT_EQ(steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(steps[i]["name"], "step " + std::to_string(i));
    EXPECT_EQ(Ns(steps[i]["ts"]), b.steps()[i].start_ns);
    EXPECT_EQ(Ns(steps[i]["dur"]), 100 * kMs);
    EXPECT_EQ(steps[i]["args"]["step"], i);
    EXPECT_DOUBLE_EQ(steps[i]["args"]["phase_cpu_ms"]["forward"].get<double>(), 30.0);
    EXPECT_DOUBLE_EQ(steps[i]["args"]["phase_gpu_ms"]["backward"].get<double>(), 70.0);
    // No GPU time for the optimizer: left out, never 0.
    EXPECT_FALSE(steps[i]["args"]["phase_gpu_ms"].contains("optimizer"));
    EXPECT_DOUBLE_EQ(steps[i]["args"]["other_ms"].get<double>(), 5.0);
  }

  // Measured waits at the step's start, on their own track; step 0's is measured too here.
  const auto waits = t.On("dataloader");
  ASSERT_EQ(waits.size(), 3u);
  EXPECT_EQ(waits[1]["name"], "wait (dataloader)");
  EXPECT_EQ(Ns(waits[1]["ts"]), b.steps()[1].start_ns);
  EXPECT_EQ(Ns(waits[1]["dur"]), 5 * kMs);

  // Phases: inside their step, after the wait, in run order; CPU and GPU time kept apart.
  const auto phases = t.On("phases");
  ASSERT_EQ(phases.size(), 9u);
  EXPECT_EQ(phases[3]["name"], "forward");
  EXPECT_EQ(phases[4]["name"], "backward");
  EXPECT_EQ(phases[5]["name"], "optimizer");
  EXPECT_EQ(Ns(phases[3]["ts"]), b.steps()[1].start_ns + 5 * kMs);
  EXPECT_EQ(Ns(phases[4]["ts"]), b.steps()[1].start_ns + 35 * kMs);
  EXPECT_EQ(Ns(phases[4]["dur"]), 50 * kMs);
  EXPECT_DOUBLE_EQ(phases[4]["args"]["cpu_ms"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(phases[4]["args"]["gpu_ms"].get<double>(), 70.0);
  EXPECT_FALSE(phases[5]["args"].contains("gpu_ms"));
  for (const auto& p : phases) {
    const auto& s = b.steps()[p["args"]["step"].get<size_t>()];
    EXPECT_GE(Ns(p["ts"]), s.start_ns);
    EXPECT_LE(Ns(p["ts"]) + Ns(p["dur"]), s.end_ns);
  }
}

TEST(PerfettoExport, GapWaitOfStepZeroIsUnknownAndPhasesAreClippedToTheStep) {
  RunBuilder b;
  StepShape shape;  // gap waits: step 0's is unknown
  shape.phases = {{"forward", 60 * kMs, std::nullopt}, {"model", 70 * kMs, std::nullopt}};
  b.Steps(2, shape);
  const Trace t = Export(b.Build());
  const auto waits = t.On("dataloader");
  ASSERT_EQ(waits.size(), 1u);  // step 1 only
  EXPECT_EQ(waits[0]["args"]["step"], 1);
  EXPECT_EQ(waits[0]["name"], "wait (gap)");
  const auto steps = t.On("steps");
  EXPECT_FALSE(steps[0]["args"].contains("wait_ms"));
  EXPECT_FALSE(steps[1]["args"].contains("other_ms"));  // phases exceed the step: nested
  const auto phases = t.On("phases");
  ASSERT_EQ(phases.size(), 4u);
  EXPECT_EQ(phases[1]["name"], "model");
  EXPECT_EQ(Ns(phases[1]["ts"]) + Ns(phases[1]["dur"]), b.steps()[0].end_ns);
  EXPECT_EQ(phases[1]["args"]["clipped_at_step_end"], true);
  EXPECT_DOUBLE_EQ(phases[1]["args"]["cpu_ms"].get<double>(), 70.0);
}

TEST(PerfettoExport, KernelWindowsPerDeviceWithTopKernelsAndACounter) {
  auto b = analysis::testing::HealthyFullRun();
  store::RunData d = b.Build();
  // A traced step on GPU 1 with one kernel of known launch configuration.
  store::KernelRow k;
  k.window_start_ns = b.steps()[2].start_ns;
  k.window_end_ns = b.steps()[2].end_ns;
  k.name = "sm90_xmma_gemm";
  k.calls = 12;
  k.gpu_ns = 9 * kMs;
  k.source = "cupti";
  k.step = 2;
  k.device = 1;
  k.stream = 7;
  k.grid = "128,1,1";
  k.block = "256,1,1";
  k.min_ns = 500'000;
  k.max_ns = 1'000'000;
  d.kernels.push_back(k);
  const Trace t = Export(d);

  const auto windows = t.On("kernels");  // device unknown (torch_profiler rows)
  ASSERT_EQ(windows.size(), 5u);
  EXPECT_EQ(windows[0]["name"], "6480 kernels");
  EXPECT_EQ(Ns(windows[0]["dur"]), kSec);
  const auto& top = windows[0]["args"]["top"];
  ASSERT_EQ(top.size(), 4u);
  EXPECT_EQ(top[0]["name"], "ampere_bf16_s16816gemm_bf16_128x128");
  EXPECT_EQ(top[0]["calls"], 1000);
  EXPECT_DOUBLE_EQ(top[0]["gpu_ms"].get<double>(), 400.0);
  EXPECT_FALSE(top[0].contains("grid"));  // not recorded: left out
  EXPECT_DOUBLE_EQ(windows[0]["args"]["gpu_ms"].get<double>(), 700.0);

  const auto gpu1 = t.On("kernels GPU 1");
  ASSERT_EQ(gpu1.size(), 1u);
  EXPECT_EQ(gpu1[0]["name"], "sm90_xmma_gemm");
  EXPECT_EQ(gpu1[0]["args"]["step"], 2);
  EXPECT_EQ(gpu1[0]["args"]["top"][0]["grid"], "128,1,1");
  EXPECT_EQ(gpu1[0]["args"]["top"][0]["stream"], 7);
  EXPECT_DOUBLE_EQ(gpu1[0]["args"]["top"][0]["max_us"].get<double>(), 1000.0);

  // Two sources: one counter each, named by source.
  const auto counter = t.Counter("GPU 1 kernel time (cupti)");
  ASSERT_EQ(counter.size(), 1u);
  EXPECT_DOUBLE_EQ(counter[0]["args"]["ms"].get<double>(), 9.0);
  EXPECT_EQ(t.Counter("kernel time (torch_profiler)").size(), 5u);
}

TEST(PerfettoExport, CpuOperatorsTrackIsHostTime) {
  RunBuilder b;
  b.Cpu().Steps(3, StepShape{});
  store::RunData d = b.Build();
  const int64_t a = b.steps()[1].start_ns, z = b.steps()[1].end_ns;
  d.cpu_ops.push_back({a, z, 1, "aten::addmm", 40, 30 * kMs, 35 * kMs, "torch_profiler"});
  d.cpu_ops.push_back({a, z, 1, "aten::relu", 20, 2 * kMs, std::nullopt, "torch_profiler"});
  const Trace t = Export(d);
  const auto ops = t.On("CPU operators");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0]["name"], "60 CPU ops");
  EXPECT_EQ(ops[0]["args"]["step"], 1);
  EXPECT_EQ(ops[0]["args"]["top"][0]["name"], "aten::addmm");
  EXPECT_DOUBLE_EQ(ops[0]["args"]["top"][0]["cpu_ms"].get<double>(), 35.0);
  EXPECT_FALSE(ops[0]["args"]["top"][1].contains("cpu_ms"));
  EXPECT_FALSE(ops[0]["args"].contains("gpu_ms"));
  ASSERT_EQ(t.Counter("CPU operator self time").size(), 1u);
  EXPECT_DOUBLE_EQ(t.Counter("CPU operator self time")[0]["args"]["ms"].get<double>(), 32.0);
}

TEST(PerfettoExport, OverlappingCommBucketsGoToLanes) {
  RunBuilder b;
  b.Rank("job", 2, 4).Steps(2, StepShape{});
  const int64_t s = b.steps()[1].start_ns;
  b.CommBucket(1, 0, s + 40 * kMs, s + 70 * kMs, 25 << 20)
      .CommBucket(1, 1, s + 50 * kMs, s + 80 * kMs)
      .CommBucket(1, 2, s + 75 * kMs, s + 85 * kMs);
  const Trace t = Export(b.Build());
  EXPECT_EQ(t.process_name, "gpuprof exp (rank 2)");
  const auto lane1 = t.On("comm");
  const auto lane2 = t.On("comm 2");
  ASSERT_EQ(lane1.size(), 2u);  // buckets 0 and 2
  ASSERT_EQ(lane2.size(), 1u);  // bucket 1 overlaps bucket 0
  EXPECT_EQ(lane1[0]["name"], "bucket 0");
  EXPECT_EQ(lane1[0]["args"]["bytes"], 25 << 20);
  EXPECT_FALSE(lane2[0]["args"].contains("bytes"));
  EXPECT_EQ(lane1[1]["name"], "bucket 2");
  EXPECT_EQ(t.doc["otherData"]["rank"], 2);
}

TEST(PerfettoExport, AGroupTraceHasOneProcessPerRankOnTheCommonTimeLine) {
  // GIVEN two ranks whose processes had the same pid (two hosts), rank 1 starting 250 ms after
  // the group's base, each with one bucket 40 ms into its step 1
  std::vector<store::RunData> runs;
  for (int64_t rank = 0; rank < 2; ++rank) {
    RunBuilder b;
    b.Rank("job", rank, 2).Steps(2, StepShape{});
    b.run().pid = 4242;
    b.run().hostname = "node-" + std::to_string(rank);
    const int64_t s = b.steps()[1].start_ns;
    b.CommBucket(1, 0, s + 40 * kMs, s + 70 * kMs, 1 << 20);
    runs.push_back(b.Build());
  }
  const std::vector<GroupTraceRank> ranks = {{&runs[0], 0}, {&runs[1], 250 * kMs}};
  const GroupTraceInfo info{"job", runs[0].run.start_unix_ns, "clocks aligned to rank 0"};
  std::ostringstream out;
  const PerfettoSummary summary = WritePerfettoGroupTrace(ranks, info, out);
  const json doc = json::parse(out.str());
  // THEN each rank is a process of its own, named by its rank, with a distinct pid
  std::map<int64_t, std::string> processes;
  std::map<int64_t, std::vector<json>> comm;  // pid -> comm slices
  std::map<std::pair<int64_t, int64_t>, std::string> threads;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      threads[{e["pid"], e["tid"]}] = e["args"]["name"];
    }
  }
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && threads[{e["pid"], e["tid"]}] == "comm") comm[e["pid"]].push_back(e);
  }
  ASSERT_EQ(processes.size(), 2u);
  EXPECT_EQ(processes.at(4242), "gpuprof exp (rank 0)");
  EXPECT_EQ(processes.at(4243), "gpuprof exp (rank 1)");
  EXPECT_EQ(summary.events, doc["traceEvents"].size());
  // AND rank 1's events are its run times plus its shift, rank 0's as they are
  const int64_t s1 = runs[0].steps[1].start_ns;
  ASSERT_EQ(comm[4242].size(), 1u);
  ASSERT_EQ(comm[4243].size(), 1u);
  EXPECT_EQ(Ns(comm[4242][0]["ts"]), s1 + 40 * kMs);
  EXPECT_EQ(Ns(comm[4243][0]["ts"]), s1 + 40 * kMs + 250 * kMs);
  EXPECT_EQ(Ns(comm[4243][0]["dur"]), 30 * kMs);
  // AND otherData has the group's time base and each rank's facts with its shift and pid
  const json& other = doc["otherData"];
  EXPECT_EQ(other["group_id"], "job");
  EXPECT_EQ(other["base_unix_ns"], runs[0].run.start_unix_ns);
  EXPECT_EQ(other["clock_alignment"], "clocks aligned to rank 0");
  ASSERT_EQ(other["ranks"].size(), 2u);
  EXPECT_EQ(other["ranks"][1]["rank"], 1);
  EXPECT_EQ(other["ranks"][1]["hostname"], "node-1");
  EXPECT_EQ(other["ranks"][1]["shift_ns"], 250 * kMs);
  EXPECT_EQ(other["ranks"][1]["trace_pid"], 4243);
  // AND one rank alone makes the same events as its own export, shifted by nothing
  std::ostringstream alone;
  WritePerfettoGroupTrace({{&runs[0], 0}}, info, alone);
  EXPECT_EQ(json::parse(alone.str())["traceEvents"],
            json::parse(PerfettoTraceJson(runs[0]))["traceEvents"]);
}

TEST(PerfettoExport, TelemetryCountersLeaveUnknownOut) {
  RunBuilder b;
  b.Steps(5, StepShape{});
  b.GpuEvery(100 * kMs, analysis::testing::HealthyGpu, 2);
  b.HostSample([] {
    store::HostSampleRow h;
    h.ts_ns = 0;
    h.cpu_pct = 42;  // nothing else measured
    return h;
  }());
  store::RunData d = b.Build();
  for (auto& g : d.gpu_samples_1s) {
    if (g.gpu_index == 1) g.power_mean_mw.reset();  // GPU 1 could not read power
  }
  const Trace t = Export(d);
  const auto names = t.CounterNames();
  EXPECT_TRUE(names.count("GPU 0 utilization"));
  EXPECT_TRUE(names.count("GPU 1 temperature"));
  EXPECT_TRUE(names.count("GPU 0 power"));
  EXPECT_FALSE(names.count("GPU 1 power"));
  EXPECT_TRUE(names.count("host CPU"));
  EXPECT_FALSE(names.count("host memory used"));
  EXPECT_FALSE(names.count("training process RSS"));
  EXPECT_FALSE(names.count("job's other ranks on this host CPU"));  // not a rank beside others
  const auto util = t.Counter("GPU 0 utilization");
  ASSERT_EQ(util.size(), d.gpu_samples_1s.size() / 2);
  EXPECT_DOUBLE_EQ(util[0]["args"]["%"].get<double>(), 85.0);
  EXPECT_DOUBLE_EQ(t.Counter("GPU 0 power")[0]["args"]["W"].get<double>(), 600.0);
  EXPECT_DOUBLE_EQ(t.Counter("host CPU")[0]["args"]["%"].get<double>(), 42.0);
  // AND a rank beside other ranks has their CPU as its own track
  d.host_samples[0].job_cpu_pct = 130;
  const auto job = Export(d).Counter("job's other ranks on this host CPU");
  ASSERT_EQ(job.size(), 1u);
  EXPECT_DOUBLE_EQ(job[0]["args"]["% of one core"].get<double>(), 130.0);
}

TEST(PerfettoExport, InsightsAndDiagnosticsAreInstants) {
  auto b = analysis::testing::HealthyRun();
  store::RunData d = b.Build();
  d.insights.push_back({0, "dataloader_stall", "data_pipeline", "high", "Steps wait 40% on data.",
                        std::string("Raise num_workers."),
                        std::string(R"({"wait_fraction": 0.4})")});
  d.insights.push_back({1, "info_rule", "misc", "info", "Fine.", std::nullopt, std::nullopt});
  d.diagnostics.push_back({1 * kSec, "warning", "store", "12 rows were not stored"});
  d.diagnostics.push_back({std::nullopt, "info", "comm", "not timed"});
  const Trace t = Export(d);
  const auto insights = t.On("insights", "i");
  ASSERT_EQ(insights.size(), 2u);
  EXPECT_EQ(insights[0]["name"], "[high] dataloader_stall");
  EXPECT_EQ(Ns(insights[0]["ts"]), *d.run.end_ns);
  EXPECT_EQ(insights[0]["args"]["fix"], "Raise num_workers.");
  EXPECT_DOUBLE_EQ(insights[0]["args"]["evidence"]["wait_fraction"].get<double>(), 0.4);
  EXPECT_FALSE(insights[1]["args"].contains("fix"));
  const auto notes = t.On("diagnostics", "i");
  ASSERT_EQ(notes.size(), 1u);  // the one without a time is not on the timeline
  EXPECT_EQ(notes[0]["args"]["message"], "12 rows were not stored");
}

TEST(PerfettoExport, AnEmptyRunAndInvalidUtf8StillMakeAValidTrace) {
  RunBuilder b;
  b.Name("bad\xff name");
  store::RunData d = b.Build();
  d.run.end_ns.reset();
  const Trace t = Export(d);
  EXPECT_EQ(t.process_name, "gpuprof bad\xef\xbf\xbd name (run 1)");
  EXPECT_TRUE(t.On("steps").empty());
  EXPECT_EQ(t.doc["otherData"]["start_utc"], "2024-05-01T12:00:00.000000000Z");
  EXPECT_DOUBLE_EQ(t.doc["otherData"]["duration_ms"].get<double>(), 0.0);
}

TEST(PerfettoExport, TimestampsKeepNanoseconds) {
  RunBuilder b;
  StepShape shape;
  shape.duration_ns = 1'234'567;  // 1234.567 µs
  b.Steps(3, shape);
  store::RunData d = b.Build();
  for (auto& s : d.steps) {
    s.start_ns += 7'000'000'000'001;  // ~2 h into the run, odd ns
    s.end_ns += 7'000'000'000'001;
  }
  const Trace t = Export(d);
  const auto steps = t.On("steps");
  ASSERT_EQ(steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(Ns(steps[i]["ts"]), d.steps[i].start_ns);
    EXPECT_EQ(Ns(steps[i]["ts"]) + Ns(steps[i]["dur"]), d.steps[i].end_ns);
  }
  EXPECT_EQ(PerfettoFormatNames().front(), "perfetto");
}

}  // namespace
}  // namespace gpuprof::traces
