"""A killed training process leaves a readable DB with what was flushed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time


def test_db_is_readable_after_kill_9(tmp_path):
    db = tmp_path / "killed.db"
    marker = tmp_path / "progress"
    # GIVEN a profiled loop that runs until killed and reports its step count
    script = textwrap.dedent(f"""
        import time, torch, gpuprof
        m = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        with gpuprof.profile("killed", db={str(db)!r}, gpu="mock", sample_hz=50):
            i = 0
            while True:
                m(torch.randn(4, 16)).sum().backward(); opt.step(); opt.zero_grad()
                time.sleep(0.01)
                i += 1
                if i % 10 == 0:
                    open({str(marker)!r}, "w").write(str(i))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            if marker.exists() and marker.read_text() and int(marker.read_text()) >= 60:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the profiled loop did not reach 60 steps")
        time.sleep(0.5)  # more than one writer flush interval
        # WHEN it is killed with SIGKILL
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    # THEN the DB opens, passes an integrity check, and holds the run and its early steps
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    status, end = con.execute("SELECT status, end_ns FROM runs WHERE run_id=1").fetchone()
    assert status == "running" and end is None
    steps = con.execute("SELECT count(*) FROM steps WHERE run_id=1").fetchone()[0]
    assert steps >= 50, steps
    assert con.execute("SELECT count(*) FROM gpu_samples WHERE run_id=1").fetchone()[0] > 0
    con.close()
