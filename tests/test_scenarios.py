"""Each scenario in examples/scenarios runs as a user would run it and produces its insight."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).resolve().parent.parent / "examples" / "scenarios"

CASES = {
    "slow_dataloader.py": {"dataloader_stall"},
    "cpu_bound_loader.py": {"dataloader_stall", "cpu_bound_dataloader"},
    "compile_spike.py": {"first_step_outlier"},  # compilation_warmup defers to it
    "throttling_gpu.py": {"thermal_throttling"},
    "memory_pressure.py": {"memory_pressure"},
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_scenario_produces_its_insight(script, tmp_path):
    db = tmp_path / "s.db"
    proc = subprocess.run([sys.executable, str(SCENARIOS / script), "--db", str(db)],
                          capture_output=True, text=True, timeout=300, cwd=SCENARIOS)
    assert proc.returncode == 0, proc.stderr
    con = sqlite3.connect(db)
    fired = {r[0] for r in con.execute("SELECT rule_id FROM insights WHERE run_id=1")}
    con.close()
    assert CASES[script] <= fired, (fired, proc.stdout)
    assert "gpuprof · " in proc.stdout
