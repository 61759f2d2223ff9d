"""`gpuprof export --format perfetto`: a real CPU run written as Chrome trace-event JSON (the
JSON Object Format that ui.perfetto.dev and chrome://tracing open), validated against the
format and against the stored run.

The run is recorded through the public API; the CLI is the installed one, or GPUPROF_CLI (a
build tree's binary), or the first `gpuprof` on PATH.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from torch import nn

import gpuprof
from gpuprof_testutil import db_rows as rows, gpuprof_exe

STEPS = 6


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    exe = os.environ.get("GPUPROF_CLI") or shutil.which("gpuprof") or gpuprof_exe()
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def record_run(db: Path, name: str = "export", **options) -> int:
    """A tiny training loop over a DataLoader: STEPS optimizer steps with loader waits."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(4 * STEPS, 16), torch.randn(4 * STEPS, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with gpuprof.profile(name, db=str(db), gpu="none", summary=False, **options) as prof:
        for x, y in loader:
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return prof.run_id


def record_run_in_subprocess(db: Path, **options) -> int:
    """record_run in a child interpreter: torch.profiler's capture (CPU operators) runs native
    code whose crash must fail this test, not abort the whole pytest process."""
    code = ("import sys, json; sys.path[:0] = json.loads(sys.argv[1]); import test_export; "
            "print(test_export.record_run(__import__('pathlib').Path(sys.argv[2]), "
            "**json.loads(sys.argv[3])))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(sys.path), str(db),
                           json.dumps(options)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"recording failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return int(proc.stdout.split()[-1])


def ns(us: float) -> int:
    """Trace microseconds back to the stored nanoseconds (the writer keeps them exact)."""
    return round(us * 1000)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate(doc, processes: int = 1) -> dict[str, list[dict]]:
    """Checks `doc` against the trace-event format (with `processes` named processes); returns
    the events by thread name ('C' events by counter name under 'counter:<name>')."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert doc["displayTimeUnit"] in ("ms", "ns")
    thread_names: dict[tuple[int, int], str] = {}
    process_names: dict[int, str] = {}
    slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    by_track: dict[str, list[dict]] = defaultdict(list)
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        assert ph in ("M", "X", "i", "C"), e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("name"), str), e
        if ph == "M":
            assert isinstance(e.get("args"), dict), e
            if e["name"] == "process_name":
                process_names[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                thread_names[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        assert is_number(e.get("ts")), e
        if ph in ("X", "i"):
            assert isinstance(e.get("tid"), int), e
        if ph == "X":
            assert is_number(e.get("dur")) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
        if ph == "i":
            assert e.get("s", "t") in ("t", "p", "g"), e
        if ph == "C":
            assert isinstance(e.get("args"), dict) and e["args"], e
            assert all(is_number(v) for v in e["args"].values()), e
            by_track["counter:" + e["name"]].append(e)
    assert len(process_names) == processes, process_names
    for e in doc["traceEvents"]:
        if e["ph"] in ("X", "i"):
            key = (e["pid"], e["tid"])
            assert key in thread_names, f"thread {key} has no thread_name: {e}"
            by_track[thread_names[key]].append(e)
    # Slices on one thread nest: none starts inside another and ends after it.
    for key, spans in slices.items():
        open_ends: list[int] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], \
                f"partial overlap on {thread_names[key]} at {start} ns"
            open_ends.append(end)
    return by_track


def test_export_writes_a_trace_of_the_run(tmp_path):
    # GIVEN a short CPU training run over a DataLoader
    db = tmp_path / "gpuprof.db"
    run_id = record_run(db)

    # WHEN it is exported without -o
    proc = cli("export", str(db), "--format", "perfetto", cwd=tmp_path)

    # THEN <run name>-<run id>.trace.json is written in the current directory and named
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / f"export-{run_id}.trace.json"
    assert proc.stdout.splitlines()[0] == out.name
    assert "ui.perfetto.dev" in proc.stdout
    doc = json.loads(out.read_text())
    tracks = validate(doc)

    # AND it holds the run: one step slice per stored step, at the stored times
    steps = rows(db, "SELECT step, start_ns, end_ns, wait_ns FROM steps WHERE run_id = ? "
                     "ORDER BY step", run_id)
    assert len(steps) == STEPS
    slices = sorted(tracks["steps"], key=lambda e: e["ts"])
    assert len(slices) == len(steps)
    for (step, start, end, _), e in zip(steps, slices):
        assert e["args"]["step"] == step
        assert (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) == (start, end)

    # AND the phases lie inside their steps, CPU time only (a CPU run has no GPU time)
    spans = {step: (start, end) for step, start, end, _ in steps}
    names = {e["name"] for e in tracks["phases"]}
    assert {"forward", "backward", "optimizer"} <= names
    for e in tracks["phases"]:
        start, end = spans[e["args"]["step"]]
        assert start <= ns(e["ts"]) and ns(e["ts"]) + ns(e["dur"]) <= end
        assert "cpu_ms" in e["args"] and "gpu_ms" not in e["args"]

    # AND each measured loader wait is a slice of the dataloader track
    waits = [w for *_, w in steps if w is not None]
    assert len(tracks["dataloader"]) == len(waits)

    # AND unknown values are left out: no GPU was sampled, so no GPU counter exists
    assert not [t for t in tracks if t.startswith("counter:GPU")]
    cpu = rows(db, "SELECT count(*) FROM host_samples WHERE run_id = ? AND cpu_pct IS NOT NULL",
               run_id)[0][0]
    assert len(tracks.get("counter:host CPU", [])) == cpu

    # AND the run's start anchors the time base
    start_unix_ns, pid = rows(db, "SELECT start_unix_ns, pid FROM runs WHERE run_id = ?",
                              run_id)[0]
    assert doc["otherData"]["start_unix_ns"] == start_unix_ns
    assert doc["otherData"]["run_id"] == run_id
    process = [e for e in doc["traceEvents"] if e["name"] == "process_name"][0]
    assert process["pid"] == pid
    assert process["args"]["name"] == f"gpuprof export (run {run_id})"


def test_export_to_stdout_by_run_id_and_the_chrome_alias(tmp_path):
    # GIVEN two runs in ./gpuprof.db
    db = tmp_path / "gpuprof.db"
    first = record_run(db, name="first")
    record_run(db, name="second")

    # WHEN the first is exported by its id alone, to stdout, as 'chrome'
    proc = cli("export", str(first), "--format", "chrome", "-o", "-", cwd=tmp_path)

    # THEN stdout is the trace of that run, and nothing else
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["otherData"]["run_name"] == "first"

    # AND by default the newest run is exported, to the -o file given
    out = tmp_path / "t.json"
    proc = cli("export", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["otherData"]["run_name"] == "second"
    assert proc.stdout.splitlines()[0] == str(out)


@pytest.mark.skipif("trace_every_n_steps" not in str(inspect.signature(gpuprof.profile)),
                    reason="this gpuprof has no kernel traces (trace_every_n_steps)")
def test_cpu_operator_windows_of_traced_steps(tmp_path):
    # GIVEN a CPU run whose steps 0, 1 and every 2nd are traced (torch.profiler CPU operators)
    db = tmp_path / "gpuprof.db"
    run_id = record_run_in_subprocess(db, trace_every_n_steps=2)
    windows = rows(db, "SELECT DISTINCT window_start_ns, window_end_ns FROM cpu_ops "
                       "WHERE run_id = ?", run_id)
    if not windows:
        pytest.skip("the run stored no cpu_ops rows (the CPU-operator capture did not run)")

    # WHEN it is exported
    proc = cli("export", str(db), "-o", "-")
    assert proc.returncode == 0, proc.stderr
    tracks = validate(json.loads(proc.stdout))

    # THEN each traced window is one slice of the CPU operators track, with its top operators
    slices = tracks["CPU operators"]
    assert sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in slices) == sorted(windows)
    for e in slices:
        assert e["args"]["top"] and "self_cpu_ms" in e["args"]["top"][0]
        assert "gpu_ms" not in e["args"]
    assert len(tracks["counter:CPU operator self time"]) == len(windows)


def test_export_errors(tmp_path):
    db = tmp_path / "gpuprof.db"
    record_run(db)

    # No such DB: a data error naming it.
    proc = cli("export", str(tmp_path / "missing.db"))
    assert proc.returncode == 1 and "no such file" in proc.stderr

    # No such run: a data error listing the run ids.
    proc = cli("export", str(db), "99")
    assert proc.returncode == 1 and "no run 99" in proc.stderr and "run ids: 1" in proc.stderr

    # A RUN that is not a run id, an unknown format: usage errors (the formats are listed).
    assert cli("export", str(db), "abc").returncode == 2
    proc = cli("export", str(db), "--format", "pprof")
    assert proc.returncode == 2
    assert "unknown --format 'pprof'" in proc.stderr and "perfetto" in proc.stderr
    assert cli("export", str(db), "-o", "").returncode == 2

    # An -o that cannot be written: a data error, and no file (nor a partial one) is left.
    target = tmp_path / "no-such-dir" / "t.json"
    proc = cli("export", str(db), "-o", str(target))
    assert proc.returncode == 1 and "cannot write" in proc.stderr
    assert not target.parent.exists()
    proc = cli("export", str(db), "-o", str(tmp_path))
    assert proc.returncode == 1 and "is a directory" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if "partial" in p.name) == []


def trace_processor_shell() -> str | None:
    """A local trace_processor_shell: $GPUPROF_TRACE_PROCESSOR or one on PATH. The perfetto
    package downloads its binary on first use, which needs the internet."""
    path = os.environ.get("GPUPROF_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")
    return path if path and os.path.isfile(path) else None


def test_perfettos_trace_processor_loads_the_export(tmp_path):
    tp_module = pytest.importorskip("perfetto.trace_processor",
                                    reason="the perfetto package is not installed")
    shell = trace_processor_shell()
    if shell is None:
        pytest.skip("no trace_processor_shell here: the perfetto package downloads it on first "
                    "use (no internet); set GPUPROF_TRACE_PROCESSOR to a local binary")
    # GIVEN an exported run
    db = tmp_path / "gpuprof.db"
    record_run(db)
    out = tmp_path / "t.json"
    assert cli("export", str(db), "-o", str(out)).returncode == 0

    # WHEN Perfetto's trace processor loads it
    config = tp_module.TraceProcessorConfig(bin_path=shell)
    with tp_module.TraceProcessor(trace=str(out), config=config) as tp:
        steps = list(tp.query("SELECT s.name FROM slice s JOIN thread_track tt "
                              "ON s.track_id = tt.id JOIN thread USING (utid) "
                              "WHERE thread.name = 'steps'"))
        errors = list(tp.query("SELECT name, value FROM stats "
                               "WHERE severity IN ('error', 'data_loss') AND value > 0"))

    # THEN every step is a slice and nothing was dropped as malformed
    assert len(steps) == STEPS
    assert errors == []
