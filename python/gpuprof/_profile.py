"""profile(): the context manager that records a run. See README "Quick start"."""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import operator
import os
import platform
import signal
import socket
import sys
import threading
import warnings
from types import TracebackType
from typing import Any, TypeVar
from collections.abc import Iterable, Iterator

from ._flops import StepFlopCounter, TransformerArch, import_dynamo, import_off_thread

T = TypeVar("T")

_GPU_BACKENDS = ("auto", "nvml", "neuron", "mock", "none")
_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
_MAX_SAMPLE_HZ = 10000.0  # GPU sampler: a tick costs ~0.5 µs (docs/telemetry.md)
_MAX_HOST_HZ = 100.0      # host sampler: a /proc tick costs ~0.13-0.8 ms (docs/telemetry.md)

_active_lock = threading.Lock()
_active: Profile | None = None


class GpuprofWarning(RuntimeWarning):
    """A problem inside gpuprof. The training continues; the run records a diagnostic."""


def _warn(message: str) -> None:
    warnings.warn(message, GpuprofWarning, stacklevel=3)


def _is_numpy_bool(value: Any) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")


def _step_index(index: Any) -> int:
    """An int, or an integer-like object (numpy / torch integer scalar, a 0-d integer tensor:
    anything with __index__) as an int; bools of any kind are refused."""
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    is_bool = (isinstance(index, bool) or _is_numpy_bool(index)
               or str(getattr(index, "dtype", "")) in ("bool", "torch.bool"))
    if not is_bool and hasattr(type(index), "__index__"):
        try:
            return operator.index(index)
        except (TypeError, ValueError, RuntimeError):
            pass
    raise TypeError(f"Profile.step: index must be an int (or an integer scalar with "
                    f"__index__), got {type(index).__name__}")


def _check_positive(name: str, value: Any, allow_zero: bool = False,
                    maximum: float | None = None) -> float:
    """A finite number > 0 (>= 0 with allow_zero), at most ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"gpuprof.profile: {name} must be a number, got {type(value).__name__}")
    if isinstance(value, int) and abs(value) > 2**1000:  # beyond any float: no OverflowError
        raise ValueError(f"gpuprof.profile: {name} must be a finite number, got an int of "
                         f"{len(str(abs(value)))} digits")
    if not math.isfinite(value):
        raise ValueError(f"gpuprof.profile: {name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"gpuprof.profile: {name} must be {bound}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"gpuprof.profile: {name} must be <= {maximum:g}, got {value!r}")
    return float(value)


def _check_utf8(name: str, value: str) -> None:
    """The store keeps text as UTF-8: a str holding surrogate escapes (a file name's
    undecodable bytes, as os.fsdecode gives them) cannot be stored. NUL ends a C string: a
    path or name holding one would be cut there ("a\x00b.db" would write a file named "a")."""
    if "\x00" in value:
        raise ValueError(f"gpuprof.profile: {name} {value!r} contains a NUL character "
                         f"(at {value.index(chr(0))}); remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"gpuprof.profile: {name} {value!r} is not valid UTF-8 (character "
                         f"{e.start} is an undecodable byte or a lone surrogate); gpuprof "
                         f"stores it as UTF-8 text: use a name without such bytes") from None


def _check_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if _is_numpy_bool(value):
        return bool(value)  # numpy's bool (a flag read through numpy)
    raise TypeError(f"gpuprof.profile: {name} must be a bool, got "
                    f"{type(value).__name__} {value!r}")


# Step numbers are stored as signed 64-bit integers and may be moved past the index (a
# repeated index takes the next free number): 2**62 leaves room for that.
_MAX_STEP_INDEX = 2**62
# tokens_per_step goes to the native FLOP count as a signed 64-bit integer.
_MAX_TOKENS_PER_STEP = 2**62


def _error_text(exc: BaseException) -> str:
    """runs.error for the exception that ended a run: "Type: message" (or "Type"). Never
    raises: a message whose __str__ fails is named as such, as Python's traceback does."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - the user's exception must propagate unchanged
        message = "<exception str() failed>"
    return f"{name}: {message}" if message else name


def _storable_text(text: str) -> str:
    """`text` as UTF-8-storable text: surrogate escapes (bytes of a non-UTF-8 file name, as
    os.listdir returns them) become backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_value(v: Any) -> Any:
    """config_json is strict JSON: a non-finite float (never a validated option) is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return v


class Step:
    """One manual step: ``with prof.step(i) as s: with s.phase("forward"): ...``.

    ``index`` is the index given to ``prof.step()``. Every step block is stored as a step;
    the stored number is ``index`` when it is above the last stored step, else the next free
    number (see README "Manual API")."""

    __slots__ = ("_prof", "index", "_open")

    def __init__(self, prof: Profile, index: int) -> None:
        self._prof = prof
        self.index = index
        self._open = False

    def __enter__(self) -> Step:
        self._open = True
        self._prof._emit_kind("STEP_BEGIN", 0, self.index)
        self._prof._flop_step(True, self.index)
        self._prof._trace_step(True, self.index)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._open = False
        self._prof._flop_step(False, self.index, ok=exc[0] is None if exc else True)
        self._prof._trace_step(False, self.index)
        self._prof._emit_kind("STEP_END", 0, self.index)
        if self._prof._coordinator is not None:
            self._prof._coordinate()

    def phase(self, name: str) -> _Phase:
        """Times a named phase of this step (forward, backward, optimizer or any name)."""
        if not isinstance(name, str) or not name:
            raise ValueError("Step.phase: name must be a non-empty string")
        return _Phase(self, name, self._prof._phase_id(name))


class _Phase:
    __slots__ = ("_step", "_name", "_id", "_live")

    def __init__(self, step: Step, name: str, phase_id: int) -> None:
        self._step = step
        self._name = name
        self._id = phase_id
        self._live = False

    def __enter__(self) -> _Phase:
        if not self._step._open:  # no step to attribute it to: say so, record nothing
            self._step._prof._stray_phase(self._name, self._step.index)
            return self
        self._live = True
        self._step._prof._phase_edge(self._id, True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live:
            self._live = False
            self._step._prof._phase_edge(self._id, False)


def _import_torch() -> Any:
    """torch, imported for auto mode when the program has not imported it yet; None when it
    is not installed. Imported off this thread (_flops.import_off_thread): what the import
    keeps must not hold the Profile and the frame of the user's code that entered profile(),
    with its locals, for the life of the process. If that thread cannot import it, this one
    tries."""
    torch = import_off_thread("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return None
    return torch


class _WrappedLoader(Iterable[T]):
    """Iterates like the wrapped loader; time spent in next() is the step's explicit wait."""

    def __init__(self, prof: Profile, iterable: Iterable[T]) -> None:
        self._prof = prof
        self._iterable = iterable

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterable, name)

    def __iter__(self) -> Iterator[T]:
        prof = self._prof
        prof._wait_edge(True)
        try:
            it = iter(self._iterable)  # a torch DataLoader starts its workers here
        finally:
            prof._wait_edge(False)
        return _WrappedIterator(prof, it)


class _WrappedIterator(Iterator[T]):
    """The wrapped loader's iterator: a next() that raises (a bad batch the loop skips)
    leaves it usable, as the loader's own iterator is; a generator would end there."""

    def __init__(self, prof: Profile, it: Iterator[T]) -> None:
        self._prof = prof
        self._it = it

    def __iter__(self) -> _WrappedIterator[T]:
        return self

    def __next__(self) -> T:
        prof = self._prof
        prof._wait_edge(True)
        try:
            return next(self._it)
        finally:
            prof._wait_edge(False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


class Profile:
    """A profiled run. Use through :func:`profile`."""

    def __init__(self, run_name: str, options: dict[str, Any], auto: bool, print_summary: bool,
                 cuda_events: bool) -> None:
        self.run_name = run_name
        self._options = options
        self._auto = auto
        self._print_summary = print_summary
        self._cuda_events = cuda_events
        self._session: Any = None
        self._native: Any = None
        self._kinds: dict[str, int] = {}
        self._phase_ids: dict[str, int] = {}
        self._patches: Any = None
        self._timer: Any = None
        self._flop_counter: StepFlopCounter | None = None
        self._state = "new"
        self._final_stats: dict[str, int] = {}
        self._stray_phases = 0
        self._prev_sigterm: Any = None
        self._pid = os.getpid()  # a forked child (dataloader worker) must not end the run
        self.summary: str | None = None
        self.run_id: int | None = None
        # profile(dashboard=...): the port to serve on (0 = a free one), None = no dashboard.
        self._dashboard_port: int | None = None
        self._coordinator: Any = None  # _distributed.Coordinator on a distributed rank
        self._coordinator_hook: Any = None  # its optimizer-step hook until it has run
        self._ddp: Any = None  # _distributed.DdpTiming in auto mode
        self._comm_hook = True  # profile(comm_hook=)
        self._wandb = False  # profile(wandb=): log the run into the active wandb.run at stop
        self._webhook: str | None = None  # profile(webhook=): a message when the run ends
        self._excluding = 0  # evaluations open (_exclude_edge)
        # The dashboard's login URL (single-use token) once it serves; None without one.
        self.dashboard_url: str | None = None
        # Kernel traces: the step count, the CPU-operator capture (CPU run), NVTX ranges.
        self._steps: Any = None  # _traces.StepCounter once torch is there
        self._steps_hook: Any = None
        self._cpu_ops: Any = None
        self._nsys: Any = None
        self._torch: Any = None

    # ---- lifecycle -----------------------------------------------------------------------
    @property
    def db_path(self) -> str:
        return str(self._options["db_path"])

    @property
    def active(self) -> bool:
        """True while the run is recording (False when profiling could not start)."""
        return self._session is not None and self._state == "running"

    def __enter__(self) -> Profile:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.stop()  # sys.exit(0) / sys.exit() is a normal completion
        else:
            self.stop(error=_error_text(exc))
        # Never swallow the user's exception.

    def start(self) -> Profile:
        global _active
        if self._state != "new":
            raise RuntimeError("gpuprof: this profile was already started; create a new one")
        self._state = "running"
        self._pid = os.getpid()
        with _active_lock:
            other = _active
            if other is None:
                _active = self
        if other is not None:
            self._state = "disabled"
            _warn(f"gpuprof: a profile ({other.run_name!r}) is already active in this "
                  f"process; {self.run_name!r} will not be recorded")
            return self
        # Whatever interrupts the start (Ctrl-C, a GpuprofWarning turned into an error by
        # -W error or pytest's filterwarnings) leaves nothing behind: the active marker, the
        # patches, the handler and the run are undone, then it propagates.
        try:
            self._start()
        except BaseException as e:
            self._abort_start(e)
            raise
        return self

    def _start(self) -> None:
        try:
            from . import _native
        except ImportError as e:
            self._disable(f"gpuprof's native core failed to import ({e}); reinstall gpuprof")
            return
        self._native = _native
        self._kinds = {k: getattr(_native.kind, k) for k in dir(_native.kind) if k.isupper()}
        torch = sys.modules.get("torch")
        if torch is None and self._auto:
            torch = _import_torch()
        opts = dict(self._options)
        env = _environment(torch)
        if opts.get("group_id") is not None:
            env.pop("group_id", None)  # an explicit group= wins over $TORCHELASTIC_RUN_ID
        opts.update(env)
        distributed, notes = self._distributed_options(opts, torch)
        self._trace_backend(opts, torch)
        try:
            self._session = _native.Session(opts)
        except Exception as e:  # a profiler failure never breaks the training
            self._disable(f"gpuprof could not start recording: {e}")
            return
        self.run_id = self._session.run_id
        for note in notes:
            self._session.add_diagnostic("warning", "distributed", note)
        if distributed:
            self._start_coordinator(torch, opts)
        if self._dashboard_port is not None:
            self._start_dashboard(_native)
        self._start_traces(torch, opts)
        if self._auto:
            if torch is None:
                self._session.add_diagnostic(
                    "warning", "auto", "auto=True but torch is not importable: no steps recorded; "
                    "use profile(..., auto=False) with prof.step()")
                _warn("gpuprof: torch is not installed, auto-instrumentation is off; use the "
                      "manual API (auto=False, prof.step(i))")
            else:
                self._install_torch(torch)
        self._install_sigterm()

    def _trace_backend(self, opts: dict[str, Any], torch: Any) -> None:
        """How traced steps are captured: kernels through CUPTI on a CUDA process, else the
        CPU operators (torch.profiler) of the traced steps."""
        if not self._tracing():
            return
        try:
            cuda = torch is not None and torch.cuda.is_available()
        except Exception:
            cuda = False
        if not cuda:
            opts["trace_backend"] = "cpu_ops" if torch is not None else ""
            return
        opts["trace_backend"] = "cupti"
        try:
            from linescope._sampling import _cupti
            ok, library = _cupti()
            if ok and library:
                opts["cupti_library"] = library
        except Exception:  # the native tracer tries its default libraries
            pass

    def _tracing(self) -> bool:
        o = self._options
        return bool(o.get("trace_every_n_steps") or o.get("trace_range_begin") is not None
                    or o.get("continuous_traces_hz"))

    def _start_traces(self, torch: Any, opts: dict[str, Any]) -> None:
        """The step count (auto: an optimizer post-hook) and, on a CPU run with a trace mode,
        the CPU-operator capture of the traced steps."""
        if torch is None:
            return
        self._torch = torch
        if not self._tracing():
            try:  # on CUDA the count also names nsys_capture()'s NVTX step ranges
                if not torch.cuda.is_available():
                    return  # nothing needs it: no hook of ours on the optimizers
            except Exception:
                return
        from ._traces import CpuOpCapture, StepCounter
        self._steps = StepCounter()
        try:
            if self._auto:
                from torch.optim.optimizer import register_optimizer_step_post_hook
                self._steps_hook = register_optimizer_step_post_hook(self._steps.optimizer_post)
            if opts.get("trace_backend") == "cpu_ops":
                self._cpu_ops = CpuOpCapture(self._session, torch, self._steps)
                self._steps.listeners.append(self._cpu_ops.on_step)
                self._session.set_telemetry_status(
                    "cpu_ops", True, "torch_profiler (" + self._session.trace_plan() + ")")
                if self._auto:
                    self._cpu_ops.on_step(None, 0)
        except Exception as e:  # a profiler failure never breaks the training
            self._session.add_diagnostic("warning", "kernels", f"trace set-up failed: {e!r}")

    def _trace_step(self, begin: bool, index: int) -> None:
        """prof.step() edges for the step count (traced steps, NVTX step ranges)."""
        steps = self._steps
        if steps is None or self._state != "running":
            return
        try:
            if begin:
                steps.manual_begin(index)
            else:
                steps.manual_end()
        except Exception as e:  # pragma: no cover - the listeners catch their own failures
            _warn(f"gpuprof: kernel trace step edge failed: {e!r}")

    def _finish_traces(self) -> None:
        hook, self._steps_hook = self._steps_hook, None
        if hook is not None:
            try:
                hook.remove()
            except Exception:
                pass
        if self._nsys is not None:
            self._nsys.close()
        ops, self._cpu_ops = self._cpu_ops, None
        if ops is not None:
            ops.finish()
            if ops.steps == 0 and not ops.failed:
                self._session.add_diagnostic(
                    "info", "kernels", "no traced step ran (" + self._session.trace_plan() +
                    "): no CPU operators recorded")
        if self._tracing():
            torch = self._torch
            try:
                if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()  # the last traced kernels are delivered
            except Exception:
                pass

    @contextlib.contextmanager
    def nsys_capture(self) -> Iterator[None]:
        """Marks a region for Nsight Systems: cudaProfilerStart/Stop around the block (for
        ``nsys profile --capture-range=cudaProfilerApi``) and NVTX ranges naming gpuprof's
        steps ("gpuprof step <i>") and phases ("gpuprof forward", ...), which ``gpuprof
        nsys-import`` uses to attach the kernels to this run's steps. Without CUDA it records
        a diagnostic and runs the block unchanged."""
        torch = self._torch
        ready = self._state == "running" and torch is not None
        cuda = False
        if ready:
            try:
                cuda = bool(torch.cuda.is_available())
            except Exception:
                cuda = False
        if not ready or not cuda or self._steps is None:
            if self._session is not None and self._state == "running":
                self._session.add_diagnostic(
                    "info", "kernels", "nsys_capture(): " + (
                        "no CUDA device: no profiler range or NVTX marks" if ready
                        else "torch is not imported: no profiler range or NVTX marks"))
            yield
            return
        from ._traces import NsysRanges
        ranges = self._nsys
        if ranges is None:
            ranges = self._nsys = NsysRanges(torch)
            self._steps.listeners.append(ranges.on_step)
        started = False
        try:
            torch.cuda.profiler.start()
            started = True
            ranges.active = True
            if self._steps.step is not None:
                ranges.on_step(None, self._steps.step)
        except Exception as e:  # never break the training for a capture mark
            self._session.add_diagnostic("warning", "kernels", f"nsys_capture() start: {e!r}")
        try:
            yield
        finally:
            try:
                ranges.close()
                if started:
                    torch.cuda.profiler.stop()
            except Exception as e:
                self._session.add_diagnostic("warning", "kernels",
                                             f"nsys_capture() stop: {e!r}")

    def _distributed_options(self, opts: dict[str, Any], torch: Any) -> tuple[bool, list[str]]:
        """The rank environment into opts (runs.rank / world_size, config_json "distributed")
        and, under torchrun with no group yet, a group id agreed through torchrun's store.
        Returns (whether this is a rank of a multi-process job, problems to note)."""
        from . import _distributed as d
        env = d.rank_environment()
        try:
            initialized = (torch is not None and torch.distributed.is_available()
                           and torch.distributed.is_initialized())
        except Exception:
            initialized = False
        if env.get("world_size", 1) < 2 and not initialized:
            return False, []
        notes: list[str] = []
        if opts.get("group_id") is not None:
            env["group_source"] = ("group=" if self._options.get("group_id") is not None
                                   else "torchrun rendezvous id")
        elif not initialized:
            group, problem = d.agree_group_through_launcher(self.run_name)
            if problem:
                notes.append(problem)
            if group is not None:
                opts["group_id"] = group
                env["group_source"] = "agreed through torchrun's store"
        if env.get("local_world_size", 1) > 1 and os.getppid() > 1:
            # The launcher (torchrun's agent) started this host's ranks: its other children
            # are the job's other ranks, whose CPU the host sampler reads apart (job_cpu_pct).
            opts["job_parent_pid"] = os.getppid()
        config = json.loads(opts["config_json"])
        config["distributed"] = env
        opts["config_json"] = json.dumps(config, sort_keys=True, allow_nan=False)
        return True, notes

    def _start_coordinator(self, torch: Any, opts: dict[str, Any]) -> None:
        """Group id (when none yet) and clock alignment once torch.distributed is up: now,
        or after the first optimizer step (prof.step() block) that finds it initialised."""
        from . import _distributed as d
        try:
            self._coordinator = d.Coordinator(self._session, torch, self.run_name,
                                              json.loads(opts["config_json"]),
                                              need_group=opts.get("group_id") is None)
            if self._coordinator.try_now() or torch is None or not self._auto:
                return
            from torch.optim.optimizer import register_optimizer_step_post_hook
            self._coordinator_hook = register_optimizer_step_post_hook(
                lambda *_: self._coordinate())
        except Exception as e:  # a profiler failure never breaks the training
            self._session.add_diagnostic("warning", "distributed",
                                         f"distributed set-up failed: {e!r}")

    def _coordinate(self) -> None:
        """After a step, on the training thread: the deferred group id / clock alignment."""
        c = self._coordinator
        if c is None or c.done or self._state != "running" or os.getpid() != self._pid:
            return
        # The optimizer hook stays registered (a no-op once done) until stop(): removing it
        # from inside torch's loop over the hooks would break that loop.
        c.try_now()

    def _finish_coordinator(self) -> None:
        hook, self._coordinator_hook = self._coordinator_hook, None
        if hook is not None:
            try:
                hook.remove()
            except Exception:
                pass
        c = self._coordinator
        if c is not None and not c.done and self._session is not None:
            self._session.add_diagnostic(
                "info", "distributed", "torch.distributed was never initialised during the "
                "run: no group id agreed (pass group= or torchrun --rdzv-id) and clocks not "
                "aligned")

    def _start_dashboard(self, native: Any) -> None:
        """The in-process dashboard: a native server thread over this run's file, reachable
        until the process exits. A failure is a warning; the training goes on."""
        if not native.HAS_SERVER:
            self._session.add_diagnostic("warning", "dashboard",
                                         f"dashboard not started: {_NO_SERVER}")
            _warn(f"gpuprof: the dashboard could not start: {_NO_SERVER}")
            return
        try:
            board = native.Dashboard(self.db_path, self.run_id,
                                     self._dashboard_port, os.environ.get("GPUPROF_WEB_DIR"))
        except Exception as e:  # a profiler failure never breaks the training
            self._session.add_diagnostic("warning", "dashboard", f"dashboard not started: {e}")
            _warn(f"gpuprof: the dashboard could not start: {e}")
            return
        _keep_dashboard(board)
        self.dashboard_url = board.url
        print(f"gpuprof dashboard: {board.url}", flush=True)

    def _abort_start(self, exc: BaseException) -> None:
        """Undoes a start that `exc` interrupted. Never raises: `exc` is what propagates. The
        run, when it was begun, is stored as failed with the interruption as its error."""
        global _active
        self._state = "disabled"
        try:
            self._restore_sigterm()
            counter, self._flop_counter = self._flop_counter, None
            if counter is not None:
                counter.finish()
            patches, self._patches = self._patches, None
            if patches is not None:
                patches.uninstall()
            self._finish_coordinator()
            hook, self._steps_hook = self._steps_hook, None
            if hook is not None:
                hook.remove()
            ops, self._cpu_ops = self._cpu_ops, None
            if ops is not None:
                ops.abandon()
            ddp, self._ddp = self._ddp, None
            if ddp is not None:
                ddp.uninstall()
            session, self._session = self._session, None
            if session is not None:
                session.stop("failed", _storable_text(
                    f"profile() start interrupted: {_error_text(exc)}"))
        except BaseException:  # noqa: BLE001 - a second interruption must not hide the first
            pass
        finally:
            with _active_lock:
                if _active is self:
                    _active = None

    def _install_sigterm(self) -> None:
        """With the default SIGTERM action (terminate), a SIGTERM first ends the run (status
        failed, error "terminated by SIGTERM"), then terminates the process as before. A
        handler the program installed itself is left alone: it decides what SIGTERM does."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
                self._prev_sigterm = signal.SIG_DFL
        except (ValueError, OSError) as e:  # embedded interpreters, restricted environments
            self._session.add_diagnostic("info", "signals", f"SIGTERM handler not installed: {e}")

    def _restore_sigterm(self) -> None:
        prev, self._prev_sigterm = self._prev_sigterm, None
        if prev is None:
            return
        try:
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, prev)
        except (ValueError, OSError):  # stop() on another thread: leave the handler; it is inert
            pass

    def _install_torch(self, torch: Any) -> None:
        from ._torch_patch import TorchPatches
        try:
            self._describe_cuda(torch)
        except Exception as e:  # descriptive only; never fatal
            self._session.add_diagnostic("warning", "device", f"reading the CUDA device: {e!r}")
        try:
            if self._cuda_events and torch.cuda.is_available():
                from ._cuda_timing import CudaPhaseTimer
                self._timer = CudaPhaseTimer(self._session, self._kinds["GPU_PHASE"], torch)
                self._session.set_telemetry_status("cuda_events", True, "torch.cuda.Event")
            else:
                reason = ("CUDA not available: phase times are CPU wall time"
                          if self._cuda_events else "cuda_events=False")
                self._session.set_telemetry_status("cuda_events", False, None, reason)
            # Without arch= or flops_per_step= one step's FLOPs are counted (below): the
            # loader hooks tell the count where loader work (a collate_fn's module) runs.
            # (The counter holds no reference to this Profile: no cycle through the hooks.)
            counter: StepFlopCounter | None = None
            if self._options.get("flops_method") is None:
                session = self._session
                counter = StepFlopCounter(lambda: int(session.stats()["optimizer_calls"]),
                                          lambda: int(session.stats()["forward_calls"]))
            edge = counter.loader_edge if counter is not None else None
            import_dynamo()  # before the patches, which it must not record (see there)
            edges = self._timer
            if torch.cuda.is_available():  # phase edges also mark nsys_capture()'s NVTX ranges
                from ._traces import NsysRanges, PhaseEdges
                self._nsys = NsysRanges(torch)
                if self._steps is not None:
                    self._steps.listeners.append(self._nsys.on_step)
                edges = PhaseEdges(self._timer, self._nsys)
            cpu_ops = self._cpu_ops if edges is None else None  # a CPU run tracing operators
            if cpu_ops is not None:
                from ._traces import CpuOpEdges
                edges = CpuOpEdges(cpu_ops, edge)
                edge = edges.loader_edge
            self._patches = TorchPatches(self._session, self._kinds, edges, edge)
            self._patches.install(torch)
            if cpu_ops is not None:  # its step edges wait for these hooks, not a pre-hook
                cpu_ops.edges_installed = True
            self._install_ddp_timing(torch)
        except Exception as e:
            self._session.add_diagnostic("error", "auto", f"auto-instrumentation failed: {e!r}")
            _warn(f"gpuprof: auto-instrumentation failed ({e!r}); recording telemetry only")
            if self._patches is not None:
                self._patches.uninstall()
                self._patches = None
            return
        if counter is not None:  # neither arch= nor flops_per_step=
            try:
                counter.install()
                self._flop_counter = counter
            except Exception as e:
                counter.finish()
                self._session.add_diagnostic(
                    "error", "flops", f"automatic FLOP count failed: installing its optimizer "
                    f"hooks raised {e!r}")

    def _install_ddp_timing(self, torch: Any) -> None:
        """Per-bucket timing of DDP's gradient collectives (a failure is a diagnostic)."""
        try:
            if not self._comm_hook or not torch.distributed.is_available():
                return
            from ._distributed import DdpTiming
            self._ddp = DdpTiming(self._session, torch)
            self._ddp.install()
        except Exception as e:
            self._session.add_diagnostic("warning", "comm", f"DDP comm timing not installed: "
                                         f"{e!r}")

    def _loader_edge(self, kind: int, begin: bool, ts: int) -> None:
        """The outermost DataLoader iter()/next() on the training thread begins or ends."""
        counter = self._flop_counter
        if counter is not None:
            counter.loader_edge(kind, begin, ts)

    def _describe_cuda(self, torch: Any) -> None:
        """A CUDA process trains on one device (one rank per GPU): gpu_count is 1 and the model
        is that device's, also when NVML is unavailable. NVML still samples every GPU."""
        if not torch.cuda.is_available():
            return
        info = self._session.info()
        model = info.get("gpu_model") or torch.cuda.get_device_name(torch.cuda.current_device())
        self._session.update_run(gpu_model=model, gpu_count=1)

    def stop(self, error: str | None = None) -> str | None:
        """Ends the run (``error`` marks it failed) and returns the summary text."""
        global _active
        if self._state != "running":
            return self.summary
        if os.getpid() != self._pid:
            self._leave_forked_child()
            return None
        if error is not None:
            error = _storable_text(str(error))
        while self._excluding:  # an evaluation still open (an exception inside it)
            self._exclude_edge(False)
        self._state = "stopped"
        self._restore_sigterm()
        try:
            if self._session is None:
                return None
            problems = []
            self._finish_flop_count()
            self._finish_coordinator()
            self._finish_traces()
            if self._ddp is not None:
                self._ddp.uninstall()
                self._ddp = None
            if self._patches is not None:
                problems += self._patches.uninstall()
                self._patches = None
            if self._timer is not None:
                try:
                    self._timer.finish()
                except Exception as e:
                    problems.append(f"resolving CUDA events failed: {e!r}")
            for p in problems:
                self._session.add_diagnostic("warning", "auto", p)
            foreign = int(self._session.stats().get("foreign_thread_calls", 0))
            if foreign:
                self._session.add_diagnostic(
                    "warning", "threads",
                    f"{foreign} model, backward, optimizer or DataLoader calls ran on other "
                    "threads than the one that entered profile() and were not recorded: only "
                    "that thread is instrumented (enter profile() on the training thread)")
            if self._stray_phases > 1:
                self._session.add_diagnostic(
                    "warning", "steps", f"{self._stray_phases} s.phase() blocks ran outside "
                    "their step and were not recorded")
            summary, err = self._session.stop("failed" if error else "ok", error)
            try:
                self._final_stats = dict(self._session.stats())
            except Exception:
                pass
            push_problem = self._session.push_warning()
            if push_problem:
                _warn(f"gpuprof: {push_problem}")
            self.summary = summary or None
            if err:
                _warn(f"gpuprof: problems while finishing run {self.run_id}: {err}")
            if self._print_summary and self.summary:
                print(self.summary, flush=True)
            if self._wandb and self.run_id is not None:
                from ._wandb import log_run
                log_run(self.db_path, self.run_id)
            if self._webhook and self.run_id is not None:
                from . import _native
                link = self._session.push_run_url()
                problem = _native.send_webhook(self.db_path, self.run_id, self._webhook, link)
                if problem:
                    _warn(f"gpuprof: {problem}")
            return self.summary
        except Exception as e:  # never raise into the user's code on the way out
            _warn(f"gpuprof: stopping the run failed: {e!r}")
            return None
        finally:
            with _active_lock:
                if _active is self:
                    _active = None

    def _leave_forked_child(self) -> None:
        """stop() in a forked child (a process that saves a checkpoint, then leaves the block):
        the run belongs to the parent, which goes on recording it. The child restores torch for
        itself and lets go, touching nothing of the run: its native session is inert there (no
        threads, no writes, never closed)."""
        global _active
        self._state = "stopped"
        self._prev_sigterm = None  # the child has the default SIGTERM action (register_at_fork)
        counter, self._flop_counter = self._flop_counter, None
        patches, self._patches = self._patches, None
        self._timer = None  # CUDA cannot be used in a forked child
        self._coordinator = self._coordinator_hook = None
        cpu_ops, self._cpu_ops = self._cpu_ops, None  # the parent's torch.profiler state
        self._nsys = None  # and NVTX ranges
        steps_hook, self._steps_hook = self._steps_hook, None
        if self._ddp is not None:
            from . import _distributed
            _distributed._sink.session = _distributed._sink.cuda = None
            self._ddp = None
        try:
            if counter is not None:
                counter.finish()
            if patches is not None:
                patches.uninstall()
            if steps_hook is not None:
                steps_hook.remove()
            if cpu_ops is not None:
                cpu_ops.forget()
        except Exception:  # noqa: BLE001 - never raise into the child's code
            pass
        if _active is self:  # the child has one thread, and a fresh _active_lock (_after_fork)
            _active = None

    def _finish_flop_count(self) -> None:
        """Ends the automatic FLOP count (restoring torch) and records its outcome: runs.
        flops_per_step with flops_method "counted", or a diagnostic (source "flops") that the
        MFU line quotes as the reason MFU is unknown."""
        counter, self._flop_counter = self._flop_counter, None
        if counter is None:
            return
        try:
            counter.finish()
            if counter.flops is not None:
                self._session.update_run(flops_per_step=float(counter.flops),
                                         flops_method="counted")
                self._session.add_diagnostic(
                    "info", "flops", f"FLOPs per step counted with FlopCounterMode over "
                    f"{counter.counted_window}: {counter.flops:.4g}")
            elif counter.problem is not None:
                self._session.add_diagnostic("warning" if counter.failed else "info", "flops",
                                             counter.problem)
                if counter.failed:
                    _warn(f"gpuprof: {counter.problem}; MFU is unknown for this run")
        except Exception as e:  # never raise on the way out
            _warn(f"gpuprof: recording the FLOP count failed: {e!r}")

    def _disable(self, reason: str) -> None:
        global _active
        self._session = None
        with _active_lock:
            if _active is self:
                _active = None
        _warn(reason)  # last: a warning turned into an error leaves nothing behind

    def stats(self) -> dict[str, int]:
        """Counters of the recorder (hook calls, dropped events, telemetry ticks, steps)."""
        if self._session is None:
            return dict(self._final_stats)
        return dict(self._session.stats())

    # ---- manual API ------------------------------------------------------------------------
    def step(self, index: int | None = None) -> Step:
        """Brackets one training step: ``with prof.step(i) as s:``."""
        if index is None:
            index = getattr(self, "_next_step", 0)
        else:
            index = _step_index(index)
            if index > _MAX_STEP_INDEX:
                raise ValueError(f"Profile.step: index must be at most 2**62, got {index}")
        if index < 0:
            raise ValueError(f"Profile.step: index must be >= 0, got {index}")
        self._next_step = index + 1
        return Step(self, index)

    def wrap_dataloader(self, iterable: Iterable[T]) -> Iterable[T]:
        """Returns an iterable over ``iterable`` whose next() time is recorded as dataloader
        wait of the step that consumes the item."""
        return _WrappedLoader(self, iterable)

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Keeps the block out of the training steps: ``with prof.evaluation(): validate()``.
        Its forwards, loader waits and time belong to no step (the next step starts after
        it) and are reported apart (diagnostic source "evaluation"); the automatic FLOP count
        leaves it out. Blocks may nest. The trainer callbacks use it for validation loops."""
        self._exclude_edge(True)
        try:
            yield
        finally:
            self._exclude_edge(False)

    def _exclude_edge(self, begin: bool) -> None:
        """One edge of an evaluation (prof.evaluation(), the trainer integrations). An end
        without an open evaluation is ignored; stop() ends the ones still open."""
        if self._session is None or self._state != "running":
            return
        if not begin:
            if self._excluding == 0:
                return
            self._excluding -= 1
        else:
            self._excluding += 1
        self._emit_kind("EXCLUDE_BEGIN" if begin else "EXCLUDE_END")
        counter = self._flop_counter
        if counter is not None and begin:
            counter.exclude_begin()
        if self._cpu_ops is not None:
            self._cpu_ops.exclude(begin)

    # ---- internals --------------------------------------------------------------------------
    def _wait_edge(self, begin: bool) -> None:
        """wrap_dataloader's wait: shares the native loader depth with the DataLoader hooks."""
        s = self._session
        if s is not None and self._state == "running":
            outermost = s.wait_begin() if begin else s.wait_end()
            if outermost:
                self._loader_edge(0, begin, 0)  # the FLOP count leaves the loader's work out

    def _emit_kind(self, kind: str, arg: int = 0, value: int = 0) -> None:
        s = self._session
        if s is not None and self._state == "running":
            s.emit(self._kinds[kind], arg, value)

    def _flop_step(self, begin: bool, index: int, ok: bool = True) -> None:
        """Tells the automatic FLOP count about a prof.step() edge: with prof.step() the
        counted window is one step block (StepFlopCounter, step mode)."""
        counter = self._flop_counter
        if counter is None or self._state != "running":
            return
        try:
            if begin:
                counter.step_begin(index)
            else:
                counter.step_end(ok)
        except Exception as e:  # pragma: no cover - the counter catches its own failures
            _warn(f"gpuprof: automatic FLOP count failed at a step edge: {e!r}")

    def _phase_id(self, name: str) -> int:
        pid = self._phase_ids.get(name)
        if pid is None:
            pid = self._session.intern_phase(name) if self._session is not None else 0
            self._phase_ids[name] = pid
        return pid

    def _stray_phase(self, name: str, index: int) -> None:
        """A phase entered while its step is not open (after ``with prof.step()`` closed, or
        before it was entered): nothing to attribute it to. Warns and records it once."""
        if self._session is None or self._state != "running":
            return
        self._stray_phases += 1
        if self._stray_phases > 1:
            return
        message = (f"s.phase({name!r}) of prof.step({index}) was entered outside that step's "
                   "`with` block; the phase is not recorded (open phases inside "
                   "`with prof.step(i) as s:`)")
        try:
            self._session.add_diagnostic("warning", "steps", message)
        except Exception:
            pass
        warnings.warn(f"gpuprof: {message}", GpuprofWarning, stacklevel=3)

    def _phase_edge(self, phase_id: int, begin: bool) -> None:
        s = self._session
        if s is None or self._state != "running":
            return
        ts = self._native.monotonic_ns()
        s.emit_at(ts, self._kinds["PHASE_BEGIN" if begin else "PHASE_END"], phase_id, 0)
        if self._timer is not None:
            self._timer.edge(phase_id, begin, ts)
        nsys = self._nsys
        if nsys is not None and nsys.active:
            name = next((n for n, i in self._phase_ids.items() if i == phase_id), str(phase_id))
            nsys.phase(1000 + phase_id, name, begin)


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM with the default action: end the active run, then terminate as SIG_DFL does
    (same signal, same exit status)."""
    prof = _active
    if prof is not None and prof._pid == os.getpid():
        prof.stop(error="terminated by SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) keeps the default SIGTERM action: it is not the
    process that owns the run. It gets its own _active_lock: another thread of the parent may
    have held the inherited one at fork, and would never release it here."""
    global _active_lock
    _active_lock = threading.Lock()
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _finish_at_exit() -> None:
    """A run started with Profile.start() and never stopped ends with the interpreter: ok, or
    failed when an uncaught exception ended the program."""
    prof = _active
    if prof is None or prof._state != "running" or prof._pid != os.getpid():
        return
    exc = getattr(sys, "last_value", None)
    if exc is not None and not isinstance(exc, SystemExit):
        prof.stop(error=_error_text(exc))
    else:
        prof.stop()
    prof._session = None  # release the native session before the interpreter tears down


def _environment(torch: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "hostname": _storable_text(socket.gethostname()),
        "python_version": platform.python_version(),
    }
    if torch is not None:
        env["torch_version"] = str(getattr(torch, "__version__", "unknown"))
        try:
            env["device_kind"] = "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:
            env["device_kind"] = "unknown"
    from ._distributed import rank_environment, rendezvous_group
    launcher = rank_environment()
    env.update((k, launcher[k]) for k in ("rank", "world_size") if k in launcher)
    run_id = rendezvous_group()
    if run_id is not None:
        # Undecodable bytes (surrogate escapes) are stored as backslash escapes: every rank
        # reads the same variable, so the ranks still share one group.
        env["group_id"] = _storable_text(run_id)
    return env


def _arch_flops(arch: TransformerArch | None, tokens_per_step: int | None,
                flops_per_step: float | None) -> dict[str, Any] | None:
    """Checks arch= / tokens_per_step= and returns the native FLOP count for them (None
    without an arch, or when the native core is missing: profile() then reports that)."""
    if arch is not None and not isinstance(arch, TransformerArch):
        raise TypeError("gpuprof.profile: arch must be a gpuprof.TransformerArch, got "
                        f"{type(arch).__name__}")
    if tokens_per_step is not None and (isinstance(tokens_per_step, bool)
                                        or not isinstance(tokens_per_step, int)):
        raise TypeError("gpuprof.profile: tokens_per_step must be an int, got "
                        f"{type(tokens_per_step).__name__}")
    if tokens_per_step is not None and tokens_per_step <= 0:
        raise ValueError(f"gpuprof.profile: tokens_per_step must be > 0, got {tokens_per_step}")
    if tokens_per_step is not None and tokens_per_step > _MAX_TOKENS_PER_STEP:
        raise ValueError(f"gpuprof.profile: tokens_per_step must be at most 2**62, got "
                         f"{tokens_per_step}")
    if arch is None:
        if tokens_per_step is not None:
            raise ValueError("gpuprof.profile: tokens_per_step only applies with arch=")
        return None
    if flops_per_step is not None:
        raise ValueError("gpuprof.profile: pass either arch= or flops_per_step=, not both "
                         "(arch= computes the FLOPs per step)")
    if tokens_per_step is None:
        raise ValueError("gpuprof.profile: arch= needs tokens_per_step= (tokens this process "
                         "trains on per optimizer step: batch size × seq_len × accumulated "
                         "micro-batches)")
    try:
        from . import _native
    except ImportError:
        return None
    try:
        return dict(_native.transformer_flops(arch.as_dict(), tokens_per_step))
    except ValueError as e:
        raise ValueError(f"gpuprof.profile: arch: {e}") from None


def _trace_options(every_n: Any, trace_range: Any, hz: Any) -> dict[str, Any]:
    """Checks the kernel-trace arguments; returns the native session's trace options."""
    out: dict[str, Any] = {}
    if every_n is not None:
        if isinstance(every_n, bool) or not isinstance(every_n, int):
            raise TypeError(f"gpuprof.profile: trace_every_n_steps must be an int >= 1, got "
                            f"{type(every_n).__name__} {every_n!r}")
        if every_n < 1 or every_n > _MAX_STEP_INDEX:
            raise ValueError(f"gpuprof.profile: trace_every_n_steps must be >= 1, got {every_n}")
        out["trace_every_n_steps"] = every_n
    if trace_range is not None:
        ok = isinstance(trace_range, (tuple, list)) and len(trace_range) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in trace_range)
        if not ok:
            raise TypeError(f"gpuprof.profile: trace_range must be a pair of ints (first step, "
                            f"step after the last), got {trace_range!r}")
        a, b = trace_range
        if a < 0 or b <= a or b > _MAX_STEP_INDEX:
            raise ValueError(f"gpuprof.profile: trace_range=(a, b) traces steps a..b-1 and "
                             f"needs 0 <= a < b, got {tuple(trace_range)!r}")
        out["trace_range_begin"], out["trace_range_end"] = a, b
    if hz is not None:
        out["continuous_traces_hz"] = _check_positive("continuous_traces_hz", hz, maximum=100.0)
    if out:
        try:
            from . import _native
        except ImportError:
            return out
        try:
            _native.check_trace_options(out)
        except ValueError as e:
            raise ValueError(f"gpuprof.profile: {e}") from None
    return out


def _server_options(server: str | None, api_key: str | None) -> dict[str, Any]:
    """The live-push options: from the arguments, else $GPUPROF_SERVER / $GPUPROF_API_KEY."""
    explicit = server is not None
    if server is None:
        server = os.environ.get("GPUPROF_SERVER") or None
    if server is None:
        if api_key is not None:
            raise ValueError("gpuprof.profile: api_key= was given without server= (or "
                             "$GPUPROF_SERVER)")
        return {}
    if api_key is None:
        api_key = os.environ.get("GPUPROF_API_KEY") or None
    where = "server=" if explicit else "$GPUPROF_SERVER"
    if not isinstance(server, str):
        raise TypeError(f"gpuprof.profile: server must be a string like 'http://host:8000', got "
                        f"{type(server).__name__} {server!r}")
    if not server.startswith("http://") or len(server) <= len("http://"):
        message = (f"gpuprof.profile: {where} must be http://HOST[:PORT] (https is not "
                   f"supported yet), got {server!r}")
        if explicit:
            raise ValueError(message)
        _warn(message + "; the run is not pushed")
        return {}
    if api_key is not None and not isinstance(api_key, str):
        raise TypeError("gpuprof.profile: api_key must be a string")
    if not api_key:
        message = (f"gpuprof.profile: {where} is set but no write key: pass api_key= or set "
                   f"$GPUPROF_API_KEY")
        if explicit:
            raise ValueError(message)
        _warn(message + "; the run is not pushed")
        return {}
    _check_utf8("server", server)
    _check_utf8("api_key", api_key)
    from . import _native
    if not _native.HAS_SERVER:
        _warn(f"gpuprof.profile: {where} is set but {_NO_SERVER}; the run is not pushed")
        return {}
    return {"server_url": server.rstrip("/"), "api_key": api_key}


_dashboards: list[Any] = []

# Why the dashboard, push and webhook are unavailable in a build without the team server.
_NO_SERVER = ("this gpuprof was built without the team server (Boost, zlib, OpenSSL or dygraphs "
              "were missing when it was built: apt-get install libboost-dev zlib1g-dev libssl-dev "
              "libjs-dygraphs, then reinstall gpuprof)")


def _close_dashboards() -> None:
    while _dashboards:
        _dashboards.pop().close()


def _keep_dashboard(board: Any) -> None:
    """Keeps a dashboard serving until the interpreter exits (then its threads are joined)."""
    if not _dashboards:
        atexit.register(_close_dashboards)
    _dashboards.append(board)


def profile(run_name: str = "run", *, db: str | os.PathLike[str] = "gpuprof.db",
            auto: bool = True, sample_hz: float = 100.0, host_hz: float = 5.0,
            gpu: str | None = None, mock_gpus: int = 1, mock_scenario: str = "",
            host: bool = True, flops_per_step: float | None = None,
            dtype: str | None = None, group: str | None = None,
            cuda_events: bool = True, summary: bool = True,
            arch: TransformerArch | None = None,
            tokens_per_step: int | None = None,
            server: str | None = None, api_key: str | None = None,
            dashboard: bool | int = False, comm_hook: bool = True,
            trace_every_n_steps: int | None = None,
            trace_range: tuple[int, int] | None = None,
            continuous_traces_hz: float | None = None, wandb: bool = False,
            webhook: str | None = None) -> Profile:
    """Profiles the code inside ``with``.

    run_name: groups runs for regression comparison. db: SQLite file (created if missing).
    auto: patch torch (nn.Module.__call__, Tensor.backward, optimizer steps) inside the block;
    False = manual API only (prof.step / s.phase / prof.wrap_dataloader).
    sample_hz: GPU telemetry rate, at most 10000 Hz. host_hz: /proc sampling rate, at most
    100 Hz (0 disables it). auto, host, cuda_events and summary are bools; group a string.
    gpu: "auto" (NVML when present, else AWS Neuron when neuron-monitor and /dev/neuron0 are),
    "nvml", "neuron" (NeuronCores via neuron-monitor; $GPUPROF_NEURON_MONITOR), "mock" (fake
    GPUs, see mock_gpus / mock_scenario) or "none"; default $GPUPROF_GPU_BACKEND or "auto".
    MFU needs the FLOPs per step (one of three ways) and ``dtype`` (bf16, fp16, tf32, fp32,
    fp8): arch=TransformerArch(...) with tokens_per_step= (tokens this process trains on per
    optimizer step: batch × seq_len × accumulated micro-batches) computes them from the
    model's shape; flops_per_step= declares them; with neither, auto mode counts one step with
    torch's FlopCounterMode (a whole prof.step() block when the loop uses prof.step()).
    arch= and flops_per_step= together are an error. mock_gpus (1..64) and mock_scenario
    ("key=value,...", e.g. "util=40,temp=88,throttle=1"; docs/telemetry.md) script gpu="mock".
    cuda_events: time phases on the GPU with CUDA events when CUDA is available.
    summary: print the insight summary when the block exits.
    comm_hook: in auto mode, time the gradient buckets of DistributedDataParallel models with a
    comm hook (chaining the user's); False leaves DDP's built-in allreduce alone.
    dashboard: serve a live dashboard of this run from the training process: True (a free port)
    or a port number; bound to 127.0.0.1. Its URL, with a single-use login token, is the first
    line printed; it stays reachable until the process exits (docs/dashboard.md).
    trace_every_n_steps, trace_range, continuous_traces_hz: kernel traces (README "Kernel
    traces"). trace_every_n_steps=N traces steps 0, N, 2N, ... plus the warm-up steps 0, 1 and
    5; trace_range=(a, b) traces steps a..b-1; continuous_traces_hz=f aggregates every kernel of
    the run per 1/f-second window. On CUDA the kernels come from CUPTI (kernels table); on a CPU
    run the traced steps' CPU operators come from torch.profiler (cpu_ops table). Off by
    default.
    wandb: at stop, log MFU, the step breakdown and the insights into the active wandb.run
    (summary keys under "gpuprof/" and two tables); without an active run, one info line.
    webhook: an http(s) URL (a Slack incoming webhook, or any Slack-compatible endpoint): at
    stop, POST the run's status, duration and top insights with their fixes; at most 10 s
    added to the end of the run, one retry; a failure is a GpuprofWarning.
    server, api_key: push the run live to a team server (``gpuprof serve``): "http://HOST:PORT"
    and one of its write keys; default $GPUPROF_SERVER and $GPUPROF_API_KEY. A native thread
    sends the new rows once a second; what the server does not take is spooled to
    $GPUPROF_BUFFER_DIR (default ~/.gpuprof/buffer) for ``gpuprof drain``. Never stops or slows
    the training: a failure is one GpuprofWarning at the end, with the reason.
    """
    if not isinstance(run_name, str):
        raise TypeError(f"gpuprof.profile: run_name must be a string, got "
                        f"{type(run_name).__name__} {run_name!r}")
    if not run_name.strip():
        raise ValueError("gpuprof.profile: run_name must be a non-empty string")
    _check_utf8("run_name", run_name)
    auto = _check_bool("auto", auto)
    host = _check_bool("host", host)
    cuda_events = _check_bool("cuda_events", cuda_events)
    summary = _check_bool("summary", summary)
    comm_hook = _check_bool("comm_hook", comm_hook)
    wandb = _check_bool("wandb", wandb)
    if webhook is not None:
        if not isinstance(webhook, str):
            raise TypeError(f"gpuprof.profile: webhook must be a URL string, got "
                            f"{type(webhook).__name__}")
        from . import _native
        if not _native.HAS_SERVER:
            _warn(f"gpuprof.profile: webhook= is set but {_NO_SERVER}; no message will be sent")
            webhook = None
        else:
            try:
                _native.check_webhook_url(webhook)
            except ValueError as e:
                raise ValueError(f"gpuprof.profile: {e}") from None
    if group is not None:
        if not isinstance(group, str):
            raise TypeError(f"gpuprof.profile: group must be a string, got "
                            f"{type(group).__name__} {group!r}")
        if not group.strip():
            raise ValueError("gpuprof.profile: group must be a non-empty string or None")
        _check_utf8("group", group)
    if gpu is None:
        env_gpu = os.environ.get("GPUPROF_GPU_BACKEND") or None  # "" = unset
        if env_gpu is not None and env_gpu not in _GPU_BACKENDS:
            raise ValueError(f"gpuprof.profile: $GPUPROF_GPU_BACKEND must be one of "
                             f"{', '.join(_GPU_BACKENDS)} (it sets the default of gpu=); got "
                             f"{env_gpu!r}")
        gpu = env_gpu or "auto"
    if not isinstance(gpu, str):
        raise TypeError(f"gpuprof.profile: gpu must be a string, one of "
                        f"{', '.join(_GPU_BACKENDS)}; got {type(gpu).__name__} {gpu!r}")
    if gpu not in _GPU_BACKENDS:
        raise ValueError(f"gpuprof.profile: gpu must be one of {', '.join(_GPU_BACKENDS)}; "
                         f"got {gpu!r}")
    sample_hz = _check_positive("sample_hz", sample_hz, maximum=_MAX_SAMPLE_HZ)
    host_hz = _check_positive("host_hz", host_hz, allow_zero=True, maximum=_MAX_HOST_HZ)
    if isinstance(mock_gpus, bool) or not isinstance(mock_gpus, int):
        raise TypeError(f"gpuprof.profile: mock_gpus must be an int in 1..64, got "
                        f"{type(mock_gpus).__name__} {mock_gpus!r}")
    if not 1 <= mock_gpus <= 64:
        raise ValueError(f"gpuprof.profile: mock_gpus must be an int in 1..64, got {mock_gpus!r}")
    if not isinstance(mock_scenario, str):
        raise TypeError("gpuprof.profile: mock_scenario must be a string like 'temp=88,throttle=1'")
    _check_utf8("mock_scenario", mock_scenario)
    if mock_scenario:
        try:
            from . import _native
        except ImportError:
            pass  # no extension (a broken install): the scenario is not checked here
        else:
            try:
                _native.check_mock_scenario(mock_scenario)
            except ValueError as e:
                raise ValueError(f"gpuprof.profile: mock_scenario: {e}") from None
    if gpu != "mock" and (mock_gpus != 1 or mock_scenario):
        given = [n for n, v in (("mock_gpus", mock_gpus != 1), ("mock_scenario", mock_scenario))
                 if v]
        _warn(f"gpuprof: {' and '.join(given)} only apply with gpu=\"mock\"; the GPU "
              f"backend is {gpu!r}, so {'they are' if len(given) > 1 else 'it is'} ignored")
    if flops_per_step is not None:
        flops_per_step = _check_positive("flops_per_step", flops_per_step)
    arch_flops = _arch_flops(arch, tokens_per_step, flops_per_step)
    flops_method = "declared" if flops_per_step is not None else None
    if arch_flops is not None:
        flops_per_step, flops_method = float(arch_flops["model_per_step"]), "arch"
    if dtype is not None and not isinstance(dtype, str):
        raise TypeError(f"gpuprof.profile: dtype must be a string, one of {', '.join(_DTYPES)}; "
                        f"got {type(dtype).__name__} {dtype!r}")
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"gpuprof.profile: dtype must be one of {', '.join(_DTYPES)}; "
                         f"got {dtype!r}")
    if not isinstance(db, (str, os.PathLike)):
        raise TypeError(f"gpuprof.profile: db must be a file path (str or os.PathLike), got "
                        f"{type(db).__name__} {db!r}")
    db_path = os.fspath(db)
    if not isinstance(db_path, str):
        raise TypeError(f"gpuprof.profile: db must be a str path, got {type(db_path).__name__}")
    if not db_path:
        raise ValueError("gpuprof.profile: db must be a file path")
    _check_utf8("db", db_path)
    trace = _trace_options(trace_every_n_steps, trace_range, continuous_traces_hz)
    options: dict[str, Any] = {
        "run_name": run_name,
        "db_path": db_path,
        "sample_hz": sample_hz,
        "host_hz": host_hz,
        "host": host,  # host_hz=0 also turns it off; the native session names which
        "gpu_backend": gpu,
        "mock_gpus": mock_gpus,
        "mock_scenario": mock_scenario,
        "flops_per_step": flops_per_step,
        "flops_method": flops_method,
        "dtype": dtype,
        "group_id": group,
    }
    config = {k: v for k, v in options.items() if k != "db_path"}
    options.update(trace)
    if trace:
        config["trace"] = {"every_n_steps": trace_every_n_steps,
                           "range": list(trace_range) if trace_range is not None else None,
                           "continuous_hz": continuous_traces_hz}
    config.update(auto=auto, cuda_events=cuda_events, summary=summary, comm_hook=comm_hook)
    if arch is not None:
        # "grad_checkpoint" is read by the gradient_checkpointing_detected rule; without an
        # arch the key is absent (not declared), never false.
        config.update(arch=arch.as_dict(), grad_checkpoint=arch.grad_checkpoint,
                      tokens_per_step=tokens_per_step)
        if arch_flops is not None:
            config.update(flops_per_token=arch_flops["model"],
                          hardware_flops_per_step=arch_flops["hardware_per_step"])
    options["config_json"] = json.dumps(_json_value(config), sort_keys=True, allow_nan=False)
    if isinstance(dashboard, bool):
        port = 0 if dashboard else None
    elif isinstance(dashboard, int) and 1 <= dashboard <= 65535:
        port = dashboard
    else:
        raise ValueError(f"gpuprof.profile: dashboard must be True, False or a port number "
                         f"(1..65535), got {dashboard!r}")
    # The team server (never in config_json: the key is a secret).
    push = _server_options(server, api_key)
    if push:
        options.update(push)
    prof = Profile(run_name, options, auto=auto, print_summary=summary, cuda_events=cuda_events)
    prof._dashboard_port = port
    prof._comm_hook = comm_hook
    prof._wandb = wandb
    prof._webhook = webhook
    return prof
