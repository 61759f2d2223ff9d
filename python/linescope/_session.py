"""``profile``: the session object, context manager and module-level controls."""

from __future__ import annotations

import contextlib
import linecache
import numbers
import os
import re
import sys
import tempfile
import threading
import time
import types
import warnings
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Iterator, Iterable

from . import _config, _report
from ._backends import (BackendOptions, ProfilerBackend, get_backend_factory, GPU_TRACE_WARNING,
                        check_utf8_path, is_utf8, native_cwd)
from ._model import (BackendCapabilities, FunctionStats, GPUStats, LineStats, ProfileResult,
                     ProfileRun, RawBackendResult, RawFunction, RawLine, Symbol)
from ._sampling import MemorySampler  # also registers the "sampler" backend
from ._text import read_source, source_lines

_DISPLAY = ("none", "end")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # as code filenames name it

_active_lock = threading.Lock()
_active: "profile | None" = None


def _after_fork_in_child() -> None:
    """A child made with os.fork() during a session does not own it: the session becomes
    inert there (leaving its `with` block does nothing, no report is written) and the child
    may start a session of its own."""
    global _active, _active_lock, _paused_for_fork
    _active_lock = threading.Lock()  # it may have been held by another thread at the fork
    _paused_for_fork = None
    if _active is not None:
        _active._forked = True
        # The native hooks and samplers leave the child's way: it runs untraced (a fork-based
        # DataLoader worker is not slowed down) and may start a session of its own.
        for part in (_active._backend, _active._memory_sampler):
            detach = getattr(part, "_detach_after_fork", None)
            if callable(detach):
                try:
                    detach()
                except Exception:  # noqa: BLE001 - never raise into the forking program
                    pass
        _active = None


_paused_for_fork: "profile | None" = None


def _fork_parts(session: "profile") -> tuple[Any, ...]:
    return (session._backend, session._memory_sampler)


def _before_fork() -> None:
    """Before os.fork(): the session's native sampler threads (the `sampler` backend, the
    memory sampler) are joined, so that the fork happens in a process with no thread of
    linescope's (Python 3.12+ warns about fork() in a multi-threaded process, and the child
    would inherit whatever locks those threads held). The parent restarts them."""
    global _paused_for_fork
    session = _paused_for_fork = _active
    if session is None:
        return
    # The frame that called os.fork() (this hook is called from inside it), on the main
    # thread: the parent's sampler restarts once that call has returned.
    caller = sys._getframe(1) if threading.current_thread() is threading.main_thread() else None
    for part in _fork_parts(session):
        pause = getattr(part, "_pause_for_fork", None)
        if callable(pause):
            try:
                pause(caller)
            except Exception:  # noqa: BLE001 - never raise into the forking program
                pass


def _after_fork_in_parent() -> None:
    """After os.fork(), in the parent: the threads _before_fork paused take over again (on
    3.13+ once os.fork() has returned: see SamplerSession::ResumeAfterFork)."""
    global _paused_for_fork
    session, _paused_for_fork = _paused_for_fork, None
    if session is None:
        return
    for part in _fork_parts(session):
        resume = getattr(part, "_resume_after_fork", None)
        if callable(resume):
            try:
                resume()
            except Exception:  # noqa: BLE001 - never raise into the forking program
                pass


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)



def _now_ns() -> int:
    """The native core's monotonic clock (the one the tracer stamps its events with)."""
    from gpuprof import _native  # the shared native core

    return _native.monotonic_ns()


def _first_user_frame() -> tuple[Any, int]:
    """The first frame outside this package above the caller, and how many frames up from the
    caller it is (1: the caller's caller); (None, n) when there is none."""
    f, up = sys._getframe(2), 1
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PACKAGE_DIR:
        f, up = f.f_back, up + 1
    return f, up


# How a session was started -> how to stop it (for the "already running" error). The command
# and the cell magic start sessions from inside this package: no user line to name.
_HOW_TO_STOP = {
    "profile.start()": "stop it with profile.stop()",
    "with profile(...)": "let its `with` block end (or call that session's stop())",
    "session.start()": "call that session's stop()",
    "the linescope command": ("the command profiles the whole script already: run it without "
                              "`linescope` to profile a part of it yourself"),
    "%%linescope": "let that cell finish",
}
_INTERNAL_STARTS = ("the linescope command", "%%linescope")


def _started_by(how: str) -> str:
    """`how`, with the user's file:line (the first frame outside this package) unless the
    package itself is the caller (the command, the cell magic)."""
    if how in _INTERNAL_STARTS:
        return how
    f, _ = _first_user_frame()
    return how if f is None else f"{how} at {f.f_code.co_filename}:{f.f_lineno}"


def _check_raw_result(backend: str, raw: Any, values: bool = True) -> None:
    """A backend's result() must be a RawBackendResult of RawLines and RawFunctions: a clear
    TypeError naming the backend otherwise (not an AttributeError from deep inside). With
    `values` (a backend that is not linescope's own) each line's values are checked too."""
    if not isinstance(raw, RawBackendResult):
        raise TypeError(f"backend {backend!r}: result() must return a linescope."
                        f"RawBackendResult, not {type(raw).__name__}")
    for field, kind in (("lines", RawLine), ("functions", RawFunction)):
        items = getattr(raw, field)
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"backend {backend!r}: RawBackendResult.{field} must be a list, "
                            f"not {type(items).__name__}")
        for x in items:
            if not isinstance(x, kind):
                raise TypeError(f"backend {backend!r}: RawBackendResult.{field} must hold "
                                f"linescope.{kind.__name__} items, not {type(x).__name__}")
            if values and kind is RawLine:
                _check_raw_line(backend, x)


# RawLine fields holding measured amounts: (name, may be None, may be negative).
_RAW_LINE_AMOUNTS = (("wall_time_ns", True, False), ("hits", True, False),
                     ("memory", True, True), ("samples", True, False),
                     ("self_time_ns", True, False), ("memory_peak", True, False),
                     ("cpu_time_ns", True, False), ("calls", True, False))


def _check_raw_line(backend: str, x: RawLine) -> None:
    """A custom backend's line: known amounts are integers (int, numpy integers; unknown:
    None), durations, counts and peaks are not negative, GPU values come as GPUStats. Clear
    errors naming the line."""
    where = f"backend {backend!r}: RawLine {x.filename!r}:{x.line!r}"

    def amount(name: str, value: Any, nullable: bool, signed: bool) -> None:
        if value is None and nullable:
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            kind = "an int or None" if nullable else "an int"
            raise TypeError(f"{where}: {name} must be {kind}, not {type(value).__name__}")
        if value < 0 and not signed:
            raise ValueError(f"{where}: {name} must not be negative, got {value}")

    if not isinstance(x.filename, (str, os.PathLike)) or not os.fspath(x.filename):
        raise TypeError(f"backend {backend!r}: RawLine.filename must be a non-empty path "
                        f"(str or os.PathLike), not {x.filename!r}")
    if isinstance(x.line, bool) or not isinstance(x.line, numbers.Integral) or x.line < 1:
        raise ValueError(f"{where}: line must be a line number (an int >= 1)")
    for name, nullable, signed in _RAW_LINE_AMOUNTS:
        amount(name, getattr(x, name), nullable, signed)
    if x.gpu is not None:
        if not isinstance(x.gpu, GPUStats):
            raise TypeError(f"{where}: gpu must be a linescope.GPUStats or None, "
                            f"not {type(x.gpu).__name__}")
        amount("gpu.time_ns", x.gpu.time_ns, True, False)
        amount("gpu.peak_memory_bytes", x.gpu.peak_memory_bytes, True, False)


def _finish_failed_beside(session: Any, exc: BaseException, failure: Exception,
                          result_name: str = "the session's .result") -> str:
    """The session could not finish (e.g. its report could not be written) while the
    profiled code was raising: that exception stays the one the user sees. Adds a note on
    it saying why, and returns that text for the caller's RuntimeWarning."""
    kept = f"; the result is in {result_name}" if session._result is not None else ""
    text = (f"linescope could not finish the session while the profiled code raised "
            f"{type(exc).__name__}: {type(failure).__name__}: {failure}{kept}")
    with contextlib.suppress(Exception):
        exc.add_note(text)
    return text


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _own_backend(factory: Any) -> bool:
    """Whether a backend factory is one of linescope's own (trace, sampler, scalene,
    tachyon), whose results need no value checks."""
    return (getattr(factory, "__module__", "") or "").startswith(__package__ + ".")


def _user_stacklevel() -> int:
    """The warnings.warn stacklevel, for a warn() in this function's caller, that names the
    user's line (the `with`, session.start() or profile.start()) however deep the package's
    own calls are."""
    return _first_user_frame()[1]


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


_UNSET: Any = _Unset()


def _patterns(name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, os.PathLike)):
        value = (value,)
    if isinstance(value, (Mapping, bytes)):  # its keys / bytes are no patterns
        raise TypeError(f"{name} must be a string or a sequence of glob patterns, "
                        f"not {type(value).__name__}")
    try:
        items = tuple(os.fspath(p) if isinstance(p, os.PathLike) else p for p in value)
    except TypeError:
        raise TypeError(f"{name} must be a string or a sequence of glob patterns, "
                        f"not {type(value).__name__}") from None
    for p in items:
        if not isinstance(p, str) or not p:
            raise ValueError(f"{name} patterns must be non-empty strings, got {p!r}")
        if not is_utf8(p):
            raise ValueError(f"{name} pattern {os.fsencode(p)!r} is not valid UTF-8: linescope "
                             "matches files by their UTF-8 paths; write the pattern as UTF-8 "
                             "text (a file whose name is not UTF-8 cannot be recorded)")
    return items


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


@contextlib.contextmanager
def _blame(name: str, from_config: set[str], config_path: Path | None) -> Iterator[None]:
    """An invalid value of option `name` that came from pyproject.toml says so."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if name not in from_config:
            raise
        raise type(e)(f"{e} (set by [tool.linescope] in {config_path})") from None


def _output_path(out: Any) -> str:
    """The absolute report path (relative paths: against the current directory now, so a
    later os.chdir does not move the report); refuses one that cannot be written."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"output must be a path or None, not {out!r}")
    path = os.path.abspath(os.fspath(out))
    if os.path.isdir(path):
        raise ValueError(f"output {path!r} is a directory; give a file name ending in .html "
                         "(the HTML report) or .json")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise ValueError(f"output {path!r} exists and is not writable; choose another path")
        try:
            with open(path, "ab"):  # opens as saving will (leaves the content alone)
                pass
        except OSError as e:
            raise ValueError(f"output {path!r} cannot be written: {e.strerror}") from None
        return path
    ancestor = os.path.dirname(path)
    while not os.path.exists(ancestor):  # missing parents are created when saving
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(f"output {path!r} cannot be written: {ancestor!r} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"output {path!r} cannot be written: no write permission in "
                         f"{ancestor!r}")
    # Permissions do not tell everything (a read-only or special file system, also for root):
    # a file is created there and removed again.
    try:
        fd, probe = tempfile.mkstemp(prefix=".linescope-probe-", dir=ancestor)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"output {path!r} cannot be written: {e.strerror} in "
                         f"{ancestor!r}") from None
    return path


def _live_codes(module: Any, path: str) -> dict[str, Any]:
    """Code objects of the module's functions — methods (static, class, property accessors)
    of the classes defined in it included, nested classes too — by qualname. Read from the
    module's and classes' own dicts by type, never through attribute access on the values:
    a global whose __getattr__ raises or imports (an attribute-dict config, a lazy-import
    proxy) is not touched."""
    out: dict[str, Any] = {}
    seen: set[int] = set()

    def add(obj: Any) -> None:
        if type(obj) is types.FunctionType:
            code = obj.__code__
            if code.co_filename == path:
                out[code.co_qualname] = code

    def visit_class(cls: type, depth: int) -> None:
        if depth > 16 or id(cls) in seen:
            return
        seen.add(id(cls))
        own = type.__dict__["__dict__"].__get__(cls)  # cls.__dict__, no metaclass hooks
        if own.get("__module__") != module.__name__:
            return  # imported, not defined here
        for member in list(own.values()):
            kind = type(member)
            if kind is staticmethod or kind is classmethod:
                add(member.__func__)
            elif kind is property:
                for accessor in (member.fget, member.fset, member.fdel):
                    add(accessor)
            elif issubclass(kind, type):
                visit_class(member, depth + 1)
            else:
                add(member)

    for value in list(vars(module).values()):
        if issubclass(type(value), type):
            visit_class(value, 0)
        else:
            add(value)
    return out


_DEF = re.compile(r"\s*(?:async\s+)?def\s+(\w+)")


def _compiled_codes(text: str, path: str) -> dict[str, list[Any]] | None:
    """The code objects `text` compiles to, by qualname (None when it does not compile)."""
    try:
        top = compile(text, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    found: dict[str, list[Any]] = {}
    stack = [top]
    while stack:
        code = stack.pop()
        found.setdefault(code.co_qualname, []).append(code)
        stack.extend(k for k in code.co_consts if isinstance(k, types.CodeType))
    return found


def _const_key(value: Any) -> Any:
    """A constant, comparable across compilations: a frozenset by its members (a .pyc's set
    literal may iterate in another order than a fresh compile's), a float by its repr (nan,
    -0.0), nested code by everything it does."""
    kind = type(value)
    if kind is types.CodeType:
        return ("code", _code_key(value))
    if kind is tuple:
        return ("tuple", tuple(_const_key(v) for v in value))
    if kind is frozenset:
        return ("frozenset", frozenset(_const_key(v) for v in value))
    if kind is float or kind is complex:
        return (kind.__name__, repr(value))
    return (kind.__name__, value)


def _code_key(code: Any) -> tuple:
    """What a function's code does, comparable across compilations of the same text: its
    bytecode, names, constants (nested functions and classes included) and first line."""
    return (code.co_firstlineno, code.co_code, code.co_names,
            tuple(_const_key(k) for k in code.co_consts))


def _rewritten(code: Any) -> bool:
    """Bytecode an import hook rewrote (pytest's assertion rewriting adds '@py_assert'
    names that no source can spell), here or in a nested function: its lines are the
    source's, its bytecode is not."""
    if any(n.startswith("@") for n in code.co_names + code.co_varnames):
        return True
    return any(type(k) is types.CodeType and _rewritten(k) for k in code.co_consts)


_CLOCK_REALTIME_COARSE = 5  # Linux's clock id: the clock file timestamps are taken from


def _file_clock_now_ns() -> tuple[int, bool]:
    """The start of the session on the file system's clock: (ns, exact). Linux stamps files
    from a coarse clock that ticks every few ms, so a file rewritten right after start() can
    carry a time before time.time_ns(). Waiting for that clock's next tick (at most one tick,
    a few ms) gives a bound every later write reaches and every earlier one stays below:
    a file is changed when its mtime is at or above it (exact). Elsewhere: time.time_ns(),
    changed when above it."""
    if sys.platform.startswith("linux"):
        try:
            first = time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
            deadline = time.monotonic() + 0.05
            while True:
                now = time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
                if now != first:
                    return now, True
                if time.monotonic() > deadline:
                    break
                time.sleep(0.0002)
        except (OSError, AttributeError):
            pass
    return time.time_ns(), False


def _source_differs(module: Any, path: str, text: str) -> bool:
    """True when `text` is not the code the module's functions run: the file was edited after
    the module was imported, so the report's lines would not match the code that ran. The
    functions must start where their code says, and each must be what `text` compiles to
    (bytecode, names, constants); a function whose bytecode an import hook rewrote (pytest's
    assertion rewriting) is checked by its lines only."""
    try:
        return _differs(_live_codes(module, path), path, text)
    except Exception:  # noqa: BLE001 - a module's odd contents: no verdict, no failure
        return False


def _differs(live: dict[str, Any], path: str, text: str) -> bool:
    if not live:
        return False
    compiled = _compiled_codes(text, path)
    if compiled is None:
        return True  # the file no longer compiles: not what ran
    # A function the text does not define was not compiled from it (exec'd under the file's
    # name, say): no verdict on it — unless the text defines none of them, when it is not
    # the file that ran (rewritten since).
    defined = {q: c for q, c in live.items() if q in compiled}
    if not defined:
        return True
    live = defined
    if _lines_differ(live, text):
        return True
    for qualname, code in live.items():
        if _rewritten(code):
            continue
        key = _code_key(code)
        if not any(_code_key(c) == key for c in compiled[qualname]):
            return True
    return False


def _lines_differ(live: dict[str, Any], text: str) -> bool:
    """Whether `text` no longer has the functions where their code says they start."""
    lines = [line.rstrip("\n") for line in source_lines(text)]
    for code in live.values():
        i = code.co_firstlineno - 1
        if not 0 <= i < len(lines):
            return True
        if code.co_name == "<lambda>":
            if "lambda" not in lines[i]:
                return True
            continue
        # The first line is the `def` itself, or its first decorator: then the first `def`
        # after it must be this one.
        if not lines[i].lstrip().startswith("@"):
            m = _DEF.match(lines[i])
            if m is None or m.group(1) != code.co_name:
                return True
            continue
        for line in lines[i + 1:i + 200]:
            m = _DEF.match(line)
            if m:
                if m.group(1) != code.co_name:
                    return True
                break
    return False


def _sum_known(values: list[int | None]) -> int | None:
    """The total when every part is known, else unknown: an unknown part is not 0."""
    return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def _max_known(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else max(values)  # type: ignore[type-var]


def _merge_duplicate_lines(lines: list[LineStats],
                           from_sampler: set[tuple[str, int]]) -> list[LineStats]:
    """One LineStats per (file, line): a backend that reports a line twice gets it merged,
    additive fields added and peaks maxed, each known only when every part is. Memory that
    the session's own sampler attributed (`from_sampler`) is per line already: taken once."""
    groups: dict[tuple[str, int], list[LineStats]] = {}
    for s in lines:
        groups.setdefault((s.filename, s.line), []).append(s)
    if len(groups) == len(lines):
        return lines
    out = []
    for key, parts in groups.items():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        first = parts[0]
        if key in from_sampler:
            memory, memory_peak = first.memory_bytes, first.memory_peak_bytes
        else:
            memory = _sum_known([p.memory_bytes for p in parts])
            memory_peak = _max_known([p.memory_peak_bytes for p in parts])
        gpu = None
        if any(p.gpu is not None for p in parts):
            gpu = GPUStats(
                _sum_known([p.gpu.time_ns if p.gpu else None for p in parts]),
                _max_known([p.gpu.peak_memory_bytes if p.gpu else None for p in parts]))
        out.append(LineStats(
            filename=first.filename, line=first.line,
            wall_time_ns=_sum_known([p.wall_time_ns for p in parts]),
            hits=_sum_known([p.hits for p in parts]),
            self_time_ns=_sum_known([p.self_time_ns for p in parts]),
            memory_bytes=memory, gpu=gpu, memory_peak_bytes=memory_peak,
            cpu_time_ns=_sum_known([p.cpu_time_ns for p in parts]),
            samples=_sum_known([p.samples for p in parts]),
            calls=_sum_known([p.calls for p in parts])))
    return out


class _ProfileMeta(type):
    """Class-level (module-level) access: ``profile.result`` of the latest session that
    stopped, however it ran (module level, ``with profile():``, an explicit session, the
    cell magic)."""

    @property
    def result(cls) -> ProfileResult:
        s = cls._last
        if s is None:
            raise RuntimeError("no linescope session has finished yet; run one first "
                               "(`with profile():`, or profile.start() then profile.stop())")
        return s.result


class _hybrid:
    """A method that works on an instance (``session.start()``) and on the class
    (``profile.start()``: the module-level default session)."""

    def __init__(self, instance_fn: Any, class_fn: Any) -> None:
        self._i = instance_fn
        self._c = class_fn
        self.__doc__ = instance_fn.__doc__

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return lambda *a, **k: self._c(owner, *a, **k)
        return self._i.__get__(obj, owner)


class profile(metaclass=_ProfileMeta):
    """Profile the source lines that run between start() and stop().

    ``with profile(...) as session: ...`` or ``session = profile(...); session.start(); ...;
    session.stop()``; module level ``profile.start(...)``, ``profile.stop()``,
    ``profile.result``, ``profile.save(path)``, ``profile.show()``.

    Options left out come from ``[tool.linescope]`` of the nearest pyproject.toml, then the
    defaults shown; explicit arguments win. Only code under ``root`` (default: the current
    directory) or matching ``include`` is recorded, minus ``exclude`` and installed packages
    (site-packages). The `trace` backend measures the thread that calls start().
    """

    _default: "profile | None" = None  # the module-level session (profile.start())
    _last: "profile | None" = None  # the latest session that stopped

    def __init__(self, backend: str = _UNSET, gpu: bool = _UNSET, memory: bool = _UNSET,
                 root: str | os.PathLike[str] | None = _UNSET,
                 include: str | Iterable[str] = _UNSET, exclude: str | Iterable[str] = _UNSET,
                 display: str = _UNSET, output: str | os.PathLike[str] | None = _UNSET,
                 sample_rate: float | None = _UNSET) -> None:
        explicit = {k: v for k, v in dict(backend=backend, gpu=gpu, memory=memory, root=root,
                                           include=include, exclude=exclude, display=display,
                                           output=output, sample_rate=sample_rate).items()
                    if v is not _UNSET}
        defaults, self._config_path = _config.load_defaults()
        opts: dict[str, Any] = dict(backend="trace", gpu=False, memory=False, root=None,
                                    include=(), exclude=(), display="end", output=None,
                                    sample_rate=None)
        opts.update(defaults)
        opts.update(explicit)
        # Options whose value came from pyproject.toml (errors name the file).
        self._from_config: set[str] = set(defaults) - set(explicit)

        def blame(name: str) -> contextlib.AbstractContextManager[None]:
            return _blame(name, self._from_config, self._config_path)

        with blame("backend"):
            if not isinstance(opts["backend"], str):
                raise TypeError(f"backend must be a string, not {opts['backend']!r}")
            self.backend_name: str = opts["backend"]
            self._factory = get_backend_factory(self.backend_name)  # unknown -> ValueError
        with blame("gpu"):
            self.gpu = _bool("gpu", opts["gpu"])
        with blame("memory"):
            self.memory = _bool("memory", opts["memory"])
        root_v = opts["root"]
        with blame("root"):
            if root_v is not None and not isinstance(root_v, (str, os.PathLike)):
                raise TypeError(f"root must be a path or None, not {root_v!r}")
            if root_v is not None and not os.path.isdir(root_v):
                raise ValueError(f"root {os.fspath(root_v)!r} is not a directory")
        self.root: str | None = None if root_v is None else os.path.abspath(root_v)
        with blame("root"):
            if self.root is not None:
                check_utf8_path("root", self.root)
            else:  # the default root: checked again at start (the directory may change)
                check_utf8_path("the current directory (the default root)", os.getcwd())
        with blame("include"):
            self.include = _patterns("include", opts["include"])
        with blame("exclude"):
            self.exclude = _patterns("exclude", opts["exclude"])
        with blame("display"):
            if opts["display"] not in _DISPLAY:
                raise ValueError(f"display must be one of {', '.join(map(repr, _DISPLAY))}, "
                                 f"not {opts['display']!r}")
        self.display: str = opts["display"]
        with blame("output"):
            out = opts["output"]
            self.output: str | None = None if out is None else _output_path(out)
        rate = opts["sample_rate"]
        with blame("sample_rate"):
            if rate is not None and (isinstance(rate, bool)
                                     or not isinstance(rate, (int, float)) or not rate > 0):
                raise ValueError(f"sample_rate must be a positive number of samples per "
                                 f"second or None, not {rate!r}")
        self.sample_rate: float | None = None if rate is None else float(rate)

        self._backend: ProfilerBackend | None = None
        self._memory_sampler: MemorySampler | None = None
        self._warnings: list[str] = []
        self._result: ProfileResult | None = None
        self._failure: str | None = None  # why a stopped session has no result
        self._state = "new"
        self._forked = False  # True in a forked child of the process that started it
        self._started_at = 0.0
        self._how = ""  # how it was started (a _HOW_TO_STOP key), and where:
        self._started_by = ""  # both, for the "already running" error
        self._t0_ns = 0
        self._t0_exact = False
        self._thread: int | None = None
        self._root_used = self.root  # the root the backend got (the default: cwd at start)
        self._snapshots: dict[str, str] = {}
        self._modules: dict[str, Any] = {}  # path -> the loaded module it was read for
        self._loaded_by_file: dict[str, Any] | None = None  # at stop: sys.modules by file

    # ---- options and capabilities --------------------------------------------------------
    def options(self) -> dict[str, Any]:
        return dict(backend=self.backend_name, gpu=self.gpu, memory=self.memory, root=self.root,
                    include=list(self.include), exclude=list(self.exclude),
                    display=self.display, output=self.output, sample_rate=self.sample_rate)

    def _backend_options(self) -> BackendOptions:
        """What a backend records (linescope's own package excluded) and measures."""
        if self.root is None:
            check_utf8_path("the current directory (the default root)", os.getcwd())
        return BackendOptions(roots=(self.root or os.getcwd(),), include=self.include,
                              exclude=self.exclude + (_PACKAGE_DIR + "/*",),
                              memory=self.memory, gpu=self.gpu, sample_rate=self.sample_rate)

    def _make_backend(self) -> ProfilerBackend:
        opts = self._backend_options()
        self._root_used = opts.roots[0]
        backend = self._factory(opts)
        caps = getattr(backend, "capabilities", None)
        if caps is None or not all(hasattr(backend, m) for m in ("start", "stop", "result")):
            raise TypeError(f"backend {self.backend_name!r} does not implement the "
                            "ProfilerBackend protocol (capabilities, start, stop, result)")
        if not isinstance(caps, BackendCapabilities):
            raise TypeError(f"backend {self.backend_name!r}: capabilities must be a "
                            "linescope.BackendCapabilities (what the backend measures), not "
                            f"{type(caps).__name__}")
        # memory=True works with any backend: one that does not measure memory itself gets
        # linescope's RSS sampler beside it.
        wanted = {"gpu": self.gpu, "sampled": self.sample_rate is not None}
        for cap, requested in wanted.items():
            if not requested or getattr(caps, cap, False):
                continue
            if cap == "sampled" and "sample_rate" in self._from_config:
                # pyproject's sample_rate is for sampling backends; an explicitly chosen
                # backend that does not sample goes on without it.
                self._warnings.append(
                    f"sample_rate = {self.sample_rate:g} from [tool.linescope] in "
                    f"{self._config_path} was ignored: the {self.backend_name!r} backend "
                    "does not sample")
                self.sample_rate = None
                continue
            if cap == "gpu" and "gpu" in caps.warn_instead_of_reject:
                text = (GPU_TRACE_WARNING if self.backend_name == "trace" else
                        f"GPU profiling is not supported by the {self.backend_name!r} backend: "
                        "GPU measurements are unavailable and Python line profiling continues.")
                self._warnings.append(text)
                warnings.warn(text, RuntimeWarning, stacklevel=_user_stacklevel())
                continue
            option = {"gpu": "gpu=True (--gpu)", "sampled": "sample_rate (--sample-rate)"}[cap]
            hint = {"gpu": "choose a backend that declares BackendCapabilities.gpu=True "
                           "(for example backend='sampler' or backend='scalene'; command "
                           "line: --backend sampler or --backend scalene)",
                    "sampled": "sample_rate only applies to sampling backends "
                               "(for example backend='sampler'; command line: --backend "
                               "sampler)"}[cap]
            raise ValueError(f"backend {self.backend_name!r} does not support {option} "
                             f"(BackendCapabilities.{cap} is False); {hint}")
        self._memory_sampler = None
        if self.memory and not caps.memory:
            source = getattr(backend, "_memory_line_source", None)
            self._memory_sampler = MemorySampler(opts, source() if callable(source) else None)
        return backend

    # ---- lifecycle -----------------------------------------------------------------------
    def _start(self, how: str = "", *, launcher: bool = False) -> "profile":
        """``launcher``: the frames running now belong to the tool that starts the session
        (the cell magic's own cell), not to the profiled code."""
        global _active
        if self._state == "running":
            raise RuntimeError("this linescope session is already running")
        if self._state == "stopped":
            raise RuntimeError("this linescope session already ran; create a new profile() "
                               "to profile again")
        how = how or "session.start()"
        started_by = _started_by(how)
        with _active_lock:
            if _active is not None:
                then = ("" if _active._how == "the linescope command"
                        else " before starting a new one")
                raise RuntimeError(
                    f"another linescope session is already running ({_active._started_by}); "
                    f"{_HOW_TO_STOP[_active._how]}{then} — sessions cannot nest or overlap")
            self._how, self._started_by = how, started_by
            _active = self
        try:
            self._warnings = []
            self._backend = self._make_backend()
            skip = getattr(self._backend, "_skip_running_frames", None)
            if launcher and callable(skip):
                skip()
            self._take_snapshots()
            self._started_at = time.time()
            self._t0_ns, self._t0_exact = _file_clock_now_ns()
            self._thread = threading.get_ident()
            if self._memory_sampler is not None:
                self._memory_sampler.start()
            try:
                self._backend.start()
            except BaseException:
                if self._memory_sampler is not None:
                    self._memory_sampler.stop()
                raise
        except BaseException:
            with _active_lock:
                _active = None
            self._backend = None
            self._memory_sampler = None
            raise
        self._state = "running"
        return self

    def _stop(self) -> ProfileResult:
        global _active
        # When the user asked to stop: the run ends here, not after the session's own work.
        stop_ns = _now_ns()
        if self._forked:
            raise RuntimeError("this linescope session was started by the parent process "
                               "before os.fork(); the child has no result of its own (the "
                               "parent's session writes the report)")
        if self._state == "new":
            raise RuntimeError("this linescope session has not started; call start() first "
                               "(or use `with profile(...):`)")
        if self._state == "stopped":
            raise RuntimeError("this linescope session is already stopped; read "
                               "session.result")
        assert self._backend is not None
        try:
            try:
                try:
                    stop_as_of = getattr(self._backend, "_stop_as_of", None)
                    if stop_as_of is not None:
                        stop_as_of(stop_ns)
                    else:
                        self._backend.stop()
                finally:
                    if self._memory_sampler is not None:
                        self._memory_sampler.stop()
            finally:
                self._state = "stopped"
                with _active_lock:
                    _active = None
            raw = self._backend.result()
            _check_raw_result(self.backend_name, raw,
                              values=not _own_backend(self._factory))
            self._result = self._build_result(raw)
        except BaseException as e:
            # The session ran and stopped without a result: it is still the latest session
            # (profile.result must not hand back an earlier one), and reading its result says
            # why there is none.
            self._failure = f"{type(e).__name__}: {e}"
            type(self)._last = self
            raise
        finally:
            # A finished session keeps only its result: the backend and the memory sampler
            # (native objects; the sampler's GPU collector holds NVML) go now, so a session
            # kept as profile.result does not hold them into the next one.
            self._backend = None
            self._memory_sampler = None
            self._loaded_by_file = None
        type(self)._last = self
        if self.output:
            _report.save(self._result, self.output)
        if self.display == "end":
            _report.show(self._result, sys.stderr)
        return self._result

    start = _hybrid(_start, lambda cls, *a, **kw: cls._module_start(*a, **kw))
    stop = _hybrid(_stop, lambda cls: cls._module_stop())

    @classmethod
    def _module_start(cls, *args: Any, **options: Any) -> "profile":
        session = cls(*args, **options)  # the same arguments as profile(...)
        session._start("profile.start()")
        cls._default = session
        return session

    @classmethod
    def _module_stop(cls) -> ProfileResult:
        running = _active
        if running is not None and running is not cls._default:
            raise RuntimeError(
                "profile.stop() stops a session started with profile.start(), and none "
                f"is running; the running session was started otherwise "
                f"({running._started_by}): {_HOW_TO_STOP[running._how]}")
        if cls._default is None:
            raise RuntimeError("profile.stop() called before profile.start(); start a session "
                               "first with profile.start(...) (or use `with profile(...):`)")
        if cls._default._state == "stopped":
            raise RuntimeError("profile.stop(): the session started with profile.start() is "
                               "already stopped; read profile.result (or start a new one)")
        return cls._default._stop()

    def __enter__(self) -> "profile":
        return self._start("with profile(...)")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._state != "running" or self._forked:
            return
        if exc is None:
            self._stop()
            return
        try:
            self._stop()
        except Exception as failure:  # noqa: BLE001 - the block's exception must stay
            warnings.warn(_finish_failed_beside(self, exc, failure), RuntimeWarning,
                          stacklevel=_user_stacklevel())

    # ---- results -------------------------------------------------------------------------
    def _get_result(self) -> ProfileResult:
        if self._result is None:
            if self._failure is not None:
                raise RuntimeError(f"no result: the session stopped, but finishing it failed "
                                   f"(backend {self.backend_name!r}: {self._failure})")
            raise RuntimeError("no result yet: the session "
                               + ("is still running; call stop() first" if self._state ==
                                  "running" else "has not run"))
        return self._result

    result = property(_get_result, doc="The ProfileResult (after stop()).")

    def _save(self, path: str | os.PathLike[str]) -> str:
        result = self._get_result()
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"save() needs a file path (.html or .json), not {path!r}")
        return _report.save(result, _output_path(path))

    def _show(self) -> None:
        _report.show(self._get_result(), sys.stdout)

    save = _hybrid(_save, lambda cls, path: cls._last_session()._save(path))
    show = _hybrid(_show, lambda cls: cls._last_session()._show())

    @classmethod
    def _last_session(cls) -> "profile":
        if cls._last is None:
            raise RuntimeError("no linescope session has finished yet; run one first "
                               "(`with profile():`, or profile.start() then profile.stop())")
        return cls._last

    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)

    # ---- source snapshots -----------------------------------------------------------------
    def _take_snapshots(self) -> None:
        """Reads, before measuring starts, the source of every loaded module that this
        session records, so that the report shows the code as it ran even when a file is
        edited during the session. Files first loaded during the session are read at stop().
        A module whose file changed after it was imported is noted at stop() (the code in
        memory no longer matches the file; checked for the files in the result only)."""
        from gpuprof import _native  # the shared native core: the same path filter

        self._snapshots = {}
        self._modules = {}
        o = self._backend_options()
        keep = _native.LineTracer(list(o.roots), list(o.include), list(o.exclude), native_cwd())
        for module in list(sys.modules.values()):
            name = getattr(module, "__file__", None)
            if not isinstance(name, str) or not name.endswith(".py"):
                continue
            path = os.path.abspath(name)
            if path in self._snapshots or not is_utf8(path) or not keep.recorded(path):
                continue
            text = self._registered_source(path)
            if text is None:
                try:
                    text = read_source(path)
                except OSError:
                    continue
                self._modules[path] = module
            self._snapshots[path] = text

    @staticmethod
    def _registered_source(name: str) -> str | None:
        """Source registered in linecache without a file timestamp (the CLI's compiled
        script, IPython cells): the exact text that was compiled."""
        entry = linecache.cache.get(name)
        if entry is not None and len(entry) == 4 and entry[1] is None:
            return "".join(entry[2])
        return None

    def _module_loaded_from(self, name: str) -> Any:
        """The loaded module whose file is `name` (None if none), from a map of sys.modules
        built once at stop()."""
        if self._loaded_by_file is None:
            self._loaded_by_file = {}
            for m in list(sys.modules.values()):
                f = getattr(m, "__file__", None)
                if isinstance(f, str):
                    self._loaded_by_file.setdefault(os.path.abspath(f), m)
        return self._loaded_by_file.get(name)

    def _source_of(self, name: str, warns: list[str]) -> str:
        text = self._registered_source(name)
        if text is not None:
            return text
        if name in self._snapshots:
            module = self._modules.get(name)
            if module is not None and _source_differs(module, name, self._snapshots[name]):
                warns.append(f"{name} changed after it was imported: the report shows the "
                             "file as it was when the session started, which may not match "
                             "the code that ran")
            return self._snapshots[name]
        if not os.path.isfile(name):
            if os.path.exists(name) and len(linecache.cache.get(name, ())) != 4:
                # A script read from a pipe or a device (/dev/fd/63, /dev/stdin) whose text is
                # no longer registered: it cannot be read again (opening a FIFO can block).
                return ""
            # <string> sources linecache knows; a module inside a zip archive through its
            # loader (module globals with __loader__)
            lines = linecache.getlines(name)
            if not lines:
                module = self._module_loaded_from(name)
                if module is not None:
                    with contextlib.suppress(Exception):
                        lines = linecache.getlines(name, module.__dict__)
            return "".join(lines)
        try:
            text = read_source(name)
            mtime = os.stat(name).st_mtime_ns
            changed = mtime >= self._t0_ns if self._t0_exact else mtime > self._t0_ns
        except OSError:
            return ""
        if not changed:
            # The file system's timestamps are coarser than the clock (a few ms): a file
            # loaded and rewritten right after start() can carry an older mtime. The code of
            # a module loaded from it tells.
            module = self._module_loaded_from(name)
            changed = module is not None and _source_differs(module, name, text)
        if changed:
            warns.append(f"{name} changed while it was being profiled: the report shows the "
                         "file as it is now, which may not match the code that ran")
        return text

    def _build_result(self, raw: RawBackendResult) -> ProfileResult:
        memory = raw.memory if self.memory else None
        line_memory: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        if self._memory_sampler is not None:
            memory = self._memory_sampler.profile()
            line_memory = self._memory_sampler.per_line()
        lines = []
        for r in raw.lines:
            # A custom backend's values may be numpy integers and its names os.PathLike: the
            # result holds plain ints and strs.
            name, line = os.fspath(r.filename), int(r.line)
            net, peak = line_memory.get((name, line), (r.memory, r.memory_peak))
            if not self.memory:
                net = peak = None
            gpu = r.gpu if self.gpu and isinstance(r.gpu, GPUStats) else None
            if gpu is not None:
                gpu = GPUStats(_int(gpu.time_ns), _int(gpu.peak_memory_bytes))
            lines.append(LineStats(
                filename=name, line=line, wall_time_ns=_int(r.wall_time_ns), hits=_int(r.hits),
                self_time_ns=_int(r.self_time_ns), memory_bytes=_int(net), gpu=gpu,
                memory_peak_bytes=_int(peak), cpu_time_ns=_int(r.cpu_time_ns),
                samples=_int(r.samples), calls=_int(r.calls)))
        lines = _merge_duplicate_lines(lines, from_sampler=set(line_memory))
        functions = [FunctionStats(qualname=f.qualname, filename=os.fspath(f.filename),
                                   first_line=f.first_line, total_time_ns=f.total_time_ns,
                                   own_time_ns=f.own_time_ns, calls=f.calls)
                     for f in raw.functions]
        files = sorted({s.filename for s in lines} | {f.filename for f in functions})
        warns = list(self._warnings)
        sources: dict[str, str] = {}
        for name in files:
            text = self._source_of(name, warns)
            if text:
                sources[name] = text
        symbols = [Symbol(f.qualname, f.filename, f.first_line) for f in functions]
        if self._memory_sampler is not None:
            warns.extend(self._memory_sampler.warnings)
        for w in raw.warnings:
            if w not in warns:
                warns.append(w)
        caps = self._backend.capabilities if self._backend is not None else None
        return ProfileResult(
            run=ProfileRun(elapsed_ns=raw.elapsed_ns, lines=lines, functions=functions,
                           started_at=self._started_at),
            sources=sources, backend=self.backend_name, capabilities=caps, symbols=symbols,
            warnings=warns, options=self.options(),
            metadata=dict(raw.metadata, thread_id=self._thread,
                          config_file=str(self._config_path) if self._config_path else None,
                          root=self._root_used),
            memory=memory,
            gpu=raw.gpu if self.gpu and caps is not None and caps.gpu else None)
