#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, idempotently:
#   apt packages -> .venv (Python 3.11) -> build deps + torch 2.13.0 (CPU) -> gpuprof built from
#   source (C++ core, extension, native CLI, C++ tests in build/py).
# Re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(g++ make libsqlite3-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
              libboost-dev zlib1g-dev libssl-dev libpq-dev postgresql
              libbenchmark-dev sqlite3 clang libjs-dygraphs)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing apt packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

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

# Build requirements and test tools (installed once; pip skips what is present).
want=(scikit-build-core nanobind cmake ninja pytest numpy ipython ipykernel nbclient nbformat)
if ! $PY -c "import scikit_build_core, nanobind, cmake, ninja, pytest, numpy, IPython, \
    ipykernel, nbclient, nbformat" >/dev/null 2>&1; then
  $PY -m pip install -q "${want[@]}"
fi
# torch 2.13.0, CPU build (a local wheel on these machines; a bare 'torch' pulls CUDA builds).
if ! $PY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" \
    >/dev/null 2>&1; then
  $PY -m pip install -q "torch==2.13.0"
fi
# Trainer integrations' tests run against the real framework (after torch, so that pip keeps
# the CPU torch above and does not pull a CUDA one).
if ! $PY -c "import lightning, transformers, accelerate, wandb, sys; sys.exit(0 if (
    lightning.__version__, transformers.__version__, accelerate.__version__,
    wandb.__version__) == ('2.6.6', '5.25.0', '1.16.0', '0.31.0') else 1)" >/dev/null 2>&1; then
  $PY -m pip install -q "lightning==2.6.6" "transformers==5.25.0" "accelerate==1.16.0" \
    "wandb==0.31.0"
fi
# DeepSpeed without its prebuilt CUDA ops (its CPU accelerator JIT-builds what it needs).
if ! $PY -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('deepspeed') == \
    '0.19.0' else 1)" >/dev/null 2>&1; then
  DS_BUILD_OPS=0 $PY -m pip install -q "deepspeed==0.19.0"
fi

# --- browser tests (tests/browser: linescope's HTML report in headless Chromium) -------------
# Debian's chromium + PyPI playwright driving it (executable_path=/usr/bin/chromium); playwright
# never downloads a browser here. Skip with BROWSER_TESTS=0.
if [ "${BROWSER_TESTS:-1}" != "0" ]; then
  if ! dpkg -s chromium >/dev/null 2>&1; then
    echo "setup: installing apt package chromium (browser tests)"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
  if ! $PY -c "import playwright.sync_api" >/dev/null 2>&1; then
    $PY -m pip install -q playwright
  fi
fi
# --- end browser tests -----------------------------------------------------------------------

# gpuprof from source. build/py is kept between runs, so this is incremental.
echo "setup: building gpuprof (C++ core, extension, CLI, C++ tests)"
$PY -m pip install -q --no-build-isolation --no-deps \
  -Ccmake.define.GPUPROF_BUILD_TESTS=ON -Cbuild.verbose=false . 
echo "setup: ready ($($PY -c 'import gpuprof; print("gpuprof", gpuprof.__version__)'))"

# linescope's sys.monitoring path needs Python 3.12+: light venvs (no torch) for 3.12 and 3.13
# with gpuprof built into each from the same sources (own build dirs; the first build compiles
# the core again, later runs are incremental). 3.13 also checks the interpreter-internal parts
# (frame reading, the pending call without a breaker poke). Skip with LINESCOPE_PY312=0 /
# LINESCOPE_PY313=0; a Python that is not installed is skipped with a note.
light_venv() {  # light_venv VENV BASE_PYTHON BUILD_DIR
  local venv="$1" base="$2" build="$3"
  if [ ! -x "$base" ]; then
    echo "setup: $base not found: $venv skipped (linescope is then tested on fewer Pythons)"
    return 0
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating $venv with $($base --version)"
    "$base" -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import scikit_build_core, nanobind, cmake, ninja, pytest, IPython" \
      >/dev/null 2>&1; then
    "$venv/bin/python" -m pip install -q scikit-build-core nanobind cmake ninja pytest ipython
  fi
  echo "setup: building gpuprof for $($venv/bin/python --version) ($build; linescope's tests)"
  "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps \
    -Cbuild-dir="$build" -Ccmake.define.GPUPROF_BUILD_CLI=OFF -Cbuild.verbose=false .
}
if [ "${LINESCOPE_PY312:-1}" != "0" ]; then
  light_venv .venv312 "${PY312_BASE:-/root/.pyenv/versions/3.12.1/bin/python}" build/py312
fi
if [ "${LINESCOPE_PY313:-1}" != "0" ]; then
  light_venv .venv313 "${PY313_BASE:-/root/.pyenv/versions/3.13.0/bin/python}" build/py313
fi

# --- linescope `scalene` backend (optional extra gpuprof[scalene]; its tests skip without it) ---
# Scalene (PyPI, >= 2.0; supports Python 3.11-3.14) into every venv. Skip with LINESCOPE_SCALENE=0.
if [ "${LINESCOPE_SCALENE:-1}" != "0" ]; then
  for venv in .venv .venv312 .venv313; do
    if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c "import scalene" >/dev/null 2>&1; then
      echo "setup: installing scalene into $venv (linescope's scalene backend)"
      "$venv/bin/python" -m pip install -q "scalene>=2.0"
    fi
  done
fi
