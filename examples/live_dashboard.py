"""Live dashboard demo: a small training loop on 4 mock GPUs, watched in the browser.

    python examples/live_dashboard.py              # ~30 s of training, then serves until Ctrl-C
    python examples/live_dashboard.py --seconds 60 --linger 0

The first line printed is the dashboard's URL (127.0.0.1, with a single-use login token): open
it and the GPU, host and step-time charts update while the loop runs; the insights panel fills
in as rules fire. The GPUs are gpuprof's mock devices (utilization wobbling, memory ramping,
one GPU throttling after 15 s), so no GPU is needed. Ctrl-C stops the training (the run is kept,
marked failed "KeyboardInterrupt") or, after it, the server; either way the process exits
cleanly with status 130.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gpuprof


class JitteryDataset(Dataset):
    """Samples that take a little CPU time to "decode", more in some stretches than others."""

    def __init__(self, n: int, dim: int, classes: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        # One stretch of 50 steps in three is slow: the loader-wait band of the step chart shows it.
        time.sleep(0.0015 if (i // 1600) % 3 == 2 else 0.0002)
        return self.x[i], self.y[i]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0, help="how long to train")
    p.add_argument("--linger", type=float, default=None,
                   help="seconds to keep serving after training (default: until Ctrl-C)")
    p.add_argument("--db", default="gpuprof.db")
    p.add_argument("--name", default="live-dashboard-demo")
    p.add_argument("--port", type=int, default=0, help="dashboard port (0: a free one)")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(JitteryDataset(1_000_000, 128, 10), batch_size=32, shuffle=False)
    scenario = "util=70,util_amp=25,period_s=12,mem_frac=0.7,mem_ramp_s=20,throttle=1," \
               "throttle_after_s=15"
    try:
        with gpuprof.profile(args.name, db=args.db, gpu="mock", mock_gpus=4,
                             mock_scenario=scenario, sample_hz=20,
                             dashboard=args.port or True) as prof:
            deadline = time.monotonic() + args.seconds
            for x, y in loader:
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                if time.monotonic() >= deadline:
                    break
        print(f"training done: run {prof.run_id} in {args.db}; the dashboard stays up "
              f"({'Ctrl-C to exit' if args.linger is None else f'{args.linger:g} s'})",
              flush=True)
        if args.linger is None:
            while True:
                time.sleep(3600)
        time.sleep(args.linger)
    except KeyboardInterrupt:
        print("stopped (Ctrl-C)", flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
