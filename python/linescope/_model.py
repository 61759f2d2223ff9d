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
    wall_time_ns: int
    hits: int | None
    self_time_ns: int | None = None
    memory_bytes: int | None = None
    gpu: GPUStats | None = None
    calls: int | None = None  # calls made from the line; not collected by `trace`

    @property
    def avg_time_ns(self) -> float | None:
        """Wall time per hit; None when hits are unknown or zero."""
        if not self.hits:
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
    wall_time_ns: int
    hits: int | None = None
    memory: int | None = None
    gpu: GPUStats | None = None
    samples: int | None = None
    self_time_ns: int | None = None


@dataclass(frozen=True)
class RawFunction:
    filename: str
    qualname: str
    first_line: int
    total_time_ns: int | None = None
    own_time_ns: int | None = None
    calls: int | None = None


@dataclass
class RawBackendResult:
    lines: list[RawLine]
    functions: list[RawFunction] = field(default_factory=list)
    elapsed_ns: int | None = None
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


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
