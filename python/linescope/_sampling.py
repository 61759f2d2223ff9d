"""The native sampling side of linescope: the ``sampler`` backend (CPU, host memory and GPU per
line, from ``_native.LineSampler``) and the memory sampler that runs beside any backend that
does not measure memory itself (``memory=True``)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any
from collections.abc import Callable

from ._backends import BackendOptions, native_cwd, nothing_recorded, register_backend
from ._model import (BackendCapabilities, GPUCollection, GPUStats, MemoryProfile,
                     RawBackendResult, RawFunction, RawLine)

DEFAULT_SAMPLE_RATE = 1000.0  # Hz
MAX_SAMPLE_RATE = 20000.0
MEMORY_INTERVAL_NS = 1_000_000  # the memory sampler beside other backends: 1 kHz

MAIN_THREAD_ONLY = ("the 'sampler' backend samples the main thread (samples are taken there by "
                    "the interpreter); start the session from the main thread")
PER_LINE_MEMORY_NEEDS_MAIN = (
    "per-line memory needs the profiled thread to be the main thread (memory samples are "
    "attributed there); the RSS timeline covers the whole process")


def _native() -> Any:
    from gpuprof import _native  # the shared native core

    return _native


def _gpu_backend(requested: bool) -> str:
    if not requested:
        return "off"
    # The same switch as gpuprof.profile(gpu=...): auto (NVML when present, else AWS Neuron
    # when neuron-monitor and /dev/neuron0 are), nvml, neuron, mock, none.
    return os.environ.get("GPUPROF_GPU_BACKEND", "auto") or "auto"


def _cupti() -> tuple[bool, str]:
    """Whether to trace kernels with CUPTI, and the library to load ("" = the native default:
    $GPUPROF_CUPTI_LIBRARY, then libcupti.so on the loader path). GPUPROF_CUPTI=0 turns it off.
    CUDA builds of torch bring CUPTI in the nvidia-cuda-cupti wheel; that copy is preferred."""
    if os.environ.get("GPUPROF_CUPTI", "1") == "0":
        return False, ""
    if os.environ.get("GPUPROF_CUPTI_LIBRARY"):
        return True, ""
    import importlib.util

    for mod in ("nvidia.cuda_cupti", "nvidia.cu13", "nvidia.cu12"):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        for d in (spec.submodule_search_locations or []) if spec else []:
            libs = sorted(Path(d).glob("lib/libcupti.so*"))
            if libs:
                return True, str(libs[0])
    return True, ""


def _synchronize_cuda() -> None:
    """Waits for queued GPU work (so its kernels are measured) when torch already uses CUDA;
    never imports torch or initialises CUDA itself."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # profiling must not break the program
        pass


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _memory_profile(native: Any, per_line: bool, interval_ns: int,
                    reason: str | None) -> MemoryProfile:
    m = native.memory()
    timeline = [(int(t), int(v)) for t, v in native.timeline()]
    if m["start"] is None and reason is None:
        reason = "; ".join(native.notes) or "RSS could not be read"
    return MemoryProfile(timeline=timeline, start_rss_bytes=m["start"],
                         peak_rss_bytes=m["peak"], end_rss_bytes=m["end"],
                         interval_ns=interval_ns * max(1, int(m["samples_per_point"])),
                         per_line=per_line and m["start"] is not None, reason=reason)


class SamplerBackend:
    """A native sampling profiler of the main thread: every 1/sample_rate s (default 1 kHz)
    the line the main thread is on receives the wall time since the previous sample, the
    thread's CPU time over it, and with ``memory=True`` the RSS change and peak; with
    ``gpu=True`` the GPU busy time (sampled utilization x time, NVML) and the process's peak
    device memory. Hits are not counted (None)."""

    capabilities = BackendCapabilities(line_time=True, hit_counts=False, function_stats=True,
                                       memory=True, sampled=True, gpu=True, threads="main thread")

    def __init__(self, options: BackendOptions) -> None:
        rate = options.sample_rate or DEFAULT_SAMPLE_RATE
        if rate > MAX_SAMPLE_RATE:
            raise ValueError(f"sample_rate {rate:g} is above the sampler's maximum of "
                             f"{MAX_SAMPLE_RATE:g} samples per second")
        self._interval_ns = int(1e9 / rate)
        self._options = options
        cupti, cupti_library = _cupti() if options.gpu else (False, "")
        self._native = _native().LineSampler(
            list(options.roots), list(options.include), list(options.exclude), native_cwd(),
            interval_ns=self._interval_ns, attribute=True, memory=options.memory,
            gpu_backend=_gpu_backend(options.gpu), cupti=cupti, cupti_library=cupti_library)

    def start(self) -> None:
        if not _on_main_thread():
            raise RuntimeError(MAIN_THREAD_ONLY)
        self._native.start()

    def stop(self) -> None:
        if self._options.gpu:
            _synchronize_cuda()
        self._native.stop()

    def _detach_after_fork(self) -> None:
        """In a child of os.fork() made during the session (see SamplerSession)."""
        self._native.detach_after_fork()

    def _pause_for_fork(self, caller: Any) -> None:
        """Before os.fork(): the sampler thread is joined (see SamplerSession.PauseForFork);
        ``caller`` is the frame calling os.fork() on the main thread, else None."""
        self._native.pause_for_fork(caller)

    def _resume_after_fork(self) -> None:
        """After os.fork(), in the parent: sampling goes on once os.fork() has returned."""
        self._native.resume_after_fork()

    def result(self) -> RawBackendResult:
        n = self._native
        want_gpu = self._options.gpu
        lines = []
        for (f, ln, samples, wall, cpu, rss_delta, rss_peak, gpu_busy,
             gpu_mem) in n.lines():
            gpu = GPUStats(time_ns=gpu_busy, peak_memory_bytes=gpu_mem) if want_gpu else None
            lines.append(RawLine(filename=f, line=ln, wall_time_ns=wall, hits=None,
                                 memory=rss_delta, gpu=gpu, samples=samples,
                                 memory_peak=rss_peak, cpu_time_ns=cpu))
        functions = [RawFunction(filename=f, qualname=q, first_line=first, total_time_ns=tot,
                                 own_time_ns=own, calls=None)
                     for f, q, first, tot, own, _samples in n.functions()]
        stats = n.stats()
        warnings = list(n.notes)
        collection = None
        if want_gpu:
            g = n.gpu()
            collection = gpu_collection(g)
            warnings.extend(g["warnings"])  # each once, decided in C++ (FinishGpuCollection)
        if not lines:
            warnings.append(nothing_recorded(self._options.roots, "was sampled") +
                            " (or the session was shorter than the sampling interval)")
        if stats["failed_requests"]:
            warnings.append(f"{stats['failed_requests']} samples could not be requested (the "
                            "interpreter's pending-call queue was full)")
        memory = (_memory_profile(n, True, self._interval_ns, None)
                  if self._options.memory else None)
        kernels = {}
        if want_gpu and "kernel_count" in g:
            kernels = {"kernel_count": g["kernel_count"],
                       "unattributed_kernel_ns": g["unattributed_kernel_ns"]}
        return RawBackendResult(
            lines=lines, functions=functions, elapsed_ns=stats["elapsed_ns"],
            warnings=warnings, memory=memory, gpu=collection,
            metadata={"sampler": "pending-call", "sample_interval_ns": self._interval_ns,
                      "samples": stats["samples"], "requests": stats["requests"],
                      "sampler_wakeups": stats["wakeups"],
                      "unattributed_samples": stats["unattributed_samples"],
                      "unattributed_ns": stats["unattributed_ns"], **kernels})


def gpu_collection(g: dict[str, Any]) -> GPUCollection:
    """The sampler's GPUCollection from the native summary ``g`` (LineSampler.gpu(); decided in
    C++ by lines::SummarizeGpuCollection and FinishGpuCollection)."""
    return GPUCollection(method=g["method"], time_available=g["time_available"],
                         memory_available=g["memory_available"], time_reason=g["time_reason"],
                         memory_reason=g["memory_reason"], devices=list(g["devices"]),
                         utilization_scope=g["utilization_scope"],
                         diagnostics=list(g["diagnostics"]))


LineSource = tuple[int, Callable[[list[int]], list[tuple[int, str, int]]]]


class MemorySampler:
    """RSS sampling beside a backend that does not measure memory (``memory=True``): a bounded
    RSS timeline for the process and RSS changes and peaks per line.

    Per line, either from a backend's ``_memory_line_source()`` (the `trace` backend: it
    publishes the current line at every line change, and each RSS reading, every
    MEMORY_INTERVAL_NS on the sampler thread, is charged to the line running at that moment,
    on any thread), or else from samples that the main thread answers (pending calls: a
    reading lands on the line the main thread is on when it answers, i.e. after a long C call
    returns; not available off the main thread)."""

    def __init__(self, options: BackendOptions, line_source: LineSource | None = None) -> None:
        self._source = line_source
        self._per_line = line_source is not None or _on_main_thread()
        self._native = _native().LineSampler(
            list(options.roots), list(options.include), list(options.exclude), native_cwd(),
            interval_ns=MEMORY_INTERVAL_NS,
            attribute=self._per_line and line_source is None, memory=True, gpu_backend="off")
        if line_source is not None:
            self._native.set_line_source(line_source[0])

    def start(self) -> None:
        self._native.start()

    def stop(self) -> None:
        self._native.stop()

    def _detach_after_fork(self) -> None:
        self._native.detach_after_fork()

    def _pause_for_fork(self, caller: Any) -> None:
        self._native.pause_for_fork(caller)

    def _resume_after_fork(self) -> None:
        self._native.resume_after_fork()

    @property
    def warnings(self) -> list[str]:
        return list(self._native.notes)

    def profile(self) -> MemoryProfile:
        return _memory_profile(self._native, self._per_line, MEMORY_INTERVAL_NS,
                               None if self._per_line else PER_LINE_MEMORY_NEEDS_MAIN)

    def per_line(self) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """(filename, line) -> (RSS change, RSS peak)."""
        if self._source is None:
            return {(f, ln): (rss_delta, rss_peak)
                    for f, ln, _s, _w, _c, rss_delta, rss_peak, _g, _m in self._native.lines()}
        rows = self._native.source_lines()
        where = {key: (f, ln) for key, f, ln in self._source[1]([r[0] for r in rows])}
        sums: dict[tuple[str, int], tuple[int, int]] = {}
        for key, delta, peak, _readings in rows:
            loc = where.get(key)
            if loc is None:
                continue
            # Code objects sharing a line (a lambda on its caller's line) are one line.
            old_delta, old_peak = sums.get(loc, (0, peak))
            sums[loc] = (old_delta + delta, max(old_peak, peak))
        return dict(sums)


register_backend("sampler", SamplerBackend)
