"""profile(spark=True) against a real local Spark (local[2], UI off): PySpark actions recorded at
the user's line with plans, operators, metrics and stages; driver and executor time apart.
Skips only where pyspark is not importable (the 3.12/3.13 venvs; test_packaging checks .venv)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

from linescope import SparkCollection, SparkExecution, profile  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    # A session left by another test module would be reused with its own settings (its
    # master, its partitions): this module's plans and metrics assume local[2].
    leftover = SparkSession.getActiveSession()
    if leftover is not None:
        leftover.stop()
    session = (SparkSession.builder.master("local[2]").appName("linescope-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


JOBS = """
def grouped(spark):
    return spark.range(2000).selectExpr("id % 7 AS k", "id").groupBy("k").count()

def collect(spark):
    df = grouped(spark)
    rows = df.collect()
    return rows

def write(spark, path):
    grouped(spark).write.mode("overwrite").parquet(path)

def failing(spark):
    return spark.range(3).selectExpr("raise_error('boom ' || id)").collect()

def lazy(spark):
    df = grouped(spark).filter("k > 2")
    return df

def nested(spark):
    return grouped(spark).first()
"""


def run(ws, spark, fn_name, *args, **options):
    mod = ws.module("jobs.py", JOBS)
    options.setdefault("display", "none")
    with profile(root=ws.root, spark=True, **options) as s:
        getattr(mod, fn_name)(spark, *args)
    return s.result


def test_action_recorded_at_its_line_with_plans_operators_metrics_and_stages(ws, spark):
    # GIVEN a collect() on line 6 of a user module WHEN profiled with spark=True
    result = run(ws, spark, "collect")
    # THEN one execution, at jobs.py:6, with plans, an operator tree with SQL metrics, stages
    assert isinstance(result.spark, SparkCollection) and result.spark.available
    [e] = result.run.spark_executions
    assert isinstance(e, SparkExecution)
    assert (e.name, e.status, e.error) == ("collect", "success", None)
    assert e.location is not None and e.location.filename.endswith("jobs.py")
    assert e.location.line == 6
    # Spark itself names the job by the user's line, not by linescope's wrapper
    assert e.description is not None and e.description.startswith("collect at ")
    assert e.description.endswith("jobs.py:6") and "linescope" not in e.description
    assert "HashAggregate" in e.plans.executed
    assert "Aggregate" in e.plans.optimized and "Aggregate" in e.plans.analyzed
    names = [op.name for op in e.operator_list()]
    assert "HashAggregate" in names and "Exchange" in names
    agg = next(op for op in e.operator_list() if op.name == "HashAggregate")
    rows = next(m for m in agg.metrics if m.name == "number of output rows")
    assert rows.unit == "count" and rows.value in (7, 14)
    assert e.stats.output_rows == 7
    assert e.jobs and e.stages
    done = [s for s in e.stages if s.status == "COMPLETE"]
    assert done and all(s.executor_run_time_ns is not None and s.num_tasks for s in done)
    assert e.stats.shuffle_write_bytes and e.stats.shuffle_write_bytes > 0
    assert e.stats.peak_execution_memory_bytes is not None
    json.dumps(result.to_dict())  # JSON-serialisable


def test_driver_and_executor_time_are_separate(ws, spark):
    result = run(ws, spark, "collect")
    [e] = result.run.spark_executions
    # THEN the driver time is the call's wall time and the executor time the sum of the
    # stages' run time: two numbers, never one sum
    assert e.driver_time_ns and e.driver_time_ns > 0
    assert e.executor_time_ns == sum(s.executor_run_time_ns or 0 for s in e.stages
                                     if s.status != "SKIPPED")
    assert result.spark.driver_time_ns == e.driver_time_ns
    assert result.spark.executor_time_ns == e.executor_time_ns
    d = result.to_dict()["run"]["spark_executions"][0]
    assert d["driver_time_ns"] == e.driver_time_ns and d["executor_time_ns"] == e.executor_time_ns


def test_writer_is_recorded(ws, spark, tmp_path):
    result = run(ws, spark, "write", str(tmp_path / "out.parquet"))
    [e] = result.run.spark_executions
    assert e.name == "write.parquet" and e.location.line == 10 and e.status == "success"
    assert any("InsertIntoHadoopFsRelation" in op.name or "WriteFiles" in op.name
               for op in e.operator_list())
    assert (tmp_path / "out.parquet").is_dir()


def test_failed_action_is_recorded_and_the_exception_propagates(ws, spark):
    mod = ws.module("jobs.py", JOBS)
    with pytest.raises(Exception, match="boom") as caught:
        with profile(root=ws.root, spark=True, display="none") as s:
            mod.failing(spark)
    assert "pyspark" in type(caught.value).__module__ or "Py4J" in type(caught.value).__name__
    [e] = s.result.run.spark_executions
    assert e.status == "failed" and "boom" in e.error and e.location.line == 13
    assert s.result.spark.failed == 1


def test_lazy_transformation_records_nothing(ws, spark):
    result = run(ws, spark, "lazy")
    assert result.run.spark_executions == []
    assert result.spark.available
    assert result.spark.reason == "no Spark action ran during the session"


def test_nested_actions_are_recorded_once(ws, spark):
    # first() calls head() calls take() calls collect(): one action, named as the user called it
    result = run(ws, spark, "nested")
    [e] = result.run.spark_executions
    assert e.name == "first" and e.location.line == 20


def test_actions_outside_the_session_are_not_wrapped(ws, spark):
    from pyspark.sql import DataFrame

    run(ws, spark, "collect")
    assert not hasattr(DataFrame.collect, "__wrapped__")


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`code` as a script in `cwd` (the default root), run in a fresh interpreter."""
    script = cwd / "main.py"
    script.write_text(textwrap.dedent(code).lstrip())
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=cwd, timeout=240)


def test_without_an_active_spark_session_says_why(tmp_path):
    # GIVEN pyspark importable but no SparkSession (a fresh process) WHEN spark=True
    out = _python("""
        import warnings
        from linescope import profile
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with profile(spark=True, display="none") as s:
                x = sum(range(10))
        print(s.result.spark.available, "|", s.result.spark.reason, "|", len(s.result.lines))
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    available, reason, lines = out.stdout.strip().split(" | ")
    assert available == "False" and "no SparkSession was active" in reason and int(lines) >= 1


def test_pyspark_missing_warns_and_profiles_normally(tmp_path):
    out = _python("""
        import sys, warnings
        sys.modules["pyspark"] = None  # not importable
        from linescope import profile
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with profile(spark=True, display="none") as s:
                x = sum(range(10))
        msgs = [str(w.message) for w in caught if w.category is RuntimeWarning]
        print(len(msgs), "|", s.result.spark.available, "|", s.result.spark.reason, "|",
              len(s.result.lines))
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    n, available, reason, lines = out.stdout.strip().split(" | ")
    assert n == "1" and available == "False" and "pyspark is not importable" in reason
    assert int(lines) >= 1


def test_cli_spark_flag(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "1").getOrCreate())
        n = spark.range(100).count()
        spark.stop()
    """).lstrip())
    exe = Path(sys.executable).parent / "linescope"
    out = subprocess.run([str(exe), "--spark", "-d", "none", "-o", str(tmp_path / "r.json"),
                          str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    [e] = doc["run"]["spark_executions"]
    # the action is read before the script's spark.stop(), at its line
    assert e["name"] == "count" and e["location"]["line"] == 4 and e["stages"]
    assert doc["spark"]["available"] is True


def test_cli_no_spark_flag_parses(tmp_path):
    from linescope.__main__ import add_profile_options, profile_options
    import argparse

    p = argparse.ArgumentParser()
    add_profile_options(p)
    assert profile_options(p.parse_args(["--spark"]))["spark"] is True
    assert profile_options(p.parse_args(["--no-spark"]))["spark"] is False


def test_magic_spark_flag(spark):
    IPython = pytest.importorskip("IPython")
    shell = IPython.core.interactiveshell.InteractiveShell.instance()
    shell.run_line_magic("load_ext", "linescope")
    shell.user_ns["spark"] = spark
    shell.run_cell_magic("linescope", "--spark -d none", "n = spark.range(50).count()\n")
    result = profile.result
    assert result.spark is not None and result.spark.available
    [e] = result.run.spark_executions
    assert e.name == "count" and e.status == "success"


def test_actions_in_notebook_cells_are_at_the_cells_label(spark):
    # GIVEN a notebook session started with spark=True in one cell
    IPython = pytest.importorskip("IPython")
    shell = IPython.core.interactiveshell.InteractiveShell.instance()
    shell.user_ns["spark"] = spark
    shell.run_cell("from linescope import profile\n"
                   "s = profile.start(display='none', spark=True)\n", store_history=True)
    # WHEN a later cell runs an action on its line 2, and the session stops
    number = shell.execution_count
    shell.run_cell("df = spark.range(30)\nn = df.count()\n", store_history=True)
    shell.run_cell("result = profile.stop()\n", store_history=True)
    # THEN the action is at that cell's label, as its lines are
    result = shell.user_ns["result"]
    [e] = result.run.spark_executions
    assert (e.name, e.location.filename, e.location.line) == ("count", f"cell {number}", 2)
    assert result.line(f"cell {number}", 2) is not None


def test_html_report_has_the_spark_view(ws, spark, tmp_path):
    out = tmp_path / "r.html"
    run(ws, spark, "collect", output=str(out))
    html = out.read_text()
    assert "spark-actions" in html  # the view's module is embedded
    from gpuprof import _native

    result = run(ws, spark, "collect")
    payload = json.loads(_native.build_report_payload(json.dumps(result.to_dict())))
    [a] = payload["spark"]["actions"]
    assert a["line"] == 6 and a["file"] is not None
    assert payload["spark"]["by_line"][f"{a['file']}:6"] == [0]
    assert a["driver_time_ns"] and a["executor_time_ns"] is not None


def test_text_summary_has_a_spark_section(ws, spark, capsys):
    run(ws, spark, "collect", display="end")
    err = capsys.readouterr().err
    assert "Spark" in err and "executor ms" in err and "collect @ " in err and "jobs.py:6" in err
