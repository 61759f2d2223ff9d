"""Backend protocol, registry and the built-in native `trace` backend."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable

from ._model import BackendCapabilities, RawBackendResult, RawFunction, RawLine


@dataclass(frozen=True)
class BackendOptions:
    """What a backend factory receives. ``roots`` are absolute directories; ``include`` /
    ``exclude`` are fnmatch patterns (``*`` also matches ``/``) tried against absolute paths
    and paths relative to a root."""

    roots: tuple[str, ...]
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    memory: bool
    gpu: bool
    sample_rate: float | None


@runtime_checkable
class ProfilerBackend(Protocol):
    """A profiler backend. ``capabilities`` is read before start(); start() and stop() are
    called once each, from the profiled thread; result() after stop()."""

    capabilities: BackendCapabilities

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def result(self) -> RawBackendResult: ...


BackendFactory = Callable[[BackendOptions], ProfilerBackend]

_REGISTRY: dict[str, BackendFactory] = {}
_LOCK = threading.Lock()


def register_backend(name: str, factory: BackendFactory, *, replace: bool = False) -> None:
    """Registers ``factory(options) -> ProfilerBackend`` under ``name`` (for
    ``profile(backend=name)`` and ``linescope --backend name``)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("register_backend: name must be a non-empty string")
    if not callable(factory):
        raise TypeError("register_backend: factory must be callable (options) -> backend")
    with _LOCK:
        if name in _REGISTRY and not replace:
            raise ValueError(f"a linescope backend named {name!r} is already registered; "
                             "pass replace=True to override it")
        _REGISTRY[name] = factory


def backend_names() -> list[str]:
    with _LOCK:
        return sorted(_REGISTRY)


def get_backend_factory(name: str) -> BackendFactory:
    with _LOCK:
        factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown linescope backend {name!r}; available: "
                         f"{', '.join(backend_names())} (or register one with "
                         "linescope.register_backend)")
    return factory


def nothing_recorded(roots: tuple[str, ...], what: str) -> str:
    """The warning of a session whose result has no line: `what` says what did not happen
    ("ran" for a tracer, "was sampled" for a sampler)."""
    return ("nothing was recorded: no line of code under the root (" + ", ".join(roots) +
            ") or matching an include pattern " + what + " during the session; if the code "
            "to profile lies elsewhere, point root= (-r) or include= (-i) at it")


def is_utf8(text: str) -> bool:
    """Whether ``text`` (a path or pattern) is UTF-8 text: a name read from a file system path
    that is not (surrogate-escaped bytes) cannot reach the native core, which keeps paths as
    UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_utf8_path(what: str, path: str) -> None:
    """ValueError naming ``what`` when ``path`` is not UTF-8 text."""
    if not is_utf8(path):
        raise ValueError(
            f"{what} {os.fsencode(path)!r} is not valid UTF-8: linescope records files by "
            "UTF-8 path; pass root= (the command line's -r) a directory whose path is UTF-8 "
            "text, or run from one")


def native_cwd() -> str:
    """The current directory for the native path filter (it resolves relative file names),
    or "" when its path is not UTF-8 (relative names then match no root)."""
    cwd = os.getcwd()
    return cwd if is_utf8(cwd) else ""


GPU_TRACE_WARNING = (
    "GPU profiling is not supported by the 'trace' backend: GPU measurements are unavailable "
    "and Python line profiling continues. Use a backend that declares "
    "BackendCapabilities.gpu=True: backend='scalene' or backend='sampler' together with "
    "gpu=True (command line: --backend scalene --gpu, or --backend sampler --gpu).")


class TraceBackend:
    """Deterministic per-line wall time and hit counts from the native tracer
    (sys.monitoring on Python 3.12+, a chained C trace function on 3.11). Measures the thread
    that calls start()."""

    capabilities = BackendCapabilities(line_time=True, hit_counts=True, function_stats=True,
                                       memory=False, sampled=False, gpu=False,
                                       threads="calling thread",
                                       warn_instead_of_reject=frozenset({"gpu"}))

    def __init__(self, options: BackendOptions) -> None:
        from gpuprof import _native  # the shared native core

        self._tracer = _native.LineTracer(list(options.roots), list(options.include),
                                          list(options.exclude), native_cwd())
        self._mode = _native.LineTracer.mode
        self._roots = options.roots
        self._adopt_running = True

    def _skip_running_frames(self) -> None:
        """Before start(): the recorded frames running at start are the launcher's (the
        notebook cell that runs the cell magic), not measured."""
        self._adopt_running = False

    def start(self) -> None:
        try:
            self._tracer.start(adopt_running=self._adopt_running)
        except RuntimeError as e:
            raise RuntimeError(f"linescope trace backend: {e}") from None

    def stop(self) -> None:
        self._tracer.stop()

    def _detach_after_fork(self) -> None:
        """In a child of os.fork() made during the session: the tracer's hooks go (the child
        does not own the session)."""
        self._tracer.detach_after_fork()

    def _stop_as_of(self, t_ns: int) -> None:
        """stop(), with the run ending at `t_ns` (gpuprof._native.monotonic_ns() taken when the
        session's stop was called): the session's own stop work is not part of the run."""
        self._tracer.stop(as_of_ns=t_ns)

    def _memory_line_source(self) -> tuple[int, Any]:
        """For linescope's memory sampler (memory=True): the tracer publishes the current
        line at every line change, so RSS readings can be charged to the running line."""
        return self._tracer.memory_line_source(), self._tracer.resolve_line_keys

    def _snapshot(self) -> RawBackendResult:
        """The result so far, while the tracer runs (save() during a session). The tracer's
        events and this read both hold the GIL, so the totals are consistent; a line that is
        still running counts up to its last event."""
        return self.result()

    def result(self) -> RawBackendResult:
        t = self._tracer
        lines = [RawLine(filename=f, line=ln, wall_time_ns=wall, hits=hits, self_time_ns=own,
                         calls=calls)
                 for f, ln, wall, own, hits, calls in t.lines()]
        functions = [RawFunction(filename=f, qualname=q, first_line=first, total_time_ns=tot,
                                 own_time_ns=own, calls=calls)
                     for f, q, first, tot, own, calls in t.functions()]
        warnings = list(t.warnings)
        if not lines:
            warnings.append(nothing_recorded(self._roots, "ran"))
        return RawBackendResult(
            lines=lines, functions=functions, elapsed_ns=t.elapsed_ns,
            warnings=warnings,
            metadata={"tracer": self._mode, "tool_id": t.tool_id,
                      "stack_repairs": t.mismatches,
                      # 3.11's trace function is per thread: other threads' events never
                      # reach it, so how many there were is unknown.
                      "other_thread_events_ignored": (t.other_thread_events
                                                      if self._mode == "sys.monitoring"
                                                      else None)})


register_backend("trace", TraceBackend)
