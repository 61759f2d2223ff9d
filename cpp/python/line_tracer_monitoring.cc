// The line tracer on Python 3.12+: the sys.monitoring (PEP 669) callbacks, and the session
// hooks that claim and release a tool id (line_tracer_internal.h). Compiled empty on 3.11.
#include "line_tracer_internal.h"

#if GPUPROF_MONITORING

#include <opcode.h>  // RESUME, CACHE

#include <string>
#include <vector>

#include "clock/clock.h"
#include "frame_peek.h"

namespace gpuprof::python::line_tracing {
namespace {

// METH_FASTCALL functions travel in PyMethodDef as PyCFunction.
template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t)>
PyCFunction Fast() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

// Line numbers and byte offsets arrive as Python ints; small ones (all in practice) are read
// without a call.
[[gnu::noinline, gnu::cold]] int32_t BigLineNumber(PyObject* line) noexcept {
  long v = PyLong_AsLong(line);
  if (v == -1 && PyErr_Occurred()) PyErr_Clear();
  return static_cast<int32_t>(v);
}
bool SmallInt(PyObject* v) noexcept {
  return PyUnstable_Long_IsCompact(reinterpret_cast<PyLongObject*>(v));
}
int32_t LineNumber(PyObject* line) noexcept {
  auto* l = reinterpret_cast<PyLongObject*>(line);
  if (PyUnstable_Long_IsCompact(l)) return static_cast<int32_t>(PyUnstable_Long_CompactValue(l));
  return BigLineNumber(line);
}

#if PY_VERSION_HEX >= 0x030D0000
// Whether the first instruction after the code's first RESUME lies on RESUME's line
// (cold, once per code object).
bool FirstLineSharesResume(PyCodeObject* code) noexcept {
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

}  // namespace

// ---- session hooks ---------------------------------------------------------------------------

void LineTracer::StartMode(bool adopt_running) {
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
}

void LineTracer::StopMode(bool) { StopMonitoring(); }

void LineTracer::DetachMode() noexcept { StopMonitoring(); }

LineTracer::FrameKey LineTracer::AdoptFrame(PyFrameObject* f) {
  return reinterpret_cast<FrameKey>(InterpreterFrameOf(f));
}

void LineTracer::DecideCode(PyCodeObject* code, CodeInfo& info) noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  if (!info.generator_like) info.keep_start = FirstLineSharesResume(code);
#else
  (void)code;
  (void)info;
#endif
}

// The line of every code unit (from `co_lines()`; -1 where none), for the JUMP callback's
// same-line test (cold: once per code object that jumps backward).
std::vector<int32_t> LineTracer::UnitLines(PyObject* code) noexcept {
  std::vector<int32_t> out;
  VisitCoLines(code, [&](long start, long end, long line) {
    if (start < 0 || end <= start) return true;
    auto hi = static_cast<size_t>(end / 2);
    try {
      if (out.size() < hi) out.resize(hi, -1);
    } catch (...) {
      return false;  // out of memory: the lines read so far
    }
    for (auto u = static_cast<size_t>(start / 2); u < hi; ++u) out[u] = static_cast<int32_t>(line);
    return true;
  });
  return out;
}

// ---- callbacks -------------------------------------------------------------------------------
// The clock is read first: the callbacks' fast paths then make no other call.
PyObject* LineTracer::OnStart(PyObject*, PyObject* const* args, Py_ssize_t) {
  int64_t now = clock::NowNs();
  return g_active ? g_active->StartEvent(args[0], now) : Py_NewRef(Py_None);
}
PyObject* LineTracer::OnResume(PyObject*, PyObject* const* args, Py_ssize_t n) {
  int64_t now = clock::NowNs();
  return g_active ? g_active->ResumeEvent(args, n, now, /*can_disable=*/true) : Py_NewRef(Py_None);
}
PyObject* LineTracer::OnThrow(PyObject*, PyObject* const* args, Py_ssize_t n) {
  int64_t now = clock::NowNs();
  if (g_active) Py_XDECREF(g_active->ResumeEvent(args, n, now, /*can_disable=*/false));
  return Py_NewRef(Py_None);  // PY_THROW cannot be disabled
}
PyObject* LineTracer::OnLeave(PyObject*, PyObject* const* args, Py_ssize_t) {
  int64_t now = clock::NowNs();
  return g_active ? g_active->LeaveEvent(args[0], now, /*can_disable=*/true) : Py_NewRef(Py_None);
}
PyObject* LineTracer::OnUnwind(PyObject*, PyObject* const* args, Py_ssize_t) {
  int64_t now = clock::NowNs();
  if (g_active) Py_XDECREF(g_active->LeaveEvent(args[0], now, /*can_disable=*/false));
  return Py_NewRef(Py_None);  // PY_UNWIND cannot be disabled
}
PyObject* LineTracer::OnLine(PyObject*, PyObject* const* args, Py_ssize_t) {
  int64_t now = clock::NowNs();
  return g_active ? g_active->LineEvent(args[0], args[1], now) : Py_NewRef(Py_None);
}
PyObject* LineTracer::OnJump(PyObject*, PyObject* const* args, Py_ssize_t) {
  int64_t now = clock::NowNs();
  return g_active ? g_active->JumpEvent(args[0], args[1], args[2], now) : Py_NewRef(Py_None);
}

// An event of a non-owner thread: unrecorded code is disabled for every thread.
PyObject* LineTracer::OtherThread(PyObject* code, bool can_disable) noexcept {
  ++other_thread_events_;
  if (can_disable && Lookup(code).idx == kExcluded) return Disable();
  return Py_NewRef(Py_None);
}

// Hot: a new line. The innermost recorded frame is the common case. Not inlined into the
// callback, and every call on its way is a tail call or followed by nothing live, so that
// the fast path needs no callee-saved registers.
PyObject* LineTracer::LineEvent(PyObject* code, PyObject* line_obj, int64_t now) noexcept {
  if (!OwnerThread()) return OtherThread(code, true);
  if (!SmallInt(line_obj)) [[unlikely]]
    return LineEventSlow(code, line_obj, now);
  FrameKey key = CurrentFrame();
  auto line =
      static_cast<int32_t>(PyUnstable_Long_CompactValue(reinterpret_cast<PyLongObject*>(line_obj)));
  if (agg_.Line(key, line, now)) return NoneRef();
  return NewFrameLine(code, key, line, now);
}
PyObject* LineTracer::LineEventSlow(PyObject* code, PyObject* line_obj, int64_t now) noexcept {
  FrameKey key = CurrentFrame();
  int32_t line = BigLineNumber(line_obj);
  if (agg_.Line(key, line, now)) return NoneRef();
  return NewFrameLine(code, key, line, now);
}

// A line from a frame that is not the innermost open one: unrecorded code, or a call
// whose PY_START is disabled, or a frame that was running when the session started.
// Hot for the first line of a fresh call of a cached, recorded plain function; the rest
// is NewFrameLineSlow.
PyObject* LineTracer::NewFrameLine(PyObject* code, FrameKey key, int32_t line,
                                   int64_t now) noexcept {
  const CodeEntry& e = code_cache_[CacheSlot(code)];
  if (e.code == code && e.idx >= 0 && !e.generator_like && line > 0 &&
      agg_.TryEnterFreshAtLine(e.idx, key, now, line))
    return NoneRef();
  return NewFrameLineSlow(code, key, line, now);
}
PyObject* LineTracer::NewFrameLineSlow(PyObject* code, FrameKey key, int32_t line,
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
PyObject* LineTracer::JumpEvent(PyObject* code, PyObject* from_obj, PyObject* to_obj,
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
bool LineTracer::SameLineJump(int32_t idx, PyObject* code, int32_t from, int32_t to) noexcept {
  std::vector<int32_t>& lines = infos_[static_cast<size_t>(idx)].unit_lines;
  if (lines.empty()) lines = UnitLines(code);
  auto f = static_cast<size_t>(from / 2);
  auto t = static_cast<size_t>(to / 2);
  return from >= 0 && to >= 0 && f < lines.size() && t < lines.size() && lines[f] > 0 &&
         lines[f] == lines[t];
}

// PY_START: generators and coroutines keep it (a fresh start, not a resume); so do, on
// 3.13+, functions whose first line would report no LINE event without it.
PyObject* LineTracer::StartEvent(PyObject* code, int64_t now) noexcept {
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
PyObject* LineTracer::ResumeEvent(PyObject* const* args, Py_ssize_t n, int64_t now,
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
PyObject* LineTracer::LeaveEvent(PyObject* code, int64_t now, bool can_disable) noexcept {
  if (!OwnerThread()) return OtherThread(code, can_disable);
  FrameKey key = CurrentFrame();
  if (agg_.ExitTop(key, now)) return NoneRef();
  return LeaveOther(code, key, now, can_disable);
}
PyObject* LineTracer::LeaveOther(PyObject* code, FrameKey key, int64_t now,
                                 bool can_disable) noexcept {
  int32_t idx = Lookup(code).idx;
  if (idx == kExcluded) return can_disable ? Disable() : Py_NewRef(Py_None);
  if (idx >= 0) agg_.Exit(key, now);  // repairs missed exits; unknown keys are ignored
  return Py_NewRef(Py_None);
}

void LineTracer::StartMonitoring() {
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

void LineTracer::StopMonitoring() {
  try {
    monitoring_.attr("set_events")(tool_id_, 0);
    nb::object events = monitoring_.attr("events");
    for (const char* name : kEventNames)
      monitoring_.attr("register_callback")(tool_id_, events.attr(name), nb::none());
    monitoring_.attr("free_tool_id")(tool_id_);
  } catch (const std::exception& e) {
    warnings_.push_back(std::string("could not release the sys.monitoring tool id: ") + e.what());
  }
}

}  // namespace gpuprof::python::line_tracing

#endif  // GPUPROF_MONITORING
