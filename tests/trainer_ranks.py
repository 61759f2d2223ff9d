"""Two ranks of a trainer's own distributed launch on CPU, for tests/test_trainer_ranks.py.

    python trainer_ranks.py lightning DB      (Lightning's ddp strategy starts the 2nd rank)
    torchrun --nproc-per-node=2 trainer_ranks.py hf DB

Each rank prints "RANK <rank> RUN <run id>"."""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gpuprof

kind, db = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(1)

if kind == "lightning":
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(320, 32), torch.randn(320, 1))
    cb = gpuprof.LightningCallback("ranks", db=db, gpu="none", summary=False)
    trainer = L.Trainer(max_epochs=1, callbacks=[cb], accelerator="cpu", devices=2,
                        strategy="ddp", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), DataLoader(data, batch_size=16))
    print(f"RANK {trainer.global_rank} RUN {cb.profile.run_id}", flush=True)
else:
    import transformers

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, x, labels=None):
            return {"loss": nn.functional.mse_loss(self.net(x), labels)}

    data = [{"x": torch.randn(32), "labels": torch.randn(1)} for _ in range(320)]
    cb = gpuprof.HFTrainerCallback("ranks", db=db, gpu="none", summary=False)
    args = transformers.TrainingArguments(
        output_dir=os.path.join(os.path.dirname(db), "hf"), per_device_train_batch_size=16,
        num_train_epochs=1, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, logging_strategy="no", ddp_backend="gloo")
    trainer = transformers.Trainer(model=Net(), args=args, train_dataset=data, callbacks=[cb])
    trainer.train()
    print(f"RANK {int(os.environ['RANK'])} RUN {cb.profile.run_id}", flush=True)
