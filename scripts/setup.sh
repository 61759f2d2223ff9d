#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, idempotently and reproducibly:
#   apt packages (only what pip cannot give) -> .venv (Python 3.11) -> pinned build/test tools
#   (scripts/requirements-*.txt) + torch 2.13.0 (CPU) -> gpuprof built from source (C++ core,
#   extension, native CLI, C++ tests in build/cp311-cp311-<platform>) -> the 3.12/3.13 venvs.
# A second run installs nothing that is already there and rebuilds only when a source changed.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {  # apt_install PKG... : the ones not installed yet
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing apt packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}
# Compiler and make; the server's libraries (Boost headers, zlib, OpenSSL, libjs-dygraphs) and
# PostgreSQL (client library, and the server for the tests' throwaway cluster); GoogleTest and
# Google Benchmark; clang (fuzzing, sanitizers) and clang-format (make lint). SQLite,
# nlohmann-json and CLI11 are vendored (third_party/), CMake and ninja come from pip.
apt_install g++ make libgtest-dev libgmock-dev libboost-dev zlib1g-dev libssl-dev libpq-dev \
  postgresql libbenchmark-dev clang clang-format libjs-dygraphs openjdk-17-jre-headless

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PYTHON="$cand"; break; fi
  done
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
PY=.venv/bin/python

# pinned VENV_PY REQUIREMENTS_FILE [ENV=VALUE...]: installs the file's pins unless every one of
# them is installed at exactly that version already.
pinned() {
  local py="$1" req="$2"; shift 2
  if ! "$py" - "$req" <<'PYEOF' >/dev/null 2>&1
import sys
from importlib import metadata
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    have = metadata.version(name)
    if have != want and not have.startswith(want + "+"):
        sys.exit(1)
PYEOF
  then
    echo "setup: installing $req into $(dirname "$(dirname "$py")")"
    env "$@" "$py" -m pip install -q -r "$req"
  fi
}
pinned $PY scripts/requirements-dev.txt
# torch first (CPU wheel), then the trainer frameworks, one at a time in the file's order so that
# pip never replaces this torch with a CUDA build.
if ! $PY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" \
    >/dev/null 2>&1; then
  $PY -m pip install -q "torch==2.13.0"
fi
pinned $PY scripts/requirements-frameworks.txt DS_BUILD_OPS=0
# linescope's Spark tests (tests/linescope/test_linescope_spark.py): pyspark in .venv only; its
# Java runtime is openjdk-17-jre-headless above.
pinned $PY scripts/requirements-spark.txt

# --- browser tests (tests/browser: the HTML report and the dashboard in headless Chromium) -----
# Debian's chromium + PyPI playwright (pinned above) driving it (executable_path=/usr/bin/chromium);
# playwright never downloads a browser here. Skip with BROWSER_TESTS=0.
if [ "${BROWSER_TESTS:-1}" != "0" ]; then
  apt_install chromium
fi

# install_gpuprof VENV_PY [pip -C options...]: builds and installs gpuprof from this tree unless
# the installed copy was built from exactly these sources with these options (a stamp beside
# the venv: the hash of every tracked and untracked-unignored file the build reads).
install_gpuprof() {
  local py="$1"; shift
  local venv stamp want
  venv="$(dirname "$(dirname "$py")")"
  stamp="$venv/.gpuprof-build-stamp"
  want="$( { echo "$*"; git ls-files -co --exclude-standard -- CMakeLists.txt pyproject.toml \
    cpp python web third_party README.md LICENSE | sort | xargs -d '\n' sha1sum 2>/dev/null; } |
    sha1sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && \
     "$py" -c "import gpuprof._native" >/dev/null 2>&1; then
    echo "setup: gpuprof in $venv is up to date with the sources"
    return 0
  fi
  echo "setup: building gpuprof for $($py --version) into $venv"
  "$py" -m pip install -q --no-build-isolation --no-deps -Cbuild.verbose=false "$@" .
  echo "$want" > "$stamp"
}

# gpuprof from source, incremental (pyproject.toml: build-dir = build/{wheel_tag}).
install_gpuprof $PY -Ccmake.define.GPUPROF_BUILD_TESTS=ON -Ccmake.define.GPUPROF_TEST_HOOKS=ON
echo "setup: ready ($($PY -c 'import gpuprof; print("gpuprof", gpuprof.__version__)'))"

# linescope's sys.monitoring path needs Python 3.12+: light venvs (no torch) for 3.12 and 3.13
# with gpuprof built into each from the same sources (their own build dirs, by wheel tag). 3.13
# also checks the interpreter-internal parts (frame reading, the pending call without a breaker
# poke). Skip with LINESCOPE_PY312=0 / LINESCOPE_PY313=0; a Python that is not installed is
# skipped with a note.
light_venv() {  # light_venv VENV BASE_PYTHON
  local venv="$1" base="$2"
  if [ ! -x "$base" ]; then
    echo "setup: $base not found: $venv skipped (linescope is then tested on fewer Pythons)"
    return 0
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating $venv with $($base --version)"
    "$base" -m venv "$venv"
  fi
  pinned "$venv/bin/python" scripts/requirements-light.txt
  install_gpuprof "$venv/bin/python" -Ccmake.define.GPUPROF_BUILD_CLI=OFF \
    -Ccmake.define.GPUPROF_TEST_HOOKS=ON
}
PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"
if [ "${LINESCOPE_PY312:-1}" != "0" ]; then
  light_venv .venv312 "${PY312_BASE:-$PYENV_ROOT/versions/3.12.1/bin/python}"
fi
if [ "${LINESCOPE_PY313:-1}" != "0" ]; then
  light_venv .venv313 "${PY313_BASE:-$PYENV_ROOT/versions/3.13.0/bin/python}"
fi

# --- linescope `scalene` backend (optional extra gpuprof[scalene]; its tests skip without it) ---
# Scalene (scripts/requirements-scalene.txt) into every venv. Skip with
# LINESCOPE_SCALENE=0.
if [ "${LINESCOPE_SCALENE:-1}" != "0" ]; then
  for venv in .venv .venv312 .venv313; do
    if [ -x "$venv/bin/python" ]; then
      pinned "$venv/bin/python" scripts/requirements-scalene.txt
    fi
  done
fi
