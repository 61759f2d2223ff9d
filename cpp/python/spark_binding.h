// linescope's Spark view in gpuprof._native (cpp/core/lines/spark.h).
#pragma once

#include <nanobind/nanobind.h>

namespace gpuprof::python {

// Adds `_native.spark_build_execution`.
void RegisterSpark(nanobind::module_& m);

}  // namespace gpuprof::python
