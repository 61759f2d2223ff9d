"""Scenario: a small CNN fed by a DataLoader whose workers each take longer to build a batch than
the model takes to train on one. With 2 workers the batches arrive in pairs, so the steps
alternate between a long wait and none (e.g. ~150 ms / ~4 ms): a bimodal step time whose median
says little about throughput.
Expect: dataloader_stall (the loader is the cause; its slow steps are not "variance").

Options beyond the common ones: --workers, --item-ms (time each worker spends per sample, an
I/O-like wait), --batch. The loop's own wall time per step (perf_counter, steps 3.. like
gpuprof's steady state) is printed as `loop: <ns per step> ns/step over <n> steps`, so that a
test can compare gpuprof's regression sizes with the true ratio."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gpuprof
from _common import args as common_args


class SlowImages(Dataset):
    """3×32×32 images, each costing `item_ms` of wall time in the worker (reading / decoding)."""

    def __init__(self, item_ms: float) -> None:
        self.item_s = item_ms / 1000

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        if self.item_s > 0:
            time.sleep(self.item_s)
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 32, 32, generator=g), i % 10


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def parse():
    import argparse
    import sys
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--workers", type=int, default=2)
    extra.add_argument("--item-ms", type=float, default=20.0)
    extra.add_argument("--batch", type=int, default=8)
    mine, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    a = common_args(__doc__, "paired-loader")
    for k, v in vars(mine).items():
        setattr(a, k, v)
    return a


if __name__ == "__main__":
    a = parse()
    torch.set_num_threads(1)
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(SlowImages(a.item_ms), batch_size=a.batch, num_workers=a.workers,
                        persistent_workers=a.workers > 0)
    marks = []
    with gpuprof.profile(a.name, db=a.db, gpu="mock"):
        for step, (x, y) in enumerate(loader):
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            marks.append(time.perf_counter_ns())
            if step + 1 == a.steps:
                break
    del loader  # stops the persistent workers now, not seconds after the process exits
    steady = marks[2:]  # like gpuprof: steps 3.. (step k ends at marks[k])
    per_step = (steady[-1] - steady[0]) / (len(steady) - 1)
    print(f"loop: {per_step:.0f} ns/step over {len(steady) - 1} steps", flush=True)
