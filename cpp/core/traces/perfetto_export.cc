#include "traces/perfetto_export.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

namespace gpuprof::traces {
namespace {

using Json = nlohmann::ordered_json;

// Microseconds (the trace-event unit) of run-relative ns. The double nearest ns / 1000 prints
// as that decimal (at most three decimals), so readers get the stored ns back exactly.
double Us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }
double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }
double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// Phases in the order a step runs them; other names follow in stored order.
int PhaseRank(const std::string& name) {
  static const char* const kOrder[] = {"forward", "backward", "comm", "optimizer"};
  for (int i = 0; i < 4; ++i) {
    if (name == kOrder[i]) return i;
  }
  return 4;
}

std::string Cut(const std::string& name, size_t max_chars) {
  if (name.size() <= max_chars) return name;
  size_t n = max_chars;
  // Do not split a UTF-8 sequence.
  while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xC0) == 0x80) --n;
  return name.substr(0, n) + "…";
}

// "2024-05-01T12:00:00.000000000Z" of Unix ns.
std::string UtcIso(int64_t unix_ns) {
  int64_t secs = unix_ns / 1'000'000'000;
  int64_t frac = unix_ns % 1'000'000'000;
  if (frac < 0) {
    frac += 1'000'000'000;
    --secs;
  }
  const std::time_t t = static_cast<std::time_t>(secs);
  std::tm tm{};
  if (!gmtime_r(&t, &tm)) return "";
  char head[32];
  std::strftime(head, sizeof head, "%Y-%m-%dT%H:%M:%S", &tm);
  char tail[16];
  std::snprintf(tail, sizeof tail, ".%09lldZ", static_cast<long long>(frac));
  return std::string(head) + tail;
}

// The traceEvents array being written: events one per line, comma-separated.
struct EventSink {
  std::ostream& out;
  size_t events = 0;
  void Emit(const Json& event) {
    out << (events == 0 ? "\n" : ",\n")
        << event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    ++events;
  }
};

// Writes the events of one process (a run) into a sink and names its thread tracks. Its times
// are run-relative ns plus `shift_ns` (0 for a run alone; the rank's place on the group's time
// line in a group trace).
class TraceWriter {
 public:
  TraceWriter(EventSink& sink, int64_t pid, int64_t shift_ns = 0)
      : sink_(sink), pid_(pid), shift_ns_(shift_ns) {}
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  int64_t pid() const { return pid_; }
  size_t events() const { return events_; }
  size_t tracks() const { return threads_.size() + counters_.size(); }

  void Emit(const Json& event) {
    sink_.Emit(event);
    ++events_;
  }

  // The tid of the thread track `name`, named (and sorted in creation order) on first use.
  int64_t Thread(const std::string& name) {
    auto it = threads_.find(name);
    if (it != threads_.end()) return it->second;
    int64_t tid = next_tid_++;
    if (tid == pid_) tid = next_tid_++;  // tid == pid would make it the process's main thread
    threads_.emplace(name, tid);
    Emit(Json{{"name", "thread_name"},
              {"ph", "M"},
              {"pid", pid_},
              {"tid", tid},
              {"args", {{"name", name}}}});
    Emit(Json{{"name", "thread_sort_index"},
              {"ph", "M"},
              {"pid", pid_},
              {"tid", tid},
              {"args", {{"sort_index", tid}}}});
    return tid;
  }

  // A complete slice [start_ns, end_ns) on thread `tid`.
  void Slice(int64_t tid, const std::string& name, const char* cat, int64_t start_ns,
             int64_t end_ns, Json args) {
    Json e{{"name", name},
           {"cat", cat},
           {"ph", "X"},
           {"ts", Us(start_ns + shift_ns_)},
           {"dur", Us(std::max<int64_t>(0, end_ns - start_ns))},
           {"pid", pid_},
           {"tid", tid}};
    if (!args.empty()) e["args"] = std::move(args);
    Emit(e);
  }

  // An instant event on thread `tid`.
  void Instant(int64_t tid, const std::string& name, const char* cat, int64_t ts_ns, Json args) {
    Json e{{"name", name}, {"cat", cat}, {"ph", "i"}, {"s", "t"}, {"ts", Us(ts_ns + shift_ns_)},
           {"pid", pid_},  {"tid", tid}};
    if (!args.empty()) e["args"] = std::move(args);
    Emit(e);
  }

  // One point of the counter `name` (a quantity; `unit` is its one series). Non-finite values
  // (never stored, but guarded) are left out.
  void Counter(const std::string& name, const char* unit, int64_t ts_ns, double value) {
    if (!std::isfinite(value)) return;
    counters_.insert(name);
    Emit(Json{{"name", name},
              {"ph", "C"},
              {"ts", Us(ts_ns + shift_ns_)},
              {"pid", pid_},
              {"args", {{unit, value}}}});
  }

 private:
  EventSink& sink_;
  const int64_t pid_;
  const int64_t shift_ns_;
  int64_t next_tid_ = 1;
  size_t events_ = 0;
  std::map<std::string, int64_t> threads_;
  std::set<std::string> counters_;
};

// Tracks of one kind whose slices may overlap: each slice goes to the first lane it does not
// overlap ("comm", "comm 2", ...), so that the slices of one thread never partially overlap.
class Lanes {
 public:
  Lanes(TraceWriter* writer, std::string base) : writer_(writer), base_(std::move(base)) {}

  int64_t Tid(int64_t start_ns, int64_t end_ns) {
    end_ns = std::max(start_ns, end_ns);
    for (size_t i = 0; i < ends_.size(); ++i) {
      if (ends_[i] <= start_ns) {
        ends_[i] = end_ns;
        return tids_[i];
      }
    }
    const std::string name = ends_.empty() ? base_ : base_ + " " + std::to_string(ends_.size() + 1);
    tids_.push_back(writer_->Thread(name));
    ends_.push_back(end_ns);
    return tids_.back();
  }

 private:
  TraceWriter* writer_;
  std::string base_;
  std::vector<int64_t> ends_;
  std::vector<int64_t> tids_;
};

void AddIf(Json& args, const char* key, const std::optional<int64_t>& v) {
  if (v) args[key] = *v;
}
void AddIf(Json& args, const char* key, const std::optional<std::string>& v) {
  if (v) args[key] = *v;
}
void AddMsIf(Json& args, const char* key, const std::optional<int64_t>& ns) {
  if (ns) args[key] = Ms(*ns);
}

Json OtherData(const store::RunData& data, int64_t end_ns) {
  const store::RunInfo& r = data.run;
  Json o{{"exported_by", "gpuprof " + r.gpuprof_version + " export --format perfetto"},
         {"time_base",
          "ts and dur are microseconds since the run's start; wall time = start_unix_ns + "
          "ts * 1000"},
         {"run_id", r.run_id},
         {"run_name", r.run_name}};
  AddIf(o, "group_id", r.group_id);
  AddIf(o, "rank", r.rank);
  AddIf(o, "world_size", r.world_size);
  o["hostname"] = r.hostname;
  o["pid"] = r.pid;
  o["start_unix_ns"] = r.start_unix_ns;
  o["start_utc"] = UtcIso(r.start_unix_ns);
  o["duration_ms"] = Ms(end_ns);
  o["status"] = r.status;
  AddIf(o, "error", r.error);
  AddIf(o, "device_kind", r.device_kind);
  AddIf(o, "gpu_model", r.gpu_model);
  AddIf(o, "gpu_count", r.gpu_count);
  AddIf(o, "python_version", r.python_version);
  AddIf(o, "torch_version", r.torch_version);
  // A rank's clock offset to rank 0 (runs.config_json "distributed"), to line ranks up.
  if (r.config_json) {
    Json config = Json::parse(*r.config_json, nullptr, false);
    if (config.is_object() && config.contains("distributed") && config["distributed"].is_object()) {
      const Json& d = config["distributed"];
      for (const char* key : {"clock_offset_ns", "clock_uncertainty_ns", "clock_reference_rank",
                              "clock_unaligned_reason"}) {
        if (d.contains(key) && !d[key].is_null()) o[key] = d[key];
      }
    }
  }
  o["phases_layout"] =
      "the store keeps each phase's summed CPU time per step, not when it ran: a step's phases "
      "are drawn end to end after its loader wait (forward, backward, comm, optimizer, others)";
  o["counters"] =
      "a counter keeps its value until its next point; between kernel or CPU operator windows "
      "nothing was traced";
  return o;
}

// The end of the run: runs.end_ns, else the latest time any row reaches.
int64_t RunEnd(const store::RunData& d) {
  if (d.run.end_ns) return *d.run.end_ns;
  int64_t end = 0;
  for (const auto& s : d.steps) end = std::max(end, s.end_ns);
  for (const auto& g : d.gpu_samples_1s) end = std::max(end, g.ts_ns);
  for (const auto& h : d.host_samples) end = std::max(end, h.ts_ns);
  for (const auto& k : d.kernels) end = std::max(end, k.window_end_ns);
  for (const auto& c : d.cpu_ops) end = std::max(end, c.window_end_ns);
  for (const auto& b : d.comm_buckets) end = std::max(end, b.end_ns);
  return end;
}

void WriteSteps(const store::RunData& d, TraceWriter& w) {
  if (d.steps.empty()) return;
  std::map<int64_t, std::vector<const store::PhaseRow*>> phases;
  for (const auto& p : d.phases) phases[p.step].push_back(&p);
  for (auto& [step, rows] : phases) {
    std::stable_sort(rows.begin(), rows.end(), [](const auto* a, const auto* b) {
      return PhaseRank(a->name) < PhaseRank(b->name);
    });
  }
  const int64_t steps_tid = w.Thread("steps");
  const bool any_wait = std::any_of(d.steps.begin(), d.steps.end(),
                                    [](const auto& s) { return s.wait_ns.has_value(); });
  const int64_t wait_tid = any_wait ? w.Thread("dataloader") : 0;
  const int64_t phases_tid = d.phases.empty() ? 0 : w.Thread("phases");
  for (const store::StepRow& s : d.steps) {
    const int64_t start = s.start_ns;
    const int64_t end = std::max(s.start_ns, s.end_ns);
    const int64_t wait = std::clamp<int64_t>(s.wait_ns.value_or(0), 0, end - start);
    Json args{{"step", s.step}, {"duration_ms", Ms(end - start)}};
    AddMsIf(args, "wait_ms", s.wait_ns);
    AddIf(args, "wait_source", s.wait_source);
    args["forward_calls"] = s.forward_calls;
    args["backward_calls"] = s.backward_calls;
    args["optimizer_calls"] = s.optimizer_calls;
    auto it = phases.find(s.step);
    if (it != phases.end()) {
      Json cpu = Json::object(), gpu = Json::object();
      int64_t cpu_sum = 0;
      for (const store::PhaseRow* p : it->second) {
        if (p->calls > 0) {
          cpu[p->name] = Ms(p->wall_ns);
          cpu_sum += p->wall_ns;
        }
        if (p->gpu_ns) gpu[p->name] = Ms(*p->gpu_ns);
      }
      if (!cpu.empty()) args["phase_cpu_ms"] = std::move(cpu);
      if (!gpu.empty()) args["phase_gpu_ms"] = std::move(gpu);
      // Step time in neither the wait nor a phase; left out when phases overlap (nested
      // manual phases make the sum exceed the step).
      if (s.wait_ns && cpu_sum > 0 && end - start - wait - cpu_sum >= 0) {
        args["other_ms"] = Ms(end - start - wait - cpu_sum);
      }
    }
    w.Slice(steps_tid, "step " + std::to_string(s.step), "step", start, end, std::move(args));

    if (s.wait_ns) {
      Json wargs{{"step", s.step}, {"wait_ms", Ms(*s.wait_ns)}};
      AddIf(wargs, "source", s.wait_source);
      w.Slice(wait_tid, "wait (" + s.wait_source.value_or("unknown") + ")", "wait", start,
              start + wait, std::move(wargs));
    }
    if (it == phases.end()) continue;
    int64_t cursor = start + wait;
    for (const store::PhaseRow* p : it->second) {
      if (p->calls == 0) continue;  // a GPU-time placeholder: no CPU side recorded
      const int64_t from = std::min(cursor, end);
      const int64_t to = std::min(from + std::max<int64_t>(0, p->wall_ns), end);
      Json pargs{{"step", s.step}, {"calls", p->calls}, {"cpu_ms", Ms(p->wall_ns)}};
      AddMsIf(pargs, "gpu_ms", p->gpu_ns);
      if (to - from < p->wall_ns) pargs["clipped_at_step_end"] = true;
      w.Slice(phases_tid, p->name, "phase", from, to, std::move(pargs));
      cursor = to;
    }
  }
}

// Kernel windows, per device: a slice per window with its top kernels, and a counter of the
// window's kernel GPU time.
void WriteKernels(const store::RunData& d, TraceWriter& w, const PerfettoOptions& options) {
  if (d.kernels.empty()) return;
  std::set<std::string> sources;
  for (const auto& k : d.kernels) sources.insert(k.source);
  // (device or -1, window start, window end, source) -> rows.
  using Key = std::tuple<int64_t, int64_t, int64_t, std::string>;
  std::map<Key, std::vector<const store::KernelRow*>> windows;
  for (const auto& k : d.kernels) {
    windows[Key{k.device.value_or(-1), k.window_start_ns, k.window_end_ns, k.source}].push_back(&k);
  }
  std::map<int64_t, Lanes> lanes;
  for (auto& [key, rows] : windows) {
    const auto& [device, start, end, source] = key;
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto* a, const auto* b) { return a->gpu_ns > b->gpu_ns; });
    int64_t calls = 0, gpu_ns = 0;
    for (const auto* r : rows) {
      calls += r->calls;
      gpu_ns += r->gpu_ns;
    }
    Json top = Json::array();
    for (size_t i = 0; i < rows.size() && i < options.top_entries; ++i) {
      const store::KernelRow& r = *rows[i];
      Json k{{"name", r.name}, {"calls", r.calls}, {"gpu_ms", Ms(r.gpu_ns)}};
      AddIf(k, "grid", r.grid);
      AddIf(k, "block", r.block);
      AddIf(k, "stream", r.stream);
      if (r.min_ns) k["min_us"] = Us(*r.min_ns);
      if (r.max_ns) k["max_us"] = Us(*r.max_ns);
      top.push_back(std::move(k));
    }
    Json args{{"window_ms", Ms(end - start)}};
    AddIf(args, "step", rows.front()->step);
    if (device >= 0) args["device"] = device;
    args["source"] = source;
    args["kernels"] = calls;
    args["entries"] = rows.size();
    args["gpu_ms"] = Ms(gpu_ns);
    args["top"] = std::move(top);
    const std::string track = device >= 0 ? "kernels GPU " + std::to_string(device) : "kernels";
    auto lane = lanes.try_emplace(device, &w, track).first;
    const std::string name = rows.size() == 1 ? Cut(rows.front()->name, options.max_name_chars)
                                              : std::to_string(calls) + " kernels";
    w.Slice(lane->second.Tid(start, end), name, "kernels", start, end, std::move(args));
    std::string counter =
        device >= 0 ? "GPU " + std::to_string(device) + " kernel time" : "kernel time";
    if (sources.size() > 1) counter += " (" + source + ")";
    w.Counter(counter, "ms", start, Ms(gpu_ns));
  }
}

// CPU operator windows (torch.profiler's CPU activities): host time, never GPU time.
void WriteCpuOps(const store::RunData& d, TraceWriter& w, const PerfettoOptions& options) {
  if (d.cpu_ops.empty()) return;
  using Key = std::tuple<int64_t, int64_t, std::string>;
  std::map<Key, std::vector<const store::CpuOpRow*>> windows;
  for (const auto& c : d.cpu_ops) {
    windows[Key{c.window_start_ns, c.window_end_ns, c.source}].push_back(&c);
  }
  Lanes lanes(&w, "CPU operators");
  for (auto& [key, rows] : windows) {
    const auto& [start, end, source] = key;
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto* a, const auto* b) { return a->self_cpu_ns > b->self_cpu_ns; });
    int64_t calls = 0, self_ns = 0;
    for (const auto* r : rows) {
      calls += r->calls;
      self_ns += r->self_cpu_ns;
    }
    Json top = Json::array();
    for (size_t i = 0; i < rows.size() && i < options.top_entries; ++i) {
      const store::CpuOpRow& r = *rows[i];
      Json op{{"name", r.name}, {"calls", r.calls}, {"self_cpu_ms", Ms(r.self_cpu_ns)}};
      AddMsIf(op, "cpu_ms", r.cpu_ns);
      top.push_back(std::move(op));
    }
    Json args{{"window_ms", Ms(end - start)}};
    AddIf(args, "step", rows.front()->step);
    args["source"] = source;
    args["calls"] = calls;
    args["entries"] = rows.size();
    args["self_cpu_ms"] = Ms(self_ns);
    args["top"] = std::move(top);
    const std::string name = rows.size() == 1 ? Cut(rows.front()->name, options.max_name_chars)
                                              : std::to_string(calls) + " CPU ops";
    w.Slice(lanes.Tid(start, end), name, "cpu_ops", start, end, std::move(args));
    w.Counter("CPU operator self time", "ms", start, Ms(self_ns));
  }
}

void WriteComm(const store::RunData& d, TraceWriter& w) {
  if (d.comm_buckets.empty()) return;
  std::vector<const store::CommBucketRow*> rows;
  for (const auto& b : d.comm_buckets) rows.push_back(&b);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto* a, const auto* b) { return a->start_ns < b->start_ns; });
  Lanes lanes(&w, "comm");
  for (const auto* b : rows) {
    Json args{
        {"step", b->step}, {"bucket", b->bucket}, {"duration_ms", Ms(b->end_ns - b->start_ns)}};
    AddIf(args, "bytes", b->bytes);
    w.Slice(lanes.Tid(b->start_ns, b->end_ns), "bucket " + std::to_string(b->bucket), "comm",
            b->start_ns, b->end_ns, std::move(args));
  }
}

void WriteHostStalls(const store::RunData& d, TraceWriter& w) {
  if (!d.stalls.empty()) {
    Lanes lanes(&w, "host stalls");
    for (const auto& s : d.stalls) {
      const int64_t end = s.start_ns + std::max<int64_t>(0, s.duration_ns);
      w.Slice(lanes.Tid(s.start_ns, end), "stall", "host", s.start_ns, end,
              Json{{"duration_ms", Ms(s.duration_ns)}});
    }
  }
  if (!d.cpu_waits.empty()) {
    Lanes lanes(&w, "CPU wait");
    for (const auto& c : d.cpu_waits) {
      w.Slice(lanes.Tid(c.start_ns, c.end_ns), "CPU wait", "host", c.start_ns, c.end_ns,
              Json{{"wait_ms", Ms(c.wait_ns)}, {"note", "run-queue wait summed over threads"}});
    }
  }
}

void WriteGpuCounters(const store::RunData& d, TraceWriter& w) {
  for (const store::GpuRollupRow& g : d.gpu_samples_1s) {
    const std::string gpu = "GPU " + std::to_string(g.gpu_index);
    if (g.util_mean_pct) w.Counter(gpu + " utilization", "%", g.ts_ns, *g.util_mean_pct);
    if (g.mem_util_mean_pct) {
      w.Counter(gpu + " memory busy", "%", g.ts_ns, *g.mem_util_mean_pct);
    }
    if (g.mem_used_max_bytes) {
      w.Counter(gpu + " memory used", "MiB", g.ts_ns, MiB(*g.mem_used_max_bytes));
    }
    if (g.power_mean_mw) w.Counter(gpu + " power", "W", g.ts_ns, *g.power_mean_mw / 1000.0);
    if (g.temp_max_c) w.Counter(gpu + " temperature", "°C", g.ts_ns, *g.temp_max_c);
    if (g.sm_clock_min_mhz) {
      w.Counter(gpu + " SM clock", "MHz", g.ts_ns, static_cast<double>(*g.sm_clock_min_mhz));
    }
  }
}

void WriteHostCounters(const store::RunData& d, TraceWriter& w) {
  for (const store::HostSampleRow& h : d.host_samples) {
    if (h.cpu_pct) w.Counter("host CPU", "%", h.ts_ns, *h.cpu_pct);
    if (h.mem_used_bytes) w.Counter("host memory used", "MiB", h.ts_ns, MiB(*h.mem_used_bytes));
    if (h.page_cache_bytes) {
      w.Counter("host page cache", "MiB", h.ts_ns, MiB(*h.page_cache_bytes));
    }
    if (h.swap_in_bps) w.Counter("host swap in", "MB/s", h.ts_ns, *h.swap_in_bps / 1e6);
    if (h.disk_read_bps) w.Counter("host disk read", "MB/s", h.ts_ns, *h.disk_read_bps / 1e6);
    if (h.proc_cpu_pct) {
      w.Counter("training process CPU", "% of one core", h.ts_ns, *h.proc_cpu_pct);
    }
    if (h.proc_rss_bytes) {
      w.Counter("training process RSS", "MiB", h.ts_ns, MiB(*h.proc_rss_bytes));
    }
    if (h.job_cpu_pct) {
      w.Counter("job's other ranks on this host CPU", "% of one core", h.ts_ns, *h.job_cpu_pct);
    }
  }
}

void WriteNotes(const store::RunData& d, TraceWriter& w, int64_t end_ns) {
  std::vector<const store::DiagnosticRow*> timed;
  for (const auto& g : d.diagnostics) {
    if (g.ts_ns) timed.push_back(&g);
  }
  if (!timed.empty()) {
    const int64_t tid = w.Thread("diagnostics");
    for (const auto* g : timed) {
      w.Instant(tid, g->level + ": " + g->source, "diagnostic", *g->ts_ns,
                Json{{"level", g->level}, {"source", g->source}, {"message", g->message}});
    }
  }
  if (d.insights.empty()) return;
  const int64_t tid = w.Thread("insights");
  for (const store::InsightRow& i : d.insights) {
    Json args{{"rule_id", i.rule_id},
              {"family", i.family},
              {"severity", i.severity},
              {"message", i.message}};
    AddIf(args, "fix", i.fix);
    if (i.evidence_json) {
      Json evidence = Json::parse(*i.evidence_json, nullptr, false);
      if (!evidence.is_discarded()) args["evidence"] = std::move(evidence);
    }
    w.Instant(tid, "[" + i.severity + "] " + i.rule_id, "insight", end_ns, std::move(args));
  }
}

}  // namespace

namespace {

// A pid for the trace: the run's own when it is a valid one not taken yet, else a free one.
int64_t TracePid(const store::RunInfo& r, std::set<int64_t>* taken) {
  int64_t pid = r.pid > 0 && r.pid <= std::numeric_limits<int32_t>::max() ? r.pid : 1;
  while (!taken->insert(pid).second) pid = pid % std::numeric_limits<int32_t>::max() + 1;
  return pid;
}

// Every event of one run: its process's names, then its tracks.
void WriteRunEvents(const store::RunData& data, TraceWriter& w, const PerfettoOptions& options,
                    int64_t end_ns) {
  const store::RunInfo& r = data.run;
  const int64_t pid = w.pid();
  const std::string process = "gpuprof " + r.run_name +
                              (r.rank ? " (rank " + std::to_string(*r.rank) + ")"
                                      : " (run " + std::to_string(r.run_id) + ")");
  w.Emit(Json{{"name", "process_name"},
              {"ph", "M"},
              {"pid", pid},
              {"tid", 0},
              {"args", {{"name", process}}}});
  w.Emit(Json{{"name", "process_labels"},
              {"ph", "M"},
              {"pid", pid},
              {"tid", 0},
              {"args", {{"labels", r.hostname + ", run " + std::to_string(r.run_id)}}}});
  w.Emit(Json{{"name", "process_sort_index"},
              {"ph", "M"},
              {"pid", pid},
              {"tid", 0},
              {"args", {{"sort_index", r.rank.value_or(0)}}}});
  WriteSteps(data, w);
  WriteComm(data, w);
  WriteKernels(data, w, options);
  WriteCpuOps(data, w, options);
  WriteHostStalls(data, w);
  WriteGpuCounters(data, w);
  WriteHostCounters(data, w);
  WriteNotes(data, w, end_ns);
}

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

PerfettoSummary WritePerfettoTrace(const store::RunData& data, std::ostream& out,
                                   const PerfettoOptions& options) {
  std::set<int64_t> pids;
  const int64_t end_ns = RunEnd(data);
  out << "{\"traceEvents\": [";
  EventSink sink{out};
  TraceWriter w(sink, TracePid(data.run, &pids));
  WriteRunEvents(data, w, options, end_ns);
  out << "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": " << Dump(OtherData(data, end_ns))
      << "}\n";
  return PerfettoSummary{sink.events, w.tracks()};
}

PerfettoSummary WritePerfettoGroupTrace(const std::vector<GroupTraceRank>& ranks,
                                        const GroupTraceInfo& info, std::ostream& out,
                                        const PerfettoOptions& options) {
  std::set<int64_t> pids;
  out << "{\"traceEvents\": [";
  EventSink sink{out};
  PerfettoSummary summary;
  Json per_rank = Json::array();
  for (const GroupTraceRank& rank : ranks) {
    if (!rank.data) continue;
    const int64_t end_ns = RunEnd(*rank.data);
    TraceWriter w(sink, TracePid(rank.data->run, &pids), rank.shift_ns);
    WriteRunEvents(*rank.data, w, options, end_ns);
    summary.tracks += w.tracks();
    Json o = OtherData(*rank.data, end_ns);
    o["trace_pid"] = w.pid();
    o["shift_ns"] = rank.shift_ns;
    per_rank.push_back(std::move(o));
  }
  summary.events = sink.events;
  Json other{{"exported_by", "gpuprof export --group --format perfetto"},
             {"group_id", info.group_id},
             {"time_base",
              "ts and dur are microseconds since base_unix_ns, the earliest rank's start on the "
              "common clock; a rank's run time t is at (start_unix_ns - clock_offset_ns - "
              "base_unix_ns + t) / 1000 (shift_ns per rank), so the ranks line up"},
             {"base_unix_ns", info.base_unix_ns},
             {"base_utc", UtcIso(info.base_unix_ns)},
             {"clock_alignment", info.alignment},
             {"ranks", std::move(per_rank)}};
  out << "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": " << Dump(other) << "}\n";
  return summary;
}

std::string PerfettoTraceJson(const store::RunData& run, const PerfettoOptions& options) {
  std::ostringstream out;
  WritePerfettoTrace(run, out, options);
  return std::move(out).str();
}

const std::vector<std::string>& PerfettoFormatNames() {
  static const std::vector<std::string> kNames = {"perfetto", "chrome"};
  return kNames;
}

}  // namespace gpuprof::traces
