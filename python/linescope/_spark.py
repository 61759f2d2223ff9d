"""``profile(spark=True)``: PySpark actions recorded at the user's line that ran them.

Only what must touch Python and JVM objects lives here: while a session runs, the DataFrame
actions and writers (and ``SparkSession.sql``, which runs commands eagerly) are wrapped; each
outermost call records where it was made (the innermost frame the session's own native path
filter records, as every backend's), how long it blocked the driver (the native clock),
its outcome, and its query execution. When the session stops, Spark's listener bus is drained
and its status stores are read over py4j (the SQL status store: executions, plan graph, SQL
metrics; the app status store: jobs and stages — both also work with ``spark.ui.enabled=false``);
the native core (``_native.spark_build_execution``) turns each action's readings into the
recorded execution: parsed metrics, operator tree, per-action totals.

An action's SQL executions and jobs are the ones Spark submitted between the call's start and
end (wall clock, milliseconds, as Spark stamps them); actions on the driver run one after
another, so the windows do not overlap. Nested actions (``first`` calls ``head`` calls
``take`` ...) are recorded once, as the outermost call.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ._backends import BackendOptions, native_cwd
from ._results import sum_known
from ._spark_model import SparkCollection, SparkExecution, execution_from_dict

# (module, class, methods, label prefix): what is wrapped while a session runs.
_TARGETS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("pyspark.sql.dataframe", "DataFrame",
     ("collect", "count", "show", "toPandas", "take", "head", "first", "tail", "foreach",
      "foreachPartition", "toLocalIterator", "isEmpty"), ""),
    ("pyspark.sql.readwriter", "DataFrameWriter",
     ("save", "saveAsTable", "insertInto", "parquet", "csv", "json", "orc", "text", "jdbc"),
     "write."),
    ("pyspark.sql.readwriter", "DataFrameWriterV2",
     ("append", "overwrite", "overwritePartitions", "create", "replace", "createOrReplace"),
     "writeTo."),
    ("pyspark.sql.session", "SparkSession", ("sql",), ""),
)
_MISSING = object()
_DRAIN_TIMEOUT_MS = 10_000
_MAX_ERROR_CHARS = 4000

PYSPARK_MISSING = ("spark=True, but pyspark is not importable in this Python ({exc}): no Spark "
                   "data was collected; line profiling continues. Install pyspark (and a Java "
                   "runtime) to record Spark actions.")
NO_SESSION = ("spark=True, but no SparkSession was active during the session: no Spark action "
              "could be recorded (create one with SparkSession.builder...getOrCreate() before "
              "or inside the profiled code)")


@dataclass
class _Pending:
    """One outermost action call, as recorded while the session ran."""

    name: str
    location: dict[str, Any] | None
    start_ms: int
    end_ms: int
    driver_time_ns: int
    status: str
    error: str | None
    jsession: Any  # the JVM SparkSession (py4j), None when unknown
    jsc: Any  # the JVM SparkContext (py4j)
    query: Any  # the DataFrame's JVM QueryExecution, None when there is none
    drop_if_idle: bool  # spark.sql: a lazy query that ran nothing is not an action
    resolved: dict[str, Any] | None = None  # the raw capture, once read
    reasons: list[str] = field(default_factory=list)


class SparkRecorder:
    """Records the PySpark actions of one session. ``start()`` wraps, ``stop()`` unwraps
    (idempotent; also when the session fails), ``finish()`` reads Spark and builds the model.
    The wrappers may run on any thread; the rest runs on the session's thread."""

    def __init__(self, options: BackendOptions) -> None:
        from gpuprof import _native

        self._native: Any = _native
        # The session's own path filter (its exclude holds linescope's package), as the
        # source snapshots and the scalene/tachyon adapters use it.
        self._filter = _native.LineTracer(list(options.roots), list(options.include),
                                          list(options.exclude), native_cwd())
        self._recorded: dict[str, bool] = {}
        self._patches: list[tuple[type, str, Any]] = []
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._reason: str | None = None
        self._available = True
        self._saw_session = False
        self._running = False

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> list[str]:
        """Wraps the actions. Returns warning texts (pyspark not importable)."""
        try:
            importlib.import_module("pyspark")
            classes = []
            for module, cls_name, methods, prefix in _TARGETS:
                mod = importlib.import_module(module)
                cls = getattr(mod, cls_name, None)
                if cls is not None:
                    classes.append((cls, methods, prefix))
        except Exception as e:  # noqa: BLE001 - ImportError, or a broken installation
            self._available = False
            self._reason = PYSPARK_MISSING.format(exc=f"{type(e).__name__}: {e}")
            return [self._reason]
        self._saw_session = self._active_session() is not None
        for cls, methods, prefix in classes:
            for name in methods:
                original = cls.__dict__.get(name, _MISSING)
                current = getattr(cls, name, None)
                if current is None or not callable(current):
                    continue
                self._patches.append((cls, name, original))
                setattr(cls, name, self._wrap(current, prefix + name, cls.__name__))
        from pyspark.sql.session import SparkSession

        # A script that stops its SparkSession inside the session: its actions are read first.
        original_stop = SparkSession.__dict__.get("stop", _MISSING)
        if original_stop is not _MISSING:
            self._patches.append((SparkSession, "stop", original_stop))
            recorder = self

            def stop(spark_self: Any, *args: Any, **kwargs: Any) -> Any:
                recorder._resolve_pending()
                return original_stop(spark_self, *args, **kwargs)

            stop.__wrapped__ = original_stop  # type: ignore[attr-defined]
            SparkSession.stop = stop  # type: ignore[method-assign,assignment]
        self._running = True
        return []

    def stop(self) -> None:
        """Undoes every wrapper (idempotent)."""
        self._running = False
        while self._patches:
            cls, name, original = self._patches.pop()
            if original is _MISSING:
                try:
                    delattr(cls, name)
                except AttributeError:
                    pass
            else:
                setattr(cls, name, original)

    def finish(self) -> tuple[list[SparkExecution], SparkCollection]:
        """Reads what Spark recorded for each action and builds the model (after stop())."""
        self.stop()
        if not self._available:
            return [], SparkCollection(available=False, reason=self._reason)
        if not self._saw_session and self._active_session() is not None:
            self._saw_session = True
        if not self._pending and not self._saw_session:
            return [], SparkCollection(available=False, reason=NO_SESSION)
        self._resolve_pending()
        executions: list[SparkExecution] = []
        diagnostics: list[str] = []
        for p in self._pending:
            raw = p.resolved
            if raw is None:
                continue
            if (p.drop_if_idle and p.status == "success" and not raw["executions"]
                    and not raw["jobs"]):
                continue  # a lazy spark.sql(...) query: nothing ran
            try:
                built = json.loads(self._native.spark_build_execution(json.dumps(raw)))
            except ValueError as err:
                diagnostics.append(f"{p.name}: {err}")
                continue
            executions.append(execution_from_dict(built, id=len(executions) + 1))
        for ex in executions:
            for d in ex.diagnostics:
                if d not in diagnostics:
                    diagnostics.append(d)
        reason = None if executions else "no Spark action ran during the session"
        return executions, SparkCollection(
            available=True, reason=reason, actions=len(executions),
            failed=sum(e.status == "failed" for e in executions),
            driver_time_ns=(sum_known([e.driver_time_ns for e in executions])
                            if executions else None),
            executor_time_ns=(sum_known([e.executor_time_ns for e in executions])
                              if executions else None),
            diagnostics=diagnostics)

    # ---- the wrappers ----------------------------------------------------------------------
    def _wrap(self, fn: Callable[..., Any], name: str, owner: str) -> Callable[..., Any]:
        recorder = self

        def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
            local = recorder._local
            if not recorder._running or getattr(local, "depth", False):
                return fn(obj, *args, **kwargs)  # a nested action: the outer call records
            local.depth = 1
            caller = sys._getframe(1)
            location = recorder._location(caller)
            clock = recorder._native.monotonic_ns
            start_wall = time.time_ns()
            start = clock()
            status, error = "success", None
            result = None
            try:
                with _call_site_of(fn, caller):
                    result = fn(obj, *args, **kwargs)
                return result
            except BaseException as e:
                status, error = "failed", _error_text(e)
                raise
            finally:
                driver_ns = clock() - start
                end_wall = time.time_ns()
                local.depth = 0
                query = result if owner == "SparkSession" and status == "success" else obj
                recorder._record(name, owner, obj, query, location, start_wall, end_wall,
                                 driver_ns, status, error)

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(fn, "__name__", name)
        wrapper.__doc__ = getattr(fn, "__doc__", None)
        return wrapper

    def _record(self, name: str, owner: str, obj: Any, query_obj: Any,
                location: dict[str, Any] | None, start_wall: int, end_wall: int,
                driver_ns: int, status: str, error: str | None) -> None:
        try:
            jsession, jsc, query = _jvm_handles(owner, obj, query_obj)
        except Exception:  # noqa: BLE001 - never raise into the profiled code
            jsession = jsc = query = None
        if jsession is not None:
            self._saw_session = True
        p = _Pending(name=name, location=location, start_ms=start_wall // 1_000_000,
                     end_ms=-(-end_wall // 1_000_000), driver_time_ns=driver_ns, status=status,
                     error=error, jsession=jsession, jsc=jsc, query=query,
                     drop_if_idle=owner == "SparkSession")
        with self._lock:
            self._pending.append(p)

    def _location(self, frame: Any) -> dict[str, Any] | None:
        """The innermost frame the session records (its path filter), or None."""
        f = frame
        while f is not None:
            name = f.f_code.co_filename
            rec = self._recorded.get(name)
            if rec is None:
                rec = self._recorded[name] = bool(self._filter.recorded(name))
            if rec:
                return {"filename": name if name.startswith("<") else os.path.abspath(name),
                        "line": f.f_lineno, "function": f.f_code.co_qualname}
            f = f.f_back
        return None

    @staticmethod
    def _active_session() -> Any:
        try:
            from pyspark.sql import SparkSession

            return SparkSession.getActiveSession()
        except Exception:  # noqa: BLE001
            return None

    # ---- reading Spark ---------------------------------------------------------------------
    def _resolve_pending(self) -> None:
        """Reads Spark's status stores for every action not read yet."""
        with self._lock:
            todo = [p for p in self._pending if p.resolved is None]
        by_context: dict[int, list[_Pending]] = {}
        for p in todo:
            by_context.setdefault(id(p.jsc), []).append(p)
        for group in by_context.values():
            _resolve_group(group)


def _error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS - 1] + "\u2026"


def _jvm_handles(owner: str, obj: Any, query_obj: Any) -> tuple[Any, Any, Any]:
    """(JVM SparkSession, JVM SparkContext, JVM QueryExecution or None) of an action's object."""
    if owner == "SparkSession":
        spark = obj
    elif owner == "DataFrame":
        spark = obj.sparkSession
    else:  # the writers
        spark = getattr(obj, "_spark", None) or obj._df.sparkSession
    jsession = spark._jsparkSession
    jsc = spark._sc._jsc.sc()
    query = None
    df = query_obj if owner != "DataFrameWriter" and owner != "DataFrameWriterV2" else \
        getattr(query_obj, "_df", None)
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:
        query = jdf.queryExecution()
    return jsession, jsc, query


def _opt(v: Any) -> Any:
    """A Scala Option's value, or None."""
    try:
        return v.get() if v.isDefined() else None
    except Exception:  # noqa: BLE001
        return None


def _ms(date: Any) -> int | None:
    d = _opt(date)
    return None if d is None else int(d.getTime())


def _seq(s: Any) -> list[Any]:
    return [s.apply(i) for i in range(s.size())]


def _plans(query: Any, reasons: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {"parsed": None, "analyzed": None, "optimized": None,
                                  "executed": None}
    if query is None:
        return out
    for key, method in (("parsed", "logical"), ("analyzed", "analyzed"),
                        ("optimized", "optimizedPlan"), ("executed", "executedPlan")):
        try:
            out[key] = str(getattr(query, method)().toString())
        except Exception as e:  # noqa: BLE001 - e.g. a query that failed analysis
            reasons.append(f"the {key} plan could not be read: {str(e).splitlines()[0][:200]}")
    return out


def _resolve_group(group: list[_Pending]) -> None:
    """Reads the stores of one SparkContext for `group` (its actions, in call order)."""
    jsc, jsession = group[0].jsc, group[0].jsession
    execs: list[Any] = []
    jobs: list[Any] = []
    reasons: list[str] = []
    sql_store = app_store = None
    if jsc is None or jsession is None:
        reasons.append("the action's SparkSession could not be read over py4j")
    else:
        try:
            try:
                jsc.listenerBus().waitUntilEmpty(_DRAIN_TIMEOUT_MS)
            except Exception:  # noqa: BLE001 - a busy bus: read what is there
                reasons.append("Spark's listener bus did not drain in "
                               f"{_DRAIN_TIMEOUT_MS // 1000} s; late events may be missing")
            sql_store = jsession.sharedState().statusStore()
            app_store = jsc.statusStore()
            execs = _seq(sql_store.executionsList())
            jobs = _seq(app_store.jobsList(None))
        except Exception as e:  # noqa: BLE001 - a stopped context, a closed gateway
            reasons = [f"Spark's status store could not be read: {str(e).splitlines()[0][:200]}"]
            execs, jobs = [], []
            sql_store = app_store = None
    windows = sorted(range(len(group)), key=lambda i: group[i].start_ms)

    def owner(t_ms: int | None) -> int | None:
        """The action whose window holds t_ms: the latest one that started by then."""
        if t_ms is None:
            return None
        best = None
        for i in windows:
            if group[i].start_ms <= t_ms:
                best = i
        if best is not None and t_ms <= group[best].end_ms:
            return best
        return None

    raw_execs: list[list[dict[str, Any]]] = [[] for _ in group]
    raw_jobs: list[list[dict[str, Any]]] = [[] for _ in group]
    stage_ids: list[list[int]] = [[] for _ in group]
    for jex in execs:
        try:
            i = owner(int(jex.submissionTime()))
            if i is None:
                continue
            raw_execs[i].append(_read_execution(sql_store, jex))
        except Exception as ex:  # noqa: BLE001
            reasons.append(f"a SQL execution could not be read: {str(ex).splitlines()[0][:200]}")
    for j in jobs:
        try:
            i = owner(_ms(j.submissionTime()))
            if i is None:
                continue
            ids = [int(s) for s in _seq(j.stageIds())]
            raw_jobs[i].append({"id": int(j.jobId()), "status": str(j.status()),
                                "stage_ids": ids, "num_tasks": int(j.numTasks())})
            stage_ids[i].extend(s for s in ids if s not in stage_ids[i])
        except Exception as ex:  # noqa: BLE001
            reasons.append(f"a Spark job could not be read: {str(ex).splitlines()[0][:200]}")
    for i, p in enumerate(group):
        own = list(reasons)
        stages = []
        for sid in sorted(stage_ids[i]):
            try:
                stages.append(_read_stage(app_store, sid))
            except Exception:  # noqa: BLE001 - a stage that never ran (skipped) has no data
                stages.append({"id": sid, "status": "SKIPPED"})
        plans = _plans(p.query, own)
        p.resolved = {
            "name": p.name, "status": p.status, "error": p.error,
            "driver_time_ns": p.driver_time_ns, "location": p.location, "plans": plans,
            "reasons": own, "executions": sorted(raw_execs[i], key=lambda x: x["id"]),
            "jobs": sorted(raw_jobs[i], key=lambda x: x["id"]), "stages": stages,
        }
        p.query = None  # the JVM objects are no longer needed
        p.jsession = p.jsc = None


def _read_execution(store: Any, e: Any) -> dict[str, Any]:
    eid = int(e.executionId())
    nodes: list[dict[str, Any]] = []
    edges: list[list[int]] = []
    values: dict[str, str] = {}
    try:
        graph = store.planGraph(eid)
        cluster_of: dict[int, int] = {}  # node id -> the WholeStageCodegen cluster holding it
        for n in _seq(graph.allNodes()):
            is_cluster = n.getClass().getSimpleName() == "SparkPlanGraphCluster"
            nodes.append({
                "id": int(n.id()), "name": str(n.name()), "desc": str(n.desc()),
                "is_cluster": is_cluster, "cluster": None,
                "metrics": [{"name": str(m.name()), "acc": int(m.accumulatorId()),
                             "type": str(m.metricType())} for m in _seq(n.metrics())],
            })
            if is_cluster:
                cluster_of.update((int(c.id()), int(n.id())) for c in _seq(n.nodes()))
        for nd in nodes:
            nd["cluster"] = cluster_of.get(nd["id"])
        edges = [[int(x.fromId()), int(x.toId())] for x in _seq(graph.edges())]
        metric_map = store.executionMetrics(eid)
        it = metric_map.iterator()
        while it.hasNext():
            kv = it.next()
            values[str(kv._1())] = str(kv._2())
    except Exception:  # noqa: BLE001 - plan graph or metrics not there: the plan text stays
        pass
    error = _opt(e.errorMessage())
    return {"id": eid, "description": str(e.description()),
            "physical_plan": str(e.physicalPlanDescription()),
            "error": None if error in (None, "") else str(error), "nodes": nodes,
            "edges": edges, "metric_values": values}


def _read_stage(store: Any, sid: int) -> dict[str, Any]:
    s = store.lastStageAttempt(sid)
    return {
        "id": int(s.stageId()), "attempt": int(s.attemptId()), "name": str(s.name()),
        "status": str(s.status()), "num_tasks": int(s.numTasks()),
        "executor_run_time_ms": int(s.executorRunTime()),
        "executor_cpu_time_ns": int(s.executorCpuTime()),
        "shuffle_read_bytes": int(s.shuffleReadBytes()),
        "shuffle_write_bytes": int(s.shuffleWriteBytes()),
        "memory_spilled_bytes": int(s.memoryBytesSpilled()),
        "disk_spilled_bytes": int(s.diskBytesSpilled()),
        "peak_execution_memory_bytes": int(s.peakExecutionMemory()),
        "input_bytes": int(s.inputBytes()), "input_records": int(s.inputRecords()),
        "output_bytes": int(s.outputBytes()), "output_records": int(s.outputRecords()),
        "failure_reason": _opt(s.failureReason()),
    }


def start_recorder(options: BackendOptions, warns: list[str], stacklevel: int) -> SparkRecorder:
    """The recorder of a session with spark=True, started (its actions wrapped). A warning it
    raises (pyspark not importable) goes into `warns` and out as a RuntimeWarning at the
    user's line (`stacklevel` as the session computed it for its caller)."""
    import warnings

    recorder = SparkRecorder(options)
    for text in recorder.start():
        warns.append(text)
        warnings.warn(text, RuntimeWarning, stacklevel=stacklevel + 1)
    return recorder


def attach(result: Any, recorder: SparkRecorder) -> None:
    """Reads Spark for the session's actions and puts them on `result` (a ProfileResult):
    ``result.run.spark_executions`` and the ``result.spark`` summary."""
    try:
        executions, summary = recorder.finish()
    except Exception as e:  # noqa: BLE001 - Spark's failure never costs the line profile
        executions, summary = [], SparkCollection(
            available=False, reason=f"reading Spark failed: {type(e).__name__}: {e}")
    result.run.spark_executions = executions
    result.spark = summary


@contextlib.contextmanager
def _call_site_of(fn: Callable[..., Any], caller: Any) -> Iterator[None]:
    """Spark names a job by its Python call site ("collect at train.py:12", in the Spark UI
    and the status store): pyspark takes the frame that called into pyspark, which is this
    module's wrapper now. The call site is set to the user's own frame instead, as pyspark
    does (its SCCallSiteSync), so profiling does not change what Spark shows."""
    try:
        from pyspark import SparkContext
        from pyspark.traceback_utils import SCCallSiteSync

        sc = SparkContext._active_spark_context
        sync = None
        if sc is not None and SCCallSiteSync._spark_stack_depth == 0:
            sync = SCCallSiteSync.__new__(SCCallSiteSync)
            sync._call_site = (f"{getattr(fn, '__name__', 'action')} at "
                               f"{caller.f_code.co_filename}:{caller.f_lineno}")
            sync._context = sc
    except Exception:  # noqa: BLE001 - an unexpected pyspark: Spark names the site itself
        sync = None
    if sync is None:
        yield
        return
    with sync:
        yield
