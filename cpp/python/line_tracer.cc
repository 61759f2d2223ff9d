// The native line tracer behind linescope's `trace` backend: the session, code-object
// registration and the per-code cache, the frames running at start, and the binding. The
// per-version hooks are in line_tracer_monitoring.cc (3.12+) and line_tracer_settrace.cc (3.11);
// line_tracer_internal.h describes what is measured and how.
#include "line_tracer.h"

#include <Python.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>

#include "clock/clock.h"
#include "line_tracer_internal.h"
#include "py_paths.h"
#include "py_text.h"

namespace gpuprof::python {
namespace line_tracing {

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

LineTracer* g_active = nullptr;
std::atomic<uintptr_t> g_owner_thread{0};

namespace {

uint32_t g_generation = 0;

struct OwnerExitWatch {
  bool armed = false;
  ~OwnerExitWatch() {
    uintptr_t me = ThisThread();
    if (armed) g_owner_thread.compare_exchange_strong(me, kOwnerGone);
  }
};
thread_local OwnerExitWatch t_owner_exit_watch;

}  // namespace

LineTracer::LineTracer(std::vector<std::string> roots, std::vector<std::string> include,
                       std::vector<std::string> exclude, std::string cwd)
    : filter_(std::move(roots), std::move(include), std::move(exclude), cwd,
              InterpreterLibraryDirs()),
      cwd_(cwd) {}

LineTracer::~LineTracer() {
  if (g_active == this) {
    // Collected while active: detach without raising.
    try {
      Stop(0);
    } catch (...) {
    }
  }
}

void LineTracer::Start(bool adopt_running) {
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
  StartMode(adopt_running);
  g_active = this;
  state_ = kRunning;
}

bool LineTracer::OwnerAlive() const noexcept {
  PyInterpreterState* interp = PyInterpreterState_Get();
  for (PyThreadState* t = PyInterpreterState_ThreadHead(interp); t != nullptr;
       t = PyThreadState_Next(t)) {
    if (t == owner_ && t->id == owner_id_) return true;
  }
  return false;
}

void LineTracer::Stop(int64_t as_of_ns) {
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
  StopMode(owner_gone);
  if (!undecodable_.empty()) {
    warnings_.push_back(
        std::to_string(undecodable_.size()) +
        " file(s) under the root ran but were not "
        "recorded because their names are not valid UTF-8 (e.g. " +
        undecodable_example_ +
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

void LineTracer::DetachAfterFork() noexcept {
  if (g_active != this || state_ != kRunning) return;
  DetachMode();
  ClearCodeCache();
  g_owner_thread.store(0, std::memory_order_relaxed);
  g_active = nullptr;
  state_ = kStopped;
}

std::vector<std::tuple<std::string, int32_t, int64_t, int64_t, int64_t, int64_t>>
LineTracer::Lines() const {
  std::vector<std::tuple<std::string, int32_t, int64_t, int64_t, int64_t, int64_t>> out;
  for (const auto& s : agg_.Lines())
    out.emplace_back(agg_.files()[static_cast<size_t>(s.file_id)], s.line, s.wall_time_ns,
                     s.self_time_ns, s.hits, s.calls);
  return out;
}

std::vector<std::tuple<std::string, std::string, int32_t, int64_t, int64_t, int64_t>>
LineTracer::Functions() const {
  std::vector<std::tuple<std::string, std::string, int32_t, int64_t, int64_t, int64_t>> out;
  for (const auto& f : agg_.Functions())
    out.emplace_back(agg_.files()[static_cast<size_t>(f.file_id)], f.qualname, f.first_line,
                     f.total_time_ns, f.own_time_ns, f.calls);
  return out;
}

std::vector<std::tuple<uint64_t, std::string, int32_t>> LineTracer::ResolveLineKeys(
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

int64_t LineTracer::elapsed_ns() const {
  return state_ == kStopped ? stop_ns_ - start_ns_
                            : (state_ == kRunning ? clock::NowNs() - start_ns_ : 0);
}

// ---- per-code decisions ----------------------------------------------------------------------

const LineTracer::CodeEntry& LineTracer::Fill(CodeEntry& e, PyObject* code) noexcept {
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

void LineTracer::ClearCodeCache() noexcept {
  for (CodeEntry& e : code_cache_) {
    PyObject* old = e.code;
    e = CodeEntry{};
    Py_XDECREF(old);
  }
}

int32_t LineTracer::LookupExtra(PyObject* code) noexcept {
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
  uintptr_t tagged = (static_cast<uintptr_t>(generation_) << 32) | static_cast<uint32_t>(idx + 2);
  if (SetExtra(code, index, reinterpret_cast<void*>(tagged)) < 0) PyErr_Clear();
  return idx;
}

int32_t LineTracer::LastLine(PyCodeObject* code) noexcept {
  int32_t hi = code->co_firstlineno;
  VisitCoLines(reinterpret_cast<PyObject*>(code), [&](long, long, long line) {
    if (line >= 0) hi = std::max(hi, static_cast<int32_t>(line));
    return true;
  });
  return hi;
}

void LineTracer::NoteUndecodable(PyObject* name) noexcept {
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

int32_t LineTracer::Register(PyObject* code_obj) noexcept {
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
    DecideCode(code, info);
    infos_.push_back(info);
    return idx;
  } catch (...) {
    return kFailed;
  }
}

void LineTracer::AdoptRunningFrames(int64_t now) {
  struct Running {
    int32_t code;
    FrameKey key;
    int32_t line;
  };
  std::vector<Running> running;          // innermost first
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);
    const int32_t idx = Lookup(reinterpret_cast<PyObject*>(code)).idx;
    Py_DECREF(code);
    if (idx >= 0) {
      const FrameKey key = AdoptFrame(f);
      if (key != 0) running.push_back({idx, key, running.empty() ? 0 : PyFrame_GetLineNumber(f)});
    }
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  for (auto it = running.rbegin(); it != running.rend(); ++it)
    agg_.Enter(it->code, it->key, now, /*fresh_call=*/false, it->line);
}

}  // namespace line_tracing

void RegisterLineTracer(nanobind::module_& m) {
  namespace nb = nanobind;
  using line_tracing::LineTracer;
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
      .def_prop_ro_static("mode", [](nb::handle) { return std::string(LineTracer::Mode()); });
  // 3.11's untraced-eval counters are a test instrument: gpuprof._native_testing.
}

}  // namespace gpuprof::python
