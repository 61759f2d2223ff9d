"""The cost of gpuprof's DDP comm hook, and the time the clock alignment takes at start.

    .venv/bin/python bench/distributed.py [--nproc 2] [--rounds 12] [--steps 20]

Launches a gloo DDP job on CPU with torchrun. Each rank holds identical DDP models inside one
gpuprof.profile(): "plain" with DDP's built-in allreduce (no hook); "builtin", torch's own C++
ALLREDUCE comm hook (what any hook costs: with a hook DDP no longer divides while it copies
gradients into the bucket, the hook divides the bucket apart); "python", torch's own Python
allreduce hook (not timed: what any Python comm hook costs); "timed", gpuprof's Python hook (the
same allreduce, timed); "native", gpuprof's native hook (gpuprof.ddp_hook, built first if it is
not: what auto mode puts on a CPU model when it is built). Rounds of `steps` steps run the models
in turn, the order reversed every other round, so the machine's drift hits all alike; each
ratio of median step times to plain's is that hook's per-step cost. Rank 0 prints the result;
not a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gpuprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def model() -> nn.Module:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(a.depth):
            layers += [nn.Linear(a.width, a.width), nn.ReLU()]
        return nn.Sequential(*layers)

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from gpuprof import _distributed, ddp_hook

    def ddp(hook) -> nn.Module:  # type: ignore[no-untyped-def]
        m = DDP(model(), bucket_cap_mb=a.bucket_mb)
        m._gpuprof_hooked = True  # auto mode leaves it as the bench sets it up
        if hook is not None:  # registered past gpuprof's shim: not wrapped again
            dist._register_comm_hook(m.reducer, m.process_group, hook)
        return m

    with gpuprof.profile("bench-ddp", db=a.db, gpu="none", summary=False, host_hz=1.0) as prof:
        native = ddp(None)
        native_module = ddp_hook.load()
        assert native_module is not None, "gpuprof.ddp_hook is not built"
        native_module.register(native.reducer, native.process_group)
        builtin = ddp(None)  # torch's own C++ ALLREDUCE hook: what any comm hook costs here
        dist._register_builtin_comm_hook(builtin.reducer, dist.BuiltinCommHookType.ALLREDUCE)
        models = (("plain", ddp(None)), ("builtin", builtin),
                  ("python", ddp(default_hooks.allreduce_hook)),
                  ("timed", ddp(_distributed.timed_allreduce_hook())), ("native", native))
        opts = {id(m): torch.optim.SGD(m.parameters(), lr=1e-3) for _, m in models}
        x = torch.randn(a.batch, a.width)
        per_step: dict[str, list[float]] = {name: [] for name, _ in models}
        for r in range(a.rounds):
            for name, m in models if r % 2 == 0 else reversed(models):
                opt = opts[id(m)]
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    m(x).square().mean().backward()
                    opt.step()
                    opt.zero_grad()
                if r > 0:  # round 0 warms both up
                    per_step[name].append((time.perf_counter() - t0) / a.steps)
    if rank == 0:
        import sqlite3
        con = sqlite3.connect(a.db)
        cfg = json.loads(con.execute("SELECT config_json FROM runs WHERE run_id = ?",
                                     (prof.run_id,)).fetchone()[0])
        buckets = con.execute("SELECT COUNT(*) FROM comm_buckets WHERE run_id = ?",
                              (prof.run_id,)).fetchone()[0]
        con.close()
        med = {name: statistics.median(v) for name, v in per_step.items()}
        d = cfg.get("distributed", {})
        print("BENCH " + json.dumps({
            "ranks": dist.get_world_size(), "rounds": a.rounds - 1, "steps_per_round": a.steps,
            **{f"{name}_ms": round(v * 1e3, 3) for name, v in med.items()},
            **{f"{name}_ratio": round(v / med["plain"], 4) for name, v in med.items()
               if name != "plain"},
            # per round: each hook's mean step over plain's in that round
            **{f"{name}_round_ratios": [
                round(x / y, 3) for x, y in zip(per_step[name], per_step["plain"], strict=True)]
               for name in ("builtin", "timed", "native")},
            # the median of those: each round's pair shares that round's machine state
            **{f"{name}_paired_ratio": round(statistics.median(
                x / y for x, y in zip(per_step[name], per_step["plain"], strict=True)), 4)
               for name in ("builtin", "python", "timed", "native")},
            "buckets_timed": buckets, "alignment_ms": d.get("clock_alignment_ms"),
            "clock_uncertainty_ns": d.get("clock_uncertainty_ns")}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=13)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--db", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return
    from gpuprof import ddp_hook
    if ddp_hook.load() is None:
        print(f"building gpuprof.ddp_hook into {ddp_hook.built_path().parent} ...", flush=True)
        ddp_hook.build()
    with tempfile.TemporaryDirectory() as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        db = a.db or str(Path(tmp) / "bench.db")
        cmd = [str(Path(sys.executable).parent / "torchrun"), f"--nproc-per-node={a.nproc}",
               f"--master-port={port}", __file__, "--worker", "--db", db,
               "--rounds", str(a.rounds), "--steps", str(a.steps), "--width", str(a.width),
               "--depth", str(a.depth), "--batch", str(a.batch), "--bucket-mb", str(a.bucket_mb)]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode != 0:
            sys.exit(proc.stderr[-4000:])
        for line in proc.stdout.splitlines():
            if line.startswith("BENCH "):
                r = json.loads(line[6:])
                print(f"DDP gloo, {r['ranks']} ranks, {r['rounds']} interleaved rounds of "
                      f"{r['steps_per_round']} steps, median ms/step: built-in allreduce "
                      f"{r['plain_ms']}; gpuprof's native hook {r['native_ms']} "
                      f"(x{r['native_ratio']}); gpuprof's Python hook {r['timed_ms']} "
                      f"(x{r['timed_ratio']}); torch's Python allreduce hook {r['python_ms']} "
                      f"(x{r['python_ratio']}); torch's C++ ALLREDUCE hook {r['builtin_ms']} "
                      f"(x{r['builtin_ratio']}); median of the per-round ratios: native "
                      f"{r['native_paired_ratio']}, Python {r['timed_paired_ratio']}, C++ "
                      f"ALLREDUCE {r['builtin_paired_ratio']}; {r['buckets_timed']} bucket "
                      f"timings stored; "
                      f"clock alignment at start {r['alignment_ms']} ms (uncertainty "
                      f"{r['clock_uncertainty_ns']} ns)")
                print(json.dumps(r))


if __name__ == "__main__":
    main()
