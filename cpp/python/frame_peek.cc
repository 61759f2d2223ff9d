#include "frame_peek.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#define GPUPROF_FRAME_PEEK 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#define GPUPROF_FRAME_PEEK 0
#endif

namespace gpuprof::python {

bool PeekOwnFrames(PyThreadState* tstate, FrameVisitor visit, void* ctx, int max_depth) noexcept {
#if GPUPROF_FRAME_PEEK
  if (tstate == nullptr) return true;
#if PY_VERSION_HEX >= 0x030D0000
  _PyInterpreterFrame* f = tstate->current_frame;
#else
  _PyInterpreterFrame* f = tstate->cframe != nullptr ? tstate->cframe->current_frame : nullptr;
#endif
  for (int depth = 0; f != nullptr && depth < max_depth; ++depth, f = f->previous) {
#if PY_VERSION_HEX >= 0x030C0000
    if (f->owner == FRAME_OWNED_BY_CSTACK) continue;
#endif
    if (_PyFrame_IsIncomplete(f)) continue;  // still being set up: no current line yet
#if PY_VERSION_HEX >= 0x030D0000
    PyObject* exe = f->f_executable;
    if (exe == nullptr || !PyCode_Check(exe)) continue;
    auto* code = reinterpret_cast<PyCodeObject*>(exe);
#else
    PyCodeObject* code = f->f_code;
    if (code == nullptr) continue;
#endif
    int offset = _PyInterpreterFrame_LASTI(f) * static_cast<int>(sizeof(_Py_CODEUNIT));
    if (visit(ctx, code, offset)) break;
  }
  return true;
#else
  (void)tstate;
  (void)visit;
  (void)ctx;
  (void)max_depth;
  return false;
#endif
}

const void* InterpreterFrameOf(PyFrameObject* frame) noexcept {
#if GPUPROF_FRAME_PEEK
  return frame != nullptr ? frame->f_frame : nullptr;
#else
  (void)frame;
  return nullptr;
#endif
}

#if PY_VERSION_HEX < 0x030C0000
void EnableLineEvents(PyFrameObject* frame) noexcept { frame->f_trace_lines = 1; }
void SetLocalTraceIfUnset(PyFrameObject* frame, PyObject* obj) noexcept {
  if (frame->f_trace == nullptr) frame->f_trace = Py_NewRef(obj);
}
#endif

}  // namespace gpuprof::python
