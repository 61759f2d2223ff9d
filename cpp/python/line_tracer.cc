// The native line tracer behind linescope's `trace` backend.
//
// What is measured: the thread that calls start() (the "owner"); events of other threads are
// ignored. Only code objects whose file passes lines::PathFilter are recorded; everything
// else (stdlib, site-packages, C extensions, I/O) is not traced, so its time lands on the
// recorded line that called into it (inclusive line time, see lines/line_model.h).
//
// 3.12+: sys.monitoring with a free tool id; LINE, PY_START, PY_RESUME, PY_THROW, PY_RETURN,
//   PY_YIELD and PY_UNWIND. Local events in unrecorded code return sys.monitoring.DISABLE,
//   so each such code location costs one callback in the whole session.
// 3.11: a C trace function installed with PyEval_SetTrace on the owner thread. A tracer that
//   was already installed (a debugger, coverage) is chained: it sees every event first.
//   Without a chained tracer, unrecorded frames get f_trace_lines = False (no line events).
//
// Per-code decisions are cached in the code object's co_extra slot (one index per process),
// tagged with a session generation so a later session with other filters decides afresh.
#include "line_tracer.h"

#include <Python.h>
#include <frameobject.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
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

class LineTracer;
LineTracer* g_active = nullptr;  // at most one tracing session per process (GIL-protected)
uint32_t g_generation = 0;

class LineTracer {
 public:
  LineTracer(std::vector<std::string> roots, std::vector<std::string> include,
             std::vector<std::string> exclude, std::string cwd)
      : filter_(std::move(roots), std::move(include), std::move(exclude), cwd), cwd_(cwd) {}
  LineTracer(const LineTracer&) = delete;
  LineTracer& operator=(const LineTracer&) = delete;
  ~LineTracer() {
    if (g_active == this) {
      // Collected while active: detach without raising.
      try {
        Stop();
      } catch (...) {
      }
    }
  }

  static const char* Mode() { return GPUPROF_MONITORING ? "sys.monitoring" : "settrace"; }

  void Start() {
    if (g_active != nullptr)
      throw std::runtime_error("another linescope trace session is already active");
    if (state_ != kIdle) throw std::runtime_error("this tracer was already started");
    if (CodeExtraIndex() < 0) throw std::runtime_error("no free code-object extra slot");
    generation_ = ++g_generation;
    owner_ = PyThreadState_Get();
    start_ns_ = clock::NowNs();
#if GPUPROF_MONITORING
    try {
      StartMonitoring();
    } catch (...) {
      if (tool_id_ >= 0) StopMonitoring();  // release a half-claimed tool id
      warnings_.clear();
      tool_id_ = -1;
      throw;
    }
#else
    prev_func_ = owner_->c_tracefunc;
    prev_obj_ = owner_->c_traceobj;
    Py_XINCREF(prev_obj_);
    g_active = this;
    PyEval_SetTrace(&LineTracer::TraceFunc, nullptr);
#endif
    g_active = this;
    state_ = kRunning;
  }

  void Stop() {
    if (state_ != kRunning) throw std::runtime_error("the tracer is not running");
    int64_t now = clock::NowNs();
#if GPUPROF_MONITORING
    StopMonitoring();
#else
    if (owner_->c_tracefunc == &LineTracer::TraceFunc) {
      if (_PyEval_SetTrace(owner_, prev_func_, prev_obj_) < 0) {
        PyErr_Clear();
        warnings_.push_back("could not restore the previous trace function");
      }
    } else {
      warnings_.push_back(
          "another tool replaced the trace function during the session (sys.settrace?); "
          "line events after that point were not recorded");
    }
    Py_CLEAR(prev_obj_);
#endif
    agg_.CloseAll(now);
    stop_ns_ = now;
    g_active = nullptr;
    state_ = kStopped;
  }

  // (filename, line, wall_ns, self_ns, hits)
  std::vector<std::tuple<std::string, int32_t, int64_t, int64_t, int64_t>> Lines() const {
    std::vector<std::tuple<std::string, int32_t, int64_t, int64_t, int64_t>> out;
    for (const auto& s : agg_.Lines())
      out.emplace_back(agg_.files()[static_cast<size_t>(s.file_id)], s.line, s.wall_time_ns,
                       s.self_time_ns, s.hits);
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
    int first_resume = -1;   // 3.11: byte offset of the first RESUME 0 (a fresh start)
    std::string bytecode;    // 3.11: co_code of generator-like codes (yield detection)
  };

  // Cold on first sight of a code object, then one co_extra read.
  int32_t Lookup(PyObject* code) noexcept {
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

  int32_t Register(PyObject* code_obj) noexcept {
    try {
      auto* code = reinterpret_cast<PyCodeObject*>(code_obj);
      std::string filename = Utf8(code->co_filename);
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
      std::string qualname = Utf8(code->co_qualname);
      int32_t first = code->co_firstlineno;
      int32_t idx = agg_.AddCode(file_id, qualname, first, first + 32);
      CodeInfo info;
      info.generator_like =
          (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)) != 0;
#if !GPUPROF_MONITORING
      if (info.generator_like) {
        PyObject* bytes = PyCode_GetCode(code);
        if (bytes != nullptr) {
          info.bytecode.assign(PyBytes_AS_STRING(bytes),
                               static_cast<size_t>(PyBytes_GET_SIZE(bytes)));
          Py_DECREF(bytes);
          constexpr unsigned char kResume = 151;
          for (size_t i = 0; i + 1 < info.bytecode.size(); i += 2) {
            if (static_cast<unsigned char>(info.bytecode[i]) == kResume &&
                info.bytecode[i + 1] == 0) {
              info.first_resume = static_cast<int>(i);
              break;
            }
          }
        } else {
          PyErr_Clear();
        }
      }
#endif
      infos_.push_back(std::move(info));
      return idx;
    } catch (...) {
      return kFailed;
    }
  }

#if GPUPROF_MONITORING
  // ---- 3.12+: sys.monitoring ----
  static PyObject* OnStart(PyObject*, PyObject* const* args, Py_ssize_t n) {
    return g_active ? g_active->Enter(args, n, /*fresh=*/true) : Py_NewRef(Py_None);
  }
  static PyObject* OnResume(PyObject*, PyObject* const* args, Py_ssize_t n) {
    return g_active ? g_active->Enter(args, n, /*fresh=*/false) : Py_NewRef(Py_None);
  }
  static PyObject* OnThrow(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (g_active) Py_XDECREF(g_active->Enter(args, n, /*fresh=*/false));
    return Py_NewRef(Py_None);  // PY_THROW cannot be disabled
  }
  static PyObject* OnReturn(PyObject*, PyObject* const* args, Py_ssize_t n) {
    return g_active ? g_active->Leave(args, n, /*finished=*/true, true) : Py_NewRef(Py_None);
  }
  static PyObject* OnYield(PyObject*, PyObject* const* args, Py_ssize_t n) {
    return g_active ? g_active->Leave(args, n, /*finished=*/false, true) : Py_NewRef(Py_None);
  }
  static PyObject* OnUnwind(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (g_active) Py_XDECREF(g_active->Leave(args, n, /*finished=*/true, false));
    return Py_NewRef(Py_None);  // PY_UNWIND cannot be disabled
  }
  static PyObject* OnLine(PyObject*, PyObject* const* args, Py_ssize_t n) {
    return g_active ? g_active->LineEvent(args, n) : Py_NewRef(Py_None);
  }

  // METH_FASTCALL functions travel in PyMethodDef as PyCFunction.
  template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t)>
  static PyCFunction Fast() {
    return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
  }

  PyObject* Disable() { return Py_NewRef(disable_.ptr()); }

  // sys.monitoring events are process-wide: only the owner thread's are recorded.
  bool OwnerThread() noexcept {
    if (PyThreadState_Get() == owner_) return true;
    ++other_thread_events_;
    return false;
  }

  PyObject* Enter(PyObject* const* args, Py_ssize_t n, bool fresh) noexcept {
    int64_t now = clock::NowNs();
    int32_t idx = Lookup(args[0]);
    if (idx == kExcluded) return Disable();  // excluded for every thread
    if (idx < 0 || !OwnerThread()) return Py_NewRef(Py_None);
    int32_t line = 0;
    if (!fresh && n > 1) {
      int offset = static_cast<int>(PyLong_AsLong(args[1]));
      if (offset >= 0) line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(args[0]), offset);
      PyErr_Clear();
    }
    agg_.Enter(idx, now, fresh, line);
    return Py_NewRef(Py_None);
  }

  PyObject* Leave(PyObject* const* args, Py_ssize_t, bool finished, bool can_disable) noexcept {
    int64_t now = clock::NowNs();
    int32_t idx = Lookup(args[0]);
    if (idx == kExcluded) return can_disable ? Disable() : Py_NewRef(Py_None);
    if (idx >= 0 && OwnerThread()) agg_.Exit(idx, now, finished);
    return Py_NewRef(Py_None);
  }

  PyObject* LineEvent(PyObject* const* args, Py_ssize_t) noexcept {
    int64_t now = clock::NowNs();
    int32_t idx = Lookup(args[0]);
    if (idx == kExcluded) return Disable();
    if (idx < 0 || !OwnerThread()) return Py_NewRef(Py_None);
    int line = static_cast<int>(PyLong_AsLong(args[1]));
    if (line > 0) agg_.Line(idx, line, now);
    PyErr_Clear();
    return Py_NewRef(Py_None);
  }

  void StartMonitoring() {
    nb::module_ sys = nb::module_::import_("sys");
    monitoring_ = sys.attr("monitoring");
    disable_ = monitoring_.attr("DISABLE");
    tool_id_ = -1;
    int free_id = -1;
    for (int id : {2, 0, 1, 3, 4, 5}) {
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
        {"linescope_py_return", Fast<&OnReturn>(), METH_FASTCALL, nullptr},
        {"linescope_py_yield", Fast<&OnYield>(), METH_FASTCALL, nullptr},
        {"linescope_py_unwind", Fast<&OnUnwind>(), METH_FASTCALL, nullptr},
        {"linescope_line", Fast<&OnLine>(), METH_FASTCALL, nullptr},
    };
    const char* names[] = {"PY_START",  "PY_RESUME", "PY_THROW", "PY_RETURN",
                           "PY_YIELD",  "PY_UNWIND", "LINE"};
    nb::object events = monitoring_.attr("events");
    long mask = 0;
    for (size_t i = 0; i < 7; ++i) {
      nb::object bit = events.attr(names[i]);
      mask |= nb::cast<long>(bit);
      nb::object fn = nb::steal(PyCFunction_New(&defs[i], nullptr));
      if (!fn.is_valid()) throw nb::python_error();
      monitoring_.attr("register_callback")(tool_id_, bit, fn);
    }
    // Locations disabled by an earlier session (other filters) must report again.
    monitoring_.attr("restart_events")();
    monitoring_.attr("set_events")(tool_id_, mask);
  }

  void StopMonitoring() {
    try {
      monitoring_.attr("set_events")(tool_id_, 0);
      nb::object events = monitoring_.attr("events");
      for (const char* name : {"PY_START", "PY_RESUME", "PY_THROW", "PY_RETURN", "PY_YIELD",
                               "PY_UNWIND", "LINE"})
        monitoring_.attr("register_callback")(tool_id_, events.attr(name), nb::none());
      monitoring_.attr("free_tool_id")(tool_id_);
    } catch (const std::exception& e) {
      warnings_.push_back(std::string("could not release the sys.monitoring tool id: ") +
                          e.what());
    }
  }
#else
  // ---- 3.11: C trace function ----
  // `frame.f_trace_lines = False` through the public attribute protocol (no reliance on the
  // frame struct's layout); the name is interned once.
  static void DisableLineEvents(PyFrameObject* frame) noexcept {
    static PyObject* name = PyUnicode_InternFromString("f_trace_lines");
    if (name == nullptr || PyObject_SetAttr(reinterpret_cast<PyObject*>(frame), name, Py_False) < 0) {
      PyErr_Clear();
    }
  }
  static int TraceFunc(PyObject*, PyFrameObject* frame, int what, PyObject* arg) {
    LineTracer* self = g_active;
    if (self == nullptr) return 0;
    if (self->prev_func_ != nullptr) {
      if (self->prev_func_(self->prev_obj_, frame, what, arg) != 0) return -1;
    }
    return self->OnTrace(frame, what, arg);
  }

  int OnTrace(PyFrameObject* frame, int what, PyObject* arg) noexcept {
    if (what != PyTrace_CALL && what != PyTrace_RETURN && what != PyTrace_LINE) return 0;
    int64_t now = clock::NowNs();
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    int32_t idx;
    if (reinterpret_cast<PyObject*>(code) == last_code_) {
      idx = last_idx_;
    } else {
      idx = Lookup(reinterpret_cast<PyObject*>(code));
      last_code_ = reinterpret_cast<PyObject*>(code);
      last_idx_ = idx;
    }
    Py_DECREF(code);  // the frame keeps it alive for the rest of this event
    if (idx == kExcluded) {
      if (what == PyTrace_CALL && prev_func_ == nullptr) {
        // No line events for this frame; its time stays on the calling recorded line.
        DisableLineEvents(frame);
      }
      return 0;
    }
    if (idx < 0) return 0;
    const CodeInfo& info = infos_[static_cast<size_t>(idx)];
    switch (what) {
      case PyTrace_CALL: {
        bool fresh = true;
        int32_t line = 0;
        if (info.generator_like) {
          fresh = PyFrame_GetLasti(frame) == info.first_resume;
          if (!fresh) line = PyFrame_GetLineNumber(frame);
        }
        agg_.Enter(idx, now, fresh, line);
        break;
      }
      case PyTrace_RETURN: {
        bool finished = true;
        if (info.generator_like && arg != nullptr) {
          constexpr unsigned char kYieldValue = 86;
          int lasti = PyFrame_GetLasti(frame);
          if (lasti >= 0 && static_cast<size_t>(lasti) < info.bytecode.size() &&
              static_cast<unsigned char>(info.bytecode[static_cast<size_t>(lasti)]) ==
                  kYieldValue)
            finished = false;
        }
        agg_.Exit(idx, now, finished);
        break;
      }
      case PyTrace_LINE:
        agg_.Line(idx, PyFrame_GetLineNumber(frame), now);
        break;
    }
    return 0;
  }

  Py_tracefunc prev_func_ = nullptr;
  PyObject* prev_obj_ = nullptr;
  PyObject* last_code_ = nullptr;
  int32_t last_idx_ = kFailed;
#endif

  lines::PathFilter filter_;
  std::string cwd_;
  lines::LineAggregator agg_;
  std::vector<CodeInfo> infos_;
  std::unordered_map<std::string, bool> decided_;
  std::vector<std::string> warnings_;
  State state_ = kIdle;
  uint32_t generation_ = 0;
  PyThreadState* owner_ = nullptr;
  int64_t start_ns_ = 0;
  int64_t stop_ns_ = 0;
  int64_t other_thread_events_ = 0;
  int tool_id_ = -1;
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
      .def("start", &LineTracer::Start)
      .def("stop", &LineTracer::Stop)
      .def("lines", &LineTracer::Lines)
      .def("functions", &LineTracer::Functions)
      .def("recorded", &LineTracer::Recorded, nb::arg("path"))
      .def_prop_ro("elapsed_ns", &LineTracer::elapsed_ns)
      .def_prop_ro("mismatches", &LineTracer::mismatches)
      .def_prop_ro("other_thread_events", &LineTracer::other_thread_events)
      .def_prop_ro("warnings", &LineTracer::warnings)
      .def_prop_ro("tool_id", &LineTracer::tool_id)
      .def_prop_ro("running", &LineTracer::running)
      .def_prop_ro_static("mode", [](nb::handle) { return std::string(LineTracer::Mode()); });
}

}  // namespace gpuprof::python
