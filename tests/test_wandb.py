"""profile(wandb=True) with the real wandb package in offline mode: MFU (or why not), the step
breakdown and the insights land in the active run's summary and two tables; without an active
run it is a no-op with one info line; a wandb failure never reaches the training."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

wandb = pytest.importorskip("wandb")

TRAIN = textwrap.dedent("""
    import json, os, sys, time
    import torch
    from torch import nn
    import gpuprof
    mode = sys.argv[1]
    if mode != "none":
        import wandb
        run = wandb.init(project="gpuprof-test", mode="offline", dir=sys.argv[2])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(320, 32), torch.randn(320, 1)), batch_size=32)
    with gpuprof.profile("wb", db=os.path.join(sys.argv[2], "w.db"), gpu="none",
                         summary=False, wandb=True) as prof:
        for _ in range(2):
            for x, y in data:
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                time.sleep(0.004)
    if mode != "none":
        summary = {k: v for k, v in dict(run.summary).items() if k.startswith("gpuprof/")}
        print("SUMMARY " + json.dumps(summary, default=str))
        wandb.finish()
    print("RUN", prof.run_id)
""")


def run_script(tmp_path, mode: str) -> subprocess.CompletedProcess:
    env = {"WANDB_SILENT": "true", "WANDB_MODE": "offline", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    import os
    env = {**os.environ, **env}
    proc = subprocess.run([sys.executable, "-c", TRAIN, mode, str(tmp_path)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_run_is_logged_into_the_active_wandb_run(tmp_path):
    proc = run_script(tmp_path, "offline")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("SUMMARY ")][0]
    summary = json.loads(line[len("SUMMARY "):])
    assert summary["gpuprof/steps"] == 20
    assert summary["gpuprof/status"] == "ok"
    assert summary["gpuprof/step_p50_ms"] > 0
    assert "mfu" not in {k.split("/", 1)[1] for k in summary}  # a CPU run: unknown, said why
    assert "CPU run" in summary["gpuprof/mfu_unknown"]
    assert summary["gpuprof/flops_per_step"] > 0
    parts = {k.split("/")[-1]: v for k, v in summary.items() if "/breakdown/" in k}
    assert {"loader_wait", "forward", "backward", "optimizer", "other"} <= set(parts)
    assert abs(sum(parts.values()) - 1.0) < 1e-6
    assert summary["gpuprof/insights_count"] >= 0
    # the tables are in the offline run's files
    tables = list(tmp_path.glob("wandb/offline-run-*/files/media/table/gpuprof/*.table.json"))
    names = sorted(p.name.split("_")[0] for p in tables)
    assert names == ["insights", "step"], tables
    breakdown = json.loads([p for p in tables if p.name.startswith("step")][0].read_text())
    assert breakdown["columns"] == ["part", "share", "mean_ms_per_step"]
    assert [r[0] for r in breakdown["data"]][:2] == ["loader_wait", "forward"]


def test_without_an_active_run_it_is_one_info_line(tmp_path):
    proc = run_script(tmp_path, "none")
    lines = [ln for ln in proc.stderr.splitlines() if "wandb" in ln]
    assert lines == ["gpuprof: wandb=True but there is no active wandb run (call wandb.init() "
                     "before the profile ends); nothing logged"], proc.stderr


def test_wandb_must_be_a_bool(tmp_path):
    import gpuprof
    with pytest.raises(TypeError, match="wandb"):
        gpuprof.profile("x", db=str(tmp_path / "x.db"), wandb="yes")


def test_a_wandb_failure_is_a_warning_not_an_exception(tmp_path, monkeypatch):
    import types

    import torch

    import gpuprof

    class BrokenSummary(dict):
        def __setitem__(self, key, value):
            raise OSError("wandb backend went away")

    fake = types.SimpleNamespace(run=types.SimpleNamespace(summary=BrokenSummary()))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(gpuprof.GpuprofWarning, match="wandb failed.*went away"):
        with gpuprof.profile("wb", db=str(tmp_path / "w.db"), gpu="none", summary=False,
                             wandb=True) as prof:
            for _ in range(3):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
    assert prof.run_id is not None
