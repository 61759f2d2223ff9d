#!/usr/bin/env bash
# GPU validation of gpuprof in one prepared command (see bench/gpu/README.md):
#
#   bash bench/gpu/run.sh                       # on the GPU machine, from the repo root
#   GPU_RUN_DRY=1 bash bench/gpu/run.sh         # here: no build, existing .venv, checks --dry-run
#
# Steps, each time-boxed with `timeout`, logged to $OUT/<step>.log, continuing on failure:
#   env      nvidia-smi, python/torch, dev packages, cmake/ninja/compiler    -> env.log
#   build    venv (--system-site-packages) + pip install --no-build-isolation
#            --no-deps . with the C++ tests, -j16                            -> build.log
#   checks   bench/gpu/checks.py (the GPU checks; before the CPU suites so
#            that a slow test suite can never eat the GPU time)              -> checks.log
#   ctest    ctest --test-dir build/gpu                                      -> ctest.log
#   pytest   pytest on the GPU-relevant suites (GPU_PYTEST_ARGS=tests: all)  -> pytest.log
#   report   $OUT/report.md + $OUT/results.json (always; also after failures)
#
# $OUT (default ./bench/gpu/out) receives at most 8 files: the 5 logs, report.md, results.json
# and gpuprof_checks.db. Scratch (step table, check results, DB) lives in $GPUPROF_GPU_WORK.
# The whole run keeps to GPU_RUN_BUDGET_S seconds (default 480): each step's timeout is its own
# cap or what is left after reserving time for the steps behind it, whichever is smaller.
set -u -o pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO" || exit 2

export OUT="${OUT:-$REPO/bench/gpu/out}"
export GPUPROF_GPU_WORK="${GPUPROF_GPU_WORK:-/tmp/gpuprof-gpu-work}"
export GPUPROF_GPU_VENV="${GPUPROF_GPU_VENV:-/tmp/gpuprof-gpu-venv}"
export GPU_RUN_DRY="${GPU_RUN_DRY:-0}"
export GPU_RUN_BUDGET_S="${GPU_RUN_BUDGET_S:-480}"
export PYTHONUNBUFFERED=1
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1  # no network there
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-16}"
if [ -z "${PYTHON:-}" ]; then
  if [ "$GPU_RUN_DRY" = 1 ] && [ -x "$REPO/.venv/bin/python" ]; then
    PYTHON="$REPO/.venv/bin/python"
  else
    PYTHON="$(command -v python3 || command -v python || echo python3)"
  fi
fi
export PYTHON
VPY="$GPUPROF_GPU_VENV/bin/python"
# The GPU machine's own build dir (the local builds use pyproject's build/{wheel_tag});
# GPUPROF_GPU_BUILD_DIR moves it.
BUILD_DIR="${GPUPROF_GPU_BUILD_DIR:-$REPO/build/gpu}"

note_of() {  # note_of STEP: the step's note on one line, or nothing
  local f="$GPUPROF_GPU_WORK/notes/$1"
  if [ -f "$f" ]; then tr '\t\n' '  ' <"$f"; fi
}
note() {  # note STEP TEXT: one line shown in the step table of report.md
  mkdir -p "$GPUPROF_GPU_WORK/notes"
  echo "$2" >"$GPUPROF_GPU_WORK/notes/$1"
  echo "NOTE: $2"
}

# ---- prerequisites ------------------------------------------------------------------------
# The GPU machine has no package registry. Debian packages of the C++ dev dependencies can travel
# with the tree in $GPUPROF_GPU_DEBS (default .debs/, git-ignored; the run tool's `carry`):
#   mkdir -p .debs && (cd .debs && apt-get download libsqlite3-dev libsqlite3-0 \
#     nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev)
# Those the machine lacks are unpacked (dpkg -x, never into /) under $DEPS and found by CMake
# through CMAKE_PREFIX_PATH; libsqlite3.so.0 goes on LD_LIBRARY_PATH only if the system has none.
DEBS_DIR="${GPUPROF_GPU_DEBS:-$REPO/.debs}"
DEPS="$GPUPROF_GPU_WORK/deps"
DEPS_LIB="$DEPS/usr/lib/x86_64-linux-gnu"
pkg_ok() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
find_cmake_config() {  # find_cmake_config NAME [ROOTS...]: a <NAME>Config.cmake / <name>-config.cmake
  local name=$1 lower
  shift
  lower="$(echo "$name" | tr '[:upper:]' '[:lower:]')"
  local roots=("$@")
  [ ${#roots[@]} -gt 0 ] || roots=(/usr/lib /usr/share /usr/local/lib /usr/local/share /opt)
  find "${roots[@]}" -maxdepth 6 \
    \( -name "${name}Config.cmake" -o -name "${lower}-config.cmake" \) 2>/dev/null | head -1
}
sys_has() {  # sys_has sqlite|json|cli11|gtest: the machine itself provides it
  case $1 in
    sqlite) pkg_ok libsqlite3-dev || { [ -f /usr/include/sqlite3.h ] &&
              ls /usr/lib/*/libsqlite3.so /usr/lib/libsqlite3.so >/dev/null 2>&1; } ;;
    json) pkg_ok nlohmann-json3-dev || [ -n "$(find_cmake_config nlohmann_json)" ] ;;
    cli11) pkg_ok libcli11-dev || [ -n "$(find_cmake_config CLI11)" ] ;;
    gtest) { pkg_ok libgtest-dev && pkg_ok libgmock-dev; } || [ -n "$(find_cmake_config GTest)" ] ;;
  esac
}
deps_has() {  # deps_has sqlite|json|cli11|gtest: unpacked under $DEPS
  case $1 in
    sqlite) [ -f "$DEPS/usr/include/sqlite3.h" ] && [ -e "$DEPS_LIB/libsqlite3.so" ] ;;
    json) [ -n "$(find_cmake_config nlohmann_json "$DEPS")" ] ;;
    cli11) [ -n "$(find_cmake_config CLI11 "$DEPS")" ] ;;
    gtest) [ -n "$(find_cmake_config GTest "$DEPS")" ] ;;
  esac
}
unpack_carried_deps() {  # runs once, in the driver, before any step
  [ "$GPU_RUN_DRY" = 1 ] && return 0
  if [ ! -d "$DEBS_DIR" ]; then echo "deps: nothing carried ($DEBS_DIR absent)"; return 0; fi
  rm -rf "$DEPS"
  local what debs deb used=()
  for what in sqlite json cli11 gtest; do
    sys_has $what && continue
    case $what in
      sqlite) debs="libsqlite3-dev_ libsqlite3-0_" ;;
      json) debs="nlohmann-json3-dev_" ;;
      cli11) debs="libcli11-dev_" ;;
      gtest) debs="libgtest-dev_ libgmock-dev_" ;;
    esac
    for deb in $debs; do
      for f in "$DEBS_DIR/$deb"*.deb; do
        [ -f "$f" ] || { echo "deps: $what missing and no $deb*.deb carried"; continue; }
        mkdir -p "$DEPS"
        dpkg -x "$f" "$DEPS" && used+=("$(basename "$f")") || echo "deps: dpkg -x $f failed"
      done
    done
  done
  if [ ${#used[@]} -eq 0 ]; then echo "deps: the machine has every dev package"; return 0; fi
  export CMAKE_PREFIX_PATH="$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  if [ -e "$DEPS_LIB/libsqlite3.so.0" ] && ! ldconfig -p 2>/dev/null | grep -q 'libsqlite3\.so\.0 '; then
    export LD_LIBRARY_PATH="$DEPS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  echo "deps: unpacked ${used[*]} under $DEPS (CMAKE_PREFIX_PATH=$CMAKE_PREFIX_PATH${LD_LIBRARY_PATH:+, LD_LIBRARY_PATH=$LD_LIBRARY_PATH})"
  mkdir -p "$GPUPROF_GPU_WORK/notes"
  echo "carried dev packages: ${used[*]}" >"$GPUPROF_GPU_WORK/notes/deps"
}
# Optional Python packages the image lacks (Scalene and what it needs beyond the image) travel as
# cp312 wheels in $GPUPROF_GPU_WHEELS (default .whl/, git-ignored; see README.md); they are
# installed with --target into scratch and put on PYTHONPATH. Without them the scalene check skips.
WHL_DIR="${GPUPROF_GPU_WHEELS:-$REPO/.whl}"
install_carried_wheels() {  # runs once, in the driver, before any step
  [ "$GPU_RUN_DRY" = 1 ] && return 0
  if ! ls "$WHL_DIR"/*.whl >/dev/null 2>&1; then echo "wheels: none carried ($WHL_DIR)"; return 0; fi
  local site="$GPUPROF_GPU_WORK/site"
  rm -rf "$site"
  if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHL_DIR"/*.whl; then
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "wheels: $(cd "$WHL_DIR" && ls -- *.whl | tr '\n' ' ')-> $site (PYTHONPATH)"
  else
    echo "wheels: pip install --target failed; the checks that need them skip"
  fi
}
detect_prereqs() {  # sets HAVE_* and MISSING_HARD / MISSING_SOFT
  HAVE_SQLITE=0; HAVE_JSON=0; HAVE_CLI11=0; HAVE_GTEST=0; HAVE_PYH=0; HAVE_CMAKE=0; HAVE_CXX=0
  # SQLite, nlohmann-json and CLI11 are vendored (third_party/): always there.
  HAVE_SQLITE=1; HAVE_JSON=1; HAVE_CLI11=1
  { sys_has gtest || deps_has gtest; } && HAVE_GTEST=1
  local inc
  inc="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)"
  [ -n "$inc" ] && [ -f "$inc/Python.h" ] && HAVE_PYH=1
  { command -v cmake >/dev/null 2>&1 || "$PYTHON" -c "import cmake" >/dev/null 2>&1; } && HAVE_CMAKE=1
  { command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1; } && HAVE_CXX=1
  MISSING_HARD=(); MISSING_SOFT=()
  [ $HAVE_SQLITE = 1 ] || MISSING_HARD+=("libsqlite3-dev")
  [ $HAVE_JSON = 1 ] || MISSING_HARD+=("nlohmann-json3-dev")
  [ $HAVE_PYH = 1 ] || MISSING_HARD+=("Python.h (python3-dev for $PYTHON, include dir '$inc')")
  [ $HAVE_CMAKE = 1 ] || MISSING_HARD+=("cmake")
  [ $HAVE_CXX = 1 ] || MISSING_HARD+=("g++")
  [ $HAVE_CLI11 = 1 ] || MISSING_SOFT+=("libcli11-dev (no gpuprof CLI: MFU check cannot read insights)")
  [ $HAVE_GTEST = 1 ] || MISSING_SOFT+=("libgtest-dev/libgmock-dev (no C++ tests, no fake NVML for pytest)")
}

# ---- steps (each runs as `bash run.sh __step NAME` under timeout) --------------------------
step_env() {
  echo "== host"; date -u; uname -a; echo "nproc: $(nproc)"; free -g 2>/dev/null | head -2
  echo; echo "== nvidia-smi -L"; nvidia-smi -L 2>&1
  echo; echo "== nvidia-smi query"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1
  echo; echo "== nvidia-smi -q -d CLOCK,POWER,TEMPERATURE (head)"
  nvidia-smi -q -d CLOCK,POWER,TEMPERATURE 2>&1 | head -90
  echo; echo "== NVML library"; ldconfig -p 2>/dev/null | grep -i nvidia-ml || echo "libnvidia-ml not in ldconfig cache"
  echo; echo "== python: $PYTHON"
  "$PYTHON" - <<'EOF' 2>&1
import sys, sysconfig, os, importlib
print("python", sys.version.replace("\n", " "))
print("prefix", sys.prefix, "base_prefix", sys.base_prefix, "(a venv)" if sys.prefix != sys.base_prefix else "")
inc = sysconfig.get_paths()["include"]
print("include", inc, "Python.h", os.path.exists(os.path.join(inc, "Python.h")))
for m in ("torch", "nanobind", "scikit_build_core", "pytest", "cmake", "ninja", "pynvml"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:18s}", getattr(mod, "__version__", "?"), getattr(mod, "__file__", ""))
    except Exception as e:
        print(f"{m:18s} MISSING ({e})")
try:
    import torch
    print("torch.cuda.is_available", torch.cuda.is_available(), "torch.version.cuda", torch.version.cuda)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print("device", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs",
              round(p.total_memory / 2**30, 1), "GiB")
except Exception as e:
    print("torch check failed:", e)
EOF
  echo; echo "== dev packages (dpkg)"
  for p in g++ libsqlite3-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev python3-dev; do
    printf '%-20s %s\n' "$p" "$(dpkg-query -W -f='${Status} ${Version}' "$p" 2>&1)"
  done
  echo; echo "== headers / cmake configs"
  for h in /usr/include/sqlite3.h /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp /usr/include/gtest/gtest.h; do
    [ -e "$h" ] && echo "present  $h" || echo "MISSING  $h"
  done
  for c in nlohmann_json CLI11 GTest; do echo "$c config: $(find_cmake_config "$c")"; done
  echo; echo "== carried packages"
  echo "CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} PYTHONPATH=${PYTHONPATH:-}"
  cat "$GPUPROF_GPU_WORK/notes/deps" 2>/dev/null || echo "no dev packages unpacked"
  echo; echo "== tools"
  for t in cmake ninja g++ c++ ctest nvcc; do printf '%-6s %s\n' "$t" "$(command -v "$t" || echo MISSING)"; done
  cmake --version 2>&1 | head -1; ninja --version 2>&1 | head -1; g++ --version 2>&1 | head -1
  echo; echo "== verdict"
  detect_prereqs
  echo "HAVE_SQLITE=$HAVE_SQLITE HAVE_JSON=$HAVE_JSON HAVE_CLI11=$HAVE_CLI11 HAVE_GTEST=$HAVE_GTEST HAVE_PYH=$HAVE_PYH HAVE_CMAKE=$HAVE_CMAKE HAVE_CXX=$HAVE_CXX"
  if [ ${#MISSING_HARD[@]} -gt 0 ]; then note env "cannot build: missing ${MISSING_HARD[*]}"; fi
  if [ ${#MISSING_SOFT[@]} -gt 0 ]; then echo "degraded build: missing ${MISSING_SOFT[*]}"; fi
  return 0
}

make_venv() {
  if [ -x "$VPY" ] && "$VPY" -c "import torch" >/dev/null 2>&1; then
    echo "venv: reusing $GPUPROF_GPU_VENV"; return 0
  fi
  rm -rf "$GPUPROF_GPU_VENV"
  echo "venv: $PYTHON -m venv --system-site-packages $GPUPROF_GPU_VENV"
  "$PYTHON" -m venv --system-site-packages "$GPUPROF_GPU_VENV" ||
    { echo "venv: retrying without pip (ensurepip missing?)"; rm -rf "$GPUPROF_GPU_VENV";
      "$PYTHON" -m venv --system-site-packages --without-pip "$GPUPROF_GPU_VENV"; } || return 1
  # --system-site-packages exposes the *base* interpreter's packages. When $PYTHON is itself a
  # venv (the GPU image's python3 is /opt/torch/.venv/bin/python3), torch lives in that venv:
  # chain its site-packages (addsitedir also runs its .pth files) behind ours.
  "$PYTHON" - "$GPUPROF_GPU_VENV" <<'EOF'
import sys, sysconfig, pathlib, subprocess
venv = pathlib.Path(sys.argv[1])
if sys.prefix == sys.base_prefix:
    print("venv: base python is not a venv; --system-site-packages is enough")
    raise SystemExit(0)
parent = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
site = subprocess.run([str(venv / "bin" / "python"), "-c",
                       "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      capture_output=True, text=True, check=True).stdout.strip()
pth = pathlib.Path(site) / "zz_gpuprof_parent_venv.pth"
pth.write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in parent))
print(f"venv: {sys.prefix} is a venv; chained {parent} via {pth}")
EOF
  "$VPY" -c "import torch, nanobind, scikit_build_core; print('venv sees torch', torch.__version__, 'nanobind', nanobind.__version__, 'scikit-build-core', scikit_build_core.__version__)"
}

step_build() {
  detect_prereqs
  if [ ${#MISSING_HARD[@]} -gt 0 ]; then
    note build "cannot build: missing ${MISSING_HARD[*]} (no apt/pip downloads on this machine)"
    return 3
  fi
  make_venv || { note build "could not create a venv from $PYTHON with torch visible"; return 4; }
  local tests=ON cli=ON soft=""
  [ $HAVE_GTEST = 1 ] || { tests=OFF; soft+="no GTest: GPUPROF_BUILD_TESTS=OFF; "; }
  [ $HAVE_CLI11 = 1 ] || { cli=OFF; soft+="no CLI11: GPUPROF_BUILD_CLI=OFF; "; }
  [ -n "$soft" ] && note build "degraded build: $soft"
  "$VPY" -m pip --version || { note build "pip not usable in the venv"; return 4; }
  echo "build: pip install --no-build-isolation --no-deps . (tests=$tests cli=$cli, -j$CMAKE_BUILD_PARALLEL_LEVEL)"
  local t0=$SECONDS
  "$VPY" -m pip install -v --no-build-isolation --no-deps \
    -Ccmake.define.GPUPROF_BUILD_TESTS=$tests -Ccmake.define.GPUPROF_BUILD_CLI=$cli \
    -Cbuild.verbose=false -Cbuild-dir="$BUILD_DIR" . ||
    { note build "pip install failed (see build.log)"; return 5; }
  echo "build: pip install took $((SECONDS - t0)) s"
  (cd /tmp && "$VPY" -c "import gpuprof, gpuprof._native; print('import ok', gpuprof.__version__, gpuprof.__file__)") ||
    { note build "built, but 'import gpuprof._native' fails"; return 6; }
  if [ -x "$GPUPROF_GPU_VENV/bin/gpuprof" ]; then "$GPUPROF_GPU_VENV/bin/gpuprof" version; fi
  return 0
}

check_python() {  # the interpreter that runs checks.py: the venv with gpuprof, else $PYTHON
  if [ "$GPU_RUN_DRY" = 1 ]; then echo "$PYTHON"; return; fi
  if [ -x "$VPY" ] && (cd /tmp && "$VPY" -c "import gpuprof._native") >/dev/null 2>&1; then
    echo "$VPY"
  else
    echo "$PYTHON"
  fi
}

step_checks() {
  local py dry=()
  py="$(check_python)"
  [ "$GPU_RUN_DRY" = 1 ] && dry=(--dry-run)
  local only=()
  [ -n "${GPU_CHECKS_ONLY:-}" ] && only=(--only "$GPU_CHECKS_ONLY")
  echo "checks: $py bench/gpu/checks.py ${dry[*]} ${only[*]}"
  "$py" "$HERE/checks.py" --out "$OUT" --work "$GPUPROF_GPU_WORK" "${dry[@]}" "${only[@]}"
}

step_ctest() {
  if [ "$GPU_RUN_DRY" = 1 ]; then
    note ctest "dry run: not run (a dry run builds nothing)"; return 0
  fi
  if [ ! -f "$BUILD_DIR/CTestTestfile.cmake" ]; then
    note ctest "no $BUILD_DIR/CTestTestfile.cmake (build failed or tests off)"; return 7
  fi
  local ct
  ct="$(command -v ctest || "$PYTHON" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "ctest"))' 2>/dev/null)"
  [ -x "$ct" ] || { note ctest "no ctest executable (neither on PATH nor in the cmake package)"; return 7; }
  "$ct" --test-dir "$BUILD_DIR" --output-on-failure -j16 --timeout 60
}

step_pytest() {
  local py
  py="$(check_python)"
  if ! (cd /tmp && "$py" -c "import gpuprof._native") >/dev/null 2>&1; then
    note pytest "gpuprof not importable from $py (build failed)"; return 7
  fi
  # The suites that touch what differs on a GPU machine (telemetry, CUDA events, MFU, the
  # sampler's CUPTI/NVML paths); GPU_PYTEST_ARGS=tests runs everything (many minutes there:
  # each child process imports the CUDA build of torch). A hanging test is cut at 60 s when
  # pytest-timeout is installed (its thread method: the signal method arms an interval timer,
  # which the sampler's no-timer test sees), so the tracebacks still reach pytest.log.
  local extra=()
  "$py" -c "import pytest_timeout" >/dev/null 2>&1 && extra=(--timeout=60 --timeout-method=thread)
  # shellcheck disable=SC2086
  "$py" -m pytest ${GPU_PYTEST_ARGS:-tests/test_telemetry.py tests/test_cuda_timing.py \
    tests/test_mfu.py tests/linescope/test_linescope_sampler.py} \
    -q -ra --tb=short -p no:cacheprovider "${extra[@]}"
}

step_report() {
  local py
  py="$(check_python)"
  "$py" "$HERE/checks.py" --report-only --out "$OUT" --work "$GPUPROF_GPU_WORK"
}

if [ "${1:-}" = "__step" ]; then
  "step_$2"
  exit $?
fi

# ---- driver -------------------------------------------------------------------------------
SECONDS=0
mkdir -p "$OUT" "$GPUPROF_GPU_WORK"
rm -rf "$GPUPROF_GPU_WORK/notes" "$GPUPROF_GPU_WORK/steps.tsv"
rm -f "$OUT"/*.log "$OUT/report.md" "$OUT/results.json" "$OUT/gpuprof_checks.db"
echo "[gpu-run +0s] OUT=$OUT WORK=$GPUPROF_GPU_WORK PYTHON=$PYTHON dry=$GPU_RUN_DRY budget=${GPU_RUN_BUDGET_S}s"

skip_step() {  # skip_step NAME TIMEOUT_S LOG REASON: a "skipped" row in the step table
  echo "[gpu-run +${SECONDS}s] $1: SKIPPED ($4)"
  note "$1" "skipped: $4"
  printf '%s\tskipped\t-\t0\t%s\t%s\t%s\n' "$1" "$2" "$(basename "$3")" "$(note_of "$1")" \
    >>"$GPUPROF_GPU_WORK/steps.tsv"
}

run_step() {  # run_step NAME CAP_S RESERVE_S: timeout = min(CAP, budget - elapsed - RESERVE)
  local name=$1 cap=$2 reserve=$3 log="$OUT/$1.log" t start rc status
  [ "$name" = report ] && log="$GPUPROF_GPU_WORK/report.log"
  if [[ " ${GPU_RUN_SKIP:-} " == *" $name "* ]]; then
    skip_step "$name" 0 "$log" "GPU_RUN_SKIP"
    return
  fi
  t=$((GPU_RUN_BUDGET_S - SECONDS - reserve))
  [ "$t" -gt "$cap" ] && t=$cap
  start=$SECONDS
  if [ "$t" -lt 5 ]; then
    skip_step "$name" "$t" "$log" "no time left in the ${GPU_RUN_BUDGET_S}s budget"
    return
  fi
  echo "[gpu-run +${SECONDS}s] $name: start (timeout ${t}s, log $(basename "$log"))"
  timeout -k 10 "$t" bash "$HERE/run.sh" __step "$name" >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status=timeout; note "$name" "killed after ${t}s (timeout)" ;;
    *) status=failed ;;
  esac
  local n
  n="$(note_of "$name")"
  echo "[gpu-run +${SECONDS}s] $name: $status (rc $rc, $((SECONDS - start))s)${n:+ — $n}"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((SECONDS - start))" "$t" \
    "$(basename "$log")" "$n" >>"$GPUPROF_GPU_WORK/steps.tsv"
}

unpack_carried_deps
install_carried_wheels
run_step env 45 420
if [ "$GPU_RUN_DRY" = 1 ]; then
  skip_step build 0 "$OUT/build.log" "dry run: using $PYTHON with the installed gpuprof"
else
  run_step build 300 200   # leaves >= 200 s for checks (>= 150) + report
fi
run_step checks 300 45     # leaves time for ctest + report
run_step ctest 60 35
run_step pytest 100 15
run_step report 30 0
echo "[gpu-run +${SECONDS}s] done; files in $OUT:"
ls -la "$OUT"
echo
if [ -f "$OUT/report.md" ]; then
  # The tables only (the run tool returns the last 12,000 characters of output).
  grep -v -e '^<details>' -e '^</details>' "$OUT/report.md" | awk '/^```json/{skip=1} !skip{print} /^```$/{skip=0}'
else
  echo "report.md missing; step table:"; cat "$GPUPROF_GPU_WORK/steps.tsv"
fi
echo
cat "$GPUPROF_GPU_WORK/report.log" 2>/dev/null  # the compact summary, last
