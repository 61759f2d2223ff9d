#include "lines/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lines/json_fields.h"
#include "lines/spark.h"

namespace gpuprof::lines {
namespace {

using json_fields::Add;
using json_fields::AddParts;
using json_fields::Field;
using json_fields::J;
using json_fields::Max;
using json_fields::MaxParts;
using json_fields::OptInt;
using nlohmann::json;

// ---- reading the linescope-result/1 document ---------------------------------------------
// A field that is missing or null is unknown. A present field of the wrong type is an error
// (thrown as ReadError, turned into a Status at the API boundary).

struct ReadError {
  std::string message;
};

OptInt Int(const json& obj, const char* key) {
  const json& v = Field(obj, key);
  if (v.is_null()) return std::nullopt;
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) return std::nullopt;
    return static_cast<int64_t>(std::llround(d));
  }
  throw ReadError{std::string("field '") + key + "' must be a number or null"};
}

std::optional<double> Real(const json& obj, const char* key) {
  const json& v = Field(obj, key);
  if (v.is_null()) return std::nullopt;
  if (v.is_number()) return v.get<double>();
  throw ReadError{std::string("field '") + key + "' must be a number or null"};
}

std::optional<std::string> Str(const json& obj, const char* key) {
  const json& v = Field(obj, key);
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return v.get<std::string>();
  throw ReadError{std::string("field '") + key + "' must be a string or null"};
}

bool Bool(const json& obj, const char* key) {
  const json& v = Field(obj, key);
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  throw ReadError{std::string("field '") + key + "' must be true or false"};
}

const json& Array(const json& obj, const char* key) {
  static const json kEmpty = json::array();
  const json& v = Field(obj, key);
  if (v.is_null()) return kEmpty;
  if (!v.is_array()) throw ReadError{std::string("field '") + key + "' must be a list"};
  return v;
}

std::vector<std::string> Strings(const json& obj, const char* key) {
  std::vector<std::string> out;
  for (const json& s : Array(obj, key)) {
    if (!s.is_string()) throw ReadError{std::string("field '") + key + "' must hold strings"};
    out.push_back(s.get<std::string>());
  }
  return out;
}

// ---- the model the payload is computed from ------------------------------------------------

struct Line {
  int file = 0;
  int64_t line = 0;
  int64_t time_ns = 0;     // inclusive wall time (driver time); 0 when unknown
  bool time_known = true;  // the backend reported a wall time (not None)
  OptInt self_ns, hits, calls, cpu_ns, samples, mem_bytes, mem_peak_bytes;
  OptInt gpu_time_ns, gpu_peak_bytes;
  bool gpu_present = false;  // the backend returned a GPUStats for the line

  // Time spent on the line itself: self time where known, else the wall time. Additive over
  // lines (inclusive wall times are not: a caller's line contains its callees' lines).
  int64_t own_ns() const { return self_ns.value_or(time_ns); }
  bool gpu_measured() const { return gpu_present && (gpu_time_ns || gpu_peak_bytes); }
};

struct Function {
  std::string name;
  int file = 0;
  int64_t line = 0;
  OptInt total_ns, own_ns, calls;
};

struct File {
  std::string path;
  std::string display;
  std::optional<std::vector<std::string>> source;  // snapshot, one entry per line
};

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string row = text.substr(start, end - start);
    if (!row.empty() && row.back() == '\r') row.pop_back();
    out.push_back(std::move(row));
    start = end + 1;
  }
  return out;
}

std::string Directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

bool Under(const std::string& path, const std::string& dir) {
  return !dir.empty() && path.size() > dir.size() + 1 && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

// The deepest directory that holds every path for which `take` is true ("" when none does).
template <typename Pred>
std::string CommonDirectory(const std::vector<File>& files, Pred take) {
  std::string common;
  bool first = true;
  for (const File& f : files) {
    if (!take(f)) continue;
    const std::string dir = Directory(f.path);
    if (first) {
      common = dir;
      first = false;
      continue;
    }
    while (!common.empty() && !(dir == common || Under(dir, common))) common = Directory(common);
  }
  return common;
}

std::string RelativeTo(const std::string& path, const std::string& dir) {
  return Under(path, dir) ? path.substr(dir.size() + 1) : path;
}

// Display names: relative to the profile root when a file lies under it; otherwise relative
// to the deepest directory the files outside the root share (or the path itself). A file
// outside the root whose name would be another file's (proj/util.py under the root and
// vendor/util.py beside it both "util.py") is named relative to the directory all files
// share instead, or by its full path: two files never show the same name.
void AssignDisplayNames(std::vector<File>* files, const std::optional<std::string>& root) {
  auto under_root = [&](const File& f) { return root && Under(f.path, *root); };
  const std::string outside =
      CommonDirectory(*files, [&](const File& f) { return !under_root(f); });
  for (File& f : *files) {
    f.display = under_root(f) ? RelativeTo(f.path, *root) : RelativeTo(f.path, outside);
  }
  std::map<std::string, int> uses;
  for (const File& f : *files) ++uses[f.display];
  const std::string all = CommonDirectory(*files, [](const File&) { return true; });
  for (File& f : *files) {
    if (uses[f.display] > 1 && !under_root(f)) f.display = RelativeTo(f.path, all);
  }
  uses.clear();
  for (const File& f : *files) ++uses[f.display];
  for (File& f : *files) {
    if (uses[f.display] > 1 && !under_root(f)) f.display = f.path;
  }
}

// What produced the GPU numbers, in words; `backend` names a backend that reports per-line
// GPU values without a collection method (a custom backend's RawLine.gpu).
std::string MethodLabel(const std::optional<std::string>& method, const std::string& backend) {
  if (!method) return "reported by the '" + backend + "' backend";
  if (*method == "nvml-sampled") return "estimated from sampled GPU utilization (NVML)";
  if (*method == "cupti") return "measured kernel time (CUPTI)";
  if (*method == "neuron-sampled") return "estimated from sampled NeuronCore utilization";
  if (*method == "mock-sampled")
    return "simulated by gpuprof's mock GPU collector (GPUPROF_GPU_BACKEND=mock), not measured";
  if (*method == "scalene-nvml") return "Scalene's estimate from sampled GPU utilization (NVML)";
  if (*method == "scalene-neuron-monitor")
    return "Scalene's estimate from sampled NeuronCore utilization (neuron-monitor)";
  if (*method == "backend") return "reported by the '" + backend + "' backend";
  if (*method == "scalene") return "estimated by Scalene's GPU sampling";
  return "reported by the '" + backend + "' backend as '" + *method + "'";
}

// How GPU time of several GPUs combines into one line's GPU time, by collection method:
// "sum" (busy time adds over GPUs: two GPUs 50 % busy for 1 s give 1 s), "mean" (Scalene
// averages the utilization over GPUs: the same give 0.5 s), or nullopt (not known).
std::optional<std::string> GpuAggregation(const std::optional<std::string>& method) {
  if (!method) return std::nullopt;
  if (*method == "nvml-sampled" || *method == "neuron-sampled" || *method == "cupti") return "sum";
  if (*method == "scalene-nvml" || *method == "scalene-neuron-monitor") return "mean";
  return std::nullopt;
}

// A line the backend reported that is not inside a captured source: its file has no
// snapshot, or its number is not a line of the snapshot (a custom backend's worker.py:99 in a
// 6-line file). Such a line is left out of every table and total and listed in a diagnostic.
struct DroppedLine {
  std::string display;  // the file's display name among all reported files
  int64_t line = 0;
  int64_t source_lines = -1;  // lines of the file's snapshot; -1: no snapshot
  OptInt time_ns, gpu_time_ns;
};

// A function definition the source view can link a call to.
struct SymbolRef {
  std::string name;  // the last part of the qualified name: what a call spells
  std::string qualname;
  int file = 0;
  int64_t line = 0;
};

struct Result {
  std::optional<double> started_at;
  OptInt elapsed_ns;
  std::string backend;
  std::vector<std::string> warnings;
  bool gpu_requested = false;
  bool gpu_capable = false;  // capabilities.gpu: the backend declares GPU collection
  bool memory_requested = false;
  std::optional<std::string> root;
  std::vector<File> files;
  std::vector<Line> lines;  // sorted by (file, line), duplicates merged
  std::vector<Function> functions;
  json memory;  // the result's MemoryProfile or null
  json gpu;     // the result's GPUCollection or null
  size_t snapshots = 0;
  // run.status / run.error (absent: a successful run).
  std::string status = "success";
  std::optional<std::string> error;
  // capabilities.hit_counts / capabilities.sampled (absent: counts, not sampled).
  bool hit_counts = true;
  bool sampled = false;
  std::vector<DroppedLine> dropped;  // lines outside the captured source, left out
  std::vector<SymbolRef> symbols;    // definitions inside captured sources
};

Result Read(const json& doc) {
  if (!doc.is_object()) throw ReadError{"the result must be a JSON object"};
  const auto format = Str(doc, "format");
  if (format != kResultFormat) {
    throw ReadError{"not a " + std::string(kResultFormat) + " document (format is " +
                    (format ? "'" + *format + "'" : std::string("missing")) + ")"};
  }
  Result r;
  const json& run = Field(doc, "run");
  if (!run.is_object()) throw ReadError{"field 'run' must be an object"};
  r.elapsed_ns = Int(run, "elapsed_ns");
  r.started_at = Real(run, "started_at");
  r.backend = Str(doc, "backend").value_or("unknown");
  r.warnings = Strings(doc, "warnings");
  const json& options = Field(doc, "options");
  r.gpu_requested = Bool(options, "gpu");
  r.memory_requested = Bool(options, "memory");
  r.root = Str(options, "root");
  // The root the session used (the current directory at start when none was given).
  if (!r.root) {
    const json& metadata = Field(doc, "metadata");
    if (metadata.is_object()) r.root = Str(metadata, "root");
  }
  r.gpu_capable = Bool(Field(doc, "capabilities"), "gpu");
  r.memory = Field(doc, "memory");
  r.gpu = Field(doc, "gpu");
  if (!r.memory.is_null() && !r.memory.is_object())
    throw ReadError{"field 'memory' must be an object or null"};
  if (!r.gpu.is_null() && !r.gpu.is_object())
    throw ReadError{"field 'gpu' must be an object or null"};

  // Files: every file with lines, functions or a source snapshot, in path order.
  std::map<std::string, std::optional<std::string>> by_path;
  const json& sources = Field(doc, "sources");
  if (!sources.is_null() && !sources.is_object())
    throw ReadError{"field 'sources' must be an object"};
  if (sources.is_object()) {
    for (auto it = sources.begin(); it != sources.end(); ++it) {
      if (!it.value().is_string()) throw ReadError{"sources must map file names to text"};
      by_path[it.key()] = it.value().get<std::string>();
    }
  }
  r.snapshots = by_path.size();
  // Every file named anywhere, for the names the diagnostic of left-out lines uses.
  std::map<std::string, std::string> named;
  for (const json& l : Array(run, "lines")) {
    const auto f = Str(l, "filename");
    if (!f) throw ReadError{"a line has no filename"};
    named.try_emplace(*f);
  }
  for (const json& fn : Array(run, "functions")) {
    const auto f = Str(fn, "filename");
    if (!f) throw ReadError{"a function has no filename"};
    by_path.try_emplace(*f);  // listed (its definition is linked) even without a snapshot
  }
  {
    for (const auto& [path, text] : by_path) named.try_emplace(path);
    std::vector<File> all;
    for (const auto& [path, display] : named) all.push_back(File{path, "", std::nullopt});
    AssignDisplayNames(&all, r.root);
    for (const File& f : all) named[f.path] = f.display;
  }
  std::map<std::string, int> index;
  for (auto& [path, text] : by_path) {
    index[path] = static_cast<int>(r.files.size());
    File file;
    file.path = path;
    if (text) {
      file.source = SplitLines(*text);
      for (auto& row : *file.source) row = ClipSourceLine(std::move(row));
    }
    r.files.push_back(std::move(file));
  }
  AssignDisplayNames(&r.files, r.root);

  std::map<std::pair<int, int64_t>, Line> merged;
  std::map<std::pair<std::string, int64_t>, DroppedLine> dropped;
  for (const json& l : Array(run, "lines")) {
    const std::string path = *Str(l, "filename");
    const int64_t number = Int(l, "line").value_or(0);
    const auto at = index.find(path);
    const File* file = at == index.end() ? nullptr : &r.files[at->second];
    if (!file || !file->source || number < 1 ||
        number > static_cast<int64_t>(file->source->size())) {
      DroppedLine d;
      d.display = named[path];
      d.line = number;
      d.source_lines = file && file->source ? static_cast<int64_t>(file->source->size()) : -1;
      d.time_ns = Int(l, "wall_time_ns");
      const json& g = Field(l, "gpu");
      if (g.is_object()) d.gpu_time_ns = Int(g, "time_ns");
      auto [it, fresh] = dropped.try_emplace({path, number}, d);
      if (!fresh) {
        it->second.time_ns = Add(it->second.time_ns, d.time_ns);
        it->second.gpu_time_ns = Add(it->second.gpu_time_ns, d.gpu_time_ns);
      }
      continue;
    }
    Line s;
    s.file = at->second;
    s.line = number;
    const OptInt wall = Int(l, "wall_time_ns");
    s.time_ns = wall.value_or(0);
    s.time_known = wall.has_value();
    s.self_ns = Int(l, "self_time_ns");
    s.hits = Int(l, "hits");
    s.calls = Int(l, "calls");
    s.cpu_ns = Int(l, "cpu_time_ns");
    s.samples = Int(l, "samples");
    s.mem_bytes = Int(l, "memory_bytes");
    s.mem_peak_bytes = Int(l, "memory_peak_bytes");
    const json& g = Field(l, "gpu");
    if (!g.is_null()) {
      if (!g.is_object()) throw ReadError{"a line's 'gpu' must be an object or null"};
      s.gpu_present = true;
      s.gpu_time_ns = Int(g, "time_ns");
      s.gpu_peak_bytes = Int(g, "peak_memory_bytes");
    }
    auto [it, fresh] = merged.try_emplace({s.file, s.line}, s);
    if (fresh) continue;
    Line& m = it->second;  // the same line reported twice: additive fields add, peaks max
    m.time_ns += s.time_ns;
    m.time_known = m.time_known && s.time_known;
    m.self_ns = AddParts(m.self_ns, s.self_ns);
    m.hits = AddParts(m.hits, s.hits);
    m.calls = AddParts(m.calls, s.calls);
    m.cpu_ns = AddParts(m.cpu_ns, s.cpu_ns);
    m.samples = AddParts(m.samples, s.samples);
    m.mem_bytes = AddParts(m.mem_bytes, s.mem_bytes);
    m.mem_peak_bytes = MaxParts(m.mem_peak_bytes, s.mem_peak_bytes);
    m.gpu_present = m.gpu_present || s.gpu_present;
    m.gpu_time_ns = AddParts(m.gpu_time_ns, s.gpu_time_ns);
    m.gpu_peak_bytes = MaxParts(m.gpu_peak_bytes, s.gpu_peak_bytes);
  }
  for (auto& [key, line] : merged) r.lines.push_back(line);
  for (auto& [key, line] : dropped) r.dropped.push_back(std::move(line));

  for (const json& fn : Array(run, "functions")) {
    Function f;
    f.name = Str(fn, "qualname").value_or("?");
    f.file = index[*Str(fn, "filename")];
    f.line = Int(fn, "first_line").value_or(0);
    f.total_ns = Int(fn, "total_time_ns");
    f.own_ns = Int(fn, "own_time_ns");
    f.calls = Int(fn, "calls");
    r.functions.push_back(std::move(f));
  }

  // Definitions a call in the source view can link to: only those inside a captured source.
  std::set<std::tuple<std::string, int, int64_t>> seen;
  for (const json& sym : Array(doc, "symbols")) {
    const auto qualname = Str(sym, "qualname");
    const auto path = Str(sym, "filename");
    const int64_t line = Int(sym, "line").value_or(0);
    if (!qualname || !path) continue;
    const auto at = index.find(*path);
    if (at == index.end()) continue;
    const File& file = r.files[at->second];
    if (!file.source || line < 1 || line > static_cast<int64_t>(file.source->size())) continue;
    if (!seen.emplace(*qualname, at->second, line).second) continue;
    const size_t dot = qualname->rfind('.');
    const std::string name = dot == std::string::npos ? *qualname : qualname->substr(dot + 1);
    if (name.empty() || name.front() == '<') continue;  // <module>, <lambda>, <listcomp>
    r.symbols.push_back(SymbolRef{name, *qualname, at->second, line});
  }

  // run.status is "success" or "failed"; a result without it (written before it existed)
  // succeeded unless it carries an error.
  r.error = Str(run, "error");
  const auto status = Str(run, "status");
  r.status = status ? *status : r.error ? "failed" : "success";
  const json& caps = Field(doc, "capabilities");
  if (!Field(caps, "hit_counts").is_null()) r.hit_counts = Bool(caps, "hit_counts");
  r.sampled = Bool(caps, "sampled");
  return r;
}

// ---- computing the payload -----------------------------------------------------------------

json LineJson(const Line& s, int64_t max_time, int64_t max_gpu_time, bool gpu_columns) {
  json j = {{"file", s.file},
            {"line", s.line},
            {"time_ns", s.time_known ? json(s.time_ns) : json(nullptr)},
            {"self_ns", J(s.self_ns)},
            {"hits", J(s.hits)},
            {"avg_ns", s.time_known && s.hits && *s.hits > 0
                           ? json(static_cast<double>(s.time_ns) / static_cast<double>(*s.hits))
                           : json(nullptr)},
            {"calls", J(s.calls)},
            {"cpu_ns", J(s.cpu_ns)},
            {"samples", J(s.samples)},
            {"mem_bytes", J(s.mem_bytes)},
            {"mem_peak_bytes", J(s.mem_peak_bytes)},
            {"heat", HeatLevel(s.time_ns, max_time)}};
  if (gpu_columns) {
    j["gpu_time_ns"] = J(s.gpu_time_ns);
    j["gpu_peak_bytes"] = J(s.gpu_peak_bytes);
    j["gpu_heat"] = s.gpu_time_ns ? json(HeatLevel(*s.gpu_time_ns, max_gpu_time)) : json(nullptr);
  }
  return j;
}

// Indices of `lines` ordered by `key` descending (unknown keys left out); ties in line order.
template <typename Key>
std::vector<size_t> RankBy(const std::vector<Line>& lines, Key key, size_t limit) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < lines.size(); ++i)
    if (key(lines[i])) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return *key(lines[a]) > *key(lines[b]); });
  if (idx.size() > limit) idx.resize(limit);
  return idx;
}

template <typename Key>
json TopIndex(const std::vector<Line>& lines, Key key) {
  auto top = RankBy(lines, key, 1);
  return top.empty() ? json(nullptr) : json(top[0]);
}

json MemorySection(const Result& r) {
  const json& m = r.memory;
  std::vector<std::pair<int64_t, int64_t>> timeline;
  for (const json& p : Array(m, "timeline")) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number())
      throw ReadError{"memory.timeline must hold [t_ns, rss_bytes] pairs"};
    timeline.emplace_back(p[0].get<int64_t>(), p[1].get<int64_t>());
  }
  std::optional<std::pair<int64_t, int64_t>> peak_point;
  for (const auto& p : timeline)
    if (!peak_point || p.second > peak_point->second) peak_point = p;
  const OptInt start = Int(m, "start_rss_bytes");
  const OptInt end = Int(m, "end_rss_bytes");
  OptInt peak = Int(m, "peak_rss_bytes");
  json lines = json::array();
  for (size_t i = 0; i < r.lines.size(); ++i)
    if (r.lines[i].mem_bytes || r.lines[i].mem_peak_bytes) lines.push_back(i);
  json points = json::array();
  for (const auto& p : DownsampleKeepPeaks(timeline, kMaxTimelinePoints))
    points.push_back({p.first, p.second});
  return {
      {"source", Str(m, "source").value_or("rss")},
      {"interval_ns", J(Int(m, "interval_ns"))},
      {"per_line", Bool(m, "per_line")},
      {"reason", J(Str(m, "reason"))},
      {"start_bytes", J(start)},
      {"peak_bytes", J(peak)},
      {"end_bytes", J(end)},
      {"change_bytes", start && end ? json(*end - *start) : json(nullptr)},
      {"peak_t_ns", peak_point ? json(peak_point->first) : json(nullptr)},
      {"samples", timeline.size()},
      {"timeline", std::move(points)},
      {"lines", std::move(lines)},
      {"top_growth", TopIndex(r.lines, [](const Line& s) { return s.mem_bytes; })},
      {"top_peak", TopIndex(r.lines, [](const Line& s) { return s.mem_peak_bytes; })},
  };
}

// The Driver time card's label: which lines its sum covers (unknown wall times are left out,
// and said to be).
std::string DriverLabel(size_t lines, size_t unknown) {
  auto n = [](size_t k) { return std::to_string(k) + " GPU-measured line" + (k == 1 ? "" : "s"); };
  if (unknown == 0) return "driver (host) wall time of the " + n(lines);
  if (unknown == lines)
    return "driver (host) wall time unknown: the backend reported none for the " + n(lines);
  return "driver (host) wall time of " + std::to_string(lines - unknown) + " of the " + n(lines) +
         " (" + std::to_string(unknown) + " without a reported wall time)";
}

// Only for a backend that declares GPU collection (see HasGpuView).
json GpuSection(const Result& r) {
  // null: the backend returned per-line values only (RawLine.gpu), no collection summary.
  const json& g = r.gpu;
  const bool collected = g.is_object();
  const auto method = collected ? Str(g, "method") : std::nullopt;
  OptInt attributed, peak;
  int64_t driver = 0;
  size_t driver_unknown = 0;  // GPU-measured lines without a wall time
  json measured = json::array();
  for (size_t i = 0; i < r.lines.size(); ++i) {
    const Line& s = r.lines[i];
    if (!s.gpu_measured()) continue;
    measured.push_back(i);
    attributed = Add(attributed, s.gpu_time_ns);
    peak = Max(peak, s.gpu_peak_bytes);
    driver += s.time_ns;
    driver_unknown += s.time_known ? 0 : 1;
  }
  // As the collection says; without one, a quantity is available where a line has a value.
  const bool time_flag = !collected || Bool(g, "time_available");
  const bool memory_flag = !collected || Bool(g, "memory_available");
  const bool time_ok = time_flag && attributed.has_value();
  const bool memory_ok = memory_flag && peak.has_value();
  const bool any_measured = time_ok || memory_ok;
  auto notice = [&](bool ok, const char* reason_key, const char* fallback) -> json {
    if (ok) return nullptr;
    const auto reason = collected ? Str(g, reason_key) : std::nullopt;
    return reason ? *reason : std::string(fallback);
  };
  const auto scope = collected ? Str(g, "utilization_scope") : std::nullopt;
  json scope_note = nullptr;
  if (scope == "device")
    scope_note =
        "GPU utilization is device-wide (per-process accounting unavailable) and can include "
        "other processes; device-memory samples refer to the profiled process.";
  else if (scope == "process")
    scope_note = "GPU utilization is per-process.";
  const std::vector<std::string> devices =
      collected ? Strings(g, "devices") : std::vector<std::string>{};
  const std::string label = MethodLabel(method, r.backend);
  std::string headline;
  // A method the report does not know is already quoted in its label.
  const bool method_in_label = method && label.find("'" + *method + "'") != std::string::npos;
  if (any_measured)
    headline =
        "GPU numbers: " + (method && !method_in_label ? *method + " \u2014 " : std::string()) +
        label;
  else if (method)
    headline = "No GPU values were measured (collection method: " + *method + ").";
  else
    headline = "No GPU values were measured: no GPU collection method was recorded.";
  const auto aggregation = GpuAggregation(method);
  json aggregation_note = nullptr;
  if (aggregation && time_ok) {
    const bool sum = *aggregation == "sum";
    const size_t n = devices.size();
    if (n == 1) {
      aggregation_note = std::string("GPU time is the busy time of 1 GPU (with several GPUs ") +
                         (sum ? "it is summed over them)." : "Scalene averages over them).");
    } else {
      // Not "over n GPUs": the sampler counts only the GPUs this process holds memory on.
      const std::string here = n > 1 ? " (" + std::to_string(n) + " devices here)" : "";
      aggregation_note =
          sum ? "GPU time is summed over GPUs" + here +
                    ": each GPU's busy time adds, so two GPUs each 50 % busy for 1 s give 1 s."
              : "GPU time is averaged over GPUs" + here +
                    ": Scalene averages their utilization, so two GPUs each 50 % busy for 1 s "
                    "give 0.5 s.";
    }
  }
  const bool by_lines = !measured.empty();
  return {
      {"requested", r.gpu_requested},
      {"collected", collected},
      {"measured", any_measured},
      {"method", J(method)},
      {"method_label", label},
      {"headline", headline},
      {"aggregation", J(aggregation)},
      {"aggregation_note", aggregation_note},
      {"devices", devices},
      {"utilization_scope", J(scope)},
      {"scope_note", scope_note},
      {"diagnostics", collected ? json(Strings(g, "diagnostics")) : json::array()},
      {"time",
       {{"value_ns", time_ok ? J(attributed) : json(nullptr)},  // a card never contradicts
        {"available", time_ok},
        {"notice", notice(time_ok, "time_reason", "no GPU time measurements were recorded")}}},
      {"memory",
       {{"peak_bytes", memory_ok ? J(peak) : json(nullptr)},
        {"available", memory_ok},
        {"notice",
         notice(memory_ok, "memory_reason", "no GPU memory measurements were recorded")}}},
      {"driver",
       {{"time_ns", !by_lines                           ? J(r.elapsed_ns)
                    : driver_unknown == measured.size() ? json(nullptr)
                                                        : json(driver)},
        {"basis", by_lines ? "measured-lines" : "elapsed"},
        {"label", by_lines ? DriverLabel(measured.size(), driver_unknown)
                           : std::string("elapsed driver time (no GPU-measured lines)")}}},
      {"lines", measured},
      {"top_time_line", TopIndex(r.lines, [](const Line& s) { return s.gpu_time_ns; })},
      {"top_peak_line", TopIndex(r.lines, [](const Line& s) { return s.gpu_peak_bytes; })},
  };
}

// The diagnostic for lines outside the captured source: null when there are none.
json DroppedSection(const std::vector<DroppedLine>& dropped) {
  if (dropped.empty()) return nullptr;
  std::string message = std::to_string(dropped.size()) +
                        (dropped.size() == 1 ? " line outside the captured source was"
                                             : " lines outside the captured source were") +
                        " left out of every table and total:";
  json lines = json::array();
  OptInt time, gpu_time;
  for (size_t i = 0; i < dropped.size(); ++i) {
    const DroppedLine& d = dropped[i];
    const std::string where = d.display + ":" + std::to_string(d.line);
    const std::string why = d.source_lines < 0 ? "no source was captured"
                            : d.source_lines == 1
                                ? "the file has 1 line"
                                : "the file has " + std::to_string(d.source_lines) + " lines";
    if (i < kMaxDroppedListed) message += (i ? ", " : " ") + where + " (" + why + ")";
    time = Add(time, d.time_ns);
    gpu_time = Add(gpu_time, d.gpu_time_ns);
    lines.push_back({{"location", where},
                     {"reason", d.source_lines < 0 ? "no-source" : "outside-file"},
                     {"time_ns", J(d.time_ns)},
                     {"gpu_time_ns", J(d.gpu_time_ns)}});
  }
  if (dropped.size() > kMaxDroppedListed)
    message += " and " + std::to_string(dropped.size() - kMaxDroppedListed) + " more";
  message += ".";
  return {{"count", dropped.size()},
          {"message", message},
          {"time_ns", J(time)},
          {"gpu_time_ns", J(gpu_time)},
          {"lines", std::move(lines)}};
}

// The GPU view and the GPU columns exist only for a backend that declares GPU collection
// (capabilities.gpu; a result with a GPU collection implies it) when GPU values were
// requested or returned. A backend without it (trace, tachyon) gets no GPU view and no GPU
// column; its diagnostic is among the warnings.
bool HasGpuView(const Result& r) {
  const bool capable = r.gpu_capable || r.gpu.is_object();
  const bool any_line =
      std::any_of(r.lines.begin(), r.lines.end(), [](const Line& s) { return s.gpu_present; });
  return capable && (r.gpu_requested || r.gpu.is_object() || any_line);
}

json Payload(const Result& r) {
  int64_t max_time = 0;
  OptInt max_gpu_time;
  for (const Line& s : r.lines) {
    max_time = std::max(max_time, s.time_ns);
    max_gpu_time = Max(max_gpu_time, s.gpu_time_ns);
  }
  const bool has_memory = r.memory_requested && r.memory.is_object();
  const bool has_gpu_view = HasGpuView(r);
  const bool gpu_columns = has_gpu_view;
  auto any = [&](auto field) {
    return std::any_of(r.lines.begin(), r.lines.end(),
                       [&](const Line& s) { return (s.*field).has_value(); });
  };
  const bool per_line_memory = has_memory && Bool(r.memory, "per_line");
  // Hits and Avg/hit: a sampling backend (or one that declares no hit counts) never fills
  // them, so they exist only where a line has a count or the backend declares counts.
  const bool hits_column = any(&Line::hits) || (r.hit_counts && !r.sampled);
  // Calls and Avg/call of the functions table: likewise only where a function has a count.
  const bool function_calls = std::any_of(r.functions.begin(), r.functions.end(),
                                          [](const Function& f) { return f.calls.has_value(); }) ||
                              (r.functions.empty() && !r.sampled);
  const json columns = {
      {"self", any(&Line::self_ns)},
      {"hits", hits_column},
      {"function_calls", function_calls},
      {"calls", any(&Line::calls)},
      {"cpu", any(&Line::cpu_ns)},
      {"samples", any(&Line::samples)},
      {"memory", has_memory && (per_line_memory || any(&Line::mem_bytes))},
      {"memory_peak", has_memory && any(&Line::mem_peak_bytes)},
      {"gpu", gpu_columns},
  };

  json lines = json::array();
  for (const Line& s : r.lines)
    lines.push_back(LineJson(s, max_time, max_gpu_time.value_or(0), gpu_columns));

  // Per-file summaries.
  struct Sum {
    int64_t executed = 0;
    int64_t own = 0;
    OptInt gpu;
    OptInt mem;
    std::optional<size_t> hottest;
  };
  std::vector<Sum> sums(r.files.size());
  size_t executed_total = 0;
  int64_t own_total = 0;
  for (size_t i = 0; i < r.lines.size(); ++i) {
    const Line& s = r.lines[i];
    Sum& f = sums[s.file];
    const bool executed = !s.hits || *s.hits > 0;
    f.executed += executed;
    executed_total += executed;
    f.own += s.own_ns();
    own_total += s.own_ns();
    f.gpu = Add(f.gpu, s.gpu_time_ns);
    f.mem = Add(f.mem, s.mem_bytes);
    if (!f.hottest || s.time_ns > r.lines[*f.hottest].time_ns) f.hottest = i;
  }
  json files = json::array();
  for (size_t i = 0; i < r.files.size(); ++i) {
    const File& f = r.files[i];
    json j = {{"path", f.path},
              {"display", f.display},
              {"source", f.source ? json(*f.source) : json(nullptr)},
              {"executed_lines", sums[i].executed},
              {"time_ns", sums[i].own},
              {"share", own_total > 0 ? json(static_cast<double>(sums[i].own) /
                                             static_cast<double>(own_total))
                                      : json(nullptr)},
              {"hottest", sums[i].hottest ? json(*sums[i].hottest) : json(nullptr)}};
    if (gpu_columns) j["gpu_time_ns"] = J(sums[i].gpu);
    if (columns["memory"].get<bool>()) j["mem_bytes"] = J(sums[i].mem);
    files.push_back(std::move(j));
  }

  // A function listed with 0 calls never ran: its times are 0, it has no time bar
  // (share null), and the overview counts it apart.
  int64_t max_fn_total = 0;
  size_t never_ran = 0;
  for (const Function& f : r.functions) {
    if (f.calls && *f.calls == 0) ++never_ran;
    max_fn_total = std::max(max_fn_total, f.total_ns.value_or(0));
  }
  json functions = json::array();
  for (const Function& f : r.functions) {
    const bool ran = !(f.calls && *f.calls == 0);
    functions.push_back(
        {{"name", f.name},
         {"file", f.file},
         {"line", f.line},
         {"total_ns", J(f.total_ns)},
         {"own_ns", J(f.own_ns)},
         {"calls", J(f.calls)},
         {"ran", ran},
         {"share", ran && f.total_ns && max_fn_total > 0
                       ? json(static_cast<double>(*f.total_ns) / static_cast<double>(max_fn_total))
                       : json(nullptr)},
         {"avg_ns", f.total_ns && f.calls && *f.calls > 0
                        ? json(static_cast<double>(*f.total_ns) / static_cast<double>(*f.calls))
                        : json(nullptr)}});
  }
  json symbols = json::array();
  for (const SymbolRef& sym : r.symbols)
    symbols.push_back(
        {{"name", sym.name}, {"qualname", sym.qualname}, {"file", sym.file}, {"line", sym.line}});

  json top = json::array();
  for (size_t i : RankBy(
           r.lines, [](const Line& s) { return OptInt(s.time_ns); }, kTopLines))
    top.push_back(i);

  return {
      {"format", kReportFormat},
      {"backend", r.backend},
      {"status", r.status},
      {"error", J(r.error)},
      {"sampled", r.sampled},
      {"started_at", J(r.started_at)},
      {"elapsed_ns", J(r.elapsed_ns)},
      {"warnings", r.warnings},
      {"columns", columns},
      {"overview",
       {{"elapsed_ns", J(r.elapsed_ns)},
        {"snapshots", r.snapshots},
        {"functions", r.functions.size()},
        {"functions_never_ran", never_ran},
        {"executed_lines", executed_total},
        {"files", r.files.size()},
        {"line_time_ns", own_total},
        {"top_lines", std::move(top)}}},
      {"heat",
       {{"levels", kHeatLevels},
        {"scale", "sqrt"},
        {"max_time_ns", max_time},
        {"max_gpu_time_ns", J(max_gpu_time)}}},
      {"files", std::move(files)},
      {"lines", std::move(lines)},
      {"functions", std::move(functions)},
      {"symbols", std::move(symbols)},
      {"dropped", DroppedSection(r.dropped)},
      {"memory", has_memory ? MemorySection(r) : json(nullptr)},
      {"gpu", has_gpu_view ? GpuSection(r) : json(nullptr)},
  };
}

// ---- rendering -----------------------------------------------------------------------------

bool ContainsNoCase(std::string_view hay, std::string_view needle) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  if (needle.size() > hay.size()) return false;
  for (size_t i = 0; i + needle.size() <= hay.size(); ++i) {
    size_t k = 0;
    while (k < needle.size() && lower(hay[i + k]) == needle[k]) ++k;
    if (k == needle.size()) return true;
  }
  return false;
}

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

// "lib/x.js" imported from "report/app.js" as "../lib/x.js" -> "lib/x.js"; nullopt when the
// path leaves web/ or is not relative.
std::optional<std::string> Resolve(const std::string& from, const std::string& spec) {
  if (spec.rfind("./", 0) != 0 && spec.rfind("../", 0) != 0) return std::nullopt;
  std::vector<std::string> parts;
  const std::string dir = Directory(from);
  std::string joined = dir.empty() ? spec : dir + "/" + spec;
  size_t start = 0;
  while (start <= joined.size()) {
    size_t end = joined.find('/', start);
    if (end == std::string::npos) end = joined.size();
    std::string part = joined.substr(start, end - start);
    if (part == "..") {
      if (parts.empty()) return std::nullopt;
      parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    start = end + 1;
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "/") + p;
  return out;
}

bool IsIdentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$';
}

bool IsIdent(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), IsIdentChar);
}

}  // namespace

std::string ClipSourceLine(std::string line) {
  size_t chars = 0;
  size_t keep = line.size();
  for (size_t i = 0; i < line.size(); ++i) {
    if ((static_cast<unsigned char>(line[i]) & 0xC0) == 0x80) continue;  // within a character
    if (chars == kMaxSourceLineChars - 1) keep = i;  // the end of the characters kept
    if (++chars > kMaxSourceLineChars) {
      line.resize(keep);
      line += "\xE2\x80\xA6";  // U+2026 HORIZONTAL ELLIPSIS
      return line;
    }
  }
  return line;
}

int HeatLevel(int64_t value, int64_t max_value) {
  if (value <= 0 || max_value <= 0) return 0;
  const double frac = std::min(1.0, static_cast<double>(value) / static_cast<double>(max_value));
  const int level = static_cast<int>(std::ceil((kHeatLevels - 1) * std::sqrt(frac) - 1e-9));
  return std::clamp(level, 1, kHeatLevels - 1);
}

std::vector<std::pair<int64_t, int64_t>> DownsampleKeepPeaks(
    const std::vector<std::pair<int64_t, int64_t>>& points, size_t max_points) {
  const size_t n = points.size();
  if (max_points < 3 || n <= max_points) return points;
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(max_points);
  out.push_back(points.front());
  const size_t inner = max_points - 2;
  const double size = static_cast<double>(n - 2) / static_cast<double>(inner);
  for (size_t b = 0; b < inner; ++b) {
    const size_t lo = 1 + static_cast<size_t>(std::floor(b * size));
    const size_t hi = std::min(n - 1, 1 + static_cast<size_t>(std::floor((b + 1) * size)));
    if (lo >= hi) continue;
    size_t best = lo;
    for (size_t i = lo + 1; i < hi; ++i)
      if (points[i].second > points[best].second) best = i;
    out.push_back(points[best]);
  }
  out.push_back(points.back());
  return out;
}

Expected<std::string> BuildReportPayload(std::string_view result_json) {
  json doc;
  try {
    doc = json::parse(result_json);
  } catch (const json::exception& e) {
    return Status::Error(std::string("linescope report: the result is not valid JSON: ") +
                         e.what());
  }
  try {
    json payload = Payload(Read(doc));
    payload["spark"] = SparkReportSection(doc, payload);  // lines/spark.cc
    return payload.dump();
  } catch (const ReadError& e) {
    return Status::Error("linescope report: " + e.message);
  } catch (const json::exception& e) {
    return Status::Error(std::string("linescope report: unexpected result layout: ") + e.what());
  }
}

Expected<std::string> BundleModules(const std::vector<WebAsset>& modules) {
  if (modules.empty()) return Status::Error("bundle: no modules");
  std::map<std::string, size_t> seen;  // path -> module index
  std::vector<std::vector<std::string>> exports(modules.size());
  std::string out = "\"use strict\";\n";
  for (size_t i = 0; i < modules.size(); ++i) {
    const WebAsset& m = modules[i];
    auto fail = [&](size_t line_no, const std::string& what) {
      return Status::Error("bundle: web/" + m.path + ":" + std::to_string(line_no) + ": " + what);
    };
    if (ContainsNoCase(m.text, "</script") || m.text.find("<!--") != std::string::npos)
      return fail(0, "contains '</script' or '<!--', which would end the inline script");
    std::string head, body;
    size_t line_no = 0, start = 0;
    while (start < m.text.size()) {
      size_t end = m.text.find('\n', start);
      if (end == std::string::npos) end = m.text.size();
      const std::string raw = m.text.substr(start, end - start);
      start = end + 1;
      ++line_no;
      const std::string line = Trim(raw);
      if (raw.rfind("import", 0) == 0 && (raw.size() == 6 || raw[6] == ' ' || raw[6] == '{')) {
        // import { a, b as c } from "./x.js";
        const size_t open = line.find('{'), close = line.find('}');
        const size_t from = line.find(" from ", close == std::string::npos ? 0 : close);
        if (open == std::string::npos || close == std::string::npos || from == std::string::npos)
          return fail(line_no, "imports must read: import { a, b as c } from \"./x.js\";");
        std::string spec = Trim(line.substr(from + 6));
        if (!spec.empty() && spec.back() == ';') spec.pop_back();
        if (spec.size() < 2 || (spec.front() != '"' && spec.front() != '\'') ||
            spec.back() != spec.front())
          return fail(line_no, "the import path must be a quoted string");
        const auto target = Resolve(m.path, spec.substr(1, spec.size() - 2));
        if (!target) return fail(line_no, "import paths must be relative (./ or ../) within web/");
        auto dep = seen.find(*target);
        if (dep == seen.end())
          return fail(line_no, "imports " + *target +
                                   ", which is not listed before it in web/report/manifest.txt");
        std::string names = line.substr(open + 1, close - open - 1), binding;
        size_t p = 0;
        while (p <= names.size()) {
          size_t comma = names.find(',', p);
          if (comma == std::string::npos) comma = names.size();
          const std::string item = Trim(names.substr(p, comma - p));
          p = comma + 1;
          if (item.empty()) continue;
          std::string name = item, alias = item;
          const size_t as = item.find(" as ");
          if (as != std::string::npos) {
            name = Trim(item.substr(0, as));
            alias = Trim(item.substr(as + 4));
          }
          if (!IsIdent(name) || !IsIdent(alias)) return fail(line_no, "bad import name " + item);
          const auto& ex = exports[dep->second];
          if (std::find(ex.begin(), ex.end(), name) == ex.end())
            return fail(line_no, *target + " does not export " + name);
          binding += (binding.empty() ? "" : ", ") + (name == alias ? name : name + ": " + alias);
        }
        head += "const { " + binding + " } = __ls_m" + std::to_string(dep->second) + ";\n";
        body += "\n";  // keep line numbers of the body stable for error messages
        continue;
      }
      if (raw.rfind("export ", 0) == 0) {
        std::string rest = raw.substr(7);
        std::string decl = rest;
        if (decl.rfind("async ", 0) == 0) decl = decl.substr(6);
        std::string kind;
        for (const char* k : {"function* ", "function ", "const ", "let ", "class "})
          if (decl.rfind(k, 0) == 0) kind = k;
        if (kind.empty())
          return fail(line_no, "exports must be declarations: export function|const|let|class");
        size_t n = kind.size();
        while (n < decl.size() && decl[n] == ' ') ++n;
        size_t e = n;
        while (e < decl.size() && IsIdentChar(decl[e])) ++e;
        const std::string name = decl.substr(n, e - n);
        if (!IsIdent(name)) return fail(line_no, "cannot read the exported name");
        exports[i].push_back(name);
        body += rest + "\n";
        continue;
      }
      if (line.rfind("export ", 0) == 0 || line.rfind("import(", 0) == 0 ||
          line.rfind("import ", 0) == 0)
        return fail(line_no, "import/export must start a line at the top level");
      body += raw + "\n";
    }
    if (!seen.emplace(m.path, i).second) return fail(0, "listed twice in the manifest");
    std::string ret;
    for (const auto& e : exports[i]) ret += (ret.empty() ? "" : ", ") + e;
    out += "// ---- web/" + m.path + "\nconst __ls_m" + std::to_string(i) + " = (() => {\n" + head +
           body + "return { " + ret + " };\n})();\n";
  }
  out += "globalThis.__linescope = { modules: {";
  for (size_t i = 0; i < modules.size(); ++i)
    out += (i ? ", " : " ") + json(modules[i].path).dump() + ": __ls_m" + std::to_string(i);
  out += " } };\n";
  return out;
}

std::string RenderReportHtml(std::string_view payload_json) {
  // The bundle depends only on the embedded assets: build it once.
  static const std::string kScript = [] {
    auto bundle = BundleModules(EmbeddedModules());
    if (bundle) return std::move(bundle).value();
    return "document.body.textContent = " + json("linescope report: " + bundle.error()).dump() +
           ";\n";
  }();
  std::string payload;
  payload.reserve(payload_json.size() + 64);
  for (char c : payload_json) {
    if (c == '<')
      payload += "\\u003c";
    else
      payload += c;
  }
  std::string style = EmbeddedStylesheet().text;
  if (ContainsNoCase(style, "</style")) style = "/* stylesheet left out: it contains </style */";

  const std::string& tpl = EmbeddedTemplate().text;
  const std::pair<const char*, const std::string*> slots[] = {
      {"{{style}}", &style}, {"{{payload}}", &payload}, {"{{script}}", &kScript}};
  std::string out;
  out.reserve(tpl.size() + style.size() + payload.size() + kScript.size());
  size_t pos = 0;
  while (pos < tpl.size()) {
    size_t next = std::string::npos;
    const std::string* value = nullptr;
    size_t len = 0;
    for (const auto& [name, v] : slots) {
      const size_t at = tpl.find(name, pos);
      if (at < next) {
        next = at;
        value = v;
        len = std::char_traits<char>::length(name);
      }
    }
    if (next == std::string::npos) {
      out.append(tpl, pos, std::string::npos);
      break;
    }
    out.append(tpl, pos, next - pos);
    out += *value;
    pos = next + len;
  }
  return out;
}

}  // namespace gpuprof::lines
