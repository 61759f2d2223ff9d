// gpuprof._native: linescope's Spark view (cpp/core/lines/spark.h). Strings in, strings out;
// a capture error becomes a ValueError here, at the binding boundary.
#include "spark_binding.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lines/line_model.h"
#include "lines/spark.h"
#include "py_paths.h"

namespace nb = nanobind;

namespace gpuprof::python {
namespace {

// Which source file a Spark action is charged to: the session's own PathFilter (the one its
// line tracer applies), so an action lands on the innermost frame the session records.
class SparkLineFilter {
 public:
  SparkLineFilter(std::vector<std::string> roots, std::vector<std::string> include,
                  std::vector<std::string> exclude, std::string cwd)
      : filter_(std::move(roots), std::move(include), std::move(exclude), std::move(cwd),
                InterpreterLibraryDirs()) {}
  bool Recorded(const std::string& path) const { return filter_.Recorded(path); }

 private:
  lines::PathFilter filter_;
};

}  // namespace

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
  m.def(
      "spark_parse_metric",
      [](const std::string& metric_type, const std::string& text)
          -> std::tuple<std::optional<double>, std::optional<double>, std::optional<double>,
                        std::optional<double>, std::string> {
        lines::SparkMetricValue v = lines::ParseSparkMetric(metric_type, text);
        return {v.total, v.min, v.med, v.max, v.unit};
      },
      nb::arg("metric_type"), nb::arg("text"),
      "Spark's formatted SQL metric -> (total, min, med, max, unit); unit is 'ns', 'bytes', "
      "'count' or ''; None where the text does not say.");
  nb::class_<SparkLineFilter>(m, "SparkLineFilter",
                              "The session's path filter: whether a file's lines are recorded.")
      .def(nb::init<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>,
                    std::string>(),
           nb::arg("roots"), nb::arg("include"), nb::arg("exclude"), nb::arg("cwd"))
      .def("recorded", &SparkLineFilter::Recorded, nb::arg("path"));
}

}  // namespace gpuprof::python
