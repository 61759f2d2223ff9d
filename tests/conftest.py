"""Shared fixtures. Tests go through the public API (gpuprof.profile, the gpuprof CLI) and read
the stored run with sqlite3 against the documented schema (docs/schema.md)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FAKE_NVML = REPO / "build" / "py" / "fake_nvml" / "libnvidia-ml.so.1"


def gpuprof_exe() -> str:
    """The native CLI installed next to this interpreter."""
    exe = Path(sys.executable).parent / "gpuprof"
    if exe.exists():
        return str(exe)
    found = shutil.which("gpuprof")
    assert found, "the gpuprof executable is not installed (run make setup)"
    return found


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([gpuprof_exe(), *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


class Db:
    """Read access to a gpuprof DB for assertions."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self, sql: str, *params) -> list[tuple]:
        con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            return con.execute(sql, params).fetchall()
        finally:
            con.close()

    def one(self, sql: str, *params):
        r = self.rows(sql, *params)
        assert len(r) == 1, r
        return r[0] if len(r[0]) > 1 else r[0][0]


@pytest.fixture
def db(tmp_path: Path) -> Db:
    return Db(tmp_path / "gpuprof.db")


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Returns write(scenario_text) that points gpuprof's NVML loader at the fake library."""
    assert FAKE_NVML.exists(), f"{FAKE_NVML} missing: the test build makes it (make setup)"

    def write(text: str) -> Path:
        scenario = tmp_path / "nvml_scenario.txt"
        scenario.write_text(text)
        monkeypatch.setenv("GPUPROF_NVML_LIBRARY", str(FAKE_NVML))
        monkeypatch.setenv("GPUPROF_FAKE_NVML_SCENARIO", str(scenario))
        return scenario

    return write


def python_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(extra)
    return env
