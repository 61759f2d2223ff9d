#include "eval_hook.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define GPUPROF_EVAL_HOOK 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#include <pthread.h>

#include <algorithm>
#include <cstdint>
#else
#define GPUPROF_EVAL_HOOK 0
#endif

namespace gpuprof::python {

#if GPUPROF_EVAL_HOOK
namespace {

// All of it is read and written with the GIL held.
struct HookState {
  SkipTracing skip = nullptr;  // nullptr: disarmed, every frame is passed on unchanged
  Py_tracefunc func = nullptr;
  PyObject* obj = nullptr;
  _PyFrameEvalFunction next = nullptr;  // what this hook chains to (never nullptr once set)
  const char* aside = nullptr;          // why the hook took itself out this session, or null
  uint64_t arming = 0;                  // counts ArmUntracedEval calls
  long long untraced = 0;
  PyObject* modules = nullptr;  // sys.modules (the interpreter's dict, borrowed), or null
  Py_ssize_t modules_seen = 0;  // its size when greenlet was last looked for
};
HookState g;

// Per thread: the lowest C stack address down to which frames may nest through the hook (0:
// not computed yet). The default TLS model: a module loaded late (after torch's libraries)
// must not need static TLS space.
thread_local uintptr_t t_stack_floor = 0;

constexpr uint8_t kTracing = 255;  // the interpreter's use_tracing value when tracing

uint8_t CanonicalTracing(PyThreadState* ts) noexcept {
  return (ts->c_tracefunc != nullptr || ts->c_profilefunc != nullptr) ? kTracing : 0;
}

// Whether the session's trace function alone runs on `ts` (no other tool's would miss events).
bool Ours(PyThreadState* ts) noexcept {
  return g.skip != nullptr && g.aside == nullptr && ts->c_tracefunc == g.func &&
         ts->c_traceobj == g.obj && ts->c_profilefunc == nullptr;
}

PyObject* UntracedEval(PyThreadState* ts, _PyInterpreterFrame* frame, int throwflag);

// Puts back what this hook chains to, where the hook is still the interpreter's function
// (one another tool installed on top calls this one, which then stays, passing frames on).
void Uninstall(PyInterpreterState* interp) noexcept {
  if (_PyInterpreterState_GetEvalFrameFunc(interp) == &UntracedEval)
    _PyInterpreterState_SetEvalFrameFunc(interp, g.next);
}

// The hook leaves for the rest of the session: calls run inline again, and every frame runs
// with its thread's own tracing state. That includes the eval loops running now on the
// session's thread, which may be another thread than the caller's: each one's use_tracing
// is set from its thread's state (the loops' _PyCFrame records live on that thread's stack
// while they run, and the GIL is held).
void StandAside(PyThreadState* ts, const char* why) noexcept {
  g.aside = why;
  Uninstall(ts->interp);
  for (PyThreadState* t = PyInterpreterState_ThreadHead(ts->interp); t != nullptr;
       t = PyThreadState_Next(t)) {
    if (t != ts && !(t->c_tracefunc == g.func && t->c_traceobj == g.obj)) continue;
    const uint8_t state = CanonicalTracing(t);
    for (_PyCFrame* cf = t->cframe; cf != nullptr; cf = cf->previous) cf->use_tracing = state;
  }
}

// Whether greenlet has been imported (by any thread) since the last look: a dict size read
// per frame, the lookup only when the size changed.
bool GreenletArrived() noexcept {
  if (g.modules == nullptr) return false;
  const Py_ssize_t n = PyDict_GET_SIZE(g.modules);
  if (n == g.modules_seen) [[likely]]
    return false;
  g.modules_seen = n;
  return PyDict_GetItemString(g.modules, "greenlet") != nullptr;
}

// This thread's floor: frames nest through the hook only in the upper half of its stack, and
// at most 4 MiB below where the hook first ran on it (for a main thread whose stack limit is
// huge). Where the stack's bounds are unknown, 256 KiB below that point.
[[gnu::noinline, gnu::cold]] uintptr_t ThreadStackFloor() noexcept {
  auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  constexpr uintptr_t kMaxBudget = uintptr_t{4} << 20;
  uintptr_t floor = here > (uintptr_t{256} << 10) ? here - (uintptr_t{256} << 10) : here;
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* addr = nullptr;
    size_t size = 0;
    if (pthread_attr_getstack(&attr, &addr, &size) == 0 && addr != nullptr && size > 0) {
      auto low = reinterpret_cast<uintptr_t>(addr);
      floor = low + size / 2;
      if (here > kMaxBudget) floor = std::max(floor, here - kMaxBudget);
    }
    pthread_attr_destroy(&attr);
  }
  return std::max<uintptr_t>(floor, 1);
}

[[gnu::noinline, gnu::cold]] PyObject* TooDeep(PyThreadState* ts, _PyInterpreterFrame* frame,
                                               int throwflag) {
  StandAside(ts, "the C stack grew deep through it");
  return g.next(ts, frame, throwflag);
}

PyObject* UntracedEval(PyThreadState* ts, _PyInterpreterFrame* frame, int throwflag) {
  // In every thread: with this function installed no call runs inline, so any thread's deep
  // recursion nests here on its C stack.
  if (t_stack_floor == 0) [[unlikely]]
    t_stack_floor = ThreadStackFloor();
  if (reinterpret_cast<uintptr_t>(__builtin_frame_address(0)) < t_stack_floor) [[unlikely]] {
    if (g.aside == nullptr && g.skip != nullptr) return TooDeep(ts, frame, throwflag);
  }
  _PyFrameEvalFunction next = g.next;
  if (!Ours(ts)) return next(ts, frame, throwflag);
  if (GreenletArrived()) [[unlikely]] {
    StandAside(ts, "greenlet is in use");
    return next(ts, frame, throwflag);
  }
  _PyCFrame* cf = ts->cframe;
  const uint8_t before = cf->use_tracing;
  const bool may_register = throwflag == 0 && !PyErr_Occurred();
  const uint8_t want =
      g.skip(reinterpret_cast<PyObject*>(frame->f_code), may_register) ? 0 : kTracing;
  // (skip() may run Python code — a registration, a deallocation — that made the hook
  // stand aside: then the frame keeps the thread's tracing state.)
  if (want == before || g.aside != nullptr) return next(ts, frame, throwflag);
  if (want == 0) ++g.untraced;
  const uint64_t arming = g.arming;
  cf->use_tracing = want;  // the callee's eval loop starts with the caller's value
  PyObject* result = next(ts, frame, throwflag);
  // The callee's loop wrote its own final value back into `cf` on exit. The caller's value
  // is put back while the same arming of the hook rules; a session started in between (other
  // filters) gets the thread's tracing state.
  cf->use_tracing = Ours(ts) && g.arming == arming ? before : CanonicalTracing(ts);
  return result;
}

}  // namespace

bool ArmUntracedEval(Py_tracefunc func, PyObject* obj, SkipTracing skip) noexcept {
  PyInterpreterState* interp = PyInterpreterState_Get();
  // greenlet carries the switching greenlet's tracing state into the one it switches to, so
  // a user greenlet resumed from unrecorded code would run untraced: not with greenlets.
  PyObject* modules = PyImport_GetModuleDict();
  if (modules != nullptr && PyDict_GetItemString(modules, "greenlet") != nullptr) {
    g.aside = "greenlet is in use";
    return false;
  }
  g.modules = modules != nullptr && PyDict_Check(modules) ? modules : nullptr;
  g.modules_seen = g.modules != nullptr ? PyDict_GET_SIZE(g.modules) : 0;
  _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
  if (current != &UntracedEval) {
    g.next = current;  // _PyEval_EvalFrameDefault, or another tool's
    _PyInterpreterState_SetEvalFrameFunc(interp, &UntracedEval);
  }
  // Else: left installed by an earlier session under another tool's hook; `next` is kept.
  g.func = func;
  g.obj = obj;
  g.aside = nullptr;
  ++g.arming;
  g.skip = skip;
  return true;
}

void DisarmUntracedEval() noexcept {
  g.skip = nullptr;
  Uninstall(PyInterpreterState_Get());
}

void ResetUntracedEvalStats() noexcept {
  g.untraced = 0;
  g.aside = nullptr;
}
long long UntracedEvalCount() noexcept { return g.untraced; }
const char* UntracedEvalAside() noexcept { return g.aside; }

#else

bool ArmUntracedEval(Py_tracefunc, PyObject*, SkipTracing) noexcept { return false; }
void DisarmUntracedEval() noexcept {}
void ResetUntracedEvalStats() noexcept {}
long long UntracedEvalCount() noexcept { return 0; }
const char* UntracedEvalAside() noexcept { return nullptr; }

#endif

}  // namespace gpuprof::python
