"""The IPython cell magic through a real IPython shell: ``%load_ext linescope`` and
``%%linescope`` / ``%%profile`` with the CLI's options."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pytest

IPython = pytest.importorskip("IPython", reason="IPython is not installed (make setup)")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

import linescope  # noqa: E402
from linescope import profile  # noqa: E402


@pytest.fixture(scope="module")
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "linescope")
    yield sh
    from IPython.core.async_helpers import get_asyncio_loop

    get_asyncio_loop().close()  # the loop that ran top-level await (as IPython does at exit)


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
    # AND a front end without HTML (terminal IPython) shows the text summary, not a placeholder
    plain = [o.data["text/plain"] for o in out.outputs if "text/html" in o.data]
    assert plain[0].startswith("linescope (trace):") and "total += helper(1000)" in plain[0]
    # AND the cell's lines and the earlier cell's function were recorded with exact hits
    r = profile.result
    cell = [f for f, text in r.sources.items() if "total += helper(1000)" in text]
    # the snapshot is there, named as the notebook names the cell (never the compiled name)
    assert len(cell) == 1 and cell[0].startswith("cell ")
    assert r.sources[cell[0]].path.startswith("<ipython-input-")
    assert r.sources[cell[0]].kind == "notebook"
    cell_lines = {s.line: s.hits for s in r.lines if s.filename == cell[0]}
    assert cell_lines == {1: 1, 2: 4, 3: 3}  # line 1 is the first line after %%linescope
    assert r.function("helper").calls == 3


def test_a_cell_ending_in_an_expression_is_one_module_function(shell):
    # GIVEN a cell whose last line is an expression (compiled apart, for its Out[] value)
    res, _ = run(shell, "%%linescope -d none\nx = 0\nfor i in range(3):\n    x += i\nx\n")
    assert res.success and res.result == 3
    # THEN the cell's code is one <module> row in the functions, not one per part
    rows = [(f.filename, f.first_line) for f in profile.result.run.functions
            if f.qualname == "<module>"]
    assert len(rows) == 1 and rows[0][0].startswith("cell ")


def test_exclude_applies_to_cells_as_on_the_command_line(shell):
    # GIVEN a function defined in an earlier cell
    shell.run_cell("def early_cell_fn():\n    return 1\n")
    # WHEN a cell runs with -e matching every cell
    res, _ = run(shell, "%%linescope -d none -e '<ipython-input-*>'\nw = early_cell_fn()\n")
    # THEN it ran, and neither cell was recorded: the exclude wins over the cells' include
    assert res.success and shell.user_ns["w"] == 1
    assert [s for s in profile.result.lines
            if s.filename.startswith(("<ipython-input-", "cell "))] == []


def test_profile_alias_and_options(shell, tmp_path):
    out_file = tmp_path / "cell.json"
    res, out = run(shell, f"%%profile -d none --memory -o {out_file}\nblock = bytearray(1 << 20)\n")
    assert res.success
    assert not [o for o in out.outputs if "text/html" in o.data]  # -d none: nothing shown
    data = json.loads(out_file.read_text())
    assert data["options"]["memory"] is True and data["memory"]["timeline"]


@pytest.mark.parametrize("options, message", [
    ("--display sometimes", "argument -d/--display: invalid choice: 'sometimes'"),
    ("--backend nope", "unknown linescope backend 'nope'"),
    ("--sample-rate 100", "backend 'trace' does not support sample_rate"),
    ("--sample-rate 0", "argument --sample-rate: expected a positive number of samples"),
    ("--sample-rate inf", "argument --sample-rate: expected a positive number of samples"),
    ("-o ''", "argument -o/--output: expected a file name"),
])
def test_usage_error_is_a_message_and_nothing_runs(shell, options, message):
    # GIVEN the result of an earlier profiled cell
    run(shell, "%%linescope -d none\nbefore = 1\n")
    earlier = profile.result
    shell.user_ns.pop("ran", None)
    # WHEN a cell's options are wrong
    res, out = run(shell, f"%%linescope {options}\nran = True\n")
    # THEN the error is reported as a usage message, like every other one
    assert out.stderr.startswith(f"%%linescope: {message}"), out.stderr
    assert "usage: %%linescope [options]" in out.stderr and "Traceback" not in out.stderr
    # AND nothing ran: not the cell, not a session
    assert "ran" not in shell.user_ns
    assert profile.result is earlier


def test_unusable_output_is_a_usage_error(shell, tmp_path):
    shell.user_ns.pop("ran", None)
    res, out = run(shell, f"%%linescope -o {tmp_path}\nran = True\n")
    assert out.stderr.startswith("%%linescope: ") and repr(str(tmp_path)) in out.stderr
    assert "ran" not in shell.user_ns


def test_an_exception_in_the_cell_still_shows_the_report_and_propagates(shell):
    res, out = run(shell, "%%linescope\nx = 1\nraise ValueError('boom')\n")
    assert not res.success and isinstance(res.error_in_exec, ValueError)
    assert [o for o in out.outputs if "text/html" in o.data]
    assert profile.result.lines  # the session was stopped and its result kept
    with profile(display="none"):  # nothing was left running
        pass


def test_gpu_with_trace_in_a_cell_warns_at_the_cell_and_continues(shell):
    with pytest.warns(RuntimeWarning, match="not supported by the 'trace' backend") as caught:
        res, out = run(shell, "%%linescope --gpu -d none\ny = 2\n")
    assert res.success and shell.user_ns["y"] == 2
    # THEN the warning names the cell's first line (not IPython's code), once
    gpu = [w for w in caught if "GPU profiling" in str(w.message)]
    assert [(w.filename[:15], w.lineno) for w in gpu] == [("<ipython-input-", 1)]
    # AND its text is the result's one warning
    assert profile.result.warnings == [str(gpu[0].message)]


def _text(out) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout)  # without the colours


@pytest.mark.parametrize("body", [
    "ran = True\nx = (1,\n",
    "    ran = True\n    x = (1,\n",  # an indented body: dedented first, as a plain cell
    "ran = True\nreturn 5\n",  # parses, but does not compile
], ids=["parse", "indented", "compile"])
def test_a_syntax_error_is_reported_as_in_a_plain_cell(shell, body):
    # GIVEN the result of an earlier profiled cell
    run(shell, "%%linescope -d none\nbefore = 1\n")
    earlier = profile.result
    shell.user_ns.pop("ran", None)
    # WHEN a profiled cell does not compile, and then the same code as a plain cell
    res, out = run(shell, "%%linescope\n" + body)
    ran = shell.user_ns.pop("ran", None)
    plain, plain_out = run(shell, body)
    # THEN no session started, and the cell ran as far as the plain one: not at all, or (for
    # code that parses) IPython's statements before the one that does not compile
    assert profile.result is earlier
    assert ran == shell.user_ns.pop("ran", None) == (True if "return" in body else None)
    # AND IPython reported the error as for the plain cell: before running it, with the same
    # message and no traceback
    err = res.error_before_exec
    assert isinstance(err, SyntaxError) and res.error_in_exec is None
    assert (repr(err), err.lineno) == (repr(plain.error_before_exec), 2)  # file, line, text
    assert _text(out) == _text(plain_out) and "Traceback" not in _text(out)
    assert not [o for o in out.outputs if "text/html" in o.data]


def test_a_traceback_from_the_cell_leaves_out_linescope_frames(shell):
    # WHEN a profiled cell raises in a function of its own
    res, out = run(shell, "%%linescope -d none\ndef fails():\n    raise ValueError('boom')\n"
                          "fails()\n")
    # THEN the traceback goes from the magic's line to the cell's frames, without linescope's
    assert isinstance(res.error_in_exec, ValueError)
    text = _text(out)
    assert os.path.dirname(linescope.__file__) not in text, text
    assert "----> 3 fails()" in text and "----> 2     raise ValueError('boom')" in text


def _cell_lines(result, marker: str) -> dict[int, int]:
    cell = [f for f, text in result.sources.items() if marker in text]
    assert len(cell) == 1
    return {s.line: s.hits for s in result.lines if s.filename == cell[0]}


def test_top_level_await_runs_as_in_a_plain_cell(shell):
    # WHEN a profiled cell awaits at top level, also in its last expression
    res, out = run(shell, "%%linescope -d none\nimport asyncio\n"
                          "await asyncio.sleep(0.02)\nslept = True\n"
                          "await asyncio.sleep(0, result='awaited')\n")
    # THEN it ran like a plain cell, its value is the cell's result
    assert res.success, res.error_in_exec
    assert shell.user_ns["slept"] is True and res.result == "awaited"
    # AND its lines were profiled, the awaiting ones included
    assert _cell_lines(profile.result, "slept = True") == {1: 1, 2: 1, 3: 1, 4: 1}


def test_top_level_await_inside_a_running_loop_is_refused(shell):
    # GIVEN a caller that runs the cell inside its own event loop (as a Jupyter kernel does)
    shell.user_ns.pop("ran", None)

    async def kernel():
        return run(shell, "%%linescope\nimport asyncio\nawait asyncio.sleep(0)\nran = True\n")

    res, out = asyncio.run(kernel())
    # THEN a message says why and what to do instead; nothing ran
    assert out.stderr.startswith("%%linescope: top-level await cannot run here")
    assert "in a plain cell instead: `with linescope.profile(" in out.stderr
    assert "ran" not in shell.user_ns


def test_value_of_the_last_expression_is_the_result_as_in_a_plain_cell(shell):
    res, out = run(shell, "%%linescope -d none\nx = 6\nx * 7\n")
    assert res.success and res.result == 42 and shell.user_ns["_"] == 42
    assert _cell_lines(profile.result, "x * 7") == {1: 1, 2: 1}  # the expression is profiled
    # a trailing semicolon hides it, as in a plain cell
    res, out = run(shell, "%%linescope -d none\nx = 6\nx * 7;\n")
    assert res.success and res.result is None
    # a failing cell has no value
    res, out = run(shell, "%%linescope -d none\nx = 6\n1 / 0\n")
    assert isinstance(res.error_in_exec, ZeroDivisionError) and res.result is None


def test_display_comes_from_pyproject_unless_the_line_sets_it(shell, tmp_path):
    # GIVEN [tool.linescope] in the current directory turns the report off
    (tmp_path / "pyproject.toml").write_text('[tool.linescope]\ndisplay = "none"\n')
    # WHEN a cell runs without -d
    res, out = run(shell, "%%linescope\nquiet = 1\n")
    # THEN nothing is shown, as the command line shows nothing
    assert res.success and shell.user_ns["quiet"] == 1
    assert not [o for o in out.outputs if "text/html" in o.data] and out.stderr == ""
    # AND -d end in the magic's line shows the report anyway
    res, out = run(shell, "%%linescope -d end\nshown = 1\n")
    assert res.success and len([o for o in out.outputs if "text/html" in o.data]) == 1


def test_an_invalid_display_in_pyproject_is_a_usage_error(shell, tmp_path):
    # GIVEN [tool.linescope] with a display value that does not exist
    (tmp_path / "pyproject.toml").write_text('[tool.linescope]\ndisplay = "sometimes"\n')
    shell.user_ns.pop("ran", None)
    # WHEN a cell runs without -d
    res, out = run(shell, "%%linescope\nran = True\n")
    # THEN it is a usage error naming the file, as on the command line, and nothing ran
    assert out.stderr.startswith("%%linescope: display must be one of 'none', 'end', not "
                                 "'sometimes' (set by [tool.linescope] in "), out.stderr
    assert "ran" not in shell.user_ns


def test_options_override_pyproject(shell, tmp_path):
    # GIVEN [tool.linescope] in the current directory turns memory on
    (tmp_path / "pyproject.toml").write_text("[tool.linescope]\nmemory = true\n")
    # WHEN a cell runs with --no-memory
    res, out = run(shell, "%%linescope -d none --no-memory\nvalue = 1\n")
    # THEN memory was not collected
    assert res.success and out.stderr == ""
    assert profile.result.options["memory"] is False and profile.result.memory is None
    assert profile.result.metadata["config_file"] == str(tmp_path / "pyproject.toml")


def test_pyproject_include_still_applies_beside_the_cells(shell, tmp_path, monkeypatch):
    # GIVEN [tool.linescope] records a library outside the root
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "cellhelper.py").write_text("def twice(n):\n    return 2 * n\n")
    monkeypatch.syspath_prepend(str(lib))
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text(f'[tool.linescope]\ninclude = ["{lib}/*"]\n')
    monkeypatch.chdir(root)
    # WHEN a cell calls it
    res, out = run(shell, "%%linescope -d none\nimport cellhelper\ncellhelper.twice(2)\n")
    # THEN both the cell and the library were recorded
    assert res.success and res.result == 4
    names = {os.path.basename(s.filename) for s in profile.result.lines}
    assert "cellhelper.py" in names and any(n.startswith("cell ") for n in names)


def test_relative_output_is_resolved_when_the_cell_starts(shell, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    res, out = run(shell, "%%linescope -d none -o cell.json\nimport os\nos.chdir('elsewhere')\n")
    os.chdir(tmp_path)
    assert res.success
    assert json.loads((tmp_path / "cell.json").read_text())["run"]["lines"]
    assert not (tmp_path / "elsewhere" / "cell.json").exists()


def test_a_report_that_cannot_be_written_does_not_replace_the_cell_s_exception(shell, tmp_path):
    # GIVEN a cell whose -o directory is replaced by a file while it runs, and which raises
    out = tmp_path / "out"
    out.mkdir()
    shell.user_ns["out_dir"] = out
    cell = (f"%%linescope -d none -o {out}/r.json\n"
            "out_dir.rmdir(); out_dir.write_text('a file now')\n"
            "raise KeyError('the cell error')\n")
    # WHEN it runs
    with pytest.warns(RuntimeWarning, match="could not finish the session") as caught:
        res, _ = run(shell, cell)
    # THEN the cell fails with its own exception, and the warning names the cell and the
    # result that is kept
    assert isinstance(res.error_in_exec, KeyError)
    said = [w for w in caught if "could not finish" in str(w.message)]
    assert said and said[0].filename.startswith("<ipython-input-")
    assert "linescope.profile.result" in str(said[0].message)


def test_help_lists_the_options_and_does_not_run_the_cell(shell):
    # WHEN the magic is asked for help
    shell.user_ns.pop("ran_help", None)
    res, out = run(shell, "%%linescope --help\nran_help = True\n")
    # THEN its options are listed, nothing is an error and the cell did not run
    assert res.success and "ran_help" not in shell.user_ns
    assert "--backend" in out.stdout and "--memory" in out.stdout and "--help" in out.stdout
    assert out.stderr == "" and not [o for o in out.outputs if "text/html" in o.data]
