"""CPU demo: train a small MLP under gpuprof and read the diagnosis.

The dataset sleeps a little per sample (think JPEG decoding on a busy CPU), so the loop
spends much of each step waiting on the loader: gpuprof should say so, with the fix.

    python examples/train_cpu.py            # writes ./gpuprof.db, prints the summary
    gpuprof insights                         # the full report of the latest run
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gpuprof


class SlowDataset(Dataset):
    def __init__(self, n: int, dim: int, classes: int, delay_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i]


def make_model(dim: int, hidden: int, depth: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = []
    d = dim
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), nn.LayerNorm(hidden), nn.ReLU()]
        d = hidden
    layers.append(nn.Linear(d, classes))
    return nn.Sequential(*layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--delay-ms", type=float, default=0.25, help="per-sample loader delay")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--db", default="gpuprof.db")
    p.add_argument("--name", default="cpu-demo")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = SlowDataset(args.steps * args.batch, 256, 10, args.delay_ms / 1000)
    loader = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers)
    model = make_model(256, 512, 4, 10)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    with gpuprof.profile(args.name, db=args.db):
        for xb, yb in loader:
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()


if __name__ == "__main__":
    main()
