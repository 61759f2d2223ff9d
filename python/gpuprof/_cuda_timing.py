"""GPU phase times from CUDA events (ARCHITECTURE principle 2).

At each outermost phase boundary an event is recorded on the current stream; completed pairs
are resolved later with the non-blocking Event.query() and handed to the native recorder as
(begin CPU timestamp, phase, GPU ns). Nothing here synchronizes during the loop; only
finish(), after the loop has ended, waits for the last outstanding events.

A forward or backward inside an open optimizer step (optimizer.step(closure): LBFGS,
Lightning) pauses the optimizer's interval: the optimizer's GPU time is its own segments, each
reported with the optimizer's begin timestamp (so they add up on its step), and the nested
work is the forward's and backward's.
"""

from __future__ import annotations

from collections import deque
from typing import Any
from collections.abc import Callable

_MAX_PENDING = 4096  # bounded: beyond this, the oldest unresolved pair is dropped
_OPTIMIZER = 2  # hook kinds 0/1/2: forward / backward / optimizer


class CudaPhaseTimer:
    def __init__(self, session: Any, gpu_phase_kind: int, torch: Any) -> None:
        self._session = session
        self._kind = gpu_phase_kind
        self._event_type = torch.cuda.Event
        self._now = __import__("gpuprof._native", fromlist=["monotonic_ns"]).monotonic_ns
        self._pool: list[Any] = []
        self._open: dict[int, tuple[int, Any]] = {}
        self._pending: deque[tuple[int, int, Any, Any]] = deque()
        self._paused_ts: int | None = None  # the open optimizer's begin, while it is paused
        self.dropped = 0
        self.resolved = 0

    def _event(self) -> Any:
        return self._pool.pop() if self._pool else self._event_type(enable_timing=True)

    def edge(self, phase_id: int, begin: bool, ts: int) -> None:
        """A phase boundary on the training thread: record an event, resolve finished ones."""
        nested = phase_id in (0, 1)  # forward, backward
        if begin:
            if nested and _OPTIMIZER in self._open:  # a closure inside optimizer.step()
                opt_ts = self._open[_OPTIMIZER][0]
                self._close(_OPTIMIZER)
                self._paused_ts = opt_ts
            ev = self._event()
            ev.record()
            self._open[phase_id] = (ts, ev)
            return
        self._close(phase_id)
        if phase_id == _OPTIMIZER:
            self._paused_ts = None
        elif (self._paused_ts is not None and 0 not in self._open and 1 not in self._open):
            ev = self._event()  # back in the optimizer's own work
            ev.record()
            self._open[_OPTIMIZER] = (self._paused_ts, ev)
            self._paused_ts = None

    def _close(self, phase_id: int) -> None:
        opened = self._open.pop(phase_id, None)
        if opened is None:
            return
        end = self._event()
        end.record()
        if len(self._pending) >= _MAX_PENDING:
            _, _, a, b = self._pending.popleft()
            self._pool += (a, b)
            self.dropped += 1
        self._pending.append((phase_id, opened[0], opened[1], end))
        self.poll()

    # Hook callback signature: (kind, is_begin, ts_ns); the hook kinds 0/1/2 are the fixed
    # phase ids forward/backward/optimizer.
    def __call__(self, kind: int, begin: bool, ts: int) -> None:
        self.edge(kind, begin, ts)

    def wrap_optimizer_hooks(self, pre: Callable[..., bool],
                             post: Callable[..., bool]) -> tuple[Callable[..., None],
                                                                 Callable[..., None]]:
        def timed_pre(*args: Any, **kwargs: Any) -> None:
            if pre(*args, **kwargs):
                self.edge(2, True, self._now())

        def timed_post(*args: Any, **kwargs: Any) -> None:
            if post(*args, **kwargs):
                self.edge(2, False, self._now())

        return timed_pre, timed_post

    def poll(self) -> None:
        """Resolves completed pairs in order without blocking."""
        while self._pending and self._pending[0][3].query():
            self._resolve(self._pending.popleft())

    def _resolve(self, item: tuple[int, int, Any, Any]) -> None:
        phase_id, ts, begin, end = item
        ns = int(begin.elapsed_time(end) * 1e6)
        self._session.emit_at(ts, self._kind, phase_id, ns)
        self._pool += (begin, end)
        self.resolved += 1

    def finish(self) -> None:
        """After the loop: wait for the outstanding events and resolve them."""
        while self._pending:
            item = self._pending.popleft()
            item[3].synchronize()
            self._resolve(item)
        self._open.clear()
