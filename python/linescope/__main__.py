"""``linescope [options] (script.py | -m module) [args...]`` and ``python -m linescope``.

The target runs as under plain ``python``: the same ``sys.argv``, ``sys.path[0]``,
``__main__.__file__`` (absolute, also as the code's filename) and exit status; an uncaught
exception goes through ``sys.excepthook`` with only the target's frames. The output is written
even when the target fails. Usage errors, an unusable ``-o`` path included, exit 2 before the
target runs.
"""

from __future__ import annotations

import argparse
import builtins
import importlib.machinery
import importlib.util
import linecache
import math
import os
import runpy
import sys
import types
import warnings
import zipfile
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator, Sequence

from ._text import file_reader_error, read_text, source_lines

if TYPE_CHECKING:
    from ._session import profile


def _sample_rate(text: str) -> float:
    """The argparse type of --sample-rate: a finite number of samples per second above 0."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and rate > 0):
        raise argparse.ArgumentTypeError(
            f"expected a positive number of samples per second (for example 1000), not {text!r}")
    return rate


def _output_path(text: str) -> str:
    """The argparse type of -o: a file name, made absolute against the current directory now,
    so that a target that changes directory does not move the output."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file name such as profile.html, not ''")
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(
            f"{text!r} names a directory; give a file name such as "
            f"{os.path.join(text, 'profile.html')!r}")
    return os.path.abspath(text)


def add_profile_options(p: argparse.ArgumentParser) -> None:
    """The profile options shared by the CLI and the %%linescope cell magic. Each one set here
    overrides the same key of [tool.linescope]."""
    p.add_argument("--backend", "-b", default=None,
                   help="profiler backend: trace (default), sampler, scalene, tachyon, or a "
                        "registered one")
    _on_off(p, "gpu", "collect GPU time and device memory (needs a GPU-capable backend)",
            "do not collect GPU data (overrides gpu = true in pyproject.toml)")
    _on_off(p, "memory", "collect host memory: RSS timeline and per-line change / peak",
            "do not collect host memory (overrides memory = true in pyproject.toml)")
    _on_off(p, "spark", "record PySpark actions at the lines that run them: plans, operator "
                        "metrics, stages, driver and executor time",
            "do not record Spark actions (overrides spark = true in pyproject.toml)")
    p.add_argument("-i", "--include", action="append", default=None, metavar="PATTERN",
                   help="also record files matching this glob (repeatable; replaces the "
                        "include list of pyproject.toml)")
    p.add_argument("-e", "--exclude", action="append", default=None, metavar="PATTERN",
                   help="do not record files matching this glob (repeatable; replaces the "
                        "exclude list of pyproject.toml)")
    p.add_argument("-r", "--root", default=None, help="project root (default: cwd)")
    p.add_argument("-o", "--output", default=None, metavar="OUT", type=_output_path,
                   help="write the result here: .html/.htm writes the single-file HTML report, "
                        "any other suffix JSON (linescope-result/1); a relative path is taken "
                        "against the current directory")
    p.add_argument("-d", "--display", choices=("none", "end"), default=None,
                   help="show the result at the end (default: end)")
    p.add_argument("--sample-rate", type=_sample_rate, default=None, metavar="RATE",
                   help="samples per second, for sampling backends")
    _on_off(p, "notebooks", "inside IPython / Jupyter, record the cells that run, each named "
                            "'cell N' (default)",
            "do not record notebook cells (unless an include pattern names them)")


def _on_off(p: argparse.ArgumentParser, name: str, on_help: str, off_help: str) -> None:
    """``--NAME`` / ``--no-NAME``: True / False, None when neither is given."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(f"--{name}", dest=name, action="store_true", default=None, help=on_help)
    g.add_argument(f"--no-{name}", dest=name, action="store_false", help=off_help)


def profile_options(args: argparse.Namespace) -> dict[str, Any]:
    """The profile() keyword arguments that the command line sets explicitly."""
    return {k: v for k, v in dict(
        backend=args.backend, gpu=args.gpu, memory=args.memory, root=args.root,
        include=args.include, exclude=args.exclude, output=args.output,
        display=args.display, sample_rate=args.sample_rate,
        notebooks=args.notebooks, spark=args.spark).items() if v is not None}


def new_session(options: dict[str, Any], record: Sequence[str]) -> profile:
    """``profile(**options)`` that also records the files matching ``record``, on top of the
    include patterns that apply otherwise (the explicit ones, else [tool.linescope]'s).
    Raises ValueError / TypeError for bad options, like profile()."""
    from . import profile
    from ._backends import is_utf8

    # A target whose path is not UTF-8 cannot be recorded (paths must be UTF-8 text): it
    # runs anyway, and the session's warnings say that such a file ran unrecorded.
    record = [p for p in record if is_utf8(p)]
    include = options.get("include")
    if include is None:
        include = profile(**options).include
    return profile(**{**options, "include": [*include, *record]})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="linescope",
        usage="linescope [options] (script.py | -m module) [args...]",
        description="Profile the source lines of a Python script or module.")
    add_profile_options(p)
    p.add_argument("--version", action="version", version=_version_line(),
                   help="print linescope's version and exit")
    # For --help only: _split_argv takes the target apart before the options are parsed.
    p.add_argument("-m", dest="module", default=None, metavar="MODULE",
                   help="run a library module as a script (like python -m); what follows "
                        "goes to the module")
    p.add_argument("target", nargs=argparse.REMAINDER, help="script.py [args...]")
    return p


def _version_line() -> str:
    from gpuprof import __version__

    return f"linescope {__version__} (gpuprof {__version__})"


def _split_argv(parser: argparse.ArgumentParser,
                argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """``argv`` split as python splits its own command line: linescope's options, the module of
    ``-m MODULE`` (or ``-mMODULE``; None for a script), and the target's words (the script
    first, after a leading ``--`` if any). Nothing after the script or the module is
    linescope's, however much it looks like one of its options."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":  # the end of the options, as `python -- script.py` takes it
            return list(argv[:i]), None, list(argv[i + 1:])
        if word.startswith("-m"):
            if word != "-m":
                return list(argv[:i]), word[2:], list(argv[i + 1:])
            if i + 1 == len(argv):
                parser.error("argument -m: expected one argument")
            return list(argv[:i]), argv[i + 1], list(argv[i + 2:])
        if word == "-" or not word.startswith("-"):
            return list(argv[:i]), None, list(argv[i:])
        i += 2 if _takes_value(parser, word) else 1
    return list(argv), None, []


def _takes_value(parser: argparse.ArgumentParser, word: str) -> bool:
    """Whether the option ``word`` takes the next word as its value, as argparse reads it
    (a unique prefix of a long option included); False when the value is attached
    (``--output=x``, ``-ox``) or argparse will refuse ``word`` anyway."""
    table = parser._option_string_actions  # option string -> action
    if word in table:
        actions = {table[word]}
    elif word.startswith("--") and "=" not in word:
        actions = {a for s, a in table.items() if s.startswith(word)}
    else:
        actions = set()
    return len(actions) == 1 and next(iter(actions)).nargs != 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    own, module, target = _split_argv(parser, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    script: str | None = None
    if module is not None:
        target_args = target
    else:
        if not target:
            parser.error("give a script to run or -m MODULE")
        script, target_args = target[0], target[1:]
        if script.startswith("-") and not os.path.exists(script):
            parser.error(f"unknown option {script}")
        if not os.path.exists(script):
            parser.error(f"can't open file {script!r}: no such file or directory")

    # The target is always recorded, also when it lies outside the root: the script, or
    # every file of a directory or zip archive run by its __main__.py. Anything else that
    # python opens as a script (a FIFO such as <(...), /dev/stdin, a device) is one too; only
    # a regular file can be a zip archive (python's zipimporter takes no other).
    runs_path = script is not None and (
        os.path.isdir(script) or (os.path.isfile(script) and zipfile.is_zipfile(script)))
    record = ([] if script is None else
              [os.path.join(os.path.abspath(script), "*")] if runs_path else
              [os.path.abspath(script)])
    try:
        session = new_session(profile_options(args), record)
    except (ValueError, TypeError) as e:  # an unusable output path (-o or pyproject) too
        parser.error(str(e))

    run: Callable[[], object]
    if script is None:
        # runpy replaces argv[0] with the module's file, as python -m does.
        assert module is not None
        argv0, path0, main_module = module, os.getcwd(), None
        # Its globals as python -m gives them (runpy would make __builtins__ a dict, and
        # leave out __annotations__).
        run = partial(runpy.run_module, module, run_name="__main__", alter_sys=True,
                      init_globals={"__builtins__": builtins, "__annotations__": {}})
    elif runs_path:
        # A directory or zip archive runs its __main__.py with itself (absolute) as
        # sys.path[0], as under python.
        argv0, path0, main_module = script, os.path.abspath(script), None
        run = partial(_run_main_of, path0)
    else:
        # python: __file__ absolute, sys.path[0] the directory of the resolved script.
        argv0, path0 = script, _script_directory(script)
        filename = os.path.abspath(script)
        main_module = _main_module(filename)
        try:
            # Read once, before the session starts (a pipe cannot be read again), and
            # registered for the session's source snapshot.
            contents = _read_script(filename)
        except OSError as e:
            parser.error(f"can't open file {script!r}: [Errno {e.errno}] {e.strerror}")
        run = partial(_run_script, main_module, contents)
    with _target_process_state([argv0, *target_args], path0, main_module):
        try:
            _start(session)
        except (ValueError, TypeError, RuntimeError) as e:  # nothing ran: a usage error
            parser.error(str(e))
        code = 1
        try:
            code = _run_target(run, session._mark_failed)
        finally:
            code = _stop(session, code)
    return code


@contextmanager
def _target_process_state(argv: list[str], path0: str,
                          main_module: types.ModuleType | None) -> Iterator[None]:
    """``sys.argv``, ``sys.path[0]`` and (for a script) ``sys.modules['__main__']`` as python
    sets them for the target; restored afterwards (``__main__`` also when the target set
    it)."""
    saved_argv, saved_path, saved_main = sys.argv[:], sys.path[:], sys.modules["__main__"]
    sys.argv = argv
    sys.path[0:1] = [path0]
    if main_module is not None:
        sys.modules["__main__"] = main_module
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.modules["__main__"] = saved_main


def _main_module(filename: str, loader: Any = None, **attrs: Any) -> types.ModuleType:
    """A fresh ``__main__`` module for the code at the absolute path ``filename``, with the
    attributes python gives it (a script's: its own source loader, no cached file; `attrs`
    add or replace them)."""
    module = types.ModuleType("__main__")
    module.__dict__.update(
        {"__file__": filename, "__cached__": None, "__builtins__": builtins,
         "__annotations__": {},
         "__loader__": loader or importlib.machinery.SourceFileLoader("__main__", filename),
         **attrs})
    return module


def _start(session: profile) -> None:
    """Starts the session; each warning it raises is printed once as a linescope message."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session._start("the linescope command")
    for text in dict.fromkeys(str(w.message) for w in caught):
        print(f"linescope: warning: {text}", file=sys.stderr)


def _stop(session: profile, code: int) -> int:
    if session._forked:  # a child of os.fork() leaving: the parent writes the output
        return code
    try:
        session.stop()  # writes the output and shows the summary
    except Exception as e:  # never mask the target's status
        print(f"linescope: could not finish the profile: {e}", file=sys.stderr)
        return code or 1
    return code


def _run_target(run: Callable[[], object], failed: Callable[[BaseException], None]) -> int:
    """Runs the target to its end and returns its exit status, as python would; `failed` is
    told what ended a target that failed (the run's status)."""
    failure: BaseException
    try:
        run()
    except SystemExit as e:
        failed(e)
        return _exit_code(e.code)
    except ImportError as e:
        if _target_frames(e.__traceback__) is not None:  # raised by the target's own code
            failure = e
        else:
            # runpy found nothing to run (no such module, a package without __main__, a
            # directory without __main__.py): one line and status 1, as python says it.
            print(f"linescope: {e}", file=sys.stderr)
            failed(e)
            return 1
    except BaseException as e:  # the target failed
        failure = e
    else:
        return 0
    failed(failure)
    # Outside the except clause, so an error in the hook is not chained to the failure.
    return _report_uncaught(failure)


def _run_main_of(path: str) -> None:
    """Runs the ``__main__.py`` of the directory or zip archive at the absolute ``path`` (which
    is sys.path[0]) as the ``__main__`` module, as python runs such a target."""
    spec = importlib.machinery.PathFinder.find_spec("__main__", [path])
    if (spec is None or spec.loader is None or spec.origin is None
            or not hasattr(spec.loader, "get_code")):
        raise ImportError(f"can't find '__main__' module in {path!r}")
    code = spec.loader.get_code("__main__")
    module = _main_module(spec.origin, spec.loader, __cached__=spec.cached, __spec__=spec,
                          __package__="")
    sys.modules["__main__"] = module
    # The source of a file inside a zip archive comes from its loader: registered so that the
    # report's snapshot (and tracebacks) can read it.
    linecache.lazycache(spec.origin, module.__dict__)
    exec(code, module.__dict__)


def _script_directory(script: str) -> str:
    """sys.path[0] for ``script`` as python computes it (``_PyPathConfig_ComputeSysPath0``):
    one symbolic link of the script itself followed, then the real path when it resolves, and
    its directory. A script read from a pipe (``/dev/fd/63``, ``/dev/stdin``) names no real
    file: its own directory then."""
    path0 = script
    try:
        link = os.readlink(script)
    except (OSError, ValueError):
        link = ""
    if link.startswith(os.sep):
        path0 = link
    elif os.sep in link:
        path0 = os.path.join(os.path.dirname(script), link)
    try:
        path0 = os.path.realpath(path0, strict=True)
    except (OSError, ValueError):
        pass
    return os.path.dirname(path0)


def _read_script(filename: str) -> tuple[bytes, bool]:
    """The bytes of the script, read once, and whether the file is seekable (not a pipe).
    Their decoded text is registered in linecache (mtime None: never re-read), so the report's
    source snapshot and tracebacks show the code as it ran even if the file changes
    meanwhile, and a script read from a pipe or a device (which cannot be read again) has its
    source too."""
    with open(filename, "rb") as f:
        source = f.read()
        seekable = f.seekable()
    text = read_text(source)
    linecache.cache[filename] = (len(text), None, source_lines(text), filename)
    return source, seekable


def _run_script(main_module: types.ModuleType, script: tuple[bytes, bool]) -> None:
    """Compiles the script of ``main_module`` (its bytes and whether its file is seekable,
    from _read_script) and runs it. A source that python's file reader refuses raises the
    SyntaxError python gives for the file."""
    filename = main_module.__file__
    assert filename is not None
    source, seekable = script
    refused = file_reader_error(source, filename, seekable)
    if refused is not None:
        raise refused
    code = compile(source, filename, "exec", dont_inherit=True)
    exec(code, main_module.__dict__)


def _exit_code(code: object) -> int:
    """The exit status of ``SystemExit(code)``, as python computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _report_uncaught(exc: BaseException) -> int:
    """Hands an exception that ended the target to ``sys.excepthook``, as python does at the top
    level (with the same fallbacks), without linescope's and runpy's frames. Returns the exit
    status: 130 for KeyboardInterrupt, else 1, or the status of a SystemExit from the hook."""
    exc = exc.with_traceback(_target_frames(exc.__traceback__))
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    hook = getattr(sys, "excepthook", None)
    if hook is None:
        print("sys.excepthook is missing", file=sys.stderr)
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
    else:
        try:
            hook(type(exc), exc, exc.__traceback__)
        except SystemExit as e:
            return _exit_code(e.code)
        except BaseException as err:
            err = err.with_traceback(_target_frames(err.__traceback__))
            print("Error in sys.excepthook:", file=sys.stderr)
            sys.__excepthook__(type(err), err, err.__traceback__)
            print("\nOriginal exception was:", file=sys.stderr)
            sys.__excepthook__(type(exc), exc, exc.__traceback__)
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _target_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without its leading frames in this file and in runpy (the callers of the
    target)."""
    while tb is not None and tb.tb_frame.f_code.co_filename in _CALLER_FILES:
        tb = tb.tb_next
    return tb


# Code filenames, not module __file__: runpy is a frozen module ("<frozen runpy>") on 3.11+.
_CALLER_FILES = frozenset({_run_target.__code__.co_filename,
                           runpy.run_module.__code__.co_filename,
                           importlib.util.find_spec.__code__.co_filename})


if __name__ == "__main__":
    sys.exit(main())
