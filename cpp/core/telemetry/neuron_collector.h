// NeuronCollector: AWS Neuron (Trainium / Inferentia) telemetry from AWS's `neuron-monitor` tool
// (package aws-neuronx-tools), run as a child process. There is no library to link: the tool is
// the supported interface. It reads a JSON config (`-c file`) naming metric groups and a period,
// and prints one JSON report per line on stdout at that period.
//
// The collector writes that config to a private temp directory, spawns the tool with its
// stdout on a pipe (stdin /dev/null, stderr into a file in the same directory, its own process
// group, default signal dispositions), and reads the reports on a reader thread it owns. Each
// report is parsed into a NeuronReport; Sample() turns the latest one into rows without ever
// waiting on the child (it only copies a shared pointer under a mutex).
//
// Rows: one per NeuronCore (GpuSampleRow::gpu_index = the NeuronCore index across the whole
// instance, as neuron-monitor numbers them; core c sits on Neuron device c / cores_per_device).
//   util_pct       neuroncore_counters.neuroncores_in_use[c].neuroncore_utilization, an average
//                  over the monitor's period (repeated on every Sample() until the next report);
//                  0 for a core no runtime has in use; nullopt when a runtime's counters failed
//   mem_used_bytes device memory on core c held by every monitored Neuron runtime
//   proc_mem_bytes the same, for runtimes whose pid is in `pids` (0 when none of them is listed)
//   everything else (mem_total, power, temp, clocks, PCIe): nullopt, neuron-monitor has none of it
// Memory attribution per core: memory_used.neuron_runtime_used_bytes.usage_breakdown.
// neuroncore_memory_usage[c] summed over its categories. A runtime without that breakdown puts
// its whole `neuron_device` total on the lowest core it has in use (core 0 if none is listed);
// a total larger than the breakdown's sum puts the difference there too. Each byte is thus on
// exactly one core, and the sum over rows is the runtime's device memory.
//
// Failure policy (like NvmlCollector's):
//   - the tool cannot be found: Open() fails "neuron-monitor not found (tried ...): install
//     aws-neuronx-tools"; it cannot be started, exits or stays silent before its first report,
//     or reports no Neuron device: Open() fails saying which;
//   - a report line that is not a JSON object: skipped, one note the first time (a count of all
//     skipped lines is noted at Stop when there were several);
//   - an `error` string in a report (runtime entry, metric group, hardware info): the affected
//     values are nullopt, one note per distinct message;
//   - the child exiting (or closing its stdout): one note with its exit status and the last line
//     of its stderr; every later Sample() returns false;
//   - no new report for stale_after (default 5 periods): Sample() returns false (the last values
//     are too old to stand for now), one note; it recovers when reports resume.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "telemetry/gpu_collector.h"
#include "util/status.h"

namespace gpuprof::telemetry {

// Environment variable naming the neuron-monitor executable (overrides PATH and the default).
inline constexpr const char* kNeuronMonitorEnv = "GPUPROF_NEURON_MONITOR";
inline constexpr const char* kNeuronMonitorName = "neuron-monitor";
inline constexpr const char* kNeuronMonitorDefaultPath = "/opt/aws/neuron/bin/neuron-monitor";
// The first Neuron device node; "auto" only starts neuron-monitor when it exists.
inline constexpr const char* kNeuronDeviceNode = "/dev/neuron0";

// The neuron-monitor to run: `configured` if non-empty, else $GPUPROF_NEURON_MONITOR if set and
// non-empty, else `neuron-monitor` found on $PATH, else /opt/aws/neuron/bin/neuron-monitor. An
// explicit or environment path is the only one tried. The result is an executable regular file;
// otherwise the error is "neuron-monitor not found (tried X): install aws-neuronx-tools".
Expected<std::string> ResolveNeuronMonitorPath(const std::string& configured);

// One parsed neuron-monitor report (the parts gpuprof uses).
struct NeuronHardwareInfo {
  std::optional<int64_t> device_count;         // neuron_device_count
  std::optional<int64_t> cores_per_device;     // neuroncore_per_device_count
  std::optional<int64_t> device_memory_bytes;  // neuron_device_memory_size (per device)
  std::optional<std::string> device_type;      // neuron_device_type, e.g. "trainium"
  std::optional<std::string> core_version;     // neuroncore_version, e.g. "v2"
  std::string error;                           // non-empty: e.g. the driver is not loaded
};

struct NeuronRuntimeReport {
  int64_t pid = 0;
  // Utilization of the cores this runtime has in use; false when its counters are absent or
  // carry an error (then the cores it uses are unknown).
  bool util_known = false;
  std::vector<std::pair<int64_t, double>> core_util;  // (core index, percent)
  // Device memory of this runtime per core, after the attribution above; false when
  // memory_used is absent or carries an error.
  bool mem_known = false;
  std::vector<std::pair<int64_t, int64_t>> core_mem;  // (core index, bytes)
};

struct NeuronReport {
  std::optional<NeuronHardwareInfo> hardware;  // neuron_hardware_info (always sent by the tool)
  bool has_runtime_data = false;               // neuron_runtime_data was an array
  std::vector<NeuronRuntimeReport> runtimes;
  // Error strings found in the report ("runtime 4242: memory_used: ..."), for notes.
  std::vector<std::string> problems;
};

// Parses one report line. Fails only when the line is not a JSON object (the message says why);
// missing or mistyped members just leave their values unknown.
Expected<NeuronReport> ParseNeuronReport(std::string_view line);

// Appends one row per core 0..core_count-1 from `report` (policy at the top of this file).
// `dropped_core` receives a core index the report names at or beyond core_count (or -1).
void NeuronReportRows(const NeuronReport& report, int64_t core_count, int64_t now_rel_ns,
                      const std::vector<int64_t>& pids, std::vector<store::GpuSampleRow>* out,
                      int64_t* dropped_core = nullptr) noexcept;

struct NeuronCollectorOptions {
  std::string monitor_path;  // the executable (ResolveNeuronMonitorPath)
  // The period asked of neuron-monitor, whole seconds. Its metric-group periods are written in
  // seconds ("1s"); the user guide documents a 5 s default and uses 1 s as the shortest period
  // in every example, and utilization is averaged over the period: 1 s is the finest reading.
  int period_s = 1;
  // How long Open() waits for the first report (it carries the hardware info that defines the
  // devices). 0 = 5 s plus two periods.
  int64_t first_report_timeout_ms = 0;
  // Stop(): SIGTERM, then SIGKILL if the child is still alive after this long.
  int64_t stop_grace_ms = 1000;
  // Sample() returns false when the latest report is older than this. 0 = 5 periods.
  int64_t stale_after_ms = 0;
};

class NeuronCollector final : public GpuCollector {
 public:
  // Writes the config, starts neuron-monitor and waits for its first report. Cold path; blocks
  // up to first_report_timeout_ms (about one period on a Neuron instance).
  static Expected<std::unique_ptr<NeuronCollector>> Open(NeuronCollectorOptions options);

  ~NeuronCollector() override;  // Stop()
  NeuronCollector(const NeuronCollector&) = delete;
  NeuronCollector& operator=(const NeuronCollector&) = delete;
  NeuronCollector(NeuronCollector&&) = delete;
  NeuronCollector& operator=(NeuronCollector&&) = delete;

  std::string backend() const override { return "neuron"; }
  // One per NeuronCore: index = core index, name "AWS NeuronCore-v2 3" (the monitor's
  // neuroncore_version and the index); memory total unknown (it is per device, shared).
  const std::vector<GpuDevice>& devices() const override { return devices_; }
  // Clears *out and appends one row per NeuronCore from the latest report. False once the child
  // is gone or stopped, or when the latest report is stale. Never waits on the child.
  bool Sample(int64_t now_rel_ns, const std::vector<int64_t>& pids,
              std::vector<store::GpuSampleRow>* out) noexcept override;
  // Thread-safe.
  std::vector<std::string> TakeNotes() override;

  // Starts the child and the reader thread; a no-op while running. Fails after Stop().
  Status Start();
  // Stops reading, then ends and reaps the child (SIGTERM, SIGKILL after stop_grace_ms) and
  // removes the temp directory. Idempotent; any thread but the reader.
  void Stop() noexcept;

  const std::string& monitor_path() const { return options_.monitor_path; }
  const std::string& config_path() const { return config_path_; }
  const NeuronHardwareInfo& hardware() const { return hardware_; }
  // The child's pid while it has not been reaped, else -1 (for tests).
  int64_t child_pid() const { return child_pid_.load(); }
  // Reports parsed so far; whether the child has gone (exited or closed its output).
  int64_t reports() const { return reports_.load(); }
  bool child_gone() const { return child_gone_.load(); }

 private:
  struct Latest {
    NeuronReport report;
    std::chrono::steady_clock::time_point received;
  };

  explicit NeuronCollector(NeuronCollectorOptions options);
  Status WriteConfig();
  Status Spawn();
  void ReaderLoop() noexcept;
  void HandleLine(std::string_view line) noexcept;
  void OnChildGone() noexcept;
  // Reaps the child if it has exited (waiting up to `wait_ms`); true once reaped.
  bool TryReap(int64_t wait_ms) noexcept;
  std::string ExitDescription() const;
  std::string StderrTail() const;
  void AddNote(std::string note) noexcept;
  void RemoveTempDir() noexcept;

  NeuronCollectorOptions options_;
  std::string temp_dir_;
  std::string config_path_;
  std::string stderr_path_;
  std::vector<GpuDevice> devices_;
  NeuronHardwareInfo hardware_;
  int64_t core_count_ = 0;

  // Child process. child_pid_ is written by Spawn/TryReap: by the reader thread while it runs,
  // by Stop() after joining it.
  std::atomic<int64_t> child_pid_{-1};
  int exit_status_ = -1;  // waitpid status once reaped, -1 unknown
  bool exit_known_ = false;
  std::string exit_description_;  // set by the reader when the child has gone
  int stdout_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread reader_;
  bool started_ = false;
  std::atomic<bool> stopped_{false};
  std::atomic<bool> child_gone_{false};
  std::atomic<int64_t> reports_{0};

  // Latest report and first-report handshake.
  std::mutex mu_;
  std::condition_variable first_cv_;
  std::shared_ptr<const Latest> latest_;
  bool have_hardware_ = false;

  // Reader-thread state.
  int64_t malformed_lines_ = 0;
  std::set<std::string> noted_problems_;

  // Sampler-thread state.
  bool stale_noted_ = false;
  bool dropped_core_noted_ = false;

  std::mutex notes_mu_;
  std::vector<std::string> notes_;
};

}  // namespace gpuprof::telemetry
