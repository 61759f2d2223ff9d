/* See main_thread_call.c. Any thread; no GIL needed. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* Queues fn(arg) to run on the main thread soon (GIL held; fn must return 0 and must not raise).
 * Returns 0, or -1 when the interpreter's queue is full. */
int gpuprof_call_on_main_thread(int (*fn)(void*), void* arg);
/* Makes the main thread check for pending calls at its next evaluation-breaker check. */
void gpuprof_poke_main_thread(void);

#ifdef __cplusplus
}
#endif
