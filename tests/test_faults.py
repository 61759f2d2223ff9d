"""Faults a careful user meets (docs/faults.md): a forked child leaving the block, a damaged DB,
a full disk, interrupted starts, degenerate rates and bad text. Each fault case runs as a user
would, in a subprocess with a timeout where the process itself is at risk."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

import gpuprof
from gpuprof_testutil import gpuprof_exe, run_cli


def run_python(code: str, cwd: Path, timeout: float = 120, **env: str
               ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **env))


def runs(db: Path) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT run_id, status, error FROM runs ORDER BY run_id").fetchall()
    finally:
        con.close()


def steps(db: Path, run_id: int) -> int:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(*) FROM steps WHERE run_id=?", (run_id,)).fetchone()[0]
    finally:
        con.close()


# ---------------------------------------------------------------- fork

FORK_PROGRAM = """
    import os, sys, torch, gpuprof
    m = torch.nn.Linear(4, 4)
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    with gpuprof.profile("fork", db="f.db", gpu="mock", summary=False) as p:
        for i in range(8):
            m(torch.randn(2, 4)).sum().backward(); o.step(); o.zero_grad()
            if i == 3:
                pid = os.fork()
                if pid == 0:
                    torch.save(m.state_dict(), "ckpt.pt")   # the child's work
                    {child_ending}
                _, status = os.waitpid(pid, 0)
                print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    print("parent run", p.run_id, flush=True)
"""


@pytest.mark.parametrize("child_ending", [
    "sys.exit(0)",                       # leaves the block through SystemExit
    "break",                             # leaves the block normally, then the interpreter exits
    "raise RuntimeError('in the child')",  # leaves the block with an exception
])
def test_a_forked_child_leaving_the_block_leaves_the_parents_run_alone(tmp_path, child_ending):
    # GIVEN a training loop that forks a child which saves a checkpoint and leaves the block
    program = FORK_PROGRAM.replace("{child_ending}", child_ending)
    proc = run_python(program, tmp_path, timeout=120)
    # THEN neither process crashes or hangs: the child ends as its code says, the parent goes on
    assert proc.returncode == 0, proc.stderr
    expected_child = 1 if child_ending.startswith("raise") else 0
    assert f"child exit {expected_child}" in proc.stdout, (proc.stdout, proc.stderr)
    assert "Segmentation" not in proc.stderr
    # AND the parent's run is stored whole, ok, by the parent alone
    assert (tmp_path / "ckpt.pt").exists()
    assert runs(tmp_path / "f.db") == [(1, "ok", None)]
    assert steps(tmp_path / "f.db", 1) == 8


def test_a_forked_child_exits_without_touching_the_run_many_times(tmp_path):
    # GIVEN 8 children in a row, each leaving the block with sys.exit(0) (the case that crashed
    # 8 of 8 times or hung)
    proc = run_python("""
        import os, sys, torch, gpuprof
        m = torch.nn.Linear(4, 4); o = torch.optim.SGD(m.parameters(), lr=0.1)
        codes = []
        with gpuprof.profile("forks", db="f.db", gpu="mock", summary=False):
            for i in range(8):
                m(torch.randn(2, 4)).sum().backward(); o.step(); o.zero_grad()
                pid = os.fork()
                if pid == 0:
                    sys.exit(0)
                codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        print(codes)
    """, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "[0, 0, 0, 0, 0, 0, 0, 0]" in proc.stdout
    assert runs(tmp_path / "f.db") == [(1, "ok", None)]


# ---------------------------------------------------------------- damaged text in the DB

def record_small_run(db: Path) -> None:
    m = torch.nn.Linear(4, 4)
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    with gpuprof.profile("ok", db=db, gpu="none", summary=False):
        for _ in range(4):
            m(torch.randn(2, 4)).sum().backward()
            o.step()
            o.zero_grad()


def test_insights_survives_invalid_utf8_in_every_text_column(tmp_path):
    # GIVEN a DB whose text columns were edited to hold bytes that are not UTF-8
    db = tmp_path / "bad.db"
    record_small_run(db)
    con = sqlite3.connect(db)
    bad = "CAST(x'41ff42' AS TEXT)"
    con.execute(f"UPDATE runs SET hostname={bad}, run_name={bad}, error={bad}, status='failed',"
                f" gpu_model={bad}, group_id={bad}")
    con.execute(f"UPDATE telemetry_status SET reason={bad}")
    con.commit()
    con.close()
    # WHEN the report is asked for, as JSON and as text
    out = run_cli("insights", str(db), "1", "--json")
    text = run_cli("insights", str(db), "1")
    # THEN both work: the bad bytes become U+FFFD in the JSON, which stays valid
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["run"]["hostname"] == "A\ufffdB"
    assert doc["run"]["run_name"] == "A\ufffdB"
    assert doc["run"]["group_id"] == "A\ufffdB"
    assert text.returncode == 0, text.stderr
    # AND the group report, which lists the (damaged) group ids it knows, exits cleanly too
    group = run_cli("insights", str(db), "--group", "other", "--json")
    assert group.returncode == 1, group.stderr
    assert "no runs with group_id 'other'" in group.stderr


# ---------------------------------------------------------------- lost rows

def can_mount_tmpfs(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def test_rows_lost_to_a_full_disk_are_recorded_and_reported(tmp_path):
    # GIVEN a DB on a 600 kB tmpfs and a run that writes far more (8 mock GPUs at 1 kHz)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not can_mount_tmpfs(mnt):
        pytest.skip("no mount namespace here (unshare -m / mount tmpfs not permitted)")
    script = tmp_path / "full.py"
    script.write_text(textwrap.dedent("""
        import sys, time, torch, gpuprof
        m = torch.nn.Linear(64, 64); o = torch.optim.SGD(m.parameters(), lr=0.1)
        with gpuprof.profile("full", db=sys.argv[1], gpu="mock", mock_gpus=8, sample_hz=1000):
            t0 = time.time()
            while time.time() - t0 < 2:
                m(torch.randn(8, 64)).sum().backward(); o.step(); o.zero_grad()
                time.sleep(0.002)
    """))
    db = mnt / "g.db"
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c",
         f"mount -t tmpfs -o size=600k tmpfs {mnt} && {sys.executable} {script} {db} && "
         f"{gpuprof_exe()} insights {db} 1 --json > {tmp_path / 'report.json'}"],
        capture_output=True, text=True, timeout=180)
    # THEN the training finished, and the summary says how many rows of which tables were lost
    assert proc.returncode == 0, proc.stderr
    summary = proc.stdout
    assert "Data loss: " in summary, summary
    assert "rows of this run were not stored: " in summary
    assert "gpu_samples " in summary and "disk is full" in summary
    # AND so does the stored run, read later
    doc = json.loads((tmp_path / "report.json").read_text())
    assert any("were not stored" in m for m in doc["data_loss"]), doc["data_loss"]
    store_rows = [d for d in doc["diagnostics"] if d["source"] == "store"]
    assert store_rows and store_rows[0]["level"] == "warning"


# ---------------------------------------------------------------- rates that would spin

def test_tiny_sampling_rates_do_not_spin(tmp_path):
    # GIVEN the smallest documented rates (they once overflowed the period and spun a core)
    with gpuprof.profile("slow", db=tmp_path / "s.db", gpu="mock", sample_hz=1e-10,
                         host_hz=1e-10, summary=False) as p:
        time.sleep(0.5)
        ticks = p.stats()
    # THEN the samplers ticked once (a spinning one ticked ~7,000 times in that half second)
    assert ticks["gpu_ticks"] <= 2, ticks
    assert ticks["host_ticks"] <= 2, ticks


# ---------------------------------------------------------------- interrupted starts

def test_a_warning_turned_error_during_start_leaves_no_active_profile(tmp_path):
    # GIVEN GpuprofWarnings turned into errors, and a start that warns (an unwritable DB)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpuprof.GpuprofWarning)
        with pytest.raises(gpuprof.GpuprofWarning):
            with gpuprof.profile("x", db=tmp_path / "no" / "such" / "dir.db", summary=False):
                pass
    # THEN a later profile in the same process records
    with gpuprof.profile("later", db=tmp_path / "ok.db", gpu="none", summary=False) as p:
        assert p.active
    assert p.run_id == 1


def test_ctrl_c_at_any_moment_of_start_leaves_no_active_profile(tmp_path):
    # GIVEN SIGINTs landing at random moments while profiles start and stop, in a loop
    proc = run_python("""
        import os, signal, threading, time, random, gpuprof
        random.seed(0)
        armed = False
        def on_sigint(signum, frame):  # Ctrl-C, but only inside the profiled statement
            if armed:
                raise KeyboardInterrupt
        signal.signal(signal.SIGINT, on_sigint)
        stop = False
        def poke():
            while not stop:
                time.sleep(random.uniform(0.0, 0.0005))
                os.kill(os.getpid(), signal.SIGINT)
        def attempt():
            global armed
            try:
                armed = True
                with gpuprof.profile("x", db="i.db", gpu="none", host=False, summary=False,
                                     auto=False):
                    pass
            finally:
                armed = False
        t = threading.Thread(target=poke, daemon=True)
        t.start()
        interrupted = 0
        for i in range(200):
            try:
                attempt()
            except KeyboardInterrupt:
                interrupted += 1
        stop = True
        t.join()
        with gpuprof.profile("final", db="i.db", gpu="none", summary=False, auto=False) as p:
            active = p.active
        print("interrupted", interrupted, "final active", active, flush=True)
    """, tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    # THEN after all that, a profile still records
    assert "final active True" in proc.stdout, proc.stdout
    assert int(proc.stdout.split()[1]) > 0  # the test did interrupt something
    # AND no run was left 'running' (an interrupted start stores its run as failed)
    assert all(status in ("ok", "failed") for _, status, _ in runs(tmp_path / "i.db"))


# ---------------------------------------------------------------- bad text

@pytest.mark.parametrize("option", ["db", "run_name", "group"])
def test_nul_in_a_name_or_path_is_refused_naming_the_option(tmp_path, option):
    kwargs = {"db": str(tmp_path / "a.db"), "run_name": "r", "group": "g"}
    kwargs[option] = kwargs[option] + "\x00b"
    name = kwargs.pop("run_name")
    with pytest.raises(ValueError, match=f"{option} .*NUL"):
        gpuprof.profile(name, **kwargs)
    assert not (tmp_path / "a").exists()


def test_values_the_native_core_cannot_take_are_named(tmp_path):
    with pytest.raises(ValueError, match="mock_scenario"):
        gpuprof.profile("r", db=tmp_path / "a.db", gpu="mock", mock_scenario="temp=\udcff")
    arch = gpuprof.TransformerArch(layers=2, hidden=64, heads=4, seq_len=8, vocab=100)
    with pytest.raises(ValueError, match="tokens_per_step"):
        gpuprof.profile("r", db=tmp_path / "a.db", arch=arch, tokens_per_step=10**40)
    with pytest.raises(ValueError, match="layers"):
        gpuprof.TransformerArch(layers=10**40, hidden=64, heads=4, seq_len=8, vocab=100)
    with pytest.raises(ValueError, match="flops_per_step"):
        gpuprof.profile("r", db=tmp_path / "a.db", flops_per_step=10**400)


# ---------------------------------------------------------------- the CLI

def test_a_run_id_beyond_64_bits_is_a_missing_run_either_way(tmp_path):
    record_small_run(tmp_path / "gpuprof.db")
    lone = run_cli("insights", "9223372036854775808", cwd=tmp_path)
    named = run_cli("insights", "gpuprof.db", "9223372036854775808", cwd=tmp_path)
    assert (lone.returncode, named.returncode) == (1, 1), (lone.stderr, named.stderr)
    assert "no run 9223372036854775808" in lone.stderr
    assert "no run 9223372036854775808" in named.stderr


def read_only_bind(tmp_path: Path, src: Path, cmd: str) -> subprocess.CompletedProcess | None:
    """Runs `cmd` with `src` bind-mounted read-only at tmp_path/ro, in a mount namespace of its
    own; None where this machine does not permit that."""
    ro = tmp_path / "ro"
    ro.mkdir(exist_ok=True)
    mount = f"mount --bind {src} {ro} && mount -o remount,bind,ro {ro}"
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "sh", "-c", f"{mount} && ! touch {ro}/probe"],
            capture_output=True, timeout=30).returncode != 0:
        return None
    return subprocess.run(["unshare", "-m", "sh", "-c", f"{mount} && {cmd}"],
                          capture_output=True, text=True, timeout=60)


def test_insights_reads_a_db_on_a_read_only_mount(tmp_path):
    # GIVEN a finished run's DB on a read-only mount
    src = tmp_path / "src"
    src.mkdir()
    record_small_run(src / "gpuprof.db")
    assert not (src / "gpuprof.db-wal").exists() or (src / "gpuprof.db-wal").stat().st_size == 0
    proc = read_only_bind(tmp_path, src, f"{gpuprof_exe()} insights {tmp_path / 'ro'}/gpuprof.db 1")
    if proc is None:
        pytest.skip("no mount namespace here")
    # THEN it is read as it is
    assert proc.returncode == 0, proc.stderr
    assert "gpuprof · ok · run 1" in proc.stdout


def test_a_read_only_db_with_a_leftover_log_says_what_to_do(tmp_path):
    # GIVEN a DB whose write-ahead log still holds data (a run killed mid-write), read-only
    src = tmp_path / "src"
    src.mkdir()
    record_small_run(src / "gpuprof.db")
    keep = sqlite3.connect(src / "gpuprof.db")  # a second connection keeps the log unfolded
    keep.execute("PRAGMA wal_autocheckpoint=0")
    keep.execute("INSERT INTO diagnostics(run_id, level, source, message) "
                 "VALUES (1, 'info', 't', 'in the log')")
    keep.commit()
    shutil.copy(src / "gpuprof.db", tmp_path / "copy.db")
    shutil.copy(src / "gpuprof.db-wal", tmp_path / "copy.db-wal")
    keep.close()
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    shutil.move(tmp_path / "copy.db", frozen / "gpuprof.db")
    shutil.move(tmp_path / "copy.db-wal", frozen / "gpuprof.db-wal")
    proc = read_only_bind(tmp_path, frozen, f"{gpuprof_exe()} insights {tmp_path / 'ro'}/gpuprof.db 1")
    if proc is None:
        pytest.skip("no mount namespace here")
    # THEN the error explains the log and what to do, instead of "unable to open database file"
    assert proc.returncode == 1
    assert "write-ahead log" in proc.stderr and "Copy the file with its -wal" in proc.stderr
