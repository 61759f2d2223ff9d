"""Packaging (issue 22) through the public surface: one version everywhere, the test-only
instruments kept out of the product's extension, the generated stub up to date, and what a
build without the team server's libraries does when a user asks for the server's features."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

import gpuprof
import linescope
from gpuprof import _native
from gpuprof_testutil import db_rows, run_cli

REPO = Path(__file__).resolve().parent.parent


def pyproject_version() -> str:
    with open(REPO / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def test_one_version_everywhere() -> None:
    # GIVEN the version written once, in pyproject.toml
    want = pyproject_version()
    # THEN the CLI, both packages, the extension and the installed metadata all say it
    assert run_cli("version", check=True).stdout.startswith(f"gpuprof {want} ")
    assert gpuprof.__version__ == want
    assert linescope.__version__ == want
    assert _native.__version__ == want
    from importlib import metadata
    assert metadata.version("gpuprof") == want


def test_the_run_records_that_version(tmp_path: Path) -> None:
    with gpuprof.profile("v", db=str(tmp_path / "v.db"), auto=False, gpu="none",
                         summary=False) as prof:
        with prof.step(0):
            pass
    assert db_rows(tmp_path / "v.db", "SELECT gpuprof_version FROM runs") == [
        (pyproject_version(),)]


def test_licences_are_shipped_with_the_install() -> None:
    from importlib import metadata
    files = [str(f) for f in metadata.files("gpuprof") or []]
    for licence in ("LICENSE", "third_party/sqlite/LICENSE.md",
                    "third_party/nlohmann_json/LICENSE", "third_party/cli11/LICENSE"):
        assert any(f.endswith("licenses/" + licence) for f in files), licence


def test_test_instruments_live_outside_the_product_module() -> None:
    # GIVEN the product's extension and the test-only one this build has
    from gpuprof import _native_testing
    # THEN the benchmark floor and the untraced-eval counters are only in the test module
    assert not hasattr(_native, "_line_floor")
    assert not hasattr(_native.LineTracer, "_untraced_eval_stats")
    assert _native_testing.line_floor.mode in ("settrace", "sys.monitoring")
    count, aside = _native_testing.untraced_eval_stats()
    assert count >= 0 and (aside is None or isinstance(aside, str))


def test_generated_stub_matches_the_built_extension(tmp_path: Path) -> None:
    # GIVEN the stub committed at python/gpuprof/_native.pyi (make stubs)
    committed = (REPO / "python" / "gpuprof" / "_native.pyi").read_text()
    # WHEN nanobind's stubgen runs on the installed extension
    out = tmp_path / "_native.pyi"
    done = subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m",
                           "gpuprof._native", "-p", str(REPO / "scripts" / "stubgen-patterns.txt"),
                           "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # THEN it is the same text: a binding changed without `make stubs` fails here
    assert out.read_text() == committed, "python/gpuprof/_native.pyi is stale: run make stubs"


@pytest.fixture
def without_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extension as a build without Boost/zlib/OpenSSL/dygraphs makes it."""
    assert _native.HAS_SERVER is True  # this test build has the server
    monkeypatch.setattr(_native, "HAS_SERVER", False)


def test_without_the_server_a_dashboard_request_warns_and_the_run_goes_on(
        tmp_path: Path, without_server: None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.warns(gpuprof.GpuprofWarning, match="built without the team server"):
        with gpuprof.profile("d", db=str(tmp_path / "d.db"), auto=False, gpu="none",
                             summary=False, dashboard=True) as prof:
            with prof.step(0):
                pass
    assert prof.dashboard_url is None
    assert "gpuprof dashboard:" not in capsys.readouterr().out
    # AND the run is stored with the reason among its diagnostics
    db = tmp_path / "d.db"
    diags = db_rows(db, "SELECT source, message FROM diagnostics")
    assert db_rows(db, "SELECT count(*) FROM steps") == [(1,)]
    assert any(src == "dashboard" and "dashboard not started" in msg and "libboost-dev" in msg
               for src, msg in diags), diags


def test_without_the_server_push_and_webhook_warn_and_the_run_is_stored(
        tmp_path: Path, without_server: None) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gpuprof.profile("p", db=str(tmp_path / "p.db"), auto=False, gpu="none",
                             summary=False, server="http://127.0.0.1:9", api_key="k",
                             webhook="http://127.0.0.1:9/hook") as prof:
            with prof.step(0):
                pass
    texts = [str(w.message) for w in caught if issubclass(w.category, gpuprof.GpuprofWarning)]
    assert any(re.search(r"server= is set but this gpuprof was built without", t) for t in texts)
    assert any(re.search(r"webhook= is set but this gpuprof was built without", t)
               for t in texts)
    assert db_rows(tmp_path / "p.db", "SELECT count(*) FROM steps") == [(1,)]


def test_the_default_venv_has_pyspark_so_the_spark_tests_cannot_skip() -> None:
    # linescope's Spark tests skip only where pyspark is not importable (the 3.12/3.13 venvs);
    # the 3.11 .venv that `make test` uses must have it (scripts/requirements-spark.txt).
    venv_python = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python"
    if not venv_python.exists():
        pytest.skip("no .venv here (run make setup)")
    out = subprocess.run([str(venv_python), "-c", "import pyspark; print(pyspark.__version__)"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"pyspark is not importable in .venv: {out.stderr[-500:]}"
    pinned = (Path(__file__).resolve().parent.parent / "scripts" / "requirements-spark.txt")
    assert f"pyspark=={out.stdout.strip()}" in pinned.read_text()
