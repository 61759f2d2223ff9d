"""``profile``: the session object, context manager and module-level controls."""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterable

from . import _config, _report
from ._backends import BackendOptions, ProfilerBackend, get_backend_factory, GPU_TRACE_WARNING
from ._model import (FunctionStats, GPUStats, LineStats, ProfileResult, ProfileRun,
                     RawBackendResult, Symbol)
from ._sampling import MemorySampler  # also registers the "sampler" backend

_DISPLAY = ("none", "end")
_PACKAGE_DIR = str(Path(__file__).resolve().parent)

_active_lock = threading.Lock()
_active: "profile | None" = None


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


_UNSET: Any = _Unset()


def _patterns(name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be a string or a sequence of glob patterns, "
                        f"not {type(value).__name__}") from None
    for p in items:
        if not isinstance(p, str) or not p:
            raise ValueError(f"{name} patterns must be non-empty strings, got {p!r}")
    return items


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


class _ProfileMeta(type):
    """Class-level (module-level) access: ``profile.result`` of the default session."""

    @property
    def result(cls) -> ProfileResult:
        s = cls._default
        if s is None:
            raise RuntimeError("no linescope session has run; call profile.start() and "
                               "profile.stop() (or use `with profile():`) first")
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

    _default: "profile | None" = None

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

        if not isinstance(opts["backend"], str):
            raise TypeError(f"backend must be a string, not {opts['backend']!r}")
        self.backend_name: str = opts["backend"]
        self._factory = get_backend_factory(self.backend_name)  # unknown backend -> ValueError
        self.gpu = _bool("gpu", opts["gpu"])
        self.memory = _bool("memory", opts["memory"])
        root_v = opts["root"]
        if root_v is not None and not isinstance(root_v, (str, os.PathLike)):
            raise TypeError(f"root must be a path or None, not {root_v!r}")
        if root_v is not None and not os.path.isdir(root_v):
            raise ValueError(f"root {os.fspath(root_v)!r} is not a directory")
        self.root: str | None = None if root_v is None else os.path.abspath(root_v)
        self.include = _patterns("include", opts["include"])
        self.exclude = _patterns("exclude", opts["exclude"])
        if opts["display"] not in _DISPLAY:
            raise ValueError(f"display must be one of {', '.join(map(repr, _DISPLAY))}, "
                             f"not {opts['display']!r}")
        self.display: str = opts["display"]
        out = opts["output"]
        if out is not None and not isinstance(out, (str, os.PathLike)):
            raise TypeError(f"output must be a path or None, not {out!r}")
        self.output: str | None = None if out is None else os.fspath(out)
        rate = opts["sample_rate"]
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                 or not rate > 0):
            raise ValueError(f"sample_rate must be a positive number of samples per second "
                             f"or None, not {rate!r}")
        self.sample_rate: float | None = None if rate is None else float(rate)

        self._backend: ProfilerBackend | None = None
        self._memory_sampler: MemorySampler | None = None
        self._warnings: list[str] = []
        self._result: ProfileResult | None = None
        self._state = "new"
        self._started_at = 0.0
        self._thread: int | None = None

    # ---- options and capabilities --------------------------------------------------------
    def options(self) -> dict[str, Any]:
        return dict(backend=self.backend_name, gpu=self.gpu, memory=self.memory, root=self.root,
                    include=list(self.include), exclude=list(self.exclude),
                    display=self.display, output=self.output, sample_rate=self.sample_rate)

    def _make_backend(self) -> ProfilerBackend:
        root = self.root or os.getcwd()
        opts = BackendOptions(roots=(root,), include=self.include,
                              exclude=self.exclude + (_PACKAGE_DIR + "/*",),
                              memory=self.memory, gpu=self.gpu, sample_rate=self.sample_rate)
        backend = self._factory(opts)
        caps = getattr(backend, "capabilities", None)
        if caps is None or not all(hasattr(backend, m) for m in ("start", "stop", "result")):
            raise TypeError(f"backend {self.backend_name!r} does not implement the "
                            "ProfilerBackend protocol (capabilities, start, stop, result)")
        # memory=True works with any backend: one that does not measure memory itself gets
        # linescope's RSS sampler beside it.
        wanted = {"gpu": self.gpu, "sampled": self.sample_rate is not None}
        for cap, requested in wanted.items():
            if not requested or getattr(caps, cap, False):
                continue
            if cap == "gpu" and "gpu" in caps.warn_instead_of_reject:
                text = (GPU_TRACE_WARNING if self.backend_name == "trace" else
                        f"GPU profiling is not supported by the {self.backend_name!r} backend: "
                        "GPU measurements are unavailable and Python line profiling continues.")
                self._warnings.append(text)
                warnings.warn(text, RuntimeWarning, stacklevel=4)
                continue
            option = {"gpu": "gpu=True", "sampled": "sample_rate"}[cap]
            hint = {"gpu": "choose a backend that declares BackendCapabilities.gpu=True "
                           "(for example backend='sampler' or backend='scalene')",
                    "sampled": "sample_rate only applies to sampling backends "
                               "(for example backend='sampler')"}[cap]
            raise ValueError(f"backend {self.backend_name!r} does not support {option} "
                             f"(BackendCapabilities.{cap} is False); {hint}")
        self._memory_sampler = (MemorySampler(opts) if self.memory and not caps.memory
                                else None)
        return backend

    # ---- lifecycle -----------------------------------------------------------------------
    def _start(self) -> "profile":
        global _active
        if self._state == "running":
            raise RuntimeError("this linescope session is already running")
        if self._state == "stopped":
            raise RuntimeError("this linescope session already ran; create a new profile() "
                               "to profile again")
        with _active_lock:
            if _active is not None:
                raise RuntimeError("another linescope session is already running; stop it "
                                   "(session.stop() or profile.stop()) before starting a new "
                                   "one — sessions cannot nest or overlap")
            _active = self
        try:
            self._warnings = []
            self._backend = self._make_backend()
            self._started_at = time.time()
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
        if self._state == "new":
            raise RuntimeError("this linescope session has not started; call start() first "
                               "(or use `with profile(...):`)")
        if self._state == "stopped":
            raise RuntimeError("this linescope session is already stopped; read "
                               "session.result")
        assert self._backend is not None
        try:
            try:
                self._backend.stop()
            finally:
                if self._memory_sampler is not None:
                    self._memory_sampler.stop()
        finally:
            self._state = "stopped"
            with _active_lock:
                _active = None
        raw = self._backend.result()
        self._result = self._build_result(raw)
        if self.output:
            _report.save(self._result, self.output)
        if self.display == "end":
            _report.show(self._result, sys.stderr)
        return self._result

    start = _hybrid(_start, lambda cls, **kw: cls._module_start(**kw))
    stop = _hybrid(_stop, lambda cls: cls._module_stop())

    @classmethod
    def _module_start(cls, **options: Any) -> "profile":
        session = cls(**options)
        session._start()
        cls._default = session
        return session

    @classmethod
    def _module_stop(cls) -> ProfileResult:
        if cls._default is None:
            raise RuntimeError("profile.stop() called before profile.start()")
        return cls._default._stop()

    def __enter__(self) -> "profile":
        return self._start()

    def __exit__(self, *exc: Any) -> None:
        if self._state == "running":
            self._stop()

    # ---- results -------------------------------------------------------------------------
    def _get_result(self) -> ProfileResult:
        if self._result is None:
            raise RuntimeError("no result yet: the session "
                               + ("is still running; call stop() first" if self._state ==
                                  "running" else "has not run"))
        return self._result

    result = property(_get_result, doc="The ProfileResult (after stop()).")

    def _save(self, path: str | os.PathLike[str]) -> str:
        return _report.save(self._get_result(), path)

    def _show(self) -> None:
        _report.show(self._get_result(), sys.stdout)

    save = _hybrid(_save, lambda cls, path: cls._default_session()._save(path))
    show = _hybrid(_show, lambda cls: cls._default_session()._show())

    @classmethod
    def _default_session(cls) -> "profile":
        if cls._default is None:
            raise RuntimeError("no linescope session has run; call profile.start() first")
        return cls._default

    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)

    def _build_result(self, raw: RawBackendResult) -> ProfileResult:
        memory = raw.memory if self.memory else None
        line_memory: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        if self._memory_sampler is not None:
            memory = self._memory_sampler.profile()
            line_memory = self._memory_sampler.per_line()
        lines = []
        for r in raw.lines:
            net, peak = line_memory.get((r.filename, r.line), (r.memory, r.memory_peak))
            if not self.memory:
                net = peak = None
            lines.append(LineStats(
                filename=r.filename, line=r.line, wall_time_ns=r.wall_time_ns, hits=r.hits,
                self_time_ns=r.self_time_ns, memory_bytes=net,
                gpu=(r.gpu if self.gpu and isinstance(r.gpu, GPUStats) else None),
                memory_peak_bytes=peak, cpu_time_ns=r.cpu_time_ns, samples=r.samples))
        functions = [FunctionStats(qualname=f.qualname, filename=f.filename,
                                   first_line=f.first_line, total_time_ns=f.total_time_ns,
                                   own_time_ns=f.own_time_ns, calls=f.calls)
                     for f in raw.functions]
        files = sorted({s.filename for s in lines} | {f.filename for f in functions})
        sources: dict[str, str] = {}
        for name in files:
            text = "".join(linecache.getlines(name))
            if not text and os.path.isfile(name):
                try:
                    text = Path(name).read_text(encoding="utf-8", errors="replace")
                except OSError:
                    text = ""
            if text:
                sources[name] = text
        symbols = [Symbol(f.qualname, f.filename, f.first_line) for f in functions]
        warns = list(self._warnings)
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
                          config_file=str(self._config_path) if self._config_path else None),
            memory=memory,
            gpu=raw.gpu if self.gpu and caps is not None and caps.gpu else None)
