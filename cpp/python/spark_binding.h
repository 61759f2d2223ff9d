// linescope's Spark view in gpuprof._native (cpp/core/lines/spark.h).
#pragma once

#include <nanobind/nanobind.h>

namespace gpuprof::python {

// Adds `_native.spark_build_execution`, `_native.spark_parse_metric` and the
// `_native.SparkLineFilter` class.
void RegisterSpark(nanobind::module_& m);

}  // namespace gpuprof::python
