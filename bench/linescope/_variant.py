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


def run(workload: str, variant: str, scale: float) -> dict:
    # Every variant imports every tool, so that heap layout and import side effects are the
    # same whichever one runs (pymalloc's pool state changes per-allocation costs).
    import cProfile  # noqa: F401
    import line_profiler  # noqa: F401
    import linescope  # noqa: F401
    from gpuprof import _native  # noqa: F401

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
    if variant == "plain":
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
        raise SystemExit(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    return {"workload": workload, "variant": variant, "scale": scale,
            "seconds": (t1 - t0) / 1e9, "info": info}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("variant", choices=VARIANTS)
    ap.add_argument("--scale", type=float, default=1.0)
    a = ap.parse_args()
    print(json.dumps(run(a.workload, a.variant, a.scale)))


if __name__ == "__main__":
    main()
