// Python str -> std::string for names and paths read from code objects (cold paths only).
#pragma once

#include <Python.h>

#include <string>

namespace gpuprof::python {

// The UTF-8 text of `s`; empty when `s` is null, not a str, or not encodable (the error is
// cleared: callers treat an empty name as unknown).
inline std::string Utf8OrEmpty(PyObject* s) {
  if (s == nullptr || !PyUnicode_Check(s)) return {};
  Py_ssize_t n = 0;
  const char* c = PyUnicode_AsUTF8AndSize(s, &n);
  if (c == nullptr) {
    PyErr_Clear();
    return {};
  }
  return std::string(c, static_cast<size_t>(n));
}

}  // namespace gpuprof::python
