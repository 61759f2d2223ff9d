"""Markdown tables from bench/linescope results (for docs/benchmarks.md).

    .venv/bin/python bench/linescope/tables.py --runs bench/results/linescope-*.json
    .venv/bin/python bench/linescope/tables.py --instructions bench/results/instr-*.json

--runs: JSON files written by run.py (one per invocation). Per interpreter and workload: the
median over runs of each run's median ratio to plain, and for the target ratios the median
with the range over runs (min–max) when there are several.
--ls010: for runs that measured the peer LineScope 0.1.0 (run.py's ls010 variants), a table
of that peer beside our trace backend instead: ratios to plain, LineScope's to its own venv's
plain, vs_ls010 = trace's added time / LineScope's, and LineScope's run time / trace's.
--instructions: JSON files written by instructions.py.
"""

from __future__ import annotations

import argparse
import json
import statistics

VARIANTS = ("floor", "floor_ret", "trace", "line_profiler", "cprofile")
TARGETS = ("vs_lp", "vs_floor", "vs_floor_ret")


def fmt(x, spec=".2f"):
    return "—" if x is None else format(x, spec)


def spread(values, spec=".2f"):
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    mid = fmt(statistics.median(vals), spec)
    return mid if len(vals) == 1 else f"{mid} ({fmt(min(vals), spec)}–{fmt(max(vals), spec)})"


def load_runs(paths):
    """{python version: [one run's entry for that interpreter, ...]}."""
    by_python: dict = {}
    for p in paths:
        with open(p) as f:
            report = json.load(f)
        for d in report["pythons"].values():
            by_python.setdefault(d["interpreter"]["version"], []).append(d)
    return by_python


def median_ratio(rows, variant):
    ratios = [r["variants"].get(variant, {}).get("ratio") for r in rows]
    ratios = [x for x in ratios if x is not None]
    return statistics.median(ratios) if ratios else None


def ls010_tables(paths):
    for version, runs in load_runs(paths).items():
        runs = [run for run in runs if any("ls010" in w["variants"]
                                           for w in run["workloads"].values())]
        if not runs:
            continue
        print(f"\nPython {version} (LineScope 0.1.0 beside our trace backend; {len(runs)} "
              "run(s))\n")
        print("| workload | plain s | **trace** | line_profiler | LineScope 0.1.0 | its plain "
              "| vs_ls010 | LineScope ÷ trace |")
        print("|---|---|---|---|---|---|---|---|")
        workloads = list(dict.fromkeys(w for run in runs for w in run["workloads"]))
        for w in workloads:
            rows = [run["workloads"][w] for run in runs if w in run["workloads"]]
            plain = statistics.median(r["variants"]["plain"]["median_s"] for r in rows)
            cells = []
            for v in ("trace", "line_profiler", "ls010", "ls010_plain"):
                x = median_ratio(rows, v)
                cell = "—" if x is None else fmt(x) + "×"
                cells.append(f"**{cell}**" if v == "trace" else cell)
            # Below zero when trace's median fell under plain's (noise): shown as "—".
            vs_cell = spread([x if x is not None and x >= 0 else None
                              for x in (r.get("vs_ls010") for r in rows)], ".3f")
            x_cell = spread([r.get("ls010_x_trace") for r in rows], ".1f")
            print(f"| {w} | {plain:.3f} | " + " | ".join(cells) + f" | {vs_cell} | {x_cell} |")


def runs_tables(paths):
    for version, runs in load_runs(paths).items():
        info = runs[0]["interpreter"]
        print(f"\nPython {version} (tracer: {info['tracer']}; {len(runs)} run(s), runs per "
              "workload in the vs_* range)\n")
        print("| workload | plain s | floor | floor+ret | **trace** | line_profiler | cProfile "
              "| vs_lp | vs_floor | vs_floor+ret |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        workloads = list(dict.fromkeys(w for run in runs for w in run["workloads"]))
        for w in workloads:  # a partial rerun (--workload) adds runs for its workloads only
            rows = [run["workloads"][w] for run in runs if w in run["workloads"]]
            plain = statistics.median(r["variants"]["plain"]["median_s"] for r in rows)
            cells = []
            for v in VARIANTS:
                x = median_ratio(rows, v)
                cell = "—" if x is None else fmt(x) + "×"
                cells.append(f"**{cell}**" if v == "trace" else cell)
            targets = [spread([r.get(t) for r in rows]) for t in TARGETS]
            print(f"| {w} | {plain:.3f} | " + " | ".join(cells) + " | " + " | ".join(targets)
                  + " |")


def instruction_tables(paths):
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        lo, hi = d["scales"]
        name = f"Python {d['version']}" if d.get("version") else d["python"]
        print(f"\n{name} (instruction counts, scales {lo} → {hi})\n")
        print("| workload | plain (M instr.) | floor | floor+ret | **trace** | line_profiler "
              "| cProfile | vs_lp | vs_floor | vs_floor+ret |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for w, row in d["workloads"].items():
            delta, added = row["delta"], row["added"]
            plain = delta["plain"]
            cells = []
            for v in VARIANTS:
                cell = fmt(delta[v] / plain) + "×" if v in delta and plain else "—"
                cells.append(f"**{cell}**" if v == "trace" else cell)

            def over(a, b, added=added):
                return added[a] / added[b] if a in added and b in added and added[b] > 0 \
                    else None

            targets = [fmt(over("trace", "line_profiler")), fmt(over("trace", "floor")),
                       fmt(over("trace", "floor_ret"))]
            print(f"| {w} | {plain / 1e6:.0f} | " + " | ".join(cells) + " | "
                  + " | ".join(targets) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="*", default=[])
    ap.add_argument("--ls010", nargs="*", default=[])
    ap.add_argument("--instructions", nargs="*", default=[])
    a = ap.parse_args()
    if a.runs:
        runs_tables(a.runs)
    if a.ls010:
        ls010_tables(a.ls010)
    if a.instructions:
        instruction_tables(a.instructions)


if __name__ == "__main__":
    main()
