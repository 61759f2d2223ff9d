#!/usr/bin/env bash
# Fuzzes the ingest parser: builds the libFuzzer targets in build/fuzz (clang, ASan + UBSan;
# the first build takes minutes, later ones only what changed) and runs them for SECONDS in all
# (default 300):
# ingest_fuzz (cpp/server/ingest_fuzz.cc: the ingest endpoints over a temporary store) for five
# sixths, row_json_fuzz (the row decoder alone) for the rest. Each starts from
# build/fuzz/corpus/<target>, a copy of cpp/server/fuzz_corpus/ that keeps what earlier runs
# found. Prints libFuzzer's final stats; exits 1 on a finding (the input that caused it is in
# build/fuzz/artifacts/, its log in build/fuzz/<target>.log: rerun one input with
# `build/fuzz/cpp/server/ingest_fuzz FILE`).
# build/fuzz is also scripts/sanitize.sh's build (the C++ tests, the CLI and the Python extension
# under the same sanitizers), so it is configured with all of them; each script builds only the
# targets it runs, and what one compiled the other reuses.
#   scripts/fuzz.sh [SECONDS]      FUZZ_JOBS=N: parallel compile jobs (default 2)
#   scripts/fuzz.sh --configure    only (re)configure build/fuzz (scripts/sanitize.sh uses this)
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-300}"
build=build/fuzz
cmake=.venv/bin/cmake
[ -x "$cmake" ] || cmake=cmake
ninja=.venv/bin/ninja
[ -x "$ninja" ] || ninja="$(command -v ninja || true)"
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found (make setup installs clang)" >&2
  exit 2
fi

# Configured every time (a second or two; nothing rebuilds unless something changed). -O1 with
# line tables: symbolized reports, a quicker build; asserts stay on (no NDEBUG).
mkdir -p "$build"
gen=()
if [ ! -f "$build/CMakeCache.txt" ] && [ -n "$ninja" ]; then
  echo "fuzz: configuring $build (clang, ASan + UBSan + libFuzzer)"
  gen=(-G Ninja -DCMAKE_MAKE_PROGRAM="$(realpath "$ninja")")
fi
flags="-O1 -gline-tables-only"
# The extension is built for .venv's Python (make setup); without it, no extension.
py=(-DGPUPROF_BUILD_PYTHON=OFF)
[ -x .venv/bin/python ] && py=(-DGPUPROF_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PWD/.venv/bin/python")
CC=clang CXX=clang++ "$cmake" -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" \
  -DGPUPROF_BUILD_FUZZ=ON -DGPUPROF_SERVER=ON -DGPUPROF_BUILD_TESTS=ON -DGPUPROF_BUILD_CLI=ON \
  "${py[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 2; }
[ "$secs" = "--configure" ] && exit 0
echo "fuzz: building ingest_fuzz and row_json_fuzz in $build"
"$cmake" --build "$build" --target ingest_fuzz row_json_fuzz -j "${FUZZ_JOBS:-2}" \
  >"$build/build.log" 2>&1 || { tail -40 "$build/build.log" >&2; exit 2; }

rm -rf "$build/tmp"  # the stores of runs that crashed (a clean exit removes its own)
mkdir -p "$build/artifacts" "$build/tmp"
status=0
run() {  # run TARGET SECONDS
  local target="$1" t="$2" corpus="$build/corpus/$1" log="$build/$1.log"
  mkdir -p "$corpus"
  cp -n cpp/server/fuzz_corpus/* "$corpus/"
  echo "fuzz: $target for ${t}s (corpus $corpus)"
  touch "$build/artifacts/.start"
  # ASan/UBSan: report and stop at the first error, symbolized; libFuzzer keeps the input.
  if ASAN_OPTIONS="abort_on_error=1:detect_leaks=1" \
     UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" TMPDIR="$PWD/$build/tmp" \
     "$build/cpp/server/$target" "$corpus" -max_total_time="$t" -max_len=16384 \
       -rss_limit_mb=2048 -timeout=10 -dict=cpp/server/ingest_fuzz.dict \
       -artifact_prefix="$build/artifacts/$target-" -print_final_stats=1 >"$log" 2>&1; then
    # libFuzzer's last progress line (execs, coverage, corpus, exec/s) and its final stats
    grep -E '^#[0-9]+' "$log" | tail -1
    grep -E '^Done [0-9]+ runs|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' \
      "$log" | tr -s ' ' | paste -sd ' ' -
  else
    echo "fuzz: $target FOUND A PROBLEM (exit $?); the end of $log:" >&2
    tail -60 "$log" >&2
    find "$build/artifacts" -name "$target-*" -newer "$build/artifacts/.start" |
      sed 's|^|fuzz: input: |' >&2
    status=1
  fi
}
ingest_secs=$(( secs * 5 / 6 ))
[ "$ingest_secs" -lt 1 ] && ingest_secs=1
row_secs=$(( secs - ingest_secs ))
[ "$row_secs" -lt 1 ] && row_secs=1
run ingest_fuzz "$ingest_secs"
run row_json_fuzz "$row_secs"
exit $status
