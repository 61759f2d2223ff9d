"""linescope `trace` backend overhead, side by side with peers, in one invocation.

Not a pass/fail test. Run: `make bench-lines` (or `.venv/bin/python bench/linescope/run.py`).

For every Python given (default: .venv = 3.11, C trace function; .venv312 = 3.12,
sys.monitoring; .venv313 = 3.13 when present) and every workload in workloads/, each
variant of _variant.py (plain, floor, floor_ret, trace, line_profiler, cprofile, ls010_plain,
ls010) runs in a fresh subprocess (floor_ret only where it differs from floor: 3.12+). Rounds are
interleaved: round r runs every (workload, variant) once, with the variant order rotated
from round to round, so slow drift of a shared machine spreads over all variants instead of
landing on one. Reported per (python, workload, variant): the
median of the timed region (main() only), the ratio to plain and the added time
(variant - plain); and the two target ratios of issue 4:

    vs_lp    = trace_added / line_profiler_added   (target <= 0.5)
    vs_floor = trace_added / floor_added           (target <= 1.15 on 3.12)

and vs_floor_ret = trace_added / floor_ret_added, against a floor that also takes the
PY_RETURN event the tracer needs (3.12+).

Peer LineScope 0.1.0 (PyPI `linescope==0.1.0`, the project ours is compared with): its package
is also named `linescope`, so it runs from its own venv, build/bench-peers/linescope-0.1.0-pyX.Y,
made here on first use from the same interpreter (pinned: PEER_REQUIREMENTS, plus the numpy
and pandas versions of the measured venv; remade only when that pin set changes). There
`ls010_plain` is its own plain baseline and `ls010` its `trace` backend; ls010's ratio and
added time are against ls010_plain (ls010_plain's ratio to plain shows that the two venvs run
the workloads alike), and

    vs_ls010 = trace_added / ls010_added   (how much of LineScope 0.1.0's added time ours adds)
    ls010_x_trace = ls010 median / trace median

A LineScope run that did not record the workload's file, or whose total line hits differ from
our trace backend's by more than 1 %, stops the benchmark (a broken peer is never reported as
fast). `--variant` without ls010 skips the peer (and its venv).

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
VARIANTS = ("plain", "floor", "floor_ret", "trace", "line_profiler", "cprofile", "ls010_plain",
            "ls010")
PEER_VARIANTS = ("ls010_plain", "ls010")
# ls010's ratio and added time are against its own venv's plain run.
BASE = {"ls010": "ls010_plain"}
# LineScope 0.1.0 and its dependencies (click>=8.4.2, psutil>=5.9), pinned; numpy and pandas
# are pinned to the measured venv's versions at setup (the numpy_pandas workload needs them).
PEER_REQUIREMENTS = ("linescope==0.1.0", "click==8.5.1", "psutil==7.2.2")
PEER_DIR = os.path.join(REPO, "build", "bench-peers")
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
            "'tracer': _native.LineTracer.mode, 'numpy': v('numpy'), 'pandas': v('pandas')}))")
    code = ("import importlib.metadata as md\n"
            "def v(name):\n"
            "    try:\n"
            "        return md.version(name)\n"
            "    except md.PackageNotFoundError:\n"
            "        return None\n" + code)
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except OSError as e:
        print(f"skip {python}: {e}", file=sys.stderr)
        return None
    if out.returncode != 0:
        print(f"skip {python}: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout)


def peer_python(exe: str, info: dict) -> str | None:
    """The interpreter of LineScope 0.1.0's venv for the measured interpreter `exe`: made (or
    remade, when its pin set changed) with `exe -m venv` and pip; None (with a note) when that
    fails, e.g. without access to a package index."""
    major_minor = ".".join(info["version"].split(".")[:2])
    venv = os.path.join(PEER_DIR, f"linescope-0.1.0-py{major_minor}")
    python = os.path.join(venv, "bin", "python")
    pins = list(PEER_REQUIREMENTS) + [f"{name}=={info[name]}" for name in ("numpy", "pandas")
                                      if info.get(name)]
    stamp = os.path.join(venv, "bench-requirements.txt")
    wanted = "\n".join(pins) + "\n"
    if os.path.exists(python) and os.path.exists(stamp):
        with open(stamp) as f:
            if f.read() == wanted:
                return python
    print(f"making {os.path.relpath(venv, REPO)}: {' '.join(pins)}", file=sys.stderr)
    try:
        subprocess.run([exe, "-m", "venv", "--clear", venv], check=True, timeout=300)
        subprocess.run([python, "-m", "pip", "install", "-q", *pins], check=True, timeout=900)
        check = subprocess.run([python, "-c", "import linescope; print(linescope.__version__)"],
                               capture_output=True, text=True, timeout=120)
        if check.stdout.strip() != "0.1.0":
            raise RuntimeError(f"linescope {check.stdout.strip()!r} {check.stderr.strip()}")
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        print(f"skip LineScope 0.1.0 for {exe}: {e}", file=sys.stderr)
        return None
    with open(stamp, "w") as f:
        f.write(wanted)
    return python


def check_peer(workload: str, info: dict, trace_hits: int | None) -> None:
    """Stops the run when LineScope's result does not show the workload it timed."""
    hits = info.get("hits") or 0
    if f"{workload}.py" not in info.get("files", []) or hits <= 0:
        raise RuntimeError(f"LineScope 0.1.0 did not record {workload}.py: {info}")
    if trace_hits and abs(hits - trace_hits) > 0.01 * trace_hits:
        raise RuntimeError(f"LineScope 0.1.0 recorded {hits} line hits in {workload}, our "
                           f"trace backend {trace_hits}: {info}")


def measure(python: str, workload: str, variant: str, scale: float) -> dict:
    cmd = [python, os.path.join(HERE, "_variant.py"), workload, variant, "--scale", str(scale)]
    env = dict(os.environ, PYTHONHASHSEED="0")  # same dict layouts in every subprocess
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(samples: dict[str, list[float]]) -> dict:
    med = {v: statistics.median(s) for v, s in samples.items() if s}
    rows = {}
    for v, m in med.items():
        s = samples[v]
        base = med.get(BASE.get(v, "plain"))
        rows[v] = {"median_s": m, "min_s": min(s), "max_s": max(s), "n": len(s),
                   "ratio": m / base if base else None,
                   "added_s": m - base if base is not None else None}

    def added(v):
        return rows[v]["added_s"] if v in rows else None

    def over(a, b):
        x, y = added(a), added(b)
        return x / y if x is not None and y and y > 0 else None

    ls_x_trace = (med["ls010"] / med["trace"] if "ls010" in med and med.get("trace")
                  else None)
    return {"variants": rows, "vs_lp": over("trace", "line_profiler"),
            "vs_floor": over("trace", "floor"), "vs_floor_ret": over("trace", "floor_ret"),
            "vs_ls010": over("trace", "ls010"), "ls010_x_trace": ls_x_trace}


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def print_table(label: str, results: dict) -> None:
    print(f"\n{label}")
    head = (f"{'workload':<13} {'plain s':>7} {'floor':>6} {'fl+ret':>6} {'trace':>6} "
            f"{'lprof':>6} {'cProf':>6}  {'+floor':>7} {'+trace':>7} {'+lprof':>7}  "
            f"{'vs_lp':>5} {'vs_floor':>8} {'vs_fl+ret':>9}  {'ls-pl':>5} {'ls010':>6} "
            f"{'vs_ls':>5} {'ls/tr':>6}")
    print(head)
    print("-" * len(head))
    for w, s in results.items():
        v = s["variants"]

        def r(name, v=v):
            x = v.get(name, {}).get("ratio")
            return "—" if x is None else f"{x:.2f}x"

        def a(name, v=v):
            return fmt(v.get(name, {}).get("added_s"), ".3f")

        print(f"{w:<13} {fmt(v.get('plain', {}).get('median_s'), '.3f'):>7} "
              f"{r('floor'):>6} {r('floor_ret'):>6} {r('trace'):>6} {r('line_profiler'):>6} "
              f"{r('cprofile'):>6}  {a('floor'):>7} {a('trace'):>7} {a('line_profiler'):>7}  "
              f"{fmt(s['vs_lp'], '.2f'):>5} {fmt(s['vs_floor'], '.2f'):>8} "
              f"{fmt(s['vs_floor_ret'], '.2f'):>9}  {r('ls010_plain'):>5} {r('ls010'):>6} "
              f"{fmt(s['vs_ls010'], '.3f'):>5} {fmt(s['ls010_x_trace'], '.1f'):>6}")
    print("ratios: median / plain median;  +X: median added seconds;  vs_lp = +trace / +lprof "
          "(target <= 0.5);  vs_floor = +trace / +floor (target <= 1.15);  vs_fl+ret = +trace "
          "/ +floor_ret (a LINE + PY_RETURN floor, 3.12+ only);  ls-pl: LineScope 0.1.0's venv, "
          "plain / plain;  ls010: LineScope 0.1.0 trace / ls-pl;  vs_ls = +trace / +ls010;  "
          "ls/tr = ls010 median / trace median")


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
    if "ls010" in variants and "ls010_plain" not in variants:
        variants.insert(variants.index("ls010"), "ls010_plain")

    ready = {}
    for p in pythons:
        exe = p if os.path.isabs(p) else os.path.join(REPO, p)
        info = probe(exe)
        if info:
            info["peer_python"] = None
            if "ls010" in variants:
                peer = peer_python(exe, info)
                info["peer_python"] = os.path.relpath(peer, REPO) if peer else None
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
                    peer = ready[p][1]["peer_python"]
                    if v in PEER_VARIANTS and not peer:
                        continue  # its venv could not be made (noted above)
                    m = measure(os.path.join(REPO, peer) if v in PEER_VARIANTS else exe, w, v,
                                a.scale)
                    if v == "ls010":
                        check_peer(w, m["info"], infos[p][w].get("trace", {}).get("hits"))
                    raw[p][w][v].append(m["seconds"])
                    infos[p][w][v] = m["info"]
        print(f"round {rnd + 1}/{a.rounds} done ({time.time() - started:.0f} s)",
              file=sys.stderr)
    for p in ready:  # the hit check of a round where ls010 ran before trace
        for w in workloads:
            if "ls010" in infos[p][w]:
                check_peer(w, infos[p][w]["ls010"], infos[p][w].get("trace", {}).get("hits"))

    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
              "seconds": time.time() - started,
              "command": " ".join([os.path.relpath(sys.executable, REPO), *sys.argv]),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "rounds": a.rounds, "scale": a.scale, "pythons": {}}
    for p, (_exe, info) in ready.items():
        results = {w: summarise(raw[p][w]) for w in workloads}
        for w in workloads:
            results[w]["samples"] = raw[p][w]
            results[w]["info"] = infos[p][w]
        report["pythons"][p] = {"interpreter": info, "workloads": results}
        print_table(f"Python {info['version']} — tracer: {info['tracer']}, floor: "
                    f"{info['floor']}, line_profiler {info['line_profiler']}, LineScope 0.1.0: "
                    f"{info['peer_python'] or '—'} "
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
