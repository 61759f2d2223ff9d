"""linescope's Python API: options, errors, backends and capabilities, module-level control,
result files and [tool.linescope] defaults."""

from __future__ import annotations

import json
import warnings

import pytest

import linescope
from linescope import (BackendCapabilities, GPUStats, RawBackendResult, RawLine, profile,
                       register_backend)


def test_second_concurrent_session_is_rejected():
    with profile(display="none"):
        with pytest.raises(RuntimeError, match="already running"):
            profile(display="none").start()


def test_stop_before_start_and_result_before_stop():
    s = profile(display="none")
    with pytest.raises(RuntimeError, match="has not started"):
        s.stop()
    with pytest.raises(RuntimeError, match="no result yet"):
        s.result
    s.start()
    with pytest.raises(RuntimeError, match="still running"):
        s.result
    s.stop()
    with pytest.raises(RuntimeError, match="already stopped"):
        s.stop()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"backend": "nope"}, ValueError, "unknown linescope backend 'nope'.*trace"),
    ({"display": "browser"}, ValueError, "display must be one of"),
    ({"sample_rate": 0}, ValueError, "sample_rate must be a positive"),
    ({"gpu": "yes"}, TypeError, "gpu must be True or False"),
    ({"include": [3]}, ValueError, "include patterns"),
    ({"root": "/definitely/not/here"}, ValueError, "is not a directory"),
])
def test_invalid_options_raise_before_anything_starts(kwargs, error, match):
    with pytest.raises(error, match=match):
        profile(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"sample_rate": 100.0}, r"does not support sample_rate"),
])
def test_capabilities_the_trace_backend_lacks_are_rejected_before_start(kwargs, match):
    s = profile(display="none", **kwargs)
    with pytest.raises(ValueError, match=match):
        s.start()
    assert not s.running
    with profile(display="none"):  # nothing was left active
        pass


def test_gpu_with_trace_warns_once_and_profiling_continues(ws):
    mod = ws.module("g.py", """
        def f():
            return 1
    """)
    with pytest.warns(RuntimeWarning, match="not supported by the 'trace' backend"):
        with profile(gpu=True, root=ws.root, display="none") as s:
            mod.f()
    r = s.result
    assert len(r.warnings) == 1 and "trace" in r.warnings[0]
    assert r.function("f").calls == 1
    assert all(line.gpu is None for line in r.lines)
    assert r.capabilities.gpu is False


class FakeGpuBackend:
    capabilities = BackendCapabilities(line_time=True, hit_counts=True, gpu=True,
                                       sampled=True)
    started = 0

    def __init__(self, options):
        self.options = options

    def start(self):
        FakeGpuBackend.started += 1

    def stop(self):
        pass

    def result(self):
        return RawBackendResult(lines=[
            RawLine("/x/train.py", 7, 1_000, None, None, GPUStats(5_000, None), 3)],
            elapsed_ns=10_000)


class CpuOnlyBackend(FakeGpuBackend):
    capabilities = BackendCapabilities(gpu=False)


register_backend("fake-gpu", FakeGpuBackend, replace=True)
register_backend("cpu-only", CpuOnlyBackend, replace=True)


def test_custom_backend_returns_gpu_stats():
    with profile(backend="fake-gpu", gpu=True, sample_rate=1000, display="none") as s:
        pass
    line = s.result.line("/x/train.py", 7)
    assert line.gpu == GPUStats(time_ns=5_000, peak_memory_bytes=None)
    assert line.hits is None and line.avg_time_ns is None  # sampled: unknown, not 0
    assert s.result.backend == "fake-gpu" and s.result.warnings == []


def test_custom_backend_without_gpu_capability_rejects_gpu_before_start():
    before = CpuOnlyBackend.started
    with pytest.raises(ValueError, match=r"'cpu-only' does not support gpu=True"):
        profile(backend="cpu-only", gpu=True, display="none").start()
    assert CpuOnlyBackend.started == before
    assert "cpu-only" in linescope.backend_names()


def test_register_backend_refuses_silent_replacement():
    with pytest.raises(ValueError, match="already registered"):
        register_backend("trace", FakeGpuBackend)


def test_module_level_start_stop_result_save_show(ws, tmp_path, capsys):
    mod = ws.module("m.py", """
        def f():
            return 1
    """)
    profile.start(root=ws.root, display="none")
    mod.f()
    result = profile.stop()
    assert profile.result is result
    assert result.function("f").calls == 1
    out = profile.save(tmp_path / "r.json")
    data = json.loads(open(out).read())
    assert data["format"] == "linescope-result/1"
    assert any(fn["qualname"] == "f" for fn in data["run"]["functions"])
    profile.show()
    assert "m.py:2" in capsys.readouterr().out


def test_output_written_at_stop_and_display_end_prints_summary(ws, tmp_path, capsys):
    mod = ws.module("o.py", """
        def f():
            return 1
    """)
    with profile(root=ws.root, output=tmp_path / "out.html"):
        mod.f()
    page = (tmp_path / "out.html").read_text()
    assert page.startswith("<!doctype html>") and "linescope-data" in page
    assert "o.py:2" in capsys.readouterr().err


def test_pyproject_tool_linescope_gives_defaults_and_explicit_wins(tmp_path, monkeypatch):
    proj = tmp_path / "cfg"
    (proj / "sub").mkdir(parents=True)
    (proj / "pyproject.toml").write_text(
        '[tool.linescope]\ndisplay = "none"\nexclude = ["gen_*"]\nroot = "sub"\n')
    monkeypatch.chdir(proj / "sub")
    s = profile()
    assert s.display == "none" and s.exclude == ("gen_*",)
    assert s.root == str(proj / "sub")
    assert profile(display="end").display == "end"


def test_pyproject_unknown_key_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[tool.linescope]\ncolour = 1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown option.*colour"):
        profile()


def test_public_types_are_exported():
    for name in ("ProfileResult", "LineStats", "FunctionStats", "GPUStats", "RawLine",
                 "RawBackendResult", "BackendCapabilities", "ProfilerBackend",
                 "register_backend", "profile"):
        assert hasattr(linescope, name)
    assert isinstance(FakeGpuBackend(None), linescope.ProfilerBackend)
