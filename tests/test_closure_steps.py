"""Closure-style optimizer steps (``optimizer.step(closure)``: LBFGS, Lightning's automatic
optimization, a hand-written closure): the forward and backward run inside the optimizer step.
Each call is one step, starting at the optimizer's begin; the closure's forward and backward
are the step's forward and backward phases; the optimizer phase is only the optimizer's own
work, so the phases never sum to more than the step and `other` is never negative; the
automatic FLOP count counts such a step. Through the public API, on CPU."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import gpuprof
from gpuprof_testutil import db_rows as rows, run_cli

STEPS = 12


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    return model, torch.randn(512, 256), torch.randn(512, 1)


def make_optimizer(kind: str, model: nn.Module):
    if kind == "lbfgs":
        return torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=1)
    return torch.optim.SGD(model.parameters(), lr=0.01)


def train(kind: str, db: Path, **options) -> int:
    model, x, y = model_and_data()
    opt = make_optimizer(kind, model)

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with gpuprof.profile(f"closure-{kind}", db=str(db), gpu="none", summary=False,
                         **options) as prof:
        for _ in range(STEPS):
            opt.step(closure)
    return prof.run_id


@pytest.mark.parametrize("kind", ["sgd", "lbfgs"])
def test_each_closure_step_is_one_step_whose_phases_fit_in_it(tmp_path, kind):
    db = tmp_path / "c.db"
    run = train(kind, db)
    steps = rows(db, "SELECT step, start_ns, end_ns, wait_ns, forward_calls, backward_calls, "
                     "optimizer_calls FROM steps WHERE run_id=? ORDER BY step", run)
    assert [s[0] for s in steps] == list(range(STEPS))
    phases: dict[int, dict[str, int]] = {}
    for step, name, wall in rows(db, "SELECT step, name, wall_ns FROM phases WHERE run_id=?",
                                 run):
        phases.setdefault(step, {})[name] = wall
    for step, start, end, wait, fwd, bwd, opt in steps:
        assert (fwd, bwd, opt) == (1, 1, 1), step
        p = phases[step]
        assert {"forward", "backward", "optimizer"} <= set(p), (step, p)
        # the phases and the wait never sum to more than the step
        assert sum(p.values()) + (wait or 0) <= end - start, (step, p, wait, end - start)
    if kind == "sgd":  # SGD's own update is far cheaper than the closure's forward+backward
        own = statistics.median(phases[s]["optimizer"] for s in range(3, STEPS))
        work = statistics.median(phases[s]["forward"] + phases[s]["backward"]
                                 for s in range(3, STEPS))
        assert own < work, (own, work)
    doc = json.loads(run_cli("insights", str(db), str(run), "--json", check=True).stdout)
    breakdown = doc["steps"]["breakdown"]
    assert breakdown["other_fraction"] >= 0, breakdown
    assert sum(p["wall_fraction"] for p in breakdown["phases"]) <= 1.0, breakdown


@pytest.mark.parametrize("kind", ["sgd", "lbfgs"])
def test_the_flop_count_counts_a_closure_step(tmp_path, kind):
    model, x, y = model_and_data()
    with FlopCounterMode(display=False) as counter:
        nn.functional.mse_loss(model(x), y).backward()
    expected = counter.get_total_flops()
    db = tmp_path / "c.db"
    run = train(kind, db)
    assert rows(db, "SELECT flops_per_step, flops_method FROM runs WHERE run_id=?", run) == [
        (expected, "counted")]
    diags = [r[0] for r in rows(db, "SELECT message FROM diagnostics WHERE run_id=? AND "
                                    "source='flops'", run)]
    assert any("closure" in m for m in diags), diags


def test_a_manual_step_around_a_closure_keeps_the_optimizer_its_own(tmp_path):
    model, x, y = model_and_data()
    opt = make_optimizer("sgd", model)

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    db = tmp_path / "c.db"
    with gpuprof.profile("closure-manual", db=str(db), gpu="none", summary=False) as prof:
        for i in range(6):
            with prof.step(i):
                opt.step(closure)
    for step, start, end in rows(db, "SELECT step, start_ns, end_ns FROM steps WHERE run_id=?",
                                 prof.run_id):
        walls = [r[0] for r in rows(db, "SELECT wall_ns FROM phases WHERE run_id=? AND step=?",
                                    prof.run_id, step)]
        assert len(walls) == 3 and sum(walls) <= end - start, (step, walls, end - start)
