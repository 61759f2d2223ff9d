"""The IPython cell magic through a real IPython shell: ``%load_ext linescope`` and
``%%linescope`` / ``%%profile`` with the CLI's options."""

from __future__ import annotations

import json

import pytest

IPython = pytest.importorskip("IPython", reason="IPython is not installed (make setup)")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from linescope import profile  # noqa: E402


@pytest.fixture(scope="module")
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "linescope")
    return sh


def run(shell, text: str):
    with capture_output() as out:
        res = shell.run_cell(text)
    return res, out


def test_cell_magic_profiles_the_cell_and_shows_the_report_inline(shell):
    # GIVEN a function defined in an earlier cell
    shell.run_cell("def helper(n):\n    return sum(i * i for i in range(n))\n")
    # WHEN a cell runs under %%linescope
    res, out = run(shell, "%%linescope\ntotal = 0\nfor k in range(3):\n"
                          "    total += helper(1000)\n")
    # THEN the cell ran in the user namespace
    assert res.success and shell.user_ns["total"] == 3 * sum(i * i for i in range(1000))
    # AND the report is shown inline, self-contained
    html = [o.data["text/html"] for o in out.outputs if "text/html" in o.data]
    assert len(html) == 1 and "<iframe srcdoc=" in html[0]
    # AND the cell's lines and the earlier cell's function were recorded with exact hits
    r = profile.result
    cell = [f for f, text in r.sources.items() if "total += helper(1000)" in text]
    assert len(cell) == 1 and cell[0].startswith("<ipython-input-")  # the snapshot is there
    cell_lines = {s.line: s.hits for s in r.lines if s.filename == cell[0]}
    assert cell_lines == {1: 1, 2: 4, 3: 3}  # line 1 is the first line after %%linescope
    assert r.function("helper").calls == 3


def test_profile_alias_and_options(shell, tmp_path):
    out_file = tmp_path / "cell.json"
    res, out = run(shell, f"%%profile -d none --memory -o {out_file}\nblock = bytearray(1 << 20)\n")
    assert res.success
    assert not [o for o in out.outputs if "text/html" in o.data]  # -d none: nothing shown
    data = json.loads(out_file.read_text())
    assert data["options"]["memory"] is True and data["memory"]["timeline"]


def test_usage_error_is_a_message_and_the_cell_does_not_run(shell):
    shell.user_ns.pop("ran", None)
    res, out = run(shell, "%%linescope --display sometimes\nran = True\n")
    assert "invalid choice" in out.stderr
    assert "ran" not in shell.user_ns
    res, out = run(shell, "%%linescope --backend nope\nran = True\n")
    assert "unknown linescope backend 'nope'" in out.stderr
    assert "ran" not in shell.user_ns


def test_an_exception_in_the_cell_still_shows_the_report_and_propagates(shell):
    res, out = run(shell, "%%linescope\nx = 1\nraise ValueError('boom')\n")
    assert not res.success and isinstance(res.error_in_exec, ValueError)
    assert [o for o in out.outputs if "text/html" in o.data]
    assert profile.result.lines  # the session was stopped and its result kept
    with profile(display="none"):  # nothing was left running
        pass


def test_gpu_with_trace_in_a_cell_warns_and_continues(shell):
    with pytest.warns(RuntimeWarning, match="not supported by the 'trace' backend"):
        res, out = run(shell, "%%linescope --gpu -d none\ny = 2\n")
    assert res.success and shell.user_ns["y"] == 2
    assert len(profile.result.warnings) == 1
