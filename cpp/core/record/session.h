// A profiled run, end to end: opens the store, registers the run, starts the telemetry
// collectors and the recorder, and at Stop() closes the run and produces the insight summary.
// This is the object the Python layer (gpuprof.profile) drives.
//
// Threading: Start/Stop/SetRunField from one control thread; Emit from the training thread
// (the same thread in practice); AddDiagnostic from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis.h"
#include "record/phase_names.h"
#include "record/recorder.h"
#include "store/sqlite_store.h"
#include "telemetry/gpu_collector.h"
#include "traces/kernel_capture.h"
#include "traces/trace_plan.h"

namespace gpuprof::record {

struct SessionConfig {
  std::string db_path = "gpuprof.db";
  store::RunInfo run;  // run_name and the descriptive fields; ids/times are filled in
  RecorderOptions recorder;
  store::StoreWriter::Options writer;  // queue, batching, retries (defaults: StoreWriter)
  telemetry::GpuCollectorOptions gpu;
  bool host_telemetry = true;  // profile(host=); host sampling also needs recorder.host_hz > 0
  std::string proc_root = "/proc";
  // When this process is one of several ranks a launcher started on this host: the launcher's
  // pid. Host sampling then also reads the job's other ranks (HostSampleRow::job_cpu_pct).
  std::optional<int64_t> job_parent_pid;
  analysis::AnalysisOptions analysis;
  // Kernel traces (profile(trace_every_n_steps=, trace_range=, continuous_traces_hz=)).
  traces::TracePlan trace_plan;
  // How traced steps are captured: "cupti" (a CUDA run: kernels through CUPTI, natively),
  // "cpu_ops" (the Python layer records CPU operators with torch.profiler; AddCpuOps), or "".
  std::string trace_backend;
  std::string cupti_library;  // "" = KernelTracer's default candidates
};

// One operator's totals over a traced window, as the Python layer hands them (AddCpuOps).
struct CpuOpTotals {
  std::string name;
  int64_t calls = 0;
  int64_t self_cpu_ns = 0;
  std::optional<int64_t> cpu_ns;
};
// Rows kept per traced window; the rest are folded into one "(N other operators)" row.
inline constexpr size_t kMaxCpuOpRows = 50;

// The diagnostics source of rows the store could not take (StoreWriter::lost()).
inline constexpr const char* kStoreDiagnosticSource = "store";
// "1234 rows of this run were not stored: gpu_samples 1100 (12.3 s to 17.8 s), steps 134 (...);
// first failure: <error>. Figures from those tables miss them."
std::string LostRowsMessage(const std::vector<store::LostRows>& lost, uint64_t dropped,
                            const std::optional<std::string>& error);

struct StopResult {
  std::string summary;               // the block printed at exit ("" if analysis failed)
  std::optional<std::string> error;  // what went wrong inside gpuprof while finishing
};

class Session {
 public:
  static Expected<std::unique_ptr<Session>> Start(SessionConfig config);
  ~Session();  // Stop("failed") if still running; never throws
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Hot path (training thread). See Recorder::Emit.
  void Emit(EventKind kind, uint32_t arg = 0, int64_t value = 0) noexcept {
    recorder_->Emit(kind, arg, value);
    if (capture_) ToCapture(kind, value);
  }
  void EmitAt(int64_t ts_ns, EventKind kind, uint32_t arg, int64_t value) noexcept {
    recorder_->EmitAt(ts_ns, kind, arg, value);
    if (capture_) ToCapture(kind, value);
  }
  // Whether step `step` is traced (TracePlan); the trace plan as text.
  bool StepTraced(int64_t step) const { return config_.trace_plan.StepTraced(step); }
  const traces::TracePlan& trace_plan() const { return config_.trace_plan; }
  // The CPU operators of traced step `step` (monotonic ns span), from torch.profiler: written
  // as cpu_ops rows, the kMaxCpuOpRows with the most self time and one row for the rest.
  void AddCpuOps(int64_t step, int64_t start_mono_ns, int64_t end_mono_ns,
                 std::vector<CpuOpTotals> ops);
  uint32_t InternPhase(const std::string& name) { return names_.Intern(name); }
  // From any thread: one DDP bucket's collective (monotonic ns). See Recorder::AddCommBucket.
  void AddCommBucket(int64_t bucket, int64_t start_mono_ns, int64_t end_mono_ns,
                     std::optional<int64_t> bytes) {
    recorder_->AddCommBucket(store::CommBucketRow{0, bucket, start_mono_ns, end_mono_ns, bytes});
  }

  // From any thread: the pids of the job's other ranks on this host, as the ranks told each
  // other; host sampling reads their CPU (job_cpu_pct) from its next tick.
  void SetJobPids(std::vector<int64_t> pids) { recorder_->SetJobPids(std::move(pids)); }

  void AddDiagnostic(const std::string& level, const std::string& source,
                     const std::string& message);
  void SetTelemetryStatus(const std::string& source, bool available,
                          const std::optional<std::string>& backend,
                          const std::optional<std::string>& reason);
  // Updates descriptive run fields (device_kind, torch_version, flops_per_step, ...).
  Status UpdateRun(const std::function<void(store::RunInfo*)>& edit);

  // Ends the run: stops the recorder and telemetry, writes everything, marks the run
  // status ("ok" | "failed") and runs the insights. Idempotent (later calls return the
  // first result).
  StopResult Stop(const std::string& status, const std::optional<std::string>& error);

  int64_t run_id() const { return info_.run_id; }
  const std::string& db_path() const { return config_.db_path; }
  const store::RunInfo& info() const { return info_; }
  bool stopped() const { return stopped_; }
  Recorder& recorder() { return *recorder_; }
  int64_t RelNow() const { return clock::NowNs() - anchor_.mono_ns; }
  const clock::Anchor& anchor() const { return anchor_; }

 private:
  explicit Session(SessionConfig config) : config_(std::move(config)) {}

  SessionConfig config_;
  clock::Anchor anchor_;
  store::RunInfo info_;
  PhaseNames names_;
  std::unique_ptr<store::SqliteStore> control_;  // lifecycle connection
  std::unique_ptr<store::StoreWriter> writer_;
  std::unique_ptr<Recorder> recorder_;
  void ToCapture(EventKind kind, int64_t value) noexcept {
    using traces::StepEdge;
    switch (kind) {
      case EventKind::kForwardBegin:
        capture_->OnEvent(StepEdge::kForwardBegin);
        break;
      case EventKind::kBackwardBegin:
        capture_->OnEvent(StepEdge::kBackwardBegin);
        break;
      case EventKind::kWaitBegin:
        capture_->OnEvent(StepEdge::kWaitBegin);
        break;
      case EventKind::kOptimizerEnd:
        capture_->OnEvent(StepEdge::kOptimizerEnd);
        break;
      case EventKind::kStepBegin:
        capture_->OnEvent(StepEdge::kStepBegin, value);
        break;
      case EventKind::kStepEnd:
        capture_->OnEvent(StepEdge::kStepEnd);
        break;
      case EventKind::kExcludeBegin:
        capture_->OnEvent(StepEdge::kExcludeBegin);
        break;
      case EventKind::kExcludeEnd:
        capture_->OnEvent(StepEdge::kExcludeEnd);
        break;
      default:
        break;
    }
  }
  void StartTraces();  // Start(): the kernel capture or the status saying why there is none
  void StopTraces();   // Stop(): after the recorder closed the last step

  std::unique_ptr<traces::KernelCapture> capture_;
  bool stopped_ = false;
  StopResult result_;
};

}  // namespace gpuprof::record
