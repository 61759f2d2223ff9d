"""The Spark part of the result model (``profile(spark=True)``).

Every PySpark DataFrame action or writer the profiled code ran is one ``SparkExecution``, at
the user's source line that triggered it. ``driver_time_ns`` (how long the call blocked the
Python driver) and ``executor_time_ns`` (the sum of the tasks' executor run time, across
parallel executor threads) are different quantities and are never added. Unknown values are
``None``, with the reason in ``SparkExecution.reasons``; never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SparkLocation:
    """The source line an action is charged to: the innermost frame the session records."""

    filename: str
    line: int
    function: str | None = None


@dataclass(frozen=True)
class SparkMetric:
    """One SQL metric of an operator. ``value`` (and the per-task ``min`` / ``med`` /
    ``max``) are in ``unit``: ``"ns"``, ``"bytes"``, ``"count"`` or ``""`` (a plain number);
    ``text`` is Spark's own display string. Sizes and durations are read from Spark's rounded
    display ("8.2 MiB", "1.5 s"), so they carry its rounding."""

    name: str
    type: str
    unit: str
    value: float | None
    min: float | None = None
    med: float | None = None
    max: float | None = None
    text: str | None = None


@dataclass(frozen=True)
class SparkOperator:
    """A node of the executed plan's operator tree. ``codegen`` marks a WholeStageCodegen
    stage (its children are the operators it fused)."""

    id: int
    name: str
    description: str
    metrics: list[SparkMetric]
    children: list[SparkOperator]
    codegen: bool = False

    def walk(self) -> list[SparkOperator]:
        """This operator and all below it, depth first."""
        out = [self]
        for c in self.children:
            out.extend(c.walk())
        return out


@dataclass(frozen=True)
class SparkStage:
    """One stage the action ran (its last attempt). Times in ns, sizes in bytes."""

    id: int | None
    attempt: int | None
    name: str | None
    status: str | None
    num_tasks: int | None
    executor_run_time_ns: int | None
    executor_cpu_time_ns: int | None
    shuffle_read_bytes: int | None
    shuffle_write_bytes: int | None
    memory_spilled_bytes: int | None
    disk_spilled_bytes: int | None
    peak_execution_memory_bytes: int | None
    input_bytes: int | None
    input_records: int | None
    output_bytes: int | None = None
    output_records: int | None = None
    failure_reason: str | None = None


@dataclass(frozen=True)
class SparkJob:
    id: int | None
    status: str | None
    stage_ids: list[int]
    num_tasks: int | None


@dataclass(frozen=True)
class SparkPlans:
    """The query's plans as text. ``executed`` is the physical plan as executed (the final
    adaptive plan); None where Spark did not provide one (e.g. an RDD-only action)."""

    parsed: str | None = None
    analyzed: str | None = None
    optimized: str | None = None
    executed: str | None = None


@dataclass(frozen=True)
class SparkExecutionStats:
    """Per-action totals over the stages that ran (skipped stages cost nothing). Executor
    times sum over tasks; ``peak_execution_memory_bytes`` is the highest stage value."""

    executor_time_ns: int | None = None
    executor_cpu_time_ns: int | None = None
    shuffle_read_bytes: int | None = None
    shuffle_write_bytes: int | None = None
    memory_spilled_bytes: int | None = None
    disk_spilled_bytes: int | None = None
    peak_execution_memory_bytes: int | None = None
    input_bytes: int | None = None
    input_records: int | None = None
    output_bytes: int | None = None
    output_rows: int | None = None
    tasks: int | None = None
    jobs: int = 0
    stages: int = 0


@dataclass(frozen=True)
class SparkExecution:
    """One PySpark action or writer call (``collect``, ``count``, ``write.parquet``, an eager
    ``spark.sql`` command, ...). ``status`` is ``"success"`` or ``"failed"`` (then ``error``
    holds the message; the user's exception propagated unchanged)."""

    id: int  # 1, 2, ... in the order the actions ran
    name: str
    location: SparkLocation | None
    status: str
    error: str | None
    driver_time_ns: int | None
    executor_time_ns: int | None
    plans: SparkPlans
    operators: list[SparkOperator]
    stages: list[SparkStage]
    jobs: list[SparkJob]
    stats: SparkExecutionStats
    sql_execution_ids: list[int] = field(default_factory=list)
    description: str | None = None
    reasons: dict[str, str] = field(default_factory=dict)  # field -> why it is None
    diagnostics: list[str] = field(default_factory=list)

    @property
    def filename(self) -> str | None:
        return None if self.location is None else self.location.filename

    @property
    def line(self) -> int | None:
        return None if self.location is None else self.location.line

    def operator_list(self) -> list[SparkOperator]:
        """Every operator of the executed plan, depth first."""
        out: list[SparkOperator] = []
        for op in self.operators:
            out.extend(op.walk())
        return out


@dataclass(frozen=True)
class SparkCollection:
    """How Spark data was collected (``spark=True``). ``available`` is False when nothing
    could be (pyspark not importable, no SparkSession was ever active); ``reason`` says why.
    ``driver_time_ns`` and ``executor_time_ns`` total the actions separately (None when no
    action ran, or some action's value is unknown)."""

    available: bool
    reason: str | None
    actions: int = 0
    failed: int = 0
    driver_time_ns: int | None = None
    executor_time_ns: int | None = None
    diagnostics: list[str] = field(default_factory=list)


def _metric(d: dict[str, Any]) -> SparkMetric:
    return SparkMetric(name=d.get("name") or "", type=d.get("type") or "",
                       unit=d.get("unit") or "", value=d.get("value"), min=d.get("min"),
                       med=d.get("med"), max=d.get("max"), text=d.get("text"))


def _operator(d: dict[str, Any]) -> SparkOperator:
    return SparkOperator(id=int(d["id"]), name=d.get("name") or "",
                         description=d.get("description") or "",
                         metrics=[_metric(m) for m in d.get("metrics", [])],
                         children=[_operator(c) for c in d.get("children", [])],
                         codegen=bool(d.get("codegen", False)))


def execution_from_dict(d: dict[str, Any], id: int) -> SparkExecution:
    """The model of one execution as the native core built it (``spark_build_execution``)."""
    loc = d.get("location")
    stats_d = dict(d.get("stats") or {})
    known = set(SparkExecutionStats.__dataclass_fields__)
    stats = SparkExecutionStats(**{k: v for k, v in stats_d.items() if k in known})
    stage_fields = set(SparkStage.__dataclass_fields__)
    return SparkExecution(
        id=id, name=d.get("name") or "", status=d.get("status") or "success",
        location=(SparkLocation(loc["filename"], int(loc["line"]), loc.get("function"))
                  if isinstance(loc, dict) and loc.get("filename") else None),
        error=d.get("error"), driver_time_ns=d.get("driver_time_ns"),
        executor_time_ns=d.get("executor_time_ns"),
        plans=SparkPlans(**{k: (d.get("plans") or {}).get(k)
                            for k in ("parsed", "analyzed", "optimized", "executed")}),
        operators=[_operator(o) for o in d.get("operators", [])],
        stages=[SparkStage(**{k: v for k, v in s.items() if k in stage_fields})
                for s in d.get("stages", [])],
        jobs=[SparkJob(id=j.get("id"), status=j.get("status"),
                       stage_ids=list(j.get("stage_ids") or []), num_tasks=j.get("num_tasks"))
              for j in d.get("jobs", [])],
        stats=stats, sql_execution_ids=[i for i in d.get("sql_execution_ids", []) if i is not None],
        description=d.get("description"), reasons=dict(d.get("reasons") or {}),
        diagnostics=list(d.get("diagnostics") or []))
