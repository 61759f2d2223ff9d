"""`gpuprof nsys-import`: an Nsight Systems export's kernels onto the steps of a real run.

The run is recorded through the public API on the CPU; the capture is a synthetic
`nsys export --type sqlite` file shaped like the documented export (META_DATA_EXPORT,
StringIds, NVTX_EVENTS, CUPTI_ACTIVITY_KIND_KERNEL / _RUNTIME). GPUPROF_CLI picks the binary
(a build tree's) instead of the installed one.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import gpuprof
from gpuprof_testutil import gpuprof_exe

PID = 4242
MAIN = PID * 0x1000000 + 11  # nsys' global thread id: process above bit 24


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    exe = os.environ.get("GPUPROF_CLI") or gpuprof_exe()
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def record_run(db: Path, steps: int = 3) -> int:
    with gpuprof.profile("nsys-import", db=str(db), auto=False, gpu="none", summary=False,
                         host=False) as prof:
        for i in range(steps):
            with prof.step(i) as s:
                with s.phase("forward"):
                    time.sleep(0.002)
    return prof.run_id


def write_capture(path: Path, steps: list[int], kernels_per_step: int = 2,
                  outside: int = 1, version: str = "3.15.1") -> None:
    """A capture of `steps` (100 ns apart): per step `kernels_per_step` gemm launches and one
    relu, all from the main thread; `outside` launches after the last step."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER
            NOT NULL, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
            domainId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
            nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
            shortName INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL,
            gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL,
            blockZ INTEGER NOT NULL);
        INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000'), (2, 'gemm'),
            (3, 'void gemm<float>(float*)'), (4, 'relu'), (5, 'void relu<float>(float*)');
    """)
    con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', ?)", (version,))
    corr = 0

    def launch(at: int, short: int, demangled: int, duration: int) -> None:
        nonlocal corr
        corr += 1
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, 1, 0)",
                    (at, at + 2, MAIN, corr))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
                    "(?, ?, 0, 1, 7, ?, ?, ?, ?, 4, 1, 1, 128, 1, 1)",
                    (at + 5, at + 5 + duration, corr, PID * 0x1000000, demangled, short))

    for n, step in enumerate(steps):
        start = 1000 + 100 * n
        con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL, NULL, 0)",
                    (start, start + 100, f"gpuprof step {step}", MAIN))
        con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, 'gpuprof forward', ?, NULL, "
                    "NULL, 0)", (start, start + 50, MAIN))
        for k in range(kernels_per_step):
            launch(start + 10 + k, 2, 3, 20)
        launch(start + 60, 4, 5, 8)
    for k in range(outside):
        launch(1000 + 100 * len(steps) + 50 + k, 2, 3, 20)
    con.commit()
    con.close()


def kernel_rows(db: Path) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(
            "SELECT k.run_id, k.step, k.name, k.calls, k.gpu_ns, k.min_ns, k.max_ns, k.device, "
            "k.stream, k.grid, k.block, k.source, k.window_start_ns = s.start_ns, "
            "k.window_end_ns = s.end_ns FROM kernels k JOIN steps s "
            "ON s.run_id = k.run_id AND s.step = k.step ORDER BY k.step, k.name").fetchall()
    finally:
        con.close()


def test_import_attaches_kernels_to_the_runs_steps(tmp_path):
    # GIVEN a recorded run of 3 steps and an nsys capture of those steps
    db = tmp_path / "gpuprof.db"
    run_id = record_run(db)
    capture = tmp_path / "capture.sqlite"
    write_capture(capture, [0, 1, 2])
    # WHEN it is imported into the newest run of ./gpuprof.db
    proc = cli("nsys-import", str(capture), cwd=tmp_path)
    # THEN one row per step and kernel lands in the kernels table, windows = the steps' spans
    assert proc.returncode == 0, proc.stderr
    assert (f"imported 9 kernels (6 rows) into steps 0–2 of run {run_id} of gpuprof.db from "
            f"{capture} (nsys export schema 3.15.1)") in proc.stdout
    assert "1 kernel was outside gpuprof step ranges and not imported" in proc.stdout
    rows = kernel_rows(db)
    assert len(rows) == 6
    for step in range(3):
        gemm, relu = [r for r in rows if r[1] == step]
        assert gemm[:12] == (run_id, step, "void gemm<float>(float*)", 2, 40, 20, 20, 0, 7,
                             "4,1,1", "128,1,1", "nsys")
        assert relu[2:5] == ("void relu<float>(float*)", 1, 8)
        assert gemm[12:] == (1, 1) and relu[12:] == (1, 1)
    # AND the report still reads the run
    report = cli("insights", str(db), str(run_id))
    assert report.returncode == 0, report.stderr


def test_second_import_is_refused_unless_replace(tmp_path):
    db = tmp_path / "runs.db"
    run_id = record_run(db)
    first = tmp_path / "first.sqlite"
    write_capture(first, [0, 1, 2])
    assert cli("nsys-import", str(first), "--db", str(db)).returncode == 0
    # WHEN the run is imported into again without --replace
    again = cli("nsys-import", str(first), "--db", str(db), "--run", str(run_id))
    # THEN it is refused and nothing changes
    assert again.returncode == 1
    assert "already has kernels imported from nsys (6 rows); pass --replace" in again.stderr
    assert len(kernel_rows(db)) == 6
    # WHEN a new capture of one step replaces the import
    second = tmp_path / "second.sqlite"
    write_capture(second, [1], kernels_per_step=3, outside=0)
    proc = cli("nsys-import", str(second), "--db", str(db), "--replace")
    # THEN only its rows remain
    assert proc.returncode == 0, proc.stderr
    assert "into step 1 of run" in proc.stdout and "replacing 6 earlier nsys rows" in proc.stdout
    rows = kernel_rows(db)
    assert [(r[1], r[3]) for r in rows] == [(1, 3), (1, 1)]


def test_errors_leave_the_db_untouched(tmp_path):
    db = tmp_path / "gpuprof.db"
    run_id = record_run(db, steps=2)
    not_sqlite = tmp_path / "capture.nsys-rep"
    not_sqlite.write_bytes(b"\x00nsys report" * 400)
    foreign = tmp_path / "foreign.sqlite"
    sqlite3.connect(foreign).executescript("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
    v4 = tmp_path / "v4.sqlite"
    write_capture(v4, [0, 1], version="4.0.0")
    other_run = tmp_path / "other.sqlite"
    write_capture(other_run, [0, 1, 7])
    cases = [
        ([str(not_sqlite)], 1, "not an SQLite file"),
        ([str(foreign)], 1, "not an Nsight Systems export"),
        ([str(v4)], 1, "export schema version '4.0.0' is not one this gpuprof reads"),
        ([str(other_run)], 1, "kernels in `gpuprof step` 7, which the run does not have "
                              "(its steps: 0–1)"),
        ([str(tmp_path / "none.sqlite")], 1, "no such file"),
        ([str(v4), "--run", "99"], 1, f"no run 99 in gpuprof.db (run ids: {run_id})"),
        ([str(v4), "--run", "abc"], 2, "--run must be a run id"),
        ([str(v4), "--db", str(tmp_path / "nope.db")], 1, "no such file"),
        ([], 2, "file is required"),
    ]
    for args, code, message in cases:
        proc = cli("nsys-import", *args, cwd=tmp_path)
        assert proc.returncode == code, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
    assert kernel_rows(db) == []


def test_help_lists_the_command(tmp_path):
    proc = cli("--help")
    assert proc.returncode == 0
    assert "nsys-import" in proc.stdout
    sub = cli("nsys-import", "--help")
    assert sub.returncode == 0
    assert "--replace" in sub.stdout and "--capture-range=cudaProfilerApi" in sub.stdout
