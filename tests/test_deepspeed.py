"""gpuprof.wrap_deepspeed_engine against the real DeepSpeed (0.19, CPU accelerator, gloo):
steps are optimizer steps (gradient accumulation makes one), engine.eval() ... engine.train()
is kept out of the steps, the FLOP count works, each rank of a torchrun launch records its own
run in one group, and anything that is not an engine is refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gpuprof_testutil import db_rows as rows
import gpuprof

pytest.importorskip("deepspeed")

HERE = Path(__file__).resolve().parent


def run(cmd: list[str], env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", **(env_extra or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def micro_batch_flops() -> int:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    with FlopCounterMode(display=False) as counter:
        nn.functional.mse_loss(model(torch.randn(16, 64)), torch.randn(16, 1)).backward()
    return counter.get_total_flops()


def test_an_engine_run_has_optimizer_steps_and_its_evaluations_apart(tmp_path):
    db = tmp_path / "ds.db"
    run([sys.executable, str(HERE / "deepspeed_train.py"), str(db)],
        {"DS_TEST_PORT": "29541"})
    (run_id, status, rank, world, flops, method), = rows(
        db, "SELECT run_id, status, rank, world_size, flops_per_step, flops_method FROM runs")
    assert (status, rank, world) == ("ok", 0, 1)
    assert rows(db, "SELECT forward_calls, backward_calls, optimizer_calls FROM steps "
                    "WHERE run_id=?", run_id) == [(2, 2, 1)] * 10
    (diag,), = rows(db, "SELECT message FROM diagnostics WHERE source='evaluation'")
    assert diag.startswith("evaluation: 2 loops") and "6 forward calls" in diag
    assert (flops, method) == (2 * micro_batch_flops(), "counted")


@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
                    reason="torchrun not next to this interpreter")
def test_each_rank_of_a_torchrun_launch_records_itself_in_one_group(tmp_path):
    db = tmp_path / "ds.db"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = run([torchrun, "--nproc-per-node=2", "--master-port=29542",
                str(HERE / "deepspeed_train.py"), str(db)], {"OMP_NUM_THREADS": "1"})
    assert sorted(int(ln.split()[2]) for ln in proc.stdout.splitlines()
                  if ln.startswith("RUN ")) == [0, 1]
    got = rows(db, "SELECT rank, world_size, group_id, status FROM runs ORDER BY rank")
    assert [(r[0], r[1], r[3]) for r in got] == [(0, 2, "ok"), (1, 2, "ok")]
    assert got[0][2] and got[0][2] == got[1][2]  # one group, agreed by the ranks
    for rank in (0, 1):
        assert rows(db, "SELECT COUNT(*) FROM steps s JOIN runs r USING (run_id) "
                        "WHERE r.rank=?", rank) == [(10,)]


def test_what_is_not_an_engine_is_refused(tmp_path):
    with pytest.raises(TypeError, match="not a DeepSpeed engine"):
        gpuprof.wrap_deepspeed_engine(nn.Linear(2, 2), "x", db=str(tmp_path / "x.db"))
    assert not (tmp_path / "x.db").exists()
