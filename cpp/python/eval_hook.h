// 3.11: code outside the profiled root runs outside the interpreter's tracing mode.
//
// A C trace function (PyEval_SetTrace) puts the thread's whole eval loop into tracing mode:
// every instruction of every frame — also of code that is not recorded, the stdlib and the
// dependencies — takes the slow path that checks for a line change, and every call gets a
// frame object and a call event. sys.monitoring (3.12+) avoids that per code object; 3.11
// has no such switch. This PEP 523 frame-evaluation function gives one: while the session's
// trace function is the thread's (no chained tracer, no profile function), a frame of code
// that `skip` says is not recorded starts with tracing off (the caller's `use_tracing` byte
// is cleared for the call and put back after it), and a recorded frame called from such
// code starts with it on again. The recorded lines see the same events as before; unrecorded
// code runs at close to its plain speed, and its time still lands on the recorded line that
// called into it.
//
// With a frame-evaluation function installed, CPython calls it for every Python frame of
// every thread instead of running calls inline, so frames nest on the C stack. Once any
// thread's C stack is deeper than the upper half of its stack (at most 4 MiB below where the
// hook first ran on it), the hook takes itself out for the rest of the session and every
// frame is traced as without it: a deep recursion that plain CPython runs runs here too. It
// also stands aside where greenlet is in use (greenlet hands the tracing state of the
// switching greenlet to the one it switches to, so a user greenlet resumed from unrecorded
// code would run untraced): not armed when greenlet was imported before, out when any thread
// imports it during the session. Standing aside also turns tracing back on in the eval loops
// running at that moment on the session's thread.
//
// Another tool's frame-evaluation function (installed before: chained; installed after, on
// top of this one: left in place, this one then passes every frame on) is respected.
#pragma once

#include <Python.h>

namespace gpuprof::python {

// Whether frames of `code` run untraced; `may_register`: false while an exception is set or
// thrown into the frame (the answer must then come from a cache, without calling Python).
using SkipTracing = bool (*)(PyObject* code, bool may_register) noexcept;

// Arms the hook for the calling thread, whose trace function is `func` / `obj` (GIL held). The
// line tracer arms it at the session's first call into unrecorded code.
// Returns false where this Python has no such hook (3.12+: sys.monitoring does this itself)
// or where greenlet is in use.
bool ArmUntracedEval(Py_tracefunc func, PyObject* obj, SkipTracing skip) noexcept;

// Disarms it (at stop, and in a child after fork): the hook is removed where it is still the
// interpreter's, or left passing every frame on where another tool's is installed on top.
void DisarmUntracedEval() noexcept;

// Frames started untraced since the last reset (a test hook; the line tracer resets at each
// start), and why the hook stood aside since (nullptr: it did not).
void ResetUntracedEvalStats() noexcept;
long long UntracedEvalCount() noexcept;
const char* UntracedEvalAside() noexcept;

}  // namespace gpuprof::python
