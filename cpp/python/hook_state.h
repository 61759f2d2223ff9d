// State shared between the Python-facing session object and the native call hooks.
// Owned by the session wrapper (see native_module.cc); hooks keep the wrapper alive.
#pragma once

#include <Python.h>

#include <cstdint>

#include "record/session.h"

namespace gpuprof::python {

enum HookKind : int { kHookForward = 0, kHookBackward = 1, kHookOptimizer = 2, kHookLoader = 3 };
constexpr int kHookKinds = 4;
// NewCallHook's kind for DataLoader.__iter__: a loader wait (kHookLoader), recorded as
// kWaitDataLoaderStart when it starts the loader's worker processes (num_workers > 0, and not
// persistent_workers or none kept yet), else as kWaitDataLoader.
constexpr int kHookLoaderStart = 4;

// kWaitBegin's value: who measured the wait (StepAssembler turns it into steps.wait_source);
// kWaitDataLoaderStart is a DataLoader wait in an iter(loader) that starts worker processes
// (steps.loader_starts).
enum WaitSource : int64_t { kWaitWrapped = 0, kWaitDataLoader = 1, kWaitDataLoaderStart = 2 };

struct HookState {
  record::Session* session = nullptr;  // null once the session has stopped
  unsigned long owner_thread = 0;      // only this thread's calls are recorded
  int depth[kHookKinds] = {};          // outermost-call tracking per kind
  uint64_t calls[kHookKinds] = {};     // outermost calls recorded per kind
  uint64_t foreign_thread_calls = 0;   // calls seen from other threads (not recorded)

  bool Recording() const { return session != nullptr; }
  // Inside a loader wait (DataLoader next()/iter(), wrap_dataloader's next()): a module, a
  // backward or an optimizer step run there is the loader's work (a collate_fn or transform
  // that calls a module), not a training phase.
  bool InLoader() const { return depth[kHookLoader] > 0; }
};

// Registers the CallHook type on `module`. Returns 0 on success, -1 with a Python error set.
int InitCallHookType(PyObject* module);

// A descriptor-aware callable that wraps `original`: calls through unchanged, and around the
// outermost call (per kind) on the owner thread it records begin/end events and, when
// `callback` is not None, calls callback(kind, is_begin, ts_ns) (CUDA events for the phases;
// for kHookLoader, whose events are a loader wait (kWaitBegin/kWaitEnd, kWaitDataLoader), the
// automatic FLOP count's edge, so that work inside the loader is left out of the count).
// `owner` is a strong reference that keeps `state` alive.
// kind kHookLoaderStart is kHookLoader whose waits start the loader (DataLoader.__iter__).
PyObject* NewCallHook(PyObject* owner, HookState* state, int kind, PyObject* original,
                      PyObject* callback);

}  // namespace gpuprof::python
