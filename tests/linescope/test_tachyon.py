"""The `tachyon` backend (CPython 3.15's profiling.sampling): clear errors before anything
runs on older Pythons and for gpu=True; the sampling path itself needs Python 3.15+."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from linescope import backend_names, profile

OLD_PYTHON = sys.version_info < (3, 15)
NEEDS = (f"the 'tachyon' backend needs Python 3.15+ (profiling.sampling); "
         f"this is Python {platform.python_version()}")


def test_tachyon_and_scalene_are_registered():
    assert {"trace", "scalene", "tachyon"} <= set(backend_names())


@pytest.mark.skipif(not OLD_PYTHON, reason="the version error only exists before 3.15")
def test_old_python_is_a_clear_error_before_anything_runs():
    ran = []
    # WHEN a tachyon session starts on Python < 3.15
    with pytest.raises(RuntimeError) as e:
        with profile(backend="tachyon", display="none"):
            ran.append(1)
    # THEN the error names the version needed and this one, and the body never ran
    assert str(e.value) == NEEDS
    assert ran == []
    # nothing is left active: another session starts
    with profile(backend="trace", display="none"):
        pass


@pytest.mark.parametrize("explicit", [True, False])
def test_gpu_is_rejected_before_start(explicit):
    ran = []
    session = profile(backend="tachyon", gpu=True, display="none")
    # THEN gpu=True is refused (not warned about, as with trace) before the backend starts
    with pytest.raises(ValueError, match=r"'tachyon' does not support gpu=True"):
        if explicit:
            session.start()
        else:
            with session:
                ran.append(1)
    assert ran == [] and not session.running


def linescope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "linescope"
    assert exe.exists(), "the linescope console script is not installed (run make setup)"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.fixture
def marker_script(tmp_path):
    (tmp_path / "target.py").write_text("open('ran.txt', 'w').write('yes')\n")
    return tmp_path


def test_cli_gpu_with_tachyon_is_a_usage_error(marker_script):
    p = linescope("--backend", "tachyon", "--gpu", "target.py", cwd=marker_script)
    assert p.returncode == 2
    assert "does not support gpu=True" in p.stderr
    assert not (marker_script / "ran.txt").exists()


@pytest.mark.skipif(not OLD_PYTHON, reason="the version error only exists before 3.15")
def test_cli_on_old_python_is_a_usage_error(marker_script):
    p = linescope("--backend", "tachyon", "target.py", cwd=marker_script)
    assert p.returncode == 2
    assert NEEDS in p.stderr
    assert not (marker_script / "ran.txt").exists()


@pytest.mark.skipif(OLD_PYTHON, reason="profiling.sampling (Tachyon) needs Python 3.15+")
def test_hot_line_gets_most_samples(ws):  # pragma: no cover - no 3.15 here
    mod = ws.module("hot.py", """
        def hot(n):
            return sum(i * i % 7 for i in range(n))
        def main():
            return hot(5_000_000)
    """)
    with profile(backend="tachyon", root=ws.root, display="none") as s:
        mod.main()
    r = s.result
    hot = r.line("hot.py", 2)
    assert hot is not None and hot.samples and hot.hits is None
    mine = [l for l in r.lines if l.filename == hot.filename]
    assert hot.wall_time_ns >= 0.5 * max(l.wall_time_ns for l in mine)


def test_the_gpu_rejection_names_gpu_and_the_alternatives(marker_script):
    # GIVEN gpu=True with the tachyon backend, through the API and the command line
    with pytest.raises(ValueError) as err:
        with profile(backend="tachyon", gpu=True, display="none"):
            pass
    p = linescope("--backend", "tachyon", "--gpu", "target.py", cwd=marker_script)
    # THEN both say that it measures no GPU time or memory and which backends do
    for text in (str(err.value), p.stderr):
        assert "measures no GPU time or GPU memory" in text
        assert "--backend sampler or --backend scalene" in text
    assert p.returncode == 2 and not (marker_script / "ran.txt").exists()
