// The Python side of lines::LineSampler: linescope's `sampler` backend and the memory sampler
// that linescope runs beside any backend for memory=True.
//
// How a sample reaches the main thread: the sampler thread queues a call with
// Py_AddPendingCall (main_thread_call.c: on 3.11/3.12 it also sets the main thread's
// evaluation breaker, which CPython leaves unset for calls queued from other threads, and
// re-sets it every interval while the call is outstanding, since a GIL switch on another thread
// can clear it). CPython runs the call on the main thread at its next evaluation-breaker check
// (a backward jump, a function start, the return of a C call) with the GIL held. There it is
// safe to read the frames: the interval that just ended is taken from the LineSampler and
// attributed to the innermost frame whose file passes the PathFilter (walking out of library
// code), and to every recorded function on the stack once. So only the main thread is
// measured, and a long C call, sleep or I/O is charged to the line that made it. One call is
// outstanding at a time. No signal is sent: a signal's delivery interrupts the main thread
// (an interprocessor interrupt in a VM) and measurably slows torch's CPU kernels at kHz rates;
// a queued call only costs the main thread its own run.
//
// Lifetime: at most one session samples at a time (g_active, GIL-protected).
#include "line_sampler.h"

#include <Python.h>
#include <frameobject.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <pthread.h>

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "frame_peek.h"
#include "lines/kernel_lines.h"
#include "lines/line_model.h"
#include "lines/sampler.h"
#include "main_thread_call.h"
#include "py_paths.h"
#include "py_text.h"
#include "telemetry/cupti_tracer.h"
#include "telemetry/gpu_collector.h"
#include "util/periodic_thread.h"

namespace nb = nanobind;

namespace gpuprof::python {
namespace {

class SamplerSession;
SamplerSession* g_active = nullptr;

constexpr int kMaxStackWalk = 512;

class SamplerSession {
 public:
  // `attribute`: attribute intervals to lines (false: timeline and totals only).
  SamplerSession(std::vector<std::string> roots, std::vector<std::string> include,
                 std::vector<std::string> exclude, std::string cwd, int64_t interval_ns,
                 bool attribute, bool memory, std::string gpu_backend, std::string nvml_library,
                 int mock_gpus, std::string mock_scenario, int64_t gpu_interval_ns, bool cupti,
                 std::string cupti_library)
      : filter_(std::move(roots), std::move(include), std::move(exclude), cwd,
                InterpreterLibraryDirs()),
        cwd_(std::move(cwd)),
        attribute_(attribute),
        memory_(memory),
        interval_ns_(interval_ns),
        gpu_interval_ns_(gpu_interval_ns),
        cupti_(cupti),
        cupti_library_(std::move(cupti_library)) {
    gpu_options_.backend = std::move(gpu_backend);
    gpu_options_.nvml_library = std::move(nvml_library);
    gpu_options_.mock_gpus = mock_gpus;
    gpu_options_.mock_scenario = std::move(mock_scenario);
    // GPU time per line is this process's own utilization where the driver gives it.
    gpu_options_.process_utilization = true;
    if (interval_ns_ <= 0) throw std::invalid_argument("interval_ns must be positive");
  }
  SamplerSession(const SamplerSession&) = delete;
  SamplerSession& operator=(const SamplerSession&) = delete;
  ~SamplerSession() {
    if (g_active == this) g_active = nullptr;
    drain_.Stop();
    kernels_.reset();
    sampler_.reset();  // joins the thread before the collector goes
    collector_.reset();
    for (auto& [code, entry] : codes_) Py_DECREF(code);
    Py_CLEAR(fork_caller_);
  }

  // On the main thread when `attribute` (the samples are taken there); anywhere otherwise
  // (RSS timeline only).
  void Start() {
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
    // CUPTI measures NVIDIA kernels only.
    if (collector_ && collector_->backend() == "nvml" && cupti_ && attribute_) StartKernelTracing();
    main_thread_ = pthread_self();
    sampler_ = attribute_
                   ? std::make_unique<lines::LineSampler>(o, &SamplerSession::Request, this,
                                                          &SamplerSession::Remind)
                   : std::make_unique<lines::LineSampler>(o, &SamplerSession::NoRequest, this);
    if (line_source_ != nullptr) sampler_->SetLineSource(line_source_);
    g_active = this;
    Status s = sampler_->Start();
    if (!s.ok()) {
      g_active = nullptr;
      StopKernelTracing();
      throw std::runtime_error(s.message());
    }
    state_ = kRunning;
  }

  // Kernel time per line through CUPTI (see lines/kernel_lines.h): a launch is tagged with the
  // sampling interval it happened in; a drain thread flushes the records twice a second.
  void StartKernelTracing() {
    kmap_ = std::make_unique<lines::KernelLineMap>();
    main_tstate_ = PyThreadState_Get();
    auto t = telemetry::KernelTracer::Open(cupti_library_, &SamplerSession::KernelTag, this);
    if (!t.ok()) {
      cupti_error_ = t.error();
      kmap_.reset();
      return;
    }
    kernels_ = std::move(t).value();
    drain_.Start(std::chrono::milliseconds(500), [this] {
      if (!kernels_->Flush().ok()) return;
      kmap_->Resolve(kernels_->TakeTotals());
    });
  }

  // The stopping thread, GIL released: the last records, then the tracer goes.
  void StopKernelTracing() {
    if (!kernels_) return;
    drain_.Stop();
    kernels_->Stop();  // flushes; what it delivered stays for TakeTotals
    kmap_->Resolve(kernels_->TakeTotals(), /*final=*/true);
    for (auto& n : kernels_->TakeNotes()) kernel_notes_.push_back(std::move(n));
    kernel_library_ = kernels_->library_path();
    kernel_version_ = kernels_->cupti_version();
    kernels_.reset();
    kernels_done_ = true;
  }

  // In a child made by os.fork() during the session: the sampler's threads did not survive
  // the fork, so nothing here may join or stop them. The session leaves the child's way (a
  // session of its own may start) and this object is kept for the process's lifetime (its
  // destructor would wait for threads that do not exist here).
  void DetachAfterFork() noexcept {
    if (state_ != kRunning) return;
    if (g_active == this) g_active = nullptr;
    state_ = kStopped;
    nb::handle self = nb::find(this);
    if (self.is_valid()) self.inc_ref();
  }

  // Around os.fork() (linescope's at-fork hooks; GIL held, on the forking thread). CPython
  // 3.12+ warns when os.fork() finds other threads in the process; this sampler's thread is
  // not the program's, so it is not there when the interpreter counts them:
  //
  // PauseForFork (before=): the interval so far is charged as a sample when the forking
  // thread is the measured one (to the line calling os.fork()), then the sampler thread is
  // joined (lines::LineSampler::Pause). `caller` is the frame that called os.fork() when the
  // forking thread is the main thread, else None.
  //
  // ResumeAfterFork (after_in_parent=): a fresh thread takes over once os.fork() has
  // returned. 3.12 counts the threads before the after_in_parent hooks run (3.11 does not
  // warn): the thread restarts in the hook. 3.13 and 3.14 before CPython gh-137109's fix
  // count them after the hooks, so on 3.13+ with a `caller` the restart waits for a queued
  // call on the main thread that finds the caller's os.fork() call finished (it is queued
  // again while that call is still on the stack, i.e. while later hooks run, for at most
  // kForkResumeWait, 1 s); the interval of the fork itself goes to the calling line. (3.13+
  // runs a pending call inside its eval-breaker check and goes on with the instruction; 3.11
  // under a trace function re-dispatches the same RESUME while the breaker is set, so a call
  // that queues itself again would never let the hook run on there.) Without a `caller` (a
  // fork on another thread, where the process has several threads anyway) the thread
  // restarts at once.
  void PauseForFork(nb::handle caller) {
    if (state_ != kRunning || !sampler_ || sampler_->paused()) return;
    if (pthread_equal(pthread_self(), main_thread_)) Sample();
    sampler_->Pause();
    Py_CLEAR(fork_caller_);
    if (!caller.is_none() && PyFrame_Check(caller.ptr())) {
      fork_caller_ = Py_NewRef(caller.ptr());
      fork_lasti_ = PyFrame_GetLasti(reinterpret_cast<PyFrameObject*>(fork_caller_));
    }
  }

  void ResumeAfterFork() {
    if (state_ != kRunning || !sampler_ || !sampler_->paused() || resume_queued_) return;
#if PY_VERSION_HEX >= 0x030D0000
    nb::handle self = nb::find(this);
    if (fork_caller_ != nullptr && self.is_valid() &&
        gpuprof_call_on_main_thread(&SamplerSession::ResumeCall, this) == 0) {
      self.inc_ref();  // alive until the queued call has run
      resume_queued_ = true;
      resume_deadline_ = std::chrono::steady_clock::now() + kForkResumeWait;
      return;
    }
#endif
    Resume();
  }

  void Stop() {
    if (state_ != kRunning) throw std::runtime_error("the sampler is not running");
    sampler_->Stop();  // also when paused for a fork
    Py_CLEAR(fork_caller_);
    Sample();  // the interval up to now, on the stopping line
    g_active = nullptr;
    state_ = kStopped;
    {
      nb::gil_scoped_release release;  // the tracer's Stop waits for launch callbacks
      StopKernelTracing();
    }
    for (auto& n : sampler_->TakeNotes()) notes_.push_back(std::move(n));
    if (collector_) {
      for (auto& n : collector_->TakeNotes()) gpu_notes_.push_back(std::move(n));
      for (auto& f : collector_->TakeFailures()) gpu_failures_.push_back(std::move(f));
    }
  }

  // (filename, line, samples, wall_ns, cpu_ns, rss_delta, rss_peak, gpu_busy_ns, gpu_mem_peak)
  using LineRow = std::tuple<std::string, int32_t, int64_t, int64_t, std::optional<int64_t>,
                             std::optional<int64_t>, std::optional<int64_t>, std::optional<int64_t>,
                             std::optional<int64_t>>;
  std::vector<LineRow> Lines() const {
    std::vector<LineRow> out;
    std::unordered_map<int64_t, bool> seen;
    bool cpu_measured = false;  // the sampler read the thread's CPU clock
    for (const auto& l : agg_.Lines()) {
      cpu_measured = cpu_measured || l.cpu_ns.has_value();
      std::optional<int64_t> gpu_ns = l.gpu_busy_ns;
      if (kernels_done_) {  // measured: a line without kernels has 0 kernel time
        const int64_t key = lines::KernelLineMap::Key(l.file_id, l.line);
        auto it = kmap_->lines().find(key);
        gpu_ns = it == kmap_->lines().end() ? 0 : it->second.kernel_busy_ns;
        seen[key] = true;
      }
      out.emplace_back(agg_.files()[static_cast<size_t>(l.file_id)], l.line, l.samples, l.wall_ns,
                       l.cpu_ns, l.rss_delta, l.rss_peak, gpu_ns, l.gpu_mem_peak);
    }
    // Lines that launched kernels but were never the line of a sample (shorter than the
    // interval): their GPU time is measured; their driver and CPU times are the sampler's
    // estimate from zero samples (0, as for any line, below the interval), not unknown.
    if (kernels_done_) {
      for (const auto& [key, k] : kmap_->lines()) {
        if (seen.count(key)) continue;
        auto file = static_cast<size_t>(key >> 32);
        if (file >= agg_.files().size()) continue;
        out.emplace_back(agg_.files()[file], static_cast<int32_t>(key & 0xffffffff), 0, 0,
                         cpu_measured ? std::optional<int64_t>(0) : std::nullopt, std::nullopt,
                         std::nullopt, k.kernel_busy_ns, std::nullopt);
      }
    }
    return out;
  }
  // (filename, qualname, first_line, total_ns, own_ns, own_samples)
  std::vector<std::tuple<std::string, std::string, int32_t, int64_t, int64_t, int64_t>> Functions()
      const {
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
    d["util_readings"] = g.util_readings;
    d["proc_util_readings"] = g.proc_util_readings;
    d["proc_mem_peak"] = g.proc_mem_peak;
    d["used_devices"] = g.used_devices;
    d["proc_mem_readings"] = g.proc_mem_readings;
    auto s = lines::SummarizeGpuCollection(gpu_error_, collector_ ? collector_->backend() : "",
                                           devices_.size(), g, gpu_notes_, gpu_failures_);
    lines::ApplyKernelTracing(s, kernels_done_, cupti_error_, kernel_library_, kernel_version_,
                              kmap_ ? kmap_->unattributed() : lines::LineKernelTotals{},
                              kmap_ ? kmap_->late_records() : 0, kernel_notes_);
    // The platform as Python names it (sys.platform): on macOS the missing collector is MPS.
    const bool apple_host =
        nb::cast<std::string>(nb::module_::import_("sys").attr("platform")) == "darwin";
    lines::FinishGpuCollection(s, devices_.size(), g, gpu_failures_, apple_host);
    if (kernels_done_) {
      int64_t kernels = kmap_->unattributed().kernel_count;
      for (const auto& [key, totals] : kmap_->lines()) kernels += totals.kernel_count;
      d["kernel_count"] = kernels;
      d["unattributed_kernel_ns"] = kmap_->unattributed().kernel_ns;
    }
    d["method"] = s.method;
    d["time_available"] = s.time_available;
    d["memory_available"] = s.memory_available;
    d["time_reason"] = s.time_reason;
    d["memory_reason"] = s.memory_reason;
    d["utilization_scope"] = s.utilization_scope.empty()
                                 ? std::nullopt
                                 : std::optional<std::string>(s.utilization_scope);
    d["diagnostics"] = s.diagnostics;
    d["warnings"] = s.warnings;
    return d;
  }
  nb::dict Stats() const {
    nb::dict d;
    d["requests"] = sampler_ ? sampler_->requests() : 0;
    d["failed_requests"] = sampler_ ? sampler_->failed_requests() : 0;
    d["wakeups"] = sampler_ ? sampler_->wakeups() : 0;
    d["samples"] = agg_.total_samples();
    d["unattributed_samples"] = agg_.unattributed_samples();
    d["unattributed_ns"] = agg_.unattributed_ns();
    d["elapsed_ns"] = elapsed_ns_;
    return d;
  }
  const std::vector<std::string>& notes() const { return notes_; }
  bool running() const { return state_ == kRunning; }

  // Before start(): charge RSS readings to the line a tracer publishes at `address`
  // (LineTracer.memory_line_source(); the tracer must outlive this sampler's stop()).
  void SetLineSource(uintptr_t address) {
    if (state_ != kIdle) throw std::runtime_error("set_line_source() must come before start()");
    line_source_ = reinterpret_cast<const std::atomic<uint64_t>*>(address);
  }
  // After stop(): (key, rss_delta, rss_peak, readings) per published line.
  std::vector<std::tuple<uint64_t, int64_t, int64_t, int64_t>> SourceLines() const {
    std::vector<std::tuple<uint64_t, int64_t, int64_t, int64_t>> out;
    if (sampler_ && state_ == kStopped)
      for (const auto& m : sampler_->SourceLines())
        out.emplace_back(m.key, m.rss_delta, m.rss_peak, m.readings);
    return out;
  }

  // One sample now, exactly as the queued call takes it (bench/linescope_gpu/sample_cost.py
  // measures its cost this way). Main thread, while running.
  void SampleNow() {
    if (state_ != kRunning) throw std::runtime_error("the sampler is not running");
    if (!pthread_equal(pthread_self(), main_thread_))
      throw std::runtime_error(
          "sample_now() must be called on the thread that started the sampler");
    Sample();
  }

 private:
  enum State { kIdle, kRunning, kStopped };
  struct CodeEntry {
    int32_t function = -1;  // -1: not recorded
    uint64_t stamp = 0;     // last sample that counted it in a total
  };

  // Any launching thread (CUPTI callback). The main thread, blocked in the launching C call,
  // reads its own frames and tags the innermost recorded line exactly; a code object no
  // sample has classified yet is classified here (with the GIL held, as a sample would;
  // without it, by its file name's text when CPython keeps that as compact ASCII, which
  // needs no Python call). A stack without a recorded frame tags nothing: the kernel is
  // unattributed, not charged to whatever line the next sample finds. Only when a frame
  // cannot be classified (or the frame layout is unknown) does the launch get the open
  // sampling interval, as launches from other threads (autograd, NCCL) always do.
  static uint64_t KernelTag(void* ctx) noexcept {
    auto* self = static_cast<SamplerSession*>(ctx);
    if (!pthread_equal(pthread_self(), self->main_thread_)) return self->kmap_->CurrentInterval();
    struct Find {
      SamplerSession* self;
      bool gil;
      uint64_t tag = telemetry::kNoTag;
      bool unknown = false;
      int frames = 0;
    } find{self, PyGILState_Check() != 0};
    const bool walked = PeekOwnFrames(
        self->main_tstate_,
        [](void* c, PyCodeObject* code, int offset) noexcept {
          auto* f = static_cast<Find*>(c);
          ++f->frames;
          const int32_t file = f->self->TagFile(code, f->gil);
          if (file == kUnclassified) {
            f->unknown = true;
            return true;
          }
          if (file < 0) return false;  // not recorded: the caller may be
          f->tag = lines::KernelLineMap::LineTag(file, PyCode_Addr2Line(code, offset));
          return true;
        },
        &find, kMaxStackWalk);
    if (find.tag != telemetry::kNoTag) return find.tag;
    if (!walked || find.unknown || find.frames >= kMaxStackWalk)
      return self->kmap_->CurrentInterval();
    return telemetry::kNoTag;
  }

  static constexpr int32_t kNotRecorded = -1, kUnclassified = -2;
  // The file id of `code` when it is recorded, kNotRecorded, or kUnclassified. Main thread
  // only (codes_, decided_ and the aggregator are main-thread state); `gil`: whether this
  // thread holds the GIL.
  int32_t TagFile(PyCodeObject* code, bool gil) noexcept {
    auto it = codes_.find(code);
    const CodeEntry* e = it != codes_.end() ? &it->second : (gil ? Lookup(code) : nullptr);
    if (e != nullptr)
      return e->function < 0 ? kNotRecorded
                             : agg_.functions()[static_cast<size_t>(e->function)].file_id;
    if (gil) return kUnclassified;  // Lookup failed (out of memory)
    PyObject* name = code->co_filename;
    if (name == nullptr || !PyUnicode_Check(name) || !PyUnicode_IS_COMPACT_ASCII(name))
      return kUnclassified;
    try {
      return RecordedFileId(std::string(static_cast<const char*>(PyUnicode_DATA(name)),
                                        static_cast<size_t>(PyUnicode_GET_LENGTH(name))));
    } catch (...) {
      return kUnclassified;
    }
  }

  // The aggregator's file id of `filename` when the filter records it (decided once per
  // file name), else kNotRecorded. Main thread only; may throw (out of memory).
  int32_t RecordedFileId(const std::string& filename) {
    auto d = decided_.find(filename);
    const bool recorded =
        d != decided_.end() ? d->second
                            : decided_.emplace(filename, filter_.Recorded(filename)).first->second;
    if (!recorded) return kNotRecorded;
    return agg_.InternFile(filename.empty() || filename.front() == '<'
                               ? filename
                               : lines::NormalizePath(filename, cwd_));
  }

  // Sampler thread.
  static bool Request(void* ctx) noexcept {
    return gpuprof_call_on_main_thread(&SamplerSession::OnMainThread, ctx) == 0;
  }
  static bool Remind(void*) noexcept {
    gpuprof_poke_main_thread();
    return true;
  }
  // Timeline only: the one request stays outstanding and nothing is attributed.
  static bool NoRequest(void*) noexcept { return true; }

  // The queued restart after a fork (main thread, GIL held; see PauseForFork).
  static int ResumeCall(void* arg) {
    auto* self = static_cast<SamplerSession*>(arg);
    if (self->state_ == kRunning && self->sampler_ && self->sampler_->paused() &&
        std::chrono::steady_clock::now() < self->resume_deadline_ && self->InsideForkCall() &&
        gpuprof_call_on_main_thread(&SamplerSession::ResumeCall, arg) == 0)
      return 0;  // asked again (the reference stays with the new call)
    self->resume_queued_ = false;
    self->Resume();
    nb::handle h = nb::find(self);
    if (h.is_valid()) h.dec_ref();  // may destroy *self: nothing after this
    return 0;
  }

  // Whether the main thread is still inside the os.fork() call made by fork_caller_: that
  // frame is on the stack below the innermost one, at the instruction of the call.
  bool InsideForkCall() noexcept {
    auto* caller = reinterpret_cast<PyFrameObject*>(fork_caller_);
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    if (caller == nullptr || frame == nullptr || frame == caller ||
        PyFrame_GetLasti(caller) != fork_lasti_)
      return false;
    Py_INCREF(frame);
    bool inside = false;
    for (int depth = 0; frame != nullptr && depth < kMaxStackWalk && !inside; ++depth) {
      PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
      Py_DECREF(frame);
      frame = back;
      inside = frame == caller;
    }
    Py_XDECREF(frame);
    if (PyErr_Occurred()) PyErr_Clear();
    return inside;
  }

  // The sampler thread again after a fork, the fork's interval charged first (GIL held).
  void Resume() noexcept {
    Py_CLEAR(fork_caller_);
    if (state_ != kRunning || !sampler_ || !sampler_->paused()) return;
    if (pthread_equal(pthread_self(), main_thread_)) Sample();
    Status s = sampler_->Resume();
    if (!s.ok()) {
      try {
        notes_.push_back(s.message() + "; no samples were taken after os.fork()");
      } catch (...) {
      }
    }
  }

  // The queued call (main thread, GIL held). Never raises into user code.
  static int OnMainThread(void* arg) {
    auto* self = static_cast<SamplerSession*>(arg);
    if (g_active == self && self->state_ == kRunning) self->Sample();
    return 0;
  }
  CodeEntry* Lookup(PyCodeObject* code) noexcept {
    auto it = codes_.find(code);
    if (it != codes_.end()) return &it->second;
    try {
      CodeEntry e;
      const int32_t file = RecordedFileId(Utf8OrEmpty(code->co_filename));
      if (file >= 0)
        e.function = agg_.AddFunction(file, Utf8OrEmpty(code->co_qualname), code->co_firstlineno);
      Py_INCREF(code);  // keeps the key alive (no address reuse) until the session goes
      return &codes_.emplace(code, e).first->second;
    } catch (...) {
      return nullptr;
    }
  }

  // One frame of a sample's stack walk (innermost first).
  struct Walk {
    SamplerSession* self;
    const lines::SampleInterval* iv;
    bool innermost = true;
    int32_t file = -1;
    int32_t line = 0;
  };
  static bool VisitFrame(void* ctx, PyCodeObject* code, int offset) noexcept {
    auto* w = static_cast<Walk*>(ctx);
    SamplerSession* self = w->self;
    CodeEntry* e = self->Lookup(code);
    if (e == nullptr || e->function < 0) return false;
    if (w->innermost) {
      w->innermost = false;
      w->file = self->agg_.functions()[static_cast<size_t>(e->function)].file_id;
      w->line = PyCode_Addr2Line(code, offset);
      try {
        self->agg_.AddLine(w->file, w->line, *w->iv);
      } catch (...) {
      }
      self->agg_.AddOwn(e->function, *w->iv);
    }
    if (e->stamp != self->stamp_) {  // once per sample, also under recursion
      e->stamp = self->stamp_;
      self->agg_.AddTotal(e->function, *w->iv);
    }
    return false;  // the whole stack: every recorded function gets its total
  }

  // Main thread, GIL held (the pending call, or Stop).
  void Sample() noexcept {
    if (!sampler_) return;
    lines::SampleInterval iv = sampler_->TakeInterval();
    elapsed_ns_ += iv.wall_ns;
    if (!attribute_) {
      agg_.AddUnattributed(iv);
      return;
    }
    ++stamp_;
    Walk walk{this, &iv};
    if (!PeekOwnFrames(PyThreadState_Get(), &SamplerSession::VisitFrame, &walk, kMaxStackWalk)) {
      // A Python whose frame layout is not known here: frame objects (they may be created).
      PyFrameObject* frame = PyEval_GetFrame();  // borrowed
      Py_XINCREF(frame);
      for (int depth = 0; frame != nullptr && depth < kMaxStackWalk; ++depth) {
        PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
        VisitFrame(&walk, code, PyFrame_GetLasti(frame));
        Py_DECREF(code);
        PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
        Py_DECREF(frame);
        frame = back;
      }
      Py_XDECREF(frame);
    }
    if (walk.innermost) agg_.AddUnattributed(iv);
    if (kmap_) kmap_->CloseInterval(walk.file, walk.line);
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
  std::vector<telemetry::GpuReadFailure> gpu_failures_;
  pthread_t main_thread_{};
  PyThreadState* main_tstate_ = nullptr;
  bool cupti_;
  std::string cupti_library_;
  const std::atomic<uint64_t>* line_source_ = nullptr;
  std::unique_ptr<lines::KernelLineMap> kmap_;
  std::unique_ptr<telemetry::KernelTracer> kernels_;
  util::PeriodicThread drain_;
  std::optional<std::string> cupti_error_;
  std::vector<std::string> kernel_notes_;
  std::string kernel_library_;
  uint32_t kernel_version_ = 0;
  bool kernels_done_ = false;
  uint64_t stamp_ = 0;
  int64_t elapsed_ns_ = 0;
  State state_ = kIdle;
  PyObject* fork_caller_ = nullptr;  // the frame that called os.fork() (PauseForFork)
  int fork_lasti_ = -1;
  bool resume_queued_ = false;
  // The queued restart stops waiting for os.fork() to return after this long (a hook that
  // never ends must not end sampling).
  static constexpr std::chrono::seconds kForkResumeWait{1};
  std::chrono::steady_clock::time_point resume_deadline_{};
};

}  // namespace

void RegisterLineSampler(nb::module_& m) {
  // (linescope's `scalene` adapter says it too.)
  m.attr("DEVICE_WIDE_GPU_WARNING") = lines::kDeviceWideGpuWarning;
  nb::class_<SamplerSession>(m, "LineSampler")
      .def(nb::init<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>,
                    std::string, int64_t, bool, bool, std::string, std::string, int, std::string,
                    int64_t, bool, std::string>(),
           nb::arg("roots"), nb::arg("include"), nb::arg("exclude"), nb::arg("cwd"),
           nb::arg("interval_ns"), nb::arg("attribute"), nb::arg("memory"), nb::arg("gpu_backend"),
           nb::arg("nvml_library") = "", nb::arg("mock_gpus") = 1, nb::arg("mock_scenario") = "",
           nb::arg("gpu_interval_ns") = 10'000'000, nb::arg("cupti") = false,
           nb::arg("cupti_library") = "")
      .def("start", &SamplerSession::Start)
      .def("stop", &SamplerSession::Stop)
      .def("detach_after_fork", &SamplerSession::DetachAfterFork)
      .def("pause_for_fork", &SamplerSession::PauseForFork, nb::arg("caller").none())
      .def("resume_after_fork", &SamplerSession::ResumeAfterFork)
      .def("lines", &SamplerSession::Lines)
      .def("functions", &SamplerSession::Functions)
      .def("timeline", &SamplerSession::Timeline)
      .def("memory", &SamplerSession::Memory)
      .def("gpu", &SamplerSession::Gpu)
      .def("stats", &SamplerSession::Stats)
      .def("sample_now", &SamplerSession::SampleNow)
      .def("set_line_source", &SamplerSession::SetLineSource, nb::arg("address"))
      .def("source_lines", &SamplerSession::SourceLines)
      .def_prop_ro("notes", &SamplerSession::notes)
      .def_prop_ro("running", &SamplerSession::running);
}

}  // namespace gpuprof::python
