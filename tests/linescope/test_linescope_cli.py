"""The linescope CLI: the target runs as under plain python (argv, sys.path, exit status),
the output is written even when the target fails, and usage errors exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest


def linescope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "linescope"
    assert exe.exists(), "the linescope console script is not installed (run make setup)"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The same target under plain python, for comparison."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


# Dumps what a script sees of itself to the JSON file named by its first argument.
STATE_DUMP = """
    import json, sys
    def annotated(a: int): pass
    json.dump({"file": __file__, "argv": sys.argv, "path0": sys.path[0], "name": __name__,
               "package": __package__, "cached": __cached__,
               "spec": None if __spec__ is None else [__spec__.name, __spec__.origin],
               "loader": type(__loader__).__name__,
               "is_main": sys.modules["__main__"].__dict__ is globals(),
               "annotation": repr(annotated.__annotations__["a"]),
               "module_annotations": repr(globals().get("__annotations__", "missing")),
               "builtins": type(__builtins__).__name__},
              open(sys.argv[1], "w"))
    """


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "target.py"
    path.write_text(
        "import json, sys, time\n"
        "def work():\n"
        "    time.sleep(0.02)\n"
        "work()\n"
        "json.dump({'argv': sys.argv, 'path0': sys.path[0], 'name': __name__},\n"
        "          open('seen.json', 'w'))\n"
        "if '--fail' in sys.argv:\n"
        "    raise RuntimeError('boom')\n"
        "sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)\n")
    return path


def test_script_argv_path_and_exit_status(script, tmp_path):
    # WHEN the script exits with status 3
    p = linescope("-d", "none", "-o", "out.json", "target.py", "--flag", "3", cwd=tmp_path)
    # THEN the status, argv and sys.path[0] are those of `python target.py --flag 3`
    assert p.returncode == 3, p.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": ["target.py", "--flag", "3"], "path0": str(tmp_path),
                    "name": "__main__"}
    data = json.loads((tmp_path / "out.json").read_text())
    lines = {(Path(l["filename"]).name, l["line"]): l for l in data["run"]["lines"]}
    assert lines[("target.py", 3)]["hits"] == 1
    assert lines[("target.py", 3)]["wall_time_ns"] >= 20_000_000
    assert data["backend"] == "trace"


def test_failing_script_still_writes_output(script, tmp_path):
    p = linescope("-d", "end", "-o", "out.json", "target.py", "--fail", cwd=tmp_path)
    assert p.returncode == 1
    assert "RuntimeError: boom" in p.stderr
    assert "linescope (trace)" in p.stderr  # the end-of-run summary
    data = json.loads((tmp_path / "out.json").read_text())
    assert any(l["line"] == 8 for l in data["run"]["lines"])


def test_module_mode(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text(
        "import json, sys\n"
        "json.dump({'argv': sys.argv, 'path0': sys.path[0]}, open('seen.json', 'w'))\n")
    p = linescope("-d", "none", "-o", "o.json", "-m", "pkg.tool", "a", "b", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == [str(pkg / "tool.py"), "a", "b"]
    assert seen["path0"] == str(tmp_path)
    data = json.loads((tmp_path / "o.json").read_text())
    assert {Path(l["filename"]).name for l in data["run"]["lines"]} == {"tool.py"}


@pytest.mark.parametrize("target, words", [
    (("-m", "tool"), ("-o", "results.csv", "-v")),
    (("-m", "tool"), ("--verbose",)),
    (("-m", "tool"), ("--out", "x")),  # not an abbreviation of linescope's --output
    (("-m", "tool"), ("-h", "--", "y")),
    (("-mtool",), ("-d", "end", "-o", "results.csv")),  # attached, as python takes it
    (("tool/__main__.py",), ("-o", "results.csv", "--help")),  # as for a script
], ids=["-o", "--verbose", "--out", "-h --", "-mtool", "script"])
def test_everything_after_the_target_goes_to_the_target_as_under_python(tmp_path, target, words):
    # GIVEN a module that records the argv it sees, and a file of the module's own
    write(tmp_path / "tool" / "__main__.py", """
        import json, sys
        json.dump(sys.argv, open("seen.json", "w"))
    """)
    (tmp_path / "results.csv").write_text("the module's\n")
    # WHEN it runs with options of its own under python, and under linescope (whose own
    # options come before the target)
    plain = python(*target, *words, cwd=tmp_path)
    expected = json.loads((tmp_path / "seen.json").read_text())
    p = linescope("-d", "none", "-o", "o.json", *target, *words, cwd=tmp_path)
    # THEN it sees the argv python gives it (argv[0] included), its words untouched
    assert p.returncode == 0 == plain.returncode, p.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == expected and seen[1:] == list(words)
    # AND linescope took none of them: its output went to o.json, results.csv is untouched
    assert p.stdout == "" and (tmp_path / "results.csv").read_text() == "the module's\n"
    data = json.loads((tmp_path / "o.json").read_text())
    assert {Path(l["filename"]).name for l in data["run"]["lines"]} == {"__main__.py"}


@pytest.mark.parametrize("kind", ["directory", "zip"])
def test_a_directory_or_zip_archive_runs_its_main_as_under_python(tmp_path, kind):
    # GIVEN an application directory (or zip archive) with a __main__.py and a helper module
    app = tmp_path / "app"
    write(app / "helper.py", """
        def twice(x):
            return 2 * x
    """)
    write(app / "__main__.py", """
        import json, sys
        import helper
        json.dump({"argv": sys.argv, "path0": sys.path[0], "value": helper.twice(21)},
                  open(sys.argv[1], "w"))
    """)
    target = "app"
    if kind == "zip":
        import zipfile
        with zipfile.ZipFile(tmp_path / "app.pyz", "w") as z:
            for f in ("__main__.py", "helper.py"):
                z.write(app / f, f)
        target = "app.pyz"
    # WHEN it runs under linescope and under python
    p = linescope("-d", "none", "-o", "o.json", target, "profiled.json", cwd=tmp_path)
    plain = python(target, "plain.json", cwd=tmp_path)
    # THEN it sees the same argv and sys.path[0], and its files are recorded
    assert p.returncode == 0 == plain.returncode, p.stderr
    assert (json.loads((tmp_path / "profiled.json").read_text())
            == {**json.loads((tmp_path / "plain.json").read_text()), "argv": [target, "profiled.json"]})
    data = json.loads((tmp_path / "o.json").read_text())
    assert {Path(l["filename"]).name for l in data["run"]["lines"]} == {"__main__.py", "helper.py"}
    # AND the report carries their source (from the archive's loader for a zip)
    sources = {Path(name).name: text for name, text in data["sources"].items()}
    assert "helper.twice(21)" in sources["__main__.py"]
    assert "return 2 * x" in sources["helper.py"]


@pytest.mark.parametrize("target, files, message", [
    (("-m", "nosuchmod"), {}, "No module named nosuchmod"),
    (("-m", "pkg"), {"pkg/__init__.py": ""},
     "No module named pkg.__main__; 'pkg' is a package and cannot be directly executed"),
    (("appdir",), {"appdir/x.py": ""}, "can't find '__main__' module in '{tmp}/appdir'"),
])
def test_nothing_to_run_is_one_line_and_status_1_as_under_python(tmp_path, target, files, message):
    for name, text in files.items():
        write(tmp_path / name, text)
    message = message.format(tmp=tmp_path)
    p = linescope("-d", "none", *target, cwd=tmp_path)
    plain = python(*target, cwd=tmp_path)
    assert p.returncode == 1 == plain.returncode
    assert p.stderr == f"linescope: {message}\n"  # one line, no runpy traceback
    assert plain.stderr == f"{sys.executable}: {message}\n"


def test_an_import_error_in_the_target_keeps_its_traceback(tmp_path):
    write(tmp_path / "bad/__init__.py", "raise ImportError('broken package')\n")
    write(tmp_path / "bad/tool.py", "")
    p = linescope("-d", "none", "-m", "bad.tool", cwd=tmp_path)
    assert p.returncode == 1
    assert "Traceback" in p.stderr and "bad/__init__.py\", line 1" in p.stderr
    assert "ImportError: broken package" in p.stderr and "runpy" not in p.stderr


def test_a_leading_double_dash_ends_the_options_as_under_python(script, tmp_path):
    p = linescope("-d", "none", "--", "target.py", "--", "x", cwd=tmp_path)
    plain = python("--", "target.py", "--", "x", cwd=tmp_path)
    assert p.returncode == 0 == plain.returncode, p.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["argv"] == ["target.py", "--", "x"]


@pytest.mark.parametrize("args, match", [
    ((), "give a script"),
    (("--",), "give a script"),
    (("-m",), "argument -m: expected one argument"),
    (("-d", "none", "-m"), "argument -m: expected one argument"),
    (("--verbose", "target.py"), "unrecognized arguments: --verbose"),
    (("missing.py",), "can't open file"),
    (("--backend", "nope", "target.py"), "unknown linescope backend"),
    (("-d", "sometimes", "target.py"), "invalid choice"),
    (("--sample-rate", "100", "target.py"), "does not support sample_rate (--sample-rate)"),
    (("--sample-rate", "100", "target.py"), "command line: --backend sampler"),
])
def test_usage_errors_exit_2(script, tmp_path, args, match):
    p = linescope(*args, cwd=tmp_path)
    assert p.returncode == 2
    assert match in p.stderr
    assert not (tmp_path / "seen.json").exists()


def test_memory_flag_collects_memory_with_the_default_backend(script, tmp_path):
    p = linescope("--memory", "-d", "none", "-o", "m.json", "target.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["options"]["memory"] is True
    assert data["memory"]["peak_rss_bytes"] >= data["memory"]["start_rss_bytes"] > 0
    assert data["memory"]["timeline"] and data["memory"]["per_line"] is True


def test_gpu_with_trace_warns_once_as_a_linescope_message_and_runs(script, tmp_path):
    # WHEN the trace backend is asked for GPU data
    p = linescope("--gpu", "-d", "none", "-o", "o.json", "target.py", cwd=tmp_path)
    # THEN the run goes on, with the warning printed once as a plain linescope line
    assert p.returncode == 0, p.stderr
    warned = [l for l in p.stderr.splitlines() if "GPU profiling is not supported" in l]
    assert len(warned) == 1 and warned[0].startswith("linescope: warning: GPU profiling")
    assert "RuntimeWarning" not in p.stderr and "bin/linescope" not in p.stderr
    # AND the same text is in the result
    data = json.loads((tmp_path / "o.json").read_text())
    assert data["warnings"] == [warned[0].removeprefix("linescope: warning: ")]


def test_python_dash_m_linescope(script, tmp_path):
    p = subprocess.run([sys.executable, "-m", "linescope", "-d", "none", "target.py", "0"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["argv"] == ["target.py", "0"]


@pytest.mark.parametrize("typed", ["sub/target.py", "alias/link.py"])
def test_script_sees_what_plain_python_shows_it(tmp_path, typed):
    # GIVEN a script in a subdirectory, also reached through a symlink in another directory
    real = write(tmp_path / "sub" / "target.py", STATE_DUMP)
    (tmp_path / "alias").mkdir()
    (tmp_path / "alias" / "link.py").symlink_to(real)
    # WHEN it runs by a relative path under python and under linescope
    plain = python(typed, "plain.json", cwd=tmp_path)
    p = linescope("-d", "none", "-o", "out.json", typed, "profiled.json", cwd=tmp_path)
    assert plain.returncode == 0 and p.returncode == 0, p.stderr
    # THEN __file__ is absolute, argv[0] as typed, sys.path[0] the resolved script's
    # directory, and the rest of __main__ is as python sets it
    seen = json.loads((tmp_path / "profiled.json").read_text())
    expected = json.loads((tmp_path / "plain.json").read_text())
    assert seen == {**expected, "argv": [typed, "profiled.json"]}
    assert seen["file"] == str(tmp_path / typed) and seen["path0"] == str(real.parent)
    # AND the report names the code by its absolute path
    data = json.loads((tmp_path / "out.json").read_text())
    assert {l["filename"] for l in data["run"]["lines"]} == {seen["file"]}


def test_module_sees_what_plain_python_shows_it(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "tool.py", STATE_DUMP)
    plain = python("-m", "pkg.tool", "plain.json", cwd=tmp_path)
    p = linescope("-d", "none", "-m", "pkg.tool", "profiled.json", cwd=tmp_path)
    assert plain.returncode == 0 and p.returncode == 0, p.stderr
    seen = json.loads((tmp_path / "profiled.json").read_text())
    expected = json.loads((tmp_path / "plain.json").read_text())
    assert seen == {**expected, "argv": [expected["argv"][0], "profiled.json"]}
    assert seen["file"] == seen["argv"][0] == str(tmp_path / "pkg" / "tool.py")


UNCAUGHT = {
    "default hook": """
        def fail():
            raise RuntimeError("boom")
        fail()
        """,
    "script's own hook": """
        import sys
        def hook(etype, value, tb):
            print(f"custom hook: {etype.__name__}: {value} at line {tb.tb_lineno}",
                  file=sys.stderr)
        sys.excepthook = hook
        raise ValueError("bad value")
        """,
    "hook that fails": """
        import sys
        def hook(etype, value, tb):
            raise LookupError("hook broke")
        sys.excepthook = hook
        raise ValueError("bad value")
        """,
    "KeyboardInterrupt": """
        def wait():
            raise KeyboardInterrupt
        wait()
        """,
    "syntax error": """
        x = (1,
        """,
}


@pytest.mark.parametrize("case", UNCAUGHT)
def test_uncaught_exception_is_reported_through_sys_excepthook_like_python(tmp_path, case):
    # GIVEN a script that ends with an uncaught exception
    write(tmp_path / "target.py", UNCAUGHT[case])
    # WHEN it runs under python and under linescope (no summary)
    plain = python("target.py", cwd=tmp_path)
    p = linescope("-d", "none", "-o", "out.json", "target.py", cwd=tmp_path)
    # THEN stderr is what python prints (the hook's output; no linescope or runpy frames)
    assert p.stderr == plain.stderr
    assert str(tmp_path / "target.py") in p.stderr or case == "script's own hook"
    # AND the status is python's: 1, or 130 for KeyboardInterrupt (python ends by SIGINT)
    assert plain.returncode == (-2 if case == "KeyboardInterrupt" else 1)
    assert p.returncode == (130 if case == "KeyboardInterrupt" else 1)
    # AND the report is still written
    assert json.loads((tmp_path / "out.json").read_text())["backend"] == "trace"


def test_excepthook_that_exits_sets_the_status(tmp_path):
    write(tmp_path / "target.py", """
        import sys
        def hook(*exc):
            sys.exit(4)
        sys.excepthook = hook
        raise ValueError("bad value")
        """)
    assert python("target.py", cwd=tmp_path).returncode == 4
    p = linescope("-d", "none", "-o", "out.json", "target.py", cwd=tmp_path)
    assert p.returncode == 4 and p.stderr == ""
    assert (tmp_path / "out.json").exists()


def test_relative_output_is_resolved_against_the_start_directory(tmp_path):
    # GIVEN a script that changes directory while it runs
    write(tmp_path / "target.py", """
        import os
        os.makedirs("elsewhere")
        os.chdir("elsewhere")
        """)
    # WHEN it runs with a relative -o
    p = linescope("-d", "none", "-o", "reports/out.json", "target.py", cwd=tmp_path)
    # THEN the output lies under the directory linescope started in
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "reports" / "out.json").read_text())["run"]["lines"]
    assert not (tmp_path / "elsewhere" / "reports").exists()


def _unusable_output(tmp_path: Path, kind: str) -> str:
    if kind == "existing directory":
        (tmp_path / "outdir").mkdir()
        return "outdir"
    if kind == "under a regular file":
        (tmp_path / "plain.txt").write_text("x")
        return "plain.txt/sub/x.html"
    if kind == "under /etc/passwd":
        return "/etc/passwd/x.html"
    if kind == "a file system that takes no files":
        if not os.path.isdir("/proc/self"):
            pytest.skip("needs Linux's /proc")
        return "/proc/x.html"  # no file can be created there, by root neither
    if os.geteuid() == 0:
        pytest.skip("root may write into any directory")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    return "locked/new/x.html"


@pytest.mark.parametrize("kind", ["existing directory", "under a regular file",
                                  "under /etc/passwd", "a file system that takes no files",
                                  "non-writable directory"])
def test_unusable_output_is_a_usage_error_before_the_target_runs(script, tmp_path, kind):
    out = _unusable_output(tmp_path, kind)
    p = linescope("-d", "none", "-o", out, "target.py", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert os.path.join(tmp_path, out) in p.stderr  # the message names the path
    assert not (tmp_path / "seen.json").exists()  # the target did not run


def test_missing_parents_of_the_output_are_created(script, tmp_path):
    p = linescope("-d", "none", "-o", "new/deeper/out.html", "target.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "new" / "deeper" / "out.html").read_text().startswith("<!")


def test_options_override_pyproject(script, tmp_path):
    # GIVEN [tool.linescope] turns memory on
    (tmp_path / "pyproject.toml").write_text("[tool.linescope]\nmemory = true\n")
    # WHEN --no-memory is given
    p = linescope("--no-memory", "-d", "none", "-o", "o.json", "target.py", cwd=tmp_path)
    # THEN the run has no memory data
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "o.json").read_text())
    assert data["options"]["memory"] is False and data["memory"] is None
    assert data["metadata"]["config_file"] == str(tmp_path / "pyproject.toml")


def test_sample_rate_reaches_a_sampling_backend(script, tmp_path):
    p = linescope("--backend", "sampler", "--sample-rate", "250", "-d", "none", "-o", "o.json",
                  "target.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "o.json").read_text())
    assert data["backend"] == "sampler" and data["options"]["sample_rate"] == 250.0


@pytest.mark.parametrize("rate", ["0", "-5", "inf", "nan", "fast"])
def test_bad_sample_rate_is_a_usage_error(script, tmp_path, rate):
    p = linescope("--backend", "sampler", "--sample-rate", rate, "target.py", cwd=tmp_path)
    assert p.returncode == 2
    assert f"argument --sample-rate: expected a positive number of samples per second" \
           f" (for example 1000), not {rate!r}" in p.stderr
    assert not (tmp_path / "seen.json").exists()


def test_pyproject_include_still_applies_beside_the_script(tmp_path):
    # GIVEN a project whose [tool.linescope] also records a library outside the root
    write(tmp_path / "lib" / "helper.py", """
        def helper():
            return sum(range(100))
        """)
    proj = tmp_path / "proj"
    write(proj / "pyproject.toml", f"""
        [tool.linescope]
        include = ["{tmp_path / 'lib'}/*"]
        """)
    write(proj / "main.py", f"""
        import sys
        sys.path.insert(0, {str(tmp_path / 'lib')!r})
        import helper
        helper.helper()
        """)
    # WHEN the script runs without -i
    p = linescope("-d", "none", "-o", "o.json", "main.py", cwd=proj)
    # THEN the library is recorded beside the script
    assert p.returncode == 0, p.stderr
    data = json.loads((proj / "o.json").read_text())
    files = {Path(l["filename"]).name for l in data["run"]["lines"]}
    assert files == {"main.py", "helper.py"}
    assert data["options"]["include"] == [f"{tmp_path / 'lib'}/*", str(proj / "main.py")]


def test_report_shows_the_source_as_it_ran_when_the_script_edits_itself(tmp_path):
    # GIVEN a script that rewrites its own file while it runs
    path = write(tmp_path / "target.py", """
        import pathlib
        pathlib.Path(__file__).write_text("# edited\\n" * 10)
        total = sum(range(10))
        """)
    original = path.read_text()
    # WHEN it runs under linescope
    p = linescope("-d", "none", "-o", "out.json", "target.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert path.read_text().startswith("# edited")
    # THEN the report's snapshot is the code that ran, with nothing to warn about
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["sources"][str(path)] == original
    assert data["warnings"] == []


def test_a_forked_child_leaving_does_not_write_the_report(tmp_path):
    # GIVEN a script that forks; the child exits through sys.exit (runs the CLI's ending)
    (tmp_path / "forker.py").write_text(
        "import os, sys\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    child_only = 1\n"
        "    sys.exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "parent_only = 2\n")
    # WHEN profiled
    p = linescope("-d", "none", "-o", "out.json", "forker.py", cwd=tmp_path)
    # THEN the report is the parent's run, written once
    assert p.returncode == 0, p.stderr
    lines = {l["line"] for l in json.loads((tmp_path / "out.json").read_text())["run"]["lines"]}
    assert 7 in lines and 4 not in lines, lines


def test_the_script_text_in_linecache_is_split_where_python_numbers_lines(tmp_path):
    # GIVEN a script whose line 1 holds a U+2028 and a form feed inside a string
    (tmp_path / "odd.py").write_text(
        's = "a\u2028b\x0cc"\n'
        "import linecache, traceback\n"
        "print(repr(linecache.getline(__file__, 3)))\n"
        "traceback.print_stack()\n")
    # WHEN run under linescope
    p = linescope("-d", "none", "odd.py", cwd=tmp_path)
    # THEN line 3 is line 3 and the stack shows the calling line's own text
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == repr("print(repr(linecache.getline(__file__, 3)))\n")
    assert "traceback.print_stack()" in p.stderr


def test_a_script_whose_name_is_not_utf8_runs_and_the_result_says_it_was_not_recorded(
        tmp_path):
    # GIVEN a script whose file name is not UTF-8 (legal on Linux), in a UTF-8 directory
    name = os.fsdecode(b"n\xe9.py")
    (tmp_path / name).write_text("print('ran')\n")
    # WHEN the command runs it
    p = linescope("-d", "none", "-o", "out.json", name, cwd=tmp_path)
    # THEN it runs as under python, and the result says why its lines are missing
    assert p.returncode == 0, p.stderr
    assert p.stdout == "ran\n"
    warnings = json.loads((tmp_path / "out.json").read_text())["warnings"]
    assert any("not valid UTF-8" in w and "n\\udce9.py" in w for w in warnings), warnings


# A script that forks three times (the last through multiprocessing's fork start method), with
# an after-fork hook of its own that runs Python code, then spins in the parent.
FORKER = """
    import logging, multiprocessing, os, time

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def hook():
        total = 0
        for i in range(1000):
            total += i

    def child():
        pass

    if __name__ == "__main__":
        os.register_at_fork(after_in_parent=hook)
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        worker = multiprocessing.get_context("fork").Process(target=child)
        worker.start()
        worker.join()
        spin(0.3)
        print("exit code", worker.exitcode)
    """


@pytest.mark.parametrize("options", [("--backend", "sampler"), ("--memory",),
                                     ("--backend", "sampler", "--memory")])
def test_forking_under_a_native_sampler_prints_what_plain_python_prints(tmp_path, options):
    # GIVEN a script that forks (Python 3.12+ warns about os.fork() in a process with several
    # threads; the sampler's thread must not count)
    write(tmp_path / "forker.py", FORKER)
    # WHEN it runs under python, and under linescope with a sampler thread
    plain = python("forker.py", cwd=tmp_path)
    p = linescope(*options, "-d", "none", "-o", "out.json", "forker.py", cwd=tmp_path)
    # THEN the output and the status are the same: no DeprecationWarning about threads
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    assert (p.returncode, p.stdout, p.stderr) == (0, plain.stdout, "")
    # AND the parent is measured after the forks: its spin loop (lines 5-6) carries the 0.3 s
    # it took, taken in many samples (sampler) / covered by the RSS timeline (memory)
    data = json.loads((tmp_path / "out.json").read_text())
    spin = [l for l in data["run"]["lines"] if l["line"] in (5, 6)]
    assert sum(l["wall_time_ns"] for l in spin) >= 250_000_000, spin
    if "sampler" in options:
        assert sum(l["samples"] for l in spin) >= 30, spin
        assert not any("os.fork()" in w for w in data["warnings"]), data["warnings"]
    if "--memory" in options:
        assert data["memory"]["timeline"][-1][0] >= 250_000_000


@pytest.mark.parametrize("name, source", [
    ("in_a_string.py", b'x = "caf\xe9"\nprint(x)\n'),
    ("in_a_comment.py", b"a = 1\n# caf\xe9\nprint(a)\n"),  # compile() of these bytes runs
    ("no_newline_at_end.py", b"a = 1\n\xe9"),
    ("coding_too_late.py", b"#!/usr/bin/env python\n# \xe9\n# coding: latin-1\n"),
    ("after_a_syntax_error.py", b"x = = 1\n# \xff\n"),
    ("unknown_coding.py", b"# -*- coding: nope -*-\nx = 1\n"),
    ("null_byte.py", b"x = 1\ny = 2\x00\n"),
])
def test_a_file_python_refuses_to_read_fails_with_python_s_syntax_error(tmp_path, name, source):
    # GIVEN a source file that python's file reader refuses (not UTF-8 without a coding line,
    # an unknown coding, a null byte)
    (tmp_path / name).write_bytes(source)
    # WHEN it runs under python and under linescope
    plain = python(name, cwd=tmp_path)
    p = linescope("-d", "none", name, cwd=tmp_path)
    # THEN linescope prints the interpreter's SyntaxError, word for word, with its status
    assert plain.returncode == 1 and "SyntaxError" in plain.stderr, plain.stderr
    assert (p.returncode, p.stdout, p.stderr) == (plain.returncode, plain.stdout, plain.stderr)


def test_a_declared_encoding_still_runs_as_under_python(tmp_path):
    (tmp_path / "latin.py").write_bytes(b"# coding: latin-1\nprint('caf\xe9')\n")
    plain = python("latin.py", cwd=tmp_path)
    p = linescope("-d", "none", "latin.py", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert (p.returncode, p.stdout, p.stderr) == (0, plain.stdout, "")


PIPED = """\
import sys
def work():
    return sum(i * i for i in range(20000))
work()
print(sys.argv, sys.path[0], __file__, __name__)
"""


def _run_from(kind: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The command `args` + the script's path, the script fed through `kind`: /dev/stdin (a
    pipe) or a named FIFO (what a shell's <(...) gives), read as it is written."""
    if kind == "stdin":
        return subprocess.run([*args, "/dev/stdin"], input=PIPED, capture_output=True,
                              text=True, cwd=tmp_path, timeout=60)
    fifo = tmp_path / "script.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "w") as f:  # blocks until the command opens it
            f.write(PIPED)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        return subprocess.run([*args, str(fifo)], capture_output=True, text=True, cwd=tmp_path,
                              timeout=60)
    finally:
        writer.join(timeout=5)


@pytest.mark.parametrize("kind", ["stdin", "fifo"])
def test_a_script_read_from_a_pipe_runs_and_the_report_shows_the_source_it_read(tmp_path, kind):
    exe = str(Path(sys.executable).parent / "linescope")
    # WHEN the script comes through a pipe, to python and to linescope
    plain = _run_from(kind, tmp_path, sys.executable)
    p = _run_from(kind, tmp_path, exe, "-o", "out.html")
    # THEN it runs once, as under python (argv, sys.path[0], __file__, status)
    assert plain.returncode == 0, plain.stderr
    assert (p.returncode, p.stdout) == (0, plain.stdout), p.stderr
    # AND the summary and the report show the source that was read (there is no file to
    # read it again)
    shown = "/dev/stdin" if kind == "stdin" else "script.fifo"  # relative to the cwd
    assert f"{shown}:3  return sum(" in p.stderr
    html = (tmp_path / "out.html").read_text()
    assert "return sum(i * i for i in range(20000))" in html


def test_dev_null_runs_as_an_empty_script(tmp_path):
    plain = python("/dev/null", cwd=tmp_path)
    p = linescope("-o", "out.html", "/dev/null", cwd=tmp_path)
    assert plain.returncode == 0 and p.returncode == 0, p.stderr
    assert p.stdout == plain.stdout == ""
    assert "nothing was recorded" in p.stderr and "Traceback" not in p.stderr
    assert (tmp_path / "out.html").read_text().startswith("<!")


def test_a_long_source_line_is_cut_in_the_summary_and_the_report(tmp_path):
    # GIVEN a script with a 2.7 MB line (a generated data literal) that takes time
    big = "a" * 2_700_000
    (tmp_path / "big.py").write_text(f"import time\nDATA = '{big}'; time.sleep(0.05)\n"
                                     "n = len(DATA)\n")
    # WHEN it is profiled with the summary and an HTML report
    p = linescope("-o", "out.html", "big.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[:2000]
    # THEN the summary's row for line 2 keeps its line number and shows the start of the line,
    # cut with an ellipsis to a terminal's width
    row = next(r for r in p.stderr.splitlines() if "big.py:2 " in r)
    source = row.split("big.py:2  ", 1)[1]
    assert source.startswith("DATA = 'aaaa") and source.endswith("…") and len(source) <= 100
    assert len(p.stderr) < 5_000
    # AND the report holds the line once, cut as well, so the page stays small
    html = (tmp_path / "out.html").read_text()
    assert len(html) < 1_000_000 and big not in html
    assert html.count("a" * 900) == 1
    # AND the JSON result keeps the source whole
    p = linescope("-d", "none", "-o", "out.json", "big.py", cwd=tmp_path)
    data = json.loads((tmp_path / "out.json").read_text())
    assert big in data["sources"][str(tmp_path / "big.py")]
