// gpuprof._native: linescope's HTML report (cpp/core/lines/report.h). Strings in, strings out;
// a payload error becomes a ValueError here, at the binding boundary.
#include "report_binding.h"

#include <nanobind/stl/string.h>

#include <string>

#include "lines/report.h"

namespace nb = nanobind;

namespace gpuprof::python {

void RegisterLineReport(nb::module_& m) {
  m.def(
      "build_report_payload",
      [](const std::string& result_json) {
        auto payload = lines::BuildReportPayload(result_json);
        if (!payload) throw nb::value_error(payload.error().c_str());
        return std::move(payload).value();
      },
      nb::arg("result_json"),
      "linescope-result/1 JSON -> linescope-report/1 payload JSON (see docs/linescope.md).");
  m.def(
      "render_report_html",
      [](const std::string& payload_json) { return lines::RenderReportHtml(payload_json); },
      nb::arg("payload_json"), "linescope-report/1 payload -> one self-contained HTML page.");
}

}  // namespace gpuprof::python
