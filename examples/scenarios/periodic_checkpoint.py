"""Scenario: a checkpoint every 10 steps that takes 200 ms (torch.save, then a write to slow
storage, a sleep here) between one step's optimizer step and the next batch. The time outside
the model is in those steps, not spread over every step as launch overhead would be.
Expect: kernel_launch_overhead as periodic host work (its slow steps, high_step_variance, are
the same cause and folded under it)."""

import os
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpuprof
from _common import GpuBound, args, model_and_optimizer

if __name__ == "__main__":
    a = args(__doc__, "periodic-checkpoint")
    inner, opt = model_and_optimizer()
    model = GpuBound(inner)
    train = DataLoader(TensorDataset(torch.randn(32 * a.steps, 128)), batch_size=32)
    with tempfile.TemporaryDirectory() as tmp, gpuprof.profile(a.name, db=a.db, gpu="mock"):
        for i, (x,) in enumerate(train):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if i % 10 == 4:
                torch.save(model.state_dict(), os.path.join(tmp, "ckpt.pt"))
                time.sleep(0.2)
