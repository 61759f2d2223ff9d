"""GPU checks of linescope's `sampler` backend (imported by checks.py as the "linescope" check).

Through the public API only (`linescope.profile(backend="sampler", gpu=True)`):

1. Attribution: a step with one matmul-heavy line, one light elementwise line and one
   synchronize line. With CUPTI (measured kernel time) the matmul line must receive most of the
   attributed GPU time; the same step with GPUPROF_CUPTI=0 (NVML utilization estimate) is
   recorded for comparison (the estimate lands where the GPU is busy, usually the sync line).
2. Peak memory: the highest per-line GPU peak memory vs torch.cuda.max_memory_allocated():
   at least the allocated peak, at most the reserved peak plus the CUDA context slack.
3. Overhead: the same training loop plain, under the sampler with gpu=False and gpu=True
   (1 kHz and 5 kHz), interleaved; ratios to plain.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

THRESHOLDS = {
    "matmul_share_min": 0.80,          # matmul line / all attributed GPU time (CUPTI)
    "peak_over_reserved_max_gib": 2.0,  # line peak - torch reserved peak (CUDA context)
    "sampler_gpu_overhead_max": 1.03,   # gpu=True / plain, 1 kHz, GPU-bound loop
}

WORKLOAD = '''
import torch


def step(a, b, small):
    c = a @ b; c = c @ b; c = c @ b; c = c @ b
    s = small * 2.0 + 1.0
    torch.cuda.synchronize() if a.is_cuda else None
    return c, s
'''
MATMUL_LINE, LIGHT_LINE, SYNC_LINE = 6, 7, 8


def _module(work: Path) -> Any:
    path = work / "ls_gpu_work.py"
    path.write_text(WORKLOAD.lstrip("\n"))
    spec = importlib.util.spec_from_file_location("ls_gpu_work", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _profiled(ctx: Any, root: Path, fn: Any, *, cupti: bool, memory: bool = False,
              rate: float | None = None) -> Any:
    import linescope

    prev = os.environ.get("GPUPROF_CUPTI")
    os.environ["GPUPROF_CUPTI"] = "1" if cupti else "0"
    try:
        kw: dict[str, Any] = dict(backend="sampler", gpu=True, memory=memory, root=str(root),
                                  display="none")
        if rate:
            kw["sample_rate"] = rate
        with linescope.profile(**kw) as s:
            fn()
        return s.result
    finally:
        if prev is None:
            os.environ.pop("GPUPROF_CUPTI", None)
        else:
            os.environ["GPUPROF_CUPTI"] = prev


def _gpu_by_line(result: Any, path: str) -> dict[int, int]:
    return {s.line: s.gpu.time_ns for s in result.lines
            if s.filename == path and s.gpu is not None and s.gpu.time_ns is not None}


def check_linescope(ctx: Any, c: Any) -> None:
    torch = ctx.torch
    n = 8192 if ctx.cuda else 64
    steps = 6 if ctx.cuda else 2
    mod = _module(ctx.work)
    path = str((ctx.work / "ls_gpu_work.py").resolve())
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    small = torch.randn(1024, device=ctx.device)
    mod.step(a, b, small)  # warm-up (cuBLAS handles, autotune)
    ctx.sync()

    def work() -> None:
        for _ in range(steps):
            mod.step(a, b, small)

    # 1. attribution
    r = _profiled(ctx, ctx.work, work, cupti=True)
    g = r.gpu
    c.figures["cupti_method"] = g.method
    c.figures["cupti_diagnostics"] = g.diagnostics
    by_line = _gpu_by_line(r, path)
    total = sum(by_line.values())
    share = by_line.get(MATMUL_LINE, 0) / total if total else None
    c.figures["gpu_ms_by_line_cupti"] = {k: round(v / 1e6, 3) for k, v in by_line.items()}
    c.figures["matmul_share_cupti"] = share
    if ctx.cuda:
        c.expect("GPU time method with CUPTI available", g.method, g.method == "cupti",
                 "== cupti", required=False)
        mn = THRESHOLDS["matmul_share_min"]
        c.expect("matmul line share of attributed GPU time", share,
                 share is not None and share >= mn, f">= {mn}")
        flops = 2 * n ** 3 * 4 * steps
        c.figures["matmul_tflops_from_line_gpu_time"] = (
            flops / (by_line[MATMUL_LINE] / 1e9) / 1e12 if by_line.get(MATMUL_LINE) else None)
    est = _profiled(ctx, ctx.work, work, cupti=False)
    c.figures["gpu_ms_by_line_nvml_estimate"] = {
        k: round(v / 1e6, 3) for k, v in _gpu_by_line(est, path).items()}
    c.figures["nvml_method"] = est.gpu.method
    c.figures["nvml_time_reason"] = est.gpu.time_reason

    # 2. peak memory vs torch's own figure
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    big: list[Any] = []

    def grow() -> None:
        for _ in range(4):
            big.append(torch.empty(2 * 1024 ** 3 if ctx.cuda else 1024, dtype=torch.uint8,
                                   device=ctx.device))
            time.sleep(0.05)
        ctx.sync()

    m = _profiled(ctx, ctx.work, grow, cupti=False, memory=True)
    peaks = [s.gpu.peak_memory_bytes for s in m.lines
             if s.gpu and s.gpu.peak_memory_bytes is not None]
    line_peak = max(peaks) if peaks else None
    c.figures["gpu_peak_line_gib"] = None if line_peak is None else line_peak / 2 ** 30
    c.figures["memory_reason"] = m.gpu.memory_reason
    if ctx.cuda:
        alloc = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
        c.figures["torch_max_allocated_gib"] = alloc / 2 ** 30
        c.figures["torch_max_reserved_gib"] = reserved / 2 ** 30
        slack = THRESHOLDS["peak_over_reserved_max_gib"]
        ok = line_peak is not None and alloc <= line_peak <= reserved + slack * 2 ** 30
        c.expect("GPU peak memory of the lines vs torch max_memory_allocated / reserved",
                 c.figures["gpu_peak_line_gib"], ok,
                 f"allocated <= peak <= reserved + {slack} GiB")
    del big
    if ctx.cuda:
        torch.cuda.empty_cache()

    # 3. overhead on a training loop
    nn = torch.nn
    d = 4096 if ctx.cuda else 64
    model = nn.Sequential(*[mm for _ in range(8) for mm in (nn.Linear(d, d), nn.GELU())])
    model = model.to(ctx.device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(64 if ctx.cuda else 4, d, device=ctx.device, dtype=dtype)

    def train(k: int = 20 if ctx.cuda else 3) -> None:
        for _ in range(k):
            model(x).float().square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        ctx.sync()

    train()
    variants = {"plain": None, "gpu=False@1k": (False, 1000.0), "gpu=True@1k": (True, 1000.0),
                "gpu=True@5k": (True, 5000.0)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for rnd in range(5 if ctx.cuda else 1):
        for name, v in (variants.items() if rnd % 2 == 0 else reversed(variants.items())):
            if v is None:
                t0 = time.perf_counter()
                train()
                times[name].append(time.perf_counter() - t0)
                continue
            import linescope

            with linescope.profile(backend="sampler", gpu=v[0], sample_rate=v[1],
                                   root=str(ctx.work), display="none"):
                t0 = time.perf_counter()
                train()
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: med[k] / med["plain"] for k in med}
    c.figures["overhead_median_s"] = med
    c.figures["overhead_ratio_vs_plain"] = ratios
    if ctx.cuda:
        mx = THRESHOLDS["sampler_gpu_overhead_max"]
        c.expect("sampler gpu=True @1 kHz / plain (GPU-bound training loop)",
                 ratios["gpu=True@1k"], ratios["gpu=True@1k"] <= mx, f"<= {mx}")
    c.headline = (f"matmul line share {share if share is None else round(share, 3)} "
                  f"({g.method}); line peak {c.figures['gpu_peak_line_gib']} GiB; "
                  f"gpu=True@1k x{round(ratios['gpu=True@1k'], 3)}")
