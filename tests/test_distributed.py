"""Distributed runs under real torchrun (gloo on CPU): every rank recorded in one shared file,
a group id without user action, clock offsets, DDP bucket timings, and the group insights."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprof_testutil import run_cli

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

SCRIPT = Path(__file__).resolve().parent / "distributed_train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(db: Path, *args: str, nproc: int = 2, launcher: str = "static",
             timeout: float = 240, hook_cache: Path | None = None,
             output: list[str] | None = None) -> list[dict]:
    """Runs the script on `nproc` local ranks; returns each rank's RESULT line. launcher:
    "static" (an explicit master port, no --rdzv-id: torchrun's run id is "none", which names
    no job, so the ranks must agree a group id), "c10d" (c10d rendezvous, no --rdzv-id: run id
    "none", and the workers are told to use torchrun's own store) or "standalone" (a fresh
    rendezvous id). hook_cache: where gpuprof.ddp_hook's native hook is built
    ($GPUPROF_CACHE_DIR); by default an empty directory, so that auto mode's hook is the
    Python one whatever a developer's ~/.cache holds. `output` receives the job's stdout."""
    cmd = [str(TORCHRUN), f"--nproc-per-node={nproc}"]
    if launcher == "standalone":
        cmd += ["--standalone"]
    elif launcher == "c10d":
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    else:
        cmd += [f"--master-port={free_port()}"]
    cmd += [str(SCRIPT), "--db", str(db), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               GPUPROF_CACHE_DIR=str(hook_cache or db.parent / "no-hook-cache"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    if output is not None:
        output.append(proc.stdout)
    # The ranks share one stdout: their lines may run together.
    results = [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", proc.stdout)]
    assert len(results) == nproc, proc.stdout + proc.stderr[-3000:]
    return sorted(results, key=lambda r: r["rank"])


def query(db: Path, sql: str, *params) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def runs(db: Path) -> list[dict]:
    rows = query(db, "SELECT run_id, group_id, rank, world_size, status, config_json FROM runs "
                     "ORDER BY rank")
    return [{"run_id": r[0], "group_id": r[1], "rank": r[2], "world_size": r[3],
             "status": r[4], "dist": json.loads(r[5]).get("distributed", {})} for r in rows]


def group_report(db: Path, group: str) -> dict:
    return json.loads(run_cli("insights", str(db), "--group", group, "--json",
                              check=True).stdout)


def fired(report: dict) -> dict[str, dict]:
    return {i["rule_id"]: i for i in report["insights"]}


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_rank_is_recorded_grouped_and_aligned(tmp_path, nproc):
    # GIVEN plain torchrun (run id "none") with nproc DDP ranks on one fresh file
    db = tmp_path / "g.db"
    results = torchrun(db, "--steps", "12", nproc=nproc)
    rs = runs(db)
    # THEN every rank is a run of one agreed group, with its rank and launcher environment
    assert [r["rank"] for r in rs] == list(range(nproc))
    assert all(r["status"] == "ok" and r["world_size"] == nproc for r in rs)
    groups = {r["group_id"] for r in rs}
    assert len(groups) == 1 and None not in groups, groups
    for r in rs:
        d = r["dist"]
        assert d["local_rank"] == r["rank"] and d["local_world_size"] == nproc
        assert d["torchelastic_run_id"] == "none"
        assert d["group_source"] == "agreed through the process group's store"
        # AND the clock offsets of ranks on one host are within their uncertainty of 0
        assert d["clock_rounds"] == 64 and d["clock_reference_rank"] == 0
        assert abs(d["clock_offset_ns"]) <= d["clock_uncertainty_ns"], d
        assert d["clock_uncertainty_ns"] < 50_000_000
    # AND every rank has its steps, phases and bucket timings (through the hook auto mode put
    # on the DDP model)
    assert all(r["comm_hook"] == "gpuprof_allreduce_hook" for r in results), results
    for r in results:
        steps = query(db, "SELECT COUNT(*) FROM steps WHERE run_id = ?", r["run_id"])[0][0]
        assert steps == 12
        names = {n for (n,) in query(db, "SELECT DISTINCT name FROM phases WHERE run_id = ?",
                                     r["run_id"])}
        assert {"forward", "backward", "optimizer"} <= names
        buckets = query(db, "SELECT COUNT(DISTINCT step), COUNT(DISTINCT bucket), MIN(bytes), "
                            "MIN(end_ns - start_ns) FROM comm_buckets WHERE run_id = ?",
                        r["run_id"])[0]
        assert buckets[0] >= 11 and buckets[1] >= 2, buckets
        assert buckets[2] > 0 and buckets[3] >= 0
    # AND the group report reads every rank, by group id
    report = group_report(db, groups.pop())
    assert len(report["ranks"]) == nproc


# Where the native hook is built for these tests: kept between runs (one build per torch
# version and hook source), outside anyone's ~/.cache.
HOOK_CACHE = Path(__file__).resolve().parent.parent / "build" / "test-ddp-hook"


@pytest.fixture(scope="module")
def native_hook() -> Path:
    """gpuprof.ddp_hook built against this torch, as a user builds it."""
    env = dict(os.environ, GPUPROF_CACHE_DIR=str(HOOK_CACHE))
    proc = subprocess.run([sys.executable, "-m", "gpuprof.ddp_hook", "build"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    status = subprocess.run([sys.executable, "-m", "gpuprof.ddp_hook", "status"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "built" in status.stdout, status.stdout + status.stderr
    return HOOK_CACHE


def test_the_native_hook_times_every_bucket_and_reduces_as_ddp_does(tmp_path, native_hook):
    # GIVEN the native hook built for this torch (python -m gpuprof.ddp_hook build)
    db = tmp_path / "native.db"
    # WHEN a 2-rank gloo DDP job runs in auto mode
    results = torchrun(db, "--steps", "12", hook_cache=native_hook)
    # THEN auto mode put the native hook on the model, and every rank's buckets are timed
    assert all(r["comm_hook"] == "gpuprof_native_allreduce_hook" for r in results), results
    for r in results:
        buckets = query(db, "SELECT COUNT(DISTINCT step), COUNT(DISTINCT bucket), MIN(bytes), "
                            "MIN(end_ns - start_ns), COUNT(*) FROM comm_buckets WHERE run_id = ?",
                        r["run_id"])[0]
        assert buckets[0] >= 11 and buckets[1] >= 2, buckets
        assert buckets[2] > 0 and buckets[3] >= 0
        # AND the run says which hook timed them
        detail = query(db, "SELECT backend FROM telemetry_status WHERE run_id = ? AND "
                           "source = 'comm'", r["run_id"])
        assert detail and "native" in detail[0][0], detail
    # AND the group report has the comm share from them
    group = runs(db)[0]["group_id"]
    assert "comm" in json.dumps(group_report(db, group))
    # AND the weights it trains are DDP's own: those of the same job under DDP's built-in
    # allreduce (no hook at all)
    plain = torchrun(tmp_path / "plain.db", "--steps", "12", "--no-comm-hook")
    for native, builtin in zip(results, plain, strict=True):
        assert native["param_sum"] == pytest.approx(builtin["param_sum"], rel=1e-9), (
            native, builtin)


def test_the_builtin_allreduce_hook_gets_the_native_hook_when_it_is_built(tmp_path,
                                                                         native_hook):
    # GIVEN DDP's built-in ALLREDUCE hook registered inside the profile, the native hook built
    db = tmp_path / "builtin-native.db"
    results = torchrun(db, "--steps", "5", "--builtin-hook", hook_cache=native_hook)
    # THEN the native hook (the same reduction) runs in its place, timed
    assert all(r["comm_hook"] == "gpuprof_native_allreduce_hook" for r in results), results
    for r in results:
        assert query(db, "SELECT COUNT(DISTINCT step) FROM comm_buckets WHERE run_id = ?",
                     r["run_id"])[0][0] >= 4


def test_without_the_native_hook_the_python_hook_times_and_says_how_to_build_it(tmp_path):
    # GIVEN no native hook built (an empty cache)
    db = tmp_path / "py.db"
    results = torchrun(db, "--steps", "4")
    # THEN the Python hook times the buckets, and a note names the command that builds it
    assert all(r["comm_hook"] == "gpuprof_allreduce_hook" for r in results), results
    notes = [m for (m,) in query(db, "SELECT message FROM diagnostics WHERE source = 'comm'")]
    assert any("python -m gpuprof.ddp_hook build" in m for m in notes), notes


def test_rendezvous_id_names_the_group(tmp_path):
    # GIVEN torchrun --standalone (a rendezvous id that names the job)
    db = tmp_path / "r.db"
    torchrun(db, "--steps", "4", "--no-ddp", launcher="standalone")
    rs = runs(db)
    assert len({r["group_id"] for r in rs}) == 1
    assert rs[0]["group_id"] == rs[0]["dist"]["torchelastic_run_id"] != "none"
    assert rs[0]["dist"]["group_source"] == "torchrun rendezvous id"


@pytest.mark.parametrize("launcher,mode,source", [
    ("static", "--manual", "agreed through torchrun's store"),
    ("c10d", "--no-ddp", "agreed through torchrun's store"),
])
def test_group_agreed_when_the_process_group_starts_inside_the_profile(tmp_path, launcher,
                                                                       mode, source):
    # GIVEN the process group initialised inside the block (manual API, or auto mode)
    db = tmp_path / "late.db"
    torchrun(db, "--steps", "5", "--init-late", mode, launcher=launcher)
    rs = runs(db)
    # THEN the ranks still agree a group id (through torchrun's store, at start: the process
    # group's does not exist yet) and align their clocks after the first step that finds the
    # process group initialised
    assert len({r["group_id"] for r in rs}) == 1 and rs[0]["group_id"] is not None
    assert all(r["dist"]["group_source"] == source for r in rs), rs
    assert all("clock_offset_ns" in r["dist"] for r in rs)
    assert all(r["status"] == "ok" for r in rs)


def test_each_rank_reads_the_other_ranks_cpu_apart_from_other_processes(tmp_path):
    # GIVEN 2 ranks on this host under torchrun, long enough for a few host samples (2 Hz)
    db = tmp_path / "cpu.db"
    results = torchrun(db, "--steps", "400", nproc=2)
    per_rank = {}
    for r in results:
        per_rank[r["rank"]] = query(
            db, "SELECT AVG(proc_cpu_pct), AVG(job_cpu_pct), COUNT(job_cpu_pct), "
                "COUNT(proc_cpu_pct) FROM host_samples WHERE run_id = ?", r["run_id"])[0]
    # THEN each rank's host samples carry the job's other rank's CPU (job_cpu_pct) on every
    # sample that has its own
    for rank, (proc, job, n_job, n_proc) in per_rank.items():
        assert n_proc >= 2 and n_job == n_proc, per_rank
        assert job > 5, per_rank  # the other rank trains: it is busy
    # AND what rank 0 read for the others is what rank 1 measured of itself, and back
    for me, other in ((0, 1), (1, 0)):
        job_seen, proc_of_other = per_rank[me][1], per_rank[other][0]
        assert abs(job_seen - proc_of_other) <= max(25.0, 0.35 * proc_of_other), per_rank

    # GIVEN a process no launcher started beside others
    code = ("import time, gpuprof\n"
            f"with gpuprof.profile('alone', db={str(tmp_path / 'alone.db')!r}, gpu='none', "
            "host_hz=20, summary=False, auto=False) as p:\n"
            "    for i in range(6):\n"
            "        with p.step(i):\n"
            "            time.sleep(0.05)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # THEN it has its own CPU and no job figure (NULL, not 0)
    own, job = query(tmp_path / "alone.db",
                     "SELECT COUNT(proc_cpu_pct), COUNT(job_cpu_pct) FROM host_samples")[0]
    assert own >= 2 and job == 0


SPAWN_SCRIPT = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
import gpuprof

def worker(rank, world, db, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    with gpuprof.profile("spawned", db=db, gpu="none", summary=False, host_hz=4.0):
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        for _ in range(600):
            ddp(torch.randn(16, 256)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1], int(sys.argv[2])), nprocs=2)
"""


def test_ranks_started_by_mp_spawn_find_each_other_on_the_host(tmp_path):
    # GIVEN 2 ranks started by torch.multiprocessing.spawn: no launcher environment at all
    script = tmp_path / "spawned.py"
    script.write_text(SPAWN_SCRIPT)
    db = tmp_path / "spawned.db"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    proc = subprocess.run([sys.executable, str(script), str(db), str(free_port())],
                          capture_output=True, text=True, timeout=300,
                          env=dict(env, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rs = runs(db)
    assert [r["rank"] for r in rs] == [0, 1]
    # THEN once the ranks told each other their pids (at start: the process group is up), each
    # reads the other's CPU as the job's, close to what the other measured of itself
    per_rank = {r["rank"]: query(db, "SELECT AVG(proc_cpu_pct), AVG(job_cpu_pct), "
                                     "COUNT(job_cpu_pct), COUNT(proc_cpu_pct) FROM host_samples "
                                     "WHERE run_id = ?", r["run_id"])[0] for r in rs}
    for rank, (proc_cpu, job, n_job, n_proc) in per_rank.items():
        assert n_job >= 2 and n_job >= n_proc - 2, per_rank  # all but the first tick or two
        assert job > 5, per_rank
    for me, other in ((0, 1), (1, 0)):
        assert abs(per_rank[me][1] - per_rank[other][0]) <= max(25.0, 0.35 * per_rank[other][0]), \
            per_rank
    assert not query(db, "SELECT message FROM diagnostics WHERE source = 'host' AND "
                         "level = 'warning'")


def test_a_fresh_shared_file_never_loses_a_rank(tmp_path):
    # GIVEN 4 ranks creating the same new file at once, ten times
    for attempt in range(10):
        db = tmp_path / f"fresh{attempt}.db"
        torchrun(db, "--steps", "2", "--no-ddp", "--manual", nproc=4)
        # THEN every rank recorded its run, every time
        rs = runs(db)
        assert [r["rank"] for r in rs] == [0, 1, 2, 3], (attempt, rs)
        assert query(db, "SELECT COUNT(*) FROM steps")[0][0] == 8
        assert not query(db, "SELECT message FROM diagnostics WHERE level = 'error'")


def test_a_rank_late_before_one_bucket_is_named(tmp_path):
    # GIVEN rank 1 spending 30 ms when the first layer's gradient is ready (its last bucket)
    db = tmp_path / "late_bucket.db"
    torchrun(db, "--steps", "20", "--late-rank", "1", "--late-ms", "30")
    rs = runs(db)
    report = group_report(db, rs[0]["group_id"])
    f = fired(report)
    # THEN bucket_skew names rank 1 and that bucket (the highest index: ready last)
    assert "bucket_skew" in f, report["insights"]
    ev = f["bucket_skew"]["evidence"]
    last_bucket = query(db, "SELECT MAX(bucket) FROM comm_buckets WHERE run_id = ?",
                        rs[1]["run_id"])[0][0]
    assert ev["rank"] == 1 and ev["bucket"] == last_bucket, ev
    assert f"Bucket {last_bucket}: rank 1 is late" in f["bucket_skew"]["message"]


def test_a_uniformly_slower_rank_is_rank_skew(tmp_path):
    # GIVEN rank 1 spending 30 ms more in every forward (DDP makes rank 0 wait for it)
    db = tmp_path / "slow.db"
    torchrun(db, "--steps", "20", "--slow-rank", "1", "--late-ms", "30")
    rs = runs(db)
    f = fired(group_report(db, rs[0]["group_id"]))
    # THEN rank_skew names rank 1 (on work time: its step time is everyone's)
    assert "rank_skew" in f, f
    assert f["rank_skew"]["evidence"]["rank"] == 1
    assert f["rank_skew"]["evidence"]["basis"] == "work_time"
    # AND it quotes what rank 1's own report (stored at its end) found first, with its fix
    lead = query(db, "SELECT rule_id, severity, message, fix FROM insights WHERE run_id = ? AND "
                     "family != 'distributed' AND severity != 'info' ORDER BY ordinal LIMIT 1",
                 rs[1]["run_id"])
    assert lead, "rank 1's 30 ms a step before its forward is a finding of its own"
    rule_id, severity, message, fix = lead[0]
    assert f["rank_skew"]["evidence"]["straggler_insight"] == {"rule_id": rule_id,
                                                               "severity": severity}
    assert f["rank_skew"]["message"].endswith(
        f"its own report leads with [{severity.upper()}] {message}"), f["rank_skew"]["message"]
    assert f["rank_skew"]["fix"] == f"Start with rank 1's own finding ({rule_id}): {fix}"
    # AND rank 0's own report says it waits for rank 1, and does not tell it to shrink its
    # communication: the collectives it waits in are rank 1's delay (comm_dominant, when it
    # fires, is folded under peer_wait)
    own = json.loads(run_cli("insights", str(db), str(rs[0]["run_id"]), "--json",
                             check=True).stdout)
    mine = fired(own)
    assert "peer_wait" in mine, own["insights"]
    assert mine["peer_wait"]["evidence"]["slowest"] == "rank 1"
    assert mine["peer_wait"]["evidence"]["peer_wait_fraction"] > 0.2
    # AND, read after both ended, it quotes rank 1's own leading finding and starts its fix there
    assert mine["peer_wait"]["message"].endswith(
        f"rank 1's own report leads with [{severity.upper()}] {message}"), \
        mine["peer_wait"]["message"]
    assert mine["peer_wait"]["fix"] == f"Start with rank 1's own finding ({rule_id}): {fix}"
    assert "comm_dominant" not in mine, mine["comm_dominant"]["message"]
    # AND rank 1 waits for nobody
    slow = json.loads(run_cli("insights", str(db), str(rs[1]["run_id"]), "--json",
                              check=True).stdout)
    assert "peer_wait" not in fired(slow)
    assert "peer_wait" not in {n["rule_id"] for n in slow["not_evaluated"]}


def test_files_of_one_rank_each_merge_into_one_group(tmp_path):
    # GIVEN a job whose ranks each wrote a file of their own (as nodes with local disks do),
    # rank 1 slower in every forward
    out: list[str] = []
    torchrun(tmp_path / "r{rank}.db", "--steps", "20", "--slow-rank", "1", "--late-ms", "30",
             output=out)
    r0, r1, merged = tmp_path / "r0.db", tmp_path / "r1.db", tmp_path / "all.db"
    # THEN rank 0's summary says its file holds 1 of the 2 ranks, and how to bring them together
    assert (f"1 of 2 ranks are in this file; to compare them all: gpuprof merge all.db {r0} "
            "<the other ranks' files>, then gpuprof insights all.db --group") in out[0], out[0]
    # AND without the other rank its own report cannot say whom it waits for
    alone = json.loads(run_cli("insights", str(r0), "1", "--json", check=True).stdout)
    assert "peer_wait" in {n["rule_id"] for n in alone["not_evaluated"]}
    # WHEN the files are merged
    proc = run_cli("merge", str(merged), str(r0), str(r1), check=True)
    assert proc.stdout.count(f"of {merged} (") == 2, proc.stdout
    assert "merged 2 runs into" in proc.stdout
    rs = runs(merged)
    assert [r["rank"] for r in rs] == [0, 1] and rs[0]["group_id"] == rs[1]["group_id"]
    # THEN every row came along (each table, per rank), insights included
    for table in ("steps", "phases", "comm_buckets", "host_samples", "telemetry_status",
                  "diagnostics", "insights"):
        for src, r in ((r0, rs[0]), (r1, rs[1])):
            want = query(src, f"SELECT COUNT(*) FROM {table}")[0][0]
            got = query(merged, f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", r["run_id"])
            assert got[0][0] == want, (table, src, want, got)
    assert query(merged, "SELECT SUM(end_ns - start_ns) FROM comm_buckets WHERE run_id = ?",
                 rs[1]["run_id"]) == query(r1, "SELECT SUM(end_ns - start_ns) FROM comm_buckets")
    # AND the group report compares the ranks, and rank 0's own report names rank 1
    assert fired(group_report(merged, rs[0]["group_id"]))["rank_skew"]["evidence"]["rank"] == 1
    own = json.loads(run_cli("insights", str(merged), str(rs[0]["run_id"]), "--json",
                             check=True).stdout)
    assert fired(own)["peer_wait"]["evidence"]["slowest"] == "rank 1", own["insights"]
    # AND merging again adds nothing
    again = run_cli("merge", str(merged), str(r1), str(r0), check=True)
    assert "merged 0 runs into" in again.stdout and "(2 already there)" in again.stdout
    assert len(runs(merged)) == 2


def test_export_group_puts_every_rank_in_one_trace_on_one_clock(tmp_path):
    from test_export import validate
    # GIVEN a 2-rank DDP job in one file, rank 1 slower
    db = tmp_path / "job.db"
    torchrun(db, "--steps", "12", "--slow-rank", "1", "--late-ms", "20")
    rs = runs(db)
    # WHEN the group is exported by its run name
    proc = run_cli("export", str(db), "--group", "dist-test", cwd=tmp_path, check=True)
    path = tmp_path / f"{rs[0]['group_id']}.group.trace.json"
    assert proc.stdout.startswith(f"{path.name}\n"), proc.stdout
    assert "2 ranks, 24 steps (clocks aligned to rank 0" in proc.stdout, proc.stdout
    doc = json.loads(path.read_text())
    # THEN it is a valid trace with one process per rank, each with its steps and buckets
    tracks = validate(doc, processes=2)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["gpuprof dist-test (rank 0)", "gpuprof dist-test (rank 1)"]
    by_pid = {pid: [e for e in tracks["steps"] if e["pid"] == pid] for pid in names}
    assert all(len(v) == 12 for v in by_pid.values()), {k: len(v) for k, v in by_pid.items()}
    assert {e["pid"] for e in tracks["comm"]} == set(names)
    # AND the ranks line up: a synchronous job's steps end together (the allreduce), to well
    # under a step
    ends = {pid: [e["ts"] + e["dur"] for e in sorted(v, key=lambda e: e["args"]["step"])]
            for pid, v in by_pid.items()}
    a, b = ends.values()
    gaps = sorted(abs(x - y) for x, y in zip(a[3:], b[3:]))
    step_us = sorted(e["dur"] for e in by_pid[next(iter(by_pid))])[6]
    assert gaps[len(gaps) // 2] < step_us / 4, (gaps, step_us)
    other = doc["otherData"]
    assert other["group_id"] == rs[0]["group_id"] and len(other["ranks"]) == 2
    assert min(r["shift_ns"] for r in other["ranks"]) == 0
    # AND a RUN with --group is a usage error, an unknown group a data error
    both = run_cli("export", str(db), "1", "--group", "dist-test")
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr
    unknown = run_cli("export", str(db), "--group", "nope", "-o", str(tmp_path / "x.json"))
    assert unknown.returncode == 1 and "no runs with group_id 'nope'" in unknown.stderr
    assert not (tmp_path / "x.json").exists()


def test_merge_refuses_bad_input_and_writes_nothing(tmp_path):
    good = tmp_path / "good.db"
    torchrun(good, "--steps", "6", "--no-ddp")
    out = tmp_path / "out.db"
    # A file merged into itself is a usage error
    same = run_cli("merge", str(good), str(good))
    assert same.returncode == 2 and "cannot be merged into itself" in same.stderr, same.stderr
    # A missing or foreign input is a data error, checked before OUT is created
    missing = run_cli("merge", str(out), str(good), str(tmp_path / "nope.db"))
    assert missing.returncode == 1 and "nope.db" in missing.stderr, missing.stderr
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    bad = run_cli("merge", str(out), str(good), str(foreign))
    assert bad.returncode == 1 and "not a gpuprof database" in bad.stderr, bad.stderr
    assert not out.exists()
    # Nothing given to merge is a usage error
    assert run_cli("merge", str(out)).returncode == 2


def test_a_large_model_with_tiny_compute_is_comm_dominant(tmp_path):
    # GIVEN 4M parameters, a batch of 1
    db = tmp_path / "comm.db"
    torchrun(db, "--steps", "12", "--width", "1024", "--depth", "4", "--batch", "1",
             "--bucket-mb", "4")
    for r in runs(db):
        got = {row[0] for row in query(db, "SELECT rule_id FROM insights WHERE run_id = ?",
                                       r["run_id"])}
        assert "comm_dominant" in got, (r["rank"], got)
    # AND comm joins the step breakdown of the per-run report
    out = run_cli("insights", str(db), str(runs(db)[0]["run_id"]), check=True).stdout
    assert "comm" in out


@pytest.mark.parametrize("no_sync", [False, True], ids=["reduce-every-pass", "no_sync"])
def test_comm_dominant_tells_gradient_accumulation_how_to_reduce(tmp_path, no_sync):
    # GIVEN the large model with tiny compute, 4 backward passes per optimizer step, with or
    # without no_sync() on the first three
    db = tmp_path / "acc.db"
    torchrun(db, "--steps", "10", "--width", "1024", "--depth", "4", "--batch", "1",
             "--bucket-mb", "4", "--accumulate", "4", *(["--no-sync"] if no_sync else []))
    for r in runs(db):
        report = json.loads(run_cli("insights", str(db), str(r["run_id"]), "--json",
                                    check=True).stdout)
        comm = {i["rule_id"]: i for i in report["insights"]}.get("comm_dominant")
        assert comm is not None, (r["rank"], [i["rule_id"] for i in report["insights"]])
        ev = comm["evidence"]
        assert ev["backward_passes_per_step"] == 4
        if no_sync:
            # THEN with no_sync() it counts one reduction per step and suggests more
            # micro-batches, not no_sync() again
            assert ev["syncs_per_step"] == 1
            assert "one all-reduce per 4 backward passes" in comm["message"]
            assert "no_sync" not in comm["fix"] and "micro-batches" in comm["fix"]
        else:
            # THEN without it each bucket was reduced after every pass, and no_sync() is the fix
            assert ev["syncs_per_step"] == 4
            assert "all-reduced 4 times a step, after each of its 4 backward passes" in \
                comm["message"]
            assert comm["fix"].startswith("Reduce once a step: run every backward pass")


def test_a_compiled_ddp_model_trains_and_its_buckets_are_timed(tmp_path):
    # GIVEN torch.compile over the DDP model (dynamo's DDPOptimizer splits the graph at the
    # buckets) with the default bucket size
    db = tmp_path / "compiled.db"
    results = torchrun(db, "--steps", "12", "--bucket-mb", "25", "--compile", timeout=600)
    # THEN both ranks trained to the same weights, and every step's bucket was timed
    assert results[0]["param_sum"] == pytest.approx(results[1]["param_sum"], rel=1e-6)
    for r in results:
        steps, buckets = query(db, "SELECT COUNT(DISTINCT step), COUNT(*) FROM comm_buckets "
                                   "WHERE run_id = ?", r["run_id"])[0]
        assert steps >= 11 and buckets >= steps, (steps, buckets)
    assert not query(db, "SELECT message FROM diagnostics WHERE level = 'error'")


@pytest.mark.parametrize("before", [False, True], ids=["inside", "before-profile"])
def test_a_user_comm_hook_still_runs_and_its_result_is_used(tmp_path, before):
    # GIVEN a user hook that replaces the averaged gradient with zeros (registered inside the
    # profile block, or before it starts)
    db = tmp_path / "hook.db"
    args = ["--steps", "6", "--user-hook"] + (["--setup-before"] if before else [])
    results = torchrun(db, *args)
    # THEN the hook ran on every bucket and its result was used: SGD never moved a parameter
    for r in results:
        assert r["hook_calls"] >= 6 and r["params_unchanged"] is True, r
        # AND its buckets were timed
        n = query(db, "SELECT COUNT(*) FROM comm_buckets WHERE run_id = ?", r["run_id"])[0][0]
        assert n == r["hook_calls"]


def test_fsdp_runs_unbroken_and_says_why_comm_is_not_timed(tmp_path):
    # GIVEN FSDP (fully_shard) instead of DDP
    db = tmp_path / "fsdp.db"
    try:
        torchrun(db, "--steps", "4", "--fsdp")
    except AssertionError as e:  # pragma: no cover - torch without CPU FSDP support
        if "fully_shard" in str(e) and "gpuprof" not in str(e):
            pytest.skip(f"FSDP does not run on CPU here: {str(e)[-300:]}")
        raise
    # THEN every rank's run is ok, with no bucket rows and a reason
    for r in runs(db):
        assert r["status"] == "ok"
        assert query(db, "SELECT COUNT(*) FROM comm_buckets WHERE run_id = ?",
                     r["run_id"])[0][0] == 0
        notes = [m for (m,) in query(db, "SELECT message FROM diagnostics WHERE run_id = ? "
                                         "AND source = 'comm'", r["run_id"])]
        assert any("no DistributedDataParallel model" in m for m in notes), notes


def test_comm_hook_false_leaves_ddp_alone(tmp_path):
    # GIVEN profile(comm_hook=False) around a DDP loop
    db = tmp_path / "nohook.db"
    results = torchrun(db, "--steps", "4", "--no-comm-hook")
    # THEN DDP keeps its built-in allreduce (no hook registered) and no bucket is timed
    assert all(not r["comm_hook"] for r in results), results
    assert query(db, "SELECT COUNT(*) FROM comm_buckets")[0][0] == 0
    assert all(json.loads(c)["comm_hook"] is False
               for (c,) in query(db, "SELECT config_json FROM runs"))


def test_profiling_only_rank_0_never_hangs_the_job(tmp_path):
    # GIVEN a job where only rank 0 runs gpuprof (the others train unprofiled)
    db = tmp_path / "only0.db"
    results = torchrun(db, "--steps", "6", "--only-rank", "0")
    # THEN the job finishes; rank 0's run is stored, its clocks left unaligned with the reason
    # after one bounded wait (no collective was entered that the others would not enter)
    rs = runs(db)
    assert [r["rank"] for r in rs] == [0] and rs[0]["status"] == "ok"
    assert "not every rank runs gpuprof" in rs[0]["dist"]["clock_unaligned_reason"]
    assert "clock_offset_ns" not in rs[0]["dist"]
    assert results[0]["seconds"] < 60, results


def test_the_builtin_allreduce_hook_registered_inside_is_timed(tmp_path):
    # GIVEN DDP's built-in ALLREDUCE comm hook registered inside the profile block
    db = tmp_path / "builtin.db"
    results = torchrun(db, "--steps", "5", "--builtin-hook")
    # THEN gpuprof's timed equivalent runs in its place and every rank's buckets are timed
    assert all(r["comm_hook"] == "gpuprof_allreduce_hook" for r in results), results
    for r in results:
        steps = query(db, "SELECT COUNT(DISTINCT step) FROM comm_buckets WHERE run_id = ?",
                      r["run_id"])[0][0]
        assert steps >= 4
