// Paths the line filters need from the running interpreter (cold: read at construction).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

namespace gpuprof::python {

// The interpreter's standard-library directories (sysconfig's `stdlib` and `platstdlib`),
// which lines::PathFilter treats as library code, like site-packages. Empty when sysconfig
// cannot say (the filter then only knows site-/dist-packages). GIL held.
inline std::vector<std::string> InterpreterLibraryDirs() {
  namespace nb = nanobind;
  std::vector<std::string> out;
  try {
    nb::object paths = nb::module_::import_("sysconfig").attr("get_paths")();
    for (const char* key : {"stdlib", "platstdlib"}) {
      nb::object v = paths.attr("get")(key);
      if (nb::isinstance<nb::str>(v)) out.push_back(nb::cast<std::string>(v));
    }
  } catch (const nb::python_error&) {
    // discarded with the exception object
  }
  return out;
}

}  // namespace gpuprof::python
