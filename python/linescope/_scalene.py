"""The ``scalene`` backend: Scalene's CPU + GPU sampler, driven inside the profiled process.

Scalene normally launches the program itself (``scalene prog.py``): it preloads its allocator
library, puts a ``python`` alias first on PATH for child processes and installs process-wide
shims (``threading.Lock``, ``os._exit``, ``exec``/``compile``, ...) that it never undoes. A
session that starts inside a running program can do none of that, so this adapter drives
Scalene's sampling core only:

* ``Scalene.cpu_signal_handler`` on SIGALRM from a wall-clock interval timer (Scalene's default
  mode; on Windows a background thread calls it, as Scalene does there). Each call reads the GPU
  collector, walks every thread's stack to its innermost recorded frame and updates Scalene's
  ``ScaleneStatistics``: Scalene's Python / native / system split, its loop-body redistribution
  and its GPU attribution apply unchanged.
* Scalene's NVIDIA (pynvml) and AWS Neuron collectors for ``gpu=True`` (NVIDIA with three
  methods replaced, see ``_scalene_gpu``).
* The equivalent of Scalene's ``Thread.join`` / lock shims, for the session's lifetime only and
  on the main thread only (``WaitShims``): a main thread waiting for other threads wakes every
  few milliseconds, so that the handler runs and the other threads are sampled.

A session that is never stopped ends its sampling at interpreter exit (atexit), before the
interpreter resets signal handlers and a pending SIGALRM would terminate the process.

The statistics are read in memory after stop(). Scalene's JSON writer reads the same
accumulators but reports percentages, drops files under 1 % of the time and has no per-line GPU
seconds, so it is not used. Scalene's class-level state is set through its name-mangled
attributes: a Scalene release outside the tested ones (``SUPPORTED_SCALENE``) is refused at
start(), and one that renames them fails there too, with a message naming the release.

The GPU collectors live in ``_scalene_gpu``, the wait shims in ``_scalene_waits``.
"""

from __future__ import annotations

import atexit
import builtins
import dataclasses
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ._backends import BackendOptions, is_utf8, native_cwd, register_backend
from ._model import BackendCapabilities, GPUStats, RawBackendResult, RawLine
from ._sampling import MAX_SAMPLE_RATE
from ._scalene_gpu import (MIB, GpuState, NeuronCollector, gpu_collection, gpu_warnings,
                           open_gpu)
from ._scalene_waits import WaitShims

INSTALL_HINT = "install it with: pip install 'gpuprof[scalene]' (Python 3.11-3.14)"

MEMORY_REASON = (
    "Scalene measures memory through its allocator library, which must be preloaded when the "
    "process starts (LD_PRELOAD / DYLD_INSERT_LIBRARIES, done by the `scalene` command); an "
    "in-process linescope session starts later, so Scalene's memory columns are not collected")

_DEFAULT_INTERVAL_S = 0.01  # Scalene's default mean sampling interval (100 samples/s)

_SYNTHETIC = "<"

# The Scalene releases (major, minor), inclusive, that the adapter accepts: it sets Scalene's
# name-mangled class state and subclasses its CPU profiler, which any release may change.
# The upper bound is the newest release the scalene tests passed on (tests/linescope/
# test_scalene.py); raise it only after they pass on a newer one.
SUPPORTED_SCALENE = ((2, 0), (2, 4))


def _load_scalene() -> dict[str, Any]:
    """Imports the parts of Scalene the adapter uses, from a supported release only (see
    ``check_scalene_version``). Importing Scalene sets LC_ALL=POSIX in os.environ and installs
    ``builtins.profile``; both are undone here, so that importing the backend changes nothing
    in the profiled program."""
    scalene_version = _installed_version()
    if scalene_version is not None:  # checked before importing: an unsupported one is not
        check_scalene_version(scalene_version)
    missing = object()
    saved_lc_all = os.environ.get("LC_ALL")
    saved_profile = builtins.__dict__.get("profile", missing)
    try:
        import scalene
        from scalene import scalene_profiler
        from scalene.scalene_arguments import ScaleneArguments
        from scalene.scalene_cpu_profiler import ScaleneCPUProfiler
        from scalene.scalene_utility import clear_intern_caches
        from scalene.time_info import TimeInfo, get_times
    except ImportError as e:
        raise RuntimeError(f"the 'scalene' backend needs the scalene package, which could not "
                           f"be imported ({e}); {INSTALL_HINT}") from None
    finally:
        if saved_lc_all is None:
            os.environ.pop("LC_ALL", None)
        else:
            os.environ["LC_ALL"] = saved_lc_all
        if saved_profile is missing:
            builtins.__dict__.pop("profile", None)
        else:
            builtins.profile = saved_profile  # type: ignore[attr-defined]
    if scalene_version is None:  # no package metadata (a source tree on sys.path)
        try:
            from scalene import scalene_config
            scalene_version = str(scalene_config.scalene_version)
        except (ImportError, AttributeError):
            scalene_version = "unknown"
        check_scalene_version(scalene_version)
    return dict(Scalene=scalene_profiler.Scalene, ScaleneArguments=ScaleneArguments,
                ScaleneCPUProfiler=ScaleneCPUProfiler, TimeInfo=TimeInfo, get_times=get_times,
                clear_intern_caches=clear_intern_caches, version=scalene_version,
                package_dir=os.path.dirname(os.path.abspath(scalene.__file__)))


def _installed_version() -> str | None:
    """The installed Scalene's version from its package metadata (None: no metadata)."""
    from importlib import metadata

    try:
        return metadata.version("scalene")
    except (metadata.PackageNotFoundError, ValueError):
        return None


def check_scalene_version(version: str) -> None:
    """Refuses (RuntimeError, at start) a Scalene release outside ``SUPPORTED_SCALENE``, or one
    whose version cannot be read: the adapter patches Scalene's internals and does not guess
    how an untested release lays them out."""
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_SCALENE
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is not None and (lo_major, lo_minor) <= (int(m[1]), int(m[2])) <= (hi_major, hi_minor):
        return
    raise RuntimeError(
        f"the 'scalene' backend supports Scalene {lo_major}.{lo_minor} to {hi_major}.{hi_minor} "
        f"(it drives Scalene's internals, which change between releases), not the installed "
        f"Scalene {version}; install a supported release with: pip install "
        f"'scalene>={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}', or choose another "
        "backend (backend='sampler' also samples lines and the GPU)")


def _wall_weighted(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Scalene's CPU-sample arguments (now, gpu_load, gpu_mem_used, prev, is_thread_sleeping,
    should_trace, last_cpu_interval, ...) with the time the sample books made equal to the wall
    time since the previous sample. Scalene books max(interval, process CPU time since the
    previous sample) and splits that into Python (the interval) and native (the excess) time;
    a line that sleeps or waits is then booked the timer interval while the signal actually
    came later, and a CPU-bound line the full gap, so wall shares lean towards CPU-bound lines.
    Scaling both terms by gap / booked keeps Scalene's Python / native split and its split over
    lines and threads, and makes every sample weigh what it spans. Arguments of another shape
    (a Scalene whose signature differs) pass unchanged."""
    if len(args) < 7:
        return args
    now, prev, interval = args[0], args[3], args[6]
    try:
        wall = float(now.wallclock - prev.wallclock)
        cpu = float(now.virtual - prev.virtual)
        interval = float(interval)
        booked = max(interval, cpu)
        if not (wall > 0 and booked > 0 and math.isfinite(wall / booked)):
            return args
        factor = wall / booked
        scaled_prev = dataclasses.replace(prev, virtual=now.virtual - cpu * factor)
    except (AttributeError, TypeError, ValueError):
        return args
    return (*args[:3], scaled_prev, *args[4:6], interval * factor, *args[7:])


# ---- the backend ---------------------------------------------------------------------------

class ScaleneBackend:
    """Sampled per-line CPU time (Python / native / system, Scalene's split), sample counts
    and, with ``gpu=True``, Scalene's per-line GPU time estimate and GPU peak memory. Samples
    every thread; each sample goes to the innermost recorded line of each thread's stack."""

    capabilities = BackendCapabilities(
        line_time=True, hit_counts=False, function_stats=False, memory=False, sampled=True,
        gpu=True, threads="all threads (sampled; start() must run on the main thread)")

    def __init__(self, options: BackendOptions) -> None:
        # The `sampler` backend's bound: Scalene's Python-level handler keeps up with it on a
        # 2-core machine; at 10^6/s it overflows the stack.
        if options.sample_rate is not None and options.sample_rate > MAX_SAMPLE_RATE:
            raise ValueError(
                f"sample_rate {options.sample_rate:g} is above the scalene backend's maximum "
                f"of {MAX_SAMPLE_RATE:g} samples per second (Scalene's signal handler, which "
                "runs on the main thread, cannot keep up beyond that)")
        self._opts = options
        self._sc = _load_scalene()
        from gpuprof import _native

        self._cwd = os.getcwd()
        exclude = [*options.exclude, self._sc["package_dir"] + "/*"]
        # A LineTracer that never starts is the native path filter (lines::PathFilter): the
        # same recorded-file rule as the `trace` backend.
        self._filter = _native.LineTracer(list(options.roots), list(options.include), exclude,
                                          native_cwd())
        self._decided: dict[str, bool] = {}
        self._interval_s = (1.0 / options.sample_rate if options.sample_rate
                            else _DEFAULT_INTERVAL_S)
        self._gpu: GpuState | None = None
        self._accelerator: Any = None
        self._running = False
        self._driver = "thread" if sys.platform == "win32" else "SIGALRM"
        self._prev_handler: Any = None
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._handler_error: str | None = None
        self._t0 = self._t1 = 0
        self._started = self._stopped = False
        self._pid = os.getpid()
        self._shims: WaitShims | None = None
        # Stretches in which the handler ran late while other threads ran: the
        # main thread ran no Python code (a wait the shims do not cover, a long native call).
        self._stall_min_s = max(0.2, 20 * self._interval_s)
        self._last_alarm = 0.0
        self._others_recorded = False  # the latest sample found other threads in recorded code
        self._stalls: list[tuple[float, str]] = []  # (seconds, main thread's line after it)

    # Scalene asks this for every frame it walks; cached per file name.
    def _should_trace(self, filename: str, func: str) -> bool:
        r = self._decided.get(filename)
        if r is None:
            r = self._decided[filename] = (bool(filename) and is_utf8(filename)
                                           and self._filter.recorded(filename))
        return r

    def start(self) -> None:
        S = self._sc["Scalene"]
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "the 'scalene' backend must be started on the main thread: Scalene samples "
                "with a timer signal, and Python runs signal handlers on the main thread only")
        if getattr(S, "_Scalene__initialized", False):
            raise RuntimeError(
                "this process already runs under the scalene command; use its own output, or "
                "run the program with plain python to profile it with backend='scalene'")
        if sys.platform == "darwin":
            from scalene.scalene_utility import is_apple_silicon_sme
            if is_apple_silicon_sme():
                raise RuntimeError(
                    "the in-process 'scalene' backend samples with SIGALRM, which corrupts "
                    "Accelerate's SME state on Apple M4 and later (Scalene issue #1056); run "
                    "the program under the scalene command instead")
        if self._driver == "SIGALRM":
            if signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0):
                raise RuntimeError(
                    "the 'scalene' backend samples with SIGALRM, but this process already has "
                    "a real-time interval timer (signal.setitimer / signal.alarm) armed")
            if signal.getsignal(signal.SIGALRM) is None:
                raise RuntimeError(
                    "the 'scalene' backend samples with SIGALRM, but native code has installed "
                    "a SIGALRM handler that Python could not restore afterwards")
        try:
            self._configure(S)
        except AttributeError as e:
            raise RuntimeError(f"linescope's scalene adapter does not support Scalene "
                               f"{self._sc['version']} (its internals differ: {e})") from None
        if self._opts.gpu:
            self._gpu = GpuState()
            self._accelerator = open_gpu(self._gpu)
        S._Scalene__accelerator = self._accelerator
        stats = S._Scalene__stats
        stats.clear_all()
        self._sc["clear_intern_caches"]()
        if self._accelerator is not None and hasattr(self._accelerator, "start_monitor"):
            try:
                self._accelerator.start_monitor()
            except Exception as e:  # noqa: BLE001 - GPU unavailable; CPU profiling goes on
                assert self._gpu is not None
                self._gpu.unavailable = (f"AWS Neuron: neuron-monitor could not be started "
                                         f"({e}); GPU measurements are unavailable")
                self._gpu.kind = self._gpu.method = self._gpu.scope = None
                self._gpu.devices.clear()
                self._accelerator = None
                S._Scalene__accelerator = None
        stats.start_clock()
        # The times the first sample measures from (as Scalene does on Windows): the first
        # signal records a sample instead of only initialising them.
        begin = self._sc["TimeInfo"]()
        begin.sys, begin.user = self._sc["get_times"]()
        begin.virtual = time.process_time()
        begin.wallclock = time.perf_counter()
        S._Scalene__last_signal_time = begin
        self._t0 = time.perf_counter_ns()
        self._running = True
        self._started = True
        self._pid = os.getpid()
        # A session that is never stopped (the program ends, an exception escapes first) still
        # disarms its timer before the interpreter finalises, where a SIGALRM would find the
        # default action (terminate) and end the process with "Alarm clock".
        atexit.register(self._stop_at_exit)
        handler = S.cpu_signal_handler
        if self._driver == "SIGALRM":
            self._shims = WaitShims(S, max(0.001, min(sys.getswitchinterval(),
                                                        self._interval_s)),
                                     self._should_trace)
            self._shims.install()
            self._last_alarm = time.perf_counter()
            self._prev_handler = signal.signal(signal.SIGALRM, self._make_signal_handler(handler))
            signal.siginterrupt(signal.SIGALRM, False)
            signal.setitimer(signal.ITIMER_REAL, S._sample_cpu_interval())
        else:
            cpu_signal = S._Scalene__signal_manager.get_signals().cpu_signal
            self._thread = threading.Thread(target=self._thread_loop, args=(handler, cpu_signal),
                                            name="linescope-scalene-sampler", daemon=True)
            self._thread.start()

    def _configure(self, S: Any) -> None:
        args = self._sc["ScaleneArguments"](
            cpu=True, gpu=self._opts.gpu, memory=False, stacks=False, async_profile=False,
            json=True, web=False, no_browser=True, cli=False, html=False,
            cpu_sampling_rate=self._interval_s, use_virtual_time=False, profile_all=False,
            program_path=self._opts.roots[0] if self._opts.roots else self._cwd)
        S._process_args(args)
        # Wall-clock sampling: ITIMER_REAL / SIGALRM (the manager defaults to virtual time).
        S._Scalene__signal_manager.get_signals().set_timer_signals(False)
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:
            cpus = os.cpu_count() or 1
        backend = self
        main = threading.main_thread().ident

        cpu_profiler: Any = self._sc["ScaleneCPUProfiler"]

        class LinescopeCpuProfiler(cpu_profiler):  # type: ignore[misc]
            """Scalene's CPU sample processing, plus a note of the GPU reads' outcome for each
            main-thread line a sample is charged to, and of whether a sample found threads
            other than the main one in recorded code (for the late-sample warning)."""

            def process_cpu_sample(self, new_frames: Any, *a: Any, **k: Any) -> None:
                backend._others_recorded = any(tid != main for _f, tid, _o in new_frames)
                super().process_cpu_sample(new_frames, *_wall_weighted(a), **k)

            def _update_main_thread_stats(self, fname: Any, lineno: Any, *a: Any,
                                          **k: Any) -> None:
                super()._update_main_thread_stats(fname, lineno, *a, **k)
                if backend._gpu is not None and backend._accelerator is not None:
                    backend._gpu.charge(str(fname), int(lineno))

        S._Scalene__cpu_profiler = LinescopeCpuProfiler(S._Scalene__stats, cpus, False)
        S._Scalene__tracing = _Tracing(self._should_trace)

    def _make_signal_handler(
            self, handler: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def on_alarm(signum: Any, frame: Any) -> None:
            if not self._running:
                return  # a signal already pending at stop(): do not re-arm the timer
            now = time.perf_counter()
            gap, self._last_alarm = now - self._last_alarm, now
            # Other threads in recorded code at the previous sample, or a thread of the
            # session's that may have run since (and ended while no sample could be taken).
            ran = self._shims is not None and self._shims.threads_may_have_run()
            others_before = self._others_recorded or ran
            try:
                handler(signum, frame)
            except Exception as e:  # noqa: BLE001 - never raise into the profiled program
                self._handler_error = f"{type(e).__name__}: {e}"
                self._running = False
            if gap > self._stall_min_s and (others_before or self._others_recorded):
                self._note_stall(gap, frame)
        return on_alarm

    def _note_stall(self, seconds: float, frame: Any) -> None:
        """Records a sample that came late while other threads ran (see on_alarm), with the
        main thread's line where it came."""
        where = frame
        while where is not None and not self._should_trace(where.f_code.co_filename,
                                                           where.f_code.co_name):
            where = where.f_back
        where = where or frame
        at = (f"{self._path(where.f_code.co_filename)}:{where.f_lineno}" if where is not None
              else "an unknown line")
        self._stalls.append((seconds, at))

    def _thread_loop(self, handler: Callable[[Any, Any], None], cpu_signal: Any) -> None:
        while self._running and not self._stop_event.wait(self._interval_s):
            try:
                handler(cpu_signal, None)
            except Exception as e:  # noqa: BLE001
                self._handler_error = f"{type(e).__name__}: {e}"
                return

    def _stop_at_exit(self) -> None:
        """atexit: a session still running when the interpreter exits. Only the sampling ends
        (timer, handler, shims, GPU collector), as for the other backends no result or report
        is made; in a forked child (which has no timer and does not own the GPU monitor)
        nothing is done."""
        if self._started and not self._stopped and os.getpid() == self._pid:
            self._stop(at_exit=True)

    def stop(self) -> None:
        self._stop(at_exit=False)

    def _stop(self, at_exit: bool) -> None:
        if self._stopped:
            return  # stopped at interpreter exit, before a stop() in an earlier atexit hook
        self._stopped = True
        S = self._sc["Scalene"]
        self._running = False
        if not at_exit:
            atexit.unregister(self._stop_at_exit)
        if self._driver == "SIGALRM":
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._prev_handler)
            signal.setitimer(signal.ITIMER_REAL, 0)
            if self._shims is not None:
                self._shims.uninstall()
        else:
            self._stop_event.set()
            if self._thread is not None:
                self._thread.join()
        self._t1 = time.perf_counter_ns()
        S._Scalene__stats.stop_clock()
        S._Scalene__accelerator = None
        if isinstance(self._accelerator, NeuronCollector):
            self._accelerator.stop_monitor()
        elif self._gpu is not None and self._gpu.kind == "nvidia":
            try:
                import pynvml
                pynvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    # ---- results -------------------------------------------------------------------------
    def _path(self, filename: str) -> str:
        if not filename or filename.startswith(_SYNTHETIC):
            return filename
        return os.path.normpath(os.path.join(self._cwd, filename))

    def result(self) -> RawBackendResult:
        S = self._sc["Scalene"]
        stats = S._Scalene__stats
        cpu = stats.cpu_stats
        gpu_stats = stats.gpu_stats
        gpu = self._gpu
        collection = gpu_collection(gpu) if gpu is not None else None
        time_ok = collection is not None and collection.time_available
        mem_ok = collection is not None and collection.memory_available

        lines: list[RawLine] = []
        split: list[list[Any]] = []
        gpu_wall: list[list[Any]] = []
        total_samples = 0
        # Scalene's per-sample time is an estimate (the sampling interval it drew, or the CPU
        # time beyond it) whose sum over a run need not equal the run: Scalene 2.x draws the
        # next random interval before booking a sample and books that draw, and a max of
        # two independent terms overshoots on average. Scalene itself only reports shares of
        # its sampled total (percentages beside the elapsed time); so does this adapter, in
        # nanoseconds: a line's share of the sampled total times the session's elapsed time.
        elapsed_ns = max(0, self._t1 - self._t0)
        sampled_s = float(getattr(cpu, "total_cpu_samples", 0.0) or 0.0)
        scale = elapsed_ns / (sampled_s * 1e9) if sampled_s > 0 else 1.0
        if self._handler_error:
            scale = min(scale, 1.0)  # sampling stopped early: the total does not span the run
        keys: set[tuple[Any, Any]] = set()
        for table in (cpu.cpu_samples_python, cpu.cpu_samples_c, cpu.cpu_utilization):
            for f, per_line in table.items():
                keys.update((f, ln) for ln in per_line)
        for f, ln in sorted(keys, key=lambda k: (str(k[0]), int(k[1]))):
            py = float(cpu.cpu_samples_python.get(f, {}).get(ln, 0.0))
            native = max(0.0, float(cpu.cpu_samples_c.get(f, {}).get(ln, 0.0)))
            util_stats = cpu.cpu_utilization.get(f, {}).get(ln)
            n = int(util_stats.size()) if util_stats is not None else 0
            util = float(util_stats.mean()) if n else 1.0
            total_s = py + native
            if n == 0 and total_s <= 0.0:
                continue
            total_samples += n
            python_ns = round(py * util * scale * 1e9)
            native_ns = round(native * util * scale * 1e9)
            wall_ns = round(total_s * scale * 1e9)
            system_ns = max(0, wall_ns - python_ns - native_ns)
            filename = self._path(str(f))
            line_gpu = None
            if gpu is not None and gpu.kind is not None:
                v = gpu.lines.get((str(f), int(ln)))
                if v is not None:
                    t = gpu_stats.gpu_samples.get(f, {}).get(ln, 0.0)
                    m = gpu_stats.gpu_mem_samples.get(f, {}).get(ln)
                    w = gpu_stats.n_gpu_samples.get(f, {}).get(ln, 0.0)
                    gpu_wall.append([filename, int(ln), round(float(w) * 1e9)])
                    line_gpu = GPUStats(
                        time_ns=round(float(t) * 1e9) if time_ok and v[0] > 0 else None,
                        peak_memory_bytes=(round(float(m.peak()) * MIB)
                                           if mem_ok and v[2] > 0 and m is not None else None))
            lines.append(RawLine(filename=filename, line=int(ln), wall_time_ns=wall_ns,
                                 hits=None, samples=n, self_time_ns=wall_ns,
                                 cpu_time_ns=python_ns + native_ns, gpu=line_gpu))
            split.append([filename, int(ln), python_ns, native_ns, system_ns])

        warnings: list[str] = []
        if self._handler_error:
            warnings.append(f"Scalene's sampling handler failed and sampling stopped early "
                            f"({self._handler_error}); the lines show the samples taken before")
        if self._stalls:
            longest, at = max(self._stalls)
            warnings.append(
                f"the main thread ran no Python code for {sum(t for t, _ in self._stalls):.2f} s "
                f"in {len(self._stalls)} stretch(es) (the longest {longest:.2f} s, until {at}) "
                "while other threads ran: the scalene backend samples only when "
                "the main thread runs Python code (Python runs its SIGALRM handler there), so "
                "the other threads' work in that time has no samples of its own. During the "
                "session linescope makes the main thread's Thread.join() and Condition waits "
                "(queue.Queue.get(), Event.wait(), Future.result(), ThreadPoolExecutor) wake "
                "up every few ms; other blocking calls (Lock.acquire(), RLock, "
                "SimpleQueue.get(), subprocess and Process waits, long native calls) do not")
        if total_samples == 0:
            warnings.append("Scalene took no samples in recorded code (the session was shorter "
                            "than the sampling interval, or no recorded code ran)")
        if collection is not None:
            for text in gpu_warnings(collection):
                if text not in warnings:
                    warnings.append(text)
        metadata: dict[str, Any] = {
            "scalene_version": self._sc["version"],
            "sampler": ("SIGALRM wall-clock interval timer" if self._driver == "SIGALRM"
                        else "background thread"),
            "mean_sample_interval_s": self._interval_s,
            # Scalene's sampled total (s) and the factor that maps shares of it onto the
            # elapsed time (see result()); GPU time is not scaled (utilization x clock time).
            "sampled_total_s": sampled_s,
            "time_scale": scale,
            "attribution": ("each sample goes to the innermost recorded line of each thread's "
                            "stack, so a line's time excludes recorded callees "
                            "(wall_time_ns == self_time_ns) and includes unrecorded ones"),
            "cpu_split_ns": {"columns": ["filename", "line", "python", "native", "system"],
                             "rows": split},
            "memory": MEMORY_REASON,
        }
        if gpu is not None and gpu.kind is not None:
            # The wall time over which each line's GPU utilization was sampled: GPU time / this
            # is the line's mean utilization.
            metadata["gpu_sampled_wall_ns"] = {"columns": ["filename", "line", "wall"],
                                               "rows": gpu_wall}
        return RawBackendResult(lines=lines, functions=[],
                                elapsed_ns=elapsed_ns, warnings=warnings,
                                metadata=metadata, gpu=collection)


class _Tracing:
    """Stands in for Scalene's ScaleneTracing: which frames count as profiled code."""

    def __init__(self, should_trace: Callable[[str, str], bool]) -> None:
        self.should_trace = should_trace

    def set_args(self, args: Any) -> None:  # called by Scalene._process_args
        pass

    def set_program_path(self, path: Any) -> None:
        pass


register_backend("scalene", ScaleneBackend)
