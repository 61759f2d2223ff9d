"""The typed result model of linescope. Unknown values are ``None``, never 0."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from dataclasses import dataclass, field
from typing import Any

from ._spark_model import SparkCollection, SparkExecution


class RunStatus(enum.StrEnum):
    """How a run ended: ``success``, or ``failed`` when the profiled code raised (the ``with``
    block, the script, the cell). ``reference``: a run known only by reference (a child
    notebook whose source and measurements are not available)."""

    SUCCESS = "success"
    FAILED = "failed"
    REFERENCE = "reference"


class SessionState(enum.StrEnum):
    """Where a session is in its life: created, running, stopped (a session runs once)."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"


@dataclass(frozen=True)
class SourceLocation:
    """A line of a captured source: ``source_id`` is a key of ``ProfileResult.sources`` (the
    file's absolute path, or ``cell N`` for notebook cell N)."""

    source_id: str
    line: int
    column: int | None = None
    symbol: str | None = None


class SourceUnit(str):
    """A captured source snapshot. It is the source text itself (a ``str``, so
    ``result.sources[name]`` reads as text) and also carries where it came from: ``id`` (its
    key in ``ProfileResult.sources``), ``path`` (the file, or the cell's compiled name),
    ``kind`` (``"python"`` or ``"notebook"``) and ``source`` (the text)."""

    id: str
    path: str
    kind: str

    def __new__(cls, text: str, id: str, path: str | None = None,
                kind: str = "python") -> SourceUnit:
        unit = super().__new__(cls, text)
        unit.id = id
        unit.path = id if path is None else path
        unit.kind = kind
        return unit

    @property
    def source(self) -> str:
        return str(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SourceUnit, (str(self), self.id, self.path, self.kind))

    def __repr__(self) -> str:
        return f"SourceUnit(id={self.id!r}, path={self.path!r}, kind={self.kind!r})"


@dataclass(frozen=True)
class GPUStats:
    """GPU work attributed to one line: a measurement domain separate from driver (CPU) wall
    time and host memory. Each field is ``None`` unless a GPU-capable backend measured it."""

    time_ns: int | None = None
    peak_memory_bytes: int | None = None


@dataclass(frozen=True)
class ProcessMemory:
    """A line's host-memory (RSS) change and the highest RSS seen while it ran (bytes; None:
    not measured). ``rss_bytes`` (the RSS after the line) is not kept per line: None."""

    delta_bytes: int | None = None
    peak_bytes: int | None = None
    rss_bytes: int | None = None


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
    def ram(self) -> ProcessMemory | None:
        """LineScope's name for the line's host-memory (RSS) change and peak; None unless
        memory=True measured them."""
        if self.memory_bytes is None and self.memory_peak_bytes is None:
            return None
        return ProcessMemory(delta_bytes=self.memory_bytes, peak_bytes=self.memory_peak_bytes)

    @property
    def location(self) -> SourceLocation:
        """Where the line is: ``location.source_id`` keys ``ProfileResult.sources``."""
        return SourceLocation(self.filename, self.line)

    @property
    def avg_time_ns(self) -> float | None:
        """Wall time per hit; None when the wall time or the hits are unknown, or hits are 0."""
        if not self.hits or self.wall_time_ns is None:
            return None
        return self.wall_time_ns / self.hits


class _NamedInSource:
    """LineScope's names of a function's ``qualname`` and ``filename``."""

    qualname: str
    filename: str

    @property
    def qualified_name(self) -> str:
        return self.qualname

    @property
    def source_id(self) -> str:
        return self.filename


@dataclass(frozen=True)
class FunctionStats(_NamedInSource):
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
class Symbol(_NamedInSource):
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
    """A run: the root run of a session is everything measured between start() and stop().
    ``status`` is ``failed`` when the profiled code raised, with ``error`` saying what
    (``"ZeroDivisionError: division by zero"``), else ``success``. The run tree
    (``id``, ``parent_id``, ``children``) is where runs of child notebooks will hang; today a
    session has one run and ``children`` is empty (docs/linescope.md, Notebooks)."""

    elapsed_ns: int | None
    lines: list[LineStats]
    functions: list[FunctionStats]
    started_at: float  # Unix seconds
    status: RunStatus = RunStatus.SUCCESS
    error: str | None = None
    name: str = "Profile"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    parent_id: str | None = None
    children: list[ProfileRun] = field(default_factory=list)
    # spark=True: the PySpark actions the run made (linescope/_spark_model.py)
    spark_executions: list[SparkExecution] = field(default_factory=list)


@dataclass
class ProfileResult:
    run: ProfileRun
    # filename (or "cell N") -> its source snapshot (a SourceUnit: the text, with id / path /
    # kind), taken when the session stopped
    sources: dict[str, SourceUnit]
    backend: str
    capabilities: BackendCapabilities
    symbols: list[Symbol]
    warnings: list[str]
    options: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    memory: MemoryProfile | None = None  # None unless memory=True
    gpu: GPUCollection | None = None  # None unless gpu=True on a GPU-capable backend
    spark: SparkCollection | None = None  # None unless spark=True

    def __repr__(self) -> str:
        # Short: a notebook shows it as the value of `profile.stop()`.
        run = self.run
        ms = "—" if run.elapsed_ns is None else f"{run.elapsed_ns / 1e6:.1f} ms"
        return (f"<linescope ProfileResult: {self.backend}, {run.status}, {ms}, "
                f"{len(run.lines)} lines, {len(run.functions)} functions, "
                f"{len(self.sources)} sources>")

    @property
    def root_run(self) -> ProfileRun:
        """The session's run (LineScope's name for ``run``)."""
        return self.run

    @property
    def status(self) -> RunStatus:
        return self.run.status

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
