"""Scenario: dataloader workers burn CPU on augmentation; every core is busy, the disk idle.
Expect: dataloader_stall and cpu_bound_dataloader."""

import os

import torch
from torch.utils.data import DataLoader, Dataset

import gpuprof
from _common import args, model_and_optimizer, train


class HeavyAugment(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        x = 0.0
        for k in range(60_000):  # pure-Python "augmentation": CPU-bound
            x += (k * i) % 7
        return torch.full((128,), x / 1e6)


if __name__ == "__main__":
    a = args(__doc__, "cpu-bound-loader")
    torch.set_num_threads(1)
    model, opt = model_and_optimizer()
    # One busy worker per core, so that the whole machine is CPU-bound whatever its size.
    workers = max(2, os.cpu_count() or 2)
    loader = DataLoader(HeavyAugment(), batch_size=8, num_workers=workers, persistent_workers=True)
    with gpuprof.profile(a.name, db=a.db, gpu="mock", host_hz=10):
        it = iter(loader)
        train(model, opt, (next(it) for _ in range(a.steps)))
