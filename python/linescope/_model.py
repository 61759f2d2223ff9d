"""The typed result model of linescope. Unknown values are ``None``, never 0."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GPUStats:
    """GPU work attributed to one line: a measurement domain separate from driver (CPU) wall
    time and host memory. Each field is ``None`` unless a GPU-capable backend measured it."""

    time_ns: int | None = None
    peak_memory_bytes: int | None = None


@dataclass(frozen=True)
class LineStats:
    """One executed source line.

    ``wall_time_ns`` is inclusive: everything that ran on the measured thread while this line
    was the current line of its frame (callees, dependencies, C extensions, I/O, sleeps).
    ``self_time_ns`` excludes time in recorded (traced) callees. A suspended generator or
    coroutine accrues no time on its lines.
    """

    filename: str
    line: int
    wall_time_ns: int | None  # None: the backend did not measure it
    hits: int | None
    self_time_ns: int | None = None
    memory_bytes: int | None = None  # net host-memory (RSS) change attributed to the line
    gpu: GPUStats | None = None
    calls: int | None = None  # fresh calls of recorded functions started from the line (`trace`)
    memory_peak_bytes: int | None = None  # highest process RSS seen while the line ran
    cpu_time_ns: int | None = None  # CPU time of the measured thread (sampling backends)
    samples: int | None = None  # samples that landed on the line (sampling backends)

    @property
    def avg_time_ns(self) -> float | None:
        """Wall time per hit; None when the wall time or the hits are unknown, or hits are 0."""
        if not self.hits or self.wall_time_ns is None:
            return None
        return self.wall_time_ns / self.hits


@dataclass(frozen=True)
class FunctionStats:
    """One function (code object). ``total_time_ns`` counts outermost activations only (no
    double counting under recursion); ``own_time_ns`` excludes recorded callees; ``calls``
    counts fresh calls (a generator resume is not a call). None = not measured."""

    qualname: str
    filename: str
    first_line: int
    total_time_ns: int | None
    own_time_ns: int | None
    calls: int | None


@dataclass(frozen=True)
class Symbol:
    """Where a function is defined (report links point here)."""

    qualname: str
    filename: str
    line: int


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend measures. Requesting an option whose capability is False is rejected
    before start (except where the backend lists the option in ``warn_instead_of_reject``:
    then profiling continues with a RuntimeWarning and a diagnostic in result.warnings)."""

    line_time: bool = True
    hit_counts: bool = True
    function_stats: bool = False
    memory: bool = False
    sampled: bool = False
    gpu: bool = False
    threads: str = "calling thread"
    warn_instead_of_reject: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RawLine:
    """A backend's per-line output, before normalisation."""

    filename: str
    line: int
    wall_time_ns: int | None
    hits: int | None = None
    memory: int | None = None
    gpu: GPUStats | None = None
    samples: int | None = None
    self_time_ns: int | None = None
    memory_peak: int | None = None
    cpu_time_ns: int | None = None
    calls: int | None = None  # calls of recorded functions made from the line


@dataclass(frozen=True)
class RawFunction:
    filename: str
    qualname: str
    first_line: int
    total_time_ns: int | None = None
    own_time_ns: int | None = None
    calls: int | None = None


@dataclass(frozen=True)
class MemoryProfile:
    """Host memory of the profiled process (``memory=True``): a bounded RSS timeline and its
    extremes. ``timeline`` holds ``(t_ns, rss_bytes)`` pairs, ``t_ns`` relative to the
    session start; when the run outgrows the bound, neighbouring points are merged keeping
    the higher RSS, so peaks survive. ``per_line`` says whether RSS changes were attributed
    to lines (``LineStats.memory_bytes`` / ``memory_peak_bytes``); when not, ``reason`` says
    why. Unknown values are None."""

    timeline: list[tuple[int, int]]
    start_rss_bytes: int | None
    peak_rss_bytes: int | None
    end_rss_bytes: int | None
    interval_ns: int | None
    per_line: bool
    reason: str | None = None
    source: str = "rss"


@dataclass(frozen=True)
class GPUCollection:
    """How GPU values were collected (``gpu=True``), kept apart from driver time and host
    memory. ``method`` names what produced ``LineStats.gpu`` (e.g. ``"nvml-sampled"``,
    ``"cupti"``, ``"backend"``); None when nothing was collected. ``time_reason`` /
    ``memory_reason`` give the recorded reason when GPU time / GPU peak memory are
    unavailable (None when available, or when the collector recorded no reason).
    ``utilization_scope`` is ``"process"`` or ``"device"`` (device-wide utilization can
    include other processes)."""

    method: str | None
    time_available: bool
    memory_available: bool
    time_reason: str | None = None
    memory_reason: str | None = None
    devices: list[str] = field(default_factory=list)
    utilization_scope: str | None = None
    diagnostics: list[str] = field(default_factory=list)


@dataclass
class RawBackendResult:
    lines: list[RawLine]
    functions: list[RawFunction] = field(default_factory=list)
    elapsed_ns: int | None = None
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    memory: MemoryProfile | None = None  # a backend that measures memory itself
    gpu: GPUCollection | None = None  # a GPU-capable backend's collection summary


@dataclass
class ProfileRun:
    """The root run of a session: everything measured between start() and stop()."""

    elapsed_ns: int | None
    lines: list[LineStats]
    functions: list[FunctionStats]
    started_at: float  # Unix seconds


@dataclass
class ProfileResult:
    run: ProfileRun
    sources: dict[str, str]  # filename -> source text, snapshot taken when the session stopped
    backend: str
    capabilities: BackendCapabilities
    symbols: list[Symbol]
    warnings: list[str]
    options: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    memory: MemoryProfile | None = None  # None unless memory=True
    gpu: GPUCollection | None = None  # None unless gpu=True on a GPU-capable backend

    @property
    def lines(self) -> list[LineStats]:
        return self.run.lines

    @property
    def functions(self) -> list[FunctionStats]:
        return self.run.functions

    def line(self, filename: str, line: int) -> LineStats | None:
        """The stats of ``filename:line`` (filename absolute or a path suffix), or None."""
        for s in self.run.lines:
            if s.line == line and _same_file(s.filename, filename):
                return s
        return None

    def function(self, qualname: str, filename: str | None = None) -> FunctionStats | None:
        for f in self.run.functions:
            if f.qualname == qualname and (filename is None or _same_file(f.filename, filename)):
                return f
        return None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["capabilities"]["warn_instead_of_reject"] = sorted(
            self.capabilities.warn_instead_of_reject)
        d["format"] = "linescope-result/1"
        return d


def _same_file(have: str, want: str) -> bool:
    return have == want or have.endswith("/" + want.lstrip("/"))
