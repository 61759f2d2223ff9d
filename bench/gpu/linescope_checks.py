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

import contextlib
import importlib.util
import os
import statistics
import time
from pathlib import Path
from typing import Any

THRESHOLDS = {
    "matmul_share_min": 0.80,          # matmul line / all attributed GPU time (CUPTI)
    "peak_over_reserved_max_gib": 2.0,  # line peak - torch reserved peak (CUDA context)
    "sampler_gpu_overhead_max": 1.03,   # gpu=True / plain, 1 kHz, GPU-bound loop
    "matmul_tflops_from_line": (400.0, 1000.0),  # 8192^3 bf16 matmuls / the line's kernel time
}

WORKLOAD = '''
import time
import torch


def step(a, b, small):
    c = a @ b; c = c @ b; c = c @ b; c = c @ b
    s = small * 2.0 + 1.0
    torch.cuda.synchronize() if a.is_cuda else None
    return c, s


def grow(keep, nbytes, device):
    for _ in range(4):
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device=device))
        time.sleep(0.05)
'''
# Line numbers in the file written from WORKLOAD (its leading newline stripped).
MATMUL_LINE, LIGHT_LINE, SYNC_LINE, GROW_LINE = 6, 7, 8, 14
# Interleaved rounds of the overhead comparisons (medians): the GPU machine's step times drift by
# several per cent between blocks, so a 3 % threshold needs more than a handful.
OVERHEAD_ROUNDS = 11


def _module(work: Path) -> Any:
    path = work / "ls_gpu_work.py"
    path.write_text(WORKLOAD.lstrip("\n"))
    spec = importlib.util.spec_from_file_location("ls_gpu_work", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def _cupti_env(cupti: bool):
    """GPUPROF_CUPTI=1/0 for the block (the sampler reads it when a session starts)."""
    prev = os.environ.get("GPUPROF_CUPTI")
    os.environ["GPUPROF_CUPTI"] = "1" if cupti else "0"
    try:
        yield
    finally:
        if prev is None:
            os.environ.pop("GPUPROF_CUPTI", None)
        else:
            os.environ["GPUPROF_CUPTI"] = prev


def _profiled(ctx: Any, root: Path, fn: Any, *, cupti: bool, memory: bool = False,
              rate: float | None = None) -> Any:
    import linescope

    kw: dict[str, Any] = dict(backend="sampler", gpu=True, memory=memory, root=str(root),
                              display="none")
    if rate:
        kw["sample_rate"] = rate
    with _cupti_env(cupti), linescope.profile(**kw) as s:
        fn()
    return s.result


def _gpu_by_line(result: Any, path: str) -> dict[int, int]:
    return {s.line: s.gpu.time_ns for s in result.lines
            if s.filename == path and s.gpu is not None and s.gpu.time_ns is not None}


class _Workload:
    """The three-line step of WORKLOAD on two n x n bf16 matrices (fp32 on the CPU)."""

    def __init__(self, ctx: Any) -> None:
        torch = ctx.torch
        self.n = 8192 if ctx.cuda else 64
        self.mod = _module(ctx.work)
        self.path = str((ctx.work / "ls_gpu_work.py").resolve())
        self.dtype = torch.bfloat16 if ctx.cuda else torch.float32
        self.a = torch.randn(self.n, self.n, device=ctx.device, dtype=self.dtype)
        self.b = torch.randn(self.n, self.n, device=ctx.device, dtype=self.dtype)
        self.small = torch.randn(1024, device=ctx.device)
        self.step()  # warm-up (cuBLAS handles, autotune)
        ctx.sync()

    def step(self) -> None:
        self.mod.step(self.a, self.b, self.small)


def _trainer(ctx: Any, dtype: Any) -> Any:
    """A GPU-bound training loop (8 x Linear(4096)+GELU, batch 2048, SGD: ~3 ms of matmuls per
    step on an H200, more than its ~1 ms of launches); train() syncs at the end."""
    torch = ctx.torch
    nn = torch.nn
    d = 4096 if ctx.cuda else 64
    model = nn.Sequential(*[mm for _ in range(8) for mm in (nn.Linear(d, d), nn.GELU())])
    model = model.to(ctx.device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(2048 if ctx.cuda else 4, d, device=ctx.device, dtype=dtype)

    def train(k: int = 20 if ctx.cuda else 3) -> None:
        for _ in range(k):
            model(x).float().square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        ctx.sync()

    train()
    return train


def _timed(fn: Any, session: Any = None) -> float:
    """Seconds fn() takes, inside the profiling session when one is given (its start and stop
    are not timed)."""
    with session if session is not None else contextlib.nullcontext():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def _interleaved(rounds: int, variants: dict[str, Any], run: Any) -> dict[str, float]:
    """Median seconds of run(variant) per variant, order reversed every other round."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for rnd in range(rounds):
        for name, v in (variants.items() if rnd % 2 == 0 else reversed(variants.items())):
            times[name].append(run(v))
    return {k: statistics.median(v) for k, v in times.items()}


def check_linescope(ctx: Any, c: Any) -> None:
    torch = ctx.torch
    w = _Workload(ctx)
    n, mod, path, dtype = w.n, w.mod, w.path, w.dtype
    a, b, small = w.a, w.b, w.small
    steps = 6 if ctx.cuda else 2

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
        tflops = (flops / (by_line[MATMUL_LINE] / 1e9) / 1e12 if by_line.get(MATMUL_LINE)
                  else None)
        c.figures["matmul_tflops_from_line_gpu_time"] = tflops
        lo, hi = THRESHOLDS["matmul_tflops_from_line"]
        c.expect("TFLOP/s implied by the matmul line's CUPTI kernel time", tflops,
                 tflops is not None and lo <= tflops <= hi,
                 f"in [{lo}, {hi}] (H200 bf16: ~790 measured, 989 datasheet)")
    # The NVML estimate needs utilization readings over the lines (the driver averages over
    # 1/6 s to 1 s): the same step for 1.5 s.
    def work_long() -> None:
        end = time.perf_counter() + (1.5 if ctx.cuda else 0.2)
        while time.perf_counter() < end:
            mod.step(a, b, small)

    est = _profiled(ctx, ctx.work, work_long, cupti=False)
    c.figures["gpu_ms_by_line_nvml_estimate"] = {
        k: round(v / 1e6, 3) for k, v in _gpu_by_line(est, path).items()}
    c.figures["nvml_method"] = est.gpu.method
    c.figures["nvml_time_reason"] = est.gpu.time_reason

    # 2. peak memory vs torch's own figure
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    big: list[Any] = []

    def grow() -> None:  # four 2 GiB allocations on the workload file's GROW_LINE
        mod.grow(big, 2 * 1024 ** 3 if ctx.cuda else 1024, ctx.device)
        ctx.sync()

    m = _profiled(ctx, ctx.work, grow, cupti=False, memory=True)
    peaks = {s.line: s.gpu.peak_memory_bytes for s in m.lines
             if s.filename == path and s.gpu and s.gpu.peak_memory_bytes is not None}
    line_peak = max(peaks.values()) if peaks else None
    c.figures["gpu_peak_gib_by_line"] = {k: round(v / 2 ** 30, 3) for k, v in peaks.items()}
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
    train = _trainer(ctx, dtype)
    # (gpu, sample rate, CUPTI): gpu=True with CUPTI traces every kernel launch; without it
    # the GPU time is the NVML estimate (one read per 10 ms on the sampler thread).
    variants = {"plain": None, "gpu=False@1k": (False, 1000.0, False),
                "gpu=True@1k": (True, 1000.0, True), "gpu=True@5k": (True, 5000.0, True),
                "gpu=True@1k,no-cupti": (True, 1000.0, False),
                "gpu=True@5k,no-cupti": (True, 5000.0, False)}

    def run(v: Any) -> float:
        if v is None:
            return _timed(train)
        import linescope

        with _cupti_env(v[2]):
            return _timed(train, linescope.profile(backend="sampler", gpu=v[0],
                                                   sample_rate=v[1], root=str(ctx.work),
                                                   display="none"))

    med = _interleaved(OVERHEAD_ROUNDS if ctx.cuda else 1, variants, run)
    ratios = {k: med[k] / med["plain"] for k in med}
    c.figures["overhead_median_s"] = med
    c.figures["overhead_ratio_vs_plain"] = ratios
    c.figures["overhead_gpu_on_over_off"] = {
        k: med[k] / med["gpu=False@1k"] for k in med if k.startswith("gpu=True")}
    if ctx.cuda:
        mx = THRESHOLDS["sampler_gpu_overhead_max"]
        c.expect("sampler gpu=True @1 kHz (CUPTI) / plain (GPU-bound training loop)",
                 ratios["gpu=True@1k"], ratios["gpu=True@1k"] <= mx, f"<= {mx}")
        c.expect("sampler gpu=True @5 kHz without CUPTI / plain (info)",
                 ratios["gpu=True@5k,no-cupti"], ratios["gpu=True@5k,no-cupti"] <= mx,
                 f"<= {mx}", required=False)
    c.headline = (f"matmul line share {share if share is None else round(share, 3)} "
                  f"({g.method}); line peak {c.figures['gpu_peak_line_gib']} GiB; "
                  f"gpu=True@1k x{round(ratios['gpu=True@1k'], 3)} (CUPTI), "
                  f"@5k no CUPTI x{round(ratios['gpu=True@5k,no-cupti'], 3)}")


def check_scalene(ctx: Any, c: Any) -> None:
    """The `scalene` backend's GPU path on the real driver (Scalene's own pynvml sampling through
    linescope's adapter), when the optional Scalene package is importable."""
    try:
        import scalene  # noqa: F401
    except Exception as e:  # the optional extra; run.sh installs carried wheels (.whl/)
        c.skip_reason = f"Scalene is not importable here ({e!r}); see bench/gpu/README.md"
        return
    import linescope

    torch = ctx.torch
    w = _Workload(ctx)
    seconds = 2.0 if ctx.cuda else 0.3  # Scalene samples at ~100 Hz; NVML averages utilization

    def work() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            w.step()

    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    with linescope.profile(backend="scalene", gpu=True, root=str(ctx.work),
                           display="none") as s:
        work()
    r = s.result
    g = r.gpu
    by_line = _gpu_by_line(r, w.path)
    total = sum(by_line.values())
    peaks = {x.line: x.gpu.peak_memory_bytes for x in r.lines
             if x.filename == w.path and x.gpu is not None
             and x.gpu.peak_memory_bytes is not None}
    line_peak = max(peaks.values()) if peaks else None
    try:
        from importlib.metadata import version
        c.figures["scalene_version"] = version("scalene")
    except Exception as e:
        c.figures["scalene_version"] = repr(e)
    c.figures["method"] = None if g is None else g.method
    c.figures["time_reason"] = None if g is None else g.time_reason
    c.figures["memory_reason"] = None if g is None else g.memory_reason
    c.figures["diagnostics"] = None if g is None else g.diagnostics
    c.figures["warnings"] = list(r.warnings)
    c.figures["gpu_ms_by_line"] = {k: round(v / 1e6, 3) for k, v in by_line.items()}
    c.figures["gpu_peak_gib_by_line"] = {k: round(v / 2 ** 30, 3) for k, v in peaks.items()}
    c.figures["driver_ms_by_line"] = {x.line: round(x.wall_time_ns / 1e6, 3) for x in r.lines
                                      if x.filename == w.path and x.wall_time_ns is not None}
    if ctx.cuda:
        c.expect("GPU time attributed to the workload's lines (ms)", total / 1e6, total > 0,
                 "> 0")
        alloc = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
        c.figures["torch_max_allocated_gib"] = alloc / 2 ** 30
        c.figures["torch_max_reserved_gib"] = reserved / 2 ** 30
        c.expect("GPU peak memory measured on the workload's lines", line_peak,
                 line_peak is not None, "not None")
        slack = THRESHOLDS["peak_over_reserved_max_gib"]
        c.expect("line GPU peak memory vs torch max_memory_allocated / reserved (GiB)",
                 None if line_peak is None else line_peak / 2 ** 30,
                 line_peak is not None and alloc <= line_peak <= reserved + slack * 2 ** 30,
                 f"allocated <= peak <= reserved + {slack} GiB", required=False)

    # gpu=True vs gpu=False under Scalene on the training loop (Scalene's published median for
    # CPU+GPU sampling is 1.02x)
    train = _trainer(ctx, w.dtype)

    def run(gpu: Any) -> float:
        if gpu is None:
            return _timed(train)
        return _timed(train, linescope.profile(backend="scalene", gpu=gpu, root=str(ctx.work),
                                               display="none"))

    med = _interleaved(OVERHEAD_ROUNDS if ctx.cuda else 1, {"plain": None, "gpu=False": False,
                                              "gpu=True": True}, run)
    ratios = {k: med[k] / med["plain"] for k in med}
    c.figures["overhead_median_s"] = med
    c.figures["overhead_ratio_vs_plain"] = ratios
    c.figures["gpu_on_over_off"] = med["gpu=True"] / med["gpu=False"]
    if ctx.cuda:
        c.expect("scalene gpu=True / gpu=False (training loop; info)",
                 c.figures["gpu_on_over_off"], c.figures["gpu_on_over_off"] <= 1.05, "<= 1.05",
                 required=False)
    c.headline = (f"GPU {round(total / 1e6, 1)} ms over {len(by_line)} lines "
                  f"({c.figures['method']}); line peak "
                  f"{None if line_peak is None else round(line_peak / 2 ** 30, 2)} GiB; "
                  f"gpu on/off x{round(c.figures['gpu_on_over_off'], 3)}")
