// The line tracer on Python 3.11: a C trace function installed with PyEval_SetTrace on the
// owner thread (chaining a tracer already there), the session hooks that install and restore
// it, and the frame-evaluation hook's question (line_tracer_internal.h). Compiled empty on
// 3.12+.
#include "line_tracer_internal.h"

#if !GPUPROF_MONITORING

#include "clock/clock.h"
#include "eval_hook.h"
#include "frame_peek.h"

namespace gpuprof::python::line_tracing {
namespace {

// `frame.f_trace_lines = False` through the public attribute protocol (no reliance on the
// frame struct's layout); the name is interned once.
void DisableLineEvents(PyFrameObject* frame) noexcept {
  static PyObject* name = PyUnicode_InternFromString("f_trace_lines");
  if (name == nullptr || PyObject_SetAttr(reinterpret_cast<PyObject*>(frame), name, Py_False) < 0) {
    PyErr_Clear();
  }
}

}  // namespace

// ---- session hooks ---------------------------------------------------------------------------

void LineTracer::StartMode(bool adopt_running) {
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
}

void LineTracer::StopMode(bool owner_gone) {
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
}

void LineTracer::DetachMode() noexcept {
  DisarmUntracedEval();
  PyThreadState* ts = PyThreadState_Get();
  if (ts == owner_ && InstalledOn(ts)) {
    if (_PyEval_SetTrace(ts, prev_func_, prev_obj_) < 0) PyErr_Clear();
  }
  Py_CLEAR(prev_obj_);
}

LineTracer::FrameKey LineTracer::AdoptFrame(PyFrameObject* f) {
  // An earlier session with other filters may have turned its line events off.
  if (prev_func_ == nullptr) {
    EnableLineEvents(f);
    SetLocalTraceIfUnset(f, trace_obj_);
  }
  return reinterpret_cast<FrameKey>(f);
}

// Fresh call vs resume of a generator or coroutine: the byte offset of its first RESUME 0.
void LineTracer::DecideCode(PyCodeObject* code, CodeInfo& info) noexcept {
  if (!info.generator_like) return;
  PyObject* bytes = PyCode_GetCode(code);
  if (bytes == nullptr) {
    PyErr_Clear();
    return;
  }
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
}

// ---- the trace function ----------------------------------------------------------------------

// What sys.gettrace() returns during a session: a callable, so that code that saves and
// restores the trace function (doctest, pdb, coverage-like tools:
// `saved = sys.gettrace(); ...; sys.settrace(saved)`) puts the session back instead of
// ending it. Restored that way it is called as a Python trace function (through CPython's
// trampoline): it re-installs the C trace function and handles that event. Recorded frames
// carry it as their local trace function (f_trace, when no chained tracer owns it), so the
// first line event after such a restore already reaches it. After the session it does
// nothing and removes itself.
PyObject* LineTracer::TraceObject() noexcept {
  static PyMethodDef def = {"linescope_trace",
                            reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&TraceCall)),
                            METH_FASTCALL, nullptr};
  static PyObject* obj = PyCFunction_New(&def, nullptr);  // process lifetime
  return obj;
}

PyObject* LineTracer::TraceCall(PyObject*, PyObject* const* args, Py_ssize_t n) {
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
  if (PyUnicode_CompareWithASCIIString(args[1], "call") == 0)
    what = PyTrace_CALL;
  else if (PyUnicode_CompareWithASCIIString(args[1], "line") == 0)
    what = PyTrace_LINE;
  else if (PyUnicode_CompareWithASCIIString(args[1], "return") == 0)
    what = PyTrace_RETURN;
  else if (PyUnicode_CompareWithASCIIString(args[1], "exception") == 0)
    what = PyTrace_EXCEPTION;
  else if (PyUnicode_CompareWithASCIIString(args[1], "opcode") == 0)
    what = PyTrace_OPCODE;
  // Reached through CPython's trampoline with the session's object installed: the session's
  // tracer was put back through sys.settrace(saved). Lines were lost if another tool's
  // tracer got a recorded frame's events meanwhile, or if no tracer ran for a while
  // (sys.settrace(None) around some work): nothing reached the session for over
  // kRestoreGapNs. A plain `sys.settrace(sys.gettrace())` loses nothing and says nothing.
  if (tstate->c_tracefunc != &LineTracer::TraceFunc &&
      (self->missed_while_replaced_ || clock::NowNs() - self->last_event_ns_ > kRestoreGapNs)) {
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
bool LineTracer::InstalledOn(PyThreadState* ts) noexcept {
  return ts->c_tracefunc == &LineTracer::TraceFunc || ts->c_traceobj == TraceObject();
}

int LineTracer::TraceFunc(PyObject*, PyFrameObject* frame, int what, PyObject* arg) {
  LineTracer* self = g_active;
  if (self == nullptr) return 0;
  if (self->prev_func_ != nullptr) {
    if (self->prev_func_(self->prev_obj_, frame, what, arg) != 0) return -1;
  }
  return self->OnTrace(frame, what);
}

// The frame-evaluation hook's question: does this code run untraced? From the code cache;
// on a miss the code is registered (decided) when that may call into Python.
bool LineTracer::SkipCode(PyObject* code, bool may_register) noexcept {
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
void LineTracer::ArmEvalHook() noexcept {
  eval_hook_pending_ = false;
  ArmUntracedEval(&LineTracer::TraceFunc, trace_obj_, &SkipCode);
}

int32_t LineTracer::CodeOf(PyFrameObject* frame) noexcept {
  PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
  int32_t idx = Lookup(reinterpret_cast<PyObject*>(code)).idx;
  Py_DECREF(code);  // the frame (and the code cache) keep it alive
  return idx;
}

// The frame object is the frame key: trace functions run only for frames that have one.
int LineTracer::OnTrace(PyFrameObject* frame, int what) noexcept {
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

}  // namespace gpuprof::python::line_tracing

#endif  // !GPUPROF_MONITORING
