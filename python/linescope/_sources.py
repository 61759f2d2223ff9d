"""The source text a session's result shows, and whether it is the code that ran.

Files loaded before the session are read when it starts (a file edited during the session
still shows the code as it ran); files first loaded during it are read at stop(). A file
whose code no longer matches what ran (edited after import, rewritten during the session)
gets a warning.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import time
import types
from typing import Any

from ._backends import BackendOptions, is_utf8, native_cwd
from ._text import read_source, source_lines


class Sources:
    """One session's source snapshots. ``take_snapshots`` and ``mark_start`` run in start()
    (before measuring begins), ``source_of`` while the result is built at stop(); all on the
    thread that starts and stops the session."""

    def __init__(self) -> None:
        self._snapshots: dict[str, str] = {}
        self._modules: dict[str, Any] = {}  # path -> the loaded module it was read for
        self._loaded_by_file: dict[str, Any] | None = None  # at stop: sys.modules by file
        self._t0_ns = 0
        self._t0_exact = False

    def take_snapshots(self, o: BackendOptions) -> None:
        """Reads, before measuring starts, the source of every loaded module that this
        session records, so that the report shows the code as it ran even when a file is
        edited during the session. Files first loaded during the session are read at stop().
        A module whose file changed after it was imported is noted at stop() (the code in
        memory no longer matches the file; checked for the files in the result only)."""
        from gpuprof import _native  # the shared native core: the same path filter

        self._snapshots = {}
        self._modules = {}
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

    def source_of(self, name: str, warns: list[str]) -> str:
        text = self._registered_source(name)
        if text is not None:
            return text
        if name in self._snapshots:
            module = self._modules.get(name)
            if module is not None and source_differs(module, name, self._snapshots[name]):
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
            changed = module is not None and source_differs(module, name, text)
        if changed:
            warns.append(f"{name} changed while it was being profiled: the report shows the "
                         "file as it is now, which may not match the code that ran")
        return text

    def mark_start(self) -> None:
        """The moment measuring starts, on the file system's clock: a file changed at or
        after it was rewritten during the session."""
        self._t0_ns, self._t0_exact = file_clock_now_ns()

    def release_modules(self) -> None:
        """Drops the map of loaded modules built at stop() (it holds every module)."""
        self._loaded_by_file = None


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


def _code_key(code: Any) -> tuple[Any, ...]:
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


def file_clock_now_ns() -> tuple[int, bool]:
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


def source_differs(module: Any, path: str, text: str) -> bool:
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

