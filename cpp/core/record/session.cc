#include "record/session.h"

#include <unistd.h>

#include <algorithm>
#include <exception>

#include "analysis/format.h"

namespace gpuprof::record {

std::string LostRowsMessage(const std::vector<store::LostRows>& lost, uint64_t dropped,
                            const std::optional<std::string>& error) {
  using analysis::FormatDuration;
  std::string out = std::to_string(dropped) + " rows of this run were not stored";
  for (size_t i = 0; i < lost.size(); ++i) {
    const store::LostRows& l = lost[i];
    out += (i ? ", " : ": ") + l.table + " " + std::to_string(l.rows);
    if (l.first_ns && l.last_ns) {
      out += *l.first_ns == *l.last_ns
                 ? " (at " + FormatDuration(static_cast<double>(*l.first_ns)) + ")"
                 : " (" + FormatDuration(static_cast<double>(*l.first_ns)) + " to " +
                       FormatDuration(static_cast<double>(*l.last_ns)) + ")";
    }
  }
  if (error) out += "; first failure: " + *error;
  out += ". Figures from those tables miss them.";
  return out;
}

Expected<std::unique_ptr<Session>> Session::Start(SessionConfig config) {
  std::unique_ptr<Session> s(new Session(std::move(config)));
  s->anchor_ = clock::Anchor::Take();

  auto store = store::SqliteStore::Open(s->config_.db_path);
  if (!store) return Status::Error(store.error());
  s->control_ = std::move(store.value());

  store::RunInfo info = s->config_.run;
  info.start_unix_ns = s->anchor_.unix_ns;
  info.start_mono_ns = s->anchor_.mono_ns;
  info.status = "running";
  info.pid = static_cast<int64_t>(getpid());
  if (info.gpuprof_version.empty()) info.gpuprof_version = GPUPROF_VERSION;
  if (!info.sample_hz) info.sample_hz = s->config_.recorder.sample_hz;

  // GPU telemetry: unavailable is a recorded fact, not an error.
  std::unique_ptr<telemetry::GpuCollector> gpu;
  std::optional<std::string> gpu_reason;
  auto made = telemetry::MakeGpuCollector(s->config_.gpu);
  if (made) {
    gpu = std::move(made.value());
    info.gpu_backend = gpu->backend();
    info.gpu_count = static_cast<int64_t>(gpu->devices().size());
    if (!gpu->devices().empty()) info.gpu_model = gpu->devices().front().name;
  } else {
    gpu_reason = made.error();
    info.gpu_backend = "none";
  }

  auto run_id = s->control_->BeginRun(info);
  if (!run_id) return Status::Error(run_id.error());
  info.run_id = run_id.value();
  s->info_ = info;

  auto writer = store::StoreWriter::Start(s->config_.db_path, info.run_id, s->config_.writer);
  if (!writer) return Status::Error(writer.error());
  s->writer_ = std::move(writer.value());

  if (gpu) {
    for (const auto& d : gpu->devices()) {
      s->writer_->Push(
          store::GpuInfoRow{d.index, d.name, d.uuid, d.memory_total_bytes, d.sm_clock_max_mhz});
    }
    s->SetTelemetryStatus("gpu", true, gpu->backend(), std::nullopt);
  } else {
    s->SetTelemetryStatus("gpu", false, std::nullopt, gpu_reason);
  }

  std::unique_ptr<telemetry::HostSampler> host;
  std::unique_ptr<telemetry::CpuWaitReader> cpu_wait;
  if (s->config_.host_telemetry && s->config_.recorder.host_hz > 0) {
    host = std::make_unique<telemetry::HostSampler>(info.pid, s->config_.proc_root);
    if (s->config_.job_parent_pid) host->set_job_parent(*s->config_.job_parent_pid);
    s->SetTelemetryStatus("host", true, "procfs", std::nullopt);
    // The stall watch runs with host telemetry (Recorder), and reads the CPU wait of this
    // process's threads where the kernel keeps it.
    s->SetTelemetryStatus("stalls", true, "watch thread", std::nullopt);
    cpu_wait = std::make_unique<telemetry::CpuWaitReader>(s->config_.proc_root + "/" +
                                                          std::to_string(info.pid) + "/task");
    if (auto why = cpu_wait->Unavailable()) {
      s->SetTelemetryStatus("cpu_wait", false, std::nullopt, *why);
      cpu_wait.reset();
    } else {
      s->SetTelemetryStatus("cpu_wait", true, "schedstat", std::nullopt);
    }
  } else {
    // Name the option that turned it off: profile(host=False), or a host rate of 0.
    const std::string why = s->config_.host_telemetry ? "host telemetry disabled (host_hz=0)"
                                                      : "host telemetry disabled (host=False)";
    s->SetTelemetryStatus("host", false, std::nullopt, why);
    s->SetTelemetryStatus("stalls", false, std::nullopt, why);
    s->SetTelemetryStatus("cpu_wait", false, std::nullopt, why);
  }

  s->recorder_ =
      std::make_unique<Recorder>(s->config_.recorder, s->anchor_, s->writer_.get(), &s->names_,
                                 std::move(gpu), std::move(host), std::move(cpu_wait));
  s->StartTraces();
  s->recorder_->Start();
  return s;
}

void Session::StartTraces() {
  const traces::TracePlan& plan = config_.trace_plan;
  if (!plan.enabled()) {
    SetTelemetryStatus("kernels", false, std::nullopt,
                       "kernel tracing is off (profile(trace_every_n_steps=N), trace_range=(a, "
                       "b) or continuous_traces_hz=f turns it on)");
    return;
  }
  if (config_.trace_backend == "cpu_ops") {
    SetTelemetryStatus("kernels", false, std::nullopt,
                       "a CPU run has no GPU kernels: the traced steps' CPU operators are "
                       "recorded instead (" +
                           plan.Describe() + ")");
    if (plan.continuous()) {
      AddDiagnostic("info", "kernels",
                    "continuous_traces_hz aggregates GPU kernels (CUPTI) and has no CPU "
                    "equivalent: a CPU run records the operators of traced steps only "
                    "(trace_every_n_steps=N or trace_range=(a, b))");
    }
    return;  // the Python layer sets cpu_ops' status when its profiler runs
  }
  if (config_.trace_backend != "cupti") {
    SetTelemetryStatus("kernels", false, std::nullopt,
                       "no CUDA device in this process: no kernels to trace");
    return;
  }
  traces::KernelCaptureOptions options;
  options.plan = plan;
  options.cupti_library = config_.cupti_library;
  store::StoreWriter* writer = writer_.get();
  auto capture = traces::KernelCapture::Open(options, anchor_.mono_ns,
                                             [writer](std::vector<store::Row>&& rows) {
                                               for (auto& r : rows) writer->Push(std::move(r));
                                             });
  if (!capture) {
    SetTelemetryStatus("kernels", false, std::nullopt,
                       "kernel tracing could not start: " + capture.error());
    AddDiagnostic("warning", "kernels", "kernel tracing could not start: " + capture.error());
    return;
  }
  capture_ = std::move(capture.value());
  SetTelemetryStatus("kernels", true, "cupti (" + plan.Describe() + ")", std::nullopt);
  traces::KernelCapture* c = capture_.get();
  recorder_->SetStepObserver([c](const store::StepRow& step) { c->OnStepRow(step); });
}

void Session::StopTraces() {
  if (!capture_) return;
  capture_->Stop();
  for (const std::string& note : capture_->TakeNotes()) AddDiagnostic("info", "kernels", note);
  const traces::KernelCapture::Stats st = capture_->stats();
  std::string msg = "kernel trace (" + config_.trace_plan.Describe() + ", " +
                    capture_->library_path() + "): " + std::to_string(st.traced_kernels) +
                    " kernels of traced steps/windows in " + std::to_string(st.rows) + " rows; " +
                    std::to_string(st.untraced_kernels) + " kernels of untraced steps not kept";
  if (st.late_rows) msg += "; " + std::to_string(st.late_rows) + " rows delivered late";
  if (st.unplaced_kernels) {
    msg += "; " + std::to_string(st.unplaced_kernels) +
           " kernels of a traced step that was never stored (not written)";
  }
  if (st.dropped_records) {
    msg += "; CUPTI dropped " + std::to_string(st.dropped_records) + " records (buffers full)";
  }
  AddDiagnostic(st.dropped_records ? "warning" : "info", "kernels", msg);
}

void Session::AddCpuOps(int64_t step, int64_t start_mono_ns, int64_t end_mono_ns,
                        std::vector<CpuOpTotals> ops) {
  if (!writer_ || stopped_) return;
  std::sort(ops.begin(), ops.end(), [](const CpuOpTotals& a, const CpuOpTotals& b) {
    return a.self_cpu_ns != b.self_cpu_ns ? a.self_cpu_ns > b.self_cpu_ns : a.name < b.name;
  });
  const int64_t start = start_mono_ns - anchor_.mono_ns, end = end_mono_ns - anchor_.mono_ns;
  const size_t keep = std::min(ops.size(), kMaxCpuOpRows);
  for (size_t i = 0; i < keep; ++i) {
    writer_->Push(store::CpuOpRow{start, end, step, ops[i].name, ops[i].calls, ops[i].self_cpu_ns,
                                  ops[i].cpu_ns, "torch_profiler"});
  }
  if (keep < ops.size()) {
    store::CpuOpRow other{start, end, step, "", 0, 0, std::nullopt, "torch_profiler"};
    for (size_t i = keep; i < ops.size(); ++i) {
      other.calls += ops[i].calls;
      other.self_cpu_ns += ops[i].self_cpu_ns;
    }
    other.name = "(" + std::to_string(ops.size() - keep) + " other operators)";
    writer_->Push(std::move(other));
  }
}

Session::~Session() {
  // A session that failed part-way through Start() has nothing to stop.
  if (!stopped_ && recorder_) {
    Stop("failed", std::string("profiler session destroyed without stop()"));
  }
}

void Session::AddDiagnostic(const std::string& level, const std::string& source,
                            const std::string& message) {
  if (writer_) writer_->Push(store::DiagnosticRow{RelNow(), level, source, message});
}

void Session::SetTelemetryStatus(const std::string& source, bool available,
                                 const std::optional<std::string>& backend,
                                 const std::optional<std::string>& reason) {
  if (writer_) writer_->Push(store::TelemetryStatusRow{source, available, backend, reason});
}

Status Session::UpdateRun(const std::function<void(store::RunInfo*)>& edit) {
  edit(&info_);
  return control_->UpdateRunFields(info_);
}

StopResult Session::Stop(const std::string& status, const std::optional<std::string>& error) {
  if (stopped_) return result_;
  stopped_ = true;
  std::string problems;
  try {
    recorder_->Stop();
    StopTraces();
    const auto& a = recorder_->assembler();
    if (recorder_->dropped_events() > 0) {
      AddDiagnostic("warning", "recorder",
                    std::to_string(recorder_->dropped_events()) +
                        " training-thread events dropped (event ring full)");
    }
    if (a.orphan_calls() > 0) {
      AddDiagnostic("info", "steps",
                    std::to_string(a.orphan_calls()) +
                        " forward/backward calls were not followed by optimizer.step() and "
                        "belong to no step");
    }
    if (const uint64_t lost = recorder_->dropped_comm(); lost > 0) {
      AddDiagnostic("info", "comm",
                    std::to_string(lost) +
                        " collective bucket timings belong to no stored step "
                        "(before the first step, after the last, or reported "
                        "after the run ended) and were not stored");
    }
    if (a.unmatched_events() > 0) {
      AddDiagnostic("info", "steps",
                    std::to_string(a.unmatched_events()) + " events could not be matched");
    }
    if (a.excluded_spans() > 0) {
      AddDiagnostic("info", "evaluation",
                    "evaluation: " + std::to_string(a.excluded_spans()) +
                        (a.excluded_spans() == 1 ? " loop, " : " loops, ") +
                        analysis::FormatDuration(static_cast<double>(a.excluded_ns())) +
                        " in all, " + std::to_string(a.excluded_forwards()) +
                        " forward calls; kept out of the training steps");
    }
    writer_->Stop();
    if (writer_->dropped() > 0) {
      const std::string lost =
          LostRowsMessage(writer_->lost(), writer_->dropped(), writer_->error());
      problems += lost;
      // Recorded with the run through the control connection (the writer has given up); when
      // the store refuses that too, the analysis gets it directly so the summary says so.
      store::DiagnosticRow diag{RelNow(), "warning", kStoreDiagnosticSource, lost};
      if (!control_->WriteRows(info_.run_id, {diag}).ok()) {
        config_.analysis.unstored_diagnostics.push_back(diag);
      }
    }
    const int64_t end_ns = RelNow();
    info_.end_ns = end_ns;
    info_.status = status;
    info_.error = error;
    if (Status st = control_->FinishRun(info_.run_id, status, end_ns, error); !st.ok()) {
      problems += (problems.empty() ? "" : "; ") + st.message();
      config_.analysis.unstored_diagnostics.push_back(store::DiagnosticRow{
          end_ns, "warning", kStoreDiagnosticSource,
          "the end of the run (status " + status + ") was not stored: " + st.message() +
              "; the DB shows the run as still running"});
    }
    std::optional<std::string> not_stored;
    auto summary = analysis::FinalizeRun(*control_, info_.run_id, config_.db_path, config_.analysis,
                                         &not_stored);
    if (summary) {
      result_.summary = summary.value();
    } else {
      problems += (problems.empty() ? "" : "; ") + summary.error();
    }
    if (not_stored) problems += (problems.empty() ? "" : "; ") + *not_stored;
  } catch (const std::exception& e) {
    problems += (problems.empty() ? "" : "; ") + std::string(e.what());
  }
  if (!problems.empty()) result_.error = problems;
  return result_;
}

}  // namespace gpuprof::record
