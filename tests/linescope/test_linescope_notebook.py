"""Notebook sessions through a real IPython shell: ``profile.start()`` in one cell records the
cells that run after it, each named ``cell N`` (N = the execution count, as ``In [N]``),
``save()`` while it runs, ``show(inline=...)`` and the cell magic's labels."""

from __future__ import annotations

import json

import pytest

IPython = pytest.importorskip("IPython", reason="IPython is not installed (make setup)")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from linescope import profile  # noqa: E402


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "linescope")
    yield sh
    if profile._default is not None and profile._default.running:  # a failed test's session
        profile._default.stop()


def cell(sh, text: str):
    """Runs a cell as a notebook does (stored in the history: the execution count moves on),
    and returns (its execution count, the result)."""
    number = sh.execution_count
    with capture_output() as out:
        res = sh.run_cell(text, store_history=True)
    assert res.success, (res.error_before_exec, res.error_in_exec, out.stderr)
    return number, out


def test_profile_start_records_every_later_cell_named_cell_n(shell, tmp_path):
    # GIVEN a session started in one cell, with no include pattern
    start, _ = cell(shell, "from linescope import profile\n"
                           "session = profile.start(display='none')\n")
    # WHEN later cells define and call functions
    define, _ = cell(shell, "def square_sum(n):\n    return sum(i * i for i in range(n))\n")
    use, _ = cell(shell, "total = 0\nfor k in range(3):\n    total += square_sum(100)\n")
    cell(shell, "result = profile.stop()\n")
    r = shell.user_ns["result"]
    # THEN each later cell is a source named by its execution count, never its compiled name
    assert f"cell {define}" in r.sources and f"cell {use}" in r.sources
    assert not any(name.startswith(("<ipython-input-", "/tmp/")) for name in r.sources)
    unit = r.sources[f"cell {use}"]
    assert unit.kind == "notebook" and unit.path.startswith("<ipython-input-")
    assert "total += square_sum(100)" in unit.source
    # AND its lines carry exact hits, found through LineScope's location names
    hits = {s.location.line: s.hits for s in r.root_run.lines
            if s.location.source_id == f"cell {use}"}
    assert hits == {1: 1, 2: 4, 3: 3}
    f = r.function("square_sum")
    assert f.filename == f"cell {define}" and f.calls == 3
    # AND the report and the JSON name the cells the same way
    html_path = tmp_path / "nb.html"
    profile.save(html_path)
    page = html_path.read_text()
    assert f"cell {use}" in page and "<ipython-input-" not in page.replace(unit.path, "")
    json_path = tmp_path / "nb.json"
    profile.save(json_path)
    data = json.loads(json_path.read_text())
    assert f"cell {use}" in data["sources"]
    assert start < define < use


def test_notebooks_false_leaves_the_cells_out(shell):
    # GIVEN a session started with notebooks=False
    cell(shell, "from linescope import profile\n"
                "session = profile.start(display='none', notebooks=False)\n")
    # WHEN a cell runs
    cell(shell, "x = sum(range(100))\n")
    cell(shell, "result = profile.stop()\n")
    # THEN no cell was recorded (only an include pattern would record them)
    r = shell.user_ns["result"]
    assert not any(name.startswith("cell ") for name in r.sources)
    assert r.options["notebooks"] is False


def test_save_while_the_session_runs_writes_the_cells_so_far(shell, tmp_path):
    # GIVEN a running notebook session with one measured cell
    cell(shell, "from linescope import profile\n"
                "session = profile.start(display='none')\n")
    measured, _ = cell(shell, "def twice(x):\n    return 2 * x\ny = twice(3) + twice(4)\n")
    # WHEN a later cell saves the report (module level and on the session) while it runs
    out = tmp_path / "running.json"
    shell.user_ns["out"] = str(out)
    cell(shell, "path = profile.save(out)\nstate = str(session.state)\n")
    # THEN the saved result has the cell measured so far, and the session still runs
    data = json.loads(out.read_text())
    assert shell.user_ns["state"] == "running"
    assert data["metadata"]["running"] is True and data["run"]["status"] == "success"
    lines = {(s["filename"], s["line"]): s["hits"] for s in data["run"]["lines"]}
    assert lines[(f"cell {measured}", 3)] == 1
    assert {f["qualname"]: f["calls"] for f in data["run"]["functions"]}["twice"] == 2
    # AND it goes on measuring after the save, and stops normally
    after, _ = cell(shell, "z = twice(21)\n")
    cell(shell, "result = profile.stop()\n")
    final = shell.user_ns["result"]
    assert final.function("twice").calls == 3
    assert final.line(f"cell {after}", 1).hits == 1


def test_show_inline_displays_the_report_in_a_notebook_kernel(shell, monkeypatch):
    # GIVEN a finished notebook session
    cell(shell, "from linescope import profile\n"
                "session = profile.start(display='none')\n")
    cell(shell, "v = 1 + 1\n")
    cell(shell, "profile.stop()\n")
    session = shell.user_ns["session"]
    # WHEN show(inline=True) runs outside a notebook kernel (terminal IPython)
    # THEN it says why it cannot display the report there
    with pytest.raises(RuntimeError, match="Jupyter notebook cell"):
        session.show(inline=True)
    with pytest.raises(TypeError, match="inline"):
        session.show(inline="yes")
    # WHEN the shell is a notebook kernel's
    monkeypatch.setattr(shell, "kernel", object(), raising=False)
    for how in ({}, {"inline": True}):
        with capture_output() as out:
            session.show(**how)
        # THEN the self-contained report is displayed in the cell (None and True)
        html = [o.data["text/html"] for o in out.outputs if "text/html" in o.data]
        assert len(html) == 1 and "<iframe srcdoc=" in html[0], how


def test_the_cell_magic_names_its_cell_by_the_execution_count(shell):
    # WHEN a %%linescope cell runs as a notebook cell
    number, _ = cell(shell, "%%linescope -d none\nacc = 0\nfor i in range(4):\n    acc += i\n")
    # THEN its lines are under "cell N", N its execution count
    r = profile.result
    assert {s.line: s.hits for s in r.lines if s.filename == f"cell {number}"} == {
        1: 1, 2: 5, 3: 4}
    assert r.sources[f"cell {number}"].kind == "notebook"


def test_a_failing_cell_under_the_magic_marks_the_run_failed(shell):
    # WHEN a %%linescope cell raises
    number = shell.execution_count
    with capture_output():
        res = shell.run_cell("%%linescope -d none\nq = 1\nraise ValueError('bad cell')\n",
                             store_history=True)
    # THEN the cell fails as a plain cell would, and the run says why it failed
    assert isinstance(res.error_in_exec, ValueError)
    r = profile.result
    assert str(r.root_run.status) == "failed"
    assert r.root_run.error == "ValueError: bad cell"
    assert r.line(f"cell {number}", 1).hits == 1


def test_in_a_notebook_kernel_stop_shows_the_report_in_the_cell(shell, monkeypatch):
    # GIVEN a notebook kernel and a session started with the default display ("end")
    monkeypatch.setattr(shell, "kernel", object(), raising=False)
    cell(shell, "from linescope import profile\nsession = profile.start()\n")
    cell(shell, "w = [i for i in range(10)]\n")
    # WHEN a later cell stops it (its value is the cell's Out[])
    _, out = cell(shell, "profile.stop()\n")
    # THEN the report is displayed inline, and the result's repr is one short line
    html = [o.data["text/html"] for o in out.outputs if "text/html" in o.data]
    assert len(html) == 1 and "<iframe srcdoc=" in html[0]
    text = repr(profile.result)
    assert text.startswith("<linescope ProfileResult: trace, success,") and "\n" not in text


def test_a_real_jupyter_kernel_names_cells_and_shows_the_report_at_stop(tmp_path):
    # GIVEN a notebook that starts a session in its first cell and stops it in a later one
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from gpuprof_testutil import run_notebook

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "from linescope import profile\nsession = profile.start()",
        "def f(n):\n    return sum(i * i for i in range(n))",
        "x = f(1000)\ny = f(10)",
        "profile.save('mid.json')",
        "result = profile.stop()",
        "print(sorted(k for k in result.sources if k.startswith('cell ')))\n"
        "print(sorted({s.filename for s in result.lines}))\n"
        "print(result.function('f').filename, result.function('f').calls)",
    )]
    src, done = tmp_path / "session.ipynb", tmp_path / "done.ipynb"
    nbformat.write(nb, src)
    # WHEN it runs in a fresh ipykernel (cells compiled to /tmp/ipykernel_*/…py)
    p = run_notebook(src, done, tmp_path, cell_timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    cells = nbformat.read(done, as_version=4).cells
    printed = "".join(o.get("text", "") for o in cells[5].outputs if o.get("name") == "stdout")
    # THEN the cells after start() are recorded as "cell N" (N as In [N]), never a temp path
    assert "['cell 1', 'cell 2', 'cell 3', 'cell 4', 'cell 5']" in printed
    assert "ipykernel" not in printed and "cell 2 2" in printed
    # AND stop() showed the report inline in its cell (display="end" in a notebook)
    html = [o.get("data", {}).get("text/html", "") for o in cells[4].outputs]
    assert any("<iframe srcdoc=" in h for h in html)
    # AND the mid-session save holds the cells run so far
    mid = json.loads((tmp_path / "mid.json").read_text())
    assert mid["metadata"]["running"] is True
    assert {f["qualname"]: f["calls"] for f in mid["run"]["functions"]}["f"] == 2
