"""linescope's native sampler with AWS Neuron telemetry (GPUPROF_GPU_BACKEND=neuron), against
the scripted fake neuron-monitor."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from linescope import profile

REPO = Path(__file__).resolve().parents[2]
FAKE_NEURON = REPO / "cpp" / "core" / "telemetry" / "fake_neuron" / "neuron-monitor"


def spin_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.fixture
def neuron(monkeypatch):
    """use(KEY=value, ...): the sampler's GPU backend is Neuron via the fake monitor."""

    def use(**scenario: object) -> None:
        monkeypatch.setenv("GPUPROF_GPU_BACKEND", "neuron")
        monkeypatch.setenv("GPUPROF_NEURON_MONITOR", str(FAKE_NEURON))
        for key, value in scenario.items():
            monkeypatch.setenv("GPUPROF_FAKE_NEURON_" + key.upper(), str(value))

    return use


def run(ws, fn, *args, **options):
    options.setdefault("root", ws.root)
    options.setdefault("display", "none")
    options.setdefault("backend", "sampler")
    options.setdefault("include", [__file__])
    with profile(**options) as session:
        fn(*args)
    return session.result


def test_neuroncore_time_and_memory_are_attributed_to_the_line(ws, neuron):
    # GIVEN two NeuronCores: ours at 60% holding 3 MB, a stranger's at 90%
    neuron(devices=1, cores=2,
           runtimes="pid=parent,cores=0,util=60,mem=3000000;pid=4242,cores=1,util=90,mem=7")
    # WHEN a line runs for 0.4 s with gpu=True
    r = run(ws, spin_for, 0.4, gpu=True)
    lines = [s for s in r.lines if s.filename == __file__ and s.gpu and s.gpu.time_ns]
    busy = sum(s.gpu.time_ns for s in lines)
    wall = sum(s.wall_time_ns for s in lines)
    # THEN its GPU time is our core's 60% of the driver time (the stranger's core does not
    # count), and its peak device memory is our runtime's
    assert busy == pytest.approx(0.6 * wall, rel=0.2)
    assert max(s.gpu.peak_memory_bytes for s in lines) == 3000000
    g = r.gpu
    assert g.method == "neuron-sampled" and g.time_available and g.memory_available
    assert g.devices == ["AWS NeuronCore-v2 0", "AWS NeuronCore-v2 1"]
    assert not any("unavailable" in w for w in r.warnings)


def test_neuron_without_the_tool_is_unavailable_and_cpu_profiling_continues(ws, neuron,
                                                                             monkeypatch,
                                                                             tmp_path):
    neuron()
    monkeypatch.setenv("GPUPROF_NEURON_MONITOR", str(tmp_path / "none"))
    r = run(ws, spin_for, 0.1, gpu=True)
    assert sum(s.wall_time_ns for s in r.lines if s.filename == __file__) > 0
    g = r.gpu
    assert not g.time_available and not g.memory_available
    assert "neuron-monitor not found" in g.time_reason
    assert "install aws-neuronx-tools" in g.memory_reason
    assert sum("GPU" in w for w in r.warnings) == 1
