"""A killed training process leaves a readable DB with what was flushed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest


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
            # Read once: the loop truncates the file before each write, so a second read may
            # find it empty.
            text = marker.read_text() if marker.exists() else ""
            if text.strip() and int(text) >= 60:
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


def _run(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=timeout)


def _run_row(db):
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT status, error, end_ns FROM runs WHERE run_id=1").fetchone()
    finally:
        con.close()


_LOOP = """
    import os, signal, sys, time, torch, gpuprof
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    def train(n):
        for _ in range(n):
            m(torch.randn(2, 8)).sum().backward(); opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize("ending, rc, status, error", [
    ("", 0, "ok", None),
    ("raise RuntimeError('diverged')", 1, "failed", "RuntimeError: diverged"),
])
def test_start_without_stop_is_finished_at_interpreter_exit(tmp_path, ending, rc, status, error):
    db = tmp_path / "nostop.db"
    # GIVEN Profile.start() and a script that ends (normally, or by an uncaught exception)
    # without stop()
    proc = _run(_LOOP + f"""
    p = gpuprof.profile("nostop", db={str(db)!r}, gpu="none", host=False, summary=False)
    p.start()
    train(3)
    {ending}
    """)
    # THEN the process exits as before, without nanobind leak reports
    assert proc.returncode == rc, proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr
    if error:
        assert error in proc.stderr
    # AND the run is finished (ok, or failed with the exception, with an end), not left
    # looking killed
    assert _run_row(db)[:2] == (status, error) and _run_row(db)[2] is not None


@pytest.mark.parametrize("code, status, error, rc", [
    ("0", "ok", None, 0),
    ("", "ok", None, 0),
    ("3", "failed", "SystemExit: 3", 3),
])
def test_sys_exit_inside_the_block(tmp_path, code, status, error, rc):
    db = tmp_path / "exit.db"
    # GIVEN sys.exit(code) inside the profiled block
    proc = _run(_LOOP + f"""
    with gpuprof.profile("exit", db={str(db)!r}, gpu="none", host=False, summary=False):
        train(3)
        sys.exit({code})
    """)
    # THEN the exit status is unchanged; exit code 0 / None is a normal completion
    assert proc.returncode == rc, proc.stderr
    got_status, got_error, end = _run_row(db)
    assert (got_status, got_error) == (status, error) and end is not None


def test_sigterm_ends_the_run_and_still_terminates_the_process(tmp_path):
    db = tmp_path / "term.db"
    # GIVEN a profiled loop that receives SIGTERM (timeout, SLURM preemption, docker stop)
    proc = _run(_LOOP + f"""
    with gpuprof.profile("term", db={str(db)!r}, gpu="none", host=False, summary=False):
        train(5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("NOT TERMINATED")
    """)
    # THEN the process dies of SIGTERM, as it would without gpuprof
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr)
    assert "NOT TERMINATED" not in proc.stdout
    # AND the run is stored as ended by the signal, with its steps
    status, error, end = _run_row(db)
    assert (status, error) == ("failed", "terminated by SIGTERM") and end is not None
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 5
    con.close()


def test_a_programs_own_sigterm_handler_is_left_in_charge(tmp_path):
    db = tmp_path / "own.db"
    # GIVEN a program whose SIGTERM handler asks the loop to finish (graceful preemption)
    proc = _run(_LOOP + f"""
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    with gpuprof.profile("own", db={str(db)!r}, gpu="none", host=False, summary=False):
        for i in range(1000):
            train(1)
            if i == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            if stop:
                break
    print("HANDLER", len(stop), signal.getsignal(signal.SIGTERM).__name__)
    """)
    # THEN the program's handler ran, the loop ended normally, and the run is ok
    assert proc.returncode == 0, proc.stderr
    assert "HANDLER 1 <lambda>" in proc.stdout
    assert _run_row(db)[:2] == ("ok", None)


def test_sigterm_handler_is_removed_when_the_run_ends(tmp_path):
    db = tmp_path / "restore.db"
    proc = _run(_LOOP + f"""
    with gpuprof.profile("r", db={str(db)!r}, gpu="none", host=False, summary=False):
        inside = signal.getsignal(signal.SIGTERM)
    print("INSIDE", inside is not signal.SIG_DFL,
          "AFTER", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "INSIDE True AFTER True" in proc.stdout, proc.stdout


def test_sigterm_in_a_forked_child_does_not_end_the_parents_run(tmp_path):
    db = tmp_path / "fork.db"
    # GIVEN a forked child (as a DataLoader worker is) that is terminated with SIGTERM
    proc = _run(_LOOP + f"""
    with gpuprof.profile("fork", db={str(db)!r}, gpu="none", host=False, summary=False):
        train(2)
        pid = os.fork()
        if pid == 0:
            print("CHILD HANDLER", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
            time.sleep(30)
            os._exit(0)
        time.sleep(1)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        print("CHILD", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
        train(2)
    """)
    # THEN the child has the default SIGTERM action, died of SIGTERM, and the parent's run
    # went on and ended ok
    assert proc.returncode == 0, proc.stderr
    assert "CHILD True" in proc.stdout and "CHILD HANDLER True" in proc.stdout, proc.stdout
    assert _run_row(db)[:2] == ("ok", None)
