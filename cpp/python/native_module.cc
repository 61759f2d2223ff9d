// gpuprof._native: the binding layer. The only code besides call_hook.cc that includes
// Python.h. Converts Python options into SessionConfig, exposes the session's event API to the
// thin Python layer, and turns native errors into Python exceptions (only here).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <pthread.h>
#include <pythread.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "analysis/analysis.h"
#include "analysis/flops.h"
#include "clock/clock.h"
#include "eval_hook.h"
#include "hook_state.h"
#include "line_sampler.h"
#include "line_tracer.h"
#include "record/session.h"
#include "report_binding.h"
#include "spark_binding.h"
#include "test_api.h"
#ifdef GPUPROF_HAVE_SERVER
#include "server/dashboard.h"
#include "server/live_push.h"
#include "server/webhook.h"
#endif
#include "telemetry/mock_collector.h"
#include "traces/cpu_op_events.h"

namespace nb = nanobind;

namespace gpuprof::python {
namespace {

using record::EventKind;

#ifdef GPUPROF_HAVE_SERVER
constexpr bool kHasServer = true;
using LivePushImpl = server::LivePush;
#else
// Built without the team server (cpp/server/CMakeLists.txt, GPUPROF_SERVER): profile() refuses
// server= before a session starts, so no push is ever made; this keeps the session's code one.
constexpr bool kHasServer = false;
struct LivePushImpl {
  void Start(const store::RunInfo&) {}
  void UpdateRun(const store::RunInfo&) noexcept {}
  void Add(const store::Row&) noexcept {}
  std::optional<std::string> Finish(const store::RunInfo&, const std::vector<store::InsightRow>&) {
    return std::nullopt;
  }
  std::optional<int64_t> server_run_id() const { return std::nullopt; }
  const std::string& server_url() const {
    static const std::string kNone;
    return kNone;
  }
};
#endif

template <typename T>
std::optional<T> Opt(const nb::dict& d, const char* key) {
  if (!d.contains(key)) return std::nullopt;
  nb::object v = d[key];
  if (v.is_none()) return std::nullopt;
  return nb::cast<T>(v);
}

class PySession;

// profile()'s trace options (trace_every_n_steps, trace_range_begin / _end,
// continuous_traces_hz), absent or None = off.
traces::TraceOptions TraceOptionsFrom(const nb::dict& options) {
  traces::TraceOptions t;
  t.every_n_steps = Opt<int64_t>(options, "trace_every_n_steps").value_or(0);
  t.range_begin = Opt<int64_t>(options, "trace_range_begin");
  t.range_end = Opt<int64_t>(options, "trace_range_end");
  t.continuous_hz = Opt<double>(options, "continuous_traces_hz").value_or(0);
  return t;
}

// Live sessions, for the fork handler. A forked child (a DataLoader worker, a process that saves a
// checkpoint) inherits a copy of the session but none of its threads, and possibly mutexes that
// those threads held: it must never stop, flush or destroy that copy. Lock-free slots, because
// the child may not take a lock that another thread of the parent held at fork.
constexpr int kLiveSlots = 16;
std::atomic<PySession*> g_live[kLiveSlots];

// The Python-facing session. Holds the native Session and the hook state the call hooks share.
//
// Fork: in a child of the process that created it, the session is inert. The pthread_atfork
// child handler stops the hooks from recording (HookState::session = null, no getpid on the hot
// path), and every cold path checks Forked(): Stop() returns without touching the run (it is the
// parent's), the diagnostics and run updates are dropped, and the destructor leaks the native
// Session instead of joining threads that do not exist in the child.
class PySession {
 public:
  explicit PySession(nb::dict options) {
    record::SessionConfig c;
    c.db_path = Opt<std::string>(options, "db_path").value_or("gpuprof.db");
    c.run.run_name = Opt<std::string>(options, "run_name").value_or("run");
    c.run.group_id = Opt<std::string>(options, "group_id");
    c.run.rank = Opt<int64_t>(options, "rank");
    c.run.world_size = Opt<int64_t>(options, "world_size");
    c.run.hostname = Opt<std::string>(options, "hostname").value_or("");
    c.run.device_kind = Opt<std::string>(options, "device_kind");
    c.run.dtype = Opt<std::string>(options, "dtype");
    c.run.flops_per_step = Opt<double>(options, "flops_per_step");
    c.run.flops_method = Opt<std::string>(options, "flops_method");
    c.run.python_version = Opt<std::string>(options, "python_version");
    c.run.torch_version = Opt<std::string>(options, "torch_version");
    c.run.config_json = Opt<std::string>(options, "config_json");
    if (auto hz = Opt<double>(options, "sample_hz")) {
      c.recorder.sample_hz = *hz;
      c.run.sample_hz = *hz;
    }
    if (auto hz = Opt<double>(options, "host_hz")) c.recorder.host_hz = *hz;
    c.gpu.backend = Opt<std::string>(options, "gpu_backend").value_or("auto");
    c.gpu.nvml_library = Opt<std::string>(options, "nvml_library").value_or("");
    c.gpu.mock_gpus = static_cast<int>(Opt<int64_t>(options, "mock_gpus").value_or(1));
    c.gpu.mock_scenario = Opt<std::string>(options, "mock_scenario").value_or("");
    c.host_telemetry = Opt<bool>(options, "host").value_or(true);
    c.proc_root = Opt<std::string>(options, "proc_root").value_or("/proc");
    c.job_parent_pid = Opt<int64_t>(options, "job_parent_pid");
    c.analysis.gpu_rate_usd_per_hour = Opt<double>(options, "gpu_rate");
    // Kernel traces: the plan is checked here too (profile() checks it first).
    if (auto plan = traces::TracePlan::Make(TraceOptionsFrom(options)); plan.ok()) {
      c.trace_plan = *plan;
    } else {
      throw nb::value_error(plan.error().c_str());
    }
    c.trace_backend = Opt<std::string>(options, "trace_backend").value_or("");
    c.cupti_library = Opt<std::string>(options, "cupti_library").value_or("");
    // The live push to a team server: every row the writer takes is teed to it.
    if (auto url = Opt<std::string>(options, "server_url")) {
#ifndef GPUPROF_HAVE_SERVER
      throw std::runtime_error(
          "server= needs the team server, which this gpuprof was built "
          "without");
#else
      server::LivePushOptions p;
      p.server_url = *url;
      p.api_key = Opt<std::string>(options, "api_key").value_or("");
      p.spool_dir = server::DefaultSpoolDir();  // $GPUPROF_BUFFER_DIR or ~/.gpuprof/buffer
      push_ = std::make_unique<server::LivePush>(std::move(p));
      server::LivePush* push = push_.get();
      c.writer.tee = [push](const store::Row& row) { push->Add(row); };
#endif
    }
    auto s = record::Session::Start(std::move(c));
    if (!s) throw std::runtime_error(s.error());
    session_ = std::move(s.value());
    if (push_) push_->Start(session_->info());
    state_.session = session_.get();
    state_.owner_thread = PyThread_get_thread_ident();
    for (auto& slot : g_live) {
      PySession* expected = nullptr;
      if (slot.compare_exchange_strong(expected, this)) break;
    }
  }

  ~PySession() {
    for (auto& slot : g_live) {
      PySession* expected = this;
      slot.compare_exchange_strong(expected, nullptr);
    }
    state_.session = nullptr;
    if (Forked()) {
      (void)session_.release();  // the parent's: never joined, flushed or closed here
      (void)push_.release();     // likewise its push thread
      return;
    }
    if (session_ && !session_->stopped()) {
      nb::gil_scoped_release release;
      session_->Stop("failed", std::string("session object collected before stop()"));
      if (push_) FinishPush();
    }
  }

  // Called in the child right after fork() (pthread_atfork): no recording from here on.
  static void AfterForkInChild() {
    for (auto& slot : g_live) {
      if (PySession* s = slot.load()) {
        s->forked_ = true;
        s->state_.session = nullptr;
      }
    }
  }
  // True in a child process of the one that created the session.
  bool Forked() const { return forked_ || getpid() != pid_; }

  HookState* state() { return &state_; }
  int64_t run_id() const { return session_->run_id(); }
  const std::string& db_path() const { return session_->db_path(); }

  void Emit(int kind, uint32_t arg, int64_t value) {
    if (state_.Recording()) session_->Emit(static_cast<EventKind>(kind), arg, value);
  }
  void EmitAt(int64_t ts, int kind, uint32_t arg, int64_t value) {
    if (state_.Recording()) session_->EmitAt(ts, static_cast<EventKind>(kind), arg, value);
  }
  // wrap_dataloader's next(). On the owner thread it shares the loader depth with the
  // DataLoader hooks, so that a wrapped torch DataLoader counts its wait once (as
  // wrap_dataloader's); the manual API on another thread (a loop run on a helper thread)
  // records it as it does its steps and phases. Both return whether they were the owner
  // thread's outermost loader edge (the FLOP count's cue).
  bool WaitBegin() {
    if (!state_.Recording()) return false;
    const bool owner = PyThread_get_thread_ident() == state_.owner_thread;
    if (owner && state_.depth[kHookLoader]++ != 0) return false;
    session_->Emit(EventKind::kWaitBegin, 0, kWaitWrapped);
    if (owner) ++state_.calls[kHookLoader];
    return owner;
  }
  bool WaitEnd() {
    if (!state_.Recording()) return false;
    const bool owner = PyThread_get_thread_ident() == state_.owner_thread;
    if (owner && (state_.depth[kHookLoader] <= 0 || --state_.depth[kHookLoader] != 0)) {
      return false;
    }
    session_->Emit(EventKind::kWaitEnd);
    return owner;
  }

  // Optimizer step pre/post hooks (torch.optim global hooks): share the optimizer depth with
  // the GradScaler.step hook so that a scaler step counts once.
  // Both return true when they recorded the outermost boundary.
  bool OptimizerPre() {
    if (!OnOwnerThread() || state_.InLoader()) return false;
    if (state_.depth[kHookOptimizer]++ != 0) return false;
    session_->Emit(EventKind::kOptimizerBegin);
    ++state_.calls[kHookOptimizer];
    return true;
  }
  bool OptimizerPost() {
    if (!OnOwnerThread()) return false;
    if (state_.depth[kHookOptimizer] <= 0) return false;
    if (--state_.depth[kHookOptimizer] != 0) return false;
    session_->Emit(EventKind::kOptimizerEnd);
    return true;
  }

  std::pair<std::string, std::optional<std::string>> Stop(const std::string& status,
                                                          std::optional<std::string> error) {
    state_.session = nullptr;
    if (Forked()) {
      return {"", std::string("not stopped: this is a forked child of the process that started "
                              "the run, which the run belongs to")};
    }
    record::StopResult r;
    {
      nb::gil_scoped_release release;
      r = session_->Stop(status, error);
      if (push_) FinishPush();
    }
    return {r.summary, r.error};
  }

  // Why the live push did not deliver everything (and where the rest is), or None.
  std::optional<std::string> PushWarning() const { return push_warning_; }
  // The run's fields changed (update_run): a live push sends them while the run goes on.
  void RunUpdated() {
    if (push_ && !Forked()) push_->UpdateRun(session_->info());
  }
  // The run's page on the team server it was pushed to, once the server acknowledged it.
  std::optional<std::string> PushRunUrl() const {
    if (!push_) return std::nullopt;
    const auto id = push_->server_run_id();
    if (!id) return std::nullopt;
    std::string base = push_->server_url();
    while (!base.empty() && base.back() == '/') base.pop_back();
    return base + "/#/runs/" + std::to_string(*id);
  }

  nb::dict Stats() const {
    nb::dict d;
    d["forward_calls"] = state_.calls[kHookForward];
    d["backward_calls"] = state_.calls[kHookBackward];
    d["optimizer_calls"] = state_.calls[kHookOptimizer];
    d["loader_calls"] = state_.calls[kHookLoader];
    d["foreign_thread_calls"] = state_.foreign_thread_calls;
    d["dropped_events"] = session_->recorder().dropped_events();
    d["gpu_ticks"] = session_->recorder().gpu_ticks();
    d["host_ticks"] = session_->recorder().host_ticks();
    // Stalls seen so far by the stall watch; None when it does not run (host telemetry off).
    if (session_->recorder().watching_stalls()) {
      d["stalls"] = session_->recorder().stalls();
    } else {
      d["stalls"] = nb::none();
    }
    // The CPU wait read so far (ns, summed over threads); None when it is not read.
    if (session_->recorder().watching_cpu_wait()) {
      d["cpu_wait_ns"] = session_->recorder().cpu_wait_ns();
    } else {
      d["cpu_wait_ns"] = nb::none();
    }
    d["steps"] = session_->recorder().assembler().steps_emitted();
    return d;
  }

  record::Session& session() { return *session_; }

 private:
  bool OnOwnerThread() {
    if (!state_.Recording()) return false;
    if (PyThread_get_thread_ident() != state_.owner_thread) {
      ++state_.foreign_thread_calls;
      return false;
    }
    return true;
  }

  // The session's final fields and insights, read back from its file, go to the server last.
  void FinishPush() {
    store::RunInfo info = session_->info();
    std::vector<store::InsightRow> insights;
    if (auto db =
            store::SqliteStore::Open(session_->db_path(), store::SqliteStore::Mode::kReadOnly)) {
      if (auto runs = (*db)->ListRuns()) {
        for (const auto& r : *runs) {
          if (r.run_id == session_->run_id()) info = r;
        }
      }
      if (auto data = (*db)->LoadRun(session_->run_id())) insights = data->insights;
    }
    push_warning_ = push_->Finish(info, insights);
  }

  std::unique_ptr<LivePushImpl> push_;  // before session_: destroyed after it
  std::optional<std::string> push_warning_;
  std::unique_ptr<record::Session> session_;
  HookState state_;
  const pid_t pid_ = getpid();
  bool forked_ = false;
};

// profile(arch=...): TransformerArch fields (a dict; None = the field's default) -> per-token
// and per-step FLOPs (analysis/flops.h). Unknown keys and invalid shapes raise ValueError.
nb::dict TransformerFlops(const nb::dict& arch, int64_t tokens_per_step) {
  static constexpr const char* kKeys[] = {
      "layers",     "hidden",    "heads",       "kv_heads",  "seq_len",   "vocab",
      "ffn_hidden", "gated_mlp", "moe_experts", "moe_top_k", "lora_rank", "grad_checkpoint"};
  for (auto [key, value] : arch) {
    const std::string k = nb::cast<std::string>(key);
    bool known = false;
    for (const char* want : kKeys) known = known || k == want;
    if (!known) throw nb::value_error(("unknown TransformerArch field '" + k + "'").c_str());
  }
  analysis::TransformerShape s;
  s.layers = Opt<int64_t>(arch, "layers").value_or(0);
  s.hidden = Opt<int64_t>(arch, "hidden").value_or(0);
  s.heads = Opt<int64_t>(arch, "heads").value_or(0);
  s.kv_heads = Opt<int64_t>(arch, "kv_heads");
  s.seq_len = Opt<int64_t>(arch, "seq_len").value_or(0);
  s.vocab = Opt<int64_t>(arch, "vocab").value_or(0);
  s.ffn_hidden = Opt<int64_t>(arch, "ffn_hidden");
  s.gated_mlp = Opt<bool>(arch, "gated_mlp").value_or(false);
  s.moe_experts = Opt<int64_t>(arch, "moe_experts").value_or(1);
  s.moe_top_k = Opt<int64_t>(arch, "moe_top_k").value_or(1);
  s.lora_rank = Opt<int64_t>(arch, "lora_rank");
  s.grad_checkpoint = Opt<bool>(arch, "grad_checkpoint").value_or(false);
  auto r = analysis::TransformerFlopsPerStep(s, tokens_per_step);
  if (!r) throw nb::value_error(r.error().c_str());
  const analysis::TransformerFlops& t = r->per_token;
  nb::dict d;
  d["attention_proj"] = t.attention_proj;
  d["attention_scores"] = t.attention_scores;
  d["mlp"] = t.mlp;
  d["lm_head"] = t.lm_head;
  d["lora_adapters"] = t.lora_adapters;
  d["forward"] = t.forward;
  d["model"] = t.model;
  d["hardware"] = t.hardware;
  d["tokens_per_step"] = r->tokens_per_step;
  d["model_per_step"] = r->model_per_step;
  d["hardware_per_step"] = r->hardware_per_step;
  return d;
}

// What PySession::comm_bucket_sink hands to C++ built apart from this module: a plain C
// layout (the other side declares the same struct; `version` says which).
constexpr const char* kCommBucketSinkName = "gpuprof.comm_bucket_sink";
constexpr int kCommBucketSinkVersion = 1;
struct CommBucketSink {
  int version;
  // One DDP bucket's collective: index, start and end (monotonic ns, as monotonic_ns()), bytes
  // (-1: unknown). From any thread, without the GIL.
  void (*add)(void* ctx, int64_t bucket, int64_t start_ns, int64_t end_ns, int64_t bytes);
  void* ctx;  // the PySession
};

void AddCommBucketFromC(void* ctx, int64_t bucket, int64_t start_ns, int64_t end_ns,
                        int64_t bytes) {
  auto* s = static_cast<PySession*>(ctx);
  if (s->Forked()) return;
  s->session().AddCommBucket(bucket, start_ns, end_ns,
                             bytes >= 0 ? std::optional<int64_t>(bytes) : std::nullopt);
}

}  // namespace
}  // namespace gpuprof::python

#ifdef GPUPROF_HAVE_SERVER
// profile(dashboard=True): the native dashboard server over this process's run file. Its
// threads never take the GIL. In a forked child (the parent's object, without its threads)
// close() lets go of it without joining anything.
class PyDashboard {
 public:
  PyDashboard(const std::string& db_path, int64_t run_id, int port,
              std::optional<std::string> web_dir) {
    if (port < 0 || port > 65535) throw nb::value_error("port must be in 0..65535");
    gpuprof::server::DashboardOptions o;
    o.db_path = db_path;
    o.run_id = run_id;
    o.port = static_cast<uint16_t>(port);
    if (web_dir && !web_dir->empty()) o.web_dir = std::move(web_dir);
    auto d = gpuprof::server::Dashboard::Start(std::move(o));
    if (!d) throw std::runtime_error(d.error());
    board_ = std::move(d.value());
  }
  ~PyDashboard() { close(); }
  std::string url() const { return board_ ? board_->url() : ""; }
  int port() const { return board_ ? board_->port() : 0; }
  void close() {
    if (!board_) return;
    if (getpid() != pid_) {
      (void)board_.release();  // the parent's threads are not here
      return;
    }
    nb::gil_scoped_release release;
    board_->Stop();
    board_.reset();
  }

 private:
  std::unique_ptr<gpuprof::server::Dashboard> board_;
  const pid_t pid_ = getpid();
};
#endif  // GPUPROF_HAVE_SERVER

NB_MODULE(_native, m) {
  using namespace gpuprof::python;
  m.doc() = "gpuprof native core (private; use the gpuprof package)";
  m.attr("__version__") = GPUPROF_VERSION;
  // nanobind lists the module's objects still alive when the interpreter finalizes it as
  // "leaked". A program that imports torch._dynamo during a run keeps them alive to the end
  // (its caches hold the frames that reference them), which is no leak: no such message on
  // the user's stderr.
  nb::set_leak_warnings(false);

  if (InitCallHookType(m.ptr()) < 0) throw nb::python_error();
  pthread_atfork(nullptr, nullptr, &PySession::AfterForkInChild);
  RegisterLineTracer(m);
  RegisterLineSampler(m);
  RegisterLineReport(m);
  RegisterSpark(m);
  // For the test-only module (test_api.h): a table of functions, not an API of this module.
  static const TestApi kTestApi{&UntracedEvalCount, &UntracedEvalAside};
  m.attr("_test_api") = nb::capsule(&kTestApi, kTestApiCapsule);

  // False when built without the team server (GPUPROF_SERVER): no dashboard, push or webhook.
  m.attr("HAS_SERVER") = kHasServer;
#ifdef GPUPROF_HAVE_SERVER
  nb::class_<PyDashboard>(m, "Dashboard")
      .def(nb::init<const std::string&, int64_t, int, std::optional<std::string>>(),
           nb::arg("db_path"), nb::arg("run_id"), nb::arg("port"), nb::arg("web_dir").none())
      .def_prop_ro("url", &PyDashboard::url)
      .def_prop_ro("port", &PyDashboard::port)
      .def("close", &PyDashboard::close);
#endif
  nb::class_<PySession>(m, "Session")
      .def(nb::init<nb::dict>(), nb::arg("options"))
      .def_prop_ro("run_id", &PySession::run_id)
      .def_prop_ro("db_path", &PySession::db_path)
      .def("emit", &PySession::Emit, nb::arg("kind"), nb::arg("arg") = 0, nb::arg("value") = 0)
      .def("emit_at", &PySession::EmitAt)
      .def("wait_begin", &PySession::WaitBegin)
      .def("wait_end", &PySession::WaitEnd)
      .def("intern_phase",
           [](PySession& s, const std::string& name) -> uint32_t {
             return s.Forked() ? 0 : s.session().InternPhase(name);
           })
      // torch's global optimizer step hooks: must return None (torch treats a value as new args).
      .def("optimizer_pre_hook", [](PySession& s, nb::args, nb::kwargs) { s.OptimizerPre(); })
      .def("optimizer_post_hook", [](PySession& s, nb::args, nb::kwargs) { s.OptimizerPost(); })
      // Same, returning whether the outermost boundary was recorded (for CUDA event timing).
      .def("optimizer_pre", [](PySession& s, nb::args, nb::kwargs) { return s.OptimizerPre(); })
      .def("optimizer_post", [](PySession& s, nb::args, nb::kwargs) { return s.OptimizerPost(); })
      .def(
          "hook",
          [](nb::handle self, int kind, nb::handle original, nb::handle callback) {
            PySession& s = nb::cast<PySession&>(self);
            PyObject* h = NewCallHook(self.ptr(), s.state(), kind, original.ptr(), callback.ptr());
            if (h == nullptr) throw nb::python_error();
            return nb::steal(h);
          },
          nb::arg("kind"), nb::arg("original"), nb::arg("callback").none() = nb::none())
      // From any thread: one DDP gradient bucket's collective (monotonic ns, as monotonic_ns()).
      .def(
          "add_comm_bucket",
          [](PySession& s, int64_t bucket, int64_t start_ns, int64_t end_ns,
             std::optional<int64_t> bytes) {
            if (!s.Forked()) s.session().AddCommBucket(bucket, start_ns, end_ns, bytes);
          },
          nb::arg("bucket"), nb::arg("start_ns"), nb::arg("end_ns"),
          nb::arg("bytes").none() = nb::none())
      // The pids of the job's other ranks on this host (the ranks exchange them at start).
      .def(
          "set_job_pids",
          [](PySession& s, std::vector<int64_t> pids) {
            if (!s.Forked()) s.session().SetJobPids(std::move(pids));
          },
          nb::arg("pids"))
      // The same for code built apart from this module (gpuprof/_ddp_hook.cpp, the native DDP
      // hook): a capsule named kCommBucketSinkName holding a CommBucketSink, whose add() any
      // thread may call without the GIL for as long as this session lives (its holder calls it
      // no more once the profile that gave it out has stopped).
      .def("comm_bucket_sink",
           [](PySession& s) {
             auto* sink = new CommBucketSink{kCommBucketSinkVersion, &AddCommBucketFromC, &s};
             return nb::capsule(sink, kCommBucketSinkName,
                                [](void* p) noexcept { delete static_cast<CommBucketSink*>(p); });
           })
      // Kernel traces: whether a step is traced, the plan as text, and the CPU operators of a
      // traced step ((name, calls, self_cpu_ns, cpu_ns or None) tuples; monotonic ns span).
      .def("step_traced", [](PySession& s, int64_t step) { return s.session().StepTraced(step); })
      .def("trace_plan", [](PySession& s) { return s.session().trace_plan().Describe(); })
      .def(
          "add_cpu_ops",
          [](PySession& s, int64_t step, int64_t start_ns, int64_t end_ns, nb::list ops) {
            if (s.Forked()) return;
            std::vector<gpuprof::record::CpuOpTotals> v;
            v.reserve(nb::len(ops));
            for (nb::handle h : ops) {
              auto t =
                  nb::cast<std::tuple<std::string, int64_t, int64_t, std::optional<int64_t>>>(h);
              v.push_back(gpuprof::record::CpuOpTotals{std::get<0>(t), std::get<1>(t),
                                                       std::get<2>(t), std::get<3>(t)});
            }
            s.session().AddCpuOps(step, start_ns, end_ns, std::move(v));
          },
          nb::arg("step"), nb::arg("start_ns"), nb::arg("end_ns"), nb::arg("ops"))
      .def("add_diagnostic",
           [](PySession& s, const std::string& level, const std::string& source,
              const std::string& message) {
             if (!s.Forked()) s.session().AddDiagnostic(level, source, message);
           })
      .def(
          "set_telemetry_status",
          [](PySession& s, const std::string& source, bool available,
             std::optional<std::string> backend, std::optional<std::string> reason) {
            if (!s.Forked()) s.session().SetTelemetryStatus(source, available, backend, reason);
          },
          nb::arg("source"), nb::arg("available"), nb::arg("backend").none() = nb::none(),
          nb::arg("reason").none() = nb::none())
      .def("info",
           [](PySession& s) {
             const auto& i = s.session().info();
             nb::dict d;
             d["run_id"] = i.run_id;
             d["run_name"] = i.run_name;
             d["gpu_backend"] = i.gpu_backend;
             d["gpu_model"] = i.gpu_model;
             d["gpu_count"] = i.gpu_count;
             // The run clock: start_unix_ns + (monotonic_ns() - anchor_mono_ns).
             d["start_unix_ns"] = s.session().anchor().unix_ns;
             d["anchor_mono_ns"] = s.session().anchor().mono_ns;
             d["group_id"] = i.group_id;
             d["config_json"] = i.config_json;
             return d;
           })
      .def(
          "update_run",
          [](PySession& s, std::optional<std::string> device_kind,
             std::optional<std::string> gpu_model, std::optional<int64_t> gpu_count,
             std::optional<double> flops_per_step, std::optional<std::string> flops_method,
             std::optional<std::string> dtype, std::optional<std::string> config_json,
             std::optional<std::string> group_id, std::optional<int64_t> rank,
             std::optional<int64_t> world_size) {
            if (s.Forked()) return;
            gpuprof::Status st = s.session().UpdateRun([&](gpuprof::store::RunInfo* r) {
              if (device_kind) r->device_kind = device_kind;
              if (gpu_model) r->gpu_model = gpu_model;
              if (gpu_count) r->gpu_count = gpu_count;
              if (flops_per_step) r->flops_per_step = flops_per_step;
              if (flops_method) r->flops_method = flops_method;
              if (dtype) r->dtype = dtype;
              if (config_json) r->config_json = config_json;
              if (group_id) r->group_id = group_id;
              if (rank) r->rank = rank;
              if (world_size) r->world_size = world_size;
            });
            if (!st.ok()) throw std::runtime_error(st.message());
            s.RunUpdated();
          },
          nb::arg("device_kind").none() = nb::none(), nb::arg("gpu_model").none() = nb::none(),
          nb::arg("gpu_count").none() = nb::none(), nb::arg("flops_per_step").none() = nb::none(),
          nb::arg("flops_method").none() = nb::none(), nb::arg("dtype").none() = nb::none(),
          nb::arg("config_json").none() = nb::none(), nb::arg("group_id").none() = nb::none(),
          nb::arg("rank").none() = nb::none(), nb::arg("world_size").none() = nb::none())
      .def("stats", &PySession::Stats)
      .def("push_warning", &PySession::PushWarning)
      .def("push_run_url", &PySession::PushRunUrl)
      .def("stop", &PySession::Stop, nb::arg("status"), nb::arg("error").none() = nb::none());

  m.def("monotonic_ns", &gpuprof::clock::NowNs);
  m.def("check_mock_scenario", [](const std::string& spec) {
    auto parsed = gpuprof::telemetry::MockScenario::Parse(spec);
    if (!parsed) throw nb::value_error(parsed.error().c_str());
  });
  // torch.profiler's raw events of one traced step -> per operator (name, calls, self ns,
  // inclusive ns), by self time (traces/cpu_op_events.h).
  m.def("aggregate_cpu_ops", [](std::vector<std::string> names, std::vector<int64_t> starts,
                                std::vector<int64_t> durations, std::vector<uint64_t> threads) {
    if (starts.size() != names.size() || durations.size() != names.size() ||
        threads.size() != names.size()) {
      throw nb::value_error(
          "aggregate_cpu_ops: names, starts, durations and threads must "
          "have the same length");
    }
    std::vector<gpuprof::traces::CpuOpEvent> events(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      events[i] = {std::move(names[i]), starts[i], durations[i], threads[i]};
    }
    auto totals = gpuprof::traces::AggregateCpuOps(std::move(events));
    if (!totals) throw nb::value_error(totals.error().c_str());
    std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>> out;
    out.reserve(totals->size());
    for (auto& t : *totals) out.emplace_back(std::move(t.name), t.calls, t.self_ns, t.total_ns);
    return out;
  });
  // The report `gpuprof insights DB RUN --json` prints, for integrations that log it
  // elsewhere (wandb=True). ValueError naming the problem (no such file or run).
  m.def("run_report_json", [](const std::string& db_path, int64_t run_id) {
    std::string out;
    {
      nb::gil_scoped_release release;  // reads the file and runs the rules
      auto store =
          gpuprof::store::SqliteStore::Open(db_path, gpuprof::store::SqliteStore::Mode::kReadOnly);
      if (!store) {
        out = "\x01" + store.error();
      } else {
        auto report = gpuprof::analysis::AnalyzeRun(**store, run_id, {});
        out = report ? gpuprof::analysis::ReportJson(*report).dump(
                           -1, ' ', false, nlohmann::json::error_handler_t::replace)
                     : "\x01" + report.error();
      }
    }
    if (!out.empty() && out[0] == '\x01') throw nb::value_error(out.c_str() + 1);
    return out;
  });
#ifdef GPUPROF_HAVE_SERVER
  // profile(webhook=): the URL is checked at profile() (ValueError naming the problem).
  m.def("check_webhook_url", [](const std::string& url) {
    auto u = gpuprof::server::ParseWebhookUrl(url);
    if (!u) throw nb::value_error(u.error().c_str());
  });
  // At the end of a run: its report as a Slack-compatible message, POSTed within the webhook's
  // time budget (server/webhook.h). Returns None when delivered, else why not.
  m.def("send_webhook",
        [](const std::string& db_path, int64_t run_id, const std::string& url,
           std::optional<std::string> dashboard_url) -> std::optional<std::string> {
          nb::gil_scoped_release release;
          auto store = gpuprof::store::SqliteStore::Open(
              db_path, gpuprof::store::SqliteStore::Mode::kReadOnly);
          if (!store) return "webhook not sent: " + store.error();
          auto report = gpuprof::analysis::AnalyzeRun(**store, run_id, {});
          if (!report) return "webhook not sent: " + report.error();
          const std::string body =
              gpuprof::server::WebhookMessage(*report, dashboard_url)
                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
          const gpuprof::Status st = gpuprof::server::PostWebhook(url, body);
          if (st.ok()) return std::nullopt;
          return st.message();
        });
#endif
  m.def("check_trace_options", [](nb::dict options) {
    auto plan = gpuprof::traces::TracePlan::Make(gpuprof::python::TraceOptionsFrom(options));
    if (!plan) throw nb::value_error(plan.error().c_str());
    return plan->Describe();
  });
  m.def("transformer_flops", &TransformerFlops, nb::arg("arch"), nb::arg("tokens_per_step") = 1);

  nb::module_ kinds = m.def_submodule("kind", "event kinds");
  kinds.attr("STEP_BEGIN") = static_cast<int>(gpuprof::record::EventKind::kStepBegin);
  kinds.attr("STEP_END") = static_cast<int>(gpuprof::record::EventKind::kStepEnd);
  kinds.attr("PHASE_BEGIN") = static_cast<int>(gpuprof::record::EventKind::kPhaseBegin);
  kinds.attr("PHASE_END") = static_cast<int>(gpuprof::record::EventKind::kPhaseEnd);
  kinds.attr("WAIT_BEGIN") = static_cast<int>(gpuprof::record::EventKind::kWaitBegin);
  kinds.attr("WAIT_END") = static_cast<int>(gpuprof::record::EventKind::kWaitEnd);
  kinds.attr("GPU_PHASE") = static_cast<int>(gpuprof::record::EventKind::kGpuPhase);
  kinds.attr("EXCLUDE_BEGIN") = static_cast<int>(gpuprof::record::EventKind::kExcludeBegin);
  kinds.attr("EXCLUDE_END") = static_cast<int>(gpuprof::record::EventKind::kExcludeEnd);
  kinds.attr("FORWARD") = static_cast<int>(kHookForward);
  kinds.attr("BACKWARD") = static_cast<int>(kHookBackward);
  kinds.attr("OPTIMIZER") = static_cast<int>(kHookOptimizer);
  kinds.attr("LOADER") = static_cast<int>(kHookLoader);
  kinds.attr("LOADER_START") = static_cast<int>(kHookLoaderStart);
}
