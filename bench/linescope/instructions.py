"""Instruction counts (valgrind callgrind) of the linescope benchmark variants: repeatable
where wall time on a shared machine is not.

    .venv/bin/python bench/linescope/instructions.py [--python P] [--workload W]
        [--variant V] [--scales 0.03 0.09]

Each (workload, variant) runs under `valgrind --tool=callgrind` at two workload scales; the
difference of the two totals is the cost of the extra work alone (interpreter start-up,
imports, tracer set-up and result building cancel out). PYTHONHASHSEED=0 keeps dict layouts
the same from run to run. Reported: that difference per
variant, its ratio to plain, the added instructions (variant - plain) and the same two
target ratios as run.py (trace added / line_profiler added, trace added / floor added).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from run import VARIANTS, WORKLOADS  # noqa: E402


def instructions(python: str, workload: str, variant: str, scale: float) -> int:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
               python, os.path.join(HERE, "_variant.py"), workload, variant,
               "--scale", str(scale)]
        env = dict(os.environ, PYTHONHASHSEED="0")  # same dict layouts in every run
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
        m = re.search(r"Collected : (\d+)", p.stderr)
        return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=".venv/bin/python")
    ap.add_argument("--workload", action="append", dest="workloads", choices=WORKLOADS)
    ap.add_argument("--variant", action="append", dest="variants", choices=VARIANTS)
    ap.add_argument("--scales", type=float, nargs=2, default=(0.03, 0.09))
    ap.add_argument("--json", help="also write the figures to this JSON file")
    a = ap.parse_args()
    python = a.python if os.path.isabs(a.python) else os.path.join(REPO, a.python)
    variants = a.variants or list(VARIANTS)
    if "plain" not in variants:
        variants.insert(0, "plain")
    lo, hi = a.scales
    report = {}
    print(f"{python}  scales {lo} -> {hi}: instructions of the extra work (plain, in "
          "millions) and each variant's multiple of plain")
    print(f"{'workload':<13} " + " ".join(f"{v[:9]:>10}" for v in variants)
          + f" {'vs_lp':>6} {'vs_floor':>8}")
    for w in a.workloads or WORKLOADS:
        d = {v: instructions(python, w, v, hi) - instructions(python, w, v, lo)
             for v in variants}
        added = {v: d[v] - d["plain"] for v in variants}

        def over(x, y, added=added):
            return added[x] / added[y] if x in added and y in added and added[y] > 0 else None

        row = {"delta": d, "added": added, "vs_lp": over("trace", "line_profiler"),
               "vs_floor": over("trace", "floor")}
        report[w] = row
        cells = " ".join(f"{d[v] / 1e6:>9.1f}M" if v == "plain"
                         else f"{d[v] / d['plain']:>9.2f}x" for v in variants)
        fmt = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
        print(f"{w:<13} {cells} {fmt(row['vs_lp']):>6} {fmt(row['vs_floor']):>8}", flush=True)
    if a.json:
        version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True).stdout.strip()
        with open(a.json, "w") as f:
            json.dump({"python": os.path.relpath(python, REPO), "version": version,
                       "scales": [lo, hi], "workloads": report}, f, indent=1)


if __name__ == "__main__":
    main()
