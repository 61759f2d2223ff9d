"""GPU checks of kernel traces (issue: trace modes, top kernels, sdpa_suboptimal, kernel_drift,
continuous mode's cost). Imported by checks.py; each function takes (ctx, check).

On CUDA: kernels come from gpuprof's CUPTI capture (kernels table, source 'cupti'); the
transformer's traced steps are cross-checked against the check's own CUDA events (a step's
summed kernel time cannot exceed the step's GPU span by more than concurrency allows, and on a
GPU-bound step covers most of it). In a dry run (CPU) the same code paths record the CPU
operators (cpu_ops) instead, and the assertions read that table.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

Ctx = Check = Any  # checks.py's classes; its helpers come in as `lib` (no import cycle)

TRACE_EVERY = 4
WARMUP = {0, 1, 5}


def _traced_rows(ctx: Ctx, run_id: int) -> tuple[str, list[dict[str, Any]]]:
    table = "kernels" if ctx.cuda else "cpu_ops"
    return table, ctx.rows(f"SELECT * FROM {table} WHERE run_id = ?", run_id)


def _rule(doc: dict[str, Any], rule_id: str) -> tuple[Any, Any]:
    fired = [i for i in doc.get("insights", []) if i["rule_id"] == rule_id]
    skipped = [n["reason"] for n in doc.get("not_evaluated", []) if n["rule_id"] == rule_id]
    return (fired[0] if fired else None), (skipped[0] if skipped else None)


def _attention_model(ctx: Ctx, fused: bool, d: int, heads: int) -> Any:
    torch = ctx.torch
    nn = torch.nn

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.out = nn.Linear(d, d, bias=False)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            if fused:
                a = nn.functional.scaled_dot_product_attention(q, k, v)
            else:
                w = torch.softmax(q @ k.transpose(-2, -1) / (d // heads) ** 0.5, dim=-1)
                a = w @ v
            return self.out(a.transpose(1, 2).reshape(b, s, d))

    torch.manual_seed(0)
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    return nn.Sequential(Attn(), Attn()).to(ctx.device, dtype), dtype


def _train(ctx: Ctx, model: Any, x: Any, steps: int) -> None:
    opt = ctx.torch.optim.SGD(model.parameters(), lr=1e-5)
    for _ in range(steps):
        model(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    ctx.sync()


def check_traces(ctx: Ctx, c: Check, lib: Any) -> None:
    """lib: the checks module (sizes, Timers, TrainLoop, record_warnings, rnd)."""
    sizes, Timers, TrainLoop = lib.sizes, lib.Timers, lib.TrainLoop
    record_warnings, rnd = lib.record_warnings, lib.rnd
    torch = ctx.torch
    sz = sizes(ctx)
    timers = Timers(ctx)
    table = "kernels" if ctx.cuda else "cpu_ops"
    time_col = "gpu_ns" if ctx.cuda else "self_cpu_ns"

    # 1. A transformer (SDPA) with trace_every_n_steps: which steps, what rows, against events.
    loop = TrainLoop(ctx, sz["tf"])
    for _ in range(sz["warm_steps"]):
        loop.step()
    ctx.sync()
    steps = 10
    marks: list[Any] = []
    with record_warnings(c), ctx.profile("gpu-check-traces", trace_every_n_steps=TRACE_EVERY) as p:
        for _ in range(steps):
            m0 = timers.mark()
            loop.step()
            marks.append((m0, timers.mark()))
        ctx.sync()
    run = p.run_id
    ctx.sync()
    step_gpu_ms = [timers.ms(a, b) for a, b in marks]
    _, rows = _traced_rows(ctx, run)
    traced = sorted({r["step"] for r in rows if r["step"] is not None})
    want = sorted(s for s in range(steps) if s in WARMUP or s % TRACE_EVERY == 0)
    c.expect(f"traced steps ({table})", traced, traced == want, f"== {want}")
    c.figures["rows"] = len(rows)
    c.figures["diagnostics"] = [d for d in ctx.diagnostics(run) if "kernels" in d]
    c.figures["telemetry_kernels"] = ctx.telemetry_status(run).get("kernels")
    if ctx.cuda:
        complete = [r for r in rows if not r["name"].startswith("(")]
        c.expect("kernel rows with grid, block, stream and device", len(complete),
                 bool(complete) and all(r["grid"] and r["block"] and r["stream"] is not None
                                        and r["device"] is not None for r in complete),
                 "all non-null")
        c.expect("min_ns <= gpu_ns / calls <= max_ns", len(complete), all(
            r["min_ns"] <= r["gpu_ns"] / r["calls"] <= r["max_ns"] for r in complete), "all")
        per_step: dict[int, int] = {}
        for r in rows:
            per_step[r["step"]] = per_step.get(r["step"], 0) + int(r["gpu_ns"])
        cover = {s: per_step[s] / 1e6 / step_gpu_ms[s] for s in per_step if s > 1}
        c.figures["kernel_ms_over_event_ms"] = {s: rnd(v, 3) for s, v in cover.items()}
        c.expect("steady traced steps: summed kernel time / own CUDA-event step time",
                 rnd(min(cover.values()), 3) if cover else None,
                 bool(cover) and all(0.6 <= v <= 1.05 for v in cover.values()),
                 "in [0.6, 1.05] (GPU-bound, kernels mostly serial)")
    doc, err = ctx.insights_json(run)
    if doc is None:
        c.expect("gpuprof insights --json", err, False, "runs")
        return
    top = doc.get("top_kernels", {})
    c.figures["top_kernels"] = top.get("top", [])[:8]
    c.expect("insights top_kernels recorded", top.get("kind"),
             top.get("recorded") is True
             and top.get("kind") == ("kernels" if ctx.cuda else "cpu_operators"), "recorded")
    fired, reason = _rule(doc, "sdpa_suboptimal")
    c.expect("sdpa_suboptimal on a model using SDPA", fired and fired["message"],
             fired is None and reason is None, "evaluated, not fired")
    del loop
    if ctx.cuda:
        torch.cuda.empty_cache()

    # 2. Hand-written attention: sdpa_suboptimal fires from the captured kernels.
    d, heads, seq = (1024, 16, 2048) if ctx.cuda else (32, 2, 256)
    model, dtype = _attention_model(ctx, fused=False, d=d, heads=heads)
    x = torch.randn(4, seq, d, device=ctx.device, dtype=dtype)
    _train(ctx, model, x, 2)
    with record_warnings(c), ctx.profile("gpu-check-traces-unfused", trace_every_n_steps=2) as p:
        _train(ctx, model, x, 6)
    doc, err = ctx.insights_json(p.run_id)
    fired, reason = _rule(doc or {}, "sdpa_suboptimal")
    c.figures["unfused_top"] = ((doc or {}).get("top_kernels", {}).get("top") or [])[:6]
    c.expect("sdpa_suboptimal on matmul-softmax-matmul", fired and fired["message"] or reason,
             fired is not None, "fires")
    del model
    if ctx.cuda:
        torch.cuda.empty_cache()

    # 3. kernel_drift: a matmul that grows 4x in the second half of the run.
    n = 2048 if ctx.cuda else 96
    a = torch.randn(n, n, device=ctx.device, dtype=dtype, requires_grad=True)
    big = torch.randn(2 * n, 2 * n, device=ctx.device, dtype=dtype, requires_grad=True)
    opt = torch.optim.SGD([a, big], lr=1e-6)
    with record_warnings(c), ctx.profile("gpu-check-traces-drift", trace_every_n_steps=2) as p:
        for i in range(16):
            m = a if i < 8 else big
            (m @ m).float().square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        ctx.sync()
    doc, err = ctx.insights_json(p.run_id)
    fired, reason = _rule(doc or {}, "kernel_drift")
    c.expect("kernel_drift on a matmul growing 8x in FLOPs", fired and fired["message"] or reason,
             fired is not None, "fires")
    del a, big, opt

    # 4. Continuous mode: its cost on the transformer, and its rows per window bounded.
    loop = TrainLoop(ctx, sz["tf"])
    for _ in range(sz["warm_steps"]):
        loop.step()
    per: dict[str, list[float]] = {"untraced": [], "continuous": []}
    cont_runs = []
    for r in range(sz["ovh_rounds"]):
        for mode in (("untraced", "continuous") if r % 2 == 0 else ("continuous", "untraced")):
            kw = {"continuous_traces_hz": 1.0} if mode == "continuous" else {}
            with record_warnings(c), ctx.profile(f"gpu-check-traces-{mode}", **kw) as p:
                ctx.sync()
                t0 = time.perf_counter()
                for _ in range(sz["ovh_block"]):
                    loop.step()
                ctx.sync()
                per[mode].append((time.perf_counter() - t0) / sz["ovh_block"])
            if mode == "continuous":
                cont_runs.append(p.run_id)
    med = {k: statistics.median(v) for k, v in per.items()}
    ratio_c = med["continuous"] / med["untraced"]
    c.figures["continuous_median_step_ms"] = {k: rnd(v * 1e3, 3) for k, v in med.items()}
    c.expect("median step, continuous_traces_hz=1 / no trace (bf16 transformer)", rnd(ratio_c, 4),
             ratio_c <= 1.01, "<= 1.01", required=ctx.cuda)
    if ctx.cuda:
        windows = ctx.rows(f"SELECT window_start_ns, COUNT(*) n, SUM({time_col}) t FROM {table} "
                           "WHERE run_id = ? GROUP BY window_start_ns", cont_runs[-1])
        c.figures["continuous_windows"] = len(windows)
        c.expect("continuous: rows per 1 s window", max((w["n"] for w in windows), default=0),
                 bool(windows) and all(w["n"] <= 65 for w in windows), "1..65")
    c.headline = (f"traced steps {traced}; top kernel "
                  f"{(top.get('top') or [{}])[0].get('name', '-')}; continuous x{rnd(ratio_c, 3)}")
