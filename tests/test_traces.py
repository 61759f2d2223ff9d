"""Kernel traces on a CPU run through the public API: profile(trace_every_n_steps=,
trace_range=, continuous_traces_hz=) record the CPU operators (torch.profiler, CPU activities)
of the traced steps only; sdpa_suboptimal and kernel_drift fire from them; `gpuprof insights`
shows the top operators; bad options are clear errors; prof.nsys_capture() without CUDA runs
the block and says why nothing was marked.

Runs are recorded in a child interpreter (tests/traces_train.py): a crash in torch.profiler's
native code fails the test instead of aborting pytest.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import gpuprof
from gpuprof_testutil import cuda_available, run_cli

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(cuda_available(), reason="CPU-run behaviour (kernels on CUDA)")


def record(db: Path, model: str = "mlp", steps: int = 12, mode: str = "auto",
           **options) -> int:
    proc = subprocess.run(
        [sys.executable, str(HERE / "traces_train.py"), str(db), model, str(steps), mode,
         json.dumps(options)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"recording failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return int(proc.stdout.split()[-1])


def query(db: Path, sql: str, *params) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def traced_steps(db: Path, run_id: int) -> set[int]:
    return {r[0] for r in query(db, "SELECT DISTINCT step FROM cpu_ops WHERE run_id=?", run_id)}


def insights_json(db: Path, run_id: int) -> dict:
    return json.loads(run_cli("insights", str(db), str(run_id), "--json", check=True).stdout)


def rule(doc: dict, rule_id: str) -> tuple[dict | None, str | None]:
    fired = [i for i in doc["insights"] if i["rule_id"] == rule_id]
    skipped = [n["reason"] for n in doc["not_evaluated"] if n["rule_id"] == rule_id]
    return (fired[0] if fired else None), (skipped[0] if skipped else None)


def test_every_n_steps_traces_the_warmup_and_every_nth_step(tmp_path):
    db = tmp_path / "t.db"
    run = record(db, steps=12, trace_every_n_steps=4)
    assert traced_steps(db, run) == {0, 1, 4, 5, 8}
    # Each traced step's window lies inside that step's own row of the steps table.
    steps = {r[0]: (r[1], r[2]) for r in query(
        db, "SELECT step, start_ns, end_ns FROM steps WHERE run_id=?", run)}
    assert len(steps) == 12
    for step, start, end, name, calls, self_ns, cpu_ns, source in query(
            db, "SELECT step, window_start_ns, window_end_ns, name, calls, self_cpu_ns, "
                "cpu_ns, source FROM cpu_ops WHERE run_id=?", run):
        assert source == "torch_profiler"
        assert calls >= 1 and self_ns >= 0 and (cpu_ns is None or cpu_ns >= self_ns), name
        s_start, s_end = steps[step]
        assert start <= s_end and end >= s_start, (step, name)
    names = {r[0] for r in query(db, "SELECT name FROM cpu_ops WHERE run_id=? AND step=4", run)}
    assert {"aten::addmm", "aten::relu"} <= names, names  # the forward's operators
    assert any("mse" in n or "mean" in n for n in names), names
    status = query(db, "SELECT source, available, backend, reason FROM telemetry_status "
                       "WHERE run_id=? AND source IN ('kernels', 'cpu_ops')", run)
    by_name = {r[0]: r for r in status}
    assert by_name["cpu_ops"][1] == 1 and "torch_profiler" in by_name["cpu_ops"][2]
    assert by_name["kernels"][1] == 0 and "CPU run" in by_name["kernels"][3]


def test_trace_range_traces_exactly_those_steps(tmp_path):
    db = tmp_path / "t.db"
    run = record(db, steps=10, trace_range=[3, 6])
    assert traced_steps(db, run) == {3, 4, 5}


def test_manual_steps_are_traced_by_their_own_index(tmp_path):
    db = tmp_path / "t.db"
    run = record(db, steps=8, mode="manual", trace_range=[2, 4])
    assert traced_steps(db, run) == {2, 3}
    stored = {r[0] for r in query(db, "SELECT step FROM steps WHERE run_id=?", run)}
    assert {2, 3} <= stored


@pytest.mark.parametrize("model, mode", [("mlp", "loader"), ("bare", "auto"),
                                         ("bare", "loader")])
def test_steps_switch_at_the_loader_or_backward_without_modules(tmp_path, model, mode):
    """The profiler switches at the first loader fetch, forward or backward after the
    optimizer step: a loop over a DataLoader, and one with no nn.Module at all, trace the
    same steps, each with its backward's operators (a loop with neither modules nor a
    DataLoader switches at the backward, so its forward counts to the step before)."""
    db = tmp_path / "t.db"
    run = record(db, model=model, steps=10, mode=mode, trace_every_n_steps=4)
    assert traced_steps(db, run) == {0, 1, 4, 5, 8}
    for step in (1, 4, 5):
        names = {r[0] for r in query(db, "SELECT name FROM cpu_ops WHERE run_id=? AND step=?",
                                     run, step)}
        assert any("backward" in n.lower() or "Backward" in n for n in names), (step, names)
        assert names & {"aten::addmm", "aten::mm", "aten::matmul"}, (step, names)


def test_an_evaluation_after_a_traced_step_is_in_no_steps_operators(tmp_path):
    db = tmp_path / "t.db"
    run = record(db, steps=10, mode="eval", trace_every_n_steps=4)
    assert traced_steps(db, run) == {0, 1, 4, 5, 8}
    names = {r[0] for r in query(db, "SELECT name FROM cpu_ops WHERE run_id=?", run)}
    assert "aten::addmm" in names
    assert "aten::cumsum" not in names, sorted(names)


def test_untraced_run_has_no_operators_and_says_why(tmp_path):
    db = tmp_path / "t.db"
    run = record(db, steps=6)
    assert query(db, "SELECT COUNT(*) FROM cpu_ops WHERE run_id=?", run) == [(0,)]
    fired, reason = rule(insights_json(db, run), "sdpa_suboptimal")
    assert fired is None and "trace" in reason, reason


def test_continuous_mode_on_a_cpu_run_is_explained(tmp_path):
    db = tmp_path / "t.db"
    run = record(db, steps=4, continuous_traces_hz=2.0)
    diags = [r[0] for r in query(db, "SELECT message FROM diagnostics WHERE run_id=? AND "
                                     "source='kernels'", run)]
    assert any("continuous_traces_hz" in m and "CPU run" in m for m in diags), diags


def test_handwritten_attention_fires_sdpa_suboptimal_and_fused_does_not(tmp_path):
    db = tmp_path / "t.db"
    manual = record(db, model="attention", steps=8, trace_every_n_steps=2)
    fused = record(db, model="sdpa", steps=8, trace_every_n_steps=2)
    fallback = record(db, model="sdpa3d", steps=8, trace_every_n_steps=2)
    fired, _ = rule(insights_json(db, manual), "sdpa_suboptimal")
    assert fired is not None, insights_json(db, manual)["not_evaluated"]
    assert fired["evidence"]["basis"] == "cpu_ops"
    assert fired["evidence"]["share"] > 0.2
    assert fired["evidence"]["sdpa_math_fallback"] is False
    assert "operator" in fired["message"] and "unfused" in fired["message"]
    # F.scaled_dot_product_attention on 3-D inputs takes torch's math path: still unfused,
    # and the message says why.
    fired, _ = rule(insights_json(db, fallback), "sdpa_suboptimal")
    assert fired is not None
    assert fired["evidence"]["sdpa_math_fallback"] is True
    assert "fell back to its math path" in fired["message"]
    fired, reason = rule(insights_json(db, fused), "sdpa_suboptimal")
    assert fired is None and reason is None  # evaluated, passed: a fused kernel ran
    names = {r[0] for r in query(db, "SELECT name FROM cpu_ops WHERE run_id=?", fused)}
    assert any("flash" in n or "efficient" in n for n in names), sorted(names)


def test_growing_operator_fires_kernel_drift(tmp_path):
    db = tmp_path / "t.db"
    run = record(db, model="growing", steps=16, trace_every_n_steps=2)
    fired, reason = rule(insights_json(db, run), "kernel_drift")
    assert fired is not None, reason
    assert fired["evidence"]["basis"] == "cpu_ops"
    assert fired["evidence"]["growth"] > 0.5
    assert fired["message"].startswith("CPU operator drift")


def test_insights_report_lists_the_top_operators(tmp_path):
    db = tmp_path / "t.db"
    run = record(db, model="attention", steps=6, trace_every_n_steps=2)
    text = run_cli("insights", str(db), str(run), check=True).stdout
    assert "Top CPU operators" in text, text
    section = text.split("Top CPU operators", 1)[1]
    assert "aten::bmm" in section or "aten::softmax" in section or "aten::_softmax" in section
    # The top operator's stored self time is the one the report prints first.
    top = query(db, "SELECT name, SUM(self_cpu_ns) s FROM cpu_ops WHERE run_id=? "
                    "GROUP BY name ORDER BY s DESC, name LIMIT 1", run)[0][0]
    lines = section.splitlines()  # [title rest, column header, first row, ...]
    assert "operator" in lines[1] and "self CPU" in lines[1], lines[:3]
    assert lines[2].rstrip().endswith(top), (top, lines[2])


def test_repeated_traced_runs_do_not_crash_the_profiler(tmp_path):
    """torch.profiler is started and stopped at step edges outside optimizer.step(): doing it
    inside the optimizer's post-hook (torch's record_function scope) crashed about half of the
    runs."""
    db = tmp_path / "t.db"
    for _ in range(4):
        run = record(db, steps=6, trace_every_n_steps=1)
        assert traced_steps(db, run) == set(range(6))


@pytest.mark.parametrize("kwargs, pattern", [
    ({"trace_every_n_steps": 0}, "trace_every_n_steps"),
    ({"trace_every_n_steps": -3}, "trace_every_n_steps"),
    ({"trace_every_n_steps": 2.5}, "trace_every_n_steps"),
    ({"trace_every_n_steps": True}, "trace_every_n_steps"),
    ({"trace_range": (5, 2)}, "trace_range"),
    ({"trace_range": (1,)}, "trace_range"),
    ({"trace_range": (-1, 3)}, "trace_range"),
    ({"trace_range": "0:4"}, "trace_range"),
    ({"continuous_traces_hz": 0}, "continuous_traces_hz"),
    ({"continuous_traces_hz": 1000.0}, "continuous_traces_hz"),
    ({"continuous_traces_hz": float("nan")}, "continuous_traces_hz"),
])
def test_bad_trace_options_are_rejected_by_name(tmp_path, kwargs, pattern):
    with pytest.raises((TypeError, ValueError), match=pattern):
        gpuprof.profile("bad", db=str(tmp_path / "t.db"), gpu="none", **kwargs)
    assert not (tmp_path / "t.db").exists()


def test_nsys_capture_without_cuda_runs_the_block_and_says_why(tmp_path):
    import torch
    db = tmp_path / "t.db"
    ran = []
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile("nsys", db=str(db), gpu="none", summary=False) as prof:
        with prof.nsys_capture():
            for _ in range(3):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
                ran.append(1)
    assert len(ran) == 3
    diags = [r[0] for r in query(db, "SELECT message FROM diagnostics WHERE run_id=?",
                                 prof.run_id)]
    assert any("nsys_capture()" in m and "no CUDA device" in m for m in diags), diags
    assert query(db, "SELECT COUNT(*) FROM steps WHERE run_id=?", prof.run_id) == [(3,)]


def test_operator_totals_match_torch_key_averages():
    """The traced step's operators are aggregated natively from torch.profiler's raw events
    (key_averages() costs ~15x more on the training thread); the totals are torch's own."""
    import torch
    from torch import nn

    from gpuprof._traces import _operators

    class KeyAveragesOnly:  # the fallback path: torch's own aggregation of the same profile
        def __init__(self, prof):
            self._prof = prof

        def key_averages(self):
            return self._prof.key_averages()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    for _ in range(3):
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    prof.stop()
    native = {n: (c, s, t) for n, c, s, t in _operators(prof, torch)}
    reference = {n: (c, s, t) for n, c, s, t in _operators(KeyAveragesOnly(prof), torch)}
    assert set(native) == set(reference)
    assert {"aten::addmm", "aten::native_layer_norm", "aten::sum"} <= set(native)
    for name, (calls, self_ns, total_ns) in reference.items():
        got = native[name]
        assert got[0] == calls, (name, got, reference[name])
        # torch rounds to microseconds (floats); the raw events are nanoseconds
        assert abs(got[1] - self_ns) <= 1000 + 0.01 * self_ns, (name, got, reference[name])
        assert abs(got[2] - total_ns) <= 1000 + 0.01 * total_ns, (name, got, reference[name])
