"""GPU check of DDP bucket timing (issue 19): a DistributedDataParallel model on the GPU, in a
one-rank NCCL process group (the machine has one GPU), under auto mode. Imported by checks.py;
check_ddp takes (ctx, check).

On CUDA the buckets are timed by gpuprof's Python hook with CUDA events (start when the hook
runs, end once the collective's future completes, resolved later without a sync): every step
must have its buckets, each with a GPU span inside its step and the bucket's bytes; the step
time with the hook is compared with DDP's built-in allreduce (no hook) in interleaved rounds.
In a dry run (CPU) the same runs in a one-rank gloo group, timed on the wall clock.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any

Ctx = Check = Any  # checks.py's classes

STEPS = 30
ROUNDS = 7
ROUND_STEPS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_ddp(ctx: Ctx, c: Check, lib: Any) -> None:
    torch = ctx.torch
    dist = torch.distributed
    nn = torch.nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    backend = "nccl" if ctx.cuda else "gloo"
    if not dist.is_available() or (ctx.cuda and not dist.is_nccl_available()):
        c.skip_reason = f"torch.distributed with {backend} is not available"
        return
    own_group = not dist.is_initialized()
    if own_group:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group(backend, rank=0, world_size=1)
    try:
        width = 4096 if ctx.cuda else 256
        batch = 64

        def model() -> Any:
            torch.manual_seed(0)
            layers: list[Any] = []
            for _ in range(4):
                layers += [nn.Linear(width, width), nn.ReLU()]
            return nn.Sequential(*layers).to(ctx.device)

        x = torch.randn(batch, width, device=ctx.device)

        def train(m: Any, opt: Any, steps: int) -> None:
            for _ in range(steps):
                m(x).square().mean().backward()
                opt.step()
                opt.zero_grad()

        # 1. Auto mode on a GPU DDP model: every step's buckets, timed by CUDA events.
        with lib.record_warnings(c), ctx.profile("gpu-check-ddp") as p:
            ddp = DDP(model(), bucket_cap_mb=25)
            opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
            train(ddp, opt, STEPS)
            if ctx.cuda:
                torch.cuda.synchronize()
        run_id = p.run_id
        hook = (ddp._get_ddp_logging_data() or {}).get("comm_hook")
        c.figures["comm_hook"] = hook
        # A GPU model keeps the Python hook (CUDA events); a CPU one gets the native hook when
        # it is built (python -m gpuprof.ddp_hook build)
        want = ({"gpuprof_allreduce_hook"} if ctx.cuda else
                {"gpuprof_allreduce_hook", "gpuprof_native_allreduce_hook"})
        c.expect("auto mode's hook is on the model", hook, hook in want, " or ".join(sorted(want)))
        buckets = ctx.rows("SELECT * FROM comm_buckets WHERE run_id = ?", run_id)
        steps = {r["step"]: r for r in ctx.rows(
            "SELECT step, start_ns, end_ns FROM steps WHERE run_id = ?", run_id)}
        per_step: dict[int, int] = {}
        for b in buckets:
            per_step[b["step"]] = per_step.get(b["step"], 0) + 1
        c.figures["buckets"] = len(buckets)
        c.figures["steps_with_buckets"] = len(per_step)
        c.figures["buckets_per_step"] = sorted(set(per_step.values()))
        c.expect("steps with timed buckets", len(per_step), len(per_step) >= STEPS - 2,
                 f">= {STEPS - 2} of {STEPS}")
        spans = [(b["end_ns"] - b["start_ns"]) / 1e6 for b in buckets]
        inside = [b for b in buckets if b["step"] in steps
                  and steps[b["step"]]["start_ns"] - 1_000_000 <= b["start_ns"]
                  and b["end_ns"] <= steps[b["step"]]["end_ns"] + 50_000_000]
        c.figures["bucket_ms_median"] = lib.rnd(statistics.median(spans)) if spans else None
        c.figures["bucket_ms_max"] = lib.rnd(max(spans)) if spans else None
        c.expect("every bucket span is >= 0", min(spans) if spans else None,
                 bool(spans) and min(spans) >= 0, ">= 0 ms")
        c.expect("buckets start in their step and end near it", len(inside),
                 len(inside) >= 0.95 * len(buckets) and bool(buckets), ">= 95% of buckets")
        c.expect("every bucket has its bytes", sum(1 for b in buckets if b["bytes"]),
                 bool(buckets) and all(b["bytes"] for b in buckets), "all > 0")
        source = ctx.rows("SELECT backend FROM telemetry_status WHERE run_id = ? AND "
                          "source = 'comm'", run_id)
        c.figures["comm_backend"] = source[0]["backend"] if source else None

        # 2. The hook's cost: DDP without a hook against auto mode's, interleaved rounds.
        with lib.record_warnings(c), ctx.profile("gpu-check-ddp-cost"):
            plain = DDP(model(), bucket_cap_mb=25)
            plain._gpuprof_hooked = True  # keeps DDP's built-in allreduce
            timed = DDP(model(), bucket_cap_mb=25)
            models = (("plain", plain), ("timed", timed))
            opts = {n: torch.optim.SGD(m.parameters(), lr=1e-4) for n, m in models}
            times: dict[str, list[float]] = {n: [] for n, _ in models}
            for r in range(ROUNDS + 1):
                for name, m in models if r % 2 == 0 else reversed(models):
                    if ctx.cuda:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    train(m, opts[name], ROUND_STEPS)
                    if ctx.cuda:
                        torch.cuda.synchronize()
                    if r > 0:
                        times[name].append((time.perf_counter() - t0) / ROUND_STEPS)
        ratios = [t / q for t, q in zip(times["timed"], times["plain"], strict=True)]
        c.figures["step_ms"] = {n: lib.rnd(statistics.median(v) * 1e3) for n, v in times.items()}
        c.figures["hook_cost_ratio_median_of_rounds"] = lib.rnd(statistics.median(ratios))
        c.expect("step time with the timed hook / without a hook",
                 lib.rnd(statistics.median(ratios)), statistics.median(ratios) <= 1.01,
                 "<= 1.01 (median of per-round ratios)", required=False)
        c.headline = (f"{len(buckets)} buckets on {len(per_step)}/{STEPS} steps "
                      f"(median {c.figures['bucket_ms_median']} ms, {backend}); hook cost "
                      f"x{c.figures['hook_cost_ratio_median_of_rounds']}")
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()
