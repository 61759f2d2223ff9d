// Native call hooks for auto-instrumentation: nn.Module.__call__, Tensor.backward,
// torch.autograd.backward, GradScaler.step, and the DataLoader's iter()/next() (loader wait).
// Written against the CPython C API directly (vectorcall + method-descriptor protocol) so
// that a nested submodule call costs one thread id compare and two integer updates beyond
// the call itself.
#include <Python.h>
#include <pythread.h>

#include <string>

#include "clock/clock.h"
#include "hook_state.h"

namespace gpuprof::python {
namespace {

using record::EventKind;

struct CallHook {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* owner;  // strong: keeps HookState alive
  HookState* state;
  PyObject* original;  // strong
  PyObject* callback;  // strong or nullptr
  int kind;
  int64_t wait_value;  // kHookLoader: kWaitBegin's value (kWaitDataLoader or ...Start)
};

constexpr EventKind kBegin[kHookKinds] = {EventKind::kForwardBegin, EventKind::kBackwardBegin,
                                          EventKind::kOptimizerBegin, EventKind::kWaitBegin};
constexpr EventKind kEnd[kHookKinds] = {EventKind::kForwardEnd, EventKind::kBackwardEnd,
                                        EventKind::kOptimizerEnd, EventKind::kWaitEnd};

// Calls the boundary callback without disturbing a pending exception; a failing callback is
// dropped (never raised into the training loop).
void RunCallback(CallHook* h, bool begin, int64_t ts) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  // Held across the call: a failing callback is cleared below, and the call must not outlive
  // the object it runs.
  PyObject* callback = Py_NewRef(h->callback);
  PyObject* r = nullptr;
  PyObject* kind = PyLong_FromLong(h->kind);
  PyObject* when = PyLong_FromLongLong(static_cast<long long>(ts));
  if (kind != nullptr && when != nullptr) {
    PyObject* args[3] = {kind, begin ? Py_True : Py_False, when};
    r = PyObject_Vectorcall(callback, args, 3, nullptr);
  }
  Py_XDECREF(kind);
  Py_XDECREF(when);
  Py_DECREF(callback);
  if (r == nullptr) {
    // Record the failure (diagnostic + warning), stop calling the callback, keep training.
    const bool loader = h->kind == kHookLoader;
    std::string what = loader ? "DataLoader callback failed" : "CUDA event callback failed";
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    if (ev != nullptr) {
      if (PyObject* s = PyObject_Repr(ev)) {
        if (const char* c = PyUnicode_AsUTF8(s)) what += std::string(": ") + c;
        Py_DECREF(s);
      }
    }
    PyErr_Clear();
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(etb);
    if (h->state->session != nullptr) {
      h->state->session->AddDiagnostic(
          "error", loader ? "flops" : "cuda_events",
          what + (loader ? "; the FLOP count no longer leaves out work inside the loader"
                         : "; GPU phase times stop here"));
    }
    if (PyErr_WarnEx(PyExc_RuntimeWarning, ("gpuprof: " + what).c_str(), 1) < 0) PyErr_Clear();
    Py_CLEAR(h->callback);
  } else {
    Py_DECREF(r);
  }
  PyErr_Restore(type, value, tb);
}

// Whether iter(loader) on this torch DataLoader starts worker processes: num_workers > 0, and
// either no persistent_workers or none kept yet (its first epoch). A loader whose attributes
// cannot be read counts as starting them. Leaves no Python error set.
bool StartsWorkers(PyObject* loader) {
  const auto attr = [loader](const char* name) {
    PyObject* v = PyObject_GetAttrString(loader, name);
    if (v == nullptr) PyErr_Clear();
    return v;
  };
  PyObject* n = attr("num_workers");
  if (n == nullptr) return true;
  const long workers = PyLong_AsLong(n);
  Py_DECREF(n);
  if (workers == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return true;
  }
  if (workers <= 0) return false;
  PyObject* p = attr("persistent_workers");
  if (p == nullptr) return true;
  const int persistent = PyObject_IsTrue(p);
  Py_DECREF(p);
  if (persistent <= 0) {
    PyErr_Clear();
    return true;
  }
  PyObject* kept = attr("_iterator");
  if (kept == nullptr) return true;
  const bool first = kept == Py_None;
  Py_DECREF(kept);
  return first;
}

PyObject* CallHookVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                             PyObject* kwnames) {
  auto* h = reinterpret_cast<CallHook*>(self);
  HookState* st = h->state;
  if (!st->Recording()) return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  if (PyThread_get_thread_ident() != st->owner_thread) {
    ++st->foreign_thread_calls;
    return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  }
  const int k = h->kind;
  // A module called while a backward runs on this thread is the backward's own work
  // (activation checkpointing recomputes forwards there; CPU autograd runs on the calling
  // thread): it opens no forward phase and counts no forward call.
  if (k == kHookForward && st->depth[kHookBackward] > 0) {
    return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  }
  // Work inside a loader wait belongs to the loader (hook_state.h, InLoader).
  if (k != kHookLoader && st->InLoader()) {
    return PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  }
  const bool outermost = st->depth[k]++ == 0;
  if (outermost) {
    const int64_t ts = clock::NowNs();
    int64_t value = 0;
    if (k == kHookLoader) {
      value = h->wait_value;
      // iter(loader) that reuses persistent workers (or has none) is an ordinary loader wait
      if (value == kWaitDataLoaderStart &&
          (PyVectorcall_NARGS(nargsf) < 1 || !StartsWorkers(args[0]))) {
        value = kWaitDataLoader;
      }
    }
    st->session->EmitAt(ts, kBegin[k], 0, value);
    ++st->calls[k];
    if (h->callback) RunCallback(h, true, ts);
  }
  PyObject* result = PyObject_Vectorcall(h->original, args, nargsf, kwnames);
  if (--st->depth[k] == 0 && outermost && st->Recording()) {
    const int64_t ts = clock::NowNs();
    st->session->EmitAt(ts, kEnd[k], 0, 0);
    if (h->callback) RunCallback(h, false, ts);
  }
  return result;
}

PyObject* CallHookCall(PyObject* self, PyObject* args, PyObject* kwargs) {
  return PyVectorcall_Call(self, args, kwargs);
}

// Accessed through an instance (obj.__call__), bind like a function does.
PyObject* CallHookDescrGet(PyObject* self, PyObject* obj, PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

int CallHookTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* h = reinterpret_cast<CallHook*>(self);
  Py_VISIT(h->owner);
  Py_VISIT(h->original);
  Py_VISIT(h->callback);
  return 0;
}

int CallHookClear(PyObject* self) {
  auto* h = reinterpret_cast<CallHook*>(self);
  Py_CLEAR(h->owner);
  Py_CLEAR(h->original);
  Py_CLEAR(h->callback);
  return 0;
}

void CallHookDealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  CallHookClear(self);
  Py_TYPE(self)->tp_free(self);
}

PyObject* GetWrapped(PyObject* self, void*) {
  auto* h = reinterpret_cast<CallHook*>(self);
  Py_INCREF(h->original);
  return h->original;
}

// Lets introspection (inspect.signature, functools, repr) see the wrapped function.
PyObject* GetAttrFallback(PyObject* self, PyObject* name) {
  PyObject* r = PyObject_GenericGetAttr(self, name);
  if (r != nullptr || !PyErr_ExceptionMatches(PyExc_AttributeError)) return r;
  PyErr_Clear();
  return PyObject_GetAttr(reinterpret_cast<CallHook*>(self)->original, name);
}

PyObject* CallHookRepr(PyObject* self) {
  auto* h = reinterpret_cast<CallHook*>(self);
  return PyUnicode_FromFormat("<gpuprof hook of %R>", h->original);
}

PyGetSetDef kGetSet[] = {
    {"__wrapped__", GetWrapped, nullptr, "the wrapped callable", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject CallHookType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace

int InitCallHookType(PyObject* module) {
  CallHookType.tp_name = "gpuprof._native.CallHook";
  CallHookType.tp_basicsize = sizeof(CallHook);
  CallHookType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                          Py_TPFLAGS_METHOD_DESCRIPTOR;
  CallHookType.tp_vectorcall_offset = offsetof(CallHook, vectorcall);
  CallHookType.tp_call = CallHookCall;
  CallHookType.tp_descr_get = CallHookDescrGet;
  CallHookType.tp_traverse = CallHookTraverse;
  CallHookType.tp_clear = CallHookClear;
  CallHookType.tp_dealloc = CallHookDealloc;
  CallHookType.tp_getset = kGetSet;
  CallHookType.tp_getattro = GetAttrFallback;
  CallHookType.tp_repr = CallHookRepr;
  CallHookType.tp_doc = "gpuprof auto-instrumentation hook (internal)";
  if (PyType_Ready(&CallHookType) < 0) return -1;
  Py_INCREF(&CallHookType);
  if (PyModule_AddObject(module, "CallHook", reinterpret_cast<PyObject*>(&CallHookType)) < 0) {
    Py_DECREF(&CallHookType);
    return -1;
  }
  return 0;
}

PyObject* NewCallHook(PyObject* owner, HookState* state, int kind, PyObject* original,
                      PyObject* callback) {
  if (kind < 0 || kind > kHookLoaderStart) {
    PyErr_SetString(PyExc_ValueError,
                    "hook kind must be 0 (forward), 1 (backward), 2 (optimizer), 3 (loader) or 4 "
                    "(loader start)");
    return nullptr;
  }
  if (!PyCallable_Check(original)) {
    PyErr_SetString(PyExc_TypeError, "the hooked object must be callable");
    return nullptr;
  }
  auto* h = PyObject_GC_New(CallHook, &CallHookType);
  if (h == nullptr) return nullptr;
  h->vectorcall = CallHookVectorcall;
  Py_INCREF(owner);
  h->owner = owner;
  h->state = state;
  Py_INCREF(original);
  h->original = original;
  h->callback = nullptr;
  if (callback != nullptr && callback != Py_None) {
    Py_INCREF(callback);
    h->callback = callback;
  }
  h->kind = kind == kHookLoaderStart ? kHookLoader : kind;
  h->wait_value = kind == kHookLoaderStart ? kWaitDataLoaderStart : kWaitDataLoader;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(h));
  return reinterpret_cast<PyObject*>(h);
}

}  // namespace gpuprof::python
