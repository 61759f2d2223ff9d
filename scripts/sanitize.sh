#!/usr/bin/env bash
# ASan + UBSan over the native code (clang; UB aborts, -fno-sanitize-recover=all):
#   1. builds build/fuzz, the build scripts/fuzz.sh fuzzes in (configured by `scripts/fuzz.sh
#      --configure`; the first build takes minutes, later ones only what changed): the C++ tests,
#      the CLI, the fake NVML/CUPTI libraries, the fuzz targets and the extensions;
#   2. runs the C++ tests under ctest, leak checking on (the PostgreSQL suite starts its
#      throwaway cluster as in the normal build; build_without_server is left to make test-cpp);
#   3. runs the pytest files that drive the native code hardest with .venv's Python importing the
#      sanitized extensions: linescope's tracer, sampler, report, CLI and memory tests, and
#      gpuprof's manual API, durability (signals, kill -9, fork), in-process dashboard and stall
#      tests. The package is staged in build/fuzz/python (links to python/ plus the extensions)
#      ahead of the installed one on PYTHONPATH, GPUPROF_BUILD_DIR points the tests at this
#      build's fake NVML and CUPTI, and clang's shared ASan runtime is preloaded (an
#      uninstrumented interpreter loading an instrumented module needs it first in the process).
#      CPython allocates through malloc (PYTHONMALLOC=malloc) so that ASan sees the objects the
#      extension touches; leak checking is off for CPython (it never frees its interned state).
#      Subprocesses that the tests start inherit all of this; the `gpuprof` CLI they run is the
#      normal build's (the sanitized CLI is covered by ctest's cli suites).
#      Left out: the team server's tests (a server and several client processes per test, and
#      PostgreSQL under the preloaded runtime: over 10 minutes; the server's code runs under
#      ctest's server_test and the fuzz targets), the Scalene backend (it preloads its own
#      allocator), the browser tests, and the torch-heavy suites (auto profiling, MFU, traces,
#      the trainer integrations): torch does work under ASan (the durability tests train with it
#      in their subprocesses) but its import takes seconds per process, and those suites are
#      mostly Python over the same native calls. Tests whose names say "fork" are deselected:
#      clang 14's ASan allocator is not fork-safe (see below).
# Tests that measure the process's RSS after a free run in a second pass with ASan's quarantine
# off: the quarantine keeps freed memory resident, by design, to catch use after free.
# Exits 1 on a failing test or a sanitizer report (printed with its stack; logs in build/fuzz).
#   scripts/sanitize.sh [cpp|py]     both parts by default
#   SANITIZE_JOBS=N: parallel compile and ctest jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

what="${1:-all}"
case "$what" in all|cpp|py) ;; *) echo "usage: $0 [cpp|py]" >&2; exit 2 ;; esac
build=build/fuzz
jobs="${SANITIZE_JOBS:-2}"
cmake=.venv/bin/cmake
[ -x "$cmake" ] || cmake=cmake
ctest=.venv/bin/ctest
[ -x "$ctest" ] || ctest=ctest
PY=.venv/bin/python

# Stop at the first error, with a symbolized stack.
ASAN_SYMBOLIZER_PATH="$(command -v llvm-symbolizer || true)"
export ASAN_SYMBOLIZER_PATH
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
asan_cpp="abort_on_error=1:detect_leaks=1"
asan_py="abort_on_error=1:detect_leaks=0"
no_quarantine="quarantine_size_mb=0"
# The RSS-after-free tests (see above): ctest names, and the pytest file.
rss_ctest='^lines_test\.LineSamplerTest\.(MemoryDeltasAndPeaksFollowAllocations|WithALineSourceRssReadingsGoToThePublishedLine)$'
rss_pytest=tests/linescope/test_linescope_memory.py
# Timing tests that share one core between two spinning threads: they run alone, in the
# second pass, so that ctest's parallel jobs do not add to the waits they measure.
timing_ctest='^telemetry\.CpuWaitReaderTest\.TwoBusyThreads'
# Not run here: build_without_server configures and compiles the tree anew with the default
# compiler (a build check with nothing sanitized; make test-cpp runs it).
skip_ctest='^build_without_server$'

report() {  # report LOG: the sanitizer reports and failures in LOG, to stderr
  grep -E -A40 '^==[0-9]+==ERROR|runtime error:' "$1" | head -150 >&2 || true
}

start=$SECONDS
bash scripts/fuzz.sh --configure
echo "sanitize: building $build (clang, ASan + UBSan)"
"$cmake" --build "$build" -j "$jobs" >"$build/sanitize_build.log" 2>&1 ||
  { grep -E -A12 '^FAILED|error:' "$build/sanitize_build.log" | head -80 >&2
    echo "sanitize: build failed (log: $build/sanitize_build.log)" >&2; exit 2; }
echo "sanitize: built in $((SECONDS - start)) s"
status=0

if [ "$what" != py ]; then
  t=$SECONDS
  log="$build/sanitize_ctest.log"
  echo "sanitize: C++ tests (ctest -j$jobs; log: $log)"
  ok=1
  ASAN_OPTIONS="$asan_cpp" "$ctest" --test-dir "$build" -j "$jobs" --output-on-failure \
    --timeout 600 -E "$rss_ctest|$timing_ctest|$skip_ctest" >"$log" 2>&1 || ok=0
  grep -E 'tests passed' "$log" | sed 's/^/sanitize: ctest: /'
  ASAN_OPTIONS="$asan_cpp:$no_quarantine" "$ctest" --test-dir "$build" --output-on-failure \
    --timeout 600 -R "$rss_ctest|$timing_ctest" >"$log.2" 2>&1 || ok=0
  grep -E 'tests passed' "$log.2" | sed 's/^/sanitize: ctest (RSS and timing tests, alone): /'
  if [ $ok -eq 0 ]; then
    cat "$log" "$log.2" | sed -n '/The following tests FAILED/,/^Errors/p' >&2
    cat "$log" "$log.2" >"$log.all"; report "$log.all"
    status=1
  fi
  echo "sanitize: ctest took $((SECONDS - t)) s"
fi

if [ "$what" != cpp ]; then
  t=$SECONDS
  log="$build/sanitize_pytest.log"
  # The package as installed, from links: python/gpuprof's files, the sanitized extensions
  # (_native and the test-only _native_testing), and python/linescope. Made afresh every run so
  # that files added to python/ are picked up.
  stage="$PWD/$build/python"
  rm -rf "$stage"
  mkdir -p "$stage/gpuprof"
  for f in python/gpuprof/*; do
    [ "$(basename "$f")" = __pycache__ ] || ln -s "$PWD/$f" "$stage/gpuprof/"
  done
  for ext in "$build"/cpp/python/_native*.so; do
    [ -f "$ext" ] && ln -s "$PWD/$ext" "$stage/gpuprof/"
  done
  ln -s "$PWD/python/linescope" "$stage/linescope"
  asan_rt="$(clang -print-file-name=libclang_rt.asan-x86_64.so)"
  [ -f "$asan_rt" ] || { echo "sanitize: clang's shared ASan runtime not found" >&2; exit 2; }
  # Only the interpreter (and what it starts) gets the runtime: not this script's own tools.
  py_asan() {  # py_asan ASAN_OPTIONS ARGS...
    ASAN_OPTIONS="$1" LD_PRELOAD="$asan_rt" PYTHONMALLOC=malloc GPUPROF_BUILD_DIR="$PWD/$build" \
      PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}" "$PY" "${@:2}"
  }
  # The interpreter must import the staged, sanitized package (not .venv's installed one).
  py_asan "$asan_py" -c "import gpuprof._native as n, sys; sys.exit(0 if \
n.__file__.startswith('$stage') else 'sanitize: imported ' + n.__file__ + ', not $stage')"
  py_tests=(
    tests/linescope/test_line_floor.py
    tests/linescope/test_linescope_api.py
    tests/linescope/test_linescope_cli.py
    tests/linescope/test_linescope_frames.py
    tests/linescope/test_linescope_magic.py
    tests/linescope/test_linescope_neuron.py
    tests/linescope/test_linescope_outside_root.py
    tests/linescope/test_linescope_report.py
    tests/linescope/test_linescope_sampler.py
    tests/linescope/test_linescope_trace.py
    tests/linescope/test_tachyon.py
    tests/test_manual_api.py
    tests/test_durability.py
    tests/test_inprocess_dashboard.py
    tests/test_stalls.py
  )
  echo "sanitize: Python tests against $build/cpp/python/_native*.so (log: $log)"
  ok=1
  # -k "not fork": clang 14's ASan allocator is not fork-safe; a child forked while another
  # thread holds its lock deadlocks in free() (seen in test_inprocess_dashboard's fork test).
  py_asan "$asan_py" -m pytest -q -p no:cacheprovider -k "not fork" "${py_tests[@]}" >"$log" 2>&1 ||
    ok=0
  tail -1 "$log" | sed 's/^/sanitize: pytest: /'
  py_asan "$asan_py:$no_quarantine" -m pytest -q -p no:cacheprovider "$rss_pytest" >"$log.2" 2>&1 ||
    ok=0
  tail -1 "$log.2" | sed 's/^/sanitize: pytest (RSS tests): /'
  if [ $ok -eq 0 ]; then
    cat "$log" "$log.2" >"$log.all"; report "$log.all"
    grep -E '^(FAILED|ERROR) ' "$log.all" >&2 || true
    status=1
  fi
  echo "sanitize: pytest took $((SECONDS - t)) s"
fi

echo "sanitize: $([ $status -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit $status
