// Reading a thread's Python frames without allocating (no frame objects are created), and, for
// the one case where that is safe, without the GIL: the calling thread reads ITS OWN frames
// while it is inside a C call (a CUDA kernel launch from a torch op, which releases the GIL).
// Its frames cannot change then: only the thread itself pushes and pops them, and the objects
// they reference are kept alive by the frames. With the GIL held (the sampler's pending call) it
// is simply the cheap way to walk the stack. This uses CPython's internal frame layout
// (_PyInterpreterFrame), compiled against the headers of the Python the extension is built for; on
// versions whose layout is not known here it reports "unsupported" and callers fall back.
#pragma once

#include <Python.h>

namespace gpuprof::python {

// Visits the frames of `tstate` from the innermost outwards: visit(ctx, code, byte_offset)
// with the frame's code object and the offset of its current instruction (for
// PyCode_Addr2Line), until it returns true or `max_depth` frames were seen. Frames that run no
// Python code (C-stack shims) and frames still being set up are skipped. Returns false when
// this Python is not supported (the caller then walks PyFrameObjects with the GIL).
using FrameVisitor = bool (*)(void* ctx, PyCodeObject* code, int byte_offset) noexcept;
bool PeekOwnFrames(PyThreadState* tstate, FrameVisitor visit, void* ctx, int max_depth) noexcept;

// The interpreter frame behind a frame object: what the thread state's current frame points at
// while that frame runs (the line tracer's frame key on 3.12+), or nullptr where this Python's
// layout is not known here.
const void* InterpreterFrameOf(PyFrameObject* frame) noexcept;

#if PY_VERSION_HEX < 0x030C0000
// 3.11, for a C trace function: `frame.f_trace_lines = True`, and `frame.f_trace = obj` (a new
// reference) when the frame has no local trace function yet. Both are plain field writes.
void EnableLineEvents(PyFrameObject* frame) noexcept;
void SetLocalTraceIfUnset(PyFrameObject* frame, PyObject* obj) noexcept;
#endif

}  // namespace gpuprof::python
