"""Code written for LineScope 0.1.0 runs unchanged: its documented names (``profiler``,
``Session``, ``Config``, ``ProfileController``, the enums), ``result.root_run`` with
``location.source_id`` / ``sources[id].source`` / ``qualified_name``, run status, functions
that never ran, ``save()`` while a session runs, package names in ``include`` and
``show(inline=...)``; ``linescope --version``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import linescope
from linescope import (Backend, Config, DisplayMode, ProfileController, RunStatus, Session,
                       SessionState, profile, profiler)


def test_the_names_linescope_code_imports_are_there():
    # LineScope's package exports
    for name in ("Backend", "Config", "DisplayMode", "ProfileController", "RunStatus",
                 "Session", "SessionState", "SourceKind", "SymbolKind", "__version__",
                 "load_ipython_extension", "profile", "profiler", "register_backend",
                 "unload_ipython_extension"):
        assert hasattr(linescope, name), name
        assert name in linescope.__all__, name
    # `profiler` is the same controller as `profile`
    assert profiler is profile
    assert RunStatus.SUCCESS == "success" and SessionState.STOPPED == "stopped"
    assert Backend.TRACE == "trace" and DisplayMode.NONE == "none"


def test_the_readme_context_manager_example(ws, monkeypatch):
    # GIVEN LineScope's README example: profile(backend=..., output=...) around main()
    mod = ws.module("app.py", """
        def main():
            total = 0
            for i in range(50):
                total += i
            return total
    """)
    monkeypatch.chdir(ws.root)
    with profile(backend="trace", output="linescope.html", display="none") as session:
        mod.main()
    # THEN the report is saved where asked, and session.save() after the block writes again
    assert (ws.root / "linescope.html").read_text().lower().startswith("<!doctype html>")
    again = session.save("again.html")
    assert os.path.isfile(again) and os.path.isabs(again)


def test_session_and_state_as_in_linescope_docs():
    # LineScope's Session docstring example
    with Session(backend="trace", display="none", notebooks=False, spark=False) as session:
        value = sum(range(10))
    assert value == 45
    assert str(session.state) == "stopped"
    assert session.state is SessionState.STOPPED
    assert str(session.result.backend) == "trace"


def test_profile_controller_as_in_linescope_docs():
    controller = ProfileController()
    with controller(backend="trace", display="none", notebooks=False, spark=False) as session:
        total = sum(range(10))
    assert (total, str(session.state), str(session.result.backend)) == (45, "stopped", "trace")
    # start / stop / result on an independent controller
    session = controller.start(backend="trace", display="none", notebooks=False, spark=False)
    assert str(session.state) == "running"
    total = sum(range(10))
    controller.stop()
    assert (total, str(session.state), str(controller.result.backend)) == (45, "stopped",
                                                                          "trace")
    with pytest.raises(RuntimeError, match="not started a session"):
        _ = ProfileController().result


def test_config_validates_and_session_takes_a_config_or_options(tmp_path):
    # GIVEN a Config
    config = Config(backend="trace", display="none", include=["extra/*"], notebooks=False)
    assert config.include == ("extra/*",) and config.notebooks is False
    # THEN a Session made from it uses it, and reports it back
    with Session(config) as session:
        sum(range(3))
    assert session.config.display == "none" and session.config.notebooks is False
    assert session.result.options["notebooks"] is False
    # AND bad values raise at once, naming the option
    with pytest.raises(ValueError, match="display"):
        Config(display="sometimes")
    with pytest.raises(TypeError, match="memory"):
        Config(memory="yes")
    with pytest.raises(ValueError, match="backend"):
        Config(backend="no-such-backend")
    # AND a Config and options together are refused
    with pytest.raises(TypeError, match=r"Config or keyword options"):
        Session(config, backend="trace")
    with pytest.raises(TypeError, match=r"linescope\.Config"):
        Session({"backend": "trace"})


def test_root_run_locations_sources_and_qualified_names(ws):
    # GIVEN a module with a function that runs, one that never runs, and a method
    mod = ws.module("shapes.py", """
        import functools

        def area(w, h):
            return w * h

        def never_called(x):
            return x

        class Box:
            @functools.cache
            def volume(self):
                return 1

            def unused(self):
                return 0
    """)
    r = ws.profile_call(lambda: [mod.area(2, 3) for _ in range(4)])
    run = r.root_run
    assert run is r.run and run.status == RunStatus.SUCCESS and run.error is None
    # THEN a line's location keys the captured sources, whose .source is the text
    line = next(s for s in run.lines if s.location.source_id.endswith("shapes.py"))
    unit = r.sources[line.location.source_id]
    assert unit.source.splitlines()[line.location.line - 1].strip() == "return w * h"
    assert unit.id == line.location.source_id and unit.kind == "python"
    assert unit == unit.source  # still the text itself, as before
    # AND functions carry qualified names; those that never ran are listed with 0 calls
    functions = {f.qualified_name: f for f in run.functions
                 if f.source_id.endswith("shapes.py")}
    assert functions["area"].calls == 4
    for name in ("never_called", "Box.volume", "Box.unused"):
        assert functions[name].calls == 0 and functions[name].total_time_ns == 0, name
    # the decorated method is placed on its decorator's line, as Python places its code
    assert functions["Box.volume"].first_line == 10
    # AND the run tree is there, for child runs to come
    assert run.parent_id is None and run.children == [] and len(run.id) == 32


def test_a_failed_block_is_a_failed_run_in_the_result_and_its_json(ws, tmp_path):
    mod = ws.module("boom.py", """
        def explode():
            return 1 / 0
    """)
    with pytest.raises(ZeroDivisionError), profile(display="none",
                                                    root=str(ws.root)) as session:
        mod.explode()
    r = session.result
    assert r.root_run.status == RunStatus.FAILED and r.status == "failed"
    assert r.root_run.error == "ZeroDivisionError: division by zero"
    out = tmp_path / "r.json"
    session.save(out)
    data = json.loads(out.read_text())
    assert data["run"]["status"] == "failed"
    assert data["run"]["error"] == "ZeroDivisionError: division by zero"
    # a SystemExit(0) is a normal end
    with pytest.raises(SystemExit), profile(display="none", root=str(ws.root)) as ok:
        raise SystemExit(0)
    assert ok.result.root_run.status == RunStatus.SUCCESS


def test_save_while_running_with_trace_and_a_clear_error_otherwise(ws, tmp_path):
    mod = ws.module("loop.py", """
        def step(i):
            return i + 1
    """)
    session = Session(display="none", root=str(ws.root))
    session.start()
    for i in range(3):
        mod.step(i)
    # WHEN the report is saved while the session runs
    html = session.save(tmp_path / "mid.html")
    snapshot = tmp_path / "mid.json"
    session.save(snapshot)
    page = session.html()
    mod.step(9)
    result = session.stop()
    # THEN the snapshot holds what ran so far, and the final result everything
    data = json.loads(snapshot.read_text())
    calls = {f["qualname"]: f["calls"] for f in data["run"]["functions"]}
    assert calls["step"] == 3 and data["metadata"]["running"] is True
    assert result.function("step").calls == 4 and result.metadata["running"] is False
    assert Path(html).read_text().lower().startswith("<!doctype html>") and "loop.py" in page
    # AND a backend that reports only at stop says so
    sampled = Session(backend="sampler", display="none", root=str(ws.root))
    sampled.start()
    try:
        with pytest.raises(RuntimeError, match="reports only when it stops"):
            sampled.save(tmp_path / "no.html")
    finally:
        sampled.stop()
    # AND a session that never started has nothing to save
    with pytest.raises(RuntimeError, match="has not run"):
        Session(display="none").save(tmp_path / "never.html")


def test_include_and_exclude_accept_package_names(ws, tmp_path, monkeypatch):
    # GIVEN a package outside the root, importable from sys.path
    lib = tmp_path / "site"
    (lib / "mylib").mkdir(parents=True)
    (lib / "mylib" / "__init__.py").write_text("")
    (lib / "mylib" / "work.py").write_text("def crunch(n):\n    return sum(range(n))\n")
    (lib / "single.py").write_text("def one():\n    return 1\n")
    monkeypatch.syspath_prepend(str(lib))
    import mylib.work
    import single

    # WHEN it is included by its package name
    with profile(display="none", root=str(ws.root), include=["mylib", "single"]) as s:
        mylib.work.crunch(10)
        single.one()
    # THEN its files are recorded, the names becoming their locations
    files = {os.path.basename(f) for f in s.result.sources}
    assert {"work.py", "single.py"} <= files
    assert s.include == (str(lib / "mylib" / "*"), str(lib / "single.py"))
    # AND a package name in exclude wins over the include
    with profile(display="none", root=str(ws.root), include=["mylib"],
                 exclude=["mylib.work"]) as s2:
        mylib.work.crunch(10)
    assert not any(f.endswith("work.py") for f in s2.result.sources)
    # AND a name that no import finds stays a glob pattern
    assert profile(display="none", include=["no_such_pkg_xyz"]).include == ("no_such_pkg_xyz",)


def test_show_inline_false_opens_the_report_in_a_browser(ws, tmp_path, monkeypatch):
    # GIVEN a browser command that records the URL it was asked to open
    seen = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f"#!/bin/sh\necho \"$1\" >> {seen}\n")
    browser.chmod(0o755)
    monkeypatch.setenv("BROWSER", str(browser))
    import webbrowser

    monkeypatch.setattr(webbrowser, "_tryorder", None)  # re-read $BROWSER
    with profile(display="none", root=str(ws.root)) as session:
        sum(range(5))
    # WHEN show(inline=False) runs
    session.show(inline=False)
    # THEN the browser got the file URL of a saved, self-contained report
    url = seen.read_text().strip()
    assert url.startswith("file://") and url.endswith(".html")
    page = Path(url[len("file://"):])
    assert page.read_text().lower().startswith("<!doctype html>")
    page.unlink()
    # AND outside a notebook, show() prints the text summary and inline=True says why not
    session.show()
    with pytest.raises(RuntimeError, match="notebook"):
        session.show(inline=True)


def test_cli_version_and_notebooks_flag(tmp_path):
    # linescope --version
    out = subprocess.run([sys.executable, "-m", "linescope", "--version"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == f"linescope {linescope.__version__} (gpuprof " \
                                 f"{linescope.__version__})"
    # --no-notebooks is accepted (LineScope's flag); a failing script is a failed run
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        x = 1
        raise RuntimeError("script broke")
    """))
    res = subprocess.run([sys.executable, "-m", "linescope", "--no-notebooks", "-d", "none",
                          "-o", str(tmp_path / "r.json"), str(script)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 1 and "script broke" in res.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["run"]["status"] == "failed"
    assert data["run"]["error"] == "RuntimeError: script broke"
    assert data["options"]["notebooks"] is False
