// The native line tracer behind linescope's `trace` backend: the class the three parts share.
//   line_tracer.cc            the session (start, stop, fork), code-object registration and
//                             the per-code cache, frames running at start, the binding;
//   line_tracer_monitoring.cc 3.12+: sys.monitoring callbacks (compiled empty on 3.11);
//   line_tracer_settrace.cc   3.11: the C trace function (compiled empty on 3.12+).
// Each mode defines the same hooks (StartMode, StopMode, DetachMode, AdoptFrame, DecideCode)
// and its own callbacks. Internal to the extension: include only from those files.
//
// What is measured: the thread that calls start() (the "owner"); events of other threads are
// ignored. Only code objects whose file passes lines::PathFilter are recorded; everything
// else (stdlib, site-packages, C extensions, I/O) is not traced, so its time lands on the
// recorded line that called into it (inclusive line time, see lines/line_model.h).
//
// Frames are told apart by key (lines::FrameKey): the interpreter frame's address.
//
// 3.12+: sys.monitoring with a free tool id; LINE, JUMP, PY_START, PY_RESUME, PY_THROW,
//   PY_RETURN, PY_YIELD and PY_UNWIND. Local events in unrecorded code return
//   sys.monitoring.DISABLE, so each such code location costs one callback in the whole session.
//   PY_START is also disabled for recorded code that is not a generator or coroutine: such a
//   call is seen at its first LINE event from a frame key that is not the innermost open frame,
//   which saves one callback per call. Generators and coroutines keep PY_START (a fresh start)
//   and PY_RESUME / PY_THROW (a resume is not a call). On 3.13+ a function whose first
//   statement shares the line of its RESUME (a one-line `def f(x): return x`, a lambda)
//   keeps PY_START too: with PY_START disabled, 3.13 reports no LINE event for that first
//   line, so the call would go unseen. JUMP counts a backward jump to the same line as a
//   new hit of that line (a one-line loop, an inlined comprehension), as the 3.11 trace
//   function and line_profiler do; every other jump location (forward jumps, jumps to
//   another line, which LINE reports) is disabled at its first event. The hot callbacks (LINE,
//   PY_RETURN of the innermost frame) read the clock, compare the thread and the frame key, and
//   touch one line cell; they do no per-event lookup of the code object.
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
#pragma once

#include <Python.h>
#include <frameobject.h>
#include <nanobind/nanobind.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "lines/line_model.h"

#if PY_VERSION_HEX >= 0x030C0000
#define GPUPROF_MONITORING 1
#else
#define GPUPROF_MONITORING 0
#endif

namespace gpuprof::python::line_tracing {

namespace nb = nanobind;

constexpr int32_t kExcluded = -1;
constexpr int32_t kFailed = -2;

// The code-object extra slot the tracer's decisions live in (one per process), and its access.
Py_ssize_t CodeExtraIndex();
int GetExtra(PyObject* code, Py_ssize_t index, void** out);
int SetExtra(PyObject* code, Py_ssize_t index, void* value);

class LineTracer;
// At most one tracing session per process (GIL-protected).
[[gnu::visibility("hidden")]] extern LineTracer* g_active;

// The OS thread that started the running session, as its thread pointer (see ThisThread), 0
// when none runs, kOwnerGone once that thread ended before stop(). Written by start / stop
// (GIL held) and by the exiting owner thread's thread-local destructor (no GIL), which runs
// before that thread's thread pointer can be reused by a new thread: a later thread is never
// taken for the owner, and the owner's freed thread state is never read.
constexpr uintptr_t kOwnerGone = 1;
[[gnu::visibility("hidden")]] extern std::atomic<uintptr_t> g_owner_thread;

// A thread pointer (unique per live OS thread) is one register read.
inline uintptr_t ThisThread() noexcept {
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

class LineTracer {
 public:
  LineTracer(std::vector<std::string> roots, std::vector<std::string> include,
             std::vector<std::string> exclude, std::string cwd);
  LineTracer(const LineTracer&) = delete;
  LineTracer& operator=(const LineTracer&) = delete;
  ~LineTracer();

  static const char* Mode() { return GPUPROF_MONITORING ? "sys.monitoring" : "settrace"; }

  // `adopt_running`: whether the recorded frames running now are measured from now on (see
  // AdoptRunningFrames); a launcher whose own frames are recorded (a notebook cell running
  // the cell magic) passes false.
  void Start(bool adopt_running);
  // `as_of_ns` (clock::NowNs time, 0: now): when the user asked to stop. The session's own
  // work between that moment and this call is then not part of the run; an event recorded
  // after it (none is expected) moves the end to that event.
  void Stop(int64_t as_of_ns);
  // In a child made by os.fork() during the session (the child does not own it): the hooks
  // go, so the child runs untraced and may start a session of its own; no result is made
  // here. What belongs to the parent's threads is not touched.
  void DetachAfterFork() noexcept;

  // (filename, line, wall_ns, self_ns, hits, calls)
  std::vector<std::tuple<std::string, int32_t, int64_t, int64_t, int64_t, int64_t>> Lines() const;
  // (filename, qualname, first_line, total_ns, own_ns, calls)
  std::vector<std::tuple<std::string, std::string, int32_t, int64_t, int64_t, int64_t>> Functions()
      const;
  bool Recorded(const std::string& path) const { return filter_.Recorded(path); }

  // memory=True beside this tracer: the address of the current-line word that the memory
  // sampler reads (lines::LineAggregator::PublishTo), valid while this tracer lives.
  uintptr_t MemoryLineSource() {
    agg_.PublishTo(&current_line_);
    return reinterpret_cast<uintptr_t>(&current_line_);
  }
  // Published keys -> (filename, line); unknown keys are skipped.
  std::vector<std::tuple<uint64_t, std::string, int32_t>> ResolveLineKeys(
      const std::vector<uint64_t>& keys) const;
  int64_t elapsed_ns() const;
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
    bool keep_start = false;          // 3.13+: PY_START stays enabled (see the header comment)
    int first_resume = -1;            // 3.11: byte offset of the first RESUME 0 (a fresh start)
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

  // ---- shared (line_tracer.cc) ----

  // Whether the owner's thread state is still one of the interpreter's (GIL held: the list
  // cannot change). Compared by address and by its unique id, so a new thread state at the
  // freed one's address is not taken for it.
  bool OwnerAlive() const noexcept;

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
  [[gnu::noinline, gnu::cold]] const CodeEntry& Fill(CodeEntry& e, PyObject* code) noexcept;
  void ClearCodeCache() noexcept;
  int32_t LookupExtra(PyObject* code) noexcept;

  // The last line a code object's instructions carry (from `co_lines()`, linear in the code
  // size), so that its line array does not have to grow while it runs (cold).
  static int32_t LastLine(PyCodeObject* code) noexcept;

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

  // Cold: a code object whose file name is not UTF-8 (a surrogate-escaped name from a
  // non-UTF-8 file system path) is not recorded; one that the filter would have recorded (its
  // raw bytes under the root) is counted, for a warning at stop().
  void NoteUndecodable(PyObject* name) noexcept;
  int32_t Register(PyObject* code_obj) noexcept;

  // The recorded frames running at start() (the caller of start() and the frames below it)
  // are open from `now` on, not counted as calls: each outer one on its current line (the
  // line waiting for the call that leads to start(); its time so far is before the session,
  // so it gets no hit), the innermost one without a line (its current line is the one
  // starting the session: its next line event names the first line measured).
  void AdoptRunningFrames(int64_t now);

  // ---- per mode (line_tracer_monitoring.cc / line_tracer_settrace.cc) ----

  // Installs the mode's hooks on the owner (AdoptRunningFrames first when asked); on failure
  // releases what it took, clears g_owner_thread and throws.
  void StartMode(bool adopt_running);
  // Removes the hooks at stop(); `owner_gone`: the owner's thread state no longer exists.
  void StopMode(bool owner_gone);
  // Removes the hooks in a forked child.
  void DetachMode() noexcept;
  // The key of a running recorded frame found at start(), made ready for the mode's events;
  // 0 when it has none.
  FrameKey AdoptFrame(PyFrameObject* f);
  // The mode's part of a newly registered code object's CodeInfo (cold).
  static void DecideCode(PyCodeObject* code, CodeInfo& info) noexcept;

  // The per-mode members below are defined in their mode's file only; those declared `inline`
  // (as they were when defined in the class) keep the compiler's inlining of the hot paths.
#if GPUPROF_MONITORING
  // ---- 3.12+: sys.monitoring (line_tracer_monitoring.cc) ----
  // The callbacks (METH_FASTCALL). The clock is read first: the fast paths make no other call.
  static PyObject* OnStart(PyObject*, PyObject* const* args, Py_ssize_t);
  static PyObject* OnResume(PyObject*, PyObject* const* args, Py_ssize_t n);
  static PyObject* OnThrow(PyObject*, PyObject* const* args, Py_ssize_t n);
  static PyObject* OnLeave(PyObject*, PyObject* const* args, Py_ssize_t);
  static PyObject* OnUnwind(PyObject*, PyObject* const* args, Py_ssize_t);
  static PyObject* OnLine(PyObject*, PyObject* const* args, Py_ssize_t);
  static PyObject* OnJump(PyObject*, PyObject* const* args, Py_ssize_t);

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
  // The hot callbacks' answer. None is immortal on 3.12+ (its reference count never
  // changes), so the new reference needs no increment.
  static PyObject* NoneRef() noexcept { return Py_None; }

  [[gnu::noinline, gnu::cold]] PyObject* OtherThread(PyObject* code, bool can_disable) noexcept;
  [[gnu::noinline]] PyObject* LineEvent(PyObject* code, PyObject* line_obj, int64_t now) noexcept;
  [[gnu::noinline, gnu::cold]] PyObject* LineEventSlow(PyObject* code, PyObject* line_obj,
                                                       int64_t now) noexcept;
  [[gnu::noinline]] PyObject* NewFrameLine(PyObject* code, FrameKey key, int32_t line,
                                           int64_t now) noexcept;
  [[gnu::noinline]] PyObject* NewFrameLineSlow(PyObject* code, FrameKey key, int32_t line,
                                               int64_t now) noexcept;
  inline PyObject* JumpEvent(PyObject* code, PyObject* from_obj, PyObject* to_obj,
                             int64_t now) noexcept;
  inline bool SameLineJump(int32_t idx, PyObject* code, int32_t from, int32_t to) noexcept;
  // The line of every code unit (from `co_lines()`; -1 where none), for the JUMP callback's
  // same-line test (cold: once per code object that jumps backward).
  static std::vector<int32_t> UnitLines(PyObject* code) noexcept;
  inline PyObject* StartEvent(PyObject* code, int64_t now) noexcept;
  inline PyObject* ResumeEvent(PyObject* const* args, Py_ssize_t n, int64_t now,
                               bool can_disable) noexcept;
  [[gnu::noinline]] PyObject* LeaveEvent(PyObject* code, int64_t now, bool can_disable) noexcept;
  [[gnu::noinline, gnu::cold]] PyObject* LeaveOther(PyObject* code, FrameKey key, int64_t now,
                                                    bool can_disable) noexcept;
  void StartMonitoring();
  void StopMonitoring();

  static constexpr size_t kEventCount = 8;
  static constexpr const char* kEventNames[kEventCount] = {
      "PY_START", "PY_RESUME", "PY_THROW", "PY_RETURN", "PY_YIELD", "PY_UNWIND", "LINE", "JUMP"};
#else
  // ---- 3.11: C trace function (line_tracer_settrace.cc) ----
  static PyObject* TraceObject() noexcept;
  static inline PyObject* TraceCall(PyObject*, PyObject* const* args, Py_ssize_t n);
  // Whether the session's trace function is what `ts` runs: installed directly, or put back
  // through sys.settrace (CPython's trampoline calling TraceObject()).
  static inline bool InstalledOn(PyThreadState* ts) noexcept;
  static inline int TraceFunc(PyObject*, PyFrameObject* frame, int what, PyObject* arg);
  static inline bool SkipCode(PyObject* code, bool may_register) noexcept;
  [[gnu::noinline, gnu::cold]] void ArmEvalHook() noexcept;
  inline int32_t CodeOf(PyFrameObject* frame) noexcept;
  inline int OnTrace(PyFrameObject* frame, int what) noexcept;

  Py_tracefunc prev_func_ = nullptr;
  PyObject* prev_obj_ = nullptr;
  PyObject* trace_obj_ = nullptr;   // TraceObject(), read once at start (the call path uses it)
  bool eval_hook_pending_ = false;  // no chained tracer, and the hook is not armed yet
  // See TraceCall: whether lines were lost while another tracer (or none) ran.
  bool restored_after_replace_ = false;
  bool missed_while_replaced_ = false;
  static constexpr int64_t kRestoreGapNs = 1'000'000;
#endif

  lines::PathFilter filter_;
  std::string cwd_;
  lines::LineAggregator agg_;
  std::vector<CodeInfo> infos_;
  std::unordered_map<std::string, bool> decided_;
  std::set<std::string> undecodable_;  // raw names of recorded-looking files not UTF-8
  std::string undecodable_example_;
  std::vector<std::string> warnings_;
  int64_t last_event_ns_ = 0;  // 3.11: the last line event the session handled
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

}  // namespace gpuprof::python::line_tracing
