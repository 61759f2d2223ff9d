#include "telemetry/neuron_collector.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

extern char** environ;

namespace gpuprof::telemetry {

namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// A report line longer than this without a newline is dropped as malformed (real reports are
// tens to hundreds of KB even on the largest instances).
constexpr size_t kMaxLineBytes = size_t{64} << 20;
// Distinct error strings from reports noted at most this many times per run.
constexpr size_t kMaxNotedProblems = 64;
// After EOF on its stdout, how long the reader waits for the child to exit to learn its status.
constexpr int64_t kExitReapWaitMs = 1000;

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

Status NotFound(const std::string& tried) {
  return Status::Error("neuron-monitor not found (tried " + tried + "): install aws-neuronx-tools");
}

// ---- JSON helpers: a missing or mistyped member is simply unknown ----

const json* Member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::optional<int64_t> IntMember(const json& obj, const char* key) {
  const json* v = Member(obj, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && std::fabs(d) < 9e18) return static_cast<int64_t>(std::llround(d));
  }
  return std::nullopt;
}

std::optional<double> NumMember(const json& obj, const char* key) {
  const json* v = Member(obj, key);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  double d = v->get<double>();
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<std::string> StrMember(const json& obj, const char* key) {
  const json* v = Member(obj, key);
  if (v == nullptr || !v->is_string()) return std::nullopt;
  return v->get<std::string>();
}

// The "error" member of a report object; empty when there is none.
std::string ErrorOf(const json& obj) { return StrMember(obj, "error").value_or(""); }

// "12" -> 12; anything but a plain non-negative decimal -> nullopt.
std::optional<int64_t> CoreIndex(const std::string& key) {
  if (key.empty() || key.size() > 9) return std::nullopt;
  int64_t v = 0;
  for (char ch : key) {
    if (ch < '0' || ch > '9') return std::nullopt;
    v = v * 10 + (ch - '0');
  }
  return v;
}

void AddTo(std::vector<std::pair<int64_t, int64_t>>& v, int64_t core, int64_t bytes) {
  for (auto& [c, b] : v) {
    if (c == core) {
      b += bytes;
      return;
    }
  }
  v.emplace_back(core, bytes);
}

void ParseRuntime(const json& entry, NeuronReport* out) {
  NeuronRuntimeReport rt;
  rt.pid = IntMember(entry, "pid").value_or(0);
  const std::string label = "runtime " + std::to_string(rt.pid);
  const std::string entry_error = ErrorOf(entry);
  const json* report = Member(entry, "report");
  if (!entry_error.empty()) out->problems.push_back(label + ": " + entry_error);
  if (!entry_error.empty() || report == nullptr || !report->is_object()) {
    out->runtimes.push_back(std::move(rt));
    return;
  }

  if (const json* counters = Member(*report, "neuroncore_counters");
      counters != nullptr && counters->is_object()) {
    const std::string err = ErrorOf(*counters);
    const json* in_use = Member(*counters, "neuroncores_in_use");
    if (!err.empty()) {
      out->problems.push_back(label + ": neuroncore_counters: " + err);
    } else if (in_use != nullptr && (in_use->is_object() || in_use->is_null())) {
      rt.util_known = true;
      if (in_use->is_object()) {
        for (const auto& [key, core] : in_use->items()) {
          auto index = CoreIndex(key);
          auto util = NumMember(core, "neuroncore_utilization");
          if (index && util) rt.core_util.emplace_back(*index, *util);
        }
      }
    }
  }

  if (const json* memory = Member(*report, "memory_used");
      memory != nullptr && memory->is_object()) {
    const std::string err = ErrorOf(*memory);
    const json* used = Member(*memory, "neuron_runtime_used_bytes");
    if (!err.empty()) {
      out->problems.push_back(label + ": memory_used: " + err);
    } else if (used != nullptr && used->is_object()) {
      const std::optional<int64_t> total = IntMember(*used, "neuron_device");
      const json* breakdown = nullptr;
      if (const json* b = Member(*used, "usage_breakdown"))
        breakdown = Member(*b, "neuroncore_memory_usage");
      int64_t breakdown_sum = 0;
      bool have_breakdown = false;
      if (breakdown != nullptr && breakdown->is_object()) {
        have_breakdown = true;
        for (const auto& [key, categories] : breakdown->items()) {
          auto index = CoreIndex(key);
          if (!index || !categories.is_object()) continue;
          int64_t bytes = 0;
          for (const auto& [name, value] : categories.items()) {
            if (value.is_number_integer() && value.get<int64_t>() > 0)
              bytes += value.get<int64_t>();
          }
          AddTo(rt.core_mem, *index, bytes);
          breakdown_sum += bytes;
        }
      }
      if (have_breakdown || total) {
        rt.mem_known = true;
        // What the breakdown does not place (all of it, without one) goes on the runtime's
        // lowest core, so that every byte is counted on exactly one core.
        const int64_t rest = total ? *total - breakdown_sum : 0;
        if (rest > 0) {
          int64_t first = -1;
          for (const auto& [c, u] : rt.core_util) first = first < 0 ? c : std::min(first, c);
          if (first < 0) {
            for (const auto& [c, b] : rt.core_mem) first = first < 0 ? c : std::min(first, c);
          }
          AddTo(rt.core_mem, first < 0 ? 0 : first, rest);
        }
      }
    }
  }
  out->runtimes.push_back(std::move(rt));
}

}  // namespace

// ---- path resolution --------------------------------------------------------------------------

Expected<std::string> ResolveNeuronMonitorPath(const std::string& configured) {
  if (!configured.empty()) {
    if (IsExecutableFile(configured)) return configured;
    return NotFound(configured);
  }
  const char* env = std::getenv(kNeuronMonitorEnv);
  if (env != nullptr && *env != '\0') {
    if (IsExecutableFile(env)) return std::string(env);
    return NotFound(std::string(env) + " from $" + kNeuronMonitorEnv);
  }
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string_view rest(path);
    while (true) {
      size_t colon = rest.find(':');
      const std::string_view dir = rest.substr(0, colon);  // empty means the current directory
      std::string candidate = dir.empty() ? std::string(".") : std::string(dir);
      candidate.append("/").append(kNeuronMonitorName);
      if (IsExecutableFile(candidate)) return candidate;
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  if (IsExecutableFile(kNeuronMonitorDefaultPath)) return std::string(kNeuronMonitorDefaultPath);
  return NotFound(std::string("'") + kNeuronMonitorName + "' on $PATH and " +
                  kNeuronMonitorDefaultPath);
}

// ---- report parsing -------------------------------------------------------------------------

Expected<NeuronReport> ParseNeuronReport(std::string_view line) {
  json doc;
  try {
    doc = json::parse(line.begin(), line.end());
  } catch (const json::exception& e) {
    return Status::Error(e.what());
  }
  if (!doc.is_object()) return Status::Error("not a JSON object");

  NeuronReport r;
  try {
    if (const json* hw = Member(doc, "neuron_hardware_info"); hw != nullptr && hw->is_object()) {
      NeuronHardwareInfo info;
      info.device_count = IntMember(*hw, "neuron_device_count");
      info.cores_per_device = IntMember(*hw, "neuroncore_per_device_count");
      info.device_memory_bytes = IntMember(*hw, "neuron_device_memory_size");
      info.device_type = StrMember(*hw, "neuron_device_type");
      info.core_version = StrMember(*hw, "neuroncore_version");
      info.error = ErrorOf(*hw);
      if (!info.error.empty()) r.problems.push_back("neuron_hardware_info: " + info.error);
      r.hardware = std::move(info);
    }
    if (const json* data = Member(doc, "neuron_runtime_data");
        data != nullptr && data->is_array()) {
      r.has_runtime_data = true;
      for (const json& entry : *data) {
        if (entry.is_object()) ParseRuntime(entry, &r);
      }
    }
  } catch (const json::exception& e) {
    return Status::Error(e.what());
  }
  return r;
}

void NeuronReportRows(const NeuronReport& report, int64_t core_count, int64_t now_rel_ns,
                      const std::vector<int64_t>& pids, std::vector<store::GpuSampleRow>* out,
                      int64_t* dropped_core) noexcept {
  if (dropped_core != nullptr) *dropped_core = -1;
  if (core_count <= 0) return;
  auto ours = [&](int64_t pid) { return std::find(pids.begin(), pids.end(), pid) != pids.end(); };
  bool util_unknown = !report.has_runtime_data;
  bool mem_unknown = !report.has_runtime_data;
  bool proc_unknown = pids.empty() || !report.has_runtime_data;
  for (const auto& rt : report.runtimes) {
    if (!rt.util_known) util_unknown = true;
    if (!rt.mem_known) {
      mem_unknown = true;
      if (ours(rt.pid)) proc_unknown = true;
    }
  }
  try {
    const size_t base = out->size();
    out->resize(base + static_cast<size_t>(core_count));
    for (int64_t c = 0; c < core_count; ++c) {
      store::GpuSampleRow& row = (*out)[base + static_cast<size_t>(c)];
      row.ts_ns = now_rel_ns;
      row.gpu_index = c;
      if (!util_unknown) row.util_pct = 0.0;
      if (!mem_unknown) row.mem_used_bytes = 0;
      if (!proc_unknown) row.proc_mem_bytes = 0;
    }
    auto at = [&](int64_t core) -> store::GpuSampleRow* {
      if (core < 0 || core >= core_count) {
        if (dropped_core != nullptr) *dropped_core = core;
        return nullptr;
      }
      return &(*out)[base + static_cast<size_t>(core)];
    };
    for (const auto& rt : report.runtimes) {
      const bool mine = ours(rt.pid);
      for (const auto& [core, util] : rt.core_util) {
        if (store::GpuSampleRow* row = at(core))
          row->util_pct = std::max(row->util_pct.value_or(0.0), util);
      }
      for (const auto& [core, bytes] : rt.core_mem) {
        store::GpuSampleRow* row = at(core);
        if (row == nullptr) continue;
        if (row->mem_used_bytes) *row->mem_used_bytes += bytes;
        if (mine && row->proc_mem_bytes) *row->proc_mem_bytes += bytes;
      }
    }
  } catch (...) {
    // Out of memory: whatever rows were made stay.
  }
}

// ---- the collector ----------------------------------------------------------------------------

NeuronCollector::NeuronCollector(NeuronCollectorOptions options) : options_(std::move(options)) {}

NeuronCollector::~NeuronCollector() { Stop(); }

Expected<std::unique_ptr<NeuronCollector>> NeuronCollector::Open(NeuronCollectorOptions options) {
  if (options.period_s < 1) {
    return Status::Error("neuron-monitor period must be at least 1 s, got " +
                         std::to_string(options.period_s));
  }
  if (options.monitor_path.empty()) return NotFound("an empty path");
  std::unique_ptr<NeuronCollector> c(new NeuronCollector(std::move(options)));
  const std::string& path = c->options_.monitor_path;
  Status started = c->Start();
  if (!started.ok()) return started;

  const int64_t timeout_ms = c->options_.first_report_timeout_ms > 0
                                 ? c->options_.first_report_timeout_ms
                                 : 5000 + 2000 * int64_t{c->options_.period_s};
  bool have = false;
  {
    std::unique_lock<std::mutex> lock(c->mu_);
    have = c->first_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
      return c->have_hardware_ || c->child_gone_.load();
    }) && c->have_hardware_;
  }
  if (!have) {
    const bool gone = c->child_gone_.load();
    c->Stop();
    if (gone) {
      // The reader described the exit (with the stderr tail) before Stop removed the files.
      return Status::Error("neuron-monitor (" + path + ") exited before its first report (" +
                           c->exit_description_ + ")");
    }
    return Status::Error("neuron-monitor (" + path + ") sent no report within " +
                         std::to_string(timeout_ms) + " ms");
  }

  NeuronHardwareInfo hw;
  {
    std::lock_guard<std::mutex> lock(c->mu_);
    hw = c->hardware_;
  }
  if (!hw.error.empty())
    return Status::Error("neuron-monitor reports no usable Neuron device: " + hw.error);
  if (!hw.device_count || *hw.device_count <= 0) {
    return Status::Error("neuron-monitor reports no Neuron device (neuron_device_count " +
                         (hw.device_count ? std::to_string(*hw.device_count) : "missing") + ")");
  }
  if (!hw.cores_per_device || *hw.cores_per_device <= 0 || *hw.cores_per_device > 1024 ||
      *hw.device_count > 1024) {
    return Status::Error("neuron-monitor reports an unusable device layout (neuron_device_count " +
                         std::to_string(*hw.device_count) + ", neuroncore_per_device_count " +
                         (hw.cores_per_device ? std::to_string(*hw.cores_per_device) : "missing") +
                         ")");
  }
  c->core_count_ = *hw.device_count * *hw.cores_per_device;
  const std::string model =
      "AWS NeuronCore" + (hw.core_version ? "-" + *hw.core_version : std::string());
  for (int64_t i = 0; i < c->core_count_; ++i) {
    GpuDevice d;
    d.index = i;
    d.name = model + " " + std::to_string(i);
    c->devices_.push_back(std::move(d));
  }
  return c;
}

Status NeuronCollector::Start() {
  if (stopped_.load()) return Status::Error("this neuron-monitor collector was stopped");
  if (started_) return Status::Ok();
  Status s = WriteConfig();
  if (!s.ok()) return s;
  if (pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    return Status::Error(std::string("cannot create a pipe for neuron-monitor: ") +
                         std::strerror(errno));
  }
  s = Spawn();
  if (!s.ok()) return s;
  try {
    reader_ = std::thread(&NeuronCollector::ReaderLoop, this);
  } catch (const std::exception& e) {
    Stop();
    return Status::Error(std::string("cannot start the neuron-monitor reader thread: ") + e.what());
  }
  started_ = true;
  return Status::Ok();
}

Status NeuronCollector::WriteConfig() {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / "gpuprof_neuron_XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return Status::Error("cannot create a temp directory for the neuron-monitor config (" + tmpl +
                         "): " + std::strerror(errno));
  }
  temp_dir_ = tmpl;
  config_path_ = temp_dir_ + "/monitor.json";
  stderr_path_ = temp_dir_ + "/stderr.log";

  // Only the runtime-level groups we read, for every runtime (tag_filter ".*"; our own process
  // tree is picked out by pid). memory_info is a cheap system-level group that makes the tool
  // report every period even while no Neuron runtime exists yet (before the model loads).
  json metric_counters = json::object({{"type", "neuroncore_counters"}});
  json metric_memory = json::object({{"type", "memory_used"}});
  json runtime = json::object();
  runtime["tag_filter"] = ".*";
  runtime["metrics"] = json::array({metric_counters, metric_memory});
  json config = json::object();
  config["period"] = std::to_string(options_.period_s) + "s";
  config["neuron_runtimes"] = json::array({runtime});
  config["system_metrics"] = json::array({json::object({{"type", "memory_info"}})});

  std::ofstream f(config_path_, std::ios::trunc);
  f << config.dump(2) << "\n";
  f.close();
  if (!f) return Status::Error("cannot write the neuron-monitor config " + config_path_);
  return Status::Ok();
}

Status NeuronCollector::Spawn() {
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    return Status::Error(std::string("cannot create a pipe for neuron-monitor: ") +
                         std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group (a terminal's Ctrl-C is ours to handle, not the monitor's), no
  // blocked signals and default dispositions (Python ignores SIGPIPE; with the default the
  // monitor dies if we vanish and the pipe closes).
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2})
    sigaddset(&defaults, sig);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);

  std::string arg0 = options_.monitor_path;
  std::string arg1 = "-c";
  std::string arg2 = config_path_;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, options_.monitor_path.c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(out_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    return Status::Error("cannot start neuron-monitor (" + options_.monitor_path +
                         "): " + std::strerror(rc));
  }
  stdout_fd_ = out_pipe[0];
  child_pid_.store(pid);
  return Status::Ok();
}

void NeuronCollector::ReaderLoop() noexcept {
  try {
    std::string buf;
    bool discarding = false;  // inside an over-long line: drop until its newline
    std::vector<char> chunk(size_t{1} << 16);
    while (true) {
      pollfd fds[2] = {{stdout_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        OnChildGone();
        return;
      }
      if (fds[1].revents != 0) return;  // Stop(): the child is ended there
      if (fds[0].revents == 0) continue;
      const ssize_t n = read(stdout_fd_, chunk.data(), chunk.size());
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        OnChildGone();
        return;
      }
      if (n == 0) {
        if (!discarding && !buf.empty()) HandleLine(buf);
        OnChildGone();
        return;
      }
      // buf holds no newline before `scan`: everything up to the last one was handled.
      size_t scan = buf.size();
      buf.append(chunk.data(), static_cast<size_t>(n));
      size_t line_start = 0;
      size_t nl;
      while ((nl = buf.find('\n', scan)) != std::string::npos) {
        if (!discarding) HandleLine(std::string_view(buf).substr(line_start, nl - line_start));
        discarding = false;
        line_start = scan = nl + 1;
      }
      buf.erase(0, line_start);
      if (!discarding && buf.size() > kMaxLineBytes) {
        if (++malformed_lines_ == 1) {
          AddNote("neuron-monitor: skipped a report line longer than " +
                  std::to_string(kMaxLineBytes >> 20) + " MiB");
        }
        discarding = true;
      }
      if (discarding) buf.clear();
    }
  } catch (...) {
    AddNote(
        "neuron-monitor: the report reader failed (out of memory); no Neuron readings from "
        "now on");
    {
      std::lock_guard<std::mutex> lock(mu_);
      child_gone_.store(true);
    }
    first_cv_.notify_all();
  }
}

void NeuronCollector::HandleLine(std::string_view line) noexcept {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
    line.remove_suffix(1);
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  if (line.empty()) return;
  try {
    auto parsed = ParseNeuronReport(line);
    if (!parsed.ok()) {
      if (++malformed_lines_ == 1) {
        std::string head(line.substr(0, 120));
        AddNote("neuron-monitor: skipped a malformed report line (" + parsed.error() +
                "): " + head + (line.size() > head.size() ? "..." : ""));
      }
      return;
    }
    for (const std::string& p : parsed.value().problems) {
      if (noted_problems_.size() < kMaxNotedProblems && noted_problems_.insert(p).second)
        AddNote("neuron-monitor: " + p + "; values it affects are unknown while it lasts");
    }
    auto latest = std::make_shared<Latest>();
    latest->report = std::move(parsed).value();
    latest->received = SteadyClock::now();
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!have_hardware_ && latest->report.hardware) {
        hardware_ = *latest->report.hardware;
        have_hardware_ = true;
        first = true;
      }
      latest_ = std::move(latest);
    }
    reports_.fetch_add(1);
    if (first) first_cv_.notify_all();
  } catch (...) {
    // Out of memory while parsing: this report is lost.
  }
}

bool NeuronCollector::TryReap(int64_t wait_ms) noexcept {
  const int64_t pid = child_pid_.load();
  if (pid <= 0) return true;
  const auto deadline =
      SteadyClock::now() + std::chrono::milliseconds(std::max<int64_t>(wait_ms, 0));
  while (true) {
    int status = 0;
    const pid_t r = waitpid(static_cast<pid_t>(pid), &status, wait_ms < 0 ? 0 : WNOHANG);
    if (r == static_cast<pid_t>(pid)) {
      exit_status_ = status;
      exit_known_ = true;
      child_pid_.store(-1);
      return true;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      // ECHILD: someone else reaped it (or SIGCHLD is ignored); it is gone either way.
      exit_known_ = false;
      child_pid_.store(-1);
      return true;
    }
    if (SteadyClock::now() >= deadline) return false;
    usleep(5000);
  }
}

std::string NeuronCollector::StderrTail() const {
  if (stderr_path_.empty()) return "";
  std::ifstream f(stderr_path_, std::ios::binary);
  if (!f) return "";
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  f.seekg(from);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  const size_t nl = text.find_last_of('\n');
  std::string last = nl == std::string::npos ? text : text.substr(nl + 1);
  if (last.size() > 300) last = last.substr(0, 300) + "...";
  return last;
}

std::string NeuronCollector::ExitDescription() const {
  std::string what;
  if (!exit_known_) {
    what = "exit status unknown";
  } else if (WIFEXITED(exit_status_)) {
    what = "exit status " + std::to_string(WEXITSTATUS(exit_status_));
  } else if (WIFSIGNALED(exit_status_)) {
    const int sig = WTERMSIG(exit_status_);
    const char* name = strsignal(sig);
    what = "killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  } else {
    what = "status " + std::to_string(exit_status_);
  }
  const std::string tail = StderrTail();
  if (!tail.empty()) what += "; stderr: " + tail;
  return what;
}

void NeuronCollector::OnChildGone() noexcept {
  try {
    const bool reaped = TryReap(kExitReapWaitMs);
    if (reaped) {
      exit_description_ = ExitDescription();
      AddNote("neuron-monitor exited (" + exit_description_ + "); no Neuron readings from now on");
    } else {
      exit_description_ = "it closed its output but is still running";
      AddNote(
          "neuron-monitor closed its output but is still running; no Neuron readings from "
          "now on");
    }
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    child_gone_.store(true);
  }
  first_cv_.notify_all();
}

void NeuronCollector::Stop() noexcept {
  if (stopped_.exchange(true)) return;
  if (stop_pipe_[1] >= 0) {
    const char byte = 1;
    ssize_t ignored = write(stop_pipe_[1], &byte, 1);
    (void)ignored;
  }
  try {
    if (reader_.joinable()) reader_.join();
  } catch (...) {
  }
  // Only this thread touches the child from here on.
  const int64_t pid = child_pid_.load();
  if (pid > 0 && !TryReap(0)) {
    // The monitor leads its own process group: signal the group, so helpers it started go too.
    kill(-static_cast<pid_t>(pid), SIGTERM);
    kill(static_cast<pid_t>(pid), SIGTERM);
    if (!TryReap(options_.stop_grace_ms)) {
      kill(-static_cast<pid_t>(pid), SIGKILL);
      kill(static_cast<pid_t>(pid), SIGKILL);
      TryReap(-1);
    }
  }
  if (malformed_lines_ > 1) {
    AddNote("neuron-monitor: " + std::to_string(malformed_lines_) +
            " malformed report lines were skipped in total");
  }
  for (int* fd : {&stdout_fd_, &stop_pipe_[0], &stop_pipe_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  RemoveTempDir();
}

void NeuronCollector::RemoveTempDir() noexcept {
  if (temp_dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(temp_dir_, ec);
}

bool NeuronCollector::Sample(int64_t now_rel_ns, const std::vector<int64_t>& pids,
                             std::vector<store::GpuSampleRow>* out) noexcept {
  try {
    out->clear();
    if (stopped_.load() || child_gone_.load()) return false;
    std::shared_ptr<const Latest> latest;
    {
      std::lock_guard<std::mutex> lock(mu_);
      latest = latest_;
    }
    if (!latest) return false;
    const int64_t stale_ms =
        options_.stale_after_ms > 0 ? options_.stale_after_ms : 5000 * int64_t{options_.period_s};
    const auto age = SteadyClock::now() - latest->received;
    if (age > std::chrono::milliseconds(stale_ms)) {
      if (!stale_noted_) {
        stale_noted_ = true;
        AddNote("neuron-monitor sent no report for more than " + std::to_string(stale_ms) +
                " ms; no Neuron readings until it reports again");
      }
      return false;
    }
    int64_t dropped = -1;
    NeuronReportRows(latest->report, core_count_, now_rel_ns, pids, out, &dropped);
    if (dropped >= 0 && !dropped_core_noted_) {
      dropped_core_noted_ = true;
      AddNote("neuron-monitor reported NeuronCore " + std::to_string(dropped) + ", beyond the " +
              std::to_string(core_count_) +
              " cores of its hardware info; readings of such cores are ignored");
    }
    return !out->empty();
  } catch (...) {
    return false;
  }
}

void NeuronCollector::AddNote(std::string note) noexcept {
  try {
    std::lock_guard<std::mutex> lock(notes_mu_);
    notes_.push_back(std::move(note));
  } catch (...) {
  }
}

std::vector<std::string> NeuronCollector::TakeNotes() {
  std::lock_guard<std::mutex> lock(notes_mu_);
  return std::exchange(notes_, {});
}

}  // namespace gpuprof::telemetry
