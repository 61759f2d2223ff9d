"""Helpers shared by the gpuprof test modules (a uniquely named module: several conftest.py
files live under tests/, so `from conftest import ...` would be ambiguous)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent


def native_build_dir() -> Path:
    """The build with the C++ test fixtures (fake NVML, fake CUPTI): $GPUPROF_BUILD_DIR, else
    the 3.11 build that scripts/setup.sh makes (pyproject.toml: build/{wheel_tag})."""
    if os.environ.get("GPUPROF_BUILD_DIR"):
        return Path(os.environ["GPUPROF_BUILD_DIR"])
    found = sorted((REPO / "build").glob("cp311-*/fake_nvml"))
    return found[0].parent if found else REPO / "build" / "cp311-cp311-linux_x86_64"


def db_rows(db: Path | str, sql: str, *params: object) -> list[tuple]:
    """The rows of a read-only query on a gpuprof DB file (the documented schema)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


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


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False when torch is missing)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


_RUN_NOTEBOOK = """
import sys, nbclient, nbformat
src, out, cwd, timeout = sys.argv[1:5]
nb = nbformat.read(src, as_version=4)
nbclient.NotebookClient(nb, timeout=int(timeout), kernel_name="python3",
                        resources={"metadata": {"path": cwd}}).execute()
nbformat.write(nb, out)
"""


def run_notebook(src: Path, out: Path, cwd: Path, *, cell_timeout: int,
                 env: dict | None = None) -> subprocess.CompletedProcess:
    """Executes every cell of the notebook `src` in a fresh Jupyter kernel (python3) with `cwd`
    as its directory and writes the executed notebook to `out`. It runs in a child process, so
    the Jupyter client's event loop does not leak into the test process."""
    return subprocess.run([sys.executable, "-c", _RUN_NOTEBOOK, str(src), str(out), str(cwd),
                           str(cell_timeout)], env=env, capture_output=True, text=True,
                          timeout=cell_timeout + 60)
