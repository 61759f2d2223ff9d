"""CUDA-event phase timing, exercised on CPU with a stand-in for torch.cuda.Event.

The stand-in completes an event a fixed number of query() calls after it was recorded and
reports elapsed_time from scripted values, so the test checks the bookkeeping: resolution
without blocking, attribution to the right step (also after the step was written), and the
final wait at exit only."""

from __future__ import annotations

import pytest

import gpuprof
from gpuprof import _native
from gpuprof._cuda_timing import CudaPhaseTimer
from gpuprof_testutil import cuda_available


class FakeEvent:
    clock = 0          # advanced by the test: "GPU time" in ms
    syncs = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t = None
        self.polls = 0

    def record(self) -> None:
        self.t = FakeEvent.clock
        self.polls = 0

    def query(self) -> bool:
        self.polls += 1
        return self.polls > 2  # completes on the third query

    def synchronize(self) -> None:
        FakeEvent.syncs += 1

    def elapsed_time(self, end: "FakeEvent") -> float:
        return float(end.t - self.t)


class FakeCuda:
    Event = FakeEvent


class FakeTorch:
    cuda = FakeCuda


def test_gpu_times_resolve_later_and_land_on_their_steps(db):
    FakeEvent.syncs = 0
    with gpuprof.profile("cuda-timing", db=db.path, auto=False, gpu="none",
                         summary=False) as prof:
        session = prof._session
        timer = CudaPhaseTimer(session, _native.kind.GPU_PHASE, FakeTorch)
        for i in range(4):
            with prof.step(i) as s:
                fwd = prof._phase_id("forward")
                ts = _native.monotonic_ns()
                session.emit_at(ts, _native.kind.PHASE_BEGIN, fwd, 0)
                timer.edge(fwd, True, ts)
                FakeEvent.clock += 5 + i        # the forward "runs" 5+i ms on the GPU
                timer.edge(fwd, False, _native.monotonic_ns())
                session.emit_at(_native.monotonic_ns(), _native.kind.PHASE_END, fwd, 0)
        # Without any synchronize, only pairs that completed were resolved so far.
        assert FakeEvent.syncs == 0
        assert timer.resolved < 4
        timer.finish()
        assert timer.resolved == 4
    gpu = [r[0] for r in db.rows("SELECT gpu_ns FROM phases WHERE name='forward' ORDER BY step")]
    assert gpu == [5_000_000, 6_000_000, 7_000_000, 8_000_000]
    # AND the CPU-side wall time is kept separately (and is not the GPU time)
    wall = [r[0] for r in db.rows("SELECT wall_ns FROM phases WHERE name='forward'")]
    assert all(w is not None and w < 5_000_000 for w in wall)


@pytest.mark.skipif(cuda_available(), reason="asserts what a machine without CUDA records")
def test_cpu_run_records_why_cuda_events_are_off(db):
    import torch
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile("cpu", db=db.path, gpu="none", summary=False):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    available, reason = db.one(
        "SELECT available, reason FROM telemetry_status WHERE source='cuda_events'")
    assert available == 0 and "CUDA not available" in reason
    # AND phase GPU times are unknown (NULL), not zero
    assert db.rows("SELECT DISTINCT gpu_ns FROM phases") == [(None,)]


class RecordingSession:
    def __init__(self) -> None:
        self.emitted: list[tuple[int, int, int, int]] = []

    def emit_at(self, ts: int, kind: int, phase: int, ns: int) -> None:
        self.emitted.append((ts, kind, phase, ns))


def test_a_closure_inside_the_optimizer_step_is_not_optimizer_gpu_time():
    """optimizer.step(closure): the optimizer's interval pauses while the closure's forward
    and backward run; its GPU time is its own segments, all reported at its begin timestamp
    (the step's), and the forward and backward keep theirs."""
    session = RecordingSession()
    timer = CudaPhaseTimer(session, 99, FakeTorch)
    FORWARD, BACKWARD, OPTIMIZER = 0, 1, 2
    script = [(0, OPTIMIZER, True, 100), (1, FORWARD, True, 101), (3, FORWARD, False, 103),
              (3, BACKWARD, True, 103), (6, BACKWARD, False, 106), (7, OPTIMIZER, False, 107),
              # a plain step afterwards is unchanged
              (10, FORWARD, True, 110), (11, FORWARD, False, 111),
              (11, BACKWARD, True, 111), (13, BACKWARD, False, 113),
              (13, OPTIMIZER, True, 113), (14, OPTIMIZER, False, 114)]
    for clock, phase, begin, ts in script:
        FakeEvent.clock = clock
        timer.edge(phase, begin, ts)
    timer.finish()
    got: dict[tuple[int, int], float] = {}
    for ts, kind, phase, ns in session.emitted:
        assert kind == 99
        got[(ts, phase)] = got.get((ts, phase), 0) + ns
    assert got == {(101, FORWARD): 2e6, (103, BACKWARD): 3e6, (100, OPTIMIZER): 2e6,
                   (110, FORWARD): 1e6, (111, BACKWARD): 2e6, (113, OPTIMIZER): 1e6}
    # segments: before the forward, between forward and backward (the loss), after backward
    assert sum(1 for e in session.emitted if e[2] == OPTIMIZER and e[0] == 100) == 3
