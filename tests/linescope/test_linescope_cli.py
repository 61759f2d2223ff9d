"""The linescope CLI: the target runs as under plain python (argv, sys.path, exit status),
the output is written even when the target fails, and usage errors exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def linescope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "linescope"
    assert exe.exists(), "the linescope console script is not installed (run make setup)"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "target.py"
    path.write_text(
        "import json, sys, time\n"
        "def work():\n"
        "    time.sleep(0.02)\n"
        "work()\n"
        "json.dump({'argv': sys.argv, 'path0': sys.path[0], 'name': __name__},\n"
        "          open('seen.json', 'w'))\n"
        "if '--fail' in sys.argv:\n"
        "    raise RuntimeError('boom')\n"
        "sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)\n")
    return path


def test_script_argv_path_and_exit_status(script, tmp_path):
    # WHEN the script exits with status 3
    p = linescope("-d", "none", "-o", "out.json", "target.py", "--flag", "3", cwd=tmp_path)
    # THEN the status, argv and sys.path[0] are those of `python target.py --flag 3`
    assert p.returncode == 3, p.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": ["target.py", "--flag", "3"], "path0": str(tmp_path),
                    "name": "__main__"}
    data = json.loads((tmp_path / "out.json").read_text())
    lines = {(Path(l["filename"]).name, l["line"]): l for l in data["run"]["lines"]}
    assert lines[("target.py", 3)]["hits"] == 1
    assert lines[("target.py", 3)]["wall_time_ns"] >= 20_000_000
    assert data["backend"] == "trace"


def test_failing_script_still_writes_output(script, tmp_path):
    p = linescope("-d", "end", "-o", "out.json", "target.py", "--fail", cwd=tmp_path)
    assert p.returncode == 1
    assert "RuntimeError: boom" in p.stderr
    assert "linescope (trace)" in p.stderr  # the end-of-run summary
    data = json.loads((tmp_path / "out.json").read_text())
    assert any(l["line"] == 8 for l in data["run"]["lines"])


def test_module_mode(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text(
        "import json, sys\n"
        "json.dump({'argv': sys.argv, 'path0': sys.path[0]}, open('seen.json', 'w'))\n")
    p = linescope("-d", "none", "-o", "o.json", "-m", "pkg.tool", "a", "b", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == [str(pkg / "tool.py"), "a", "b"]
    assert seen["path0"] == str(tmp_path)
    data = json.loads((tmp_path / "o.json").read_text())
    assert {Path(l["filename"]).name for l in data["run"]["lines"]} == {"tool.py"}


@pytest.mark.parametrize("args, match", [
    ((), "give a script"),
    (("missing.py",), "can't open file"),
    (("--backend", "nope", "target.py"), "unknown linescope backend"),
    (("-d", "sometimes", "target.py"), "invalid choice"),
    (("--sample-rate", "100", "target.py"), "does not support sample_rate"),
])
def test_usage_errors_exit_2(script, tmp_path, args, match):
    p = linescope(*args, cwd=tmp_path)
    assert p.returncode == 2
    assert match in p.stderr
    assert not (tmp_path / "seen.json").exists()


def test_memory_flag_collects_memory_with_the_default_backend(script, tmp_path):
    p = linescope("--memory", "-d", "none", "-o", "m.json", "target.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["options"]["memory"] is True
    assert data["memory"]["peak_rss_bytes"] >= data["memory"]["start_rss_bytes"] > 0
    assert data["memory"]["timeline"] and data["memory"]["per_line"] is True


def test_gpu_with_trace_warns_and_runs(script, tmp_path):
    p = linescope("--gpu", "-d", "none", "-o", "o.json", "target.py", cwd=tmp_path)
    assert p.returncode == 0
    assert "RuntimeWarning" in p.stderr and "GPU profiling is not supported" in p.stderr
    data = json.loads((tmp_path / "o.json").read_text())
    assert len(data["warnings"]) == 1


def test_python_dash_m_linescope(script, tmp_path):
    p = subprocess.run([sys.executable, "-m", "linescope", "-d", "none", "target.py", "0"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["argv"] == ["target.py", "0"]
