"""linescope: the source-line profiler of gpuprof.

    from linescope import profile
    with profile() as session:
        work()
    session.result.lines  # LineStats per executed line

Code written for LineScope 0.1.0 runs unchanged: ``profiler`` (the same object as
``profile``), ``Session``, ``Config``, ``ProfileController``, the enums, ``result.root_run``
(docs/linescope.md, "Coming from LineScope").
"""

from __future__ import annotations

from ._backends import BackendOptions, ProfilerBackend, backend_names, register_backend
from . import _scalene, _tachyon  # noqa: F401  (registers the 'scalene' and 'tachyon' backends)
from ._model import (BackendCapabilities, FunctionStats, GPUCollection, GPUStats, LineStats,
                     MemoryProfile, ProfileResult, ProfileRun, RawBackendResult, RawFunction,
                     RawLine, RunStatus, SessionState, SourceLocation, SourceUnit, Symbol)
from ._spark_model import (SparkCollection, SparkExecution, SparkExecutionStats, SparkJob,
                           SparkLocation, SparkMetric, SparkOperator, SparkPlans, SparkStage)
from ._session import profile
from ._compat import (Backend, Config, DisplayMode, ProfileController, Session, SourceKind,
                      SymbolKind)

from gpuprof import __version__  # one version: the gpuprof distribution's

profiler = profile  # LineScope's second name of the module-level controller


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext linescope``: nothing to undo (the magics stay registered, as IPython
    keeps them); accepted so that LineScope notebooks that call it run."""


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext linescope``: registers the ``%%linescope`` and ``%%profile`` cell magics."""
    from ._magic import load_ipython_extension as load

    load(ipython)


__all__ = [
    "Backend", "BackendCapabilities", "BackendOptions", "Config", "DisplayMode",
    "FunctionStats", "GPUCollection", "GPUStats", "LineStats", "MemoryProfile",
    "ProfileController", "ProfileResult", "ProfileRun", "ProfilerBackend", "RawBackendResult",
    "RawFunction", "RawLine", "RunStatus", "Session", "SessionState", "SourceKind",
    "SourceLocation", "SourceUnit", "Symbol", "SymbolKind", "backend_names",
    "load_ipython_extension", "profile", "profiler", "register_backend",
    "unload_ipython_extension", "__version__",
]
__all__ += [  # profile(spark=True)
    "SparkCollection", "SparkExecution", "SparkExecutionStats", "SparkJob", "SparkLocation",
    "SparkMetric", "SparkOperator", "SparkPlans", "SparkStage",
]
