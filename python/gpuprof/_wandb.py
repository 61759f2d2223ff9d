"""profile(wandb=True): the run's headline figures, step breakdown and insights logged into
the active Weights & Biases run when the profile stops. Python because it touches wandb's
objects; the figures are the native report's (`gpuprof insights --json`), unchanged.

Logged into ``wandb.run.summary`` (keys under ``gpuprof/``): run_id, db, status, steps,
step_p50_ms (steady state), mfu (only when known; else mfu_unknown with the reason),
flops_per_step, breakdown/<part> (share of steady-state step time: loader_wait, each phase,
other), insights_count, top_insight; and two tables with ``wandb.run.log``:
``gpuprof/insights`` (severity, rule, message, fix) and ``gpuprof/step_breakdown`` (part,
share, mean ms per step). Without an active run (``wandb.init()`` not called, or finished):
one info line on stderr, nothing else. wandb is never imported here: a program that did not
import it has no run. A failure is a GpuprofWarning, never an exception into the program.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    run, steps, mfu = doc.get("run", {}), doc.get("steps", {}), doc.get("mfu", {})
    out: dict[str, Any] = {"gpuprof/run_id": run.get("run_id"),
                           "gpuprof/status": run.get("status"),
                           "gpuprof/steps": (steps.get("all") or {}).get("count", 0)}
    steady = steps.get("steady") or steps.get("all")
    if steady and steady.get("p50_ns") is not None:
        out["gpuprof/step_p50_ms"] = steady["p50_ns"] / 1e6
    if mfu.get("value") is not None:
        out["gpuprof/mfu"] = mfu["value"]
    else:
        out["gpuprof/mfu_unknown"] = mfu.get("reason") or "not measured"
    if run.get("flops_per_step") is not None:
        out["gpuprof/flops_per_step"] = run["flops_per_step"]
    for part, share, _ in _breakdown(doc):
        out[f"gpuprof/breakdown/{part}"] = share
    insights = doc.get("insights", [])
    out["gpuprof/insights_count"] = len(insights)
    if insights:
        out["gpuprof/top_insight"] = f"[{insights[0]['severity'].upper()}] {insights[0]['message']}"
    return out


def _breakdown(doc: dict[str, Any]) -> list[tuple[str, float, float | None]]:
    b = (doc.get("steps") or {}).get("breakdown") or {}
    rows: list[tuple[str, float, float | None]] = []
    if b.get("wait_fraction") is not None:
        rows.append(("loader_wait", b["wait_fraction"], None))
    for p in b.get("phases", []):
        mean = p.get("wall_mean_ns")
        rows.append((p["name"], p["wall_fraction"], None if mean is None else mean / 1e6))
    if b.get("other_fraction") is not None:
        rows.append(("other", b["other_fraction"], None))
    return rows


def log_run(db_path: str, run_id: int) -> None:
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    if wandb is None or run is None:
        print("gpuprof: wandb=True but there is no active wandb run (call wandb.init() before "
              "the profile ends); nothing logged", file=sys.stderr, flush=True)
        return
    try:
        from . import _native
        doc = json.loads(_native.run_report_json(db_path, run_id))
        summary = _summary(doc)
        summary["gpuprof/db"] = db_path
        for key, value in summary.items():
            run.summary[key] = value
        insights = wandb.Table(columns=["severity", "rule", "message", "fix"],
                               data=[[i["severity"], i["rule_id"], i["message"], i.get("fix")]
                                     for i in doc.get("insights", [])])
        breakdown = wandb.Table(columns=["part", "share", "mean_ms_per_step"],
                                data=[list(r) for r in _breakdown(doc)])
        run.log({"gpuprof/insights": insights, "gpuprof/step_breakdown": breakdown})
    except Exception as e:  # never into the training program
        from ._profile import GpuprofWarning
        warnings.warn(f"gpuprof: logging run {run_id} to wandb failed: {e!r}", GpuprofWarning,
                      stacklevel=2)
