#!/usr/bin/env python3
"""Cost of linescope's `sampler` on the main thread, two ways.

    .venv/bin/python bench/linescope_gpu/sample_cost.py [--rounds 7]

1. One sample taken directly (`_native.LineSampler.sample_now()`: the same native code the
   queued pending call runs — stack walk without allocation, attribution, interval close),
   at stack depth 1 and 30, with and without memory.
2. End to end: a pure-Python loop (the worst case: every sample interrupts bytecode) run plain
   and under `profile(backend="sampler")` at 1, 5 and 10 kHz, interleaved; reported as the
   median added time per sample taken and the ratio to plain. The sampler thread's own
   wake-ups are printed beside it (on a 2-core machine they compete with the main thread).

Not a pass/fail test. Writes JSON to bench/results/linescope_sample_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
N_DIRECT = 20_000


def deep(n, f):
    if n:
        return deep(n - 1, f)
    return f()


def direct_cost(depth: int, memory: bool) -> float:
    from gpuprof import _native

    here = str(Path(__file__).parent)
    s = _native.LineSampler([here], [], [], os.getcwd(), interval_ns=10**9, attribute=True,
                            memory=memory, gpu_backend="off")
    s.start()

    def loop() -> float:
        t0 = time.perf_counter()
        for _ in range(N_DIRECT):
            s.sample_now()
        return time.perf_counter() - t0

    try:
        dt = deep(depth, loop)
    finally:
        s.stop()
    t0 = time.perf_counter()
    for _ in range(N_DIRECT):
        pass
    base = time.perf_counter() - t0
    return (dt - base) / N_DIRECT * 1e9


def work() -> None:
    s = 0
    for i in range(3_000_000):
        s += i % 7


def timed(rate: float | None) -> tuple[float, int, int]:
    import linescope

    if rate is None:
        t0 = time.perf_counter()
        work()
        return time.perf_counter() - t0, 0, 0
    with linescope.profile(backend="sampler", sample_rate=rate, display="none",
                           root=str(Path(__file__).parent)) as p:
        t0 = time.perf_counter()
        work()
        dt = time.perf_counter() - t0
    md = p.result.metadata
    return dt, int(md.get("samples") or 0), int(md.get("sampler_wakeups") or 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    out: dict = {"python": sys.version.split()[0], "direct": [], "end_to_end": []}
    print("1. one sample, called directly (ns per sample, median of 5)")
    for depth in (1, 30):
        for memory in (False, True):
            ns = statistics.median(direct_cost(depth, memory) for _ in range(5))
            out["direct"].append(dict(depth=depth, memory=memory, ns=ns))
            print(f"   depth {depth:2d} memory={str(memory):5}  {ns:7.0f} ns")

    rates = (None, 1000.0, 5000.0, 10000.0)
    runs: dict = {r: [] for r in rates}
    work()  # warm-up
    for r in range(args.rounds):
        for rate in (rates if r % 2 == 0 else tuple(reversed(rates))):
            runs[rate].append(timed(rate))
    plain = statistics.median(t for t, _, _ in runs[None])
    print(f"\n2. pure-Python loop, plain {plain:.4f} s (median of {args.rounds})")
    print(f"   {'rate':>8} {'x plain':>8} {'samples':>8} {'rate got':>9} {'wakeups':>8} "
          f"{'added/sample':>13}")
    for rate in rates[1:]:
        t = statistics.median(x for x, _, _ in runs[rate])
        n = statistics.median(x for _, x, _ in runs[rate])
        w = statistics.median(x for _, _, x in runs[rate])
        per = (t - plain) / n * 1e9 if n else None
        out["end_to_end"].append(dict(rate=rate, median_s=t, vs_plain=t / plain, samples=n,
                                      wakeups=w, added_ns_per_sample=per,
                                      raw=runs[rate], plain_raw=runs[None]))
        per_s = "—" if per is None else f"{per:.0f} ns"
        print(f"   {rate:8.0f} {t / plain:8.3f} {n:8.0f} {n / t:8.0f}/s {w:8.0f} {per_s:>13}")
    path = REPO / "bench" / "results" / "linescope_sample_cost.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
