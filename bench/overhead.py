"""Instrumentation overhead of gpuprof on a CPU toy loop, side by side with torch.profiler.

Not a pass/fail test. Run: `make bench` (or `.venv/bin/python bench/overhead.py`).

1. Step time: an MLP with ~50 submodules (a few ms per step on one thread), trained in
   interleaved blocks: plain / gpuprof (auto, host sampling on, GPU backend mock at 100 Hz) /
   gpuprof with hooks only (no telemetry threads) / torch.profiler (CPU activities). Median
   step time per mode, ratio to plain.
2. Breakdown: cost per hooked call (outermost and nested module call, backward, optimizer
   hook) measured on trivial modules with and without the patch, times calls per step.
3. Background cost: CPU time of the sampler/recorder/writer threads per tick, measured on an
   idle process over a fixed window.
4. Live push: the same loop under gpuprof and under gpuprof with profile(server=..., api_key=...)
   pushing to a `gpuprof serve` the bench starts on 127.0.0.1 (free port, temporary SQLite
   store), interleaved in longer blocks (--push-steps, several 1 s push periods each, so that
   batches go out during the timed steps). Median step time per mode, ratio to the non-pushing
   gpuprof; and the median time to leave the `with` block (the push sends the rest there).
5. Dashboard: the same loop under gpuprof and under gpuprof with profile(dashboard=True) while a
   viewer process reads it as the run page does (GPU and host series of every GPU, the step
   breakdown every second, the insights report every 5 s, through the login link), interleaved
   in blocks of --push-steps. Median step time per mode and the per-round ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path

import torch
from torch import nn

import gpuprof


def make_model(width: int, blocks: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def count_modules(model: nn.Module) -> int:
    return sum(1 for _ in model.modules())


def run_steps(model, opt, xs, ys, loss_fn) -> list[float]:
    times = []
    for x, y in zip(xs, ys):
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def training_setup(args):
    """The benched MLP, its optimizer and loss, and args.steps fixed batches."""
    torch.manual_seed(0)
    model = make_model(args.width, args.blocks)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    xs = [torch.randn(args.batch, args.width) for _ in range(args.steps)]
    ys = [torch.randint(0, 10, (args.batch,)) for _ in range(args.steps)]
    return model, opt, loss_fn, xs, ys


def step_time_comparison(args, db: str) -> dict[str, list[float]]:
    model, opt, loss_fn, xs, ys = training_setup(args)
    run_steps(model, opt, xs, ys, loss_fn)  # warm up allocator and kernels
    modes = ["plain", "gpuprof", "gpuprof-hooks-only", "torch.profiler"]
    out: dict[str, list[float]] = {m: [] for m in modes}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = modes[:]
        rng.shuffle(order)
        for mode in order:
            if mode == "plain":
                out[mode] += run_steps(model, opt, xs, ys, loss_fn)
            elif mode == "gpuprof":
                with gpuprof.profile("bench", db=db, gpu="mock", mock_gpus=1, summary=False):
                    out[mode] += run_steps(model, opt, xs, ys, loss_fn)
            elif mode == "gpuprof-hooks-only":
                # No telemetry threads: isolates the cost of the hooks and the recorder.
                with gpuprof.profile("bench", db=db, gpu="none", host=False, summary=False):
                    out[mode] += run_steps(model, opt, xs, ys, loss_fn)
            else:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                    out[mode] += run_steps(model, opt, xs, ys, loss_fn)
    return out


PUSH_KEY = "bench-key"


def start_server(store: str) -> tuple[subprocess.Popen, str]:
    """A `gpuprof serve` on a free port of 127.0.0.1; returns (process, URL)."""
    exe = Path(sys.executable).parent / "gpuprof"
    proc = subprocess.Popen([str(exe), "serve", "--port", "0", "--api-key", PUSH_KEY,
                             "--storage-url", f"sqlite://{store}"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", proc.stdout.readline())
    if not m:
        proc.kill()
        raise SystemExit("gpuprof serve did not start")
    return proc, m.group(1)


def ingest_counters(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as res:
        text = res.read().decode()
    return {k: int(v) for k, v in re.findall(r"^gpuprof_ingest_(\w+)_total (\d+)$", text, re.M)}


def push_comparison(args, db: str, url: str) -> dict[str, dict[str, list[float]]]:
    """Step times and block exit times of gpuprof with and without the live push."""
    model, opt, loss_fn, xs, ys = training_setup(args)
    reps = max(1, args.push_steps // args.steps)  # the same batches, reps times per block
    run_steps(model, opt, xs, ys, loss_fn)
    modes = {"gpuprof": {}, "gpuprof+push": {"server": url, "api_key": PUSH_KEY}}
    out = {m: {"steps": [], "exit": [], "block": []} for m in modes}
    rng = random.Random(1)
    for _ in range(args.push_rounds):
        order = list(modes)
        rng.shuffle(order)
        for mode in order:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                prof = gpuprof.profile("bench-push", db=db, gpu="mock", mock_gpus=1,
                                       summary=False, **modes[mode])
                with prof:
                    block = []
                    for _ in range(reps):
                        block += run_steps(model, opt, xs, ys, loss_fn)
                    t_exit = time.perf_counter()
                out[mode]["exit"].append(time.perf_counter() - t_exit)
                out[mode]["steps"] += block
                out[mode]["block"].append(statistics.median(block))
            problems = [w for w in caught if issubclass(w.category, gpuprof.GpuprofWarning)]
            if problems:  # a push that failed measures nothing
                raise SystemExit(f"{mode}: {problems[0].message}")
    return out


def per_call_costs(n: int = 200_000) -> dict[str, float]:
    """ns per call added by the patch, for an outermost and a nested module call."""
    leaf = nn.Identity()
    nested = nn.Sequential(nn.Identity())  # outer call + one nested call
    x = torch.zeros(1)

    def time_calls(fn) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn(x)
            best = min(best, (time.perf_counter_ns() - t0) / n)
        return best

    plain_leaf, plain_nested = time_calls(leaf), time_calls(nested)
    with tempfile.TemporaryDirectory() as d:
        with gpuprof.profile("calls", db=os.path.join(d, "c.db"), gpu="none", host=False,
                             summary=False):
            hooked_leaf, hooked_nested = time_calls(leaf), time_calls(nested)
    outer = hooked_leaf - plain_leaf
    inner = (hooked_nested - plain_nested) - outer
    return {"plain_call_ns": plain_leaf, "outermost_added_ns": outer, "nested_added_ns": inner}


def background_cost(seconds: float, gpus: int) -> dict[str, float]:
    """CPU seconds used by gpuprof's threads while the training thread sleeps."""
    with tempfile.TemporaryDirectory() as d:
        t_cpu = time.process_time()
        time.sleep(seconds)
        idle = time.process_time() - t_cpu
        with gpuprof.profile("bg", db=os.path.join(d, "b.db"), gpu="mock", mock_gpus=gpus,
                             sample_hz=100, host_hz=5, summary=False) as prof:
            t_cpu = time.process_time()
            time.sleep(seconds)
            busy = time.process_time() - t_cpu
            stats = prof.stats()
    cpu = max(0.0, busy - idle)
    return {"cpu_pct_of_one_core": 100 * cpu / seconds, "gpu_ticks": stats["gpu_ticks"],
            "host_ticks": stats["host_ticks"],
            "us_per_tick_all_threads": 1e6 * cpu / max(1, stats["gpu_ticks"])}


def overhead_sections(args) -> None:
    model_modules = count_modules(make_model(args.width, args.blocks))
    with tempfile.TemporaryDirectory() as d:
        res = step_time_comparison(args, os.path.join(d, "bench.db"))
    plain = statistics.median(res["plain"])
    print(f"# step time ({model_modules} modules, width {args.width}, batch {args.batch}, "
          f"{args.rounds} interleaved rounds x {args.steps} steps, torch threads {args.threads})")
    print(f"{'mode':<16}{'median ms':>12}{'ratio':>10}")
    for mode, ts in res.items():
        med = statistics.median(ts)
        print(f"{mode:<16}{med * 1e3:>12.3f}{med / plain:>10.4f}")
    c = per_call_costs()
    print("\n# per hooked call")
    for k, v in c.items():
        print(f"{k:<24}{v:>10.1f} ns")
    calls_per_step = 1 + (model_modules - 1) + 1  # outer model call, nested, loss module
    predicted = (2 * c["outermost_added_ns"] + (model_modules - 1) * c["nested_added_ns"]) / 1e6
    print(f"predicted hook cost per step: {predicted:.4f} ms for {calls_per_step} module calls "
          f"({100 * predicted / (plain * 1e3):.3f}% of the plain step)")
    b = background_cost(3.0, gpus=8)
    print("\n# background threads (mock 8 GPUs at 100 Hz, host at 5 Hz, idle training thread)")
    for k, v in b.items():
        print(f"{k:<26}{v:>10.2f}")


def push_section(args) -> None:
    with tempfile.TemporaryDirectory() as d:
        server, url = start_server(os.path.join(d, "server.db"))
        try:
            res = push_comparison(args, os.path.join(d, "push.db"), url)
            got = ingest_counters(url)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    base = statistics.median(res["gpuprof"]["steps"])
    reps = max(1, args.push_steps // args.steps)
    print(f"\n# live push to gpuprof serve on 127.0.0.1 ({args.push_rounds} interleaved rounds x "
          f"{reps * args.steps} steps; {got['runs_created']} runs, {got['batches']} batches, "
          f"{got['rows']} rows received)")
    print(f"{'mode':<16}{'median ms':>12}{'ratio':>10}{'exit ms':>12}")
    for mode, r in res.items():
        med = statistics.median(r["steps"])
        print(f"{mode:<16}{med * 1e3:>12.3f}{med / base:>10.4f}"
              f"{statistics.median(r['exit']) * 1e3:>12.1f}")
    # Each round's push block against its own gpuprof block: load that drifts between rounds
    # (a shared machine) cancels out.
    paired = sorted(p / g for p, g in zip(res["gpuprof+push"]["block"], res["gpuprof"]["block"]))
    print(f"per-round ratio gpuprof+push / gpuprof: median {statistics.median(paired):.4f}, "
          f"min {paired[0]:.4f}, max {paired[-1]:.4f}")


VIEWER = r"""
import http.cookiejar, sys, time, urllib.request
url = sys.argv[1]
base = url.split("/login?")[0]
o = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
o.open(url, timeout=30).read()
run = sys.argv[2]
i = 0
while True:
    o.open(f"{base}/api/v1/runs/{run}/series?metric=gpu_util,gpu_mem,gpu_power,gpu_temp&gpu=all"
           "&points=1000", timeout=30).read()
    o.open(f"{base}/api/v1/runs/{run}/series?metric=host_cpu,host_mem,host_disk_read"
           "&points=1000", timeout=30).read()
    o.open(f"{base}/api/v1/runs/{run}/steps?points=1000", timeout=30).read()
    if i % 5 == 0:
        o.open(f"{base}/api/v1/runs/{run}", timeout=30).read()
    i += 1
    time.sleep(1)
"""


def dashboard_section(args) -> None:
    """Step times of gpuprof with and without the in-process dashboard and a reading viewer."""
    model, opt, loss_fn, xs, ys = training_setup(args)
    reps = max(1, args.push_steps // args.steps)
    run_steps(model, opt, xs, ys, loss_fn)
    modes = ["gpuprof", "gpuprof+dashboard"]
    out = {m: {"steps": [], "block": []} for m in modes}
    rng = random.Random(2)
    with tempfile.TemporaryDirectory() as d:
        for rnd in range(args.push_rounds):
            order = modes[:]
            rng.shuffle(order)
            for mode in order:
                db = os.path.join(d, f"{mode}-{rnd}.db")  # one file per dashboard
                prof = gpuprof.profile("bench-dash", db=db, gpu="mock", mock_gpus=8,
                                       summary=False, dashboard=mode != "gpuprof")
                viewer = None
                with prof:
                    if prof.dashboard_url:
                        viewer = subprocess.Popen([sys.executable, "-c", VIEWER,
                                                   prof.dashboard_url, str(prof.run_id)])
                        time.sleep(0.5)  # logged in and reading
                    block = []
                    for _ in range(reps):
                        block += run_steps(model, opt, xs, ys, loss_fn)
                if viewer is not None:
                    if viewer.poll() is not None:
                        raise SystemExit("the viewer process failed")
                    viewer.kill()
                    viewer.wait()
                out[mode]["steps"] += block
                out[mode]["block"].append(statistics.median(block))
    base = statistics.median(out["gpuprof"]["steps"])
    print(f"\n# in-process dashboard with a viewer reading every second ({args.push_rounds} "
          f"interleaved rounds x {reps * args.steps} steps, 8 mock GPUs)")
    print(f"{'mode':<20}{'median ms':>12}{'ratio':>10}")
    for mode, r in out.items():
        med = statistics.median(r["steps"])
        print(f"{mode:<20}{med * 1e3:>12.3f}{med / base:>10.4f}")
    paired = sorted(p / g for p, g in zip(out["gpuprof+dashboard"]["block"],
                                          out["gpuprof"]["block"]))
    print(f"per-round ratio gpuprof+dashboard / gpuprof: median {statistics.median(paired):.4f}, "
          f"min {paired[0]:.4f}, max {paired[-1]:.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description="gpuprof overhead benchmark")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--push-steps", type=int, default=360,
                   help="steps per block of the live-push comparison (several push periods)")
    p.add_argument("--push-rounds", type=int, default=6)
    p.add_argument("--push-only", action="store_true", help="only the live-push comparison")
    p.add_argument("--dashboard-only", action="store_true",
                   help="only the in-process dashboard comparison")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.dashboard_only:
        dashboard_section(args)
        return
    if not args.push_only:
        overhead_sections(args)
    push_section(args)
    dashboard_section(args)


if __name__ == "__main__":
    main()
