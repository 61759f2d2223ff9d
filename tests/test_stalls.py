"""The stall watch: a process held off the CPU (here stopped with SIGSTOP, as CPU steal, a
container quota or the OOM-killer's swapping would) is recorded with the run, reported by
host_stalls, and its slow steps are not blamed on the training's code; threads that queue for a
CPU behind other processes (here busy loops pinned to the training's core) are reported by
cpu_contention."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gpuprof
from gpuprof_testutil import run_cli

# A manual loop of 10 ms steps that says when it reached the steady state (a file) and runs on
# until the test says it is done, then 20 steps more.
LOOP = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import gpuprof
    db, ready, done = sys.argv[1:4]
    with gpuprof.profile("stalled", db=db, auto=False, gpu="none", summary=False) as prof:
        i = 0
        after_done = 0
        while after_done < 20:
            with prof.step(i):
                time.sleep(0.010)
            i += 1
            if i == 10:
                Path(ready).touch()
            if Path(done).exists():
                after_done += 1
            if i > 3000:
                raise SystemExit("the test never said it was done")
""")


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_a_process_held_off_the_cpu_is_reported_as_host_stalls(tmp_path):
    # GIVEN a training loop in the steady state
    db, ready, done = tmp_path / "s.db", tmp_path / "ready", tmp_path / "done"
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(db), str(ready), str(done)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready)
        # WHEN the machine stops it 4 times for 150 ms (between stops it runs ~10 steps)
        for _ in range(4):
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(0.15)
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.1)
        done.touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    doc = json.loads(run_cli("insights", str(db), "1", "--json", check=True).stdout)
    # THEN the run holds the stalls: 4 of about 150 ms (a busy machine may add others)
    assert doc["stalls"]["count"] >= 4
    assert doc["stalls"]["longest_ns"] >= 140e6
    assert doc["stalls"]["total_ns"] >= 4 * 140e6
    # AND host_stalls reports them with the host's fix
    by_id = {i["rule_id"]: i for i in doc["insights"]}
    assert "host_stalls" in by_id, doc["insights"]
    stalls = by_id["host_stalls"]
    assert stalls["evidence"]["stalls"] >= 4
    assert "held off the CPU" in stalls["message"]
    assert "CPU steal" in stalls["fix"]
    # AND the slow steps are not a separate finding blaming logging or GC: high_step_variance
    # is folded under host_stalls as the same cause
    assert "high_step_variance" not in by_id
    folded = {e["rule_id"]: e for e in doc["explained"]}
    assert folded["high_step_variance"]["explained_by"] == "host_stalls"
    assert folded["high_step_variance"]["evidence"]["stall_caused"] is True
    # AND the full report names the watch and what it saw
    text = run_cli("insights", str(db), "1", check=True).stdout
    assert "stalls       available (watch thread) · held off the CPU" in text


def test_without_host_telemetry_stalls_are_unknown_not_zero(tmp_path):
    db = tmp_path / "s.db"
    with gpuprof.profile("no-host", db=str(db), auto=False, gpu="none", host=False,
                         summary=False) as prof:
        for i in range(3):
            with prof.step(i):
                time.sleep(0.002)
        assert prof.stats()["stalls"] is None
    doc = json.loads(run_cli("insights", str(db), "1", "--json", check=True).stdout)
    assert doc["stalls"] is None
    status = {t["source"]: t for t in doc["telemetry"]}
    assert status["stalls"]["available"] is False
    assert status["stalls"]["reason"] == "host telemetry disabled (host=False)"
    reasons = {n["rule_id"]: n["reason"] for n in doc["not_evaluated"]}
    assert reasons["host_stalls"] == "no stall watch: host telemetry disabled (host=False)"
    # AND so is the CPU wait
    assert prof.stats()["cpu_wait_ns"] is None
    assert doc["cpu_wait"] is None
    assert status["cpu_wait"]["reason"] == "host telemetry disabled (host=False)"
    assert reasons["cpu_contention"] == "CPU wait not read: host telemetry disabled (host=False)"


def test_a_quiet_run_records_that_it_was_watched(tmp_path):
    # A run the machine never paused says so (watched, no stalls) rather than nothing.
    db = tmp_path / "s.db"
    with gpuprof.profile("quiet", db=str(db), auto=False, gpu="none", summary=False) as prof:
        for i in range(3):
            with prof.step(i):
                time.sleep(0.002)
        live = prof.stats()["stalls"]
        assert isinstance(live, int) and live >= 0
    doc = json.loads(run_cli("insights", str(db), "1", "--json", check=True).stdout)
    assert doc["stalls"] is not None
    status = {t["source"]: t for t in doc["telemetry"]}
    assert status["stalls"] == {"source": "stalls", "available": True,
                                "backend": "watch thread", "reason": None}


# A CPU-bound manual loop (~20 ms of pure Python a step) pinned to one core, as the training.
BUSY_LOOP = textwrap.dedent("""
    import os, sys, time
    import gpuprof
    db, cpu = sys.argv[1], int(sys.argv[2])
    os.sched_setaffinity(0, {cpu})
    with gpuprof.profile("contended", db=db, auto=False, gpu="none", summary=False) as prof:
        for i in range(60):
            with prof.step(i):
                t = time.thread_time()
                while time.thread_time() - t < 0.020:
                    pass
""")


def test_threads_queueing_behind_other_processes_are_reported_as_cpu_contention(tmp_path):
    # GIVEN two busy loops pinned to the core the training is pinned to
    cpu = min(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c",
                              f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
            for _ in range(2)]
    try:
        db = tmp_path / "c.db"
        proc = subprocess.run([sys.executable, "-c", BUSY_LOOP, str(db), str(cpu)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    doc = json.loads(run_cli("insights", str(db), "1", "--json", check=True).stdout)
    # THEN the run holds the CPU wait: about two thirds of the time with two hogs on the core
    assert doc["cpu_wait"]["total_ns"] > 0
    by_id = {i["rule_id"]: i for i in doc["insights"]}
    assert "cpu_contention" in by_id, doc["insights"]
    found = by_id["cpu_contention"]
    assert found["evidence"]["share"] >= 0.4, found
    assert found["severity"] in ("med", "high")
    assert "The training's threads queued" in found["message"]
    # AND the full report's telemetry names the reading and what it saw
    text = run_cli("insights", str(db), "1", check=True).stdout
    assert "cpu_wait     available (schedstat) · the training's threads queued" in text
