// `_native_testing.line_floor`: the minimal per-line hook that bench/linescope measures as the
// floor of deterministic line tracing (a benchmark instrument, not a product feature).
#pragma once

#include <nanobind/nanobind.h>

namespace gpuprof::python {

// Adds the `line_floor` submodule (start(root, returns=False), stop() -> (events,
// span_ns), mode).
void RegisterLineFloor(nanobind::module_& m);

}  // namespace gpuprof::python
