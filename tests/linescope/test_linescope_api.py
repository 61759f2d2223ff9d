"""linescope's Python API: options, errors, backends and capabilities, module-level control,
result files and [tool.linescope] defaults."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import linescope
from linescope import (BackendCapabilities, GPUStats, RawBackendResult, RawLine, profile,
                       register_backend)


def test_second_concurrent_session_is_rejected():
    with profile(display="none"):
        with pytest.raises(RuntimeError, match="already running") as e:
            profile(display="none").start()
    # the message says which session runs, where it was started, and how to stop that one
    assert f"with profile(...) at {__file__}:" in str(e.value)
    assert "let its `with` block end" in str(e.value)


def test_the_already_running_error_says_how_to_stop_the_session_that_runs():
    # GIVEN a session started explicitly
    s = profile(display="none")
    s.start()
    try:
        with pytest.raises(RuntimeError, match="already running") as e:
            profile.start(display="none")
        assert f"session.start() at {__file__}:" in str(e.value)
        assert "call that session's stop()" in str(e.value)
        # WHEN the user tries module-level profile.stop(): it says that it is not that session
        with pytest.raises(RuntimeError, match="started otherwise") as e:
            profile.stop()
        assert "call that session's stop()" in str(e.value)
        assert s.running
    finally:
        s.stop()
    # AND a session from profile.start() is named as such and stopped by profile.stop()
    profile.start(display="none")
    with pytest.raises(RuntimeError, match=r"profile\.start\(\) at .*stop it with profile\.stop\(\)"):
        profile(display="none").start()
    profile.stop()


def test_module_level_start_takes_profile_arguments_and_stop_says_what_to_do():
    # WHEN profile.stop() comes before any profile.start() (a fresh interpreter)
    out = subprocess.run([sys.executable, "-c", "from linescope import profile\n"
                          "try:\n    profile.stop()\nexcept RuntimeError as e:\n    print(e)"],
                         capture_output=True, text=True, check=True).stdout
    assert "before profile.start(); start a session first with profile.start(" in out
    # AND profile.start() takes profile()'s arguments, positional ones too
    profile.start("trace", False, display="none")
    r = profile.stop()
    assert r.backend == "trace" and profile.result is r
    # AND a second profile.stop() points at profile.result (there is no `session` name here)
    with pytest.raises(RuntimeError, match=r"already stopped; read profile\.result"):
        profile.stop()
    # AND a path pattern may be a pathlib.Path
    with profile(include=Path("/nowhere/*.py"), display="none") as s:
        pass
    assert s.include == ("/nowhere/*.py",)


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
    ({"include": {"a": 1}}, TypeError, "include must be a string or a sequence of glob "
                                       "patterns, not dict"),
    ({"exclude": b"*.py"}, TypeError, "exclude must be .* not bytes"),
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


def test_the_gpu_warning_names_the_users_line_however_the_session_starts():
    import inspect
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile(gpu=True, display="none"):
            seen.append(inspect.currentframe().f_lineno - 1)
        s = profile(gpu=True, display="none")
        s.start(); seen.append(inspect.currentframe().f_lineno)  # noqa: E702
        s.stop()
        profile.start(gpu=True, display="none"); seen.append(inspect.currentframe().f_lineno)  # noqa: E702
        profile.stop()
    gpu = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert [(w.filename, w.lineno) for w in gpu] == [(__file__, n) for n in seen]


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


@pytest.mark.parametrize("text, match", [
    ('tool = "x"\n', r"\[tool\] in .*pyproject\.toml must be a table"),
    ('[tool]\nlinescope = 3\n', r"\[tool\.linescope\] in .*pyproject\.toml must be a table"),
    ('[tool.linescope]\ninclude = { a = 1 }\n',
     r"include must be a string or a sequence of glob patterns, not dict.*pyproject\.toml"),
])
def test_pyproject_of_the_wrong_shape_is_an_error_naming_the_file(tmp_path, monkeypatch, text,
                                                                  match):
    (tmp_path / "pyproject.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises((ValueError, TypeError), match=match):
        profile()


def test_public_types_are_exported():
    for name in ("ProfileResult", "LineStats", "FunctionStats", "GPUStats", "RawLine",
                 "RawBackendResult", "BackendCapabilities", "ProfilerBackend",
                 "register_backend", "profile"):
        assert hasattr(linescope, name)
    assert isinstance(FakeGpuBackend(None), linescope.ProfilerBackend)


def test_profile_result_and_save_refer_to_the_latest_finished_session(ws, tmp_path):
    # GIVEN a session run as a with block (not through profile.start())
    mod = ws.module("last.py", """
        def f():
            return 1
    """)
    with profile(root=ws.root, display="none") as session:
        mod.f()
    # THEN the module-level accessors see it
    assert profile.result is session.result
    out = profile.save(tmp_path / "last.json")
    assert json.loads(open(out).read())["run"]["functions"][0]["qualname"] == "f"


def test_relative_output_is_fixed_when_the_session_is_made(ws, tmp_path, monkeypatch):
    # GIVEN a relative output path and code that changes directory during the session
    mod = ws.module("cd.py", """
        import os
        def f(there):
            os.chdir(there)
    """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    session = profile(root=ws.root, display="none", output="rel.json")
    assert session.options()["output"] == str(tmp_path / "rel.json")
    # WHEN
    with session:
        mod.f(str(elsewhere))
    # THEN the report lands where the path pointed when the session was made
    assert (tmp_path / "rel.json").is_file() and not (elsewhere / "rel.json").exists()


def test_an_output_that_cannot_be_written_is_refused_before_start(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="is a directory"):
        profile(output=tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        profile(output=blocker / "sub" / "r.html")


def test_save_checks_the_path_like_output(ws, tmp_path):
    with profile(root=ws.root, display="none") as s:
        pass
    with pytest.raises(ValueError, match="is a directory; give a file name"):
        s.save(tmp_path)
    with pytest.raises(TypeError, match="save\\(\\) needs a file path"):
        s.save(None)
    assert s.save(tmp_path / "new" / "r.json") == str(tmp_path / "new" / "r.json")


@pytest.mark.parametrize("result, match", [
    ({"lines": []}, "result\\(\\) must return a linescope.RawBackendResult, not dict"),
    (RawBackendResult(lines=[("a.py", 1, 5)]), "lines must hold linescope.RawLine items, not tuple"),
    (RawBackendResult(lines=[], functions=[1]), "functions must hold linescope.RawFunction"),
])
def test_a_backend_result_of_the_wrong_type_is_a_clear_error(result, match):
    class Wrong:
        capabilities = BackendCapabilities()
        def __init__(self, options): pass
        def start(self): pass
        def stop(self): pass
        def result(self): return result

    name = f"wrong-result-{abs(hash(match))}"
    register_backend(name, Wrong)
    with pytest.raises(TypeError, match=f"backend '{name}': .*" + match):
        with profile(backend=name, display="none"):
            pass
    with profile(display="none"):  # nothing was left active
        pass


@pytest.mark.parametrize("gpu", [False, True])
def test_capabilities_that_are_not_backend_capabilities_are_rejected_before_start(gpu):
    # GIVEN a backend whose capabilities is a dict, not a BackendCapabilities
    started = []

    class DictCaps:
        capabilities = {"gpu": True}
        def __init__(self, options): pass
        def start(self): started.append(True)
        def stop(self): pass
        def result(self): return RawBackendResult(lines=[])

    register_backend("dict-caps", DictCaps, replace=True)
    # THEN with or without gpu=True: a TypeError that says what capabilities must be
    with pytest.raises(TypeError, match=r"backend 'dict-caps': capabilities must be a "
                                        r"linescope.BackendCapabilities .* not dict"):
        with profile(backend="dict-caps", gpu=gpu, display="none"):
            pass
    assert started == []
    with profile(display="none"):  # nothing was left active
        pass


@pytest.mark.parametrize("line, error, match", [
    (RawLine("a.py", 1, 5, gpu={"time_ns": 5, "peak_memory_bytes": 6}), TypeError,
     "'a.py':1: gpu must be a linescope.GPUStats or None, not dict"),
    (RawLine("a.py", 1, 5, gpu=GPUStats(-5_000_000, None)), ValueError,
     "'a.py':1: gpu.time_ns must not be negative, got -5000000"),
    (RawLine("a.py", 2, 5, gpu=GPUStats(None, -10)), ValueError,
     "'a.py':2: gpu.peak_memory_bytes must not be negative"),
    (RawLine("a.py", 1, "fast"), TypeError, "wall_time_ns must be an int or None, not str"),
    (RawLine("a.py", 1, 5, hits=-1), ValueError, "hits must not be negative"),
    (RawLine("a.py", 0, 5), ValueError, "line must be a line number"),
])
def test_a_custom_backend_s_line_values_are_checked(line, error, match):
    # GIVEN a custom backend returning a malformed value (and a signed memory change, which
    # is allowed)
    class Odd:
        capabilities = BackendCapabilities(gpu=True)
        def __init__(self, options): pass
        def start(self): pass
        def stop(self): pass
        def result(self):
            return RawBackendResult(lines=[RawLine("ok.py", 1, 1, memory=-4096), line])

    name = f"odd-values-{abs(hash(match))}"
    register_backend(name, Odd)
    # THEN stop() says which backend, line and field
    with pytest.raises(error, match=f"backend '{name}': RawLine .*" + re.escape(match)):
        with profile(backend=name, display="none", gpu=True):
            pass


def test_a_custom_backend_may_use_numpy_integers_paths_and_unknowns(tmp_path):
    # GIVEN a custom backend whose values are numpy integers, with a pathlib filename, an
    # unknown wall time and hit count, and a negative memory change
    np = pytest.importorskip("numpy")
    src = tmp_path / "calc.py"
    src.write_text("a = 1\nb = 2\n")

    class Numpyish:
        capabilities = BackendCapabilities(gpu=True, memory=True)
        def __init__(self, options): pass
        def start(self): pass
        def stop(self): pass
        def result(self):
            return RawBackendResult(lines=[
                RawLine(src, np.int64(1), np.int64(5_000), hits=np.int32(3),
                        memory=np.int64(-4096), gpu=GPUStats(np.int64(7), np.int64(8))),
                RawLine(str(src), 2, None, hits=None)])

    register_backend("numpyish", Numpyish, replace=True)
    # WHEN profiled
    with profile(backend="numpyish", display="none", gpu=True, memory=True) as s:
        pass
    # THEN the values are taken as they are
    r = s.result
    first = r.line(str(src), 1)
    assert (first.wall_time_ns, first.hits, first.memory_bytes) == (5_000, 3, -4096)
    assert (first.gpu.time_ns, first.gpu.peak_memory_bytes) == (7, 8)
    assert r.line(str(src), 2).wall_time_ns is None
    # AND an unknown wall time gives an unknown average, not an error
    assert r.line(str(src), 2).avg_time_ns is None
    s.save(tmp_path / "r.html")  # and the report renders them


class _ScriptedBackend:
    """A custom backend that returns the lines it is built with (or raises them)."""
    capabilities = BackendCapabilities(gpu=True)
    lines: list = []

    def __init__(self, options): pass
    def start(self): pass
    def stop(self): pass

    def result(self):
        if isinstance(self.lines, BaseException):
            raise self.lines
        return RawBackendResult(lines=list(self.lines))


def test_a_line_reported_twice_is_merged_and_unknown_parts_stay_unknown(tmp_path):
    # GIVEN a backend that reports line 1 twice, once without hits and without GPU data
    src = tmp_path / "dup.py"
    src.write_text("x = 1\ny = 2\n")
    backend = type("Dup", (_ScriptedBackend,), {"lines": [
        RawLine(str(src), 1, 5_000_000, hits=None, gpu=None),
        RawLine(str(src), 1, 1_000_000, hits=3, gpu=GPUStats(2_000, 64)),
        RawLine(str(src), 2, 7, hits=1, gpu=GPUStats(10, 20)),
        RawLine(str(src), 2, 3, hits=2, gpu=GPUStats(5, 30))]})
    register_backend("dup-lines", backend, replace=True)
    out = tmp_path / "dup.html"
    with profile(backend="dup-lines", gpu=True, display="none", output=out) as s:
        pass
    # THEN the result holds each line once: times add; a part's unknown hits or GPU values
    # make the merged ones unknown (not the known part's), so avg/hit is unknown too
    r = s.result
    assert [(l.line, l.wall_time_ns) for l in r.lines] == [(1, 6_000_000), (2, 10)]
    one, two = r.line(str(src), 1), r.line(str(src), 2)
    assert one.hits is None and one.avg_time_ns is None
    assert (one.gpu.time_ns, one.gpu.peak_memory_bytes) == (None, None)
    assert (two.hits, two.gpu.time_ns, two.gpu.peak_memory_bytes) == (3, 15, 30)
    # AND the report shows the same
    payload = json.loads(re.search(r'id="linescope-data">(.*?)</script>', out.read_text(),
                                   re.S).group(1))
    first = next(l for l in payload["lines"] if l["line"] == 1)
    assert (first["time_ns"], first["hits"], first["avg_ns"]) == (6_000_000, None, None)


def test_a_session_whose_backend_result_fails_is_the_latest_and_says_why(tmp_path):
    # GIVEN a finished session, then one whose backend's result() raises
    ok = type("Ok", (_ScriptedBackend,), {"lines": [RawLine(str(tmp_path / "a.py"), 1, 5, 1)]})
    broken = type("Broken", (_ScriptedBackend,), {"lines": OSError("disk gone")})
    register_backend("scripted-ok", ok, replace=True)
    register_backend("scripted-broken", broken, replace=True)
    with profile(backend="scripted-ok", display="none"):
        pass
    s = profile(backend="scripted-broken", display="none")
    with pytest.raises(OSError, match="disk gone"):
        with s:
            pass
    # THEN the session is stopped, and its result (and profile.result) say why there is none,
    # instead of "has not run" or the earlier session's result
    assert not s.running
    for read in (lambda: s.result, lambda: profile.result):
        with pytest.raises(RuntimeError, match="session stopped, but finishing it failed "
                                               r"\(backend 'scripted-broken': OSError: disk "
                                               r"gone\)"):
            read()


def test_a_module_whose_body_was_edited_before_the_session_is_flagged(ws):
    # GIVEN a module imported, then edited without reloading: same line layout, another body
    mod = ws.module("edited_body.py", """
        import time
        def work():
            time.sleep(0.01)
    """)
    (ws.root / "edited_body.py").write_text("import time\ndef work():\n    pass  # edited\n")
    untouched = ws.module("untouched.py", """
        def same():
            return 1
    """)
    # WHEN it is profiled
    with profile(root=ws.root, display="none") as session:
        mod.work()
        untouched.same()
    # THEN the report's text is not what ran, and a warning says so; the other file is fine
    warnings_ = session.result.warnings
    assert any("edited_body.py changed after it was imported" in w for w in warnings_), warnings_
    assert not any("untouched.py" in w for w in warnings_)


def test_pyproject_values_are_checked_and_errors_name_the_file(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.linescope]\nmemory = "yes"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=r"memory must be True or False.*pyproject\.toml"):
        profile()
    assert profile(memory=False).memory is False  # an explicit value replaces the bad one


def test_pyproject_sample_rate_is_ignored_by_a_backend_that_does_not_sample(ws, tmp_path,
                                                                          monkeypatch):
    # GIVEN a pyproject that configures the sampler, and an explicit trace backend
    (tmp_path / "pyproject.toml").write_text(
        '[tool.linescope]\nbackend = "sampler"\nsample_rate = 200\ndisplay = "none"\n')
    monkeypatch.chdir(tmp_path)
    mod = ws.module("sr.py", """
        def f():
            return 1
    """)
    # WHEN
    with profile(backend="trace", root=ws.root) as session:
        mod.f()
    # THEN it runs, says so, and an explicit sample_rate with trace is still an error
    assert session.result.function("f").calls == 1
    assert any("sample_rate = 200" in w and "ignored" in w for w in session.result.warnings)
    assert session.result.options["sample_rate"] is None
    with pytest.raises(ValueError, match="does not support sample_rate"):
        with profile(backend="trace", sample_rate=100, root=ws.root):
            pass


def test_source_snapshots_show_the_code_as_it_ran(ws):
    # GIVEN a module imported before the session that is edited during it, and one that was
    # edited after its import but before the session
    early = ws.module("early.py", """
        def f():
            return "original"
    """)
    stale = ws.module("stale.py", """
        def g():
            return 1
    """)
    stale_path = ws.root / "stale.py"
    stale_path.write_text("# a line added above, so g moved\ndef g():\n    return 2\n")
    early_path = ws.root / "early.py"
    # WHEN
    with profile(root=ws.root, display="none") as session:
        early.f()
        early_path.write_text("# edited during the session\n")
        stale.g()
    r = session.result
    # THEN the first keeps its original text without a warning; the second is flagged
    assert 'return "original"' in r.sources[str(early_path)]
    assert not any("early.py" in w for w in r.warnings)
    assert any("stale.py changed after it was imported" in w for w in r.warnings)


def test_a_file_first_loaded_and_edited_during_the_session_is_flagged(ws):
    ws.write("late.py", "def h():\n    return 3\n")
    driver = ws.module("driver.py", """
        import importlib.util, pathlib
        def run(root):
            path = pathlib.Path(root) / "late.py"
            spec = importlib.util.spec_from_file_location("ls_late_mod", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mod.h()
            path.write_text("# rewritten\\n")
    """)
    with profile(root=ws.root, display="none") as session:
        driver.run(str(ws.root))
    assert any("late.py changed while it was being profiled" in w
               for w in session.result.warnings)


def test_edits_right_at_the_start_are_told_apart_from_writes_just_before_it(ws):
    # The file system stamps files from a clock that ticks every few ms: a file rewritten in
    # the same tick as start() must still count as changed, and one written just before
    # start() (the same tick, the other side) must not.
    driver = ws.module("driver_edit.py", """
        import importlib.util, pathlib
        def run(path, rewrite):
            spec = importlib.util.spec_from_file_location("ls_tick_mod", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mod.h()
            if rewrite:
                pathlib.Path(path).write_text("# rewritten\\n")
    """)
    for i in range(15):
        for rewrite in (True, False):
            path = ws.write(f"tick_{i}_{rewrite}.py", "def h():\n    return 3\n")
            with profile(root=ws.root, display="none") as session:
                driver.run(str(path), rewrite)
            flagged = any(f"tick_{i}_{rewrite}.py changed while it was being profiled" in w
                          for w in session.result.warnings)
            assert flagged == rewrite, (i, rewrite, session.result.warnings)


class _ChildLeaves(Exception):
    pass


# Earlier tests may have loaded libraries that start native threads (numpy's BLAS): the
# child here only leaves the block and exits, so 3.12+'s fork-with-threads warning is moot.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_leaving_the_with_block_writes_nothing(ws, tmp_path):
    import os
    mod = ws.module("fork.py", """
        def parent_work():
            return 1
    """)
    out = tmp_path / "fork.json"
    status = None
    try:
        with profile(root=ws.root, display="none", output=out) as session:
            pid = os.fork()
            if pid == 0:  # the child leaves the block, as sys.exit() there would
                raise _ChildLeaves
            _, status = os.waitpid(pid, 0)
            mod.parent_work()
    except _ChildLeaves:  # in the child only: did leaving write (or break) anything?
        os._exit(3 if out.exists() else 0)
    # THEN the child wrote nothing; the parent's report has the parent's work
    assert os.waitstatus_to_exitcode(status) == 0
    assert session.result.function("parent_work").calls == 1
    assert json.loads(out.read_text())["run"]["functions"]


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("backend", ["trace", "sampler"])
def test_a_forked_child_runs_untraced_and_may_profile_on_its_own(ws, backend):
    # GIVEN a child forked inside a session (a fork-based DataLoader worker, say)
    mod = ws.module("forkwork.py", """
        def child_work():
            return sum(range(1000))
    """)
    read_end, write_end = os.pipe()
    with profile(backend=backend, root=ws.root, display="none") as session:
        pid = os.fork()
        if pid == 0:
            try:
                # THEN in the child no hook of the parent's session is left ...
                state = {"gettrace": sys.gettrace() is None}
                if sys.version_info >= (3, 12):
                    state["tools"] = [sys.monitoring.get_tool(i) for i in range(6)]
                # ... and a session of its own starts and records
                with profile(backend=backend, root=ws.root, display="none") as mine:
                    end = time.monotonic() + 0.05  # samples land on it too
                    while time.monotonic() < end:
                        mod.child_work()
                state["own"] = mine.result.function("child_work") is not None
                os.write(write_end, json.dumps(state).encode())
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
    os.close(write_end)
    state = json.loads(os.read(read_end, 4096) or b"{}")
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0 and state, state
    assert state["gettrace"] is True
    assert "linescope" not in state.get("tools", [])
    assert state["own"] is True
    # AND the parent's session went on
    assert session.result.backend == backend


def test_snapshots_decode_like_python_and_keep_python_line_numbers(ws):
    # GIVEN a latin-1 module with a coding cookie, a UTF-8 BOM module, and a module whose
    # form feed / U+2028 characters must not shift lines
    (ws.root / "latin.py").write_bytes(
        b"# -*- coding: latin-1 -*-\ndef f():\n    return 'caf\xe9'\n")
    (ws.root / "bom.py").write_bytes(b"\xef\xbb\xbfdef g():\n    return 1\n")
    (ws.root / "ff.py").write_text("\x0c\ndef h():\n    return 's\u2028t'\n")
    import importlib.util
    import sys
    mods = []
    for name in ("latin", "bom", "ff"):
        spec = importlib.util.spec_from_file_location(f"ls_dec_{name}", ws.root / f"{name}.py")
        m = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = m
        spec.loader.exec_module(m)
        mods.append(m)
    with profile(root=ws.root, display="none") as session:
        mods[0].f(), mods[1].g(), mods[2].h()
    r = session.result
    # THEN the text is Python's, and nothing is flagged as edited
    assert "return 'café'" in r.sources[str(ws.root / "latin.py")]
    assert r.sources[str(ws.root / "bom.py")].startswith("def g():")
    assert not [w for w in r.warnings if "changed" in w], r.warnings


def test_a_report_that_cannot_be_written_does_not_replace_the_block_s_exception(ws, tmp_path):
    # GIVEN an output whose directory is replaced by a file while the block runs, and a
    # block that raises
    out = tmp_path / "out"
    out.mkdir()
    session = profile(root=ws.root, display="none", output=out / "r.json")
    # WHEN
    with pytest.warns(RuntimeWarning, match="could not finish the session while the "
                                            "profiled code raised KeyError") as said:
        with pytest.raises(KeyError, match="the user's error") as caught:
            with session:
                out.rmdir()
                out.write_text("now a file")
                raise KeyError("the user's error")
    # THEN the user's exception propagates, carrying a note on why no report was written,
    # and the result is still there
    assert any(f"cannot write the linescope report to {out / 'r.json'}: File exists" in n
               for n in getattr(caught.value, "__notes__", []))
    assert session.result is not None
    # AND the warning names the user's `with` line
    assert [w.filename for w in said if "could not finish" in str(w.message)] == [__file__]
    # AND without an exception in the block the failure is raised as before
    out2 = tmp_path / "out2"
    out2.mkdir()
    ok = profile(root=ws.root, display="none", output=out2 / "r.json")
    with pytest.raises(OSError, match=r"cannot write the linescope report to .*r\.json: "):
        with ok:
            out2.rmdir()
            out2.write_text("now a file")


def test_paths_that_are_not_utf8_are_a_clear_error_or_a_warning(tmp_path, monkeypatch):
    # GIVEN a current directory whose name is not UTF-8 (any bytes are legal on Linux)
    bad = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9")
    os.mkdir(bad)
    monkeypatch.chdir(bad)
    # THEN the default root is refused before anything starts, saying what to do
    with pytest.raises(ValueError, match=r"the current directory \(the default root\) "
                                         r"b'.*caf\\xe9' is not valid UTF-8: .*pass root="):
        profile(display="none")
    # AND so is such a root or pattern passed explicitly
    with pytest.raises(ValueError, match=r"root b'.*caf\\xe9' is not valid UTF-8"):
        profile(root=bad, display="none")
    with pytest.raises(ValueError, match=r"include pattern b'.*\\xff' is not valid UTF-8: .*write the pattern as UTF-8"):
        profile(root=tmp_path, include=[os.fsdecode(b"*\xff")], display="none")
    # GIVEN a UTF-8 root holding a file whose name is not UTF-8
    root = tmp_path / "proj"
    root.mkdir()
    name = os.fsencode(root) + b"/m\xff.py"
    with open(name, "wb") as f:
        f.write(b"def f():\n    return 1\n")
    code = compile(open(name, "rb").read(), os.fsdecode(name), "exec")
    ns: dict = {}
    exec(code, ns)
    # WHEN it runs in a session (from a UTF-8 directory or not: the root is explicit)
    with profile(root=root, display="none") as s:
        ns["f"]()
    # THEN it is not recorded, and the result says so, naming it
    assert s.result.lines == []
    assert any("1 file(s) under the root ran but were not recorded because their names are "
               "not valid UTF-8 (e.g. '" in w and "m\\udcff.py" in w for w in s.result.warnings)


class _NoElapsedBackend(FakeGpuBackend):
    def result(self):
        return RawBackendResult(lines=[RawLine("/x/train.py", 7, 1_000)])  # no elapsed_ns


def test_a_summary_without_an_elapsed_time_says_it_is_unknown(capsys):
    # GIVEN a custom backend that reports no elapsed time
    register_backend("no-elapsed", _NoElapsedBackend, replace=True)
    with profile(backend="no-elapsed") as s:
        pass
    # THEN the result has None, and the printed summary says "unknown" instead of a number
    assert s.result.run.elapsed_ns is None
    first = capsys.readouterr().err.splitlines()[0]
    # (/x/train.py has no captured source: its line is left out of the counts)
    assert first.startswith("linescope (no-elapsed): elapsed time unknown, 0 lines in 0 files")


def test_globals_whose_attribute_access_raises_do_not_break_the_edit_check(ws):
    # GIVEN a module with an attribute-dict config and a lazy proxy whose __getattr__ raises
    mod = ws.module("odd_globals.py", """
        class Config(dict):
            def __getattr__(self, key):
                return self[key]          # KeyError for anything missing
        class Lazy:
            def __getattr__(self, name):
                raise ModuleNotFoundError("no module named 'heavy'")
        config = Config(lr=0.1)
        heavy = Lazy()
        def work():
            return config.lr
    """)
    # WHEN it is profiled
    with profile(root=ws.root, display="none") as session:
        mod.work()
    # THEN the session stops with its result and no warning about the module
    r = session.result
    assert r.line(str(ws.root / "odd_globals.py"), 10).hits == 1
    assert not any("odd_globals.py" in w for w in r.warnings), r.warnings


def test_edits_inside_closures_and_nested_classes_are_flagged_and_exec_code_is_not(ws):
    # GIVEN three modules imported and then edited without reloading, keeping the layout:
    # a closure's body, a nested class's method; and one untouched module that generates a
    # function with exec(compile(..., __file__, ...))
    closure = ws.module("closure_edit.py", """
        def outer():
            def inner():
                return 1
            return inner()
    """)
    (ws.root / "closure_edit.py").write_text(
        "def outer():\n    def inner():\n        return 2\n    return inner()\n")
    nested = ws.module("nested_edit.py", """
        class A:
            class B:
                def m(self):
                    return 1
    """)
    (ws.root / "nested_edit.py").write_text(
        "class A:\n    class B:\n        def m(self):\n            return 2\n")
    generated = ws.module("generated.py", """
        ns = {}
        exec(compile("def getter(o):\\n    return o.x\\n", __file__, "exec"), ns)
        getter = ns["getter"]
        def use():
            return getter(type("O", (), {"x": 1}))
    """)
    # WHEN they run under a session
    with profile(root=ws.root, display="none") as session:
        closure.outer()
        nested.A.B().m()
        generated.use()
    warns = session.result.warnings
    # THEN both edits are flagged; the generated function is no edit
    assert any("closure_edit.py changed after it was imported" in w for w in warns), warns
    assert any("nested_edit.py changed after it was imported" in w for w in warns), warns
    assert not any("generated.py" in w for w in warns), warns


def test_a_module_loaded_from_a_pyc_of_another_hash_seed_is_not_flagged(tmp_path):
    # GIVEN an unedited module with set literals whose .pyc an earlier process wrote under
    # another hash seed (a set literal's frozenset then iterates in another order than a
    # fresh compile of the same text)
    (tmp_path / "setmod.py").write_text(
        "def classify(word):\n"
        "    if word in {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}:\n"
        "        return 1\n"
        "    if word in {'red', 'green', 'blue', 'cyan', 'magenta', 'yellow'}:\n"
        "        return 2\n"
        "    return 0\n")
    (tmp_path / "run.py").write_text(
        "import os, sys\n"
        "sys.path.insert(0, os.getcwd())\n"
        "import setmod\n"
        "from linescope import profile\n"
        "fresh = compile(open('setmod.py').read(), 'setmod.py', 'exec')\n"
        "def sets(code):\n"
        "    return [list(k) for c in code.co_consts if hasattr(c, 'co_consts')\n"
        "            for k in c.co_consts if isinstance(k, frozenset)]\n"
        "differs = sets(fresh) != sets(setmod.classify.__code__) or None\n"
        "with profile(root=os.getcwd(), display='none') as p:\n"
        "    setmod.classify('beta')\n"
        "print(bool(differs), any('setmod.py' in w for w in p.result.warnings))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); import setmod"],
                   cwd=tmp_path, env={**env, "PYTHONHASHSEED": "1"}, check=True, timeout=60)
    outcomes = []
    for seed in ("17", "21", "27", "28", "5"):
        done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, capture_output=True,
                              text=True, env={**env, "PYTHONHASHSEED": seed}, timeout=120)
        assert done.returncode == 0, done.stderr
        outcomes.append(done.stdout.split())
    # THEN no run is flagged, also those whose .pyc sets iterate in another order
    assert all(flagged == "False" for _, flagged in outcomes), outcomes
    assert any(differs == "True" for differs, _ in outcomes), outcomes  # the case was hit
