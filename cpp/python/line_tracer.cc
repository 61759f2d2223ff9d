// The native line tracer behind linescope's `trace` backend.
//
// What is measured: the thread that calls start() (the "owner"); events of other threads are
// ignored. Only code objects whose file passes lines::PathFilter are recorded; everything
// else (stdlib, site-packages, C extensions, I/O) is not traced, so its time lands on the
// recorded line that called into it (inclusive line time, see lines/line_model.h).
//
// Frames are told apart by key (lines::FrameKey): the interpreter frame's address.
//
// 3.12+: sys.monitoring with a free tool id; LINE, JUMP, PY_START, PY_RESUME, PY_THROW,
//   PY_RETURN, PY_YIELD and PY_UNWIND. Local events in unrecorded code return sys.monitoring.DISABLE,
//   so each such code location costs one callback in the whole session. PY_START is also
//   disabled for recorded code that is not a generator or coroutine: such a call is seen at
//   its first LINE event from a frame key that is not the innermost open frame, which saves
//   one callback per call. Generators and coroutines keep PY_START (a fresh start) and
//   PY_RESUME / PY_THROW (a resume is not a call). On 3.13+ a function whose first
//   statement shares the line of its RESUME (a one-line `def f(x): return x`, a lambda)
//   keeps PY_START too: with PY_START disabled, 3.13 reports no LINE event for that first
//   line, so the call would go unseen. JUMP counts a backward jump to the same line as a
//   new hit of that line (a one-line loop, an inlined comprehension), as the 3.11 trace
//   function and line_profiler do; every other jump location (forward jumps, jumps to
//   another line, which LINE reports) is disabled at its first event. The hot callbacks (LINE, PY_RETURN of the
//   innermost frame) read the clock, compare the thread and the frame key, and touch one
//   line cell; they do no per-event lookup of the code object.
// 3.11: a C trace function installed with PyEval_SetTrace on the owner thread. A tracer that
//   was already installed (a debugger, coverage) is chained: it sees every event first.
//   Without a chained tracer, unrecorded frames get f_trace_lines = False (no line events),
//   and from the session's first call into unrecorded code on, such frames start with the
//   thread's tracing mode off (eval_hook.h).
//   Fresh call vs resume is told apart from the code object's bytecode at f_lasti.
//
// Per-code decisions are cached in the code object's co_extra slot (one index per process),
// tagged with a session generation so a later session with other filters decides afresh,
// and in a small direct-mapped cache by address (entries hold strong references).
#include "line_tracer.h"
#include "eval_hook.h"
#include "frame_peek.h"
#include "py_paths.h"
#include "py_text.h"

#include <Python.h>
#include <frameobject.h>
#if PY_VERSION_HEX >= 0x030C0000
#include <opcode.h>  // RESUME, CACHE
#endif
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "clock/clock.h"
#include "lines/line_model.h"

namespace nb = nanobind;

namespace gpuprof::python {
namespace {

#if PY_VERSION_HEX >= 0x030C0000
#define GPUPROF_MONITORING 1
#else
#define GPUPROF_MONITORING 0
#endif

Py_ssize_t CodeExtraIndex() {
  static Py_ssize_t index = -2;
  if (index == -2) {
#if PY_VERSION_HEX >= 0x030C0000
    index = PyUnstable_Eval_RequestCodeExtraIndex(nullptr);
#else
    index = _PyEval_RequestCodeExtraIndex(nullptr);
#endif
  }
  return index;
}

int GetExtra(PyObject* code, Py_ssize_t index, void** out) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyUnstable_Code_GetExtra(code, index, out);
#else
  return _PyCode_GetExtra(code, index, out);
#endif
}

int SetExtra(PyObject* code, Py_ssize_t index, void* value) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyUnstable_Code_SetExtra(code, index, value);
#else
  return _PyCode_SetExtra(code, index, value);
#endif
}

constexpr int32_t kExcluded = -1;
constexpr int32_t kFailed = -2;

class LineTracer;
LineTracer* g_active = nullptr;  // at most one tracing session per process (GIL-protected)
uint32_t g_generation = 0;

// The OS thread that started the running session, as its thread pointer (see ThisThread), 0
// when none runs, kOwnerGone once that thread ended before stop(). Written by start / stop
// (GIL held) and by the exiting owner thread's thread-local destructor (no GIL), which runs
// before that thread's thread pointer can be reused by a new thread: a later thread is never
// taken for the owner, and the owner's freed thread state is never read.
constexpr uintptr_t kOwnerGone = 1;
std::atomic<uintptr_t> g_owner_thread{0};

// A thread pointer (unique per live OS thread) is one register read.
uintptr_t ThisThread() noexcept {
#if (defined(__x86_64__) || defined(__aarch64__)) && defined(__has_builtin)
#if __has_builtin(__builtin_thread_pointer)
#define GPUPROF_THREAD_POINTER 1
  return reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
#endif
#endif
#ifndef GPUPROF_THREAD_POINTER
  return static_cast<uintptr_t>(pthread_self());
#endif
}

struct OwnerExitWatch {
  bool armed = false;
  ~OwnerExitWatch() {
    uintptr_t me = ThisThread();
    if (armed) g_owner_thread.compare_exchange_strong(me, kOwnerGone);
  }
};
thread_local OwnerExitWatch t_owner_exit_watch;

class LineTracer {
 public:
  LineTracer(std::vector<std::string> roots, std::vector<std::string> include,
             std::vector<std::string> exclude, std::string cwd)
      : filter_(std::move(roots), std::move(include), std::move(exclude), cwd,
                InterpreterLibraryDirs()),
        cwd_(cwd) {}
  LineTracer(const LineTracer&) = delete;
  LineTracer& operator=(const LineTracer&) = delete;
  ~LineTracer() {
    if (g_active == this) {
      // Collected while active: detach without raising.
      try {
        Stop(0);
      } catch (...) {
      }
    }
  }

  static const char* Mode() { return GPUPROF_MONITORING ? "sys.monitoring" : "settrace"; }

  // `adopt_running`: whether the recorded frames running now are measured from now on (see
  // AdoptRunningFrames); a launcher whose own frames are recorded (a notebook cell running
  // the cell magic) passes false.
  void Start(bool adopt_running) {
    if (g_active != nullptr)
      throw std::runtime_error("another linescope trace session is already active");
    if (state_ != kIdle) throw std::runtime_error("this tracer was already started");
    if (CodeExtraIndex() < 0) throw std::runtime_error("no free code-object extra slot");
    generation_ = ++g_generation;
    owner_ = PyThreadState_Get();
    owner_id_ = owner_->id;
    start_ns_ = clock::NowNs();
    last_event_ns_ = start_ns_;
    t_owner_exit_watch.armed = true;
    g_owner_thread.store(ThisThread(), std::memory_order_relaxed);
#if GPUPROF_MONITORING
    try {
      if (adopt_running) AdoptRunningFrames(start_ns_);
      StartMonitoring();
    } catch (...) {
      if (tool_id_ >= 0) StopMonitoring();  // release a half-claimed tool id
      warnings_.clear();
      tool_id_ = -1;
      g_owner_thread.store(0, std::memory_order_relaxed);
      throw;
    }
#else
    trace_obj_ = TraceObject();
    if (trace_obj_ == nullptr) {
      g_owner_thread.store(0, std::memory_order_relaxed);
      throw nb::python_error();
    }
    prev_func_ = owner_->c_tracefunc;
    prev_obj_ = owner_->c_traceobj;
    if (prev_obj_ == trace_obj_) {
      prev_func_ = nullptr;  // a stale restore of an earlier session's tracer (sys.settrace)
      prev_obj_ = nullptr;
    }
    Py_XINCREF(prev_obj_);
    if (adopt_running) AdoptRunningFrames(start_ns_);
    g_active = this;
    // Unrecorded code out of tracing mode (eval_hook.h), from its first call on; a chained
    // tracer sees everything.
    eval_hook_pending_ = prev_func_ == nullptr;
    ResetUntracedEvalStats();
    PyEval_SetTrace(&LineTracer::TraceFunc, trace_obj_);
#endif
    g_active = this;
    state_ = kRunning;
  }

  // Whether the owner's thread state is still one of the interpreter's (GIL held: the list
  // cannot change). Compared by address and by its unique id, so a new thread state at the
  // freed one's address is not taken for it.
  bool OwnerAlive() const noexcept {
    PyInterpreterState* interp = PyInterpreterState_Get();
    for (PyThreadState* t = PyInterpreterState_ThreadHead(interp); t != nullptr;
         t = PyThreadState_Next(t)) {
      if (t == owner_ && t->id == owner_id_) return true;
    }
    return false;
  }

  // `as_of_ns` (clock::NowNs time, 0: now): when the user asked to stop. The session's own
  // work between that moment and this call is then not part of the run; an event recorded
  // after it (none is expected) moves the end to that event.
  void Stop(int64_t as_of_ns) {
    if (state_ != kRunning) throw std::runtime_error("the tracer is not running");
    int64_t now = clock::NowNs();
    if (as_of_ns > 0 && as_of_ns < now) now = std::max({as_of_ns, agg_.LatestEventNs(), start_ns_});
    // Gone: its thread-local destructor ran, or (the destructor may run after join() returned)
    // its thread state is no longer among the interpreter's.
    const bool owner_gone =
        g_owner_thread.exchange(0, std::memory_order_relaxed) == kOwnerGone || !OwnerAlive();
    if (owner_gone) {
      warnings_.push_back(
          "the measured thread (the one that called start()) ended before stop(); its lines "
          "up to then are recorded, and no other thread was measured after it");
    }
#if GPUPROF_MONITORING
    StopMonitoring();
#else
    DisarmUntracedEval();
    if (owner_gone) {
      // Its thread state is gone, and with it the trace function installed on it.
    } else if (InstalledOn(owner_)) {
      if (_PyEval_SetTrace(owner_, prev_func_, prev_obj_) < 0) {
        PyErr_Clear();
        warnings_.push_back("could not restore the previous trace function");
      }
    } else {
      warnings_.push_back(
          "another tool replaced the trace function during the session (sys.settrace?); "
          "line events after that point were not recorded");
    }
    if (restored_after_replace_) {
      warnings_.push_back(
          "another tool replaced the trace function during the session (sys.settrace) and "
          "later put linescope's back: the lines that ran in between were not recorded, and "
          "their time is on the line that replaced it");
    }
    Py_CLEAR(prev_obj_);
#endif
    if (!undecodable_.empty()) {
      warnings_.push_back(
          std::to_string(undecodable_.size()) + " file(s) under the root ran but were not "
          "recorded because their names are not valid UTF-8 (e.g. " + undecodable_example_ +
          "); linescope records files by UTF-8 path: rename them to profile their lines");
    }
    // The innermost recorded frame is on the line that stops the session (the `with` line
    // on exit, `session.stop()`): that is the profiler's own work, not the user's.
    agg_.DiscardCurrentLine();
    agg_.CloseAll(now);
    ClearCodeCache();
    stop_ns_ = now;
    g_active = nullptr;
    state_ = kStopped;
  }

  // In a child made by os.fork() during the session (the child does not own it): the hooks
  // go, so the child runs untraced and may start a session of its own; no result is made
  // here. What belongs to the parent's threads is not touched.
  void DetachAfterFork() noexcept {
    if (g_active != this || state_ != kRunning) return;
#if GPUPROF_MONITORING
    StopMonitoring();
#else
    DisarmUntracedEval();
    PyThreadState* ts = PyThreadState_Get();
    if (ts == owner_ && InstalledOn(ts)) {
      if (_PyEval_SetTrace(ts, prev_func_, prev_obj_) < 0) PyErr_Clear();
    }
    Py_CLEAR(prev_obj_);
#endif
    ClearCodeCache();
    g_owner_thread.store(0, std::memory_order_relaxed);
    g_active = nullptr;
    state_ = kStopped;
  }

  // (filename, line, wall_ns, self_ns, hits, calls)
  std::vector<std::tuple<std::string, int32_t, int64_t, int64_t, int64_t, int64_t>> Lines()
      const {
    std::vector<std::tuple<std::string, int32_t, int64_t, int64_t, int64_t, int64_t>> out;
    for (const auto& s : agg_.Lines())
      out.emplace_back(agg_.files()[static_cast<size_t>(s.file_id)], s.line, s.wall_time_ns,
                       s.self_time_ns, s.hits, s.calls);
    return out;
  }
  // (filename, qualname, first_line, total_ns, own_ns, calls)
  std::vector<std::tuple<std::string, std::string, int32_t, int64_t, int64_t, int64_t>>
  Functions() const {
    std::vector<std::tuple<std::string, std::string, int32_t, int64_t, int64_t, int64_t>> out;
    for (const auto& f : agg_.Functions())
      out.emplace_back(agg_.files()[static_cast<size_t>(f.file_id)], f.qualname, f.first_line,
                       f.total_time_ns, f.own_time_ns, f.calls);
    return out;
  }
  bool Recorded(const std::string& path) const { return filter_.Recorded(path); }

  // memory=True beside this tracer: the address of the current-line word that the memory
  // sampler reads (lines::LineAggregator::PublishTo), valid while this tracer lives.
  uintptr_t MemoryLineSource() {
    agg_.PublishTo(&current_line_);
    return reinterpret_cast<uintptr_t>(&current_line_);
  }
  // Published keys -> (filename, line); unknown keys are skipped.
  std::vector<std::tuple<uint64_t, std::string, int32_t>> ResolveLineKeys(
      const std::vector<uint64_t>& keys) const {
    std::vector<std::tuple<uint64_t, std::string, int32_t>> out;
    for (uint64_t key : keys) {
      int32_t code = lines::LineAggregator::KeyCode(key);
      if (key == 0 || code < 0 || static_cast<size_t>(code) >= agg_.code_count()) continue;
      out.emplace_back(key, agg_.files()[static_cast<size_t>(agg_.code_file(code))],
                       lines::LineAggregator::KeyLine(key));
    }
    return out;
  }
  int64_t elapsed_ns() const {
    return state_ == kStopped ? stop_ns_ - start_ns_
                              : (state_ == kRunning ? clock::NowNs() - start_ns_ : 0);
  }
  int64_t mismatches() const { return agg_.mismatches(); }
  int64_t other_thread_events() const { return other_thread_events_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  int tool_id() const { return tool_id_; }
  bool running() const { return state_ == kRunning; }

 private:
  enum State { kIdle, kRunning, kStopped };

  // Per registered code object (parallel to the aggregator's code indices).
  struct CodeInfo {
    bool generator_like = false;
    bool keep_start = false;  // 3.13+: PY_START stays enabled (see the header comment)
    int first_resume = -1;    // 3.11: byte offset of the first RESUME 0 (a fresh start)
    std::vector<int32_t> unit_lines;  // 3.12+: line per code unit, built at the first JUMP
  };

  using FrameKey = lines::FrameKey;

  // What the tracer knows about one code object, cached by address.
  struct CodeEntry {
    PyObject* code = nullptr;  // strong reference while cached
    int32_t idx = kFailed;     // aggregator code index, or kExcluded / kFailed
    bool generator_like = false;
    bool keep_start = false;
  };
  static constexpr size_t kCodeCacheSize = 256;

  // Hot: a direct-mapped cache hit is a hash and a compare. A miss costs one co_extra read
  // (and on first sight of a code object in this session, its registration). Entries hold
  // strong references, so a cached address cannot be reused by another code object.
  static size_t CacheSlot(PyObject* code) noexcept {
    auto a = reinterpret_cast<uintptr_t>(code);
    return ((a >> 4) ^ (a >> 12)) & (kCodeCacheSize - 1);
  }
  const CodeEntry& Lookup(PyObject* code) noexcept {
    CodeEntry& e = code_cache_[CacheSlot(code)];
    if (e.code == code) return e;
    return Fill(e, code);
  }

  [[gnu::noinline, gnu::cold]] const CodeEntry& Fill(CodeEntry& e, PyObject* code) noexcept {
    int32_t idx = LookupExtra(code);
    Py_INCREF(code);
    PyObject* old = e.code;
    e.code = code;
    e.idx = idx;
    e.generator_like = idx >= 0 && infos_[static_cast<size_t>(idx)].generator_like;
    e.keep_start = idx >= 0 && infos_[static_cast<size_t>(idx)].keep_start;
    Py_XDECREF(old);  // after the entry is consistent: a dealloc may run arbitrary code
    return e;
  }

  void ClearCodeCache() noexcept {
    for (CodeEntry& e : code_cache_) {
      PyObject* old = e.code;
      e = CodeEntry{};
      Py_XDECREF(old);
    }
  }

  int32_t LookupExtra(PyObject* code) noexcept {
    void* extra = nullptr;
    Py_ssize_t index = CodeExtraIndex();
    if (GetExtra(code, index, &extra) < 0) {
      PyErr_Clear();
      return kFailed;
    }
    auto v = reinterpret_cast<uintptr_t>(extra);
    if (v != 0 && static_cast<uint32_t>(v >> 32) == generation_)
      return static_cast<int32_t>(static_cast<uint32_t>(v)) - 2;
    int32_t idx = Register(code);
    uintptr_t tagged = (static_cast<uintptr_t>(generation_) << 32) |
                       static_cast<uint32_t>(idx + 2);
    if (SetExtra(code, index, reinterpret_cast<void*>(tagged)) < 0) PyErr_Clear();
    return idx;
  }

  // The last line a code object's instructions carry (from `co_lines()`, linear in the code
  // size), so that its line array does not have to grow while it runs (cold).
  static int32_t LastLine(PyCodeObject* code) noexcept {
    int32_t hi = code->co_firstlineno;
    VisitCoLines(reinterpret_cast<PyObject*>(code), [&](long, long, long line) {
      if (line >= 0) hi = std::max(hi, static_cast<int32_t>(line));
      return true;
    });
    return hi;
  }

  // Calls visit(start, end, line) for each `co_lines()` range (byte offsets; line -1 where
  // the range has none) until it returns false. Cold; Python errors are cleared.
  template <class Visit>
  static void VisitCoLines(PyObject* code, Visit visit) noexcept {
    PyObject* it = PyObject_CallMethod(code, "co_lines", nullptr);
    PyObject* entry = nullptr;
    bool go_on = true;
    while (go_on && it != nullptr && (entry = PyIter_Next(it)) != nullptr) {
      if (PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 3) {
        PyObject* l = PyTuple_GET_ITEM(entry, 2);
        go_on = visit(PyLong_AsLong(PyTuple_GET_ITEM(entry, 0)),
                      PyLong_AsLong(PyTuple_GET_ITEM(entry, 1)),
                      PyLong_Check(l) ? PyLong_AsLong(l) : -1L);
      }
      Py_DECREF(entry);
    }
    Py_XDECREF(it);
    if (PyErr_Occurred()) PyErr_Clear();
  }

#if PY_VERSION_HEX >= 0x030D0000
  // Whether the first instruction after the code's first RESUME lies on RESUME's line
  // (cold, once per code object).
  static bool FirstLineSharesResume(PyCodeObject* code) noexcept {
    PyObject* bytes = PyCode_GetCode(code);
    if (bytes == nullptr) {
      PyErr_Clear();
      return true;  // unknown: keeping PY_START is always correct
    }
    const auto* b = reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(bytes));
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    bool shares = false;
    for (Py_ssize_t i = 0; i + 1 < n; i += 2) {
      if (b[i] != RESUME) continue;
      int resume_line = PyCode_Addr2Line(code, static_cast<int>(i));
      for (Py_ssize_t j = i + 2; j + 1 < n; j += 2) {
        if (b[j] == CACHE) continue;
        int line = PyCode_Addr2Line(code, static_cast<int>(j));
        if (line < 0) continue;  // an instruction without a line reports no LINE event
        shares = line == resume_line;
        break;
      }
      break;
    }
    Py_DECREF(bytes);
    return shares;
  }
#endif

#if GPUPROF_MONITORING
  // The line of every code unit (from `co_lines()`; -1 where none), for the JUMP callback's
  // same-line test (cold: once per code object that jumps backward).
  static std::vector<int32_t> UnitLines(PyObject* code) noexcept {
    std::vector<int32_t> out;
    VisitCoLines(code, [&](long start, long end, long line) {
      if (start < 0 || end <= start) return true;
      auto hi = static_cast<size_t>(end / 2);
      try {
        if (out.size() < hi) out.resize(hi, -1);
      } catch (...) {
        return false;  // out of memory: the lines read so far
      }
      for (auto u = static_cast<size_t>(start / 2); u < hi; ++u)
        out[u] = static_cast<int32_t>(line);
      return true;
    });
    return out;
  }
#endif

  // Cold: a code object whose file name is not UTF-8 (a surrogate-escaped name from a
  // non-UTF-8 file system path) is not recorded; one that the filter would have recorded (its
  // raw bytes under the root) is counted, for a warning at stop().
  void NoteUndecodable(PyObject* name) noexcept {
    if (name == nullptr || !PyUnicode_Check(name) || PyUnicode_GET_LENGTH(name) == 0) return;
    PyObject* raw = PyUnicode_EncodeFSDefault(name);
    if (raw == nullptr) {
      PyErr_Clear();
      return;
    }
    try {
      std::string path(PyBytes_AS_STRING(raw), static_cast<size_t>(PyBytes_GET_SIZE(raw)));
      if (filter_.Recorded(path) && undecodable_.insert(path).second && undecodable_.size() == 1) {
        PyObject* shown = PyObject_ASCII(name);
        if (shown != nullptr) undecodable_example_ = Utf8OrEmpty(shown);
        Py_XDECREF(shown);
        PyErr_Clear();
      }
    } catch (...) {
    }
    Py_DECREF(raw);
  }

  int32_t Register(PyObject* code_obj) noexcept {
    try {
      auto* code = reinterpret_cast<PyCodeObject*>(code_obj);
      std::string filename = Utf8OrEmpty(code->co_filename);
      if (filename.empty()) NoteUndecodable(code->co_filename);
      auto cached = decided_.find(filename);
      bool recorded;
      if (cached != decided_.end()) {
        recorded = cached->second;
      } else {
        recorded = filter_.Recorded(filename);
        decided_.emplace(filename, recorded);
      }
      if (!recorded) return kExcluded;
      std::string path = filename.empty() || filename.front() == '<'
                             ? filename
                             : lines::NormalizePath(filename, cwd_);
      int32_t file_id = agg_.InternFile(path);
      std::string qualname = Utf8OrEmpty(code->co_qualname);
      int32_t first = code->co_firstlineno;
      int32_t idx = agg_.AddCode(file_id, qualname, first, LastLine(code));
      CodeInfo info;
      info.generator_like =
          (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)) != 0;
#if PY_VERSION_HEX >= 0x030D0000
      if (!info.generator_like) info.keep_start = FirstLineSharesResume(code);
#endif
#if !GPUPROF_MONITORING
      if (info.generator_like) {
        PyObject* bytes = PyCode_GetCode(code);
        if (bytes != nullptr) {
          const char* b = PyBytes_AS_STRING(bytes);
          Py_ssize_t n = PyBytes_GET_SIZE(bytes);
          constexpr unsigned char kResume = 151;
          for (Py_ssize_t i = 0; i + 1 < n; i += 2) {
            if (static_cast<unsigned char>(b[i]) == kResume && b[i + 1] == 0) {
              info.first_resume = static_cast<int>(i);
              break;
            }
          }
          Py_DECREF(bytes);
        } else {
          PyErr_Clear();
        }
      }
#endif
      infos_.push_back(info);
      return idx;
    } catch (...) {
      return kFailed;
    }
  }

  // The recorded frames running at start() (the caller of start() and the frames below it)
  // are open from `now` on, not counted as calls: each outer one on its current line (the
  // line waiting for the call that leads to start(); its time so far is before the session,
  // so it gets no hit), the innermost one without a line (its current line is the one
  // starting the session: its next line event names the first line measured).
  void AdoptRunningFrames(int64_t now) {
    struct Running {
      int32_t code;
      FrameKey key;
      int32_t line;
    };
    std::vector<Running> running;  // innermost first
    PyFrameObject* f = PyEval_GetFrame();  // borrowed
    Py_XINCREF(f);
    while (f != nullptr) {
      PyCodeObject* code = PyFrame_GetCode(f);
      const int32_t idx = Lookup(reinterpret_cast<PyObject*>(code)).idx;
      Py_DECREF(code);
      if (idx >= 0) {
#if GPUPROF_MONITORING
        auto key = reinterpret_cast<FrameKey>(InterpreterFrameOf(f));
#else
        auto key = reinterpret_cast<FrameKey>(f);
        // An earlier session with other filters may have turned its line events off.
        if (prev_func_ == nullptr) {
          EnableLineEvents(f);
          SetLocalTraceIfUnset(f, trace_obj_);
        }
#endif
        if (key != 0) running.push_back({idx, key, running.empty() ? 0 : PyFrame_GetLineNumber(f)});
      }
      PyFrameObject* back = PyFrame_GetBack(f);
      Py_DECREF(f);
      f = back;
    }
    for (auto it = running.rbegin(); it != running.rend(); ++it)
      agg_.Enter(it->code, it->key, now, /*fresh_call=*/false, it->line);
  }

#if GPUPROF_MONITORING
  // ---- 3.12+: sys.monitoring ----
  // The clock is read first: the callbacks' fast paths then make no other call.
  static PyObject* OnStart(PyObject*, PyObject* const* args, Py_ssize_t) {
    int64_t now = clock::NowNs();
    return g_active ? g_active->StartEvent(args[0], now) : Py_NewRef(Py_None);
  }
  static PyObject* OnResume(PyObject*, PyObject* const* args, Py_ssize_t n) {
    int64_t now = clock::NowNs();
    return g_active ? g_active->ResumeEvent(args, n, now, /*can_disable=*/true)
                    : Py_NewRef(Py_None);
  }
  static PyObject* OnThrow(PyObject*, PyObject* const* args, Py_ssize_t n) {
    int64_t now = clock::NowNs();
    if (g_active) Py_XDECREF(g_active->ResumeEvent(args, n, now, /*can_disable=*/false));
    return Py_NewRef(Py_None);  // PY_THROW cannot be disabled
  }
  static PyObject* OnLeave(PyObject*, PyObject* const* args, Py_ssize_t) {
    int64_t now = clock::NowNs();
    return g_active ? g_active->LeaveEvent(args[0], now, /*can_disable=*/true)
                    : Py_NewRef(Py_None);
  }
  static PyObject* OnUnwind(PyObject*, PyObject* const* args, Py_ssize_t) {
    int64_t now = clock::NowNs();
    if (g_active) Py_XDECREF(g_active->LeaveEvent(args[0], now, /*can_disable=*/false));
    return Py_NewRef(Py_None);  // PY_UNWIND cannot be disabled
  }
  static PyObject* OnLine(PyObject*, PyObject* const* args, Py_ssize_t) {
    int64_t now = clock::NowNs();
    return g_active ? g_active->LineEvent(args[0], args[1], now) : Py_NewRef(Py_None);
  }
  static PyObject* OnJump(PyObject*, PyObject* const* args, Py_ssize_t) {
    int64_t now = clock::NowNs();
    return g_active ? g_active->JumpEvent(args[0], args[1], args[2], now) : Py_NewRef(Py_None);
  }

  // METH_FASTCALL functions travel in PyMethodDef as PyCFunction.
  template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t)>
  static PyCFunction Fast() {
    return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
  }

  PyObject* Disable() { return Py_NewRef(disable_.ptr()); }

  // sys.monitoring events are process-wide: only the owner thread's are recorded (see
  // g_owner_thread); the owner's Python thread state is then known without a lookup.
  static bool OwnerThread() noexcept {
    return ThisThread() == g_owner_thread.load(std::memory_order_relaxed);
  }

  // The key of the frame that raised the event: the owner's current interpreter frame.
  FrameKey CurrentFrame() const noexcept {
#if PY_VERSION_HEX >= 0x030D0000
    return reinterpret_cast<FrameKey>(owner_->current_frame);
#else
    return reinterpret_cast<FrameKey>(owner_->cframe->current_frame);
#endif
  }

  // An event of a non-owner thread: unrecorded code is disabled for every thread.
  [[gnu::noinline, gnu::cold]] PyObject* OtherThread(PyObject* code, bool can_disable) noexcept {
    ++other_thread_events_;
    if (can_disable && Lookup(code).idx == kExcluded) return Disable();
    return Py_NewRef(Py_None);
  }

  [[gnu::noinline, gnu::cold]] static int32_t BigLineNumber(PyObject* line) noexcept {
    long v = PyLong_AsLong(line);
    if (v == -1 && PyErr_Occurred()) PyErr_Clear();
    return static_cast<int32_t>(v);
  }
  static bool SmallInt(PyObject* v) noexcept {
    return PyUnstable_Long_IsCompact(reinterpret_cast<PyLongObject*>(v));
  }
  static int32_t LineNumber(PyObject* line) noexcept {
    auto* l = reinterpret_cast<PyLongObject*>(line);
    if (PyUnstable_Long_IsCompact(l)) return static_cast<int32_t>(PyUnstable_Long_CompactValue(l));
    return BigLineNumber(line);
  }

  // The hot callbacks' answer. None is immortal on 3.12+ (its reference count never
  // changes), so the new reference needs no increment.
  static PyObject* NoneRef() noexcept { return Py_None; }

  // Hot: a new line. The innermost recorded frame is the common case. Not inlined into the
  // callback, and every call on its way is a tail call or followed by nothing live, so that
  // the fast path needs no callee-saved registers.
  [[gnu::noinline]] PyObject* LineEvent(PyObject* code, PyObject* line_obj,
                                        int64_t now) noexcept {
    if (!OwnerThread()) return OtherThread(code, true);
    if (!SmallInt(line_obj)) [[unlikely]]
      return LineEventSlow(code, line_obj, now);
    FrameKey key = CurrentFrame();
    auto line = static_cast<int32_t>(
        PyUnstable_Long_CompactValue(reinterpret_cast<PyLongObject*>(line_obj)));
    if (agg_.Line(key, line, now)) return NoneRef();
    return NewFrameLine(code, key, line, now);
  }
  [[gnu::noinline, gnu::cold]] PyObject* LineEventSlow(PyObject* code, PyObject* line_obj,
                                                       int64_t now) noexcept {
    FrameKey key = CurrentFrame();
    int32_t line = BigLineNumber(line_obj);
    if (agg_.Line(key, line, now)) return NoneRef();
    return NewFrameLine(code, key, line, now);
  }

  // A line from a frame that is not the innermost open one: unrecorded code, or a call
  // whose PY_START is disabled, or a frame that was running when the session started.
  // Hot for the first line of a fresh call of a cached, recorded plain function; the rest
  // is NewFrameLineSlow.
  [[gnu::noinline]] PyObject* NewFrameLine(PyObject* code, FrameKey key, int32_t line,
                                           int64_t now) noexcept {
    const CodeEntry& e = code_cache_[CacheSlot(code)];
    if (e.code == code && e.idx >= 0 && !e.generator_like && line > 0 &&
        agg_.TryEnterFreshAtLine(e.idx, key, now, line))
      return NoneRef();
    return NewFrameLineSlow(code, key, line, now);
  }
  [[gnu::noinline]] PyObject* NewFrameLineSlow(PyObject* code, FrameKey key, int32_t line,
                                               int64_t now) noexcept {
    const CodeEntry& e = Lookup(code);
    if (e.idx == kExcluded) return Disable();
    if (e.idx < 0 || line <= 0) return NoneRef();
    // Frames running at start() are open already (AdoptRunningFrames): this is a fresh call
    // unless it is a generator or coroutine resuming.
    agg_.EnterAtLine(e.idx, key, now, /*fresh_call=*/!e.generator_like, line);
    return NoneRef();
  }

  // JUMP: a backward jump to the jump's own line starts that line again (a hit). Other
  // jumps are disabled where they are: LINE reports the line changes.
  PyObject* JumpEvent(PyObject* code, PyObject* from_obj, PyObject* to_obj,
                      int64_t now) noexcept {
    int32_t from = LineNumber(from_obj);  // byte offsets (small ints, like line numbers)
    int32_t to = LineNumber(to_obj);
    if (to > from) return Disable();
    const CodeEntry& e = Lookup(code);
    if (e.idx == kExcluded) return Disable();
    if (e.idx < 0) return Py_NewRef(Py_None);
    if (!SameLineJump(e.idx, code, from, to)) return Disable();
    if (!OwnerThread()) {
      ++other_thread_events_;
      return Py_NewRef(Py_None);
    }
    FrameKey key = CurrentFrame();
    if (agg_.RepeatLine(key, now)) return Py_NewRef(Py_None);
    // A frame without a current line (it began before the session and loops on one line).
    int32_t line = infos_[static_cast<size_t>(e.idx)].unit_lines[static_cast<size_t>(to / 2)];
    if (agg_.Line(key, line, now)) return Py_NewRef(Py_None);
    return NewFrameLine(code, key, line, now);
  }
  bool SameLineJump(int32_t idx, PyObject* code, int32_t from, int32_t to) noexcept {
    std::vector<int32_t>& lines = infos_[static_cast<size_t>(idx)].unit_lines;
    if (lines.empty()) lines = UnitLines(code);
    auto f = static_cast<size_t>(from / 2);
    auto t = static_cast<size_t>(to / 2);
    return from >= 0 && to >= 0 && f < lines.size() && t < lines.size() && lines[f] > 0 &&
           lines[f] == lines[t];
  }

  // PY_START: generators and coroutines keep it (a fresh start, not a resume); so do, on
  // 3.13+, functions whose first line would report no LINE event without it.
  PyObject* StartEvent(PyObject* code, int64_t now) noexcept {
    const CodeEntry& e = Lookup(code);
    if (e.idx == kExcluded) return Disable();  // excluded for every thread
    if (e.idx < 0) return Py_NewRef(Py_None);
    if (!e.generator_like && !e.keep_start) return Disable();  // seen at their first LINE
    if (!OwnerThread()) {
      ++other_thread_events_;
      return Py_NewRef(Py_None);
    }
    agg_.Enter(e.idx, CurrentFrame(), now, /*fresh_call=*/true, 0);
    return Py_NewRef(Py_None);
  }

  // PY_RESUME / PY_THROW: a generator or coroutine frame goes on, on the line of `offset`.
  PyObject* ResumeEvent(PyObject* const* args, Py_ssize_t n, int64_t now,
                        bool can_disable) noexcept {
    if (!OwnerThread()) return OtherThread(args[0], can_disable);
    const CodeEntry& e = Lookup(args[0]);
    if (e.idx == kExcluded) return can_disable ? Disable() : Py_NewRef(Py_None);
    if (e.idx < 0) return Py_NewRef(Py_None);
    int32_t line = 0;
    if (n > 1) {
      long offset = PyLong_AsLong(args[1]);
      if (offset >= 0)
        line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(args[0]), static_cast<int>(offset));
      else if (PyErr_Occurred())
        PyErr_Clear();
    }
    agg_.Enter(e.idx, CurrentFrame(), now, /*fresh_call=*/false, line);
    return Py_NewRef(Py_None);
  }

  // PY_RETURN / PY_YIELD / PY_UNWIND. Hot for the innermost recorded frame.
  [[gnu::noinline]] PyObject* LeaveEvent(PyObject* code, int64_t now,
                                         bool can_disable) noexcept {
    if (!OwnerThread()) return OtherThread(code, can_disable);
    FrameKey key = CurrentFrame();
    if (agg_.ExitTop(key, now)) return NoneRef();
    return LeaveOther(code, key, now, can_disable);
  }
  [[gnu::noinline, gnu::cold]] PyObject* LeaveOther(PyObject* code, FrameKey key, int64_t now,
                                         bool can_disable) noexcept {
    int32_t idx = Lookup(code).idx;
    if (idx == kExcluded) return can_disable ? Disable() : Py_NewRef(Py_None);
    if (idx >= 0) agg_.Exit(key, now);  // repairs missed exits; unknown keys are ignored
    return Py_NewRef(Py_None);
  }

  void StartMonitoring() {
    nb::module_ sys = nb::module_::import_("sys");
    monitoring_ = sys.attr("monitoring");
    disable_ = monitoring_.attr("DISABLE");
    tool_id_ = -1;
    int free_id = -1;
    // The unassigned ids first: cProfile (3.12+) needs the profiler's id 2 and refuses to
    // start when it is taken, so a program that uses cProfile keeps working; the debugger
    // (0) and coverage (1) ids last.
    for (int id : {3, 4, 2, 5, 1, 0}) {
      if (monitoring_.attr("get_tool")(id).is_none()) {
        free_id = id;
        break;
      }
    }
    if (free_id < 0)
      throw std::runtime_error(
          "all sys.monitoring tool ids are in use by other tools; stop one of them first");
    monitoring_.attr("use_tool_id")(free_id, "linescope");
    tool_id_ = free_id;  // ours from here on (released by StopMonitoring)
    static PyMethodDef defs[] = {
        {"linescope_py_start", Fast<&OnStart>(), METH_FASTCALL, nullptr},
        {"linescope_py_resume", Fast<&OnResume>(), METH_FASTCALL, nullptr},
        {"linescope_py_throw", Fast<&OnThrow>(), METH_FASTCALL, nullptr},
        {"linescope_py_return", Fast<&OnLeave>(), METH_FASTCALL, nullptr},
        {"linescope_py_yield", Fast<&OnLeave>(), METH_FASTCALL, nullptr},
        {"linescope_py_unwind", Fast<&OnUnwind>(), METH_FASTCALL, nullptr},
        {"linescope_line", Fast<&OnLine>(), METH_FASTCALL, nullptr},
        {"linescope_jump", Fast<&OnJump>(), METH_FASTCALL, nullptr},
    };
    nb::object events = monitoring_.attr("events");
    long mask = 0;
    for (size_t i = 0; i < kEventCount; ++i) {
      nb::object bit = events.attr(kEventNames[i]);
      mask |= nb::cast<long>(bit);
      nb::object fn = nb::steal(PyCFunction_New(&defs[i], nullptr));
      if (!fn.is_valid()) throw nb::python_error();
      monitoring_.attr("register_callback")(tool_id_, bit, fn);
    }
    // Locations disabled by an earlier session (other filters, or PY_START of recorded
    // functions) must report again.
    monitoring_.attr("restart_events")();
    monitoring_.attr("set_events")(tool_id_, mask);
  }

  void StopMonitoring() {
    try {
      monitoring_.attr("set_events")(tool_id_, 0);
      nb::object events = monitoring_.attr("events");
      for (const char* name : kEventNames)
        monitoring_.attr("register_callback")(tool_id_, events.attr(name), nb::none());
      monitoring_.attr("free_tool_id")(tool_id_);
    } catch (const std::exception& e) {
      warnings_.push_back(std::string("could not release the sys.monitoring tool id: ") +
                          e.what());
    }
  }

  static constexpr size_t kEventCount = 8;
  static constexpr const char* kEventNames[kEventCount] = {
      "PY_START", "PY_RESUME", "PY_THROW", "PY_RETURN", "PY_YIELD", "PY_UNWIND", "LINE", "JUMP"};
#else
  // ---- 3.11: C trace function ----
  // `frame.f_trace_lines = False` through the public attribute protocol (no reliance on the
  // frame struct's layout); the name is interned once.
  static void DisableLineEvents(PyFrameObject* frame) noexcept {
    static PyObject* name = PyUnicode_InternFromString("f_trace_lines");
    if (name == nullptr ||
        PyObject_SetAttr(reinterpret_cast<PyObject*>(frame), name, Py_False) < 0) {
      PyErr_Clear();
    }
  }
  // What sys.gettrace() returns during a session: a callable, so that code that saves and
  // restores the trace function (doctest, pdb, coverage-like tools:
  // `saved = sys.gettrace(); ...; sys.settrace(saved)`) puts the session back instead of
  // ending it. Restored that way it is called as a Python trace function (through CPython's
  // trampoline): it re-installs the C trace function and handles that event. Recorded frames
  // carry it as their local trace function (f_trace, when no chained tracer owns it), so the
  // first line event after such a restore already reaches it. After the session it does
  // nothing and removes itself.
  static PyObject* TraceObject() noexcept {
    static PyMethodDef def = {"linescope_trace", reinterpret_cast<PyCFunction>(
                                                     reinterpret_cast<void (*)()>(&TraceCall)),
                              METH_FASTCALL, nullptr};
    static PyObject* obj = PyCFunction_New(&def, nullptr);  // process lifetime
    return obj;
  }
  static PyObject* TraceCall(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 3 || !PyFrame_Check(args[0]) || !PyUnicode_Check(args[1])) {
      PyErr_SetString(PyExc_TypeError, "linescope_trace(frame, event, arg)");
      return nullptr;
    }
    PyThreadState* tstate = PyThreadState_Get();
    LineTracer* self = g_active;
    if (self == nullptr || self->owner_ != tstate) {
      if (tstate->c_traceobj == TraceObject()) PyEval_SetTrace(nullptr, nullptr);
      Py_RETURN_NONE;
    }
    // Called as a frame's local trace function while another tool's trace function is
    // installed (it replaced the session's): that tool's, nothing to do here — but an event
    // of a recorded frame went to it, not to the session.
    if (tstate->c_traceobj != TraceObject()) {
      self->missed_while_replaced_ = true;
      Py_RETURN_NONE;
    }
    int what = -1;
    if (PyUnicode_CompareWithASCIIString(args[1], "call") == 0) what = PyTrace_CALL;
    else if (PyUnicode_CompareWithASCIIString(args[1], "line") == 0) what = PyTrace_LINE;
    else if (PyUnicode_CompareWithASCIIString(args[1], "return") == 0) what = PyTrace_RETURN;
    else if (PyUnicode_CompareWithASCIIString(args[1], "exception") == 0) what = PyTrace_EXCEPTION;
    else if (PyUnicode_CompareWithASCIIString(args[1], "opcode") == 0) what = PyTrace_OPCODE;
    // Reached through CPython's trampoline with the session's object installed: the session's
    // tracer was put back through sys.settrace(saved). Lines were lost if another tool's
    // tracer got a recorded frame's events meanwhile, or if no tracer ran for a while
    // (sys.settrace(None) around some work): nothing reached the session for over
    // kRestoreGapNs. A plain `sys.settrace(sys.gettrace())` loses nothing and says nothing.
    if (tstate->c_tracefunc != &LineTracer::TraceFunc &&
        (self->missed_while_replaced_ ||
         clock::NowNs() - self->last_event_ns_ > kRestoreGapNs)) {
      self->restored_after_replace_ = true;
    }
    self->missed_while_replaced_ = false;
    PyEval_SetTrace(&LineTracer::TraceFunc, TraceObject());
    if (what >= 0 &&
        TraceFunc(TraceObject(), reinterpret_cast<PyFrameObject*>(args[0]), what, args[2]) != 0)
      return nullptr;
    Py_RETURN_NONE;
  }

  // Whether the session's trace function is what `ts` runs: installed directly, or put back
  // through sys.settrace (CPython's trampoline calling TraceObject()).
  static bool InstalledOn(PyThreadState* ts) noexcept {
    return ts->c_tracefunc == &LineTracer::TraceFunc || ts->c_traceobj == TraceObject();
  }

  static int TraceFunc(PyObject*, PyFrameObject* frame, int what, PyObject* arg) {
    LineTracer* self = g_active;
    if (self == nullptr) return 0;
    if (self->prev_func_ != nullptr) {
      if (self->prev_func_(self->prev_obj_, frame, what, arg) != 0) return -1;
    }
    return self->OnTrace(frame, what);
  }

  // The frame-evaluation hook's question: does this code run untraced? From the code cache;
  // on a miss the code is registered (decided) when that may call into Python.
  static bool SkipCode(PyObject* code, bool may_register) noexcept {
    LineTracer* self = g_active;
    if (self == nullptr) return false;
    CodeEntry& e = self->code_cache_[CacheSlot(code)];
    if (e.code == code) return e.idx == kExcluded;
    return may_register && self->Fill(e, code).idx == kExcluded;
  }

  // The first call into unrecorded code: from now on such frames start untraced. Armed
  // lazily, because with a frame-evaluation function installed CPython makes every Python
  // call a C-level call (no inlined calls), which costs call-heavy recorded code a little;
  // a program that never calls out of the root does not pay that.
  [[gnu::noinline, gnu::cold]] void ArmEvalHook() noexcept {
    eval_hook_pending_ = false;
    ArmUntracedEval(&LineTracer::TraceFunc, trace_obj_, &SkipCode);
  }

  int32_t CodeOf(PyFrameObject* frame) noexcept {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    int32_t idx = Lookup(reinterpret_cast<PyObject*>(code)).idx;
    Py_DECREF(code);  // the frame (and the code cache) keep it alive
    return idx;
  }

  // The frame object is the frame key: trace functions run only for frames that have one.
  int OnTrace(PyFrameObject* frame, int what) noexcept {
    auto key = reinterpret_cast<FrameKey>(frame);
    switch (what) {
      case PyTrace_LINE: {
        int64_t now = clock::NowNs();
        last_event_ns_ = now;
        int32_t line = PyFrame_GetLineNumber(frame);
        if (agg_.Line(key, line, now)) return 0;
        int32_t idx = CodeOf(frame);
        if (idx == kExcluded) {
          // A frame that began before the session: no more line events from it.
          if (prev_func_ == nullptr) DisableLineEvents(frame);
          return 0;
        }
        if (idx < 0) return 0;
        // Frames running at start() are open already: a recorded frame that is not open is
        // one whose exit was missed and that runs on (repaired as a continuation).
        agg_.EnterAtLine(idx, key, now, /*fresh_call=*/false, line);
        return 0;
      }
      case PyTrace_CALL: {
        int64_t now = clock::NowNs();
        last_event_ns_ = now;
        int32_t idx = CodeOf(frame);
        if (idx == kExcluded) {
          // No line events for this frame; its time stays on the calling recorded line.
          if (prev_func_ == nullptr) DisableLineEvents(frame);
          if (eval_hook_pending_) [[unlikely]]
            ArmEvalHook();
          return 0;
        }
        if (idx < 0) return 0;
        const CodeInfo& info = infos_[static_cast<size_t>(idx)];
        bool fresh = true;
        int32_t line = 0;
        if (info.generator_like) {
          fresh = PyFrame_GetLasti(frame) == info.first_resume;
          if (!fresh) line = PyFrame_GetLineNumber(frame);
        }
        if (prev_func_ == nullptr) {
          // A generator suspended under an earlier session with other filters may have its
          // line events off; f_trace: see TraceObject.
          if (!fresh) EnableLineEvents(frame);
          SetLocalTraceIfUnset(frame, trace_obj_);
        }
        agg_.Enter(idx, key, now, fresh, line);
        return 0;
      }
      case PyTrace_RETURN: {
        // A return or a yield: the aggregator closes the slice the same way.
        int64_t now = clock::NowNs();
        if (agg_.ExitTop(key, now)) return 0;
        if (CodeOf(frame) >= 0) agg_.Exit(key, now);
        return 0;
      }
      default:
        return 0;
    }
  }

  Py_tracefunc prev_func_ = nullptr;
  PyObject* prev_obj_ = nullptr;
  PyObject* trace_obj_ = nullptr;  // TraceObject(), read once at start (the call path uses it)
  bool eval_hook_pending_ = false;  // no chained tracer, and the hook is not armed yet
#endif

  lines::PathFilter filter_;
  std::string cwd_;
  lines::LineAggregator agg_;
  std::vector<CodeInfo> infos_;
  std::unordered_map<std::string, bool> decided_;
  std::set<std::string> undecodable_;  // raw names of recorded-looking files not UTF-8
  std::string undecodable_example_;
  std::vector<std::string> warnings_;
  // 3.11, see TraceCall: whether lines were lost while another tracer (or none) ran.
  bool restored_after_replace_ = false;
  bool missed_while_replaced_ = false;
  int64_t last_event_ns_ = 0;  // the last line event the session handled
  static constexpr int64_t kRestoreGapNs = 1'000'000;
  State state_ = kIdle;
  uint32_t generation_ = 0;
  PyThreadState* owner_ = nullptr;
  uint64_t owner_id_ = 0;
  int64_t start_ns_ = 0;
  int64_t stop_ns_ = 0;
  int64_t other_thread_events_ = 0;
  int tool_id_ = -1;
  std::atomic<uint64_t> current_line_{0};
  CodeEntry code_cache_[kCodeCacheSize];
#if GPUPROF_MONITORING
  nb::object monitoring_;
  nb::object disable_;
#endif
};

}  // namespace

void RegisterLineTracer(nb::module_& m) {
  nb::class_<LineTracer>(m, "LineTracer")
      .def(nb::init<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>,
                    std::string>(),
           nb::arg("roots"), nb::arg("include"), nb::arg("exclude"), nb::arg("cwd"))
      .def("start", &LineTracer::Start, nb::arg("adopt_running") = true)
      .def("stop", &LineTracer::Stop, nb::arg("as_of_ns") = 0)
      .def("detach_after_fork", &LineTracer::DetachAfterFork)
      .def("lines", &LineTracer::Lines)
      .def("functions", &LineTracer::Functions)
      .def("recorded", &LineTracer::Recorded, nb::arg("path"))
      .def("memory_line_source", &LineTracer::MemoryLineSource)
      .def("resolve_line_keys", &LineTracer::ResolveLineKeys, nb::arg("keys"))
      .def_prop_ro("elapsed_ns", &LineTracer::elapsed_ns)
      .def_prop_ro("mismatches", &LineTracer::mismatches)
      .def_prop_ro("other_thread_events", &LineTracer::other_thread_events)
      .def_prop_ro("warnings", &LineTracer::warnings)
      .def_prop_ro("tool_id", &LineTracer::tool_id)
      .def_prop_ro("running", &LineTracer::running)
      .def_prop_ro_static("mode", [](nb::handle) { return std::string(LineTracer::Mode()); })
      // 3.11 (eval_hook.h): frames started untraced in the last session, and why the hook
      // stood aside (None: it did not); (0, None) on 3.12+.
      .def_static("_untraced_eval_stats", []() {
        const char* aside = UntracedEvalAside();
        return std::make_tuple(UntracedEvalCount(),
                               aside ? nb::object(nb::str(aside)) : nb::none());
      });
}

}  // namespace gpuprof::python
