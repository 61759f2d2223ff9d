"""The cost of gpuprof's DDP comm hook, and the time the clock alignment takes at start.

    .venv/bin/python bench/distributed.py [--nproc 2] [--rounds 12] [--steps 20]

Launches a gloo DDP job on CPU with torchrun. Each rank holds two identical DDP models inside
one gpuprof.profile(): A with DDP's built-in allreduce (no hook), B with gpuprof's timed hook
around the same allreduce (the hook auto mode installs). Rounds of `steps` steps alternate
A, B, B, A, ... so the machine's drift hits both alike; the ratio B / A of the median step time
is the hook's per-step cost. Rank 0 prints the result; not a pass/fail test.
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

    plain = DDP(model(), bucket_cap_mb=a.bucket_mb)
    plain._gpuprof_hooked = True  # the bench's baseline: keep DDP's built-in allreduce
    timed = DDP(model(), bucket_cap_mb=a.bucket_mb)  # gets the timed hook at its first forward
    # torch's own Python allreduce hook, not wrapped (registered past gpuprof's shim): what a
    # Python comm hook costs by itself, apart from gpuprof's timing.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    python = DDP(model(), bucket_cap_mb=a.bucket_mb)
    python._gpuprof_hooked = True
    dist._register_comm_hook(python.reducer, python.process_group, default_hooks.allreduce_hook)
    models = (("plain", plain), ("python", python), ("timed", timed))
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=1e-3) for _, m in models}
    x = torch.randn(a.batch, a.width)
    per_step: dict[str, list[float]] = {name: [] for name, _ in models}
    with gpuprof.profile("bench-ddp", db=a.db, gpu="none", summary=False, host_hz=1.0) as prof:
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
        p, t = statistics.median(per_step["plain"]), statistics.median(per_step["timed"])
        py = statistics.median(per_step["python"])
        d = cfg.get("distributed", {})
        print("BENCH " + json.dumps({
            "ranks": dist.get_world_size(), "rounds": a.rounds - 1, "steps_per_round": a.steps,
            "plain_ms": round(p * 1e3, 3), "timed_ms": round(t * 1e3, 3),
            "ratio": round(t / p, 4), "python_hook_ms": round(py * 1e3, 3),
            "ratio_to_python_hook": round(t / py, 4), "buckets_timed": buckets,
            "alignment_ms": d.get("clock_alignment_ms"),
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
                      f"{r['steps_per_round']} steps: built-in allreduce {r['plain_ms']} ms/step, "
                      f"gpuprof's timed hook {r['timed_ms']} ms/step, ratio {r['ratio']}; "
                      f"torch's Python allreduce hook alone {r['python_hook_ms']} ms/step, "
                      f"timed / that {r['ratio_to_python_hook']} "
                      f"({r['buckets_timed']} bucket timings stored); clock alignment at start "
                      f"{r['alignment_ms']} ms (uncertainty {r['clock_uncertainty_ns']} ns)")
                print(json.dumps(r))


if __name__ == "__main__":
    main()
