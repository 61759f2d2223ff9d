#!/usr/bin/env bash
# `make test-wheel`: the wheel that `pip wheel .` builds installs into a fresh venv and runs there.
# Reuses the 3.11 build directory (pyproject.toml: build/{wheel_tag}), so after `make setup` the
# wheel is only packed, not compiled. The fresh venv gets the wheel and torch 2.13.0 (CPU) and
# nothing of this tree; the checks run outside the tree:
#   gpuprof version == pyproject's version == gpuprof.__version__ == linescope.__version__;
#   the licences are in the wheel; `import gpuprof, linescope`; the CPU demo trains and prints
#   insights; `gpuprof insights` reads its run; linescope profiles a function.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
PY="${PY:-.venv/bin/python}"
WORK="$(mktemp -d /tmp/gpuprof-wheel.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

want="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
echo "wheel: pip wheel . (version $want)"
t0=$SECONDS
# The test build's options (nothing recompiles) minus the test-only module.
"$PY" -m pip wheel -q --no-build-isolation --no-deps -Ccmake.define.GPUPROF_BUILD_TESTS=ON \
  -Ccmake.define.GPUPROF_TEST_HOOKS=OFF -Cbuild.verbose=false -w "$WORK/dist" .
whl="$(ls "$WORK"/dist/gpuprof-"$want"-*.whl)"
echo "wheel: built $(basename "$whl") in $((SECONDS - t0)) s"

# The licences travel with the wheel.
"$PY" - "$whl" <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["LICENSE", "third_party/sqlite/LICENSE.md", "third_party/nlohmann_json/LICENSE",
        "third_party/cli11/LICENSE"]
missing = [n for n in need if not any(x.endswith(".dist-info/licenses/" + n) for x in names)]
assert not missing, f"licences missing from the wheel: {missing}"
assert not any("/tests/" in x or "_native_testing" in x for x in names), "test code in the wheel"
assert "gpuprof/_ddp_hook.cpp" in names, "the native DDP hook's source is not in the wheel"
print(f"wheel: {len(names)} files, licences present")
PYEOF

base="$("$PY" -c 'import sys; print(sys._base_executable)')"
"$base" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/python" -m pip install -q "$whl"
"$V/python" -m pip install -q "torch==2.13.0"

cd "$WORK"
got="$("$V/gpuprof" version)"
echo "wheel: $got"
case "$got" in "gpuprof $want "*) ;; *) echo "wheel: gpuprof version says '$got', want $want"; exit 1;; esac
cat > check_install.py <<'PYEOF'
import sys
import gpuprof, linescope
want = sys.argv[1]
assert gpuprof.__version__ == want, (gpuprof.__version__, want)
assert linescope.__version__ == want, (linescope.__version__, want)
assert gpuprof.__file__.startswith(sys.prefix), gpuprof.__file__
print(f"wheel: import gpuprof, linescope: {want} from {sys.prefix}")
from linescope import profile


def work():
    total = 0
    for i in range(20000):
        total += i * i
    return total


with profile(display="none") as session:
    work()
assert session.result.lines, "linescope recorded no line"
print(f"wheel: linescope recorded {len(session.result.lines)} lines")
PYEOF
"$V/python" check_install.py "$want"
cp "$REPO/examples/train_cpu.py" "$WORK/"
"$V/python" train_cpu.py > demo.out 2>&1 || { cat demo.out; exit 1; }
grep -q "gpuprof" demo.out || { cat demo.out; echo "wheel: the demo printed no summary"; exit 1; }
"$V/gpuprof" insights > insights.out || { cat insights.out; exit 1; }
grep -q -i "dataloader\|loader" insights.out || { cat insights.out; echo "wheel: no insight"; exit 1; }
echo "wheel: the CPU demo ran from the wheel; gpuprof insights:"
head -5 insights.out
# The native DDP comm hook builds from the installed package against the installed torch, as
# a user builds it (ninja from pip; the environment not activated).
"$V/python" -m pip install -q ninja
GPUPROF_CACHE_DIR="$WORK/cache" "$V/python" -m gpuprof.ddp_hook build
GPUPROF_CACHE_DIR="$WORK/cache" "$V/python" -m gpuprof.ddp_hook status
echo "wheel: OK"
