"""gpuprof.LightningCallback against the real Lightning (2.6, CPU): steps are the trainer's
optimizer steps (its automatic optimization runs forward and backward inside
optimizer.step(closure)), gradient accumulation makes one step, validation loops are kept out
of the steps and reported apart, the FLOP count and the summary work, a failing fit is a
failed run, bad options fail at construction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

import gpuprof
from gpuprof_testutil import db_rows as rows, run_cli

L = pytest.importorskip("lightning")

BATCH, BATCHES = 32, 10


class Model(L.LightningModule):
    def __init__(self, fail_at: int = -1, fail_in_validation: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
        self.fail_at = fail_at
        self.fail_in_validation = fail_in_validation

    def training_step(self, batch, i):
        if i == self.fail_at:
            raise RuntimeError("bad batch")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, i):
        if self.fail_in_validation and self.current_epoch == 1:
            raise ValueError("bad validation batch")
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(db: Path, epochs: int = 2, accumulate: int = 1, fail_at: int = -1,
        fail_in_validation: bool = False, **options):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(BATCH * BATCHES, 64), torch.randn(BATCH * BATCHES, 1))
    callback = gpuprof.LightningCallback("lightning", db=str(db), gpu="none", **options)
    trainer = L.Trainer(max_epochs=epochs, callbacks=[callback], accelerator="cpu", devices=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=3,
                        accumulate_grad_batches=accumulate)
    trainer.fit(Model(fail_at, fail_in_validation), DataLoader(data, batch_size=BATCH),
                DataLoader(data, batch_size=BATCH))
    return callback


def one_batch_flops() -> int:
    model = Model()
    with FlopCounterMode(display=False) as counter:
        x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 1)
        nn.functional.mse_loss(model.net(x), y).backward()
    return counter.get_total_flops()


def test_fit_is_one_run_of_optimizer_steps_with_validation_kept_apart(tmp_path, capsys):
    db = tmp_path / "l.db"
    cb = fit(db, summary=True)
    run = cb.profile.run_id
    assert rows(db, "SELECT status, run_name FROM runs WHERE run_id=?", run) == [("ok",
                                                                                  "lightning")]
    steps = rows(db, "SELECT step, start_ns, end_ns, wait_ns, forward_calls, backward_calls, "
                     "optimizer_calls FROM steps WHERE run_id=? ORDER BY step", run)
    assert len(steps) == 2 * BATCHES
    # validation forwards are in no step: every step is one training batch
    assert {(s[4], s[5], s[6]) for s in steps} == {(1, 1, 1)}
    for step, start, end, wait, *_ in steps:
        walls = [r[0] for r in rows(db, "SELECT wall_ns FROM phases WHERE run_id=? AND step=?",
                                    run, step)]
        assert sum(walls) + (wait or 0) <= end - start, (step, walls, wait, end - start)
    diags = [r[0] for r in rows(db, "SELECT message FROM diagnostics WHERE run_id=? AND "
                                    "source='evaluation'", run)]
    # the sanity check and one validation per epoch, 3 batches each
    assert len(diags) == 1 and diags[0].startswith("evaluation: 3 loops"), diags
    assert "forward calls; kept out of the training steps" in diags[0]
    # the loader wait is measured inside Lightning's fetcher (torch DataLoader next())
    assert {s[0] for s in rows(db, "SELECT wait_source FROM steps WHERE run_id=? AND step>0",
                               run)} == {"dataloader"}
    # the FLOP count works through the closure
    assert rows(db, "SELECT flops_per_step, flops_method FROM runs WHERE run_id=?", run) == [
        (one_batch_flops(), "counted")]
    doc = json.loads(run_cli("insights", str(db), str(run), "--json", check=True).stdout)
    assert doc["steps"]["breakdown"]["other_fraction"] >= 0
    assert "gpuprof · lightning" in capsys.readouterr().out
    assert cb.profile.summary and "20 steps" in cb.profile.summary


def test_gradient_accumulation_is_one_step_per_optimizer_step(tmp_path):
    db = tmp_path / "l.db"
    cb = fit(db, epochs=1, accumulate=2, summary=False)
    steps = rows(db, "SELECT forward_calls, backward_calls, optimizer_calls FROM steps WHERE "
                     "run_id=?", cb.profile.run_id)
    assert steps == [(2, 2, 1)] * (BATCHES // 2)
    assert rows(db, "SELECT flops_per_step FROM runs WHERE run_id=?", cb.profile.run_id) == [
        (2 * one_batch_flops(),)]


def test_a_failing_fit_is_a_failed_run(tmp_path):
    db = tmp_path / "l.db"
    with pytest.raises(RuntimeError, match="bad batch"):
        fit(db, epochs=1, fail_at=4, summary=False)
    (status, error), = rows(db, "SELECT status, error FROM runs")
    assert status == "failed" and "RuntimeError: bad batch" in error
    assert rows(db, "SELECT COUNT(*) FROM steps") == [(4,)]


def test_a_fit_failing_inside_validation_ends_that_evaluation_with_the_run(tmp_path):
    db = tmp_path / "l.db"
    with pytest.raises(ValueError, match="bad validation batch"):
        fit(db, fail_in_validation=True, summary=False)
    (status, error), = rows(db, "SELECT status, error FROM runs")
    assert status == "failed" and "bad validation batch" in error
    # the sanity check, epoch 0's validation, and epoch 1's that raised: all three ended
    (diag,), = rows(db, "SELECT message FROM diagnostics WHERE source='evaluation'")
    assert diag.startswith("evaluation: 3 loops"), diag
    assert rows(db, "SELECT COUNT(*) FROM steps") == [(2 * BATCHES,)]


def test_bad_options_fail_when_the_callback_is_made(tmp_path):
    with pytest.raises(ValueError, match="sample_hz"):
        gpuprof.LightningCallback("x", db=str(tmp_path / "l.db"), sample_hz=-1)
    with pytest.raises(TypeError):
        gpuprof.LightningCallback("x", db=str(tmp_path / "l.db"), no_such_option=1)
    assert not (tmp_path / "l.db").exists()
