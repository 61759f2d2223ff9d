#!/usr/bin/env bash
# The unit tests alone, in well under a minute on two cores, against the existing normal build
# (make setup); `make test` runs everything. Two parts:
#   ctest: every C++ test except the slow ones and those needing a service: the configure-and-
#     compile check build_without_server (~25 s), the SPSC ring's two-thread stress test (~13 s),
#     and the PostgreSQL suite with the cluster it starts;
#   pytest: linescope's API, tracer, frames, report, magic and memory tests, and gpuprof's manual
#     API, Neuron telemetry and nsys import (no torch import in the test process, no servers,
#     trainers, browsers or timed sampling runs), against the gpuprof installed in .venv.
# Prints the summaries (the full ctest output of a failure) and the wall time.
#   scripts/test_quick.sh
#   GPUPROF_BUILD_DIR: the build with the C++ tests (default: the first of build/cp311-* and
#     build/py that exists); the Python tests take the fake NVML and CUPTI from it too.
set -euo pipefail
cd "$(dirname "$0")/.."

build="${GPUPROF_BUILD_DIR:-}"
if [ -z "$build" ]; then
  for d in build/cp311-* build/py; do
    if [ -d "$d" ]; then build="$d"; break; fi
  done
fi
if [ -z "$build" ] || [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "test-quick: no C++ test build in ${build:-build/cp311-* or build/py} (make setup)" >&2
  exit 2
fi
GPUPROF_BUILD_DIR="$(cd "$build" && pwd)"
export GPUPROF_BUILD_DIR
ctest=.venv/bin/ctest
[ -x "$ctest" ] || ctest=ctest
PY=.venv/bin/python

slow='^(build_without_server|record_test\.SpscRingTest\.ProducerAndConsumerThreadsSeeEveryItemInOrder|pg_cluster_start|pg_cluster_stop)$|^pg_store_test\.'
py_tests=(
  tests/linescope/test_line_floor.py
  tests/linescope/test_linescope_api.py
  tests/linescope/test_linescope_frames.py
  tests/linescope/test_linescope_magic.py
  tests/linescope/test_linescope_memory.py
  tests/linescope/test_linescope_outside_root.py
  tests/linescope/test_linescope_report.py
  tests/linescope/test_linescope_trace.py
  tests/test_manual_api.py
  tests/test_neuron_telemetry.py
  tests/test_nsys_import.py
)

start=$SECONDS
status=0
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if "$ctest" --test-dir "$build" -j2 -E "$slow" --output-on-failure --timeout 60 >"$log" 2>&1; then
  grep -E 'tests passed' "$log" | sed "s|^|test-quick: ctest ($build): |"
else
  sed -n '/\*\*\*Failed\|\*\*\*Timeout\|\*\*\*Exception/,/^\[  FAILED  \] [0-9]* test/p' "$log"
  sed -n '/tests passed/,$p' "$log"
  status=1
fi
"$PY" -m pytest -q -p no:cacheprovider "${py_tests[@]}" >"$log" 2>&1 || { cat "$log"; status=1; }
tail -1 "$log" | sed 's/^/test-quick: pytest: /'
echo "test-quick: $([ $status -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit $status
