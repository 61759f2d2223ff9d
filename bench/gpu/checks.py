#!/usr/bin/env python3
"""GPU validation of gpuprof through its public API. See bench/gpu/README.md.

Every check drives ``gpuprof.profile(...)`` like a user would, then reads the stored run from
the SQLite file (docs/schema.md) and, where the figure lives there, from
``gpuprof insights DB RUN --json``. Each check measures the same thing independently (its own
torch.cuda.Event pairs, wall clocks, nvidia-smi) and records pass/fail with the figures.

  python bench/gpu/checks.py --out DIR [--work DIR] [--dry-run] [--only nvml,phases,...]
  python bench/gpu/checks.py --report-only --out DIR [--work DIR]

--dry-run: CUDA unavailable (or ignored): every check runs its code path on the CPU with tiny
sizes and gpu="mock", and is marked "skip" — it proves the script, not the GPU.
--report-only: re-renders DIR/report.md and DIR/results.json from what the run left in WORK
(the step table of run.sh and the check results); needs neither torch nor gpuprof.

A failing or crashing check never stops the others; results are written after every check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# H200 SXM dense bf16 peak (datasheet); gpuprof's own table (cpp/core/analysis/flops.cc) has
# the same figure for "H200" and 835 for "H200 NVL".
H200_BF16_PEAK_TFLOPS = 989.0

# Acceptance thresholds (README.md of this folder lists the same numbers).
THRESHOLDS: dict[str, Any] = {
    "nvml_min_sample_fraction": 0.80,   # stored samples / (sample_hz x run duration)
    "nvml_min_busy_util_pct": 50.0,     # mean util_pct over the busy window
    "nvml_min_nonnull_fraction": 0.90,  # each required column non-NULL in >= 90% of rows
    "nvml_min_pcie_rows_per_s": 0.8,    # PCIe is read once a second: rows with it per second
    "nvml_proc_mem_over_reserved_gib": (0.0, 2.0),  # proc_mem - torch reserved (CUDA context)
    "phase_ratio_same_pass": (0.97, 1.03),      # gpuprof gpu_ns / own events, same loop
    "phase_ratio_separate_pass": (0.90, 1.10),  # gpuprof gpu_ns / own events, un-profiled loop
    "async_gpu_over_wall_min": 1.5,     # forward/backward gpu_ns / wall_ns in the no-sync probe
    "nosync_cpu_over_sleep_max": 0.5,   # CPU time of 2 steps behind a GPU sleep / sleep time
    "loop_wall_ratio_max": 1.05,        # profiled loop wall / un-profiled loop wall
    "mfu_ratio": (0.95, 1.05),          # gpuprof achieved TFLOPs / own achieved TFLOPs
    "overhead_ratio_max": 1.03,         # median step, gpuprof / plain, GPU-bound transformer
    "overhead_launch_bound_warn": 1.15,  # same, launch-bound small MLP (informational)
}

CHECK_ORDER = ["nvml", "phases", "mfu", "overhead", "traces", "ddp", "linescope", "scalene"]
CHECK_TITLES = {
    "nvml": "Real NVML telemetry",
    "phases": "CUDA-event phase timing",
    "mfu": "MFU on real kernels",
    "overhead": "Overhead on GPU",
    "traces": "Kernel traces: CUPTI capture, top kernels, sdpa_suboptimal, kernel_drift",
    "linescope": "linescope sampler: GPU time and memory per line",
    "scalene": "linescope scalene backend on the real driver",
    "ddp": "DDP bucket timing with CUDA events (one-rank NCCL)",
}
CHECK_LIMIT_S = 120  # per check (SIGALRM); the whole script is also time-boxed by run.sh
NO_ALARM_CHECKS = {"scalene"}  # Scalene owns SIGALRM while it samples

GIB = 1024 ** 3


def log(msg: str) -> None:
    print(f"[checks +{time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


_T0 = time.monotonic()


def jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else v
    if v is None or isinstance(v, (bool, int, str)):
        return v
    try:
        return float(v)
    except Exception:
        return str(v)


def rnd(v: Optional[float], nd: int = 4) -> Optional[float]:
    return None if v is None else round(float(v), nd)


def mean(xs: list[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def within(v: Optional[float], lo: float, hi: float) -> bool:
    return v is not None and lo <= v <= hi


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
class Check:
    """One check's verdict: assertions (required ones decide pass/fail), figures and notes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.title = CHECK_TITLES.get(name, name)
        self.asserts: list[dict[str, Any]] = []
        self.figures: dict[str, Any] = {}
        self.notes: list[str] = []
        self.headline = ""
        self.skip_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.seconds = 0.0

    def expect(self, name: str, value: Any, ok: bool, threshold: str,
               required: bool = True) -> bool:
        self.asserts.append({"name": name, "value": jsonable(value), "threshold": threshold,
                             "ok": bool(ok), "required": required})
        return bool(ok)

    def note(self, text: str) -> None:
        self.notes.append(text)
        log(f"  note: {text}")

    @property
    def status(self) -> str:
        if self.error is not None:
            return "error"
        if self.skip_reason is not None:
            return "skip"
        if any(a["required"] and not a["ok"] for a in self.asserts):
            return "fail"
        if any(not a["ok"] for a in self.asserts):
            return "warn"
        return "pass" if self.asserts else "skip"

    def to_json(self) -> dict[str, Any]:
        return jsonable({"name": self.name, "title": self.title, "status": self.status,
                         "headline": self.headline, "skip_reason": self.skip_reason,
                         "error": self.error, "seconds": round(self.seconds, 2),
                         "asserts": self.asserts, "figures": self.figures,
                         "notes": self.notes})


# ---------------------------------------------------------------------------------------------
# Context: torch, gpuprof, device, DB
# ---------------------------------------------------------------------------------------------
class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.out = Path(args.out)
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.db = self.work / "gpuprof_checks.db"
        self.dry = bool(args.dry_run)
        self.torch: Any = None
        self.gpuprof: Any = None
        self.gpuprof_error: Optional[str] = None
        self.cuda = False
        self.device = "cpu"
        self.meta: dict[str, Any] = {}

    def load(self) -> None:
        self.meta["python"] = sys.version.split()[0]
        self.meta["python_executable"] = sys.executable
        self.meta["dry_run"] = self.dry
        try:
            import torch
            self.torch = torch
            self.meta["torch"] = torch.__version__
            self.meta["torch_cuda"] = getattr(torch.version, "cuda", None)
            self.cuda = bool(torch.cuda.is_available()) and not self.dry
            if torch.cuda.is_available():
                p = torch.cuda.get_device_properties(0)
                self.meta["cuda_device"] = p.name
                self.meta["cuda_capability"] = f"{p.major}.{p.minor}"
                self.meta["cuda_sms"] = p.multi_processor_count
                self.meta["cuda_mem_total_gib"] = round(p.total_memory / GIB, 1)
        except Exception as e:  # report-only still works; checks record the reason
            self.meta["torch_error"] = repr(e)
        self.device = "cuda" if self.cuda else "cpu"
        if self.dry:
            self.meta["note"] = "dry run: CPU, tiny sizes, gpu='mock'; figures are not meaningful"
        try:
            import gpuprof
            import gpuprof._native  # noqa: F401  (a broken build fails here, not at profile())
            self.gpuprof = gpuprof
            self.meta["gpuprof"] = gpuprof.__version__
            self.meta["gpuprof_file"] = gpuprof.__file__
        except Exception as e:
            self.gpuprof_error = f"gpuprof not importable ({e!r}); see build.log"
            self.meta["gpuprof_error"] = self.gpuprof_error
        exe = self.gpuprof_exe()
        self.meta["gpuprof_cli"] = exe
        if exe:
            try:
                self.meta["gpuprof_cli_version"] = subprocess.run(
                    [exe, "version"], capture_output=True, text=True, timeout=20).stdout.strip()
            except Exception as e:
                self.meta["gpuprof_cli_version"] = repr(e)

    def gpuprof_exe(self) -> Optional[str]:
        cand = Path(sys.executable).parent / "gpuprof"
        if cand.exists():
            return str(cand)
        return shutil.which("gpuprof")

    # -- helpers used by the checks --------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def gpu_backend(self) -> str:
        return "nvml" if self.cuda else "mock"

    def mock_scenario(self) -> str:
        return "" if self.cuda else "model=NVIDIA H200"

    def profile(self, run_name: str, **kw: Any) -> Any:
        kw.setdefault("db", str(self.db))
        kw.setdefault("summary", False)
        kw.setdefault("gpu", self.gpu_backend())
        if kw["gpu"] == "mock":
            kw.setdefault("mock_scenario", self.mock_scenario())
        return self.gpuprof.profile(run_name, **kw)

    def rows(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute(sql, params).fetchall()]
        finally:
            con.close()

    def insights_json(self, run_id: int) -> tuple[Optional[dict[str, Any]], str]:
        exe = self.gpuprof_exe()
        if not exe:
            return None, "the gpuprof CLI is not installed (built without CLI11?)"
        p = subprocess.run([exe, "insights", str(self.db), str(run_id), "--json"],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            return None, f"gpuprof insights exited {p.returncode}: {p.stderr.strip()[:500]}"
        try:
            return json.loads(p.stdout), ""
        except json.JSONDecodeError as e:
            return None, f"gpuprof insights --json is not JSON ({e}): {p.stdout[:300]!r}"

    def run_row(self, run_id: int) -> dict[str, Any]:
        r = self.rows("SELECT * FROM runs WHERE run_id = ?", run_id)
        return r[0] if r else {}

    def diagnostics(self, run_id: int) -> list[str]:
        return [f"{d['level']}/{d['source']}: {d['message']}" for d in self.rows(
            "SELECT level, source, message FROM diagnostics WHERE run_id = ? ORDER BY rowid",
            run_id)]

    def telemetry_status(self, run_id: int) -> dict[str, dict[str, Any]]:
        return {t["source"]: t for t in self.rows(
            "SELECT source, available, backend, reason FROM telemetry_status WHERE run_id = ?",
            run_id)}


class Timers:
    """Own GPU timing: torch.cuda.Event pairs on CUDA, perf_counter on CPU (dry run)."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    def mark(self) -> Any:
        if self.ctx.cuda:
            ev = self.ctx.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter_ns()

    def ms(self, a: Any, b: Any) -> float:
        """Elapsed ms between two marks; call after ctx.sync()."""
        if self.ctx.cuda:
            return float(a.elapsed_time(b))
        return (b - a) / 1e6


@contextlib.contextmanager
def time_limit(seconds: int):
    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"check exceeded its {seconds} s limit")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def record_warnings(check: Check):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        check.note(f"warning during the check: {w.category.__name__}: {w.message}")


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------
def sizes(ctx: Ctx) -> dict[str, Any]:
    if ctx.cuda:
        return dict(
            mm=8192, nvml_busy_s=3.0, nvml_idle_s=0.6,
            tf=dict(d=2048, heads=16, seq=2048, batch=4, layers=4),
            phase_steps=30, warm_steps=5,
            mfu_n=8192, mfu_per_step=8, mfu_steps=40, mfu_async_steps=60,
            ovh_rounds=5, ovh_block=12,
            mlp=dict(d=512, layers=16, batch=32), mlp_block=60,
            sleep_ms=300.0,
        )
    return dict(  # dry run: exercise the code paths in seconds on a CPU
        mm=128, nvml_busy_s=0.6, nvml_idle_s=0.2,
        tf=dict(d=64, heads=4, seq=32, batch=2, layers=2),
        phase_steps=8, warm_steps=2,
        mfu_n=128, mfu_per_step=2, mfu_steps=8, mfu_async_steps=8,
        ovh_rounds=2, ovh_block=4,
        mlp=dict(d=64, layers=4, batch=8), mlp_block=10,
        sleep_ms=0.0,
    )


def make_transformer(ctx: Ctx, d: int, heads: int, layers: int) -> Any:
    torch = ctx.torch
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 4 * d, bias=False)
            self.fc2 = nn.Linear(4 * d, d, bias=False)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            qkv = self.qkv(self.ln1(x)).view(b, s, 3, heads, d // heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(layers)]).to(ctx.device, torch.bfloat16)


class TrainLoop:
    """A bf16 transformer trained with AdamW; steps never synchronize."""

    def __init__(self, ctx: Ctx, cfg: dict[str, int]) -> None:
        torch = ctx.torch
        self.ctx = ctx
        self.model = make_transformer(ctx, cfg["d"], cfg["heads"], cfg["layers"])
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        g = torch.Generator(device=ctx.device).manual_seed(1)
        self.xs = [torch.randn(cfg["batch"], cfg["seq"], cfg["d"], device=ctx.device,
                               dtype=torch.bfloat16, generator=g) for _ in range(2)]
        self.i = 0
        self.params = sum(p.numel() for p in self.model.parameters())

    def step(self, marks: Optional[list[Any]] = None, timers: Optional[Timers] = None) -> None:
        """One training step; with `marks`, appends 6 own timing marks around the phases."""
        x = self.xs[self.i % len(self.xs)]
        self.i += 1
        if marks is None:
            out = self.model(x)
            loss = out.float().square().mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            return
        assert timers is not None
        m0 = timers.mark()
        out = self.model(x)
        m1 = timers.mark()
        loss = out.float().square().mean()
        m2 = timers.mark()
        loss.backward()
        m3 = timers.mark()
        m4 = timers.mark()
        self.opt.step()
        m5 = timers.mark()
        self.opt.zero_grad(set_to_none=True)
        marks.append((m0, m1, m2, m3, m4, m5))

    @staticmethod
    def phase_ms(timers: Timers, marks: list[Any]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
        for m0, m1, m2, m3, m4, m5 in marks:
            out["forward"].append(timers.ms(m0, m1))
            out["backward"].append(timers.ms(m2, m3))
            out["optimizer"].append(timers.ms(m4, m5))
        return out


def matmul_flops(n: int) -> float:
    return 2.0 * n * n * n


# ---------------------------------------------------------------------------------------------
# Check 1: real NVML path
# ---------------------------------------------------------------------------------------------
REQUIRED_SAMPLE_COLS = ["util_pct", "mem_used_bytes", "mem_total_bytes", "proc_mem_bytes",
                        "power_mw", "temp_c", "sm_clock_mhz", "pcie_rx_bps", "pcie_tx_bps"]
INFO_SAMPLE_COLS = ["mem_util_pct", "clock_reasons"]
ONCE_A_SECOND_COLS = {"pcie_rx_bps", "pcie_tx_bps"}


def nvidia_smi_apps() -> list[dict[str, Any]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        p = subprocess.run([exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,"
                            "nounits"], capture_output=True, text=True, timeout=15)
    except Exception:
        return []
    rows = []
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                rows.append({"pid": int(parts[0]), "used_mib": float(parts[1])})
            except ValueError:
                rows.append({"pid": int(parts[0]), "used_mib": None})
    return rows


def check_nvml(ctx: Ctx, c: Check) -> None:
    torch = ctx.torch
    sz = sizes(ctx)
    n = sz["mm"]
    g = torch.Generator(device=ctx.device).manual_seed(2)
    a = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16, generator=g)
    for _ in range(3):
        a @ b
    ctx.sync()
    hz = 100.0
    busy_s, idle_s = sz["nvml_busy_s"], sz["nvml_idle_s"]
    mm_count = 0
    with record_warnings(c):
        with ctx.profile("gpu-check-nvml", auto=False, sample_hz=hz,
                         gpu=ctx.gpu_backend()) as prof:
            time.sleep(idle_s)
            busy_t0 = time.monotonic_ns()
            end = busy_t0 + int(busy_s * 1e9)
            while time.monotonic_ns() < end:
                for _ in range(4):
                    a @ b
                mm_count += 4
                ctx.sync()  # keeps the busy window honest: the GPU is done when the CPU says so
            busy_t1 = time.monotonic_ns()
            reserved = torch.cuda.memory_reserved() if ctx.cuda else None
            allocated = torch.cuda.memory_allocated() if ctx.cuda else None
            free_total = torch.cuda.mem_get_info() if ctx.cuda else None
            smi_apps = nvidia_smi_apps() if ctx.cuda else []
            time.sleep(idle_s)
            stats = prof.stats()
    run_id = prof.run_id
    c.figures["run_id"] = run_id
    if run_id is None:
        c.expect("profile started", False, False, "run_id is set")
        return
    run = ctx.run_row(run_id)
    tstat = ctx.telemetry_status(run_id)
    diags = ctx.diagnostics(run_id)
    gpus = ctx.rows("SELECT * FROM gpus WHERE run_id = ? ORDER BY gpu_index", run_id)
    samples = ctx.rows("SELECT * FROM gpu_samples WHERE run_id = ? AND gpu_index = 0 "
                       "ORDER BY ts_ns", run_id)
    start_mono = run.get("start_mono_ns")
    end_ns = run.get("end_ns")
    c.figures.update(gpu_backend=run.get("gpu_backend"), gpu_model=run.get("gpu_model"),
                     gpu_count=run.get("gpu_count"), sample_hz=run.get("sample_hz"),
                     run_duration_s=rnd(end_ns / 1e9 if end_ns else None, 3),
                     telemetry_status=tstat, diagnostics=diags, gpus=gpus,
                     recorder_stats=stats, matmuls_in_busy_window=mm_count,
                     busy_tflops=rnd(matmul_flops(n) * mm_count / ((busy_t1 - busy_t0) / 1e9)
                                     / 1e12, 1))
    gs = tstat.get("gpu", {})
    c.expect("telemetry_status gpu available", gs.get("available"), gs.get("available") == 1,
             "== 1 (reason when not: " + str(gs.get("reason")) + ")")
    c.expect("runs.gpu_backend", run.get("gpu_backend"),
             run.get("gpu_backend") == ctx.gpu_backend(), f"== '{ctx.gpu_backend()}'")
    model = run.get("gpu_model") or ""
    c.expect("runs.gpu_model contains H200", model, "H200" in model, "contains 'H200'")

    # Sample count and rate.
    count = len(samples)
    expected = (end_ns / 1e9) * hz if end_ns else None
    c.figures["samples"] = count
    c.figures["samples_expected"] = rnd(expected, 1)
    if count >= 2:
        span = (samples[-1]["ts_ns"] - samples[0]["ts_ns"]) / 1e9
        c.figures["achieved_hz"] = rnd((count - 1) / span if span > 0 else None, 2)
        deltas = [(samples[i + 1]["ts_ns"] - samples[i]["ts_ns"]) / 1e6 for i in range(count - 1)]
        c.figures["tick_interval_ms_median"] = rnd(statistics.median(deltas), 3)
        c.figures["tick_interval_ms_max"] = rnd(max(deltas), 3)
    frac = ratio(count, expected)
    c.figures["sample_fraction"] = rnd(frac, 3)
    lo = THRESHOLDS["nvml_min_sample_fraction"]
    c.expect("samples / expected", rnd(frac, 3), frac is not None and frac >= lo,
             f">= {lo} (expected = sample_hz {hz:g} x run duration)")

    # NULL columns.
    nulls: dict[str, Any] = {}
    req = THRESHOLDS["nvml_min_nonnull_fraction"]
    for col in REQUIRED_SAMPLE_COLS + INFO_SAMPLE_COLS:
        nn_count = sum(1 for s in samples if s.get(col) is not None)
        f = nn_count / count if count else 0.0
        nulls[col] = rnd(f, 3)
        if col in ONCE_A_SECOND_COLS:
            # Read at most once a second by design (nvmlDeviceGetPcieThroughput blocks ~20 ms;
            # docs/telemetry.md): the rows in between are unmeasured (NULL). Rows with a value
            # per second of run is what must hold.
            per_s = nn_count / (end_ns / 1e9) if end_ns else 0.0
            lo_s = THRESHOLDS["nvml_min_pcie_rows_per_s"]
            ok = per_s >= lo_s
            c.expect(f"{col} rows with a value per second of run", rnd(per_s, 3), ok,
                     f">= {lo_s} (read once a second)")
            if not ok:
                related = [d for d in diags if "pcie" in d.lower()]
                c.note(f"{col} has a value in {nn_count}/{count} rows; diagnostics: "
                       f"{related or diags or 'none recorded'}")
        elif col in REQUIRED_SAMPLE_COLS:
            ok = f >= req
            c.expect(f"{col} non-NULL fraction", rnd(f, 3), ok, f">= {req}")
            if not ok:
                related = [d for d in diags if col.split("_")[0] in d.lower()]
                c.note(f"{col} is NULL in {count - nn_count}/{count} rows; diagnostics: "
                       f"{related or diags or 'none recorded'}")
        elif f < req:
            c.note(f"{col} (informational) non-NULL in {f:.0%} of rows")
    c.figures["nonnull_fraction"] = nulls
    smax = gpus[0].get("sm_clock_max_mhz") if gpus else None
    c.expect("gpus.sm_clock_max_mhz", smax, smax is not None and smax > 0, "non-NULL, > 0")

    # Busy-window figures (run-relative; runs.start_mono_ns is CLOCK_MONOTONIC like
    # time.monotonic_ns()).
    if start_mono is not None:
        b0 = busy_t0 - start_mono + int(0.3e9)  # NVML util averages over up to ~1/6-1 s
        b1 = busy_t1 - start_mono
        c.figures["busy_window_rel_s"] = [rnd(b0 / 1e9, 3), rnd(b1 / 1e9, 3)]
        busy = [s for s in samples if b0 <= s["ts_ns"] <= b1]
        idle = [s for s in samples if s["ts_ns"] < busy_t0 - start_mono - int(0.05e9)]
    else:
        busy, idle = [], []
    c.figures["busy_samples"] = len(busy)

    def col_stats(rows: list[dict[str, Any]], col: str) -> dict[str, Any]:
        vals = [r[col] for r in rows if r.get(col) is not None]
        if not vals:
            return {"n": 0}
        return {"n": len(vals), "mean": rnd(statistics.fmean(vals), 2), "min": min(vals),
                "max": max(vals)}

    busy_stats = {col: col_stats(busy, col) for col in REQUIRED_SAMPLE_COLS + INFO_SAMPLE_COLS}
    c.figures["busy_window"] = busy_stats
    c.figures["idle_before_util_mean"] = col_stats(idle, "util_pct").get("mean")
    util = busy_stats["util_pct"].get("mean")
    ulo = THRESHOLDS["nvml_min_busy_util_pct"]
    c.expect("mean util_pct in busy window", util, util is not None and util > ulo, f"> {ulo}")
    mem_used = busy_stats["mem_used_bytes"].get("max")
    c.expect("mem_used_bytes (busy max)", mem_used, bool(mem_used and mem_used > 0), "> 0")
    proc_mem = busy_stats["proc_mem_bytes"].get("max")
    c.expect("proc_mem_bytes (busy max)", proc_mem, bool(proc_mem and proc_mem > 0), "> 0")

    # proc_mem vs torch's reservation (+ CUDA context, cuBLAS handles and the like).
    c.figures["torch_memory_reserved"] = reserved
    c.figures["torch_memory_allocated"] = allocated
    if free_total:
        c.figures["cuda_mem_get_info_used"] = free_total[1] - free_total[0]
        c.figures["nvml_mem_used_minus_cuda_used_mib"] = rnd(
            (mem_used - (free_total[1] - free_total[0])) / 2**20 if mem_used else None, 1)
    me = os.getpid()
    c.figures["nvidia_smi_compute_apps"] = smi_apps
    mine = [r for r in smi_apps if r["pid"] == me]
    if mine and mine[0]["used_mib"] is not None:
        c.figures["nvidia_smi_own_mib"] = mine[0]["used_mib"]
        c.figures["proc_mem_minus_nvidia_smi_mib"] = rnd(
            proc_mem / 2**20 - mine[0]["used_mib"] if proc_mem else None, 1)
    elif ctx.cuda:
        c.note(f"nvidia-smi lists no compute app with our pid {me} ({smi_apps}); a pid "
               "namespace would explain it")
    lo_g, hi_g = THRESHOLDS["nvml_proc_mem_over_reserved_gib"]
    diff = (proc_mem - reserved) / GIB if (proc_mem and reserved is not None) else None
    c.figures["proc_mem_minus_reserved_gib"] = rnd(diff, 3)
    c.expect("proc_mem - torch.cuda.memory_reserved() (GiB)", rnd(diff, 3),
             within(diff, lo_g, hi_g), f"in [{lo_g}, {hi_g}] (the CUDA context's own memory)")
    for col in ("power_mw", "temp_c", "sm_clock_mhz", "pcie_rx_bps", "pcie_tx_bps"):
        st = busy_stats[col]
        if st.get("n"):
            c.figures[f"busy_{col}_mean"] = st["mean"]
    c.headline = (f"{count} samples ({c.figures.get('achieved_hz')} Hz of {hz:g}), busy util "
                  f"{util}%, proc_mem-reserved {rnd(diff, 2)} GiB, model '{model}'")
    del a, b


# ---------------------------------------------------------------------------------------------
# Check 2: CUDA-event phase timing
# ---------------------------------------------------------------------------------------------
def calibrate_sleep(ctx: Ctx, timers: Timers) -> float:
    """GPU cycles per ms for torch.cuda._sleep at the current clocks."""
    torch = ctx.torch
    cycles = 20_000_000
    torch.cuda._sleep(cycles)  # warm up
    ctx.sync()
    a = timers.mark()
    torch.cuda._sleep(cycles)
    b = timers.mark()
    ctx.sync()
    return cycles / max(timers.ms(a, b), 1e-3)


def sleep_probe(ctx: Ctx, c: Check, loop: TrainLoop, timers: Timers,
                profiled: bool) -> dict[str, Any]:
    """Occupies the GPU with a long sleep kernel, then runs 2 steps: if nothing waits for the
    GPU, the CPU is through them long before the sleep ends and the GPU is still busy."""
    torch = ctx.torch
    sz = sizes(ctx)
    if "sleep_cycles_per_ms" not in c.figures:
        c.figures["sleep_cycles_per_ms"] = calibrate_sleep(ctx, timers)
    cycles_per_ms = c.figures["sleep_cycles_per_ms"]
    ctx.sync()
    res: dict[str, Any] = {"profiled": profiled}
    cm = (ctx.profile("gpu-check-nosync-probe", gpu=ctx.gpu_backend())
          if profiled else contextlib.nullcontext())
    with cm as prof:
        s0 = timers.mark()
        torch.cuda._sleep(int(cycles_per_ms * sz["sleep_ms"]))
        s1 = timers.mark()
        t0 = time.perf_counter()
        for _ in range(2):
            loop.step()
        t1 = time.perf_counter()
        probe = torch.cuda.Event()
        probe.record()
        res["gpu_still_busy_after_steps"] = not probe.query()
    ctx.sync()
    res["sleep_ms"] = rnd(timers.ms(s0, s1), 2)
    res["cpu_ms_for_2_steps"] = rnd((t1 - t0) * 1e3, 2)
    res["cpu_over_sleep"] = rnd(ratio((t1 - t0) * 1e3, timers.ms(s0, s1)), 3)
    if profiled:
        res["run_id"] = prof.run_id
    return res


def check_phases(ctx: Ctx, c: Check) -> None:
    torch = ctx.torch
    sz = sizes(ctx)
    timers = Timers(ctx)
    loop = TrainLoop(ctx, sz["tf"])
    c.figures["model"] = dict(sz["tf"], params=loop.params, dtype="bf16", optimizer="AdamW")
    n = sz["phase_steps"]
    for _ in range(sz["warm_steps"]):
        loop.step()
    ctx.sync()

    def unprofiled_pass() -> tuple[dict[str, list[float]], float]:
        marks: list[Any] = []
        ctx.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            loop.step(marks, timers)
        ctx.sync()
        wall = time.perf_counter() - t0
        return TrainLoop.phase_ms(timers, marks), wall

    sep_a, wall_a = unprofiled_pass()
    marks: list[Any] = []
    with record_warnings(c):
        with ctx.profile("gpu-check-phases", summary=True) as prof:
            ctx.sync()
            t0 = time.perf_counter()
            for _ in range(n):
                loop.step(marks, timers)
            ctx.sync()
            wall_prof = time.perf_counter() - t0
            stats = prof.stats()
    same = TrainLoop.phase_ms(timers, marks)
    sep_b, wall_b = unprofiled_pass()
    run_id = prof.run_id
    c.figures["run_id"] = run_id
    c.figures["recorder_stats"] = stats
    if run_id is None:
        c.expect("profile started", False, False, "run_id is set")
        return
    warm = 3  # gpuprof's steady state skips the first 3 steps (run_view.h kWarmupSteps)
    steps = ctx.rows("SELECT step FROM steps WHERE run_id = ? ORDER BY step", run_id)
    c.expect("steps recorded", len(steps), len(steps) == n, f"== {n} (one per optimizer step)")
    tstat = ctx.telemetry_status(run_id).get("cuda_events", {})
    c.figures["telemetry_cuda_events"] = tstat
    c.expect("telemetry_status cuda_events available", tstat.get("available"),
             tstat.get("available") == 1, "== 1")
    rows = ctx.rows("SELECT step, name, wall_ns, gpu_ns, calls FROM phases WHERE run_id = ? "
                    "ORDER BY step, name", run_id)
    per_phase: dict[str, Any] = {}
    for name in ("forward", "backward", "optimizer"):
        pr = [r for r in rows if r["name"] == name and warm <= r["step"] < n]
        gpu = [r["gpu_ns"] / 1e6 for r in pr if r["gpu_ns"] is not None]
        wall = [r["wall_ns"] / 1e6 for r in pr]
        nulls = sum(1 for r in rows if r["name"] == name and r["gpu_ns"] is None)
        gp = mean(gpu)
        own_same = mean(same[name][warm:])
        own_sep = mean(sep_a[name][warm:] + sep_b[name][warm:])
        d = {
            "gpuprof_gpu_ms": rnd(gp, 4), "gpuprof_wall_ms": rnd(mean(wall), 4),
            "own_same_pass_ms": rnd(own_same, 4), "own_separate_pass_ms": rnd(own_sep, 4),
            "ratio_same_pass": rnd(ratio(gp, own_same), 4),
            "ratio_separate_pass": rnd(ratio(gp, own_sep), 4),
            "wall_over_gpu": rnd(ratio(mean(wall), gp), 4),
            "steps_with_gpu_ns": len(gpu), "steps_compared": len(pr), "gpu_ns_null_rows": nulls,
        }
        per_phase[name] = d
        lo, hi = THRESHOLDS["phase_ratio_same_pass"]
        c.expect(f"{name}: gpuprof gpu_ns / own events (same loop)", d["ratio_same_pass"],
                 within(d["ratio_same_pass"], lo, hi), f"in [{lo}, {hi}]")
        lo, hi = THRESHOLDS["phase_ratio_separate_pass"]
        c.expect(f"{name}: gpuprof gpu_ns / own events (un-profiled loop)",
                 d["ratio_separate_pass"], within(d["ratio_separate_pass"], lo, hi),
                 f"in [{lo}, {hi}]")
        c.expect(f"{name}: phase rows with gpu_ns NULL", nulls, nulls == 0, "== 0")
    c.figures["phases"] = per_phase

    # The CLI's view of the same run.
    rep, err = ctx.insights_json(run_id)
    if rep is None:
        c.note(f"insights --json unavailable: {err}")
    else:
        cli = {p["name"]: {"gpu_mean_ms": rnd((p.get("gpu_mean_ns") or 0) / 1e6 or None, 4),
                           "wall_mean_ms": rnd((p.get("wall_mean_ns") or 0) / 1e6 or None, 4),
                           "gpu_steps": p.get("gpu_steps")}
               for p in ((rep.get("steps") or {}).get("breakdown") or {}).get("phases") or []}
        c.figures["cli_phases"] = cli
        c.figures["cli_insights"] = [f"[{i['severity']}] {i['rule_id']}: {i['message']}"
                                     for i in rep.get("insights", [])]

    # Loop wall time with and without gpuprof (a synchronize per phase would show here when
    # the loop is launch-bound; the no-sync probe below is the decisive test).
    wall_plain = (wall_a + wall_b) / 2
    lr = ratio(wall_prof, wall_plain)
    c.figures["loop_wall_s"] = {"plain_a": rnd(wall_a, 4), "gpuprof": rnd(wall_prof, 4),
                                "plain_b": rnd(wall_b, 4), "ratio": rnd(lr, 4)}
    mx = THRESHOLDS["loop_wall_ratio_max"]
    c.expect("loop wall time gpuprof / plain", rnd(lr, 4), lr is not None and lr <= mx,
             f"<= {mx}")

    # No-sync probe: a GPU sleep, then 2 steps; the CPU must not wait for the GPU.
    if not ctx.cuda:
        c.note("no-sync probe skipped: needs CUDA (torch.cuda._sleep)")
    else:
        plain = sleep_probe(ctx, c, loop, timers, profiled=False)
        prof_probe = sleep_probe(ctx, c, loop, timers, profiled=True)
        c.figures["nosync_probe"] = {"plain": plain, "gpuprof": prof_probe}
        mx = THRESHOLDS["nosync_cpu_over_sleep_max"]
        if not plain["gpu_still_busy_after_steps"]:
            c.note("no-sync probe inconclusive: even the plain loop waited for the GPU "
                   f"({plain}); launch queue full?")
            c.expect("no-sync probe conclusive", False, False, "plain loop outruns the GPU",
                     required=False)
        else:
            ok = prof_probe["gpu_still_busy_after_steps"] and (
                prof_probe["cpu_over_sleep"] or 9) <= mx
            c.expect("profiled steps did not wait for the GPU (CPU time / GPU sleep)",
                     prof_probe["cpu_over_sleep"], ok,
                     f"<= {mx} and the sleep kernel still running after the steps")
        # Async evidence: in the probe run the GPU was idle-free only after the sleep, so
        # the stored wall_ns is launch time and gpu_ns the kernels' time.
        pid = prof_probe.get("run_id")
        if pid is not None:
            pr = ctx.rows("SELECT step, name, wall_ns, gpu_ns FROM phases WHERE run_id = ? "
                          "ORDER BY step, name", pid)
            c.figures["nosync_probe"]["phases"] = pr
            mn = THRESHOLDS["async_gpu_over_wall_min"]
            for name in ("forward", "backward"):
                g = [r["gpu_ns"] for r in pr if r["name"] == name and r["gpu_ns"] is not None]
                w = [r["wall_ns"] for r in pr if r["name"] == name]
                rr = ratio(mean(g), mean(w))
                c.expect(f"{name}: gpu_ns / wall_ns in the probe (async launch)", rnd(rr, 3),
                         rr is not None and rr >= mn, f">= {mn}")
    f = per_phase["forward"]
    c.headline = ("gpuprof/own (same loop) fwd {} bwd {} opt {}; un-profiled {} {} {}; "
                  "loop wall ratio {}").format(
        f["ratio_same_pass"], per_phase["backward"]["ratio_same_pass"],
        per_phase["optimizer"]["ratio_same_pass"], f["ratio_separate_pass"],
        per_phase["backward"]["ratio_separate_pass"],
        per_phase["optimizer"]["ratio_separate_pass"], rnd(lr, 3))
    del loop
    if ctx.cuda:
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Check 3: MFU on real kernels
# ---------------------------------------------------------------------------------------------
def expected_peak(model: str) -> Optional[float]:
    if "H200" not in model:
        return None
    return 835.0 if "NVL" in model else H200_BF16_PEAK_TFLOPS


def check_mfu(ctx: Ctx, c: Check) -> None:
    torch = ctx.torch
    sz = sizes(ctx)
    timers = Timers(ctx)
    n, k_per_step = sz["mfu_n"], sz["mfu_per_step"]
    g = torch.Generator(device=ctx.device).manual_seed(3)
    A = [torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16, generator=g)
         for _ in range(4)]
    B = [torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16, generator=g)
         for _ in range(4)]
    flops_per_step = matmul_flops(n) * k_per_step
    c.figures["workload"] = {"m=n=k": n, "matmuls_per_step": k_per_step,
                             "flops_per_step": flops_per_step, "dtype": "bf16"}

    def work() -> None:
        for j in range(k_per_step):
            A[j % 4] @ B[j % 4]

    for _ in range(3):
        work()
    ctx.sync()

    def profiled_loop(name: str, steps: int, sync_each_step: bool) -> dict[str, Any]:
        gpu_ms: list[float] = []
        ends: list[float] = []
        pairs: list[Any] = []
        with record_warnings(c):
            with ctx.profile(name, auto=False, flops_per_step=flops_per_step, dtype="bf16",
                             summary=sync_each_step) as prof:
                for i in range(steps):
                    with prof.step(i) as s:
                        with s.phase("matmul"):
                            m0 = timers.mark()
                            work()
                            m1 = timers.mark()
                        if sync_each_step:  # the step ends when its work is done, like a
                            ctx.sync()      # loop that reads loss.item() every step
                    ends.append(time.perf_counter())
                    pairs.append((m0, m1))
                ctx.sync()
        ctx.sync()
        gpu_ms = [timers.ms(a, b) for a, b in pairs]
        warm = 3
        tiles = [ends[i] - ends[i - 1] for i in range(warm, len(ends))]
        own_wall_step = mean(tiles)
        own_gpu_step = mean([x / 1e3 for x in gpu_ms[warm:]])
        res: dict[str, Any] = {
            "run_id": prof.run_id, "steps": steps,
            "own_step_wall_ms": rnd(own_wall_step * 1e3 if own_wall_step else None, 4),
            "own_step_gpu_ms": rnd(own_gpu_step * 1e3 if own_gpu_step else None, 4),
            "own_tflops_wall": rnd(flops_per_step / own_wall_step / 1e12
                                   if own_wall_step else None, 2),
            "own_tflops_gpu": rnd(flops_per_step / own_gpu_step / 1e12
                                  if own_gpu_step else None, 2),
        }
        if prof.run_id is None:
            return res
        run = ctx.run_row(prof.run_id)
        res["runs"] = {k: run.get(k) for k in ("gpu_model", "dtype", "flops_per_step",
                                               "flops_method", "device_kind")}
        rep, err = ctx.insights_json(prof.run_id)
        if rep is None:
            res["cli_error"] = err
            return res
        res["cli_mfu"] = rep.get("mfu")
        res["cli_steady"] = rep.get("steps", {}).get("steady")
        return res

    sync_res = profiled_loop("gpu-check-mfu", sz["mfu_steps"], sync_each_step=True)
    c.figures["synced_loop"] = sync_res
    async_res = profiled_loop("gpu-check-mfu-async", sz["mfu_async_steps"],
                              sync_each_step=False)
    c.figures["async_loop"] = async_res
    del A, B
    if ctx.cuda:
        torch.cuda.empty_cache()

    if sync_res.get("run_id") is None:
        c.expect("profile started", False, False, "run_id is set")
        return
    model = (sync_res.get("runs") or {}).get("gpu_model") or ""
    mfu = sync_res.get("cli_mfu")
    if mfu is None:
        c.expect("gpuprof insights --json", sync_res.get("cli_error"), False,
                 "the CLI reports the run")
        c.headline = f"CLI unavailable: {sync_res.get('cli_error')}"
        return
    value, peak, ach = mfu.get("value"), mfu.get("peak_tflops"), mfu.get("achieved_tflops")
    own_wall, own_gpu = sync_res["own_tflops_wall"], sync_res["own_tflops_gpu"]
    c.expect("mfu.value reported", value if value is not None else mfu.get("reason"),
             value is not None, "not null (reason otherwise)")
    exp_peak = expected_peak(model)
    c.expect("mfu.peak_tflops for the model", peak, peak is not None and exp_peak is not None
             and abs(peak - exp_peak) < 0.5,
             f"== {exp_peak} for '{model}' (989 H200 SXM, 835 H200 NVL)")
    r = ratio(ach, own_wall)
    lo, hi = THRESHOLDS["mfu_ratio"]
    c.expect("gpuprof achieved TFLOPs / own (wall per step)", rnd(r, 4), within(r, lo, hi),
             f"in [{lo}, {hi}]")
    own_mfu_989 = ratio(own_wall, H200_BF16_PEAK_TFLOPS)
    own_gpu_mfu_989 = ratio(own_gpu, H200_BF16_PEAK_TFLOPS)
    c.figures["summary"] = {
        "gpuprof_mfu": rnd(value, 4), "gpuprof_achieved_tflops": rnd(ach, 2),
        "gpuprof_peak_tflops": peak, "gpuprof_gpu_label": mfu.get("gpu"),
        "own_tflops_wall": own_wall, "own_tflops_gpu_events": own_gpu,
        "own_mfu_vs_989_wall": rnd(own_mfu_989, 4),
        "own_mfu_vs_989_gpu_events": rnd(own_gpu_mfu_989, 4),
        "own_mfu_vs_gpuprof_peak_wall": rnd(ratio(own_wall, peak), 4),
    }
    c.expect("gpuprof MFU plausible", rnd(value, 4), value is not None and 0.2 <= value <= 1.0,
             "in [0.2, 1.0] for 8192^3 bf16 matmuls", required=False)
    amfu = (async_res.get("cli_mfu") or {}).get("value")
    if amfu is not None:
        c.figures["summary"]["async_loop_gpuprof_mfu"] = rnd(amfu, 4)
        c.figures["summary"]["async_loop_own_tflops_gpu_events"] = async_res["own_tflops_gpu"]
        if amfu > 1.0:
            c.note(f"loop without any per-step sync: gpuprof reports MFU {amfu:.2f} (> 1): its "
                   "MFU uses CPU-timeline step times, and the CPU ran ahead of the GPU by up to "
                   "the launch queue; the GPU-event truth is "
                   f"{async_res['own_tflops_gpu']} TFLOP/s")
        c.expect("async loop: gpuprof MFU <= 1", rnd(amfu, 3), amfu <= 1.0,
                 "<= 1.0 (informational: CPU-timeline step times)", required=False)
    c.headline = (f"gpuprof MFU {rnd(value, 3)} ({rnd(ach, 1)} of {peak} TFLOP/s); own "
                  f"{own_wall} TFLOP/s wall, {own_gpu} by events = {rnd(own_mfu_989, 3)} / "
                  f"{rnd(own_gpu_mfu_989, 3)} of 989")


# ---------------------------------------------------------------------------------------------
# Check 4: overhead on GPU
# ---------------------------------------------------------------------------------------------
# Where a launch-bound loop's cost under gpuprof comes from: the same loop with parts of gpuprof
# turned off (flops_per_step= skips the automatic one-step FLOP count).
BREAKDOWN_VARIANTS: dict[str, Optional[dict[str, Any]]] = {
    "plain": None,
    "default": {},
    "flops_declared": {"flops_per_step": 1e9},
    "flops_declared_no_cuda_events": {"flops_per_step": 1e9, "cuda_events": False},
    "hooks_and_gpu_sampling": {"flops_per_step": 1e9, "cuda_events": False, "host": False},
    "hooks_only": {"flops_per_step": 1e9, "cuda_events": False, "host": False, "gpu": "none"},
}


def breakdown(ctx: Ctx, c: Check, step: Callable[[], None], rounds: int,
              block: int) -> dict[str, Any]:
    """Per variant (informational): the sync-bracketed block's mean step, the median CPU time of
    a step inside the block (launch cost; the first step apart) and the first step alone."""
    rng = random.Random(1)
    names = list(BREAKDOWN_VARIANTS)
    block_mean: dict[str, list[float]] = {n: [] for n in names}
    steps: dict[str, list[float]] = {n: [] for n in names}
    first: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            kw = BREAKDOWN_VARIANTS[name]
            cm = (contextlib.nullcontext() if kw is None
                  else ctx.profile(f"gpu-check-breakdown-{name}", **kw))
            with record_warnings(c), cm:
                ctx.sync()
                t0 = time.perf_counter()
                ts = []
                for _ in range(block):
                    a = time.perf_counter()
                    step()
                    ts.append(time.perf_counter() - a)
                ctx.sync()
                block_mean[name].append((time.perf_counter() - t0) / block)
            first[name].append(ts[0])
            steps[name].extend(ts[1:])
    out: dict[str, Any] = {}
    base_block = statistics.median(block_mean["plain"])
    base_step = statistics.median(steps["plain"])
    for n in names:
        bm, sm = statistics.median(block_mean[n]), statistics.median(steps[n])
        out[n] = {"block_mean_ms": rnd(bm * 1e3, 4), "step_cpu_median_ms": rnd(sm * 1e3, 4),
                  "first_step_ms": rnd(statistics.median(first[n]) * 1e3, 3),
                  "block_ratio": rnd(bm / base_block, 4), "step_cpu_ratio": rnd(sm / base_step, 4)}
    return out


def interleaved(ctx: Ctx, c: Check, run_name: str, step: Callable[[], None], rounds: int,
                block: int) -> dict[str, Any]:
    """Median per-step time (sync-bracketed blocks) plain vs gpuprof, interleaved."""
    rng = random.Random(0)
    per: dict[str, list[float]] = {"plain": [], "gpuprof": []}
    enter_exit: list[float] = []
    dropped = 0

    def run_block() -> float:
        ctx.sync()
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        ctx.sync()
        return (time.perf_counter() - t0) / block

    for _ in range(rounds):
        order = ["plain", "gpuprof"]
        rng.shuffle(order)
        for mode in order:
            if mode == "plain":
                per[mode].append(run_block())
                continue
            te0 = time.perf_counter()
            with record_warnings(c):
                with ctx.profile(run_name) as prof:
                    t_in = time.perf_counter()
                    per[mode].append(run_block())
                    t_out = time.perf_counter()
                    dropped += int(prof.stats().get("dropped_events", 0))
            enter_exit.append((t_in - te0) + (time.perf_counter() - t_out))
    med = {m: statistics.median(v) for m, v in per.items()}
    return {
        "median_step_ms": {m: rnd(v * 1e3, 4) for m, v in med.items()},
        "block_step_ms": {m: [rnd(x * 1e3, 4) for x in v] for m, v in per.items()},
        "ratio": rnd(ratio(med["gpuprof"], med["plain"]), 4),
        "profile_enter_exit_ms_median": rnd(statistics.median(enter_exit) * 1e3, 2)
        if enter_exit else None,
        "dropped_events": dropped, "rounds": rounds, "steps_per_block": block,
    }


def check_overhead(ctx: Ctx, c: Check) -> None:
    torch = ctx.torch
    sz = sizes(ctx)
    loop = TrainLoop(ctx, sz["tf"])
    for _ in range(sz["warm_steps"]):
        loop.step()
    ctx.sync()
    tf = interleaved(ctx, c, "gpu-check-overhead", loop.step, sz["ovh_rounds"], sz["ovh_block"])
    c.figures["transformer"] = dict(tf, model=sz["tf"])
    mx = THRESHOLDS["overhead_ratio_max"]
    c.expect("median step gpuprof / plain (bf16 transformer, GPU-bound)", tf["ratio"],
             tf["ratio"] is not None and tf["ratio"] <= mx, f"<= {mx}")
    c.expect("dropped events", tf["dropped_events"], tf["dropped_events"] == 0, "== 0",
             required=False)
    del loop
    if ctx.cuda:
        torch.cuda.empty_cache()

    # Launch-bound: a small MLP whose step is all kernel launches (hooks + CUDA events show).
    m = sz["mlp"]
    nn = torch.nn
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(m["layers"]):
        layers += [nn.Linear(m["d"], m["d"]), nn.ReLU()]
    mlp = nn.Sequential(*layers).to(ctx.device)
    opt = torch.optim.SGD(mlp.parameters(), lr=1e-3)
    x = torch.randn(m["batch"], m["d"], device=ctx.device)

    def mlp_step() -> None:
        mlp(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(10):
        mlp_step()
    lb = interleaved(ctx, c, "gpu-check-overhead-launch-bound", mlp_step, sz["ovh_rounds"],
                     sz["mlp_block"])
    c.figures["launch_bound_mlp"] = dict(lb, model=m)
    w = THRESHOLDS["overhead_launch_bound_warn"]
    c.expect("median step gpuprof / plain (launch-bound MLP, informational)", lb["ratio"],
             lb["ratio"] is not None and lb["ratio"] <= w, f"<= {w}", required=False)
    c.figures["launch_bound_breakdown"] = breakdown(ctx, c, mlp_step, sz["ovh_rounds"],
                                                    sz["mlp_block"])
    c.headline = (f"transformer {tf['median_step_ms']['plain']} -> "
                  f"{tf['median_step_ms']['gpuprof']} ms/step (x{tf['ratio']}); launch-bound MLP "
                  f"{lb['median_step_ms']['plain']} -> {lb['median_step_ms']['gpuprof']} ms "
                  f"(x{lb['ratio']})")


sys.path.insert(0, str(HERE))
from linescope_checks import check_linescope, check_scalene  # noqa: E402
from ddp_checks import check_ddp  # noqa: E402
from trace_checks import check_traces  # noqa: E402

CHECKS: dict[str, Callable[[Ctx, Check], None]] = {
    "nvml": check_nvml, "phases": check_phases, "mfu": check_mfu, "overhead": check_overhead,
    "traces": lambda ctx, c: check_traces(ctx, c, sys.modules[__name__]),
    "linescope": check_linescope, "scalene": check_scalene,
    "ddp": lambda ctx, c: check_ddp(ctx, c, sys.modules[__name__]),
}
# A check missing from CHECK_ORDER would silently never run on the device.
assert set(CHECK_ORDER) == set(CHECKS) == set(CHECK_TITLES), "check lists differ"


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def read_steps(work: Path) -> list[dict[str, Any]]:
    path = work / "steps.tsv"
    steps = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 6:
                steps.append({"step": parts[0], "status": parts[1], "rc": parts[2],
                              "seconds": parts[3], "timeout_s": parts[4], "log": parts[5],
                              "note": parts[6] if len(parts) > 6 else ""})
    return steps


def test_summary(out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    ctest = out / "ctest.log"
    if ctest.exists():
        text = ctest.read_text(errors="replace")
        m = re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", text)
        if m:
            res["ctest"] = {"passed_pct": int(m.group(1)), "failed": int(m.group(2)),
                            "total": int(m.group(3)),
                            "failed_tests": re.findall(r"^\s*\d+ - (\S+) \(", text, re.M)[:30]}
    pyt = out / "pytest.log"
    if pyt.exists():
        lines = [x for x in pyt.read_text(errors="replace").splitlines()
                 if re.search(r"\d+ (passed|failed|error)", x) and " in " in x]
        if lines:
            res["pytest"] = {"summary": lines[-1].strip("= ").strip(),
                             "failed_tests": re.findall(r"^(?:FAILED|ERROR) (\S+)",
                                                        pyt.read_text(errors="replace"),
                                                        re.M)[:30]}
    return res


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        s = json.dumps(v)
        return s if len(s) <= 120 else s[:117] + "..."
    return str(v)


def render(out: Path, work: Path) -> str:
    checks_path = work / "checks.json"
    data: dict[str, Any] = {}
    if checks_path.exists():
        try:
            data = json.loads(checks_path.read_text())
        except json.JSONDecodeError as e:
            data = {"error": f"checks.json unreadable: {e}"}
    steps = read_steps(work)
    tests = test_summary(out)
    checks = data.get("checks", [])
    results = {"format": "gpuprof.gpu-validation/1", "generated_unix": time.time(),
               "meta": data.get("meta", {}), "steps": steps, "tests": tests,
               "checks": checks, "thresholds": THRESHOLDS}
    counts: dict[str, int] = {}
    for ch in checks:
        counts[ch["status"]] = counts.get(ch["status"], 0) + 1
    results["summary"] = counts
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(jsonable(results), indent=2) + "\n")

    meta = data.get("meta", {})
    L: list[str] = ["# gpuprof GPU validation", ""]
    L.append(f"Generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}. "
             "Figures in results.json; logs beside this file.")
    L.append("")
    if meta:
        keys = ["cuda_device", "cuda_capability", "torch", "torch_cuda", "python", "gpuprof",
                "gpuprof_cli_version", "dry_run", "note", "gpuprof_error", "torch_error"]
        L.append("| environment | value |")
        L.append("|---|---|")
        for k in keys:
            if k in meta:
                L.append(f"| {k} | {fmt(meta[k])} |")
        L.append("")
    if steps:
        L += ["## Steps (run.sh)", "", "| step | status | rc | seconds | timeout | log | note |",
              "|---|---|---|---|---|---|---|"]
        for s in steps:
            L.append(f"| {s['step']} | {s['status']} | {s['rc']} | {s['seconds']} | "
                     f"{s['timeout_s']} | {s['log']} | {s['note']} |")
        L.append("")
    if tests:
        L += ["## CPU test suites", ""]
        if "ctest" in tests:
            t = tests["ctest"]
            L.append(f"- ctest: {t['total'] - t['failed']}/{t['total']} passed"
                     + (f"; failed: {', '.join(t['failed_tests'])}" if t["failed_tests"] else ""))
        if "pytest" in tests:
            t = tests["pytest"]
            L.append(f"- pytest: {t['summary']}"
                     + (f"; failed: {', '.join(t['failed_tests'])}" if t["failed_tests"] else ""))
        L.append("")
    if data.get("error"):
        L += [f"**{data['error']}**", ""]
    if not checks:
        L += ["## Checks", "", "**No check results** (checks.py did not run or was killed "
              "before its first check finished; see checks.log).", ""]
    else:
        L += ["## Checks", "", "| check | status | seconds | headline |", "|---|---|---|---|"]
        for ch in checks:
            head = ch.get("headline") or ch.get("skip_reason") or ch.get("error") or ""
            L.append(f"| {ch['title']} | **{ch['status'].upper()}** | {ch['seconds']} | "
                     f"{head.replace('|', '/')} |")
        L.append("")
        for ch in checks:
            L += [f"### {ch['title']} — {ch['status'].upper()}", ""]
            if ch.get("skip_reason"):
                L += [f"Skipped: {ch['skip_reason']}", ""]
            if ch.get("error"):
                L += ["Error:", "", "```", ch["error"][-3000:], "```", ""]
            if ch["asserts"]:
                L += ["| assertion | value | threshold | ok | required |", "|---|---|---|---|---|"]
                for a in ch["asserts"]:
                    L.append(f"| {a['name']} | {fmt(a['value'])} | {a['threshold']} | "
                             f"{'yes' if a['ok'] else '**NO**'} | "
                             f"{'yes' if a['required'] else 'info'} |")
                L.append("")
            for n in ch.get("notes", []):
                L.append(f"- {n}")
            if ch.get("notes"):
                L.append("")
            key_figs = {k: v for k, v in ch.get("figures", {}).items()
                        if k in ("phases", "summary", "busy_window", "nonnull_fraction",
                                 "loop_wall_s", "nosync_probe", "transformer",
                                 "launch_bound_mlp", "synced_loop", "async_loop",
                                 "telemetry_status", "diagnostics", "cli_phases")}
            if key_figs:
                L += ["<details><summary>figures</summary>", "", "```json",
                      json.dumps(jsonable(key_figs), indent=1)[:8000], "```", "</details>", ""]
    L += ["## Verdict", ""]
    verdict = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no checks ran"
    L.append(verdict)
    (out / "report.md").write_text("\n".join(L) + "\n")

    # Compact summary for the end of run.sh's output (the run tool returns its last 12,000
    # characters): steps, suites, one line per check, the failed assertions.
    S = ["== SUMMARY (details in report.md / results.json)"]
    for st in steps:
        S.append(f"step {st['step']:7s} {st['status']:8s} {st['seconds']:>4s}s  {st['note']}")
    for k, t in tests.items():
        S.append(f"{k}: " + (t.get("summary") or f"{t['total'] - t['failed']}/{t['total']} passed"))
    for ch in checks:
        head = ch.get("headline") or ch.get("skip_reason") or (ch.get("error") or "")[-300:]
        S.append(f"check {ch['name']:8s} {ch['status'].upper():5s} {head}")
        for a in ch["asserts"]:
            if not a["ok"]:
                label = "info  " if not a["required"] else (
                    "(skip)" if ch["status"] == "skip" else "FAILED")
                S.append(f"    {label} {a['name']}: "
                         f"{fmt(a['value'])} (want {a['threshold']})")
    S.append(f"verdict: {verdict}")
    return "\n".join(S)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def save(ctx: Ctx, results: list[Check]) -> None:
    data = {"meta": ctx.meta, "checks": [r.to_json() for r in results]}
    tmp = ctx.work / "checks.json.tmp"
    tmp.write_text(json.dumps(jsonable(data), indent=2))
    tmp.replace(ctx.work / "checks.json")


def copy_db(ctx: Ctx) -> None:
    """A self-contained copy of the checks' DB (WAL folded in) for later inspection."""
    if not ctx.db.exists():
        return
    dst = ctx.out / "gpuprof_checks.db"
    try:
        src = sqlite3.connect(f"file:{ctx.db}?mode=ro", uri=True)
        if dst.exists():
            dst.unlink()
        out = sqlite3.connect(dst)
        with out:
            src.backup(out)
        out.close()
        src.close()
    except Exception as e:
        log(f"copying the DB failed: {e!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = os.environ.get("OUT") or str(HERE / "out")
    ap.add_argument("--out", default=default_out, help="where report.md/results.json go")
    ap.add_argument("--work", default=None, help="scratch dir (DB, checks.json); default "
                    "$GPUPROF_GPU_WORK or OUT/../gpuprof-gpu-work under /tmp")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: run every code path on the CPU with tiny sizes, mark skip")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render report.md/results.json from WORK and OUT logs")
    ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(CHECKS))
    args = ap.parse_args()
    if args.work is None:
        args.work = os.environ.get("GPUPROF_GPU_WORK") or "/tmp/gpuprof-gpu-work"
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        print(render(out, work))
        return 0

    ctx = Ctx(args)
    for p in (ctx.db, Path(str(ctx.db) + "-wal"), Path(str(ctx.db) + "-shm"),
              work / "checks.json"):
        if p.exists():
            p.unlink()
    ctx.load()
    log(f"python {ctx.meta.get('python')}, torch {ctx.meta.get('torch')}, device "
        f"{ctx.meta.get('cuda_device', 'none')}, gpuprof {ctx.meta.get('gpuprof')}, dry_run "
        f"{ctx.dry}, cuda used {ctx.cuda}")
    names = [n for n in (args.only.split(",") if args.only else CHECK_ORDER) if n]
    results: list[Check] = []
    for name in names:
        c = Check(name)
        results.append(c)
        t0 = time.monotonic()
        log(f"check {name}: start")
        try:
            if name not in CHECKS:
                raise KeyError(f"unknown check {name!r} (valid: {', '.join(CHECKS)})")
            if ctx.torch is None:
                c.skip_reason = f"torch not importable: {ctx.meta.get('torch_error')}"
            elif ctx.gpuprof is None:
                c.skip_reason = ctx.gpuprof_error
            elif not ctx.cuda and not ctx.dry:
                c.skip_reason = ("CUDA not available (torch.cuda.is_available() is False); "
                                 "use --dry-run to exercise the code paths on CPU")
            else:
                # Scalene samples with SIGALRM and refuses to start beside an armed timer:
                # that check is bounded by run.sh's step timeout alone.
                with (contextlib.nullcontext() if name in NO_ALARM_CHECKS
                      else time_limit(CHECK_LIMIT_S)):
                    CHECKS[name](ctx, c)
                if ctx.dry:
                    c.skip_reason = ("dry run: CUDA unavailable, code path exercised on CPU "
                                     "with tiny sizes and gpu='mock'; figures not meaningful "
                                     f"(would have been: {c.status})")
        except BaseException as e:  # one check never takes the others down
            if isinstance(e, KeyboardInterrupt):
                raise
            c.error = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            log(f"check {name}: ERROR {e!r}")
        finally:
            c.seconds = time.monotonic() - t0
            if ctx.cuda:
                with contextlib.suppress(Exception):
                    ctx.torch.cuda.synchronize()
                    ctx.torch.cuda.empty_cache()
        log(f"check {name}: {c.status.upper()} in {c.seconds:.1f}s  {c.headline}")
        for a in c.asserts:
            log(f"    [{'ok' if a['ok'] else 'NO'}{'' if a['required'] else ' (info)'}] "
                f"{a['name']}: {fmt(a['value'])}  (want {a['threshold']})")
        if c.skip_reason:
            log(f"    skip: {c.skip_reason}")
        save(ctx, results)
    copy_db(ctx)
    render(out, work)
    statuses = [c.status for c in results]
    log("summary: " + ", ".join(f"{c.name}={c.status}" for c in results))
    if any(s in ("fail", "error") for s in statuses):
        return 1
    if not ctx.dry and statuses and all(s == "skip" for s in statuses):
        return 2  # a real run where nothing could be checked (no CUDA, no gpuprof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
