// gpuprof._native_testing: instruments for the tests and benchmarks, kept out of the product's
// extension. Built with GPUPROF_TEST_HOOKS (on with GPUPROF_BUILD_TESTS; scripts/setup.sh turns
// it on for every venv it builds); a wheel built by `pip install .` / `pip wheel .` has none.
//   line_floor            the minimal per-line hook bench/linescope measures (line_floor.h)
//   untraced_eval_stats() 3.11's untraced-eval hook counters of the last line tracer session
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/tuple.h>

#include <tuple>

#include "line_floor.h"
#include "test_api.h"

namespace nb = nanobind;

namespace {

const gpuprof::python::TestApi& Api() {
  nb::object cap = nb::module_::import_("gpuprof._native").attr("_test_api");
  void* p = PyCapsule_GetPointer(cap.ptr(), gpuprof::python::kTestApiCapsule);
  if (p == nullptr) throw nb::python_error();
  return *static_cast<const gpuprof::python::TestApi*>(p);
}

}  // namespace

NB_MODULE(_native_testing, m) {
  m.doc() = "gpuprof test and benchmark instruments (not part of the product)";
  gpuprof::python::RegisterLineFloor(m);
  m.def(
      "untraced_eval_stats",
      []() {
        const gpuprof::python::TestApi& api = Api();
        const char* aside = api.untraced_eval_aside();
        return std::make_tuple(api.untraced_eval_count(),
                               aside ? nb::object(nb::str(aside)) : nb::none());
      },
      "(frames started untraced in the last line tracer session, why the hook stood aside)");
}
