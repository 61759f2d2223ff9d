"""``profile``: the session object, context manager and module-level controls."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterable
from types import FrameType
from typing import Any

from . import _notebook, _options, _report, _spark, _symbols
from ._backends import GPU_TRACE_WARNING, BackendOptions, ProfilerBackend, check_utf8_path
from ._model import (BackendCapabilities, FunctionStats, GPUStats, LineStats, ProfileResult,
                     ProfileRun, RawBackendResult, RunStatus, SessionState, SourceUnit,
                     Symbol)
from ._options import UNSET
from ._results import check_raw_result, is_own_backend, known_int, merge_duplicate_lines
from ._sampling import MemorySampler  # also registers the "sampler" backend
from ._sources import Sources

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # as code filenames name it

_active_lock = threading.Lock()
_active: profile | None = None


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


_paused_for_fork: profile | None = None


def _fork_parts(session: profile) -> tuple[Any, ...]:
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


def _first_user_frame() -> tuple[FrameType | None, int]:
    """The first frame outside this package above the caller, and how many frames up from the
    caller it is (1: the caller's caller); (None, n) when there is none."""
    f: FrameType | None = sys._getframe(2)
    up = 1
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


def _user_stacklevel() -> int:
    """The warnings.warn stacklevel, for a warn() in this function's caller, that names the
    user's line (the `with`, session.start() or profile.start()) however deep the package's
    own calls are."""
    return _first_user_frame()[1]


class _ProfileMeta(type):
    """Class-level (module-level) access: ``profile.result`` of the latest session that
    stopped, however it ran (module level, ``with profile():``, an explicit session, the
    cell magic)."""

    _last: profile | None  # set on the class `profile`

    @property
    def result(cls) -> ProfileResult:
        s = cls._last
        if s is None:
            raise RuntimeError("no linescope session has finished yet; run one first "
                               "(`with profile():`, or profile.start() then profile.stop())")
        return s._get_result()


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

    _default: profile | None = None  # the module-level session (profile.start())
    _last: profile | None = None  # the latest session that stopped

    def __init__(self, backend: str = UNSET, gpu: bool = UNSET, memory: bool = UNSET,
                 root: str | os.PathLike[str] | None = UNSET,
                 include: str | Iterable[str] = UNSET, exclude: str | Iterable[str] = UNSET,
                 display: str = UNSET, output: str | os.PathLike[str] | None = UNSET,
                 sample_rate: float | None = UNSET, notebooks: bool = UNSET,
                 child_notebooks: bool = UNSET, spark: bool = UNSET) -> None:
        explicit = {k: v for k, v in dict(backend=backend, gpu=gpu, memory=memory, root=root,
                                           include=include, exclude=exclude, display=display,
                                           output=output, sample_rate=sample_rate,
                                           notebooks=notebooks,
                                           child_notebooks=child_notebooks,
                                           spark=spark).items()
                    if v is not UNSET}
        o = _options.resolve(explicit)
        self._config_path = o.config_path
        self._from_config = o.from_config  # options set by pyproject.toml (errors name it)
        self.backend_name: str = o.backend
        self._factory = o.factory
        self.gpu = o.gpu
        self.memory = o.memory
        self.root: str | None = o.root
        self.include = o.include
        self.exclude = o.exclude
        self.display: str = o.display
        self.output: str | None = o.output
        self.sample_rate: float | None = o.sample_rate
        self.notebooks: bool = o.notebooks
        self.child_notebooks: bool = o.child_notebooks
        self.spark: bool = o.spark
        self._spark: _spark.SparkRecorder | None = None  # spark=True, while it runs
        self._in_notebook = False  # started inside IPython with notebooks=True: cells recorded
        self._error: str | None = None  # what the profiled code raised (the run failed)

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
        self._thread: int | None = None
        self._root_used = self.root  # the root the backend got (the default: cwd at start)
        self._sources = Sources()

    # ---- options and capabilities --------------------------------------------------------
    def options(self) -> dict[str, Any]:
        return dict(backend=self.backend_name, gpu=self.gpu, memory=self.memory, root=self.root,
                    include=list(self.include), exclude=list(self.exclude),
                    display=self.display, output=self.output, sample_rate=self.sample_rate,
                    notebooks=self.notebooks, child_notebooks=self.child_notebooks,
                    spark=self.spark)

    def _backend_options(self) -> BackendOptions:
        """What a backend records (linescope's own package excluded) and measures."""
        if self.root is None:
            check_utf8_path("the current directory (the default root)", os.getcwd())
        include = self.include
        if self._in_notebook:  # the cells that run while the session runs
            include = (*include, *(p for p in _notebook.CELL_PATTERNS if p not in include))
        return BackendOptions(roots=(self.root or os.getcwd(),), include=include,
                              exclude=(*self.exclude, _PACKAGE_DIR + "/*"),
                              memory=self.memory, gpu=self.gpu, sample_rate=self.sample_rate)

    def _make_backend(self) -> ProfilerBackend:
        # A backend class declares what it measures before it is made: a request it cannot
        # serve is refused first (before, e.g., tachyon's "needs Python 3.15").
        declared = getattr(self._factory, "capabilities", None)
        if isinstance(declared, BackendCapabilities):
            self._check_requests(declared)
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
        if caps != declared:  # an instance that measures otherwise than its class declared
            self._check_requests(caps)
        # memory=True works with any backend: one that does not measure memory itself gets
        # linescope's RSS sampler beside it.
        self._memory_sampler = None
        if self.memory and not caps.memory:
            source = getattr(backend, "_memory_line_source", None)
            self._memory_sampler = MemorySampler(opts, source() if callable(source) else None)
        return backend

    def _check_requests(self, caps: BackendCapabilities) -> None:
        """Each requested option against what the backend measures: refused (ValueError), or
        dropped with a warning where the backend or the option's source allows that."""
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
            option = {"gpu": "gpu=True (--gpu): it measures no GPU time or GPU memory",
                      "sampled": "sample_rate (--sample-rate)"}[cap]
            hint = {"gpu": "choose a backend that declares BackendCapabilities.gpu=True "
                           "(for example backend='sampler' or backend='scalene'; command "
                           "line: --backend sampler or --backend scalene)",
                    "sampled": "sample_rate only applies to sampling backends "
                               "(for example backend='sampler'; command line: --backend "
                               "sampler)"}[cap]
            raise ValueError(f"backend {self.backend_name!r} does not support {option} "
                             f"(BackendCapabilities.{cap} is False); {hint}")

    # ---- lifecycle -----------------------------------------------------------------------
    def _start(self, how: str = "", *, launcher: bool = False) -> profile:
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
            self._in_notebook = self.notebooks and _notebook.shell() is not None
            self._backend = self._make_backend()
            skip = getattr(self._backend, "_skip_running_frames", None)
            if launcher and callable(skip):
                skip()
            self._sources.take_snapshots(self._backend_options())
            self._started_at = time.time()
            self._sources.mark_start()
            self._thread = threading.get_ident()
            if self._memory_sampler is not None:
                self._memory_sampler.start()
            self._spark = (_spark.start_recorder(self._backend_options(), self._warnings,
                                                 _user_stacklevel()) if self.spark else None)
            try:
                self._backend.start()
            except BaseException:
                if self._memory_sampler is not None:
                    self._memory_sampler.stop()
                if self._spark is not None:
                    self._spark.stop()
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
                    if self._spark is not None:
                        self._spark.stop()  # the wrappers go; Spark is read below
            finally:
                self._state = "stopped"
                with _active_lock:
                    _active = None
            raw = self._backend.result()
            check_raw_result(self.backend_name, raw, values=not is_own_backend(self._factory))
            self._result = self._build_result(raw)
            if self._spark is not None:
                _spark.attach(self._result, self._spark)
                _spark_at_cell_labels(self._result)
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
            self._sources.release_modules()
        type(self)._last = self
        if self.output:
            _report.save(self._result, self.output)
        if self.display == "end" and _notebook.in_kernel():
            from ._magic import display_report  # a notebook: the report in the cell

            display_report(self._result)
        elif self.display == "end":
            _report.show(self._result, sys.stderr)
        return self._result

    start = _hybrid(_start, lambda cls, *a, **kw: cls._module_start(*a, **kw))
    stop = _hybrid(_stop, lambda cls: cls._module_stop())

    @classmethod
    def _module_start(cls, *args: Any, **options: Any) -> profile:
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

    def __enter__(self) -> profile:
        return self._start("with profile(...)")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._state != "running" or self._forked:
            return
        if exc is None:
            self._stop()
            return
        self._mark_failed(exc)
        try:
            self._stop()
        except Exception as failure:  # noqa: BLE001 - the block's exception must stay
            warnings.warn(_finish_failed_beside(self, exc, failure), RuntimeWarning,
                          stacklevel=_user_stacklevel())

    def _mark_failed(self, exc: BaseException) -> None:
        """The profiled code raised `exc`: the run's status is failed, with what it raised
        (a SystemExit with status 0 or None is a normal end)."""
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return
        text = str(exc)
        self._error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__

    # ---- state and configuration (also LineScope's names) ----------------------------------
    @property
    def state(self) -> SessionState:
        """``created``, ``running`` or ``stopped``."""
        return {"new": SessionState.CREATED, "running": SessionState.RUNNING,
                "stopped": SessionState.STOPPED}[self._state]

    @property
    def config(self) -> Any:
        """The session's resolved options as a linescope.Config."""
        from ._compat import Config

        return Config(**self.options())

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

    def _current_result(self) -> ProfileResult:
        """The result after stop(); while the session runs, the result so far (a snapshot:
        a line still running counts up to its last event)."""
        return self._snapshot() if self._state == "running" else self._get_result()

    def _snapshot(self) -> ProfileResult:
        assert self._backend is not None
        snapshot = getattr(self._backend, "_snapshot", None)
        if snapshot is None:
            raise RuntimeError(
                f"this session is still running and the {self.backend_name!r} backend reports "
                "only when it stops; call stop() first, or use the 'trace' backend, which can "
                "save a report while it runs")
        raw = snapshot()
        check_raw_result(self.backend_name, raw, values=not is_own_backend(self._factory))
        return self._build_result(raw, running=True)

    def _save(self, path: str | os.PathLike[str]) -> str:
        """Writes the report (.html / .htm) or the JSON result (any other suffix); while the
        session runs, of what it has measured so far. Returns the absolute path."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"save() needs a file path (.html or .json), not {path!r}")
        return _report.save(self._current_result(), _options.output_path(path))

    def _html(self) -> str:
        """The self-contained HTML report (while the session runs: of what it measured so
        far)."""
        return _report.render_html(self._current_result())

    def _show(self, *, inline: bool | None = None) -> None:
        """``inline=None``: the report inside a Jupyter notebook cell when running in one,
        else the text summary on stdout; ``inline=True``: the report in the notebook cell
        (an error outside a notebook); ``inline=False``: the HTML report in a web browser
        (saved to ``output`` when set, else to a temporary file)."""
        if inline is not None and not isinstance(inline, bool):
            raise TypeError(f"show(inline=...) must be True, False or None, not {inline!r}")
        result = self._current_result()
        kernel = _notebook.in_kernel()
        if inline is True and not kernel:
            raise RuntimeError("show(inline=True) displays the report in a Jupyter notebook "
                               "cell, and none is running here; use show() for the text "
                               "summary or show(inline=False) for a web browser")
        if inline is None and not kernel:
            _report.show(result, sys.stdout)
        elif inline is False:
            _report.open_in_browser(result, self.output)
        else:
            from ._magic import display_report

            display_report(result)

    save = _hybrid(_save, lambda cls, path: cls._current_session()._save(path))
    show = _hybrid(_show, lambda cls, *, inline=None: cls._current_session()._show(inline=inline))
    html = _hybrid(_html, lambda cls: cls._current_session()._html())

    @classmethod
    def _last_session(cls) -> profile:
        if cls._last is None:
            raise RuntimeError("no linescope session has finished yet; run one first "
                               "(`with profile():`, or profile.start() then profile.stop())")
        return cls._last

    @classmethod
    def _current_session(cls) -> profile:
        """For profile.save() / show() / html(): the session profile.start() started while it
        runs, else the latest one that stopped."""
        running = cls._default
        if running is not None and running._state == "running":
            return running
        return cls._last_session()

    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)

    def _build_result(self, raw: RawBackendResult, running: bool = False) -> ProfileResult:
        """The result of `raw`; `running`: a snapshot of a running session (the memory
        sampler is read at stop only)."""
        memory = raw.memory if self.memory else None
        line_memory: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        if self._memory_sampler is not None and running:
            memory = None
        elif self._memory_sampler is not None:
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
                gpu = GPUStats(known_int(gpu.time_ns), known_int(gpu.peak_memory_bytes))
            lines.append(LineStats(
                filename=name, line=line, wall_time_ns=known_int(r.wall_time_ns),
                hits=known_int(r.hits), self_time_ns=known_int(r.self_time_ns),
                memory_bytes=known_int(net), gpu=gpu, memory_peak_bytes=known_int(peak),
                cpu_time_ns=known_int(r.cpu_time_ns), samples=known_int(r.samples),
                calls=known_int(r.calls)))
        lines = merge_duplicate_lines(lines, from_sampler=set(line_memory))
        functions = [FunctionStats(qualname=f.qualname, filename=os.fspath(f.filename),
                                   first_line=f.first_line, total_time_ns=f.total_time_ns,
                                   own_time_ns=f.own_time_ns, calls=f.calls)
                     for f in raw.functions]
        files = sorted({s.filename for s in lines} | {f.filename for f in functions})
        warns = list(self._warnings)
        sources: dict[str, str] = {}
        for name in files:
            text = self._sources.source_of(name, warns)
            if text:
                sources[name] = text
        assert self._backend is not None  # called by _stop(), before it lets the backend go
        caps = self._backend.capabilities
        if caps.function_stats and caps.hit_counts and not caps.sampled:
            functions += _never_ran(functions, sources)
        symbols = [Symbol(f.qualname, f.filename, f.first_line) for f in functions]
        if self._memory_sampler is not None and running:
            warns.append("host memory is reported when the session stops; this report was "
                         "saved while it ran")
        elif self._memory_sampler is not None:
            warns.extend(self._memory_sampler.warnings)
        for w in raw.warnings:
            if w not in warns:
                warns.append(w)
        labels = _notebook.cell_labels(list(sources)) if any(
            _notebook.is_cell_file(f) for f in files) else {}
        units = {}
        for name, text in sources.items():
            label = labels.get(name, name)
            units[label] = SourceUnit(text, label, name,
                                      "notebook" if name in labels else "python")
        if labels:
            lines, functions, symbols = _relabelled(labels, lines, functions, symbols)
        return ProfileResult(
            run=ProfileRun(elapsed_ns=raw.elapsed_ns, lines=lines, functions=functions,
                           started_at=self._started_at,
                           status=RunStatus.FAILED if self._error else RunStatus.SUCCESS,
                           error=self._error),
            sources=units, backend=self.backend_name, capabilities=caps, symbols=symbols,
            warnings=warns, options=self.options(),
            metadata=dict(raw.metadata, thread_id=self._thread,
                          config_file=str(self._config_path) if self._config_path else None,
                          root=self._root_used, running=running),
            memory=memory,
            gpu=raw.gpu if self.gpu and caps.gpu else None)


def _never_ran(functions: list[FunctionStats],
               sources: dict[str, str]) -> list[FunctionStats]:
    """The functions defined in the captured sources that did not run (0 calls, 0 time):
    defined by the snapshot, matched to the ones that ran by name and first line."""
    ran: dict[str, set[Any]] = {}
    for f in functions:
        ran.setdefault(f.filename, set()).update((f.qualname, f.first_line))
    out = []
    for name, text in sources.items():
        seen = ran.get(name, set())
        for qualname, first in _symbols.defined_functions(text):
            if qualname in seen or first in seen:
                continue
            out.append(FunctionStats(qualname=qualname, filename=name, first_line=first,
                                     total_time_ns=0, own_time_ns=0, calls=0))
    return out


def _relabelled(labels: dict[str, str], lines: list[LineStats], functions: list[FunctionStats],
                symbols: list[Symbol]
                ) -> tuple[list[LineStats], list[FunctionStats], list[Symbol]]:
    """Lines, functions and symbols of notebook cells named by their label (``cell N``)."""
    import dataclasses

    def name(f: str) -> str:
        return labels.get(f, f)

    return ([dataclasses.replace(x, filename=name(x.filename)) for x in lines],
            [dataclasses.replace(x, filename=name(x.filename)) for x in functions],
            [dataclasses.replace(x, filename=name(x.filename)) for x in symbols])


def _spark_at_cell_labels(result: ProfileResult) -> None:
    """Spark actions charged to a notebook cell name it as the lines do (``cell N``)."""
    import dataclasses

    ids = {unit.path: unit.id for unit in result.sources.values() if unit.path != unit.id}
    if not ids:
        return
    result.run.spark_executions = [
        dataclasses.replace(x, location=dataclasses.replace(x.location,
                                                            filename=ids[x.location.filename]))
        if x.location is not None and x.location.filename in ids else x
        for x in result.run.spark_executions]
