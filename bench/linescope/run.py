"""linescope `trace` backend overhead, side by side with peers, in one invocation.

Not a pass/fail test. Run: `make bench-lines` (or `.venv/bin/python bench/linescope/run.py`).

For every Python given (default: .venv = 3.11, C trace function; .venv312 = 3.12,
sys.monitoring; .venv313 = 3.13 when present) and every workload in workloads/, each
variant of _variant.py (plain, floor, floor_ret, trace, line_profiler, cprofile) runs in a
fresh subprocess (floor_ret only where it differs from floor: 3.12+). Rounds are
interleaved: round r runs every (workload, variant) once, with the variant order rotated
from round to round, so slow drift of a shared machine spreads over all variants instead of
landing on one. Reported per (python, workload, variant): the
median of the timed region (main() only), the ratio to plain and the added time
(variant − plain); and the two target ratios of issue 4:

    vs_lp    = trace_added / line_profiler_added   (target <= 0.5)
    vs_floor = trace_added / floor_added           (target <= 1.15 on 3.12)

and vs_floor_ret = trace_added / floor_ret_added, against a floor that also takes the
PY_RETURN event the tracer needs (3.12+).

A table goes to stdout and everything (raw samples too) to bench/results/linescope-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
VARIANTS = ("plain", "floor", "floor_ret", "trace", "line_profiler", "cprofile")
WORKLOADS = ("raytrace", "fannkuch", "nbody", "tight_loop", "recursion", "numpy_pandas",
             "dependency")
DEFAULT_PYTHONS = (".venv/bin/python", ".venv312/bin/python", ".venv313/bin/python")


def probe(python: str) -> dict | None:
    """Version and readiness of one interpreter; None (with a note) when it cannot run all
    variants."""
    code = ("import sys, json, line_profiler, gpuprof;"
            "from gpuprof import _native, _native_testing;"
            "print(json.dumps({'version': sys.version.split()[0],"
            "'line_profiler': line_profiler.__version__, 'floor': _native_testing.line_floor.mode,"
            "'tracer': _native.LineTracer.mode}))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except OSError as e:
        print(f"skip {python}: {e}", file=sys.stderr)
        return None
    if out.returncode != 0:
        print(f"skip {python}: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout)


def measure(python: str, workload: str, variant: str, scale: float) -> dict:
    cmd = [python, os.path.join(HERE, "_variant.py"), workload, variant, "--scale", str(scale)]
    env = dict(os.environ, PYTHONHASHSEED="0")  # same dict layouts in every subprocess
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(samples: dict[str, list[float]]) -> dict:
    med = {v: statistics.median(s) for v, s in samples.items() if s}
    plain = med.get("plain")
    rows = {}
    for v, m in med.items():
        s = samples[v]
        rows[v] = {"median_s": m, "min_s": min(s), "max_s": max(s), "n": len(s),
                   "ratio": m / plain if plain else None,
                   "added_s": m - plain if plain is not None else None}

    def added(v):
        return rows[v]["added_s"] if v in rows else None

    def over(a, b):
        x, y = added(a), added(b)
        return x / y if x is not None and y and y > 0 else None

    return {"variants": rows, "vs_lp": over("trace", "line_profiler"),
            "vs_floor": over("trace", "floor"), "vs_floor_ret": over("trace", "floor_ret")}


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def print_table(label: str, results: dict) -> None:
    print(f"\n{label}")
    head = (f"{'workload':<13} {'plain s':>7} {'floor':>6} {'fl+ret':>6} {'trace':>6} "
            f"{'lprof':>6} {'cProf':>6}  {'+floor':>7} {'+trace':>7} {'+lprof':>7}  "
            f"{'vs_lp':>5} {'vs_floor':>8} {'vs_fl+ret':>9}")
    print(head)
    print("-" * len(head))
    for w, s in results.items():
        v = s["variants"]

        def r(name):
            x = v.get(name, {}).get("ratio")
            return "—" if x is None else f"{x:.2f}x"

        def a(name):
            return fmt(v.get(name, {}).get("added_s"), ".3f")

        print(f"{w:<13} {fmt(v.get('plain', {}).get('median_s'), '.3f'):>7} "
              f"{r('floor'):>6} {r('floor_ret'):>6} {r('trace'):>6} {r('line_profiler'):>6} "
              f"{r('cprofile'):>6}  {a('floor'):>7} {a('trace'):>7} {a('line_profiler'):>7}  "
              f"{fmt(s['vs_lp'], '.2f'):>5} {fmt(s['vs_floor'], '.2f'):>8} "
              f"{fmt(s['vs_floor_ret'], '.2f'):>9}")
    print("ratios: median / plain median;  +X: median added seconds;  vs_lp = +trace / +lprof "
          "(target <= 0.5);  vs_floor = +trace / +floor (target <= 1.15);  vs_fl+ret = +trace "
          "/ +floor_ret (a LINE + PY_RETURN floor, 3.12+ only)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", dest="pythons",
                    help="interpreter to measure (repeatable; default: .venv, .venv312, "
                         ".venv313 where present)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="workload size factor (1.0 = ~0.3-1 s plain each)")
    ap.add_argument("--workload", action="append", dest="workloads", choices=WORKLOADS)
    ap.add_argument("--variant", action="append", dest="variants", choices=VARIANTS)
    ap.add_argument("--out", help="JSON path (default bench/results/linescope-<time>.json)")
    a = ap.parse_args()
    pythons = a.pythons or [p for p in DEFAULT_PYTHONS if os.path.exists(os.path.join(REPO, p))]
    workloads = a.workloads or list(WORKLOADS)
    variants = a.variants or list(VARIANTS)
    if "plain" not in variants:
        variants.insert(0, "plain")

    ready = {}
    for p in pythons:
        exe = p if os.path.isabs(p) else os.path.join(REPO, p)
        info = probe(exe)
        if info:
            ready[p] = (exe, info)
    if not ready:
        raise SystemExit("no interpreter with gpuprof and line_profiler installed "
                         "(pip install line_profiler into the venvs; see docs/benchmarks.md)")

    started = time.time()
    load_before = os.getloadavg()
    raw: dict = {p: {w: {v: [] for v in variants} for w in workloads} for p in ready}
    infos: dict = {p: {w: {} for w in workloads} for p in ready}
    for rnd in range(a.rounds):
        for p, (exe, _) in ready.items():
            for wi, w in enumerate(workloads):
                k = (rnd + wi) % len(variants)
                for v in variants[k:] + variants[:k]:
                    if v == "floor_ret" and ready[p][1]["floor"] == "settrace":
                        continue  # a trace function gets every return anyway: = floor
                    m = measure(exe, w, v, a.scale)
                    raw[p][w][v].append(m["seconds"])
                    infos[p][w][v] = m["info"]
        print(f"round {rnd + 1}/{a.rounds} done ({time.time() - started:.0f} s)",
              file=sys.stderr)

    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
              "seconds": time.time() - started,
              "command": " ".join([os.path.relpath(sys.executable, REPO)] + sys.argv),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "rounds": a.rounds, "scale": a.scale, "pythons": {}}
    for p, (exe, info) in ready.items():
        results = {w: summarise(raw[p][w]) for w in workloads}
        for w in workloads:
            results[w]["samples"] = raw[p][w]
            results[w]["info"] = infos[p][w]
        report["pythons"][p] = {"interpreter": info, "workloads": results}
        print_table(f"Python {info['version']} — tracer: {info['tracer']}, floor: "
                    f"{info['floor']}, line_profiler {info['line_profiler']} "
                    f"({a.rounds} rounds, scale {a.scale})", results)
    print(f"\nload average before/after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")

    out = a.out or os.path.join(REPO, "bench", "results",
                                time.strftime("linescope-%Y%m%d-%H%M%S.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {os.path.relpath(out, REPO)}")


if __name__ == "__main__":
    main()
