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
  methods replaced, see ``_nvidia_collector_class``).
* The equivalent of Scalene's ``Thread.join`` / lock shims, for the session's lifetime only and
  on the main thread only (``_WaitShims``): a main thread waiting for other threads wakes every
  few milliseconds, so that the handler runs and the other threads are sampled.

A session that is never stopped ends its sampling at interpreter exit (atexit), before the
interpreter resets signal handlers and a pending SIGALRM would terminate the process.

The statistics are read in memory after stop(). Scalene's JSON writer reads the same
accumulators but reports percentages, drops files under 1 % of the time and has no per-line GPU
seconds, so it is not used. Scalene's class-level state is set through its name-mangled
attributes; a Scalene release that renames them fails at start() with a message naming it.
"""

from __future__ import annotations

import atexit
import builtins
import dataclasses
import functools
import math
import os
import shutil
import signal
import sys
import threading
import weakref
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ._backends import BackendOptions, is_utf8, native_cwd, register_backend
from ._model import BackendCapabilities, GPUCollection, GPUStats, RawBackendResult, RawLine
from ._sampling import MAX_SAMPLE_RATE

INSTALL_HINT = "install it with: pip install 'gpuprof[scalene]' (Python 3.11-3.14)"

MEMORY_REASON = (
    "Scalene measures memory through its allocator library, which must be preloaded when the "
    "process starts (LD_PRELOAD / DYLD_INSERT_LIBRARIES, done by the `scalene` command); an "
    "in-process linescope session starts later, so Scalene's memory columns are not collected")

APPLE_REASON = (
    "Apple MPS metrics are unavailable: Scalene's per-process MPS timing needs its PyTorch "
    "(torch.profiler) instrumentation, which the in-process adapter does not run")

NVML_LIBRARY_NOTE = (
    "GPUPROF_NVML_LIBRARY is not used by the scalene backend: Scalene's pynvml loads "
    "libnvidia-ml.so.1 from the dynamic loader's search path (LD_LIBRARY_PATH)")

_MIB = 1048576  # Scalene reports device memory in MiB (bytes / 1048576)
_DEFAULT_INTERVAL_S = 0.01  # Scalene's default mean sampling interval (100 samples/s)

_SYNTHETIC = "<"


def _load_scalene() -> dict[str, Any]:
    """Imports the parts of Scalene the adapter uses. Importing Scalene sets LC_ALL=POSIX in
    os.environ and installs ``builtins.profile``; both are undone here, so that importing the
    backend changes nothing in the profiled program."""
    missing = object()
    saved_lc_all = os.environ.get("LC_ALL")
    saved_profile = builtins.__dict__.get("profile", missing)
    try:
        from scalene import scalene_profiler
        from scalene.scalene_arguments import ScaleneArguments
        from scalene.scalene_cpu_profiler import ScaleneCPUProfiler
        from scalene.scalene_utility import clear_intern_caches
        from scalene.time_info import TimeInfo, get_times
        import scalene
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
    try:
        from importlib.metadata import version
        scalene_version = version("scalene")
    except Exception:  # noqa: BLE001 - metadata is informational
        scalene_version = "unknown"
    return dict(Scalene=scalene_profiler.Scalene, ScaleneArguments=ScaleneArguments,
                ScaleneCPUProfiler=ScaleneCPUProfiler, TimeInfo=TimeInfo, get_times=get_times,
                clear_intern_caches=clear_intern_caches, version=scalene_version,
                package_dir=os.path.dirname(os.path.abspath(scalene.__file__)))


# ---- GPU collection ------------------------------------------------------------------------

@dataclass
class _GpuState:
    """What the GPU collector saw. The reads run inside the sampling handler on the main
    thread; result() reads after stop(). ``last_*_ok`` describe the most recent read, which
    the CPU-sample hook charges to the line that sample lands on."""

    kind: str | None = None  # "nvidia" | "neuron" | None (no collector)
    method: str | None = None
    devices: list[str] = field(default_factory=list)
    scope: str | None = None
    unavailable: str | None = None  # why no collector runs
    diagnostics: list[str] = field(default_factory=list)
    memory_unavailable: str | None = None  # a collector-level reason (e.g. WDDM)
    last_util_ok: bool = True
    last_mem_ok: bool = True
    util_ok: int = 0
    util_failed: int = 0
    util_error: str | None = None
    mem_ok: int = 0
    mem_failed: int = 0
    mem_error: str | None = None
    mem_not_available: int = 0
    # (filename, line) -> [util ok, util failed, memory ok, memory failed] over the samples
    # that Scalene charged to the line (main thread only: Scalene attributes GPU there).
    lines: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def charge(self, filename: str, line: int) -> None:
        v = self.lines.get((filename, line))
        if v is None:
            v = self.lines[(filename, line)] = [0, 0, 0, 0]
        v[0 if self.last_util_ok else 1] += 1
        v[2 if self.last_mem_ok else 3] += 1


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


def _nvidia_collector_class(base: type, pynvml: Any, state: _GpuState) -> type:
    """Scalene's NVIDIA collector (``ScaleneNVIDIAGPU``: NVML handles, the utilization and
    per-process memory reads, ``get_stats``) with three methods replaced:

    * ``_set_accounting_mode`` only reads the accounting mode. Scalene switches persistence and
      accounting mode on for every GPU when it has the permission to; a profiling session
      inside someone's program leaves the device settings as they are.
    * ``gpu_utilization`` / ``gpu_memory_usage`` make the same NVML reads but record each
      read's outcome, so that a failed read is unknown rather than Scalene's silent 0.
    * ``__del__`` prints nothing (Scalene prints an accuracy note to stderr; linescope records
      it as a diagnostic).
    """
    not_found = getattr(pynvml, "NVML_ERROR_NOT_FOUND", 6)

    class LinescopeNvidiaCollector(base):  # type: ignore[misc, valid-type]
        def _handles(self) -> list[Any]:
            return list(getattr(self, "_ScaleneNVIDIAGPU__handle", []))

        def _set_accounting_mode(self) -> bool:
            try:
                return all(pynvml.nvmlDeviceGetAccountingMode(h) == pynvml.NVML_FEATURE_ENABLED
                           for h in self._handles())
            except pynvml.NVMLError as e:
                state.diagnostics.append(f"NVML accounting mode could not be read ({e})")
                return False

        def gpu_utilization(self, pid: int) -> float:
            if not self.has_gpu():
                return 0.0
            handles = self._handles()
            per_process = bool(getattr(self, "_ScaleneNVIDIAGPU__has_per_pid_accounting", False))
            total = 0.0
            try:
                for h in handles:
                    if per_process:
                        try:
                            total += pynvml.nvmlDeviceGetAccountingStats(h, pid).gpuUtilization
                        except pynvml.NVMLError as e:
                            if getattr(e, "value", None) != not_found:
                                raise
                            # Not found: this process has not used that GPU (0 %).
                    else:
                        total += pynvml.nvmlDeviceGetUtilizationRates(h).gpu
            except pynvml.NVMLError as e:
                state.last_util_ok = False
                state.util_failed += 1
                state.util_error = str(e)
                return 0.0
            state.last_util_ok = True
            state.util_ok += 1
            return min(max(total / max(len(handles), 1) / 100.0, 0.0), 1.0)

        def gpu_memory_usage(self, pid: int) -> float:
            if not self.has_gpu():
                return 0.0
            total = 0
            not_available = False
            try:
                for h in self._handles():
                    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                        if proc.pid != pid:
                            continue
                        if proc.usedGpuMemory is None:  # NVML_VALUE_NOT_AVAILABLE
                            not_available = True
                        else:
                            total += int(proc.usedGpuMemory)
            except pynvml.NVMLError as e:
                state.last_mem_ok = False
                state.mem_failed += 1
                state.mem_error = str(e)
                return 0.0
            if not_available:
                state.last_mem_ok = False
                state.mem_not_available += 1
                return 0.0
            state.last_mem_ok = True
            state.mem_ok += 1
            return total / _MIB

        def __del__(self) -> None:
            pass

    return LinescopeNvidiaCollector


class _EndAtEof:
    """Stands in for the stdout pipe of Scalene's neuron-monitor process, read by Scalene's
    reader thread (``NeuronMonitor._update_line``), which loops on ``readline()`` for ever: at
    end of file (neuron-monitor stopped or died) it would spin at 100% of a core for the rest of
    the process. Here end of file ends the thread instead (SystemExit ends a thread quietly)."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe

    def readline(self) -> str:
        line = self._pipe.readline()
        if not line:
            raise SystemExit
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


class _NeuronCollector:
    """Scalene's AWS Neuron collector (``ScaleneNeuron``, reading ``neuron-monitor``) as it is;
    it reports no per-read failures, so every read that returns counts as a success (of both
    the utilization and the memory value), one that raises as a failure of both."""

    def __init__(self, inner: Any, state: _GpuState) -> None:
        self._inner = inner
        self._state = state

    def has_gpu(self) -> bool:
        return bool(self._inner.has_gpu())

    def gpu_device(self) -> str:
        return str(self._inner.gpu_device())

    def reinit(self) -> None:
        self._inner.reinit()

    def get_num_cores(self) -> int:
        return int(self._inner.get_num_cores())

    def get_stats(self) -> tuple[float, float]:
        state = self._state
        try:
            util, mem = self._inner.get_stats()
        except Exception as e:  # noqa: BLE001 - a failed read is unknown, not 0
            state.last_util_ok = state.last_mem_ok = False
            state.util_failed += 1
            state.mem_failed += 1
            state.util_error = state.mem_error = f"{type(e).__name__}: {e}"
            return 0.0, 0.0
        state.last_util_ok = state.last_mem_ok = True
        state.util_ok += 1
        state.mem_ok += 1
        return util, mem

    def start_monitor(self) -> None:
        # Checked first: Scalene's monitor object, failing to spawn it, also fails in __del__.
        if shutil.which("neuron-monitor") is None:
            raise FileNotFoundError("neuron-monitor is not on PATH (install aws-neuronx-tools)")
        self._inner.start_monitor()
        # Scalene's reader thread looks the pipe up on every line: from the next one on, end of
        # file ends the thread rather than spinning it (see _EndAtEof).
        monitor = getattr(self._inner, "_neuron_monitor", None)
        process = getattr(monitor, "_process", None)
        if process is not None and process.stdout is not None:
            process.stdout = _EndAtEof(process.stdout)

    def stop_monitor(self) -> None:
        monitor = getattr(self._inner, "_neuron_monitor", None)
        process = getattr(monitor, "_process", None)
        if process is not None:
            try:
                process.terminate()
            except OSError:
                pass


def _open_gpu(state: _GpuState) -> Any:
    """Opens Scalene's collector for this machine; returns the accelerator object for Scalene
    or None (then ``state.unavailable`` says why)."""
    if sys.platform == "darwin":
        state.unavailable = APPLE_REASON
        return None
    reasons = []
    try:
        import pynvml
        from scalene.scalene_nvidia_gpu import ScaleneNVIDIAGPU
    except ImportError as e:
        reasons.append(f"NVIDIA: Scalene's NVML collector could not be imported ({e})")
    else:
        collector = _nvidia_collector_class(ScaleneNVIDIAGPU, pynvml, state)()
        if collector.has_gpu():
            _note_nvml_library(pynvml, state)
            handles = collector._handles()
            for h in handles:
                try:
                    state.devices.append(str(pynvml.nvmlDeviceGetName(h)))
                except pynvml.NVMLError:
                    state.devices.append("NVIDIA GPU (name unavailable)")
            per_process = bool(getattr(collector, "_ScaleneNVIDIAGPU__has_per_pid_accounting",
                                       False))
            state.kind = "nvidia"
            state.method = "scalene-nvml"
            state.scope = "process" if per_process else "device"
            state.diagnostics.append(
                f"GPU time is Scalene's estimate: NVML utilization (averaged over "
                f"{len(handles)} GPU(s)) x wall time between CPU samples, charged to the main "
                "thread's current line; GPU peak memory is the highest per-process device "
                "memory sample (NVML compute-process list) taken while the line ran")
            if not per_process:
                state.diagnostics.append(
                    "NVIDIA utilization is device-wide because per-process accounting mode is "
                    "off, so attributed GPU time can include other processes' work on the same "
                    "GPUs (device memory samples are this process's own). Accounting mode can "
                    "be switched on by an administrator: nvidia-smi -am 1")
            if sys.platform == "win32":
                _check_wddm(pynvml, handles, state)
            return collector
        reason = _nvml_reason(pynvml)
        hint = _note_nvml_library(pynvml, state)
        reasons.append(f"NVIDIA: {reason}{'; ' + hint if hint else ''}")
    try:
        from scalene.scalene_neuron import ScaleneNeuron
        neuron = ScaleneNeuron()
        has_neuron = neuron.has_gpu()
    except Exception as e:  # noqa: BLE001 - the probe runs neuron-ls; any failure = no device
        has_neuron = False
        reasons.append(f"AWS Neuron: the probe failed ({e})")
    else:
        if not has_neuron:
            reasons.append("AWS Neuron: no device (neuron-ls is not installed or lists none)")
    if has_neuron:
        state.kind = "neuron"
        state.method = "scalene-neuron-monitor"
        state.devices.append("AWS Neuron")
        state.scope = "device"
        state.diagnostics.append(
            "AWS Neuron utilization and memory come from neuron-monitor for every Neuron "
            "runtime on the host (device-wide, can include other processes); GPU time is "
            "utilization x wall time between CPU samples, charged to the main thread's line")
        return _NeuronCollector(neuron, state)
    state.unavailable = "no supported GPU was found (" + "; ".join(reasons) + ")"
    return None


def _nvml_library_file(pynvml: Any) -> tuple[bool, str | None]:
    """Whether pynvml has loaded an NVML library, and which file (None: not known)."""
    lib = getattr(pynvml, "nvmlLib", None)
    if lib is None:
        return False, None
    if sys.platform == "win32":
        return True, getattr(lib, "_name", None)  # pynvml loads nvml.dll by full path
    try:
        import ctypes

        class LinkMap(ctypes.Structure):  # the head of glibc's struct link_map
            _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]

        dlinfo = ctypes.CDLL(None).dlinfo
        dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        dlinfo.restype = ctypes.c_int
        link_map = ctypes.POINTER(LinkMap)()
        rtld_di_linkmap = 2
        if dlinfo(lib._handle, rtld_di_linkmap, ctypes.byref(link_map)) == 0 and link_map:
            name = link_map.contents.l_name
            if name:
                return True, os.path.abspath(os.fsdecode(name))
    except Exception:  # noqa: BLE001 - no dlinfo (not glibc): the file stays unknown
        pass
    return True, None


def _note_nvml_library(pynvml: Any, state: _GpuState) -> str:
    """With GPUPROF_NVML_LIBRARY set: a diagnostic saying that the scalene backend does not use
    it and which library pynvml loaded instead; returns the hint for a "no GPU" reason when the
    setting could explain it (pynvml loaded no library, or another file than the one named),
    else ""."""
    wanted = os.environ.get("GPUPROF_NVML_LIBRARY")
    if not wanted:
        return ""
    loaded, path = _nvml_library_file(pynvml)
    if not loaded:
        state.diagnostics.append(NVML_LIBRARY_NOTE)
        return ("GPUPROF_NVML_LIBRARY does not apply to Scalene's pynvml, which searches "
                "LD_LIBRARY_PATH")
    if path is None:
        state.diagnostics.append(NVML_LIBRARY_NOTE)
        return ""
    try:
        same = os.path.samefile(wanted, path)
    except OSError:
        same = False
    if same:
        state.diagnostics.append(
            f"{NVML_LIBRARY_NOTE}; that search found the same file ({path})")
        return ""
    state.diagnostics.append(
        f"GPUPROF_NVML_LIBRARY ({wanted}) is not used by the scalene backend: Scalene's pynvml "
        f"loaded {path} from the dynamic loader's search path (LD_LIBRARY_PATH)")
    return (f"GPUPROF_NVML_LIBRARY does not apply to Scalene's pynvml, which loaded {path} "
            "from the loader's search path (LD_LIBRARY_PATH)")


def _nvml_reason(pynvml: Any) -> str:
    """Why Scalene's NVIDIA collector found no usable GPU, asked of NVML directly."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        loaded, path = _nvml_library_file(pynvml)
        if loaded and path:
            return f"NVML ({path}) could not be initialised ({e})"
        return f"NVML could not be initialised ({e})"
    except Exception as e:  # noqa: BLE001 - e.g. a library without the init entry point
        return f"NVML could not be initialised ({type(e).__name__}: {e})"
    try:
        n = pynvml.nvmlDeviceGetCount()
        if n == 0:
            return "NVML reports no NVIDIA GPU"
        return f"Scalene's NVML collector could not read the {n} GPU(s)"
    except pynvml.NVMLError as e:
        return f"NVML could not count the GPUs ({e})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _check_wddm(pynvml: Any, handles: list[Any], state: _GpuState) -> None:
    """Windows: under the WDDM driver model NVML has no per-process device memory."""
    wddm = getattr(pynvml, "NVML_DRIVER_WDDM", 0)
    for h in handles:
        try:
            current, _pending = pynvml.nvmlDeviceGetDriverModel(h)
        except Exception:  # noqa: BLE001 - not all drivers answer
            continue
        if current == wddm:
            state.memory_unavailable = (
                "the NVIDIA driver runs in WDDM mode, where NVML does not expose per-process "
                "device memory; GPU time sampling continues")
            return


# ---- blocking waits on the main thread -------------------------------------------------------

class _PollingWaiter:
    """The lock a ``threading.Condition.wait`` on the main thread waits on, during a session:
    a blocking acquire waits in slices (see ``_WaitShims``). The waiter stays in the
    condition's waiter list for the whole wait, so a notify() is never missed."""

    __slots__ = ("_lock", "_shims")

    def __init__(self, lock: Any, shims: "_WaitShims") -> None:
        self._lock = lock
        self._shims = shims

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking or (timeout < 0 and timeout != -1) or not self._shims.here():
            return self._lock.acquire(blocking, timeout)
        return self._shims.wait(lambda step: self._lock.acquire(True, step),
                                None if timeout == -1 else timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def _at_fork_reinit(self) -> None:
        self._lock._at_fork_reinit()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


class _WaitShims:
    """Makes the main thread's blocking waits wake up every ``slice_s`` while a session runs.

    Python runs the SIGALRM handler only on the main thread, between bytecodes. A main thread
    blocked on a lock sleeps in a futex wait, which the kernel resumes after the C-level
    handler (the handler is installed with SA_RESTART, as Scalene does, so that native code is
    not handed EINTR), so it would take no sample until the wait ends and the other threads'
    lines would get none. (time.sleep and select / poll waits return EINTR even so, and Python
    runs the handler there.) Scalene's launcher installs shims for this for good
    (``scalene/replacement_thread_join.py``, ``replacement_lock.py``); an in-process session
    installs the equivalent for its lifetime, on the main thread only:

    * ``threading.Thread.join`` (also ``ThreadPoolExecutor.shutdown``, the ``with`` block's
      end) joins in slices;
    * the waiter lock of ``threading.Condition.wait`` (``threading._allocate_lock`` called from
      it): ``queue.Queue.get``, ``Event.wait``, ``Future.result``, ``concurrent.futures.wait``,
      ``Semaphore`` and ``Barrier`` waits.

    During a join or a condition wait Scalene's "sleeping" flag is set for the main thread, as
    Scalene's shims do, so such samples go to the other threads' lines, not to the waiting
    line; not when the main thread has no recorded frame (Scalene then takes the first
    recorded thread for the main one, and would drop its samples as sleeping).

    ``uninstall()`` puts back every original that is still the installed shim (one that
    someone replaced meanwhile stays theirs; ours then passes straight through)."""

    def __init__(self, scalene: Any, slice_s: float,
                 recorded: Callable[[str, str], bool]) -> None:
        self._S = scalene
        self._slice = slice_s
        self._recorded = recorded
        self._main = threading.main_thread().ident
        self._pid = os.getpid()
        self._active = False
        self._installed: list[tuple[Any, str, Any, Any]] = []
        # Threads started (Thread.start) during the session, since the previous
        # threads_may_have_run(), and whether one of them was running at that call.
        self._threads: list[weakref.ref[threading.Thread]] = []
        self._started_since = self._alive_then = False

    def threads_may_have_run(self) -> bool:
        """Whether a thread started during the session may have run since the previous call
        (for the late-sample warning): one was running then, or one has been started since.
        Threads from before the session (an IDE's, a pool's idle ones) do not count."""
        ran = self._alive_then or self._started_since
        self._threads = [r for r in self._threads if (t := r()) is not None and t.is_alive()]
        self._started_since, self._alive_then = False, bool(self._threads)
        return ran

    def here(self) -> bool:
        """True on the main thread of the process that started the session, while it runs."""
        return (self._active and threading.get_ident() == self._main
                and os.getpid() == self._pid)

    def wait(self, attempt: Callable[[float], bool], timeout: float | None) -> bool:
        """Calls attempt(step) with steps of at most the slice until it returns True (True) or
        `timeout` seconds have passed (False); None waits without end."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        tid = threading.get_ident()
        f: Any = sys._getframe(1)
        while f is not None and not self._recorded(f.f_code.co_filename, f.f_code.co_name):
            f = f.f_back
        sleeping = f is not None
        while True:
            step = (self._slice if deadline is None
                    else min(self._slice, max(deadline - time.monotonic(), 0.0)))
            if sleeping:
                self._S.set_thread_sleeping(tid)
            try:
                if attempt(step):
                    return True
            finally:
                if sleeping:
                    self._S.reset_thread_sleeping(tid)
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def install(self) -> None:
        shims = self
        orig_join = threading.Thread.join
        orig_allocate = threading._allocate_lock  # type: ignore[attr-defined]
        wait_code = threading.Condition.wait.__code__

        @functools.wraps(orig_join)
        def join(thread: threading.Thread, timeout: float | None = None) -> None:
            if not shims.here():
                return orig_join(thread, timeout)

            def attempt(step: float) -> bool:
                orig_join(thread, step)  # raises as join() does (not started, current thread)
                return not thread.is_alive()

            shims.wait(attempt, timeout)
            return None

        @functools.wraps(orig_allocate)
        def allocate_lock() -> Any:
            lock = orig_allocate()
            if shims.here() and sys._getframe(1).f_code is wait_code:
                return _PollingWaiter(lock, shims)
            return lock

        orig_start = threading.Thread.start

        @functools.wraps(orig_start)
        def start(thread: threading.Thread) -> None:
            shims._threads.append(weakref.ref(thread))  # see threads_may_have_run()
            shims._started_since = True
            try:
                return orig_start(thread)
            finally:
                # A sample taken while start() waited saw the thread not yet alive.
                shims._started_since = True

        self._installed = [(threading.Thread, "join", orig_join, join),
                           (threading, "_allocate_lock", orig_allocate, allocate_lock),
                           (threading.Thread, "start", orig_start, start)]
        for owner, name, _orig, shim in self._installed:
            setattr(owner, name, shim)
        self._active = True

    def uninstall(self) -> None:
        self._active = False
        for owner, name, orig, shim in self._installed:
            if getattr(owner, name, None) is shim:
                setattr(owner, name, orig)
        self._installed = []
        self._S._Scalene__is_thread_sleeping.pop(self._main, None)


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
        exclude = list(options.exclude) + [self._sc["package_dir"] + "/*"]
        # A LineTracer that never starts is the native path filter (lines::PathFilter): the
        # same recorded-file rule as the `trace` backend.
        self._filter = _native.LineTracer(list(options.roots), list(options.include), exclude,
                                          native_cwd())
        self._decided: dict[str, bool] = {}
        self._interval_s = (1.0 / options.sample_rate if options.sample_rate
                            else _DEFAULT_INTERVAL_S)
        self._gpu: _GpuState | None = None
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
        self._shims: _WaitShims | None = None
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
            self._gpu = _GpuState()
            self._accelerator = _open_gpu(self._gpu)
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
            self._shims = _WaitShims(S, max(0.001, min(sys.getswitchinterval(),
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
            cpus = len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
        except AttributeError:
            cpus = os.cpu_count() or 1
        backend = self
        main = threading.main_thread().ident

        class LinescopeCpuProfiler(self._sc["ScaleneCPUProfiler"]):  # type: ignore[misc]
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

    def _make_signal_handler(self, handler: Callable[[Any, Any], None]) -> Callable:
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
        if isinstance(self._accelerator, _NeuronCollector):
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
        collection = self._gpu_collection() if gpu is not None else None
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
                        peak_memory_bytes=(round(float(m.peak()) * _MIB)
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
            for text in _gpu_warnings(collection):
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

    def _gpu_collection(self) -> GPUCollection:
        g = self._gpu
        assert g is not None
        if g.kind is None:
            reason = g.unavailable or "no GPU collector could be started"
            return GPUCollection(method=None, time_available=False, memory_available=False,
                                 time_reason=reason, memory_reason=reason, devices=[],
                                 utilization_scope=None, diagnostics=list(g.diagnostics))
        diagnostics = list(g.diagnostics)
        sampled = sum(v[0] + v[1] for v in g.lines.values())
        time_reason = memory_reason = None
        time_available = g.util_ok > 0 and any(v[0] for v in g.lines.values())
        if not time_available:
            time_reason = (f"every GPU utilization read failed ({g.util_error})"
                           if g.util_failed else
                           "no CPU sample landed on a recorded main-thread line, so no GPU "
                           "sample was attributed")
        elif g.util_failed:
            diagnostics.append(f"GPU utilization reads failed in {g.util_failed} of "
                               f"{g.util_failed + g.util_ok} samples ({g.util_error}); lines "
                               "whose samples all failed have no GPU time")
        memory_available = (g.memory_unavailable is None and g.mem_ok > 0
                            and any(v[2] for v in g.lines.values()))
        if g.memory_unavailable is not None:
            memory_reason = g.memory_unavailable
        elif not memory_available:
            if g.mem_not_available and not g.mem_ok:
                memory_reason = (
                    "NVML does not report this process's device memory (usedGpuMemory not "
                    "available, as under the Windows WDDM driver model); GPU time sampling "
                    "continues")
            elif g.mem_failed and not g.mem_ok:
                memory_reason = f"every GPU memory read failed ({g.mem_error})"
            elif sampled == 0:
                memory_reason = ("no CPU sample landed on a recorded main-thread line, so no "
                                 "GPU memory sample was attributed")
            else:
                memory_reason = "no GPU memory read succeeded"
        if memory_available and (g.mem_failed or g.mem_not_available):
            bad = g.mem_failed + g.mem_not_available
            why = g.mem_error if g.mem_failed else "per-process memory not available"
            diagnostics.append(f"GPU memory reads failed in {bad} of {bad + g.mem_ok} samples "
                               f"({why}); lines whose samples all failed have no GPU peak "
                               "memory")
        return GPUCollection(method=g.method, time_available=time_available,
                             memory_available=memory_available, time_reason=time_reason,
                             memory_reason=memory_reason, devices=list(g.devices),
                             utilization_scope=g.scope, diagnostics=diagnostics)


def _gpu_warnings(c: GPUCollection) -> list[str]:
    out = []
    if c.method is None:
        out.append(f"GPU measurements are unavailable: {c.time_reason}; CPU profiling "
                   "continues (scalene backend)")
        return out
    if not c.time_available:
        out.append(f"GPU time is unavailable: {c.time_reason} (scalene backend)")
    if not c.memory_available:
        out.append(f"GPU peak memory is unavailable: {c.memory_reason} (scalene backend)")
    out.extend(d for d in c.diagnostics if "failed in" in d)
    if c.time_available and c.utilization_scope == "device":
        from gpuprof import _native  # the text the sampler's native summary says too

        out.append(_native.DEVICE_WIDE_GPU_WARNING)
    return out


class _Tracing:
    """Stands in for Scalene's ScaleneTracing: which frames count as profiled code."""

    def __init__(self, should_trace: Callable[[str, str], bool]) -> None:
        self.should_trace = should_trace

    def set_args(self, args: Any) -> None:  # called by Scalene._process_args
        pass

    def set_program_path(self, path: Any) -> None:
        pass


register_backend("scalene", ScaleneBackend)
