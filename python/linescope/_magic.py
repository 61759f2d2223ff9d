"""IPython / Jupyter integration: ``%load_ext linescope``, then ``%%linescope [options]`` (or
its alias ``%%profile``) profiles the cell and shows the report inline.

The options are the CLI's (``linescope --help``) without the target: ``--backend``,
``--gpu/--no-gpu``, ``--memory/--no-memory``, ``-i/-e PATTERN``, ``-r ROOT``, ``-o OUT``,
``-d none|end``, ``--sample-rate RATE``. Code of this and earlier cells is recorded, besides
the root. The cell runs as a plain cell would: top-level ``await`` works, and the value of a
last expression is the magic's result (shown as ``Out[n]``).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import html
import inspect
import shlex
import sys
from types import CodeType
from typing import Any

# Where IPython and ipykernel put cell code: the terminal's "<ipython-input-N-hash>", the
# kernel's "/tmp/ipykernel_<pid>/<hash>.py".
CELL_PATTERNS = ("<ipython-input-*>", "*/ipykernel_*/*.py")


class MagicUsageError(Exception):
    """A usage error in the magic's options (shown as a message, not a traceback)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # no SystemExit here
        raise self.usage_error(message)

    def usage_error(self, message: str) -> MagicUsageError:
        return MagicUsageError(f"%%linescope: {message}\n{self.format_usage()}")


def _parser() -> _Parser:
    from .__main__ import add_profile_options

    p = _Parser(prog="%%linescope", usage="%(prog)s [options]",
                description="Profile the source lines of this cell.", add_help=False)
    add_profile_options(p)
    return p


def _options(parser: _Parser, line: str) -> tuple[dict[str, Any], str]:
    """The profile() options of the magic's line (the cell patterns not yet added) and the
    display mode."""
    from .__main__ import profile_options

    try:
        argv = shlex.split(line)
    except ValueError as e:
        raise parser.usage_error(str(e)) from None
    opts = profile_options(parser.parse_args(argv))
    display = opts.pop("display", "end")
    return opts, display


class _Cell:
    """A cell compiled as IPython compiles a plain one (input and AST transformers, the
    top-level-await flag when autoawait is on), its last expression apart so that its value
    can be returned."""

    def __init__(self, shell: Any, cell: str) -> None:
        self._shell = shell
        source = shell.transform_cell(cell)
        filename = shell.compile.cache(source, shell.execution_count)
        tree = shell.transform_ast(shell.compile.ast_parse(source, filename))
        last: ast.Expression | None = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not _ends_quiet(source):
            last = ast.Expression(tree.body.pop().value)
        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0) if shell.autoawait else 0
        with shell.compile.extra_flags(flags):
            self._body: CodeType = shell.compile(tree, filename, "exec")
            self._last: CodeType | None = (None if last is None
                                           else shell.compile(last, filename, "eval"))

    @property
    def awaits(self) -> bool:
        return any(c is not None and c.co_flags & inspect.CO_COROUTINE
                   for c in (self._body, self._last))

    def run(self) -> Any:
        """Runs the cell in the user namespace; the value of its last expression, or None."""
        self._eval(self._body)
        return None if self._last is None else self._eval(self._last)

    def _eval(self, code: CodeType) -> Any:
        value = eval(code, self._shell.user_global_ns, self._shell.user_ns)
        if code.co_flags & inspect.CO_COROUTINE:  # top-level await: the shell's loop runs it
            value = (getattr(self._shell, "trio_runner", None) or self._shell.loop_runner)(value)
        return value


def _ends_quiet(source: str) -> bool:
    """A trailing ';' hides the value of the last expression, as in a plain cell."""
    from IPython.core.displayhook import DisplayHook

    try:
        return bool(DisplayHook.semicolon_at_end_of_expression(source))
    except Exception:  # tokenize errors: the compiler reports them
        return False


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def report_iframe(result: Any) -> str:
    """The report as an <iframe srcdoc> that a notebook shows inline (self-contained)."""
    from . import _report

    page = _report.render_html(result)
    return (f'<div class="linescope-report"><iframe srcdoc="{html.escape(page, quote=True)}" '
            'style="width:100%;height:640px;border:1px solid #ccc" '
            'title="linescope report"></iframe></div>')


def run_cell_magic(shell: Any, line: str, cell: str) -> Any:
    """Profiles the cell. A usage error is printed (``%%linescope: ...`` and the usage line)
    and nothing runs; an exception in the cell still stops the session and shows the report,
    then propagates. Returns the value of the cell's last expression."""
    from .__main__ import new_session

    parser = _parser()
    try:
        options, display = _options(parser, line)
        try:
            session = new_session({**options, "display": "none"}, CELL_PATTERNS)
        except (ValueError, TypeError) as e:  # an unusable output path too
            raise parser.usage_error(str(e)) from None
        code = _Cell(shell, cell)  # a SyntaxError propagates, as in a plain cell
        if code.awaits and _loop_running():
            raise parser.usage_error(
                "top-level await cannot run here: an event loop is already running in this "
                "thread (a Jupyter kernel runs the cell inside its own loop); profile the "
                "awaited code in a plain cell instead: `with linescope.profile(include="
                "['*/ipykernel_*/*.py']): await ...`")
        try:
            session._start("%%linescope")
        except (ValueError, TypeError, RuntimeError) as e:
            raise parser.usage_error(str(e)) from None
    except MagicUsageError as e:
        print(str(e).rstrip(), file=sys.stderr)
        return None
    try:
        value = code.run()
    finally:
        result = session.stop()
        if display == "end":
            _show(result)
    return value


def _show(result: Any) -> None:
    try:
        from IPython.display import HTML, display
    except ImportError:  # pragma: no cover - IPython is there when a magic runs
        return
    display(HTML(report_iframe(result)))


def load_ipython_extension(ipython: Any) -> None:
    def linescope_magic(line: str, cell: str) -> Any:
        return run_cell_magic(ipython, line, cell)

    linescope_magic.__doc__ = __doc__
    ipython.register_magic_function(linescope_magic, "cell", "linescope")
    ipython.register_magic_function(linescope_magic, "cell", "profile")
