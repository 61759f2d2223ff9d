"""IPython / Jupyter integration: ``%load_ext linescope``, then ``%%linescope [options]`` (or
its alias ``%%profile``) profiles the cell and shows the report inline.

The options are the CLI's (``linescope --help``) without the target: ``--backend``,
``--gpu/--no-gpu``, ``--memory/--no-memory``, ``-i/-e PATTERN``, ``-r ROOT``, ``-o OUT``,
``-d none|end``, ``--sample-rate RATE``. Code of this and earlier cells is recorded, besides
the root. The cell runs as a plain cell would: top-level ``await`` works, the value of a
last expression is the magic's result (shown as ``Out[n]``), a syntax error is reported before
anything runs, and tracebacks and warnings name the cell's lines, not linescope's.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import html
import inspect
import shlex
import sys
import warnings
from types import CodeType
from typing import Any
from collections.abc import Callable

from ._notebook import CELL_PATTERNS, running_cell_number


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
    p.add_argument("-h", "--help", action="store_true",
                   help="show this help; the cell does not run")
    return p


class _MagicHelp(Exception):
    """``%%linescope --help``: the help text is shown and the cell does not run."""


def _options(parser: _Parser, line: str) -> dict[str, Any]:
    """The profile() options of the magic's line (the cell patterns not yet added)."""
    from .__main__ import profile_options

    try:
        argv = shlex.split(line)
    except ValueError as e:
        raise parser.usage_error(str(e)) from None
    args = parser.parse_args(argv)
    if args.help:
        raise _MagicHelp(parser.format_help())
    return profile_options(args)


class _Cell:
    """A cell compiled as IPython compiles a plain one (input and AST transformers, the
    top-level-await flag when autoawait is on), its last expression apart so that its value
    can be returned."""

    def __init__(self, shell: Any, cell: str) -> None:
        self._shell = shell
        source = shell.transform_cell(cell)
        # Compiled under the running cell's number (its report name is "cell N", N as In [N]).
        self.filename: str = shell.compile.cache(source, running_cell_number(shell))
        tree = shell.transform_ast(shell.compile.ast_parse(source, self.filename))
        last: ast.Expression | None = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not _ends_quiet(source):
            last = ast.Expression(tree.body.pop().value)
        with shell.compile.extra_flags(_await_flag(shell)):
            self._body: CodeType = shell.compile(tree, self.filename, "exec")
            self._last: CodeType | None = (None if last is None
                                           else shell.compile(last, self.filename, "eval"))

    @property
    def awaits(self) -> bool:
        return any(c is not None and c.co_flags & inspect.CO_COROUTINE
                   for c in (self._body, self._last))

    def run(self) -> Any:
        """Runs the cell in the user namespace; the value of its last expression, or None."""
        __tracebackhide__ = True  # IPython leaves this frame out of the cell's tracebacks
        self._eval(self._body)
        return None if self._last is None else self._eval(self._last)

    def _eval(self, code: CodeType) -> Any:
        __tracebackhide__ = True
        value = eval(code, self._shell.user_global_ns, self._shell.user_ns)
        if code.co_flags & inspect.CO_COROUTINE:  # top-level await: the shell's loop runs it
            value = (getattr(self._shell, "trio_runner", None) or self._shell.loop_runner)(value)
        return value

    def warn(self, caught: list[warnings.WarningMessage]) -> None:
        """Issues each warning in ``caught`` again, as raised at the cell's line 1 (under the
        filters in effect: ``-W error`` raises it here)."""
        __tracebackhide__ = True
        for w in caught:
            self.issue(w.message, w.category)

    def issue(self, message: Warning | str, category: type[Warning]) -> None:
        """Issues one warning as raised at the cell's line 1."""
        __tracebackhide__ = True
        module = self._shell.user_global_ns.get("__name__", "__main__")  # as the cell's own
        # (the cell's text is in linecache: no module_globals to look it up)
        warnings.warn_explicit(message, category, self.filename, 1, module=module)


def _await_flag(shell: Any) -> int:
    """The compile flag of top-level await, when autoawait is on (as for a plain cell)."""
    return getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0) if shell.autoawait else 0


def _is_valid(shell: Any, cell: str) -> bool:
    """Whether ``cell`` compiles as a plain cell would (without side effects on the shell)."""
    try:
        compile(shell.transform_cell(cell), "<cell>", "exec",
                shell.compile.flags | _await_flag(shell), dont_inherit=True)
    except SyntaxError:
        return False
    return True


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
    from ._session import _finish_failed_beside

    __tracebackhide__ = True
    parser = _parser()
    try:
        try:
            session = new_session(_options(parser, line), CELL_PATTERNS)
        except (ValueError, TypeError) as e:  # an unusable output path too
            raise parser.usage_error(str(e)) from None
        # -d, else [tool.linescope]'s display; the magic shows the report itself (inline).
        display, session.display = session.display, "none"
        # A SyntaxError propagates (in a %%linescope cell, IPython has reported it already,
        # as for a plain cell: see _plain_when_invalid).
        code = _Cell(shell, cell)
        if code.awaits and _loop_running():
            raise parser.usage_error(
                "top-level await cannot run here: an event loop is already running in this "
                "thread (a Jupyter kernel runs the cell inside its own loop); profile the "
                "awaited code in a plain cell instead: `with linescope.profile(include="
                "['*/ipykernel_*/*.py']): await ...`")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                session._start("%%linescope", launcher=True)
        except (ValueError, TypeError, RuntimeError) as e:
            raise parser.usage_error(str(e)) from None
    except MagicUsageError as e:
        print(str(e).rstrip(), file=sys.stderr)
        return None
    except _MagicHelp as e:
        print(str(e).rstrip())
        return None
    try:
        code.warn(caught)  # the session's warnings name the cell, not IPython's caller
        value = code.run()
    except BaseException as exc:
        # The cell's exception propagates; a session that cannot finish (a report that
        # cannot be written) does not replace it.
        session._mark_failed(exc)
        try:
            result = session.stop()
        except Exception as failure:  # noqa: BLE001
            text = _finish_failed_beside(session, exc, failure, "linescope.profile.result")
            with contextlib.suppress(Warning):  # a filter making it an error: `exc` stays
                code.issue(text, RuntimeWarning)  # at the cell, as the other warnings
            result = session._result
        if display == "end" and result is not None:
            display_report(result)
        raise
    result = session.stop()
    if display == "end":
        display_report(result)
    return value


def display_report(result: Any) -> None:
    """Shows the report in the running notebook cell (this magic, session.show(inline=True),
    stop() in a kernel)."""
    from . import _report

    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is there when a magic runs
        return
    # The inline report, and the text summary for front ends that show no HTML (terminal
    # IPython, a plain-text notebook view).
    display({"text/html": report_iframe(result), "text/plain": _report.render_text(result)},
            raw=True)


def _plain_when_invalid(shell: Any,
                        magic: Callable[..., Any]) -> Callable[[list[str]], list[str]]:
    """An input transformer (run before IPython's cell-magic one): a cell of ``magic`` whose body
    does not compile becomes that body, so that IPython reports the syntax error as for a plain
    cell, before anything runs (``error_before_exec``), and no session starts."""

    def transform(lines: list[str]) -> list[str]:
        if not lines or not lines[0].startswith("%%"):
            return lines
        name = lines[0][2:].rstrip().partition(" ")[0]
        try:
            if shell.find_cell_magic(name) is not magic or _is_valid(shell, "".join(lines[1:])):
                return lines
        except Exception:  # anything else: the magic reports it as it runs
            return lines
        body, cleanup = lines[1:], shell.input_transformers_cleanup
        # The transformers the cell's lines went through before this one.
        for earlier in cleanup[:cleanup.index(transform)] if transform in cleanup else []:
            body = earlier(body)
        return body

    # Left out of check_complete (a console's "is the input complete?"), where a %%-cell ends
    # at a blank line whatever its body holds.
    transform.has_side_effects = True  # type: ignore[attr-defined]
    transform.linescope = True  # type: ignore[attr-defined]  # found again by %reload_ext
    return transform


def load_ipython_extension(ipython: Any) -> None:
    def linescope_magic(line: str, cell: str) -> Any:
        __tracebackhide__ = True
        return run_cell_magic(ipython, line, cell)

    linescope_magic.__doc__ = __doc__
    ipython.register_magic_function(linescope_magic, "cell", "linescope")
    ipython.register_magic_function(linescope_magic, "cell", "profile")
    cleanup = ipython.input_transformers_cleanup
    cleanup[:] = [t for t in cleanup if not getattr(t, "linescope", False)]  # %reload_ext
    cleanup.append(_plain_when_invalid(ipython, linescope_magic))
