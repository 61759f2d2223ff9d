// linescope's report functions in gpuprof._native.
#pragma once

#include <nanobind/nanobind.h>

namespace gpuprof::python {

// Adds `_native.build_report_payload` and `_native.render_report_html`.
void RegisterLineReport(nanobind::module_& m);

}  // namespace gpuprof::python
