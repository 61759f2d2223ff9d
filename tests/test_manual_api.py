"""The manual API (auto=False), also on a machine without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

import gpuprof
from gpuprof_testutil import run_cli


def test_manual_steps_phases_and_wrapped_loader(db):
    # GIVEN an RL-like loop with custom phases and a loader that takes 20 ms per item
    def loader():
        for i in range(5):
            time.sleep(0.02)
            yield i

    with gpuprof.profile("manual", db=db.path, auto=False, gpu="none", summary=False) as prof:
        wrapped = prof.wrap_dataloader(loader())
        for i, _ in enumerate(wrapped):
            with prof.step(i) as s:
                with s.phase("rollout"):
                    time.sleep(0.005)
                with s.phase("forward"):
                    time.sleep(0.002)
    # THEN 5 steps with explicit waits of >= 20 ms
    rows = db.rows("SELECT step, wait_ns, wait_source FROM steps ORDER BY step")
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]
    assert all(r[2] == "explicit" and r[1] >= 19_000_000 for r in rows), rows
    # AND the custom phase is stored by name with its wall time
    rollout = db.rows("SELECT wall_ns, calls FROM phases WHERE name='rollout' ORDER BY step")
    assert len(rollout) == 5 and all(w >= 4_500_000 and c == 1 for w, c in rollout)


def test_wrapped_loader_keeps_len():
    prof = gpuprof.profile("len", auto=False, gpu="none")
    assert len(prof.wrap_dataloader([1, 2, 3])) == 3


def test_manual_api_without_torch(tmp_path):
    # GIVEN a Python where importing torch fails
    script = textwrap.dedent(f"""
        import sys, sqlite3
        sys.modules["torch"] = None          # import torch -> ImportError
        import gpuprof
        with gpuprof.profile("no-torch", db={str(tmp_path / 'nt.db')!r}, auto=False,
                             gpu="none") as prof:
            for i, item in enumerate(prof.wrap_dataloader(range(4))):
                with prof.step(i) as s:
                    with s.phase("work"):
                        sum(range(10000))
        con = sqlite3.connect({str(tmp_path / 'nt.db')!r})
        print("STEPS", con.execute("select count(*) from steps").fetchone()[0])
        print("DEVICE", con.execute("select device_kind from runs").fetchone()[0])
    """)
    # WHEN the manual API runs there
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    # THEN it works, records the steps, and the device is unknown (not guessed)
    assert proc.returncode == 0, proc.stderr
    assert "STEPS 4" in proc.stdout
    assert "DEVICE None" in proc.stdout
    assert "gpuprof · no-torch  (4 steps" in proc.stdout


def test_auto_without_torch_warns_and_still_records(tmp_path):
    script = textwrap.dedent(f"""
        import sys, warnings
        sys.modules["torch"] = None
        import gpuprof
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with gpuprof.profile("auto-no-torch", db={str(tmp_path / 'a.db')!r}, gpu="none",
                                 summary=False):
                pass
        print("WARN", any("torch is not installed" in str(x.message) for x in w))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "WARN True" in proc.stdout


def _epoch_loop(db_path, epochs=3, batches=4):
    loader = list(range(batches))
    with gpuprof.profile("epochs", db=db_path, auto=False, gpu="none", host=False,
                         summary=False) as prof:
        for _epoch in range(epochs):
            for i, _ in enumerate(prof.wrap_dataloader(loader)):
                with prof.step(i) as s:
                    with s.phase("forward"):
                        time.sleep(0.001)
                    with s.phase("backward"):
                        time.sleep(0.001)
                    with s.phase("optimizer"):
                        pass
    return prof


def test_epoch_loop_stores_every_step_in_run_order(db):
    # GIVEN the README loop inside an epoch loop: enumerate() restarts at 0 every epoch
    prof = _epoch_loop(db.path, epochs=3, batches=4)
    # THEN all 12 prof.step() blocks are stored, numbered in run order, tiling the timeline
    rows = db.rows("SELECT step, start_ns, end_ns FROM steps ORDER BY step")
    assert [r[0] for r in rows] == list(range(12))
    assert all(rows[k][1] == rows[k - 1][2] for k in range(1, 12)), rows
    assert prof.stats()["steps"] == 12
    # AND each phase ran once per stored step (no step absorbed another epoch's)
    calls = db.rows("SELECT step, calls FROM phases WHERE name='forward' ORDER BY step")
    assert calls == [(k, 1) for k in range(12)]
    # AND each epoch restart is noted with the offset back to the user's index
    notes = [r[0] for r in db.rows(
        "SELECT message FROM diagnostics WHERE source='steps' AND level='info' ORDER BY ts_ns")]
    assert len(notes) == 2, notes
    assert "prof.step(0) is stored as step 4" in notes[0] and "index + 4" in notes[0]
    assert "prof.step(0) is stored as step 8" in notes[1] and "index + 8" in notes[1]
    # AND the summary and `gpuprof insights` count 12 steps
    proc = run_cli("insights", str(db.path), str(prof.run_id), check=True)
    assert "(12 steps" in proc.stdout, proc.stdout


def test_repeated_and_decreasing_indices_are_kept_as_separate_steps(db):
    # GIVEN step(5), step(2), step(2)
    with gpuprof.profile("idx", db=db.path, auto=False, gpu="none", host=False,
                         summary=False) as prof:
        for i in (5, 2, 2):
            with prof.step(i):
                time.sleep(0.001)
    # THEN three steps: 5 (the user's index), then the next free numbers
    assert [r[0] for r in db.rows("SELECT step FROM steps ORDER BY step")] == [5, 6, 7]


def test_negative_step_index_is_rejected(db):
    with gpuprof.profile("neg", db=db.path, auto=False, gpu="none", host=False,
                         summary=False) as prof:
        with pytest.raises(ValueError, match="index must be >= 0"):
            prof.step(-1)


def test_manual_call_counters_count_the_named_phases(db):
    # GIVEN manual steps with forward/backward/optimizer phases (twice forward in step 1)
    with gpuprof.profile("calls", db=db.path, auto=False, gpu="none", host=False,
                         summary=False) as prof:
        for i in range(2):
            with prof.step(i) as s:
                for _ in range(i + 1):
                    with s.phase("forward"):
                        pass
                with s.phase("backward"):
                    pass
                with s.phase("optimizer"):
                    pass
        with prof.step(2) as s:
            with s.phase("rollout"):
                pass
    # THEN the counters are the phases that ran (measured), 0 where none ran
    rows = db.rows("SELECT step, forward_calls, backward_calls, optimizer_calls FROM steps "
                   "ORDER BY step")
    assert rows == [(0, 1, 1, 1), (1, 2, 1, 1), (2, 0, 0, 0)]


def test_named_phases_around_auto_timed_calls_are_counted_once(db):
    # GIVEN auto mode (the default) with prof.step() and s.phase("forward"/...) around the
    # model call, backward and optimizer step, as a GAN loop grouped by hand is written
    torch = pytest.importorskip("torch")

    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def forward(self, x):
            time.sleep(0.05)
            return self.lin(x)

    model = Slow()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile("twice", db=db.path, gpu="none", host=False, summary=False) as prof:
        for i in range(4):
            with prof.step(i) as s:
                with s.phase("forward"):
                    loss = model(torch.randn(4, 8)).sum()
                with s.phase("backward"):
                    loss.backward()
                with s.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
    # THEN each step's forward is the 50 ms call once (not the phase plus the auto-timed
    # call: that would be 100 ms or more; the slack covers a slow first call under ASan), one
    # call, and the phases fit inside their step
    for step, fwd_ns, calls, span in db.rows(
            "SELECT p.step, p.wall_ns, p.calls, s.end_ns - s.start_ns FROM phases p "
            "JOIN steps s ON s.run_id = p.run_id AND s.step = p.step "
            "WHERE p.name = 'forward' ORDER BY p.step"):
        assert calls == 1, step
        assert 50e6 <= fwd_ns < 100e6 and fwd_ns <= span, (step, fwd_ns, span)


def test_phase_outside_its_step_warns_and_is_recorded_as_a_diagnostic(db):
    # GIVEN a phase entered after its step closed
    with gpuprof.profile("late", db=db.path, auto=False, gpu="none", host=False,
                         summary=False) as prof:
        with prof.step(0) as s:
            time.sleep(0.001)
        # WHEN it runs THEN a GpuprofWarning names it and the loop continues
        with pytest.warns(gpuprof.GpuprofWarning, match=r"s.phase\('late'\)"):
            with s.phase("late"):
                time.sleep(0.001)
    # AND a stored diagnostic says it; no phase row was invented for it
    msgs = [r[0] for r in db.rows("SELECT message FROM diagnostics WHERE level='warning' "
                                  "AND source='steps'")]
    assert any("s.phase('late')" in m and "not recorded" in m for m in msgs), msgs
    assert db.rows("SELECT * FROM phases WHERE name='late'") == []


def test_a_step_index_too_large_to_store_is_a_clear_error(db):
    with gpuprof.profile("big", db=db.path, gpu="none", auto=False, summary=False) as prof:
        with pytest.raises(ValueError, match=r"index must be at most 2\*\*62"):
            prof.step(2**63)
        with prof.step(2**62):
            pass
        with prof.step():  # the next one still works
            pass
    assert [r[0] for r in db.rows("SELECT step FROM steps ORDER BY step")] == [2**62, 2**62 + 1]


def test_integer_scalars_with_index_are_step_indices(db):
    # GIVEN numpy (and, when installed, torch) integer indices
    np = pytest.importorskip("numpy")
    indices = [np.int64(3), np.int32(4)]
    try:
        import torch
        indices += [torch.tensor(5), torch.tensor(6)[()]]
    except ImportError:
        pass
    # WHEN they index steps
    with gpuprof.profile("npidx", db=db.path, auto=False, gpu="none", host=False,
                         summary=False) as prof:
        for i in indices:
            with prof.step(i):
                pass
        # THEN bools and non-integers are still refused, and the range check still applies
        for bad in (np.bool_(True), np.float64(1.0), 1.0):
            with pytest.raises(TypeError, match="index must be an int"):
                prof.step(bad)
        with pytest.raises(ValueError, match="index must be >= 0"):
            prof.step(np.int64(-1))
    assert [r[0] for r in db.rows("SELECT step FROM steps ORDER BY step")] == \
        [int(i) for i in indices]
