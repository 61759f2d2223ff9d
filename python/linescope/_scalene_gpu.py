"""GPU collection for the ``scalene`` backend: Scalene's NVIDIA (pynvml) and AWS Neuron
collectors opened for a session, with each read's outcome recorded (a failed read is unknown,
not Scalene's silent 0), and the session's GPUCollection built from what they saw.

The reads run inside the sampling handler on the main thread; ``gpu_collection`` and
``gpu_warnings`` after stop().
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any

from ._model import GPUCollection

APPLE_REASON = (
    "Apple MPS metrics are unavailable: Scalene's per-process MPS timing needs its PyTorch "
    "(torch.profiler) instrumentation, which the in-process adapter does not run")

NVML_LIBRARY_NOTE = (
    "GPUPROF_NVML_LIBRARY is not used by the scalene backend: Scalene's pynvml loads "
    "libnvidia-ml.so.1 from the dynamic loader's search path (LD_LIBRARY_PATH)")

MIB = 1048576  # Scalene reports device memory in MiB (bytes / 1048576)


@dataclass
class GpuState:
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


def _nvidia_collector_class(base: type, pynvml: Any, state: GpuState) -> type:
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

    class LinescopeNvidiaCollector(base):  # type: ignore[misc]
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
            return total / MIB

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
        line: str = self._pipe.readline()
        if not line:
            raise SystemExit
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


class NeuronCollector:
    """Scalene's AWS Neuron collector (``ScaleneNeuron``, reading ``neuron-monitor``) as it is;
    it reports no per-read failures, so every read that returns counts as a success (of both
    the utilization and the memory value), one that raises as a failure of both."""

    def __init__(self, inner: Any, state: GpuState) -> None:
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


def open_gpu(state: GpuState) -> Any:
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
        return NeuronCollector(neuron, state)
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


def _note_nvml_library(pynvml: Any, state: GpuState) -> str:
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


def _check_wddm(pynvml: Any, handles: list[Any], state: GpuState) -> None:
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


def gpu_collection(g: GpuState) -> GPUCollection:
    """The session's GPUCollection (after stop()): what the collector measured, and why
    what it could not measure is unknown."""
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


def gpu_warnings(c: GPUCollection) -> list[str]:
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
