"""linescope: the source-line profiler of gpuprof.

    from linescope import profile
    with profile() as session:
        work()
    session.result.lines  # LineStats per executed line
"""

from __future__ import annotations

from ._backends import BackendOptions, ProfilerBackend, backend_names, register_backend
from . import _scalene, _tachyon  # noqa: F401  (registers the 'scalene' and 'tachyon' backends)
from ._model import (BackendCapabilities, FunctionStats, GPUCollection, GPUStats, LineStats,
                     MemoryProfile, ProfileResult, ProfileRun, RawBackendResult, RawFunction,
                     RawLine, Symbol)
from ._session import profile

from gpuprof import __version__  # one version: the gpuprof distribution's


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext linescope``: registers the ``%%linescope`` and ``%%profile`` cell magics."""
    from ._magic import load_ipython_extension as load

    load(ipython)


__all__ = [
    "BackendCapabilities", "BackendOptions", "FunctionStats", "GPUCollection", "GPUStats",
    "LineStats", "MemoryProfile",
    "ProfileResult", "ProfileRun", "ProfilerBackend", "RawBackendResult", "RawFunction",
    "RawLine", "Symbol", "backend_names", "profile", "register_backend", "__version__",
]
