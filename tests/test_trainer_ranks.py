"""The trainer callbacks under the trainers' own distributed launch, two ranks on CPU (gloo):
Lightning's ddp strategy (it starts the second process itself) and the Hugging Face Trainer
under torchrun. Each rank records its own run with its rank, the two runs share a group, and
each holds that rank's optimizer steps (320 samples / 16 per batch / 2 ranks)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def launch(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def check_ranks(db: Path, out: str) -> None:
    # The ranks share one stdout: their lines may run together ("RANK 0 RUN 2RANK 1 RUN 1").
    assert sorted(re.findall(r"RANK (\d+) RUN \d+", out)) == ["0", "1"], out
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        runs = con.execute("SELECT run_id, rank, world_size, group_id, status FROM runs "
                           "ORDER BY rank").fetchall()
        steps = {r[1]: con.execute("SELECT COUNT(*) FROM steps WHERE run_id=?",
                                   (r[0],)).fetchone()[0] for r in runs}
    finally:
        con.close()
    assert [(r[1], r[2], r[4]) for r in runs] == [(0, 2, "ok"), (1, 2, "ok")], runs
    assert runs[0][3] and runs[0][3] == runs[1][3], runs  # one group
    assert steps == {0: 10, 1: 10}, steps


def test_lightning_ddp_ranks_each_record_a_run_of_one_group(tmp_path):
    pytest.importorskip("lightning")
    db = tmp_path / "l.db"
    out = launch([sys.executable, str(HERE / "trainer_ranks.py"), "lightning", str(db)],
                 tmp_path)
    check_ranks(db, out)


def test_hf_trainer_ranks_under_torchrun_each_record_a_run_of_one_group(tmp_path):
    pytest.importorskip("transformers")
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun not next to this interpreter")
    db = tmp_path / "h.db"
    out = launch([str(torchrun), "--nproc-per-node=2", "--master-port=29551",
                  str(HERE / "trainer_ranks.py"), "hf", str(db)], tmp_path)
    check_ranks(db, out)
