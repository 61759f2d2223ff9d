// `_native_testing.line_floor`: a benchmark instrument, not a product feature.
//
// The cheapest per-line hook the interpreter allows, used by bench/linescope to measure the
// floor that any deterministic line tracer pays: per line event one clock read and one
// counter, nothing else. Like the `trace` backend it records only code whose file lies under
// a root, so that both skip the same code:
//   3.12+: a sys.monitoring LINE callback (METH_FASTCALL C function); with returns=True
//          also a PY_RETURN callback doing the same (the event set of a tracer that sees
//          every frame exit). Locations outside the root return DISABLE (each costs one
//          callback per session).
//   3.11:  a C trace function (PyEval_SetTrace) counting PyTrace_LINE of code under the
//          root (the interpreter calls it for every call and return anyway, so `returns`
//          changes nothing); frames outside the root get f_trace_lines = False at their call
//          event, and frames already running at start() at once.
// A 64-entry direct-mapped cache of the root decision by code address keeps the filter to
// one compare per event (a freed and reused code address can be misjudged; fine for a
// benchmark).
// One session per process, calling thread only (3.11) / process-wide (3.12); GIL-protected.
#include "line_floor.h"

#include <Python.h>
#include <frameobject.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "clock/clock.h"

namespace nb = nanobind;

namespace gpuprof::python {
namespace {

struct FloorState {
  bool running = false;
  std::string root;  // absolute, with a trailing '/'
  int64_t lines = 0;
  int64_t last_ns = 0;
  int64_t span_ns = 0;  // sum of gaps between line events (keeps the clock read observable)
  struct Entry {
    PyObject* code;
    bool recorded;
  } cache[64] = {};
  int tool_id = -1;
  PyObject* disable = nullptr;
};
FloorState g_floor;

bool UnderRoot(PyObject* code_obj) noexcept {
  PyObject* name = reinterpret_cast<PyCodeObject*>(code_obj)->co_filename;
  Py_ssize_t n = 0;
  const char* s = PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, &n) : nullptr;
  if (s == nullptr) {
    PyErr_Clear();
    return false;
  }
  const std::string& r = g_floor.root;
  return static_cast<size_t>(n) > r.size() && r.compare(0, r.size(), s, r.size()) == 0;
}

// True when the code is under the root; the answer is cached by code address.
inline bool Recorded(PyObject* code) noexcept {
  auto& e = g_floor.cache[(reinterpret_cast<uintptr_t>(code) >> 4) & 63];
  if (e.code != code) e = {code, UnderRoot(code)};
  return e.recorded;
}

inline void Count() noexcept {
  int64_t now = clock::NowNs();
  g_floor.span_ns += now - g_floor.last_ns;
  g_floor.last_ns = now;
  ++g_floor.lines;
}

#if PY_VERSION_HEX >= 0x030C0000
constexpr const char* kMode = "sys.monitoring";

PyObject* OnEvent(PyObject*, PyObject* const* args, Py_ssize_t) {
  if (!Recorded(args[0])) return Py_NewRef(g_floor.disable);
  Count();
  return Py_NewRef(Py_None);
}

void StartHook(bool returns) {
  nb::object mon = nb::module_::import_("sys").attr("monitoring");
  int id = -1;
  for (int candidate : {3, 4, 5, 0, 1, 2}) {
    if (mon.attr("get_tool")(candidate).is_none()) {
      id = candidate;
      break;
    }
  }
  if (id < 0) throw std::runtime_error("no free sys.monitoring tool id");
  mon.attr("use_tool_id")(id, "linescope-floor");
  g_floor.tool_id = id;
  g_floor.disable = mon.attr("DISABLE").ptr();  // a module-level singleton, lives forever
  static PyMethodDef def = {"line_floor",
                            reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&OnEvent)),
                            METH_FASTCALL, nullptr};
  nb::object fn = nb::steal(PyCFunction_New(&def, nullptr));
  if (!fn.is_valid()) throw nb::python_error();
  nb::object events = mon.attr("events");
  long mask = nb::cast<long>(events.attr("LINE"));
  if (returns) mask |= nb::cast<long>(events.attr("PY_RETURN"));
  mon.attr("register_callback")(id, events.attr("LINE"), fn);
  if (returns) mon.attr("register_callback")(id, events.attr("PY_RETURN"), fn);
  mon.attr("restart_events")();
  mon.attr("set_events")(id, mask);
}

void StopHook() {
  nb::object mon = nb::module_::import_("sys").attr("monitoring");
  mon.attr("set_events")(g_floor.tool_id, 0);
  for (const char* event : {"LINE", "PY_RETURN"})
    mon.attr("register_callback")(g_floor.tool_id, mon.attr("events").attr(event), nb::none());
  mon.attr("free_tool_id")(g_floor.tool_id);
  g_floor.tool_id = -1;
}
#else
constexpr const char* kMode = "settrace";

void DisableLines(PyFrameObject* frame) noexcept {
  static PyObject* attr = PyUnicode_InternFromString("f_trace_lines");
  if (PyObject_SetAttr(reinterpret_cast<PyObject*>(frame), attr, Py_False) < 0) PyErr_Clear();
}

bool FrameRecorded(PyFrameObject* frame) noexcept {
  PyCodeObject* code = PyFrame_GetCode(frame);
  bool recorded = Recorded(reinterpret_cast<PyObject*>(code));
  Py_DECREF(code);
  return recorded;
}

// Every line event that arrives is one of a recorded frame.
int OnTrace(PyObject*, PyFrameObject* frame, int what, PyObject*) {
  if (what == PyTrace_LINE) {
    Count();
  } else if (what == PyTrace_CALL && !FrameRecorded(frame)) {
    DisableLines(frame);
  }
  return 0;
}

void StartHook(bool) {
  for (PyFrameObject* f = PyEval_GetFrame(); f != nullptr;) {  // frames running now
    if (!FrameRecorded(f)) DisableLines(f);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference; the chain keeps it alive
    Py_XDECREF(back);
    f = back;
  }
  PyEval_SetTrace(&OnTrace, nullptr);
}
void StopHook() { PyEval_SetTrace(nullptr, nullptr); }
#endif

void Start(const std::string& root, bool returns) {
  if (g_floor.running) throw std::runtime_error("the line floor is already running");
  if (root.empty() || root.front() != '/') throw std::invalid_argument("root must be absolute");
  g_floor = FloorState{};
  g_floor.root = root.back() == '/' ? root : root + "/";
  g_floor.last_ns = clock::NowNs();
  StartHook(returns);
  g_floor.running = true;
}

// Returns (line events counted, summed gaps in ns).
std::pair<int64_t, int64_t> Stop() {
  if (!g_floor.running) throw std::runtime_error("the line floor is not running");
  StopHook();
  g_floor.running = false;
  return {g_floor.lines, g_floor.span_ns};
}

}  // namespace

void RegisterLineFloor(nb::module_& m) {
  nb::module_ f = m.def_submodule(
      "line_floor", "benchmark instrument: the minimal per-line hook (bench/linescope)");
  f.def("start", &Start, nb::arg("root"), nb::arg("returns") = false);
  f.def("stop", &Stop);
  f.attr("mode") = kMode;
}

}  // namespace gpuprof::python
