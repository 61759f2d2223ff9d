// linescope's `trace` backend: the native line tracer (PEP 669 sys.monitoring on 3.12+,
// a chained C trace function on 3.11). Feeds gpuprof::lines::LineAggregator.
#pragma once

#include <nanobind/nanobind.h>

namespace gpuprof::python {

// Adds `_native.LineTracer` to the extension module.
void RegisterLineTracer(nanobind::module_& m);

}  // namespace gpuprof::python
