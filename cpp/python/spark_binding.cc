// gpuprof._native: linescope's Spark view (cpp/core/lines/spark.h). Strings in, strings out;
// a capture error becomes a ValueError here, at the binding boundary.
#include "spark_binding.h"

#include <nanobind/stl/string.h>

#include <string>
#include <utility>

#include "lines/spark.h"

namespace nb = nanobind;

namespace gpuprof::python {

void RegisterSpark(nb::module_& m) {
  m.def(
      "spark_build_execution",
      [](const std::string& raw_json) {
        auto built = lines::BuildSparkExecution(raw_json);
        if (!built) throw nb::value_error(built.error().c_str());
        return std::move(built).value();
      },
      nb::arg("raw_json"),
      "A Spark action's raw capture (JSON) -> the recorded execution (JSON): operator tree "
      "with parsed SQL metrics, jobs, stages, totals (see cpp/core/lines/spark.h).");
}

}  // namespace gpuprof::python
