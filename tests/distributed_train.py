"""A small DDP (gloo, CPU) training script for tests/test_distributed.py, run under torchrun.

Options shape the job: a rank made late before one bucket, a uniformly slower rank, a large
model with tiny compute, gradient accumulation with or without no_sync(), torch.compile, a user
comm hook, the process group initialised inside the profile, FSDP instead of DDP. Prints one
JSON line per rank: "RESULT {...}".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import gpuprof


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True, help="'{rank}' in it: a file per rank")
    p.add_argument("--name", default="dist-test")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bucket-mb", type=float, default=0.25)
    p.add_argument("--late-rank", type=int, default=-1,
                   help="this rank sleeps --late-ms when the first layer's gradient is ready "
                        "(just before the last bucket)")
    p.add_argument("--slow-rank", type=int, default=-1,
                   help="this rank sleeps --late-ms in every forward")
    p.add_argument("--late-ms", type=float, default=30.0)
    p.add_argument("--user-hook", action="store_true",
                   help="a user comm hook that zeroes the averaged gradient")
    p.add_argument("--builtin-hook", action="store_true",
                   help="register DDP's built-in ALLREDUCE comm hook")
    p.add_argument("--init-late", action="store_true",
                   help="initialise the process group inside the profile block")
    p.add_argument("--setup-before", action="store_true",
                   help="wrap the model (and register --user-hook) before the profile starts")
    p.add_argument("--manual", action="store_true", help="auto=False with prof.step()")
    p.add_argument("--accumulate", type=int, default=1,
                   help="backward passes per optimizer step (gradient accumulation)")
    p.add_argument("--no-sync", action="store_true",
                   help="with --accumulate: all but a step's last backward inside no_sync()")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--no-ddp", action="store_true", help="no model wrapper, no collectives")
    p.add_argument("--no-comm-hook", action="store_true", help="profile(comm_hook=False)")
    p.add_argument("--only-rank", type=int, default=-1,
                   help="only this rank runs gpuprof (the others train unprofiled)")
    a = p.parse_args()

    if not a.init_late:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(a.depth):
        layers += [nn.Linear(a.width, a.width), nn.ReLU()]
    inner = nn.Sequential(*layers)
    rank = int(os.environ["RANK"])
    hook_calls = [0]

    if a.late_rank == rank:
        inner[0].weight.register_hook(lambda g: time.sleep(a.late_ms / 1e3))

    def zeroing_hook(state, bucket):
        hook_calls[0] += 1
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: torch.zeros_like(f.value()[0]))

    def wrap() -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(inner, bucket_cap_mb=a.bucket_mb)
        if a.user_hook:
            ddp.register_comm_hook(None, zeroing_hook)
        if a.builtin_hook:
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        return ddp

    early = wrap() if a.setup_before else None
    prof = gpuprof.profile(a.name, db=a.db.replace("{rank}", str(rank)), gpu="none", auto=not a.manual,
                           summary=rank == 0, host_hz=2.0, comm_hook=not a.no_comm_hook)
    if a.only_rank not in (-1, rank):
        prof = contextlib.nullcontext(prof)  # never entered: this rank is not profiled
    started = time.monotonic()
    with prof:
        if a.init_late:
            dist.init_process_group("gloo")
        if early is not None:
            model: nn.Module = early
        elif a.fsdp:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            fully_shard(inner, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
            model = inner
        elif a.no_ddp:
            model = inner
        else:
            model = wrap()
        before = [t.detach().clone() for t in model.parameters()] if a.user_hook else []
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        run_model = torch.compile(model) if a.compile else model
        for i in range(a.steps):
            x = torch.randn(a.batch, a.width)
            if a.manual:
                with prof.step(i) as s:
                    with s.phase("forward"):
                        if a.slow_rank == rank:
                            time.sleep(a.late_ms / 1e3)
                        loss = model(x).square().mean()
                    with s.phase("backward"):
                        loss.backward()
                    with s.phase("optimizer"):
                        opt.step()
                        opt.zero_grad()
                continue
            if a.slow_rank == rank:
                time.sleep(a.late_ms / 1e3)
            for micro in range(a.accumulate):
                last = micro == a.accumulate - 1
                quiet = model.no_sync() if a.no_sync and not last else contextlib.nullcontext()
                with quiet:
                    run_model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        unchanged = all(torch.equal(b, t.detach()) for b, t in zip(before, model.parameters()))
    prof = getattr(prof, "enter_result", prof)
    data = model._get_ddp_logging_data() if hasattr(model, "_get_ddp_logging_data") else {}
    hook_name = data.get("comm_hook") or None  # the registered hook's name; "" = none
    # The trained weights, to compare a run under one comm hook with a run under another
    param_sum = None if a.fsdp else sum(float(t.detach().double().sum())
                                         for t in model.parameters())
    print("RESULT " + json.dumps({"rank": rank, "run_id": prof.run_id,
                                  "seconds": round(time.monotonic() - started, 2),
                                  "hook_calls": hook_calls[0], "comm_hook": hook_name,
                                  "param_sum": param_sum,
                                  "params_unchanged": unchanged if a.user_hook else None}),
          flush=True)
    # torch 2.13's gloo can abort a rank that destroys its process group a second or more
    # before another ("terminate called without an active exception"), which gpuprof's
    # summary at a rank's end makes likely when only some ranks profile: meet first.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
