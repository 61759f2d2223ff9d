"""gpuprof.HFTrainerCallback against the real Hugging Face Trainer (transformers 5 +
accelerate, CPU): steps are the trainer's optimizer steps (gradient accumulation makes one),
evaluations during training are kept out of the steps and reported apart, the DataLoader wait
and the FLOP count work, bad options fail when the callback is made."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gpuprof_testutil import db_rows as rows
import gpuprof

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

BATCH, SAMPLES = 32, 320


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def train(tmp_path: Path, accumulate: int = 1, eval_steps: int = 4, **options):
    torch.manual_seed(0)
    data = [{"x": torch.randn(64), "labels": torch.randn(1)} for _ in range(SAMPLES)]
    callback = gpuprof.HFTrainerCallback("hf", db=str(tmp_path / "hf.db"), gpu="none",
                                         **options)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH, num_train_epochs=2,
        gradient_accumulation_steps=accumulate, eval_strategy="steps", eval_steps=eval_steps,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        logging_strategy="no", learning_rate=1e-3)
    trainer = transformers.Trainer(model=Net(), args=args, train_dataset=data,
                                   eval_dataset=data[:3 * BATCH], callbacks=[callback])
    trainer.train()
    return callback


def one_batch_flops() -> int:
    net = Net()
    with FlopCounterMode(display=False) as counter:
        net(torch.randn(BATCH, 64), torch.randn(BATCH, 1))["loss"].backward()
    return counter.get_total_flops()


def test_train_is_one_run_of_optimizer_steps_with_evaluations_kept_apart(tmp_path):
    cb = train(tmp_path, summary=False)
    db, run = tmp_path / "hf.db", cb.profile.run_id
    assert rows(db, "SELECT status FROM runs WHERE run_id=?", run) == [("ok",)]
    steps = rows(db, "SELECT step, start_ns, end_ns, wait_ns, wait_source, forward_calls, "
                     "backward_calls, optimizer_calls FROM steps WHERE run_id=? ORDER BY step",
                 run)
    assert len(steps) == 2 * SAMPLES // BATCH
    assert {s[5:] for s in steps} == {(1, 1, 1)}  # no evaluation forward in a step
    assert {s[4] for s in steps} == {"dataloader"}
    # evaluations after steps 4, 8, 12, 16 and 20, three batches each
    (diag,), = rows(db, "SELECT message FROM diagnostics WHERE run_id=? AND "
                        "source='evaluation'", run)
    assert diag.startswith("evaluation: 5 loops") and "15 forward calls" in diag, diag
    for step, start, end, wait, *_ in steps:
        walls = [r[0] for r in rows(db, "SELECT wall_ns FROM phases WHERE run_id=? AND step=?",
                                    run, step)]
        assert sum(walls) + (wait or 0) <= end - start
    assert rows(db, "SELECT flops_per_step, flops_method FROM runs WHERE run_id=?", run) == [
        (one_batch_flops(), "counted")]
    assert cb.profile.summary is not None


def test_gradient_accumulation_is_one_step_per_optimizer_step(tmp_path):
    cb = train(tmp_path, accumulate=2, summary=False)
    db, run = tmp_path / "hf.db", cb.profile.run_id
    assert rows(db, "SELECT forward_calls, backward_calls, optimizer_calls FROM steps WHERE "
                    "run_id=?", run) == [(2, 2, 1)] * (2 * (SAMPLES // BATCH // 2))  # 2 epochs
    assert rows(db, "SELECT flops_per_step FROM runs WHERE run_id=?", run) == [
        (2 * one_batch_flops(),)]


def test_bad_options_fail_when_the_callback_is_made(tmp_path):
    with pytest.raises(ValueError, match="host_hz"):
        gpuprof.HFTrainerCallback("x", db=str(tmp_path / "h.db"), host_hz=1000)
    assert not (tmp_path / "h.db").exists()
