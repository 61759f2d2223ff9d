"""Runs ONE workload under ONE variant in this process and prints one JSON line.

Used by run.py (each measurement in a fresh subprocess). Timed region: the workload's
main() only — imports, `setup()`, tracer start and stop (and building a result) are outside
it, so every variant is charged only for what it adds while the code runs. Every variant
imports all the tools first, so that they start from the same heap.

    python _variant.py WORKLOAD VARIANT [--scale F]

Variants:
  plain          nothing installed
  floor          gpuprof._native_testing.line_floor: one clock read + one counter per line event of
                 code under the root (sys.monitoring LINE on 3.12+, C trace function on 3.11)
  floor_ret      the same hook also on every return of code under the root (3.12+: LINE +
                 PY_RETURN, the event set of a tracer that sees each frame exit; on 3.11 the
                 trace function gets returns anyway, so this equals `floor`)
  trace          linescope `trace` backend, root = workloads/ (display="none")
  line_profiler  line_profiler.LineProfiler with add_module(workload) — every function and
                 method defined in the workload file, the same code linescope records — and
                 enable_by_count() around main(); no per-call decorator wrapper
  cprofile       cProfile.Profile enable/disable around main()

Peer variants, run by the separate venv that run.py makes for LineScope 0.1.0 (PyPI
`linescope==0.1.0`, whose package name clashes with ours, so it cannot share the project's
venv); that interpreter imports LineScope 0.1.0 (and cProfile) only:
  ls010_plain    nothing installed: LineScope's own baseline, in its venv
  ls010          LineScope 0.1.0's `trace` backend through its public API: profile(backend=
                 "trace", root=workloads/, display="none", notebooks=False, spark=False), with
                 every other option given explicitly so that no [tool.linescope] table of this
                 repository's pyproject.toml applies; the result's lines are summed after stop()
                 (outside the timed region) so that run.py can check it recorded the workload
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "workloads")
DEPS = os.path.join(HERE, "deps")
VARIANTS = ("plain", "floor", "floor_ret", "trace", "line_profiler", "cprofile")
PEER_VARIANTS = ("ls010_plain", "ls010")
LS010_VERSION = "0.1.0"


def run(workload: str, variant: str, scale: float) -> dict:
    # Every variant imports every tool, so that heap layout and import side effects are the
    # same whichever one runs (pymalloc's pool state changes per-allocation costs). The peer
    # venv has LineScope 0.1.0 under the same package name instead of ours and the rest.
    import cProfile
    import linescope
    if variant in PEER_VARIANTS:
        version = getattr(linescope, "__version__", None)
        if version != LS010_VERSION:
            raise SystemExit(f"{variant} needs LineScope {LS010_VERSION}'s venv; this "
                             f"interpreter has linescope {version!r} ({sys.executable})")
    else:
        import line_profiler
        from gpuprof import _native
        del line_profiler, _native
    del cProfile

    sys.path[:0] = [WORKLOADS, DEPS]
    mod = importlib.import_module(workload)
    mod.scale(scale)
    if hasattr(mod, "setup"):
        mod.setup()
    # Objects that exist now (the tools, numpy/pandas) move to the permanent generation, so
    # that collections in the timed region cost the same in every variant.
    gc.collect()
    gc.freeze()
    info: dict = {}
    if variant in ("plain", "ls010_plain"):
        t0 = time.perf_counter_ns()
        mod.main()
        t1 = time.perf_counter_ns()
    elif variant in ("floor", "floor_ret"):
        from gpuprof import _native_testing
        floor = _native_testing.line_floor
        floor.start(WORKLOADS, returns=variant == "floor_ret")
        t0 = time.perf_counter_ns()
        mod.main()
        t1 = time.perf_counter_ns()
        events, _span = floor.stop()
        info = {"events": events, "hook": floor.mode}
    elif variant == "trace":
        from linescope import profile
        session = profile(root=WORKLOADS, display="none")
        session.start()
        t0 = time.perf_counter_ns()
        mod.main()
        t1 = time.perf_counter_ns()
        session.stop()
        r = session.result
        info = {"hits": sum(s.hits for s in r.lines),
                "files": sorted({os.path.basename(s.filename) for s in r.lines}),
                "tracer": r.metadata.get("tracer") if hasattr(r, "metadata") else None}
    elif variant == "ls010":
        session = linescope.profile(
            backend="trace", root=WORKLOADS, include=(), exclude=(), memory=False, gpu=False,
            spark=False, notebooks=False, child_notebooks=False, display="none", output=None)
        session.start()
        t0 = time.perf_counter_ns()
        mod.main()
        t1 = time.perf_counter_ns()
        session.stop()
        res = session.result
        lines = [s for s in res.root_run.lines if s.hits]
        info = {"version": linescope.__version__, "backend": str(res.backend),
                "hits": sum(s.hits for s in lines),
                "files": sorted({os.path.basename(s.location.source_id) for s in lines}),
                "line_time_s": sum(s.wall_time_ns or 0 for s in lines) / 1e9,
                "calls": sum(f.calls or 0 for f in res.root_run.functions)}
    elif variant == "line_profiler":
        import line_profiler
        prof = line_profiler.LineProfiler()
        added = prof.add_module(mod)
        prof.enable_by_count()
        t0 = time.perf_counter_ns()
        mod.main()
        t1 = time.perf_counter_ns()
        prof.disable_by_count()
        stats = prof.get_stats()
        info = {"functions": added, "version": line_profiler.__version__,
                "hits": sum(n for lines in stats.timings.values() for _, n, _ in lines)}
    elif variant == "cprofile":
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
        t0 = time.perf_counter_ns()
        mod.main()
        t1 = time.perf_counter_ns()
        prof.disable()
    else:
        raise SystemExit(f"unknown variant {variant!r}; one of "
                         f"{', '.join(VARIANTS + PEER_VARIANTS)}")
    return {"workload": workload, "variant": variant, "scale": scale,
            "seconds": (t1 - t0) / 1e9, "info": info}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("variant", choices=VARIANTS + PEER_VARIANTS)
    ap.add_argument("--scale", type=float, default=1.0)
    a = ap.parse_args()
    print(json.dumps(run(a.workload, a.variant, a.scale)))


if __name__ == "__main__":
    main()
