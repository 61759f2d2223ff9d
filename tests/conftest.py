"""Shared fixtures. Tests go through the public API (gpuprof.profile, the gpuprof CLI) and read
the stored run with sqlite3 against the documented schema (docs/schema.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuprof_testutil import db_rows, gpuprof_exe, native_build_dir, run_cli  # noqa: F401  (re-exported)

REPO = Path(__file__).resolve().parent.parent


FAKE_NVML = native_build_dir() / "fake_nvml" / "libnvidia-ml.so.1"


class Db:
    """Read access to a gpuprof DB for assertions."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self, sql: str, *params) -> list[tuple]:
        return db_rows(self.path, sql, *params)

    def one(self, sql: str, *params):
        r = self.rows(sql, *params)
        assert len(r) == 1, r
        return r[0] if len(r[0]) > 1 else r[0][0]


@pytest.fixture
def db(tmp_path: Path) -> Db:
    return Db(tmp_path / "gpuprof.db")


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Returns write(scenario_text) that points gpuprof's NVML loader at the fake library.

    The fake GPU world has no CUPTI: on a machine with CUDA's CUPTI (torch's nvidia-cuda-cupti
    wheel) linescope's sampler would otherwise measure the real driver's kernels beside the
    fake NVML. Tests of CUPTI turn it back on with GPUPROF_CUPTI=1 and a library of their own."""
    assert FAKE_NVML.exists(), f"{FAKE_NVML} missing: the test build makes it (make setup)"

    def write(text: str) -> Path:
        scenario = tmp_path / "nvml_scenario.txt"
        scenario.write_text(text)
        monkeypatch.setenv("GPUPROF_NVML_LIBRARY", str(FAKE_NVML))
        monkeypatch.setenv("GPUPROF_FAKE_NVML_SCENARIO", str(scenario))
        monkeypatch.setenv("GPUPROF_CUPTI", "0")
        return scenario

    return write


def python_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(extra)
    return env


# ---- a throwaway PostgreSQL cluster (scripts/pg_cluster.sh) for the team server's tests ------

@pytest.fixture(scope="session")
def pg_cluster(tmp_path_factory):
    """Starts a PostgreSQL cluster for this test session (unix socket in a fresh /tmp dir) and
    stops it afterwards; yields the libpq URL of its `gpuprof` database. The project's set-up
    installs Debian's postgresql; without it the tests that need it fail, naming the package."""
    import subprocess
    state = tmp_path_factory.mktemp("pg") / "state"
    script = REPO / "scripts" / "pg_cluster.sh"
    started = subprocess.run(["bash", str(script), "start", str(state)], capture_output=True,
                             text=True, timeout=120)
    if started.returncode != 0:
        pytest.fail("could not start PostgreSQL for the tests (apt-get install postgresql): " +
                    started.stderr)
    try:
        yield state.read_text().splitlines()[0]
    finally:
        subprocess.run(["bash", str(script), "stop", str(state)], capture_output=True,
                       timeout=120)


@pytest.fixture
def pg_database(pg_cluster, request):
    """A fresh, empty database in the session's cluster; yields its URL."""
    import re
    import subprocess
    name = "t_" + re.sub(r"[^a-z0-9]", "_", request.node.name.lower())[:40] + f"_{os.getpid()}"
    subprocess.run(["psql", pg_cluster, "-q", "-c", f"DROP DATABASE IF EXISTS {name}",
                    "-c", f"CREATE DATABASE {name}"], check=True, capture_output=True, timeout=60)
    head, _, query = pg_cluster.partition("?")
    yield head.rsplit("/", 1)[0] + "/" + name + ("?" + query if query else "")
    subprocess.run(["psql", pg_cluster, "-q", "-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
                   capture_output=True, timeout=60)
