"""IPython / Jupyter integration: ``%load_ext linescope``, then ``%%linescope [options]`` (or
its alias ``%%profile``) profiles the cell and shows the report inline.

The options are the CLI's (``linescope --help``) without the target: ``--backend``,
``--gpu/--no-gpu``, ``--memory``, ``-i/-e PATTERN``, ``-r ROOT``, ``-o OUT``, ``-d none|end``,
``--sample-rate``. Code of this and earlier cells is recorded, besides the root.
"""

from __future__ import annotations

import argparse
import html
import shlex
import sys
from typing import Any

# Where IPython and ipykernel put cell code: the terminal's "<ipython-input-N-hash>", the
# kernel's "/tmp/ipykernel_<pid>/<hash>.py".
CELL_PATTERNS = ("<ipython-input-*>", "*/ipykernel_*/*.py")


class MagicUsageError(Exception):
    """A usage error in the magic's options (shown as a message, not a traceback)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # no SystemExit inside a notebook
        raise MagicUsageError(f"%%linescope: {message}\n{self.format_usage()}")


def _parser() -> argparse.ArgumentParser:
    from .__main__ import add_profile_options

    p = _Parser(prog="%%linescope", usage="%%linescope [options]",
                description="Profile the source lines of this cell.", add_help=False)
    add_profile_options(p)
    return p


def _options(line: str) -> tuple[dict[str, Any], str]:
    try:
        argv = shlex.split(line)
    except ValueError as e:
        raise MagicUsageError(f"%%linescope: {e}") from None
    args = _parser().parse_args(argv)
    opts = {k: v for k, v in dict(
        backend=args.backend, gpu=args.gpu, memory=args.memory, root=args.root,
        include=args.include, exclude=args.exclude, output=args.output,
        sample_rate=args.sample_rate).items() if v is not None}
    opts["include"] = [*opts.get("include", ()), *CELL_PATTERNS]
    return opts, args.display or "end"


def report_iframe(result: Any) -> str:
    """The report as an <iframe srcdoc> that a notebook shows inline (self-contained)."""
    from . import _report

    page = _report.render_html(result)
    return (f'<div class="linescope-report"><iframe srcdoc="{html.escape(page, quote=True)}" '
            'style="width:100%;height:640px;border:1px solid #ccc" '
            'title="linescope report"></iframe></div>')


def run_cell_magic(shell: Any, line: str, cell: str) -> None:
    from . import profile

    try:
        options, display = _options(line)
        session = profile(display="none", **options)
    except (MagicUsageError, ValueError, TypeError) as e:
        print(str(e).rstrip(), file=sys.stderr)
        return
    source = shell.transform_cell(cell)
    filename = shell.compile.cache(source, shell.execution_count)
    code = compile(source, filename, "exec")
    profile._default = session  # profile.result / profile.save() after the cell
    try:
        session.start()
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"%%linescope: {e}", file=sys.stderr)
        return
    try:
        exec(code, shell.user_ns)
    finally:
        result = session.stop()
        if display == "end":
            _show(result)


def _show(result: Any) -> None:
    try:
        from IPython.display import HTML, display
    except ImportError:  # pragma: no cover - IPython is there when a magic runs
        return
    display(HTML(report_iframe(result)))


def load_ipython_extension(ipython: Any) -> None:
    def linescope_magic(line: str, cell: str) -> None:
        return run_cell_magic(ipython, line, cell)

    linescope_magic.__doc__ = __doc__
    ipython.register_magic_function(linescope_magic, "cell", "linescope")
    ipython.register_magic_function(linescope_magic, "cell", "profile")
