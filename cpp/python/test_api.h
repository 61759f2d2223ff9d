// What the test-only extension `gpuprof._native_testing` (testing_module.cc) reads of the
// product's `gpuprof._native`: a table of plain functions behind an opaque capsule
// (`_native._test_api`), because the two modules are separate shared objects whose internal
// state is not shared. Nothing in the product calls these.
#pragma once

namespace gpuprof::python {

inline constexpr const char* kTestApiCapsule = "gpuprof._native._test_api";

struct TestApi {
  // 3.11's untraced-eval hook (eval_hook.h): frames started untraced since the line tracer's
  // last start, and why the hook stood aside (nullptr: it did not); 0 / nullptr on 3.12+.
  long long (*untraced_eval_count)() noexcept;
  const char* (*untraced_eval_aside)() noexcept;
};

}  // namespace gpuprof::python
