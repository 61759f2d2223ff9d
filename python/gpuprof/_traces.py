"""Kernel traces from the Python side: the step count the traced steps follow, the CPU-operator
capture of a CPU run (torch.profiler, CPU activities, only on traced steps), and the NVTX ranges
of ``prof.nsys_capture()``.

Which steps are traced is decided by the native trace plan (session.step_traced); on a CUDA run
the kernels are captured natively through CUPTI and nothing here runs per step except the step
count. Everything here runs on the training thread and never raises into it: a failure becomes
a diagnostic (source "kernels") and the capture stops.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

_native_now: Callable[[], int] | None = None


def _now() -> int:
    global _native_now
    if _native_now is None:
        from ._native import monotonic_ns
        _native_now = monotonic_ns
    return _native_now()


class StepCounter:
    """The index of the step being run, as gpuprof's steps table numbers it: in auto mode the
    first optimizer that steps marks the end of each iteration (a second optimizer, or
    gradient accumulation, stays in the same step); with prof.step(i), i when it is above the
    last step, else the next free number. Listeners get (ended step or None, new step or None)."""

    def __init__(self) -> None:
        self.step: int | None = 0
        self._manual = False
        self._last_manual = -1
        self._first_optimizer: Any = None
        # True while the listeners run from inside optimizer.step() (its post-hook), where
        # torch's own record_function scope is open: a listener that starts or stops
        # torch.profiler there must defer that to a point outside the optimizer step.
        self.in_optimizer_step = False
        self.listeners: list[Callable[[int | None, int | None], None]] = []

    def _move(self, new: int | None) -> None:
        old, self.step = self.step, new
        for fn in list(self.listeners):
            fn(old, new)

    def optimizer_post(self, optimizer: Any, *_: Any) -> None:
        if self._manual:
            return
        if self._first_optimizer is None:
            self._first_optimizer = optimizer
        elif optimizer is not self._first_optimizer:
            return
        self.in_optimizer_step = True
        try:
            self._move((self.step or 0) + 1)
        finally:
            self.in_optimizer_step = False

    def manual_begin(self, index: int) -> None:
        if not self._manual:
            self._manual = True
            self._move(None)  # the auto count's open step (if any) ends here
        stored = index if index > self._last_manual else self._last_manual + 1
        self._last_manual = stored
        self._move(stored)

    def manual_end(self) -> None:
        self._move(None)


_PENDING_NONE = object()


class CpuOpCapture:
    """torch.profiler (CPU activities) around each traced step of a run without CUDA; the
    operators' totals go to session.add_cpu_ops (cpu_ops table).

    An auto-mode step ends in the optimizer's post-hook, inside the record_function scope
    torch opens around optimizer.step(); stopping or starting the profiler there corrupts
    kineto's state (a crash in about half of the runs). So a step edge met inside the
    optimizer step is only noted, and carried out at the next safe point: the first loader
    wait, forward or backward after it (CpuOpEdges, the auto hooks' callback), else the next
    module forward (a global forward pre-hook that exists only while an edge is pending), or
    stop(). What runs between the optimizer step and that point (zero_grad, logging) goes to
    the step that just ended."""

    def __init__(self, session: Any, torch: Any, counter: StepCounter | None = None) -> None:
        self._session = session
        self._torch = torch
        self._counter = counter
        self._prof: Any = None
        self._step: int | None = None
        self._start = 0
        self._pending: Any = None  # the deferred new step (or _PENDING_NONE), None = none
        self._hook: Any = None
        self.edges_installed = False  # CpuOpEdges calls safe_point(): no forward pre-hook
        self._excluded = 0  # inside prof.evaluation() blocks
        self.failed = False
        self.steps = 0

    def on_step(self, ended: int | None, new: int | None) -> None:
        if self.failed:
            return
        if self._counter is not None and self._counter.in_optimizer_step:
            self._defer(new)
            return
        self._pending = None
        self._apply(new)

    def _defer(self, new: int | None) -> None:
        self._pending = _PENDING_NONE if new is None else new
        if self._hook is not None or self.edges_installed:
            return
        try:
            from torch.nn.modules.module import register_module_forward_pre_hook
            self._hook = register_module_forward_pre_hook(self._run_pending)
        except Exception as e:
            self._fail(e)

    def _run_pending(self, *_: Any) -> None:
        if self._excluded:
            return  # an evaluation's forwards: the step starts after it
        self._flush_pending()

    def _flush_pending(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        pending, self._pending = self._pending, None
        if pending is not None and not self.failed:
            self._apply(None if pending is _PENDING_NONE else pending)

    def safe_point(self) -> None:
        """Outside optimizer.step(): a deferred step edge is carried out now."""
        if self._pending is not None and self._excluded == 0:
            self._run_pending()

    def exclude(self, begin: bool) -> None:
        """prof.evaluation(): the traced step that just ended stops recording before the
        evaluation, and the next one starts at the first safe point after it."""
        if self.failed:
            return
        if not begin:
            self._excluded = max(0, self._excluded - 1)
            return
        self._excluded += 1
        if self._excluded == 1 and self._pending is not None and self._prof is not None:
            try:
                self._finish()
            except Exception as e:  # a profiler failure never breaks the training
                self._fail(e)

    def forget(self) -> None:
        """In a forked child: the parent's profiler and pending edge are dropped, untouched."""
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        self._pending = self._prof = None
        self.failed = True

    def abandon(self) -> None:
        """The profile is being disabled: the profiler stops, nothing is recorded."""
        prof = self._prof
        self.forget()
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass

    def _apply(self, new: int | None) -> None:
        try:
            if self._prof is not None:
                self._finish()
            if new is not None and self._session.step_traced(new):
                self._begin(new)
        except Exception as e:  # a profiler failure never breaks the training
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        self.failed = True
        self._prof = None
        self._session.add_diagnostic("warning", "kernels", f"CPU operator capture stopped: {e!r}")

    def _begin(self, step: int) -> None:
        profiler = self._torch.profiler
        self._prof = profiler.profile(activities=[profiler.ProfilerActivity.CPU],
                                      record_shapes=False, with_stack=False)
        self._prof.start()
        self._step = step
        self._start = _now()

    def _finish(self) -> None:
        prof, self._prof = self._prof, None
        end = _now()
        prof.stop()
        self._session.add_cpu_ops(int(self._step or 0), self._start, end,
                                 _operators(prof, self._torch))
        self.steps += 1

    def finish(self) -> None:
        """At stop(): a deferred edge is carried out, and a traced step still open is
        recorded up to now."""
        if self._hook is not None or self._pending is not None:
            self._flush_pending()
        if self._prof is not None and not self.failed:
            self._apply(None)


def _operators(prof: Any, torch: Any) -> list[tuple[str, int, int, int | None]]:
    """(name, calls, self ns, inclusive ns) per operator of a stopped torch.profiler. The raw
    events are read out as flat arrays and aggregated natively (gpuprof._native.
    aggregate_cpu_ops, ~2 ms for a step of ~1200 operators); key_averages(), which builds a
    Python object per event (~30 ms), is the fallback when the raw results are not there."""
    from . import _native
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:
        events = None
    if events is not None:
        cpu = torch.autograd.DeviceType.CPU
        names: list[str] = []
        starts: list[int] = []
        durations: list[int] = []
        threads: list[int] = []
        for e in events:
            if e.device_type() != cpu:
                continue
            names.append(e.name())
            starts.append(e.start_ns())
            durations.append(e.duration_ns())
            threads.append(e.start_thread_id())
        return [(n, c, s, t) for n, c, s, t in _native.aggregate_cpu_ops(names, starts,
                                                                         durations, threads)]
    ops: list[tuple[str, int, int, int | None]] = []
    for e in prof.key_averages():
        self_us = float(getattr(e, "self_cpu_time_total", 0.0) or 0.0)
        total_us = getattr(e, "cpu_time_total", None)
        ops.append((str(e.key), int(e.count), round(self_us * 1000),
                    None if total_us is None else round(float(total_us) * 1000)))
    return ops


class NsysRanges:
    """NVTX ranges that name gpuprof's steps ("gpuprof step <i>") and phases ("gpuprof
    forward", ...), for ``gpuprof nsys-import``; active only inside prof.nsys_capture()."""

    def __init__(self, torch: Any) -> None:
        self._nvtx = torch.cuda.nvtx
        self.active = False
        self._step_range: Any = None
        self._phase_ranges: dict[int, Any] = {}

    def on_step(self, ended: int | None, new: int | None) -> None:
        if not self.active:
            return
        if self._step_range is not None:
            self._nvtx.range_end(self._step_range)
            self._step_range = None
        if new is not None:
            self._step_range = self._nvtx.range_start(f"gpuprof step {new}")

    def phase(self, key: int, name: str, begin: bool) -> None:
        if not self.active:
            return
        if begin:
            self._phase_ranges[key] = self._nvtx.range_start(f"gpuprof {name}")
        else:
            rid = self._phase_ranges.pop(key, None)
            if rid is not None:
                self._nvtx.range_end(rid)

    def close(self) -> None:
        for rid in self._phase_ranges.values():
            self._nvtx.range_end(rid)
        self._phase_ranges.clear()
        if self._step_range is not None:
            self._nvtx.range_end(self._step_range)
            self._step_range = None
        self.active = False


_HOOK_PHASES = {0: "forward", 1: "backward", 2: "optimizer"}
_OPTIMIZER = 2


class CpuOpEdges:
    """The auto hooks' edge callback on a CPU run that captures CPU operators (same protocol as
    CudaPhaseTimer): the beginning of a loader wait, a forward or a backward is outside
    optimizer.step(), so a step edge deferred there is carried out at the first of them. A
    loop with a DataLoader switches at the batch fetch; one with modules at the forward; a
    loop with neither at the backward (the forward's operators then count to the step
    before). Composes with another loader-edge callback (the FLOP count's)."""

    def __init__(self, capture: CpuOpCapture,
                 loader: Callable[[int, bool, int], None] | None = None) -> None:
        self._capture = capture
        self._loader = loader

    def __call__(self, kind: int, begin: bool, ts: int) -> None:
        if begin and kind != _OPTIMIZER:
            self._capture.safe_point()

    def loader_edge(self, kind: int, begin: bool, ts: int) -> None:
        if begin:
            self._capture.safe_point()
        if self._loader is not None:
            self._loader(kind, begin, ts)

    def wrap_optimizer_hooks(self, pre: Callable[..., bool],
                             post: Callable[..., bool]) -> tuple[Callable[..., None],
                                                                 Callable[..., None]]:
        def plain_pre(*args: Any, **kwargs: Any) -> None:
            pre(*args, **kwargs)

        def plain_post(*args: Any, **kwargs: Any) -> None:
            post(*args, **kwargs)

        return plain_pre, plain_post


class PhaseEdges:
    """The auto hooks' phase-edge callback on a CUDA run: the CUDA event timer (when on) and
    the NVTX ranges of nsys_capture(). Same protocol as CudaPhaseTimer."""

    def __init__(self, timer: Any, ranges: NsysRanges) -> None:
        self._timer = timer
        self._ranges = ranges
        self._now = _now

    def __call__(self, kind: int, begin: bool, ts: int) -> None:
        if self._timer is not None:
            self._timer.edge(kind, begin, ts)
        if self._ranges.active:
            self._ranges.phase(kind, _HOOK_PHASES.get(kind, str(kind)), begin)

    def wrap_optimizer_hooks(self, pre: Callable[..., bool],
                             post: Callable[..., bool]) -> tuple[Callable[..., None],
                                                                 Callable[..., None]]:
        def edged_pre(*args: Any, **kwargs: Any) -> None:
            if pre(*args, **kwargs):
                self(2, True, self._now())

        def edged_post(*args: Any, **kwargs: Any) -> None:
            if post(*args, **kwargs):
                self(2, False, self._now())

        return edged_pre, edged_post
