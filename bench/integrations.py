"""Cost of gpuprof's trainer callbacks: Lightning's Trainer.fit and Hugging Face's
Trainer.train with and without gpuprof.LightningCallback / gpuprof.HFTrainerCallback.

Not a pass/fail test. Run: `.venv/bin/python bench/integrations.py [--rounds 5] [--steps 60]`.

The same MLP (16 x Linear 256² + ReLU, batch 64, SGD, one thread) is trained for --steps
optimizer steps per fit, without validation, in interleaved rounds (plain, gpuprof; the order
flips every round). Two times per fit: the steps (a clock callback, listed before gpuprof's,
from the first batch's start to the end of training, divided by the steps after the first)
and the whole fit() / train() call, which also holds gpuprof's start and stop (session,
store, hooks; about 20-40 ms once per fit). The first round warms up and is left out.
Reported: median ms per step per mode and the ratios gpuprof / plain, per trainer. gpuprof
runs with gpu="none" (no GPU here), host sampling on, the summary off.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gpuprof

WIDTH, DEPTH, BATCH = 256, 16, 64


def mlp() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


def lightning_fit(steps: int, db: str | None) -> tuple[float, float]:
    import lightning as L

    class Clock(L.Callback):
        t0 = t1 = 0.0

        def on_train_batch_start(self, trainer, module, batch, i):
            if i == 0:
                Clock.t0 = time.perf_counter()

        def on_train_end(self, trainer, module):
            Clock.t1 = time.perf_counter()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    data = TensorDataset(torch.randn(BATCH * steps, WIDTH), torch.randn(BATCH * steps, 1))
    callbacks: list = [Clock()]
    if db is not None:
        callbacks.append(gpuprof.LightningCallback("bench", db=db, gpu="none", summary=False))
    trainer = L.Trainer(max_epochs=1, callbacks=callbacks, accelerator="cpu", devices=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    module, loader = Module(), DataLoader(data, batch_size=BATCH)
    t0 = time.perf_counter()
    trainer.fit(module, loader)
    return (Clock.t1 - Clock.t0) / (steps - 1), (time.perf_counter() - t0) / steps


def hf_train(steps: int, db: str | None, out: str) -> tuple[float, float]:
    import transformers

    class Clock(transformers.TrainerCallback):
        t0 = t1 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                Clock.t0 = time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):
            Clock.t1 = time.perf_counter()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def forward(self, x, labels=None):
            return {"loss": nn.functional.mse_loss(self.net(x), labels)}

    data = [{"x": torch.randn(WIDTH), "labels": torch.randn(1)} for _ in range(BATCH * steps)]
    callbacks: list = [Clock()]
    if db is not None:
        callbacks.append(gpuprof.HFTrainerCallback("bench", db=db, gpu="none", summary=False))
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=BATCH, max_steps=steps, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no",
        learning_rate=1e-3, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=Net(), args=args, train_dataset=data,
                                   callbacks=callbacks)
    t0 = time.perf_counter()
    trainer.train()
    return (Clock.t1 - Clock.t0) / steps, (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "bench.db")
        runners = {"lightning": lambda d: lightning_fit(args.steps, d),
                   "hf_trainer": lambda d: hf_train(args.steps, d, os.path.join(tmp, "hf"))}
        for name, run in runners.items():
            per: dict[str, list[tuple[float, float]]] = {"plain": [], "gpuprof": []}
            for r in range(args.rounds + 1):
                order = ["plain", "gpuprof"] if r % 2 == 0 else ["gpuprof", "plain"]
                for mode in order:
                    t = run(None if mode == "plain" else db)
                    if r > 0:
                        per[mode].append(t)
            results[name] = per
    print(f"torch {torch.__version__}, {args.rounds} rounds x {args.steps} steps per fit, "
          f"1 thread; medians")
    print(f"{'trainer':12} {'plain ms/step':>14} {'gpuprof':>9} {'ratio':>6}   "
          f"{'whole fit: ratio':>16}   per-round step ratios")
    for name, per in results.items():
        step = {m: statistics.median(t[0] for t in v) for m, v in per.items()}
        whole = {m: statistics.median(t[1] for t in v) for m, v in per.items()}
        rounds = " ".join(f"{b[0] / a[0]:.3f}" for a, b in zip(per["plain"], per["gpuprof"]))
        print(f"{name:12} {step['plain'] * 1e3:14.3f} {step['gpuprof'] * 1e3:9.3f} "
              f"{step['gpuprof'] / step['plain']:6.3f}   "
              f"{whole['gpuprof'] / whole['plain']:16.3f}   {rounds}")


if __name__ == "__main__":
    main()
