// linescope's sampling: `_native.LineSampler`, the main-thread line sampler behind the
// `sampler` backend (CPU, memory and GPU per line) and linescope's memory=True for any backend.
#pragma once

#include <nanobind/nanobind.h>

namespace gpuprof::python {

// Adds `_native.LineSampler` to the extension module.
void RegisterLineSampler(nanobind::module_& m);

}  // namespace gpuprof::python
