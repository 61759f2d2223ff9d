"""AWS Neuron telemetry through gpuprof.profile(gpu="neuron"): the real child-process path
against the scripted fake neuron-monitor (cpp/core/telemetry/fake_neuron/neuron-monitor).
No torch needed (auto=False)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import gpuprof

REPO = Path(__file__).resolve().parent.parent
FAKE_NEURON = REPO / "cpp" / "core" / "telemetry" / "fake_neuron" / "neuron-monitor"


@pytest.fixture
def fake_neuron(monkeypatch):
    """use(KEY=value, ...) points gpuprof at the fake monitor with that scenario
    (GPUPROF_FAKE_NEURON_<KEY>, documented at the top of the script)."""

    def use(**scenario: object) -> None:
        monkeypatch.setenv("GPUPROF_NEURON_MONITOR", str(FAKE_NEURON))
        for key, value in scenario.items():
            monkeypatch.setenv("GPUPROF_FAKE_NEURON_" + key.upper(), str(value))

    return use


def idle_run(db, seconds: float = 0.5, **kwargs) -> gpuprof.Profile:
    with gpuprof.profile("neuron", db=db.path, auto=False, summary=False, **kwargs) as prof:
        time.sleep(seconds)
    return prof


def test_neuron_cores_are_sampled_with_this_processs_memory(db, fake_neuron):
    # GIVEN a Trainium instance with two NeuronCores: this process's runtime on core 0 at 60%
    # holding 3 MB, a stranger's on core 1 at 90% holding 5 MB
    fake_neuron(devices=1, cores=2,
                runtimes="pid=parent,cores=0,util=60,mem=3000000;"
                         "pid=4242,cores=1,util=90,mem=5000000")
    # WHEN a run samples at 100 Hz
    idle_run(db, gpu="neuron", sample_hz=100)
    # THEN the run's GPUs are the NeuronCores
    assert db.one("SELECT gpu_backend, gpu_model, gpu_count FROM runs") == (
        "neuron", "AWS NeuronCore-v2 0", 2)
    assert db.rows("SELECT gpu_index, name FROM gpus ORDER BY gpu_index") == [
        (0, "AWS NeuronCore-v2 0"), (1, "AWS NeuronCore-v2 1")]
    assert db.one("SELECT available, backend FROM telemetry_status WHERE source='gpu'") == (
        1, "neuron")
    # AND every sample carries the monitor's values: utilization per core, device memory of
    # every runtime, and per-process memory of ours only
    for core, util, used, ours in ((0, 60.0, 3000000, 3000000), (1, 90.0, 5000000, 0)):
        rows = db.rows("SELECT util_pct, mem_used_bytes, proc_mem_bytes, power_mw, temp_c "
                       "FROM gpu_samples WHERE gpu_index=?", core)
        assert len(rows) >= 10, rows
        assert set(rows) == {(util, used, ours, None, None)}


def test_neuron_requested_without_the_tool_is_unavailable_with_the_reason(db, monkeypatch,
                                                                           tmp_path):
    # GIVEN no neuron-monitor where gpuprof is told to look
    monkeypatch.setenv("GPUPROF_NEURON_MONITOR", str(tmp_path / "bin" / "neuron-monitor"))
    # WHEN a run asks for Neuron telemetry
    idle_run(db, seconds=0.1, gpu="neuron")
    # THEN the run completes without GPU samples and says what to install
    assert db.one("SELECT status, gpu_backend FROM runs") == ("ok", "none")
    available, reason = db.one(
        "SELECT available, reason FROM telemetry_status WHERE source='gpu'")
    assert available == 0
    assert reason == ("gpu_backend='neuron' was requested but neuron-monitor not found (tried "
                      f"{tmp_path / 'bin' / 'neuron-monitor'} from $GPUPROF_NEURON_MONITOR): "
                      "install aws-neuronx-tools")


def test_monitor_exiting_mid_run_is_a_diagnostic_and_sampling_stops(db, fake_neuron):
    # GIVEN a monitor that dies after five reports (20 ms apart)
    fake_neuron(runtimes="pid=parent,cores=0,util=30,mem=1000", exit_after=5,
                exit_message="nrt: device reset")
    # WHEN a run outlives it
    idle_run(db, seconds=0.6, gpu="neuron", sample_hz=100)
    # THEN the early samples exist, none after the exit, and one diagnostic says what happened
    n = db.one("SELECT count(*) FROM gpu_samples WHERE gpu_index=0")
    assert 1 <= n < 50, n
    notes = [r[0] for r in db.rows("SELECT message FROM diagnostics WHERE source='gpu'")]
    assert sum("neuron-monitor exited (exit status 3; stderr: nrt: device reset)" in m
               for m in notes) == 1, notes
