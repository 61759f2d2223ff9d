"""Scenario: dataloader workers burn CPU on augmentation; every core is busy, the disk idle.
Expect: cpu_bound_dataloader, which explains the stall (dataloader_stall, folded under it: more
num_workers would not help, so its advice is not printed)."""

import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

import gpuprof
from _common import args, model_and_optimizer, train


class HeavyAugment(Dataset):
    """Each item costs `cpu_ms` of CPU time (not a fixed amount of work), so that the run is
    long enough for the host readings on a fast machine as on a slow one."""

    def __init__(self, cpu_ms: float) -> None:
        self.cpu_s = cpu_ms / 1000

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        x, k = 0.0, 0
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:  # pure-Python "augmentation": CPU-bound
            for _ in range(500):
                x += (k * i) % 7
                k += 1
        return torch.full((128,), x / 1e6)


if __name__ == "__main__":
    a = args(__doc__, "cpu-bound-loader")
    torch.set_num_threads(1)
    model, opt = model_and_optimizer()
    # One busy worker per core, so that the whole machine is CPU-bound whatever its size.
    workers = max(2, os.cpu_count() or 2)
    # 4 ms of CPU per item and worker: a batch of 8 takes ~32 ms of wall time per step
    # whatever the number of workers, so 40 steps span over a second of host readings.
    loader = DataLoader(HeavyAugment(4.0 * workers), batch_size=8, num_workers=workers,
                        persistent_workers=True)
    with gpuprof.profile(a.name, db=a.db, gpu="mock", host_hz=10):
        it = iter(loader)
        train(model, opt, (next(it) for _ in range(a.steps)))
    # Stop the workers before exiting: orphaned, busy workers would go on burning CPU for
    # seconds (they check for their parent every 5 s) and slow whatever runs next.
    del it, loader
