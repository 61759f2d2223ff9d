"""Cost of gpuprof's kernel traces on a CPU run (CPU operators of traced steps), side by side
with torch.profiler, the peer that records the same operators.

Not a pass/fail test. Run: `.venv/bin/python bench/traces.py [--steps N] [--rounds R]`.

An MLP with ~50 submodules is trained in interleaved blocks of --steps steps, one block per
mode per round:
  gpuprof               profile() with no trace mode (the baseline here);
  gpuprof+trace         profile(trace_every_n_steps=10): torch.profiler runs on steps 0, 1, 5,
                        10, 20, ... only;
  torch.profiler        CPU activities over every step (what one does without gpuprof);
  torch.profiler+sched  schedule(wait=9, warmup=0, active=1): every 10th step, the peer's own
                        way of tracing some steps.
Each step is timed on its own (perf_counter around forward, backward, optimizer); the report
gives per mode the median untraced step, the median traced step, the median step right after a
traced one (gpuprof stops the profiler and reads its operators at that step's first forward)
and the mean over all steps (what the run pays in all), each with its ratio to the gpuprof
baseline. Steps 0..5 of every block (warm-up, the warm-up traces) are left out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Callable

import torch
from torch import nn

import gpuprof

TRACE_EVERY = 10


def make_model(width: int = 256, blocks: int = 16) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def train(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          steps: int, after_step: Callable[[], None] = lambda: None) -> list[float]:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        after_step()
        times.append(time.perf_counter() - t0)
    return times


def quiet_stderr() -> int:
    """torch 2.13's kineto prints two lines per profiler start/stop on fd 2; keep the bench
    output readable (restored after each block)."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    return saved


def restore_stderr(saved: int) -> None:
    os.dup2(saved, 2)
    os.close(saved)


def run_block(mode: str, steps: int, db: str) -> list[float]:
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    saved = quiet_stderr()
    try:
        if mode == "gpuprof":
            with gpuprof.profile("bench-traces", db=db, gpu="none", summary=False):
                return train(model, opt, x, y, steps)
        if mode == "gpuprof+trace":
            with gpuprof.profile("bench-traces", db=db, gpu="none", summary=False,
                                 trace_every_n_steps=TRACE_EVERY):
                return train(model, opt, x, y, steps)
        act = [torch.profiler.ProfilerActivity.CPU]
        if mode == "torch.profiler":
            with torch.profiler.profile(activities=act):
                return train(model, opt, x, y, steps)
        sched = torch.profiler.schedule(wait=TRACE_EVERY - 1, warmup=0, active=1)
        with torch.profiler.profile(activities=act, schedule=sched,
                                    on_trace_ready=lambda p: p.key_averages()) as prof:
            return train(model, opt, x, y, steps, prof.step)
    finally:
        restore_stderr(saved)


def kind(mode: str, i: int) -> str:
    """'traced', 'after' (the step after a traced one, where gpuprof reads the profiler) or
    'untraced'."""
    def gp(j: int) -> bool:
        return j in (0, 1, 5) or j % TRACE_EVERY == 0
    if mode == "gpuprof+trace":
        return "traced" if gp(i) else "after" if gp(i - 1) else "untraced"
    if mode == "torch.profiler":
        return "traced"
    if mode == "torch.profiler+sched":
        return "traced" if i % TRACE_EVERY == TRACE_EVERY - 1 else "untraced"
    return "untraced"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    modes = ["gpuprof", "gpuprof+trace", "torch.profiler", "torch.profiler+sched"]
    kinds = ["untraced", "traced", "after"]
    samples: dict[str, dict[str, list[float]]] = {m: {k: [] for k in kinds + ["all"]}
                                                  for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "bench.db")
        run_block("gpuprof", 10, db)  # imports, dynamo, first-use costs
        for r in range(args.rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                for i, t in enumerate(run_block(mode, args.steps, db)):
                    if i > 5:
                        samples[mode][kind(mode, i)].append(t)
                        samples[mode]["all"].append(t)
    base = statistics.median(samples["gpuprof"]["untraced"])
    print(f"torch {torch.__version__}, {args.rounds} rounds x {args.steps} steps per mode, "
          f"1 thread; median step time, ratio to gpuprof without traces ({base * 1e3:.2f} ms)")
    base_mean = statistics.fmean(samples["gpuprof"]["all"])
    print(f"{'mode':22} {'untraced (median)':>18} {'traced (median)':>18} "
          f"{'after traced':>18} {'all steps (mean)':>18}")
    for mode in modes:
        cells = []
        for k in kinds + ["all"]:
            v = samples[mode][k]
            if not v:
                cells.append(f"{'—':>18}")
                continue
            m = statistics.fmean(v) if k == "all" else statistics.median(v)
            ref = base_mean if k == "all" else base
            cells.append(f"{m * 1e3:9.2f} ms {m / ref:5.2f}x")
        print(f"{mode:22} " + " ".join(f"{c:>18}" for c in cells))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
