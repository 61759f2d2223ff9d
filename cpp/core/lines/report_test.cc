#include "lines/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

namespace gpuprof::lines {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// A linescope-result/1 document shaped like ProfileResult.to_dict().
json Line(const std::string& file, int line, int64_t wall, json hits, json self = nullptr) {
  return {{"filename", file},       {"line", line},         {"wall_time_ns", wall},
          {"hits", hits},           {"self_time_ns", self}, {"memory_bytes", nullptr},
          {"gpu", nullptr},         {"calls", nullptr},     {"memory_peak_bytes", nullptr},
          {"cpu_time_ns", nullptr}, {"samples", nullptr}};
}

json Result() {
  return {
      {"format", "linescope-result/1"},
      {"backend", "trace"},
      {"run",
       {{"elapsed_ns", 10'000'000},
        {"started_at", 1700000000.5},
        {"lines",
         {Line("/proj/app.py", 2, 6'000'000, 1, 1'000'000),
          Line("/proj/app.py", 5, 5'000'000, 10, 5'000'000), Line("/proj/app.py", 6, 100, 10, 100),
          Line("/proj/lib/util.py", 3, 2'000'000, 4)}},
        {"functions",
         {{{"qualname", "main"},
           {"filename", "/proj/app.py"},
           {"first_line", 1},
           {"total_time_ns", 6'000'000},
           {"own_time_ns", 1'000'000},
           {"calls", 1}},
          {{"qualname", "work"},
           {"filename", "/proj/app.py"},
           {"first_line", 4},
           {"total_time_ns", 5'000'100},
           {"own_time_ns", 5'000'100},
           {"calls", 0}}}}}},
      {"sources",
       {{"/proj/app.py", "def main():\n    work()\n\ndef work():\n    x = 1\n    return x\n"},
        {"/proj/lib/util.py", "a = 1\nb = 2\nc = a + b\n"}}},
      {"capabilities", {{"gpu", false}, {"memory", false}}},
      {"symbols", json::array()},
      {"warnings", {"something odd"}},
      {"options", {{"gpu", false}, {"memory", false}, {"root", "/proj"}}},
      {"metadata", json::object()},
      {"memory", nullptr},
      {"gpu", nullptr},
  };
}

json Build(const json& result) {
  auto payload = BuildReportPayload(result.dump());
  EXPECT_TRUE(payload.ok()) << payload.error();
  return payload.ok() ? json::parse(payload.value()) : json();
}

// Index of the payload line at file display name `display`, line `line`.
const json& PayloadLine(const json& p, const std::string& display, int line) {
  for (const json& l : p["lines"]) {
    if (p["files"][l["file"].get<int>()]["display"] == display && l["line"] == line) return l;
  }
  static const json kNone;
  ADD_FAILURE() << "no line " << display << ":" << line;
  return kNone;
}

TEST(ReportPayload, FileNamesFollowTheRootTheSessionUsedWhenNoneWasGiven) {
  // GIVEN a result whose options have no root (the default: the directory at start), with
  // that directory in the metadata
  json r = Result();
  r["options"]["root"] = nullptr;
  r["metadata"]["root"] = "/proj/lib";
  // WHEN the payload is built
  json p = Build(r);
  // THEN names under that directory are relative to it; a file outside it is named from the
  // files' common directory
  ASSERT_EQ(p["files"].size(), 2u);
  EXPECT_EQ(p["files"][0]["display"], "app.py");
  EXPECT_EQ(p["files"][1]["display"], "util.py");
}

TEST(ReportPayload, TwoFilesNeverShareADisplayName) {
  // GIVEN util.py under the root and another util.py beside it, outside the root, plus a
  // third outside file that collides with nothing
  json r = Result();
  r["options"]["root"] = "/w/proj";
  r["run"]["lines"] = {Line("/w/proj/util.py", 1, 10, 1), Line("/w/vendor/util.py", 1, 10, 1),
                       Line("/w/vendor/x/only.py", 1, 10, 1)};
  r["run"]["functions"] = json::array();
  r["sources"] = {{"/w/proj/util.py", "x = 1\n"},
                  {"/w/vendor/util.py", "x = 1\n"},
                  {"/w/vendor/x/only.py", "x = 1\n"}};
  // WHEN the payload is built
  json p = Build(r);
  // THEN the file under the root keeps its short name, the outside one that would repeat it
  // is named from the directory all files share, the other from the outside files' one
  ASSERT_EQ(p["files"].size(), 3u);
  std::set<std::string> names;
  for (const json& f : p["files"]) names.insert(f["display"].get<std::string>());
  EXPECT_EQ(names, (std::set<std::string>{"util.py", "vendor/util.py", "x/only.py"}));
}

TEST(ReportPayload, OverviewCardsFilesAndTopLines) {
  // GIVEN a result with 4 lines in two files under the root
  // WHEN the payload is built
  json p = Build(Result());
  // THEN the overview counts what the result holds
  EXPECT_EQ(p["format"], "linescope-report/1");
  EXPECT_EQ(p["overview"]["elapsed_ns"], 10'000'000);
  EXPECT_EQ(p["overview"]["snapshots"], 2);
  EXPECT_EQ(p["overview"]["functions"], 2);
  EXPECT_EQ(p["overview"]["executed_lines"], 4);
  EXPECT_EQ(p["warnings"], json({"something odd"}));
  // file names are shown relative to the root, in path order
  ASSERT_EQ(p["files"].size(), 2u);
  EXPECT_EQ(p["files"][0]["display"], "app.py");
  EXPECT_EQ(p["files"][1]["display"], "lib/util.py");
  // a file's time is the sum of its lines' own time (self where known, else wall)
  EXPECT_EQ(p["files"][0]["time_ns"], 1'000'000 + 5'000'000 + 100);
  EXPECT_EQ(p["files"][1]["time_ns"], 2'000'000);
  EXPECT_EQ(p["files"][0]["executed_lines"], 3);
  const json& hottest = p["lines"][p["files"][0]["hottest"].get<int>()];
  EXPECT_EQ(hottest["line"], 2);
  EXPECT_DOUBLE_EQ(p["files"][1]["share"].get<double>(), 2'000'000.0 / 8'000'100.0);
  // the source snapshot is split into lines
  EXPECT_EQ(p["files"][1]["source"], json({"a = 1", "b = 2", "c = a + b"}));
  // most expensive lines: by wall time, descending
  std::vector<int64_t> top;
  for (const json& i : p["overview"]["top_lines"])
    top.push_back(p["lines"][i.get<int>()]["time_ns"]);
  EXPECT_EQ(top, (std::vector<int64_t>{6'000'000, 5'000'000, 2'000'000, 100}));
  // derived per-line values
  EXPECT_DOUBLE_EQ(PayloadLine(p, "app.py", 5)["avg_ns"].get<double>(), 500'000.0);
}

TEST(ReportPayload, FunctionsLinkToTheirDefinitions) {
  json p = Build(Result());
  ASSERT_EQ(p["functions"].size(), 2u);
  const json& main = p["functions"][0];
  EXPECT_EQ(main["name"], "main");
  EXPECT_EQ(p["files"][main["file"].get<int>()]["path"], "/proj/app.py");
  EXPECT_EQ(main["line"], 1);
  EXPECT_DOUBLE_EQ(main["avg_ns"].get<double>(), 6'000'000.0);
  // zero calls: average unknown, not 0
  EXPECT_TRUE(p["functions"][1]["avg_ns"].is_null());
}

TEST(ReportPayload, UnknownValuesStayNull) {
  // GIVEN a sampled line (hits unknown) and an unknown elapsed time
  json r = Result();
  r["run"]["elapsed_ns"] = nullptr;
  // json::array(): clang reads a one-element braced list `{Line(...)}` as a copy of the element
  r["run"]["lines"] = json::array({Line("/proj/app.py", 5, 3'000, nullptr)});
  json p = Build(r);
  const json& l = p["lines"][0];
  EXPECT_TRUE(l["hits"].is_null());
  EXPECT_TRUE(l["avg_ns"].is_null());
  EXPECT_TRUE(l["self_ns"].is_null());
  EXPECT_TRUE(l["mem_bytes"].is_null());
  EXPECT_TRUE(p["overview"]["elapsed_ns"].is_null());
  EXPECT_EQ(p["overview"]["executed_lines"], 1);  // sampled: it ran
  EXPECT_FALSE(p["columns"]["self"].get<bool>());
  // no GPU and no memory collection: no sections, no columns, no per-line GPU fields
  EXPECT_TRUE(p["gpu"].is_null());
  EXPECT_TRUE(p["memory"].is_null());
  EXPECT_FALSE(p["columns"]["gpu"].get<bool>());
  EXPECT_FALSE(p["columns"]["memory"].get<bool>());
  EXPECT_FALSE(l.contains("gpu_time_ns"));
}

TEST(ReportPayload, DuplicateLinesAreMerged) {
  json r = Result();
  r["run"]["lines"] = {Line("/proj/app.py", 5, 3'000, 1), Line("/proj/app.py", 5, 2'000, 2)};
  json p = Build(r);
  ASSERT_EQ(p["lines"].size(), 1u);
  EXPECT_EQ(p["lines"][0]["time_ns"], 5'000);
  EXPECT_EQ(p["lines"][0]["hits"], 3);
}

TEST(ReportPayload, AMergedFieldWithAnUnknownPartIsUnknown) {
  // GIVEN a line reported twice, once without a hit count
  json r = Result();
  json unknown_hits = Line("/proj/app.py", 5, 5'000'000, 1);
  unknown_hits["hits"] = nullptr;
  r["run"]["lines"] = {unknown_hits, Line("/proj/app.py", 5, 1'000'000, 3)};
  json p = Build(r);
  // THEN its time adds, its hits (and so its avg/hit) are unknown, not 3
  ASSERT_EQ(p["lines"].size(), 1u);
  EXPECT_EQ(p["lines"][0]["time_ns"], 6'000'000);
  EXPECT_TRUE(p["lines"][0]["hits"].is_null());
  EXPECT_TRUE(p["lines"][0]["avg_ns"].is_null());
}

TEST(ReportPayload, HeatLevelsFollowTime) {
  json p = Build(Result());
  EXPECT_EQ(p["heat"]["levels"], kHeatLevels);
  EXPECT_EQ(p["heat"]["max_time_ns"], 6'000'000);
  EXPECT_EQ(PayloadLine(p, "app.py", 2)["heat"], kHeatLevels - 1);
  EXPECT_GT(PayloadLine(p, "app.py", 5)["heat"], PayloadLine(p, "lib/util.py", 3)["heat"]);
  EXPECT_GE(PayloadLine(p, "app.py", 6)["heat"], 1);
}

TEST(ReportHeat, LevelsAreMonotoneAndBounded) {
  EXPECT_EQ(HeatLevel(0, 100), 0);
  EXPECT_EQ(HeatLevel(5, 0), 0);
  EXPECT_EQ(HeatLevel(1, 1'000'000'000), 1);
  EXPECT_EQ(HeatLevel(100, 100), kHeatLevels - 1);
  int prev = 0;
  for (int64_t v = 0; v <= 1000; v += 7) {
    const int level = HeatLevel(v, 1000);
    EXPECT_GE(level, prev);
    prev = level;
  }
  EXPECT_EQ(HeatLevel(25, 100), 5);  // sqrt scale: ceil(9 * 0.5)
}

json WithMemory(json r) {
  r["options"]["memory"] = true;
  json timeline = json::array();
  for (int i = 0; i < 5000; ++i) timeline.push_back({i * 1000, 100 + (i == 3217 ? 900 : i % 10)});
  r["memory"] = {{"timeline", timeline}, {"start_rss_bytes", 100}, {"peak_rss_bytes", 1000},
                 {"end_rss_bytes", 150}, {"interval_ns", 1000},    {"per_line", true},
                 {"reason", nullptr},    {"source", "rss"}};
  r["run"]["lines"][1]["memory_bytes"] = 4096;
  r["run"]["lines"][1]["memory_peak_bytes"] = 1000;
  r["run"]["lines"][3]["memory_bytes"] = -1024;
  return r;
}

TEST(ReportPayload, MemorySectionWhenCollected) {
  json p = Build(WithMemory(Result()));
  const json& m = p["memory"];
  ASSERT_TRUE(m.is_object());
  EXPECT_EQ(m["start_bytes"], 100);
  EXPECT_EQ(m["peak_bytes"], 1000);
  EXPECT_EQ(m["end_bytes"], 150);
  EXPECT_EQ(m["change_bytes"], 50);
  EXPECT_EQ(m["peak_t_ns"], 3217 * 1000);
  EXPECT_EQ(m["samples"], 5000);
  // the timeline is bounded and keeps its peak
  EXPECT_LE(m["timeline"].size(), kMaxTimelinePoints);
  bool has_peak = false;
  for (const json& pt : m["timeline"]) has_peak = has_peak || pt[1] == 1000;
  EXPECT_TRUE(has_peak);
  EXPECT_EQ(m["lines"].size(), 2u);
  EXPECT_EQ(p["lines"][m["top_growth"].get<int>()]["mem_bytes"], 4096);
  EXPECT_TRUE(p["columns"]["memory"].get<bool>());
  EXPECT_TRUE(p["columns"]["memory_peak"].get<bool>());
  EXPECT_EQ(p["files"][0]["mem_bytes"], 4096);
}

TEST(ReportPayload, MemoryWithoutPerLineAttributionKeepsTheReason) {
  json r = WithMemory(Result());
  r["memory"]["per_line"] = false;
  r["memory"]["reason"] = "sampler too slow";
  for (json& l : r["run"]["lines"]) l["memory_bytes"] = nullptr, l["memory_peak_bytes"] = nullptr;
  json p = Build(r);
  EXPECT_EQ(p["memory"]["reason"], "sampler too slow");
  EXPECT_FALSE(p["columns"]["memory"].get<bool>());
  EXPECT_TRUE(p["memory"]["top_growth"].is_null());
}

json WithGpu(json r) {
  r["backend"] = "fake-gpu";
  r["options"]["gpu"] = true;
  r["run"]["lines"][0]["gpu"] = {{"time_ns", 4'000'000}, {"peak_memory_bytes", 1 << 20}};
  r["run"]["lines"][1]["gpu"] = {{"time_ns", 1'000'000}, {"peak_memory_bytes", 3 << 20}};
  r["gpu"] = {{"method", "nvml-sampled"},      {"time_available", true},
              {"memory_available", true},      {"time_reason", nullptr},
              {"memory_reason", nullptr},      {"devices", {"NVIDIA H200"}},
              {"utilization_scope", "device"}, {"diagnostics", {"utilization is device-wide"}}};
  return r;
}

TEST(ReportPayload, UnknownWallTimesAreNotSummedAsZero) {
  // GIVEN GPU-measured lines of which one has no wall time (a custom backend's None)
  json r = WithGpu(Result());
  r["run"]["lines"][0]["wall_time_ns"] = nullptr;
  json p = Build(r);
  // THEN the line's time is unknown, and the Driver time card sums the known one and says so
  const json& line0 = p["lines"][0];
  EXPECT_TRUE(line0["time_ns"].is_null());
  EXPECT_TRUE(line0["avg_ns"].is_null());
  EXPECT_EQ(p["gpu"]["driver"]["time_ns"], 5'000'000);
  EXPECT_EQ(p["gpu"]["driver"]["label"],
            "driver (host) wall time of 1 of the 2 GPU-measured lines (1 without a reported "
            "wall time)");
  // AND with no wall time at all the card has no value
  r["run"]["lines"][1]["wall_time_ns"] = nullptr;
  json q = Build(r);
  EXPECT_TRUE(q["gpu"]["driver"]["time_ns"].is_null());
  EXPECT_THAT(q["gpu"]["driver"]["label"].get<std::string>(), HasSubstr("unknown"));
}

TEST(ReportPayload, GpuSectionSumsMeasuredLines) {
  json p = Build(WithGpu(Result()));
  const json& g = p["gpu"];
  ASSERT_TRUE(g.is_object());
  EXPECT_TRUE(p["columns"]["gpu"].get<bool>());
  EXPECT_EQ(g["time"]["value_ns"], 5'000'000);  // 4 ms + 1 ms
  EXPECT_TRUE(g["time"]["notice"].is_null());
  EXPECT_EQ(g["memory"]["peak_bytes"], 3 << 20);  // the max, not a sum
  EXPECT_TRUE(g["memory"]["notice"].is_null());
  EXPECT_EQ(g["driver"]["time_ns"], 6'000'000 + 5'000'000);  // wall time of the measured lines
  EXPECT_EQ(g["driver"]["basis"], "measured-lines");
  EXPECT_EQ(g["lines"].size(), 2u);
  EXPECT_EQ(g["method"], "nvml-sampled");
  EXPECT_THAT(g["method_label"].get<std::string>(), HasSubstr("estimated"));
  EXPECT_THAT(g["scope_note"].get<std::string>(), HasSubstr("other processes"));
  EXPECT_EQ(g["devices"], json({"NVIDIA H200"}));
  // per-line GPU fields, unknown where the line was not measured
  EXPECT_EQ(PayloadLine(p, "app.py", 2)["gpu_time_ns"], 4'000'000);
  EXPECT_EQ(PayloadLine(p, "app.py", 2)["gpu_heat"], kHeatLevels - 1);
  EXPECT_TRUE(PayloadLine(p, "lib/util.py", 3)["gpu_time_ns"].is_null());
  EXPECT_TRUE(PayloadLine(p, "lib/util.py", 3)["gpu_heat"].is_null());
  EXPECT_EQ(p["files"][0]["gpu_time_ns"], 5'000'000);
  EXPECT_TRUE(p["files"][1]["gpu_time_ns"].is_null());
}

TEST(ReportPayload, GpuMemoryUnavailableCarriesTheRecordedReason) {
  json r = WithGpu(Result());
  r["gpu"]["memory_available"] = false;
  r["gpu"]["memory_reason"] = "NVML: per-process memory is not supported (WDDM)";
  for (json& l : r["run"]["lines"])
    if (l["gpu"].is_object()) l["gpu"]["peak_memory_bytes"] = nullptr;
  json p = Build(r);
  EXPECT_TRUE(p["gpu"]["memory"]["peak_bytes"].is_null());
  EXPECT_FALSE(p["gpu"]["memory"]["available"].get<bool>());
  EXPECT_EQ(p["gpu"]["memory"]["notice"], "NVML: per-process memory is not supported (WDDM)");
  EXPECT_EQ(p["gpu"]["time"]["value_ns"], 5'000'000);  // time sampling continues
}

TEST(ReportPayload, GpuMemoryUnavailableWithoutReasonSaysNoneWereRecorded) {
  json r = WithGpu(Result());
  r["gpu"]["memory_available"] = false;
  r["gpu"]["time_available"] = false;
  r["gpu"]["time_reason"] = "no NVIDIA device";
  for (json& l : r["run"]["lines"]) l["gpu"] = nullptr;
  json p = Build(r);
  EXPECT_EQ(p["gpu"]["memory"]["notice"], "no GPU memory measurements were recorded");
  EXPECT_EQ(p["gpu"]["time"]["notice"], "no NVIDIA device");
  EXPECT_TRUE(p["gpu"]["time"]["value_ns"].is_null());
  // no measured line: driver time falls back to the elapsed time
  EXPECT_EQ(p["gpu"]["driver"]["time_ns"], 10'000'000);
  EXPECT_EQ(p["gpu"]["driver"]["basis"], "elapsed");
  EXPECT_TRUE(p["gpu"]["lines"].empty());
}

TEST(ReportPayload, ACollectionThatSaysUnavailableIsBelievedOverLineValues) {
  // GIVEN a collection that marks GPU time and memory unavailable (no reason) while its lines
  // still carry GPU values (a custom backend that contradicts itself)
  json r = WithGpu(Result());
  r["gpu"]["time_available"] = false;
  r["gpu"]["memory_available"] = false;
  json p = Build(r);
  // THEN the cards agree with the headline: no value, the notice that none were recorded
  EXPECT_EQ(p["gpu"]["headline"].get<std::string>().rfind("No GPU values were measured", 0), 0u);
  EXPECT_TRUE(p["gpu"]["time"]["value_ns"].is_null());
  EXPECT_EQ(p["gpu"]["time"]["notice"], "no GPU time measurements were recorded");
  EXPECT_TRUE(p["gpu"]["memory"]["peak_bytes"].is_null());
  EXPECT_EQ(p["gpu"]["memory"]["notice"], "no GPU memory measurements were recorded");
  // AND the driver time is the host wall time of the lines that carry GPU values
  EXPECT_THAT(p["gpu"]["driver"]["label"].get<std::string>(),
              ::testing::HasSubstr("driver (host) wall time of the"));
}

TEST(ReportPayload, GpuRequestedFromABackendWithoutGpuHasNoGpuViewOrColumns) {
  // GIVEN gpu=True with the trace backend (capabilities.gpu false: a warning, no result.gpu)
  json r = Result();
  r["options"]["gpu"] = true;
  r["warnings"].push_back("GPU profiling is not supported by the 'trace' backend");
  json p = Build(r);
  // THEN there is no GPU section and no GPU column; the diagnostic is among the warnings
  EXPECT_TRUE(p["gpu"].is_null());
  EXPECT_FALSE(p["columns"]["gpu"].get<bool>());
  EXPECT_FALSE(PayloadLine(p, "app.py", 2).contains("gpu_time_ns"));
  EXPECT_FALSE(p["files"][0].contains("gpu_time_ns"));
  EXPECT_THAT(p["warnings"].dump(), HasSubstr("not supported by the 'trace' backend"));
}

TEST(ReportPayload, GpuFalseOnAGpuCapableBackendHasNoGpuView) {
  json r = Result();
  r["capabilities"]["gpu"] = true;
  json p = Build(r);
  EXPECT_TRUE(p["gpu"].is_null());
  EXPECT_FALSE(p["columns"]["gpu"].get<bool>());
}

// A custom backend that declares the gpu capability and returns GPU values only through
// RawLine.gpu (RawBackendResult.gpu = None, so result.gpu is null).
json CustomPerLineGpu() {
  json r = Result();
  r["backend"] = "withgpu";
  r["capabilities"]["gpu"] = true;
  r["options"]["gpu"] = true;
  r["run"]["lines"][0]["gpu"] = {{"time_ns", 120'000'000}, {"peak_memory_bytes", 3 << 20}};
  r["run"]["lines"][1]["gpu"] = {{"time_ns", nullptr}, {"peak_memory_bytes", 1 << 20}};
  r["run"]["lines"][2]["gpu"] = {{"time_ns", 5'000'000}, {"peak_memory_bytes", nullptr}};
  return r;
}

TEST(ReportPayload, CustomBackendWithPerLineGpuOnlyShowsItsValues) {
  json p = Build(CustomPerLineGpu());
  const json& g = p["gpu"];
  ASSERT_TRUE(g.is_object());
  // THEN the GPU columns exist and carry the per-line values (unknown stays null)
  EXPECT_TRUE(p["columns"]["gpu"].get<bool>());
  EXPECT_EQ(PayloadLine(p, "app.py", 2)["gpu_time_ns"], 120'000'000);
  EXPECT_EQ(PayloadLine(p, "app.py", 2)["gpu_peak_bytes"], 3 << 20);
  EXPECT_TRUE(PayloadLine(p, "app.py", 5)["gpu_time_ns"].is_null());
  EXPECT_EQ(PayloadLine(p, "app.py", 5)["gpu_peak_bytes"], 1 << 20);
  EXPECT_TRUE(PayloadLine(p, "lib/util.py", 3)["gpu_time_ns"].is_null());
  EXPECT_EQ(p["files"][0]["gpu_time_ns"], 125'000'000);
  // the cards: totals from the lines, available, no notice
  EXPECT_FALSE(g["collected"].get<bool>());
  EXPECT_TRUE(g["measured"].get<bool>());
  EXPECT_EQ(g["time"]["value_ns"], 125'000'000);
  EXPECT_TRUE(g["time"]["available"].get<bool>());
  EXPECT_TRUE(g["time"]["notice"].is_null());
  EXPECT_EQ(g["memory"]["peak_bytes"], 3 << 20);
  EXPECT_TRUE(g["memory"]["notice"].is_null());
  EXPECT_EQ(g["lines"].size(), 3u);
  // a neutral method label, never a claim that the backend collects nothing
  EXPECT_TRUE(g["method"].is_null());
  EXPECT_EQ(g["method_label"], "reported by the 'withgpu' backend");
  EXPECT_EQ(g["headline"], "GPU numbers: reported by the 'withgpu' backend");
  EXPECT_THAT(p.dump(), Not(HasSubstr("does not collect")));
}

TEST(ReportPayload, LinesOutsideTheCapturedSourceAreLeftOutOfEveryTotalAndListed) {
  // GIVEN a custom backend's GPU lines: two inside app.py (6 lines), worker.py:99 in a
  // 6-line file, and gone.py, whose source was not captured, each with 1000 s of GPU time
  json r = CustomPerLineGpu();
  r["sources"]["/proj/worker.py"] = "a\nb\nc\nd\ne\nf\n";
  json far = Line("/proj/worker.py", 99, 7'000'000, 1);
  far["gpu"] = {{"time_ns", 1'000'000'000'000}, {"peak_memory_bytes", 1LL << 40}};
  json gone = Line("/proj/gone.py", 4, 8'000'000, 1);
  gone["gpu"] = {{"time_ns", 1'000'000'000'000}, {"peak_memory_bytes", nullptr}};
  json zero = Line("/proj/app.py", 0, 9'000'000, 1);
  r["run"]["lines"].push_back(far);
  r["run"]["lines"].push_back(gone);
  r["run"]["lines"].push_back(zero);
  r["run"]["lines"].push_back(far);  // reported twice: listed once
  // WHEN the payload is built
  json p = Build(r);
  // THEN GPU totals and every other total count only the lines inside a captured source
  EXPECT_EQ(p["gpu"]["time"]["value_ns"], 125'000'000);
  EXPECT_EQ(p["gpu"]["memory"]["peak_bytes"], 3 << 20);
  EXPECT_EQ(p["gpu"]["lines"].size(), 3u);
  EXPECT_EQ(p["lines"].size(), 4u);
  EXPECT_EQ(p["overview"]["executed_lines"], 4);
  EXPECT_EQ(p["overview"]["line_time_ns"], 1'000'000 + 5'000'000 + 100 + 2'000'000);
  EXPECT_EQ(p["heat"]["max_time_ns"], 6'000'000);
  for (const json& l : p["lines"]) {
    const json& f = p["files"][l["file"].get<int>()];
    ASSERT_TRUE(f["source"].is_array());
    EXPECT_GE(l["line"], 1);
    EXPECT_LE(l["line"].get<size_t>(), f["source"].size());
  }
  // a file known only from left-out lines is not listed; a captured one stays
  std::set<std::string> names;
  for (const json& f : p["files"]) names.insert(f["display"].get<std::string>());
  EXPECT_EQ(names, (std::set<std::string>{"app.py", "lib/util.py", "worker.py"}));
  // AND the diagnostic lists each left-out line once, saying why
  const json& d = p["dropped"];
  ASSERT_TRUE(d.is_object());
  EXPECT_EQ(d["count"], 3);
  EXPECT_EQ(d["gpu_time_ns"], 3'000'000'000'000);  // worker.py:99 twice
  EXPECT_EQ(d["message"],
            "3 lines outside the captured source were left out of every table and total: "
            "app.py:0 (the file has 6 lines), gone.py:4 (no source was captured), "
            "worker.py:99 (the file has 6 lines).");
  EXPECT_EQ(d["lines"][2]["location"], "worker.py:99");
  EXPECT_EQ(d["lines"][2]["reason"], "outside-file");
  EXPECT_EQ(d["lines"][2]["time_ns"], 14'000'000);
  EXPECT_EQ(d["lines"][1]["reason"], "no-source");
}

TEST(ReportPayload, NoLeftOutLinesNoDiagnosticAndTheListIsBounded) {
  EXPECT_TRUE(Build(Result())["dropped"].is_null());
  json r = Result();
  for (int i = 0; i < 13; ++i) r["run"]["lines"].push_back(Line("/proj/app.py", 100 + i, 1, 1));
  const std::string message = Build(r)["dropped"]["message"];
  EXPECT_THAT(message, HasSubstr("13 lines outside"));
  EXPECT_THAT(message, HasSubstr("app.py:109 (the file has 6 lines) and 3 more."));
  EXPECT_THAT(message, Not(HasSubstr("app.py:110")));
}

TEST(ReportPayload, RunStatusIsSuccessUnlessTheResultSaysItFailed) {
  // GIVEN a result from before run.status existed
  json p = Build(Result());
  EXPECT_EQ(p["status"], "success");
  EXPECT_TRUE(p["error"].is_null());
  EXPECT_EQ(p["backend"], "trace");
  // a failed run carries its error
  json r = Result();
  r["run"]["status"] = "failed";
  r["run"]["error"] = "ZeroDivisionError: division by zero";
  p = Build(r);
  EXPECT_EQ(p["status"], "failed");
  EXPECT_EQ(p["error"], "ZeroDivisionError: division by zero");
  // an explicit success with a null error
  r["run"]["status"] = "success";
  r["run"]["error"] = nullptr;
  EXPECT_EQ(Build(r)["status"], "success");
  // an error without a status is a failure
  r["run"].erase("status");
  r["run"]["error"] = "boom";
  EXPECT_EQ(Build(r)["status"], "failed");
}

TEST(ReportPayload, SamplingBackendsHaveNoHitsColumn) {
  // GIVEN a sampling backend's result: no hit counts, samples instead
  json r = Result();
  r["backend"] = "sampler";
  r["capabilities"]["sampled"] = true;
  r["capabilities"]["hit_counts"] = false;
  for (json& l : r["run"]["lines"]) {
    l["hits"] = nullptr;
    l["samples"] = 3;
  }
  json p = Build(r);
  EXPECT_FALSE(p["columns"]["hits"].get<bool>());
  EXPECT_TRUE(p["columns"]["samples"].get<bool>());
  EXPECT_TRUE(p["sampled"].get<bool>());
  // nor Calls / Avg/call in the functions table when no function has a call count
  for (json& f : r["run"]["functions"]) f["calls"] = nullptr;
  EXPECT_FALSE(Build(r)["columns"]["function_calls"].get<bool>());
  // a tracing backend has the columns, also before any line ran
  EXPECT_TRUE(Build(Result())["columns"]["hits"].get<bool>());
  EXPECT_TRUE(Build(Result())["columns"]["function_calls"].get<bool>());
  json empty = Result();
  empty["run"]["lines"] = json::array();
  EXPECT_TRUE(Build(empty)["columns"]["hits"].get<bool>());
  // a sampling backend whose lines do carry counts shows them
  r["run"]["lines"][0]["hits"] = 2;
  EXPECT_TRUE(Build(r)["columns"]["hits"].get<bool>());
}

TEST(ReportPayload, FunctionsThatNeverRanHaveZeroCallsAndNoBar) {
  // GIVEN `work` listed with 0 calls and zero times, `main` with 1 call
  json r = Result();
  r["run"]["functions"][1]["calls"] = 0;
  r["run"]["functions"][1]["total_time_ns"] = 0;
  r["run"]["functions"][1]["own_time_ns"] = 0;
  json p = Build(r);
  const json& main = p["functions"][0];
  const json& work = p["functions"][1];
  EXPECT_TRUE(main["ran"].get<bool>());
  EXPECT_DOUBLE_EQ(main["share"].get<double>(), 1.0);
  EXPECT_FALSE(work["ran"].get<bool>());
  EXPECT_EQ(work["calls"], 0);  // a count, not unknown
  EXPECT_TRUE(work["share"].is_null());
  EXPECT_TRUE(work["avg_ns"].is_null());
  EXPECT_EQ(p["overview"]["functions"], 2);
  EXPECT_EQ(p["overview"]["functions_never_ran"], 1);
  // unknown calls are not "never ran"
  r["run"]["functions"][1]["calls"] = nullptr;
  EXPECT_TRUE(Build(r)["functions"][1]["ran"].get<bool>());
}

TEST(ReportPayload, SymbolsInsideCapturedSourcesAreCallTargets) {
  // GIVEN symbols: two valid definitions, one past the file's end, one in an uncaptured
  // file, a <module> pseudo-symbol and a duplicate
  json r = Result();
  r["symbols"] = {{{"qualname", "main"}, {"filename", "/proj/app.py"}, {"line", 1}},
                  {{"qualname", "Box.work"}, {"filename", "/proj/app.py"}, {"line", 4}},
                  {{"qualname", "far"}, {"filename", "/proj/app.py"}, {"line", 60}},
                  {{"qualname", "lost"}, {"filename", "/elsewhere/x.py"}, {"line", 1}},
                  {{"qualname", "<module>"}, {"filename", "/proj/app.py"}, {"line", 1}},
                  {{"qualname", "main"}, {"filename", "/proj/app.py"}, {"line", 1}}};
  json p = Build(r);
  // THEN only the two definitions remain, named as a call spells them
  ASSERT_EQ(p["symbols"].size(), 2u);
  EXPECT_EQ(p["symbols"][0],
            (json{{"name", "main"}, {"qualname", "main"}, {"file", 0}, {"line", 1}}));
  EXPECT_EQ(p["symbols"][1]["name"], "work");
  EXPECT_EQ(p["symbols"][1]["qualname"], "Box.work");
  EXPECT_EQ(p["symbols"][1]["line"], 4);
}

TEST(ReportPayload, CustomBackendWithoutGpuValuesSaysNoneWereRecorded) {
  json r = CustomPerLineGpu();
  for (json& l : r["run"]["lines"]) l["gpu"] = nullptr;
  json p = Build(r);
  const json& g = p["gpu"];
  ASSERT_TRUE(g.is_object());
  EXPECT_TRUE(p["columns"]["gpu"].get<bool>());
  EXPECT_FALSE(g["measured"].get<bool>());
  EXPECT_EQ(g["time"]["notice"], "no GPU time measurements were recorded");
  EXPECT_EQ(g["memory"]["notice"], "no GPU memory measurements were recorded");
  EXPECT_EQ(g["headline"], "No GPU values were measured: no GPU collection method was recorded.");
}

TEST(ReportPayload, NothingMeasuredHeadlineMakesNoClaimAboutTheMethod) {
  // GIVEN an NVML collection whose every read failed
  json r = WithGpu(Result());
  r["gpu"]["time_available"] = false;
  r["gpu"]["memory_available"] = false;
  r["gpu"]["time_reason"] = "every GPU utilization read failed (Unknown Error (NVML error 999))";
  for (json& l : r["run"]["lines"]) l["gpu"] = nullptr;
  json p = Build(r);
  const json& g = p["gpu"];
  EXPECT_FALSE(g["measured"].get<bool>());
  EXPECT_EQ(g["headline"], "No GPU values were measured (collection method: nvml-sampled).");
  EXPECT_TRUE(g["aggregation_note"].is_null());
  EXPECT_EQ(g["time"]["notice"],
            "every GPU utilization read failed (Unknown Error (NVML error 999))");
}

TEST(ReportPayload, NoMethodRecordedIsACleanSentence) {
  // GIVEN a GPU-capable backend that found no device (method null, nothing measured)
  json r = Result();
  r["backend"] = "scalene";
  r["capabilities"]["gpu"] = true;
  r["options"]["gpu"] = true;
  r["gpu"] = {{"method", nullptr},
              {"time_available", false},
              {"memory_available", false},
              {"time_reason", "no supported GPU was found"},
              {"memory_reason", "no supported GPU was found"},
              {"devices", json::array()},
              {"utilization_scope", nullptr},
              {"diagnostics", json::array()}};
  json p = Build(r);
  EXPECT_EQ(p["gpu"]["headline"],
            "No GPU values were measured: no GPU collection method was recorded.");
  EXPECT_THAT(p["gpu"]["headline"].get<std::string>(), Not(HasSubstr("\u2014")));
  EXPECT_EQ(p["gpu"]["time"]["notice"], "no supported GPU was found");
}

TEST(ReportPayload, AMethodTheReportDoesNotKnowIsNamedOnceInTheHeadline) {
  // GIVEN a custom backend's GPUCollection with its own method name
  json r = WithGpu(Result());
  r["backend"] = "mine";
  r["gpu"]["method"] = "mymethod";
  const json g = Build(r)["gpu"];
  // THEN the label quotes it, and the headline does not repeat it in front
  EXPECT_EQ(g["method_label"], "reported by the 'mine' backend as 'mymethod'");
  EXPECT_EQ(g["headline"], "GPU numbers: reported by the 'mine' backend as 'mymethod'");
}

TEST(ReportPayload, SaysHowGpuTimeCombinesOverGpus) {
  // GIVEN two GPUs: the native sampler sums busy time, Scalene averages utilization
  json r = WithGpu(Result());
  r["gpu"]["devices"] = {"GPU A", "GPU B"};
  json sum = Build(r)["gpu"];
  EXPECT_EQ(sum["aggregation"], "sum");
  EXPECT_THAT(sum["aggregation_note"].get<std::string>(),
              HasSubstr("summed over GPUs (2 devices here)"));
  EXPECT_EQ(sum["headline"],
            "GPU numbers: nvml-sampled \u2014 estimated from sampled GPU utilization (NVML)");
  r["gpu"]["method"] = "scalene-nvml";
  json mean = Build(r)["gpu"];
  EXPECT_EQ(mean["aggregation"], "mean");
  EXPECT_THAT(mean["aggregation_note"].get<std::string>(),
              HasSubstr("averaged over GPUs (2 devices here)"));
  EXPECT_THAT(mean["method_label"].get<std::string>(), HasSubstr("Scalene"));
  // one GPU: nothing to combine, but still said
  r["gpu"]["devices"] = {"GPU A"};
  EXPECT_THAT(Build(r)["gpu"]["aggregation_note"].get<std::string>(), HasSubstr("1 GPU"));
  // an unknown method: not said
  r["gpu"]["method"] = "my-method";
  EXPECT_TRUE(Build(r)["gpu"]["aggregation"].is_null());
  EXPECT_TRUE(Build(r)["gpu"]["aggregation_note"].is_null());
}

TEST(ReportPayload, RejectsWhatIsNotAResult) {
  EXPECT_THAT(BuildReportPayload("{nope").error(), HasSubstr("not valid JSON"));
  EXPECT_THAT(BuildReportPayload(R"({"format": "other/1"})").error(),
              HasSubstr("not a linescope-result/1 document"));
  json r = Result();
  r["run"]["lines"][0]["wall_time_ns"] = "fast";
  EXPECT_THAT(BuildReportPayload(r.dump()).error(), HasSubstr("wall_time_ns"));
}

TEST(ReportDownsample, KeepsPeaksEndsAndTheBound) {
  std::vector<std::pair<int64_t, int64_t>> pts;
  for (int i = 0; i < 10'000; ++i) pts.emplace_back(i, i == 7777 ? 1'000'000 : i % 3);
  auto out = DownsampleKeepPeaks(pts, 100);
  EXPECT_LE(out.size(), 100u);
  EXPECT_EQ(out.front(), pts.front());
  EXPECT_EQ(out.back(), pts.back());
  EXPECT_NE(std::find(out.begin(), out.end(), std::make_pair<int64_t, int64_t>(7777, 1'000'000)),
            out.end());
  for (size_t i = 1; i < out.size(); ++i) EXPECT_LT(out[i - 1].first, out[i].first);
  EXPECT_EQ(DownsampleKeepPeaks(pts, 20'000).size(), pts.size());
}

TEST(ReportPayload, LongSourceLinesAreCutWithAnEllipsis) {
  // GIVEN a snapshot with a 2.7 MB generated line, a line of exactly the limit, and a long
  // line of two-byte characters
  json r = Result();
  const std::string huge = "x = '" + std::string(2'700'000, 'a') + "'";
  const std::string limit(kMaxSourceLineChars, 'b');
  std::string wide;
  for (size_t i = 0; i < kMaxSourceLineChars + 5; ++i) wide += "\xC3\xA9";  // é
  r["sources"]["/proj/lib/util.py"] = "a = 1\n" + huge + "\n" + limit + "\n" + wide + "\n";
  // WHEN the payload is built
  const json src = Build(r)["files"][1]["source"];
  // THEN the long lines keep their first kMaxSourceLineChars - 1 characters and end in "…",
  // the others are whole, and no line number moves
  ASSERT_EQ(src.size(), 4u);
  EXPECT_EQ(src[0], "a = 1");
  EXPECT_EQ(src[1], huge.substr(0, kMaxSourceLineChars - 1) + "\xE2\x80\xA6");
  EXPECT_EQ(src[2], limit);
  std::string cut;
  for (size_t i = 0; i + 1 < kMaxSourceLineChars; ++i) cut += "\xC3\xA9";
  EXPECT_EQ(src[3], cut + "\xE2\x80\xA6");
  // and the page stays small: the huge line is not in it, whole or repeated
  const std::string html = RenderReportHtml(Build(r).dump());
  EXPECT_LT(html.size(), 2'000'000u);
}

// ---- rendering ---------------------------------------------------------------------------

size_t Count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

TEST(ReportHtml, SourcesCannotEndTheDataScript) {
  // GIVEN a source that contains a closing script tag and an HTML comment opener
  json r = Result();
  r["sources"]["/proj/app.py"] = "s = '</script><script>alert(1)</script>'\n# <!-- x\n";
  json p = Build(r);
  const std::string html = RenderReportHtml(p.dump());
  // THEN the only </script> tags are the page's own two, and the data survives
  EXPECT_EQ(Count(html, "</script>"), 2u);
  EXPECT_THAT(html, Not(HasSubstr("<!-- x")));
  const size_t open = html.find("id=\"linescope-data\">");
  ASSERT_NE(open, std::string::npos);
  const size_t start = html.find('>', open) + 1;
  const std::string data = html.substr(start, html.find("</script>", start) - start);
  json back = json::parse(data);
  EXPECT_EQ(back["files"][0]["source"][0], "s = '</script><script>alert(1)</script>'");
}

TEST(ReportHtml, IsSelfContained) {
  const std::string html = RenderReportHtml(Build(WithGpu(WithMemory(Result()))).dump());
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u);
  // no external resource: no src/href to a URL, no stylesheet links, no script files
  EXPECT_FALSE(std::regex_search(
      html, std::regex(R"((src|href)\s*=\s*["']?\s*(https?:)?//)", std::regex::icase)));
  EXPECT_FALSE(std::regex_search(html, std::regex(R"(<script[^>]*\bsrc\s*=)", std::regex::icase)));
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  EXPECT_THAT(html, Not(HasSubstr("@import")));
  EXPECT_THAT(html, Not(HasSubstr("fetch(")));
  EXPECT_THAT(html, Not(HasSubstr("XMLHttpRequest")));
  EXPECT_THAT(html, Not(HasSubstr("import(")));
  // and a policy that forbids any request the page might still try
  EXPECT_THAT(html, HasSubstr("Content-Security-Policy\" content=\"default-src 'none'"));
  // every embedded module and the stylesheet are inlined
  for (const WebAsset& m : EmbeddedModules()) EXPECT_THAT(html, HasSubstr("// ---- web/" + m.path));
  EXPECT_THAT(html, HasSubstr(".heat-9"));
  EXPECT_THAT(html, Not(HasSubstr("{{")));
}

TEST(ReportBundle, EmbeddedAssetsFollowTheConvention) {
  ASSERT_FALSE(EmbeddedModules().empty());
  EXPECT_EQ(EmbeddedModules().back().path, "report/app.js");
  auto bundle = BundleModules(EmbeddedModules());
  ASSERT_TRUE(bundle.ok()) << bundle.error();
  EXPECT_THAT(bundle.value(), HasSubstr("globalThis.__linescope"));
  EXPECT_THAT(bundle.value(), Not(HasSubstr("\nimport ")));
  EXPECT_THAT(bundle.value(), Not(HasSubstr("\nexport ")));
}

TEST(ReportBundle, RewritesImportsAndExports) {
  std::vector<WebAsset> mods = {
      {"lib/a.js", "export function twice(x) {\n  return 2 * x;\n}\nexport const k2 = 3;\n"},
      {"report/b.js",
       "import { twice, k2 as three } from \"../lib/a.js\";\n"
       "export const six = twice(three);\n"}};
  auto bundle = BundleModules(mods);
  ASSERT_TRUE(bundle.ok()) << bundle.error();
  EXPECT_THAT(bundle.value(), HasSubstr("const { twice, k2: three } = __ls_m0;"));
  EXPECT_THAT(bundle.value(), HasSubstr("return { twice, k2 };"));
  EXPECT_THAT(bundle.value(), HasSubstr("return { six };"));
}

TEST(ReportBundle, ConventionViolationsNameTheModuleAndLine) {
  auto err = [](std::vector<WebAsset> m) { return BundleModules(m).error(); };
  EXPECT_THAT(
      err({{"a.js", "import { x } from \"./later.js\";\n"}, {"later.js", "export const x = 1;\n"}}),
      HasSubstr("web/a.js:1: imports later.js, which is not listed before it"));
  EXPECT_THAT(err({{"a.js", "export const x = 1;\n"}, {"b.js", "import { y } from \"./a.js\";\n"}}),
              HasSubstr("a.js does not export y"));
  EXPECT_THAT(err({{"a.js", "const x = 1;\nexport default x;\n"}}),
              HasSubstr("web/a.js:2: exports must be declarations"));
  EXPECT_THAT(err({{"a.js", "import { x } from \"https://cdn.example/x.js\";\n"}}),
              HasSubstr("must be relative"));
  EXPECT_THAT(err({{"a.js", "const s = \"</script>\";\n"}}),
              HasSubstr("would end the inline script"));
}

}  // namespace
}  // namespace gpuprof::lines
