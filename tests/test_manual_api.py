"""The manual API (auto=False), also on a machine without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import gpuprof


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
