/* Asking the main thread to run a C function soon, from any thread, without a signal.
 *
 * Py_AddPendingCall queues the call; the main thread runs it at its next evaluation-breaker
 * check (a backward jump, a function start, the return of a C call) with the GIL held. On 3.13+
 * queuing sets the main thread's breaker. On 3.11 and 3.12 the breaker is recomputed on the
 * QUEUING thread, which is not the main thread, so it stays unset and the call can wait for
 * hundreds of milliseconds; there the breaker is set directly (CPython's internal interpreter
 * state, compiled against the headers of the Python being built for; C, not C++, because 3.12's
 * internal atomics header is C-only). Another thread that handles the breaker may clear it
 * again, so callers re-poke while their call is outstanding.
 */
#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define Py_BUILD_CORE 1
/* 3.12's public objimpl.h defines this as a macro unless Py_BUILD_CORE was set before Python.h;
 * the internal pycore_gc.h defines it as a function. */
#undef _PyGC_FINALIZED
#include <internal/pycore_interp.h>
#undef Py_BUILD_CORE
#define GPUPROF_POKE_BREAKER 1
#else
#define GPUPROF_POKE_BREAKER 0
#endif

#include "main_thread_call.h"

void gpuprof_poke_main_thread(void) {
#if GPUPROF_POKE_BREAKER
  _Py_atomic_store_relaxed(&PyInterpreterState_Main()->ceval.eval_breaker, 1);
#endif
}

int gpuprof_call_on_main_thread(int (*fn)(void*), void* arg) {
  if (Py_AddPendingCall(fn, arg) != 0) return -1;
  gpuprof_poke_main_thread();
  return 0;
}
