"""A DeepSpeed training run on CPU under gpuprof.wrap_deepspeed_engine, for
tests/test_deepspeed.py: 20 micro-batches of 16, gradient accumulation 2 (10 optimizer steps),
an evaluation (engine.eval() ... engine.train()) after every 8th micro-batch.

    python deepspeed_train.py DB          (one process: initialises gloo itself)
    torchrun --nproc-per-node=2 deepspeed_train.py DB
Prints "RUN <run id> <rank>"."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

if "RANK" not in os.environ:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("DS_TEST_PORT", "29531"))
dist.init_process_group("gloo")

import deepspeed  # noqa: E402  (after the process group: DeepSpeed then uses it)

import gpuprof  # noqa: E402

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
world = dist.get_world_size()
config = {"train_batch_size": 32 * world, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config=config)
engine = gpuprof.wrap_deepspeed_engine(engine, "ds", db=sys.argv[1], gpu="none", summary=False)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
    torch.randn(320, 64), torch.randn(320, 1)), batch_size=16)
for i, (x, y) in enumerate(data):
    engine.backward(nn.functional.mse_loss(engine(x), y))
    engine.step()
    if i % 8 == 7:
        engine.eval()
        with torch.no_grad():
            for _ in range(3):
                engine(x)
        engine.train()
engine.close()  # ends the gpuprof run
print("RUN", engine.gpuprof.run_id, dist.get_rank(), flush=True)
dist.destroy_process_group()
