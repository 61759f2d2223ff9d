"""Cost of gpuprof's DataLoader hooks per next(), side by side with plain torch.

The cheapest DataLoader there is (batch_size=None, an in-memory dataset, num_workers=0), so
the hooks' share is as large as it gets. Modes, interleaved per round in one process:
plain; gpuprof with auto=False (its threads run, nothing is patched: the baseline of the
hooks); gpuprof with flops_per_step declared (the native hooks: two clock reads and two ring
pushes per next()); gpuprof counting FLOPs automatically (the hooks also call the FLOP
count's Python callback at each edge, which returns at once outside the counted step). The
order of the modes rotates per round.

    .venv/bin/python bench/dataloader_hook.py [--rounds 5] [--batches 100000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import gpuprof


class Indices(Dataset):
    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> int:
        return i


def ns_per_next(loader: DataLoader, n: int) -> float:
    it = iter(loader)
    t = time.perf_counter_ns()
    for _ in range(n):
        next(it)
    return (time.perf_counter_ns() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=100_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(Indices(), batch_size=None)
    db = Path(tempfile.mkdtemp()) / "bench.db"
    results: dict[str, list[float]] = {"plain": [], "no_hooks": [], "declared": [],
                                       "counted": []}
    modes = list(results)
    for r in range(args.rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            if mode == "plain":
                results[mode].append(ns_per_next(loader, args.batches))
                continue
            extra = {} if mode == "counted" else {"flops_per_step": 1e6}
            with gpuprof.profile("dl-bench", db=db, gpu="none", host=False, summary=False,
                                 auto=mode != "no_hooks", **extra):
                results[mode].append(ns_per_next(loader, args.batches))
    plain = statistics.median(results["plain"])
    print(f"{'mode':<10} {'median ns/next()':>17} {'added ns':>9} {'ratio':>7}")
    for mode, values in results.items():
        m = statistics.median(values)
        print(f"{mode:<10} {m:>17.0f} {m - plain:>9.0f} {m / plain:>7.3f}")


if __name__ == "__main__":
    main()
