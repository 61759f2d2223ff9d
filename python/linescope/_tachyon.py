"""The ``tachyon`` backend: CPython 3.15's sampling profiler (``profiling.sampling``, named
Tachyon), driven from inside the profiled process.

Tachyon samples a process from outside by reading its memory. Its documented interface is
the command line, so start() launches ``python -m profiling.sampling attach <this pid>`` with
the pstats output (a marshal file whose keys are ``(filename, executing line, function)``
with direct and cumulative sample counts), and stop() interrupts it with SIGINT, the way a
user ends an attached session; it then writes the file, which result() reads.

On Linux with Yama ``ptrace_scope=1`` a process may only be read by its ancestors, and the
sampler is our child, so this process names the sampler as its allowed tracer
(``prctl(PR_SET_PTRACER, pid)``) before letting it attach: the sampler waits on its stdin
until then.

Untested in this repository: no Python 3.15 is available here. Only the error paths (Python
older than 3.15, ``gpu=True``) are exercised by the tests.
"""

from __future__ import annotations

import marshal
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from ._backends import BackendOptions, is_utf8, native_cwd, register_backend
from ._model import BackendCapabilities, RawBackendResult, RawLine

REQUIRED = (3, 15)
_DEFAULT_RATE = 10_000.0  # samples/s: Tachyon's default interval of 100 us
_DURATION_S = 10 ** 7  # Tachyon stops after -d seconds (default 10); stop() ends it earlier
_PR_SET_PTRACER = 0x59616D61  # "Yama"

# Runs in the sampler process: waits until the target allowed it to attach, then runs the
# documented CLI with the remaining arguments.
_GATE = ("import runpy, sys; sys.stdin.buffer.read(1); "
         "sys.argv = ['profiling.sampling', *sys.argv[1:]]; "
         "runpy.run_module('profiling.sampling', run_name='__main__', alter_sys=True)")


def version_error() -> str | None:
    """The error text when this interpreter cannot run the backend, else None."""
    if sys.version_info < REQUIRED:
        return (f"the 'tachyon' backend needs Python {REQUIRED[0]}.{REQUIRED[1]}+ "
                f"(profiling.sampling); this is Python {platform.python_version()}")
    return None


class TachyonBackend:
    """Sampled per-line wall time from Tachyon: a line's time is its samples on the stack
    (inclusive of callees) times the sampling interval. No hit counts, memory or GPU."""

    capabilities = BackendCapabilities(line_time=True, hit_counts=False, function_stats=False,
                                       memory=False, sampled=True, gpu=False,
                                       threads="all threads (sampled from another process)")

    def __init__(self, options: BackendOptions) -> None:
        from gpuprof import _native

        self._opts = options
        self._cwd = os.getcwd()
        self._filter = _native.LineTracer(list(options.roots), list(options.include),
                                          list(options.exclude), native_cwd())
        rate = options.sample_rate or _DEFAULT_RATE
        self._interval_us = max(1, round(1e6 / rate))
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._t0 = self._t1 = 0
        self._warnings: list[str] = []

    def start(self) -> None:
        err = version_error()
        if err is not None:
            raise RuntimeError(err)
        import importlib.util
        if importlib.util.find_spec("profiling.sampling") is None:
            raise RuntimeError("the 'tachyon' backend needs the profiling.sampling module, "
                               "which this Python 3.15 build does not have")
        self._dir = tempfile.mkdtemp(prefix="linescope-tachyon-")
        out = os.path.join(self._dir, "profile.pstats")
        cmd = [sys.executable, "-c", _GATE, "attach", "-i", str(self._interval_us),
               "-d", str(_DURATION_S), "-a", "--pstats", "-o", out, str(os.getpid())]
        with open(os.path.join(self._dir, "sampler.log"), "wb") as log:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log,
                                          stderr=subprocess.STDOUT)
        _allow_tracer(self._proc.pid)
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(b"g")
            self._proc.stdin.close()
        except OSError:  # the sampler already exited; stop() reports its output
            pass
        self._t0 = time.perf_counter_ns()

    def stop(self) -> None:
        self._t1 = time.perf_counter_ns()
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self._warnings.append("the Tachyon sampler did not finish within 60 s of "
                                      "SIGINT and was killed")
        if proc.returncode not in (0, None):
            self._warnings.append(f"the Tachyon sampler exited with status {proc.returncode}: "
                                  f"{self._log_tail()}")
        _allow_tracer(0)  # back to the default (only ancestors may read this process)

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self._dir or "", "sampler.log"), "rb") as f:
                text = f.read().decode("utf-8", "replace").strip()
        except OSError:
            return "(no output)"
        return text[-500:] or "(no output)"

    def result(self) -> RawBackendResult:
        lines: list[RawLine] = []
        stats = self._load()
        per_line: dict[tuple[str, int], list[float]] = {}
        for key, value in stats.items():
            if not (isinstance(key, tuple) and len(key) == 3 and isinstance(value, tuple)
                    and len(value) >= 4):
                continue  # e.g. the ("__sampled__",) marker
            filename, line, _func = key
            if not isinstance(filename, str) or not isinstance(line, int) or line <= 0:
                continue  # synthetic frames (<GC>, <native>) have line 0
            if not is_utf8(filename) or not self._filter.recorded(filename):
                continue
            path = filename if filename.startswith("<") else os.path.normpath(
                os.path.join(self._cwd, filename))
            acc = per_line.setdefault((path, line), [0, 0.0])
            acc[0] += int(value[1])  # cumulative samples: the line was on the stack
            acc[1] += float(value[3])  # cumtime: Tachyon's estimate, samples x interval
        for (path, line), (samples, seconds) in sorted(per_line.items()):
            lines.append(RawLine(filename=path, line=line, wall_time_ns=round(seconds * 1e9),
                                 hits=None, samples=int(samples)))
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        return RawBackendResult(
            lines=lines, functions=[], elapsed_ns=max(0, self._t1 - self._t0),
            warnings=list(self._warnings),
            metadata={"sampler": "profiling.sampling attach (Tachyon)",
                      "sample_interval_us": self._interval_us,
                      "attribution": "samples with the line anywhere on the stack (inclusive)"})

    def _load(self) -> dict[Any, Any]:
        path = os.path.join(self._dir or "", "profile.pstats")
        try:
            with open(path, "rb") as f:
                data = marshal.load(f)
        except FileNotFoundError:
            self._warnings.append("the Tachyon sampler wrote no profile (the session ended "
                                  f"before it attached?): {self._log_tail()}")
            return {}
        except (OSError, ValueError, EOFError, TypeError) as e:
            self._warnings.append(f"the Tachyon profile could not be read ({e})")
            return {}
        return data if isinstance(data, dict) else {}


def _allow_tracer(pid: int) -> None:
    """Linux/Yama: lets process ``pid`` read this process's memory (0 restores the default:
    ancestors only). Does nothing elsewhere or without Yama."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)
    except (OSError, AttributeError):
        pass


register_backend("tachyon", TachyonBackend)
