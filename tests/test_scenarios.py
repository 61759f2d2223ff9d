"""Each scenario in examples/scenarios runs as a user would run it (real DataLoader workers, real
timings) and produces exactly its insights; the regression rule sizes changes by throughput."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuprof_testutil import run_cli

SCENARIOS = Path(__file__).resolve().parent.parent / "examples" / "scenarios"

# What each scenario must report: exactly these findings (findings of the same cause that the
# registry's precedence folds under them are not reported on their own).
CASES = {
    "slow_dataloader.py": {"dataloader_stall"},
    "cpu_bound_loader.py": {"cpu_bound_dataloader"},
    "compile_spike.py": {"first_step_outlier"},
    "throttling_gpu.py": {"thermal_throttling"},
    "memory_pressure.py": {"memory_pressure"},
    "paired_loader.py": {"dataloader_stall"},
    "unwrapped_evaluation.py": {"evaluation_in_steps"},
    "periodic_checkpoint.py": {"kernel_launch_overhead"},
}


def run_scenario(script: str, db: Path, *args: str, env: dict | None = None
                 ) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(SCENARIOS / script), "--db", str(db), *args],
                          capture_output=True, text=True, timeout=300, cwd=SCENARIOS,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


def reported(db: Path, run_id: int) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {r[0] for r in con.execute("SELECT rule_id FROM insights WHERE run_id=?",
                                          (run_id,))}
    finally:
        con.close()


def loop_ns_per_step(proc: subprocess.CompletedProcess) -> float:
    """The scenario's own measure of its steady-state wall time per step."""
    m = re.search(r"^loop: (\d+) ns/step", proc.stdout, re.M)
    assert m, proc.stdout
    return float(m.group(1))


def insights_json(db: Path, run_id: int) -> dict:
    return json.loads(run_cli("insights", str(db), str(run_id), "--json", check=True).stdout)


def busy_cpu_share(interval: float = 0.3) -> float:
    """The machine's busy CPU share over `interval` seconds (/proc/stat)."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle
    total0, idle0 = read()
    time.sleep(interval)
    total1, idle1 = read()
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def wait_for_a_quiet_machine(timeout: float = 15.0) -> None:
    """The scenarios judge CPU load and step-time spikes, so each starts on a machine the
    previous one (its DataLoader workers, its interpreter's exit) no longer keeps busy."""
    deadline = time.monotonic() + timeout
    while busy_cpu_share() > 0.3 and time.monotonic() < deadline:
        pass


# What the machine, not the scenario, can add to a run: the process held off the CPU
# (host_stalls) or its threads queued behind other processes for a CPU (cpu_contention), both
# measured, so the finding is true of the run; and the timing findings a pause of the machine
# produces when neither measure sees it (a pause of the main thread alone: memory reclaim in a
# container at its limit, say).
MACHINE = {"host_stalls", "cpu_contention"}
MACHINE_TIMING = {"high_step_variance", "compilation_warmup", "first_step_outlier"}
ATTEMPTS = 3


def accepted(script: str, fired: set[str]) -> set[str]:
    """The findings the scenario must report: its own, plus the machine's when they fired."""
    return CASES[script] | (fired & MACHINE)


@pytest.fixture(scope="module")
def scenario_runs(tmp_path_factory) -> dict[str, tuple[set[str], str, Path]]:
    """Every scenario: (reported rule ids, stdout, DB). A scenario whose run differs from its
    expected findings only by timing findings of a machine pause is run again (at most
    ATTEMPTS times): a wrong rule fails every attempt, a shared machine's pause does not
    repeat on cue. Each attempt's stdout is kept for the failure message."""
    out = {}
    for script in sorted(CASES):
        stdouts = []
        for attempt in range(ATTEMPTS):
            wait_for_a_quiet_machine()
            db = tmp_path_factory.mktemp("scenario") / "s.db"
            proc = run_scenario(script, db)
            fired = reported(db, 1)
            stdouts.append(f"attempt {attempt + 1}:\n{proc.stdout}")
            extra = fired - accepted(script, fired)
            if not extra or not extra <= MACHINE_TIMING or CASES[script] - fired:
                break
        out[script] = (fired, "\n".join(stdouts), db)
    return out


@pytest.mark.parametrize("script", sorted(CASES))
def test_scenario_reports_exactly_its_insights(script, scenario_runs):
    fired, stdout, _ = scenario_runs[script]
    assert fired == accepted(script, fired), stdout
    assert "gpuprof · " in stdout


def test_precision_and_recall_over_all_scenarios(scenario_runs):
    # Every finding reported is intended (precision), every intended finding is reported
    # (recall), over all scenarios together.
    tp = fp = fn = 0
    lines = []
    for script, expected in sorted(CASES.items()):
        fired = scenario_runs[script][0]
        tp += len(fired & expected)
        fp += len(fired - accepted(script, fired))
        fn += len(expected - fired)
        lines.append(f"{script}: extra {sorted(fired - expected)}, "
                     f"missing {sorted(expected - fired)}")
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    assert (precision, recall) == (1.0, 1.0), "\n".join(lines)


def test_a_cpu_bound_loader_gets_no_contradicting_advice(scenario_runs):
    # GIVEN loader workers that peg every core
    _, stdout, db = scenario_runs["cpu_bound_loader.py"]
    # THEN the summary leads with the CPU-bound diagnosis and never also says "raise num_workers"
    assert "more num_workers won't help" in stdout
    assert "raise DataLoader num_workers" not in stdout
    assert "(same cause, also explains: dataloader_stall" in stdout
    # AND the stall is kept, folded under it, in the JSON report
    doc = insights_json(db, 1)
    assert [i["rule_id"] for i in doc["insights"]][0] == "cpu_bound_dataloader"
    folded = {e["rule_id"]: e["explained_by"] for e in doc["explained"]}
    assert folded.get("dataloader_stall") == "cpu_bound_dataloader"
    assert "dataloader_stall" in doc["insights"][0]["explains"]


def test_a_paired_loaders_slow_steps_are_not_blamed_on_logging(scenario_runs):
    # GIVEN a loader whose 2 workers deliver batches in pairs (steps alternate long / short)
    _, stdout, db = scenario_runs["paired_loader.py"]
    doc = insights_json(db, 1)
    # THEN nothing reported blames logging, checkpoints or GC
    for insight in doc["insights"]:
        assert "GC" not in insight["fix"] and "checkpoint" not in insight["fix"], insight
    # AND if the variance rule saw the slow steps, it found them to be loader waits
    for e in doc["explained"]:
        if e["rule_id"] == "high_step_variance":
            assert e["evidence"]["loader_caused"] is True
            assert "waiting on the loader" in e["message"]


def test_an_unwrapped_evaluation_is_named_and_its_loader_is_not_the_trainings(scenario_runs):
    # GIVEN a validation pass every 10 steps, not wrapped in prof.evaluation()
    _, stdout, db = scenario_runs["unwrapped_evaluation.py"]
    doc = insights_json(db, 1)
    found = [i for i in doc["insights"] if i["rule_id"] == "evaluation_in_steps"][0]
    # THEN the finding names those steps and their calls: 8 validation forwards + the step's own
    assert found["evidence"]["evaluation_steps"] == 4
    assert found["evidence"]["step_period"] == 10
    assert found["evidence"]["median_forward_calls"] == 9
    assert "every 10th (5, 15, …, 35)" in found["message"]
    assert "prof.evaluation()" in found["fix"]
    # AND the loader rules judged the training steps only: never "raise num_workers"
    assert "raise DataLoader num_workers" not in stdout


def test_a_wrapped_evaluation_reports_nothing(tmp_path):
    # GIVEN the same loop with the validation pass in `with prof.evaluation():`
    fired: set[str] = set()
    for _ in range(ATTEMPTS):
        wait_for_a_quiet_machine()
        db = tmp_path / f"w{_}.db"
        proc = run_scenario("unwrapped_evaluation.py", db, "--wrapped")
        fired = reported(db, 1) - MACHINE
        if not fired - MACHINE_TIMING:
            break
    # THEN no evaluation steps, and nothing else (a machine's pause aside)
    assert "evaluation_in_steps" not in fired, proc.stdout
    assert fired <= MACHINE_TIMING, proc.stdout
    diagnostics = sqlite3.connect(db).execute(
        "SELECT message FROM diagnostics WHERE source = 'evaluation'").fetchall()
    assert diagnostics and diagnostics[0][0].startswith("evaluation: 4 loops"), diagnostics


def test_a_periodic_checkpoint_is_host_work_not_launch_overhead(scenario_runs):
    # GIVEN a 200 ms checkpoint every 10 steps
    _, stdout, db = scenario_runs["periodic_checkpoint.py"]
    doc = insights_json(db, 1)
    found = [i for i in doc["insights"] if i["rule_id"] == "kernel_launch_overhead"][0]
    # THEN the time outside the model is placed in those steps, with the fix for such work
    assert found["evidence"]["periodic_other"] is True
    assert found["evidence"]["spike_steps"] == 4
    assert found["evidence"]["spike_period"] == 10
    assert "periodic host work" in found["message"]
    assert "async_save" in found["fix"] and "torch.compile" not in found["fix"]
    # AND the slow steps are that finding, not a second one with the general advice
    for e in doc["explained"]:
        if e["rule_id"] == "high_step_variance":
            assert e["explained_by"] == "kernel_launch_overhead"


# ---------------------------------------------------------------- regression, by throughput

def regression(db: Path, run_id: int) -> tuple[dict | None, str | None]:
    """The regression insight of a run (None if not reported) and its not-evaluated reason."""
    doc = insights_json(db, run_id)
    found = [i for i in doc["insights"] if i["rule_id"] == "regression"]
    reason = [n["reason"] for n in doc["not_evaluated"] if n["rule_id"] == "regression"]
    return (found[0] if found else None), (reason[0] if reason else None)


@pytest.fixture(scope="module")
def paired_baseline(tmp_path_factory) -> tuple[Path, float]:
    """A DB holding one baseline run of the paired loader (2 workers, 10 ms a sample: ~40 ms
    a step, alternating) and its own wall time per step."""
    db = tmp_path_factory.mktemp("regression") / "base.db"
    proc = run_scenario("paired_loader.py", db, "--item-ms", "10", "--name", "cnn")
    return db, loop_ns_per_step(proc)


def compare_with_baseline(paired_baseline, tmp_path, *args: str):
    base_db, base_ns = paired_baseline
    db = tmp_path / "r.db"
    shutil.copy(base_db, db)
    proc = run_scenario("paired_loader.py", db, "--name", "cnn", *args)
    return db, loop_ns_per_step(proc) / base_ns


def test_identical_runs_report_no_change(paired_baseline, tmp_path):
    db, _ = compare_with_baseline(paired_baseline, tmp_path, "--item-ms", "10")
    found, reason = regression(db, 2)
    assert found is None, found
    assert reason is None or reason.startswith("inconclusive"), reason


@pytest.mark.parametrize("item_ms,steps", [("30", "40"), ("150", "20")], ids=["3x", "15x"])
def test_slower_runs_are_sized_by_their_wall_time(paired_baseline, tmp_path, item_ms, steps):
    # GIVEN the same loop with a loader 3× (15×) slower per sample
    db, truth = compare_with_baseline(paired_baseline, tmp_path, "--item-ms", item_ms,
                                      "--steps", steps)
    found, reason = regression(db, 2)
    # THEN the regression is reported, sized within 15% of the true wall-time ratio
    assert found is not None, reason
    assert found["severity"] == "med"
    ratio = found["evidence"]["ratio"]
    assert abs(ratio / truth - 1) <= 0.15, (ratio, truth, found["message"])
    assert f"{ratio:.1f}× slower" in found["message"]


def test_a_faster_run_is_sized_by_its_wall_time(tmp_path):
    # GIVEN a loader-bound baseline (~60 ms a step) and the same model fed without the wait
    db = tmp_path / "f.db"
    base = run_scenario("paired_loader.py", db, "--item-ms", "30", "--batch", "4",
                        "--name", "cnn-fast")
    fast = run_scenario("paired_loader.py", db, "--item-ms", "0", "--batch", "4",
                        "--name", "cnn-fast")
    truth = loop_ns_per_step(fast) / loop_ns_per_step(base)
    found, reason = regression(db, 2)
    # THEN the improvement is reported, sized within 15% of the true ratio
    assert found is not None, reason
    assert found["severity"] == "info"
    assert abs(found["evidence"]["ratio"] / truth - 1) <= 0.15, (found, truth)
    assert "faster" in found["message"]


# ---------------------------------------------------------------- cost that persists

def test_the_cost_in_the_summary_is_the_cost_insights_prints_later(tmp_path):
    # GIVEN a short CPU run priced with GPUPROF_GPU_RATE=2
    db = tmp_path / "c.db"
    code = (
        "import torch, gpuprof\n"
        "m = torch.nn.Linear(8, 8); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        f"with gpuprof.profile('priced', db={str(db)!r}, gpu='none'):\n"
        "    for _ in range(5):\n"
        "        m(torch.randn(4, 8)).sum().backward(); o.step(); o.zero_grad()\n")
    env = dict(os.environ, GPUPROF_GPU_RATE="2")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if "Estimated cost" in l)
    assert "1 machine @ $2.00/h" in line
    # AND the run, well under a second, is never "0 s"
    assert "(0 s" not in line
    assert re.search(r"\(\d+(\.\d)? (ms|µs) · 1 machine", line), line
    # WHEN the report is printed later, without the variable
    env.pop("GPUPROF_GPU_RATE")
    later = run_cli("insights", str(db), "1", env=env, check=True).stdout
    # THEN it prints the same cost line, priced at the stored rate
    assert line.split("]", 1)[1].strip() in later, later
    assert "cost unknown" not in later
    # AND --gpu-rate re-prices it
    repriced = run_cli("insights", str(db), "1", "--gpu-rate", "3", env=env, check=True).stdout
    assert "1 machine @ $3.00/h" in repriced
