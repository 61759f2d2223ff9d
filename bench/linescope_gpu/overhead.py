#!/usr/bin/env python3
"""Overhead of GPU collection in linescope: gpu=True vs gpu=False for each GPU-capable backend,
and both vs the plain run, on the same workload, interleaved in one process run.

    .venv/bin/python bench/linescope_gpu/overhead.py [--rounds 7] [--rates 1000,5000]
        [--backends sampler,scalene] [--workload mlp|loop] [--fake-nvml]

On a machine without an NVIDIA driver pass --fake-nvml to measure the collection path through
the fake libnvidia-ml.so.1 of the test build (its calls cost far less than a real driver's;
the real figure comes from bench/gpu/ on a GPU machine). Prints a table of median times and
ratios; writes JSON to bench/results/linescope_gpu_overhead-<workload>.json (--out). Not a
pass/fail test.

Scalene's published median for CPU+GPU sampling is 1.02x; the target is to match it with the
native `sampler` at a higher sample rate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COLLECTED: dict = {}  # (backend, rate) -> what the last gpu=True run collected
FAKE_NVML = next(iter(sorted((REPO / "build").glob("cp311-*/fake_nvml/libnvidia-ml.so.1"))),
                 REPO / "build" / "cp311-cp311-linux_x86_64" / "fake_nvml" / "libnvidia-ml.so.1")


def make_workload(name: str):
    if name == "loop":
        def work() -> None:
            s = 0
            for i in range(1_500_000):
                s += i % 7
        return work
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier timings on a small shared machine
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(512, 512), nn.ReLU())])
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 512, device=device)

    def work() -> None:
        for _ in range(20):
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
    return work


def timed(work, backend: str | None, gpu: bool, rate: float | None) -> float:
    import linescope

    if backend is None:
        t0 = time.perf_counter()
        work()
        return time.perf_counter() - t0
    kw = dict(backend=backend, gpu=gpu, display="none", root=str(Path(__file__).parent))
    if rate is not None:
        kw["sample_rate"] = rate
    with linescope.profile(**kw) as session:
        t0 = time.perf_counter()
        work()
        dt = time.perf_counter() - t0
    g = session.result.gpu
    if g is not None:  # what gpu=True really collected, for the table
        COLLECTED[(backend, rate)] = (
            f"{g.method or 'nothing'}: time {'yes' if g.time_available else 'no'}, "
            f"memory {'yes' if g.memory_available else 'no'}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rates", default="1000,5000")
    ap.add_argument("--backends", default="sampler,scalene")
    ap.add_argument("--workload", choices=("mlp", "loop"), default="mlp")
    ap.add_argument("--fake-nvml", action="store_true")
    ap.add_argument("--out", help="JSON path (default bench/results/linescope_gpu_overhead-"
                                  "<workload>.json)")
    args = ap.parse_args()
    if args.fake_nvml and str(FAKE_NVML.parent) not in os.environ.get("LD_LIBRARY_PATH", ""):
        # Scalene's pynvml finds libnvidia-ml.so.1 through the loader path, read at start-up.
        env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
            [str(FAKE_NVML.parent), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    if args.fake_nvml:
        scenario = Path(tempfile.mkdtemp()) / "scenario.txt"
        scenario.write_text("devices 1\ngpu * util 80\ngpu 0 process self 2000000000\n")
        os.environ["GPUPROF_NVML_LIBRARY"] = str(FAKE_NVML)
        os.environ["GPUPROF_FAKE_NVML_SCENARIO"] = str(scenario)
    import linescope

    backends = [b for b in args.backends.split(",") if b in linescope.backend_names()]
    rates = [float(r) for r in args.rates.split(",") if r]
    work = make_workload(args.workload)
    work()  # warm-up
    variants: list[tuple[str, str | None, bool, float | None]] = [("plain", None, False, None)]
    for b in backends:
        for rate in (rates if b == "sampler" else [None]):
            tag = f"{b}@{rate:g}Hz" if rate else b
            variants += [(f"{tag} gpu=False", b, False, rate), (f"{tag} gpu=True", b, True, rate)]
    times: dict[str, list[float]] = {v[0]: [] for v in variants}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else list(reversed(variants))
        for name, b, gpu, rate in order:
            times[name].append(timed(work, b, gpu, rate))
    plain = statistics.median(times["plain"])
    rows = []
    print(f"{'variant':32} {'median s':>9} {'x plain':>8} {'gpu=True / gpu=False':>22}")
    for name, b, gpu, rate in variants:
        med = statistics.median(times[name])
        pair = None
        if gpu:
            off = statistics.median(times[name.replace("gpu=True", "gpu=False")])
            pair = med / off
        got = COLLECTED.get((b, rate)) if gpu else None
        rows.append(dict(variant=name, median_s=med, vs_plain=med / plain, gpu_on_off=pair,
                         collected=got, samples=times[name]))
        print(f"{name:32} {med:9.4f} {med / plain:8.3f} "
              f"{'' if pair is None else f'{pair:22.3f}'}  {got or ''}")
    out = Path(args.out) if args.out else (
        REPO / "bench" / "results" / f"linescope_gpu_overhead-{args.workload}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(workload=args.workload, rounds=args.rounds,
                                   fake_nvml=args.fake_nvml, python=sys.version.split()[0],
                                   rows=rows), indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
