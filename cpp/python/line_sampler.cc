// The Python side of lines::LineSampler: linescope's `sampler` backend and the memory sampler
// that linescope runs beside any backend for memory=True.
//
// How a sample reaches the main thread: the sampler thread sends a signal to the main thread
// (pthread_kill). CPython's C-level handler only notes it; at its next evaluation-breaker check
// (a backward jump, a function start, the return of a C call, or an EINTR retry inside a
// blocking call) the interpreter calls the Python-level handler on the main thread with the
// GIL held, and that handler is this session's `on_signal` (installed by linescope with
// signal.signal, SA_RESTART set). There it is safe to read the frames: the interval that just
// ended is taken from the LineSampler and attributed to the innermost frame whose file passes
// the PathFilter (walking out of library code), and to every recorded function on the stack
// once. So only the main thread is measured, and a long C call, sleep or I/O is charged to the
// line that made it. (Py_AddPendingCall is not used: on 3.11 a call added from a thread that
// is not the main thread does not set the main thread's evaluation breaker, so it can wait for
// seconds.) One signal is outstanding at a time, so a blocked main thread is not flooded.
//
// Lifetime: at most one session samples at a time (g_active, GIL-protected).
#include "line_sampler.h"

#include <Python.h>
#include <frameobject.h>
#include <pthread.h>
#include <signal.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "lines/line_model.h"
#include "lines/sampler.h"
#include "telemetry/gpu_collector.h"

namespace nb = nanobind;

namespace gpuprof::python {
namespace {

std::string Utf8(PyObject* s) {
  if (s == nullptr || !PyUnicode_Check(s)) return {};
  Py_ssize_t n = 0;
  const char* c = PyUnicode_AsUTF8AndSize(s, &n);
  if (c == nullptr) {
    PyErr_Clear();
    return {};
  }
  return std::string(c, static_cast<size_t>(n));
}

class SamplerSession;
SamplerSession* g_active = nullptr;

constexpr int kMaxStackWalk = 512;

class SamplerSession {
 public:
  // `attribute`: attribute intervals to lines (false: timeline and totals only).
  SamplerSession(std::vector<std::string> roots, std::vector<std::string> include,
                 std::vector<std::string> exclude, std::string cwd, int64_t interval_ns,
                 bool attribute, bool memory, std::string gpu_backend, std::string nvml_library,
                 int mock_gpus, std::string mock_scenario, int64_t gpu_interval_ns)
      : filter_(std::move(roots), std::move(include), std::move(exclude), cwd),
        cwd_(std::move(cwd)),
        attribute_(attribute),
        memory_(memory),
        interval_ns_(interval_ns),
        gpu_interval_ns_(gpu_interval_ns) {
    gpu_options_.backend = std::move(gpu_backend);
    gpu_options_.nvml_library = std::move(nvml_library);
    gpu_options_.mock_gpus = mock_gpus;
    gpu_options_.mock_scenario = std::move(mock_scenario);
    if (interval_ns_ <= 0) throw std::invalid_argument("interval_ns must be positive");
  }
  SamplerSession(const SamplerSession&) = delete;
  SamplerSession& operator=(const SamplerSession&) = delete;
  ~SamplerSession() {
    if (g_active == this) g_active = nullptr;
    sampler_.reset();  // joins the thread before the collector goes
    collector_.reset();
    for (auto& [code, entry] : codes_) Py_DECREF(code);
  }

  // `signum`: the signal whose Python-level handler is on_signal (then call this on the main
  // thread), or 0 when nothing is attributed (`attribute` false: RSS timeline only).
  void Start(int signum) {
    if (signum < 0 || signum >= NSIG || (signum == 0 && attribute_))
      throw std::invalid_argument("a signal number is needed to attribute samples");
    if (g_active != nullptr)
      throw std::runtime_error("another linescope sampling session is already active");
    if (state_ != kIdle) throw std::runtime_error("this sampler was already started");
    lines::SamplerOptions o;
    o.interval_ns = interval_ns_;
    o.memory = memory_;
    o.gpu_interval_ns = gpu_interval_ns_;
    if (gpu_options_.backend != "off") {
      auto c = telemetry::MakeGpuCollector(gpu_options_);
      if (c.ok()) {
        collector_ = std::move(c).value();
        o.gpu = collector_.get();
        for (const auto& d : collector_->devices())
          devices_.push_back(d.name.value_or("GPU " + std::to_string(d.index)));
      } else {
        gpu_error_ = c.error();
      }
    }
    signum_ = signum;
    main_thread_ = pthread_self();
    sampler_ = std::make_unique<lines::LineSampler>(o, &SamplerSession::Request, this);
    g_active = this;
    Status s = sampler_->Start();
    if (!s.ok()) {
      g_active = nullptr;
      throw std::runtime_error(s.message());
    }
    state_ = kRunning;
  }

  void Stop() {
    if (state_ != kRunning) throw std::runtime_error("the sampler is not running");
    sampler_->Stop();
    Sample();  // the interval up to now, on the stopping line
    g_active = nullptr;
    state_ = kStopped;
    for (auto& n : sampler_->TakeNotes()) notes_.push_back(std::move(n));
    if (collector_)
      for (auto& n : collector_->TakeNotes()) gpu_notes_.push_back(std::move(n));
  }

  // (filename, line, samples, wall_ns, cpu_ns, rss_delta, rss_peak, gpu_busy_ns, gpu_mem_peak)
  using LineRow =
      std::tuple<std::string, int32_t, int64_t, int64_t, std::optional<int64_t>,
                 std::optional<int64_t>, std::optional<int64_t>, std::optional<int64_t>,
                 std::optional<int64_t>>;
  std::vector<LineRow> Lines() const {
    std::vector<LineRow> out;
    for (const auto& l : agg_.Lines())
      out.emplace_back(agg_.files()[static_cast<size_t>(l.file_id)], l.line, l.samples,
                       l.wall_ns, l.cpu_ns, l.rss_delta, l.rss_peak, l.gpu_busy_ns,
                       l.gpu_mem_peak);
    return out;
  }
  // (filename, qualname, first_line, total_ns, own_ns, own_samples)
  std::vector<std::tuple<std::string, std::string, int32_t, int64_t, int64_t, int64_t>>
  Functions() const {
    std::vector<std::tuple<std::string, std::string, int32_t, int64_t, int64_t, int64_t>> out;
    for (const auto& f : agg_.functions())
      if (f.total_ns > 0 || f.own_samples > 0)
        out.emplace_back(agg_.files()[static_cast<size_t>(f.file_id)], f.qualname, f.first_line,
                         f.total_ns, f.own_ns, f.own_samples);
    return out;
  }

  std::vector<std::pair<int64_t, int64_t>> Timeline() const {
    return sampler_ ? sampler_->rss_timeline().Points()
                    : std::vector<std::pair<int64_t, int64_t>>{};
  }
  nb::dict Memory() const {
    nb::dict d;
    d["start"] = sampler_ ? sampler_->rss_start() : std::nullopt;
    d["peak"] = sampler_ ? sampler_->rss_peak() : std::nullopt;
    d["end"] = sampler_ ? sampler_->rss_end() : std::nullopt;
    d["samples_per_point"] = sampler_ ? sampler_->rss_timeline().samples_per_point() : 0;
    d["raw_samples"] = sampler_ ? sampler_->rss_timeline().raw_samples() : 0;
    return d;
  }
  nb::dict Gpu() const {
    nb::dict d;
    d["backend"] = collector_ ? std::optional<std::string>(collector_->backend()) : std::nullopt;
    d["error"] = gpu_error_;
    d["devices"] = devices_;
    lines::GpuSamplingSummary g;
    if (sampler_) g = sampler_->gpu_summary();
    d["ticks"] = g.ticks;
    d["failed_ticks"] = g.failed_ticks;
    d["proc_mem_peak"] = g.proc_mem_peak;
    d["used_devices"] = g.used_devices;
    auto s = lines::SummarizeGpuCollection(gpu_error_, collector_ ? collector_->backend() : "",
                                           devices_.size(), g, gpu_notes_);
    d["method"] = s.method;
    d["time_available"] = s.time_available;
    d["memory_available"] = s.memory_available;
    d["time_reason"] = s.time_reason;
    d["memory_reason"] = s.memory_reason;
    d["utilization_scope"] =
        s.utilization_scope.empty() ? std::nullopt : std::optional<std::string>(s.utilization_scope);
    d["diagnostics"] = s.diagnostics;
    return d;
  }
  nb::dict Stats() const {
    nb::dict d;
    d["requests"] = sampler_ ? sampler_->requests() : 0;
    d["failed_requests"] = sampler_ ? sampler_->failed_requests() : 0;
    d["samples"] = agg_.total_samples();
    d["unattributed_samples"] = agg_.unattributed_samples();
    d["unattributed_ns"] = agg_.unattributed_ns();
    d["elapsed_ns"] = elapsed_ns_;
    return d;
  }
  const std::vector<std::string>& notes() const { return notes_; }
  bool running() const { return state_ == kRunning; }

 private:
  enum State { kIdle, kRunning, kStopped };
  struct CodeEntry {
    int32_t function = -1;  // -1: not recorded
    uint64_t stamp = 0;     // last sample that counted it in a total
  };

  // Sampler thread.
  static bool Request(void* ctx) noexcept {
    auto* self = static_cast<SamplerSession*>(ctx);
    if (self->signum_ == 0) return true;  // timeline only: the request stays outstanding
    return pthread_kill(self->main_thread_, self->signum_) == 0;
  }

 public:
  // The Python-level signal handler (main thread, GIL held). Never raises into user code.
  void OnSignal() noexcept {
    if (g_active == this && state_ == kRunning) Sample();
  }

 private:
  CodeEntry* Lookup(PyCodeObject* code) noexcept {
    auto it = codes_.find(code);
    if (it != codes_.end()) return &it->second;
    try {
      CodeEntry e;
      std::string filename = Utf8(code->co_filename);
      auto d = decided_.find(filename);
      bool recorded;
      if (d != decided_.end()) {
        recorded = d->second;
      } else {
        recorded = filter_.Recorded(filename);
        decided_.emplace(filename, recorded);
      }
      if (recorded) {
        std::string path = filename.empty() || filename.front() == '<'
                               ? filename
                               : lines::NormalizePath(filename, cwd_);
        e.function = agg_.AddFunction(agg_.InternFile(path), Utf8(code->co_qualname),
                                      code->co_firstlineno);
      }
      Py_INCREF(code);  // keeps the key alive (no address reuse) until the session goes
      return &codes_.emplace(code, e).first->second;
    } catch (...) {
      return nullptr;
    }
  }

  void Sample() noexcept {
    if (!sampler_) return;
    lines::SampleInterval iv = sampler_->TakeInterval();
    elapsed_ns_ += iv.wall_ns;
    if (!attribute_) {
      agg_.AddUnattributed(iv);
      return;
    }
    ++stamp_;
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    bool innermost = true;
    for (int depth = 0; frame != nullptr && depth < kMaxStackWalk; ++depth) {
      PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
      CodeEntry* e = Lookup(code);
      Py_DECREF(code);
      if (e != nullptr && e->function >= 0) {
        if (innermost) {
          innermost = false;
          const auto& fn = agg_.functions()[static_cast<size_t>(e->function)];
          try {
            agg_.AddLine(fn.file_id, PyFrame_GetLineNumber(frame), iv);
          } catch (...) {
          }
          agg_.AddOwn(e->function, iv);
        }
        if (e->stamp != stamp_) {
          e->stamp = stamp_;
          agg_.AddTotal(e->function, iv);
        }
      }
      PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
      Py_DECREF(frame);
      frame = back;
    }
    Py_XDECREF(frame);
    if (innermost) agg_.AddUnattributed(iv);
    if (PyErr_Occurred()) PyErr_Clear();
  }

  lines::PathFilter filter_;
  std::string cwd_;
  bool attribute_;
  bool memory_;
  int64_t interval_ns_;
  int64_t gpu_interval_ns_;
  telemetry::GpuCollectorOptions gpu_options_;
  std::unique_ptr<telemetry::GpuCollector> collector_;
  std::optional<std::string> gpu_error_;
  std::vector<std::string> devices_;
  std::unique_ptr<lines::LineSampler> sampler_;
  lines::SampleAggregator agg_;
  std::unordered_map<PyCodeObject*, CodeEntry> codes_;
  std::unordered_map<std::string, bool> decided_;
  std::vector<std::string> notes_;
  std::vector<std::string> gpu_notes_;
  int signum_ = 0;
  pthread_t main_thread_{};
  uint64_t stamp_ = 0;
  int64_t elapsed_ns_ = 0;
  State state_ = kIdle;
};

}  // namespace

void RegisterLineSampler(nb::module_& m) {
  nb::class_<SamplerSession>(m, "LineSampler")
      .def(nb::init<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>,
                    std::string, int64_t, bool, bool, std::string, std::string, int, std::string,
                    int64_t>(),
           nb::arg("roots"), nb::arg("include"), nb::arg("exclude"), nb::arg("cwd"),
           nb::arg("interval_ns"), nb::arg("attribute"), nb::arg("memory"),
           nb::arg("gpu_backend"), nb::arg("nvml_library") = "", nb::arg("mock_gpus") = 1,
           nb::arg("mock_scenario") = "", nb::arg("gpu_interval_ns") = 10'000'000)
      .def("start", &SamplerSession::Start, nb::arg("signum"))
      .def("on_signal", [](SamplerSession& s, nb::args) { s.OnSignal(); })
      .def("stop", &SamplerSession::Stop)
      .def("lines", &SamplerSession::Lines)
      .def("functions", &SamplerSession::Functions)
      .def("timeline", &SamplerSession::Timeline)
      .def("memory", &SamplerSession::Memory)
      .def("gpu", &SamplerSession::Gpu)
      .def("stats", &SamplerSession::Stats)
      .def_prop_ro("notes", &SamplerSession::notes)
      .def_prop_ro("running", &SamplerSession::running);
}

}  // namespace gpuprof::python
