"""The native `gpuprof` CLI on runs written through the public API."""

from __future__ import annotations

import torch
from torch import nn

import gpuprof
from gpuprof_testutil import run_cli


def record_run(db_path, name="cli", steps=5):
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile(name, db=db_path, gpu="none", summary=False) as prof:
        for _ in range(steps):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    return prof


def test_insights_latest_run_in_default_db(tmp_path):
    # GIVEN two runs in ./gpuprof.db
    record_run(tmp_path / "gpuprof.db", "first", 3)
    record_run(tmp_path / "gpuprof.db", "second", 4)
    # WHEN `gpuprof insights` runs in that directory with no arguments
    proc = run_cli("insights", cwd=tmp_path, check=True)
    # THEN it reports the latest run
    assert "second" in proc.stdout
    assert "4 steps" in proc.stdout


def test_insights_for_a_given_run(tmp_path):
    db = tmp_path / "runs.db"
    first = record_run(db, "first", 3)
    record_run(db, "second", 4)
    proc = run_cli("insights", str(db), str(first.run_id), check=True)
    assert "first" in proc.stdout and "3 steps" in proc.stdout


def test_insights_json(tmp_path):
    import json
    db = tmp_path / "j.db"
    prof = record_run(db, "json-run", 6)
    proc = run_cli("insights", str(db), str(prof.run_id), "--json", check=True)
    doc = json.loads(proc.stdout)
    assert "insights" in doc
    assert json.dumps(doc).count("json-run") >= 1


def test_missing_db_is_a_clear_error(tmp_path):
    proc = run_cli("insights", str(tmp_path / "nope.db"))
    assert proc.returncode != 0
    assert "nope.db" in proc.stderr


def test_unknown_run_is_a_clear_error(tmp_path):
    db = tmp_path / "u.db"
    record_run(db)
    proc = run_cli("insights", str(db), "999")
    assert proc.returncode != 0
    assert "999" in proc.stderr


def test_version_and_help():
    v = run_cli("version", check=True)
    assert gpuprof.__version__ in v.stdout
    for sub in ([], ["insights"], ["version"], ["rules"]):
        h = run_cli(*sub, "--help", check=True)
        assert "Usage" in h.stdout or "usage" in h.stdout.lower()


def test_rules_markdown_lists_the_registry():
    proc = run_cli("rules", "--markdown", check=True)
    for rule in ("dataloader_stall", "compilation_warmup", "first_step_outlier",
                 "high_step_variance", "kernel_launch_overhead", "low_mfu"):
        assert rule in proc.stdout


def test_lone_latest_is_the_latest_run_of_the_default_db(tmp_path):
    # GIVEN two runs in ./gpuprof.db
    record_run(tmp_path / "gpuprof.db", "first", 3)
    record_run(tmp_path / "gpuprof.db", "second", 4)
    # WHEN `gpuprof insights latest` runs there
    proc = run_cli("insights", "latest", cwd=tmp_path, check=True)
    # THEN it is the same report as for the latest run named in full
    assert "second" in proc.stdout and "4 steps" in proc.stdout
    assert proc.stdout == run_cli("insights", "gpuprof.db", "2", cwd=tmp_path, check=True).stdout


def test_usage_errors_exit_2_data_errors_1(tmp_path):
    record_run(tmp_path / "h.db")
    for args in (["bogus"], ["rules", "--bogus"], ["insights", "h.db", "1", "extra"],
                 ["insights", "h.db", "seven"]):
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr and not proc.stdout
    assert run_cli("insights", "h.db", "999", cwd=tmp_path).returncode == 1
    assert run_cli("insights", "--help", cwd=tmp_path).returncode == 0
