"""GPU telemetry through the real NVML dlopen path (fake libnvidia-ml.so.1 driven by a
scenario file), the mock backend, graceful fallback, and host telemetry from /proc."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import gpuprof
from gpuprof_testutil import cuda_available

# runs.gpu_count is the GPUs this process trains on: with CUDA in torch one device (one rank per
# GPU, docs/schema.md), otherwise every GPU the collector found. The gpus table lists them all.
TRAINS_ON_ONE_CUDA_DEVICE = cuda_available()


def idle_run(db, seconds: float = 0.6, **kwargs) -> gpuprof.Profile:
    with gpuprof.profile("telemetry", db=db.path, summary=False, **kwargs) as prof:
        time.sleep(seconds)
    return prof


def test_nvml_fields_are_sampled_per_gpu(db, fake_nvml):
    # GIVEN a driver reporting two H100s, rising utilization, and memory used by this process
    fake_nvml("""
        devices 2
        gpu * name NVIDIA H100 80GB HBM3
        gpu * util 10..90/20
        gpu * mem_used 2000000000
        gpu * power 350000
        gpu * temp 61
        gpu * sm_clock 1755
        gpu * sm_clock_max 1980
        gpu * pcie_rx 1000
        gpu 0 process self 123456789
    """)
    # WHEN a run samples at 100 Hz
    idle_run(db, gpu="nvml", sample_hz=100)
    # THEN the run knows its GPUs
    assert db.one("SELECT gpu_backend, gpu_model, gpu_count FROM runs") == (
        "nvml", "NVIDIA H100 80GB HBM3", 1 if TRAINS_ON_ONE_CUDA_DEVICE else 2)
    assert db.one("SELECT count(*) FROM gpus") == 2
    # AND both GPUs have many samples with the scripted values
    for gpu in (0, 1):
        rows = db.rows("SELECT util_pct, mem_used_bytes, power_mw, temp_c, sm_clock_mhz, "
                       "pcie_rx_bps FROM gpu_samples WHERE gpu_index=? ORDER BY ts_ns", gpu)
        assert len(rows) >= 20, len(rows)
        assert rows[0][0] < rows[-1][0] <= 90
        assert all(r[1:5] == (2000000000, 350000, 61.0, 1755) for r in rows)
        # PCIe is read at most once a second (the driver call blocks ~20 ms): the first tick
        # has it, the ticks in between leave it unmeasured (NULL), never 0
        assert rows[0][5] == 1000 * 1024.0
        assert all(r[5] in (None, 1000 * 1024.0) for r in rows)
    # AND per-process device memory is this process's on GPU 0 and none on GPU 1
    assert set(r[0] for r in db.rows(
        "SELECT proc_mem_bytes FROM gpu_samples WHERE gpu_index=0")) == {123456789}
    assert set(r[0] for r in db.rows(
        "SELECT proc_mem_bytes FROM gpu_samples WHERE gpu_index=1")) == {0}
    assert db.one("SELECT available, backend FROM telemetry_status WHERE source='gpu'") == (
        1, "nvml")


def test_not_supported_fields_are_null_with_one_diagnostic(db, fake_nvml):
    fake_nvml("""
        devices 1
        gpu 0 util 50
        gpu 0 not_supported power
    """)
    idle_run(db, gpu="nvml")
    # THEN power is NULL (not 0) in every sample while utilization is present
    rows = db.rows("SELECT power_mw, util_pct FROM gpu_samples")
    assert rows and all(p is None and u == 50.0 for p, u in rows)
    notes = [r[0] for r in db.rows("SELECT message FROM diagnostics WHERE source='gpu'")]
    assert sum("power" in n for n in notes) == 1, notes


def test_field_failing_mid_run_becomes_null_from_then_on(db, fake_nvml):
    fake_nvml("""
        devices 1
        gpu 0 temp 70
        gpu 0 fail temp after 5
    """)
    idle_run(db, gpu="nvml", sample_hz=100)
    temps = [r[0] for r in db.rows("SELECT temp_c FROM gpu_samples ORDER BY ts_ns")]
    assert temps[:5] == [70.0] * 5
    assert len(temps) > 10 and all(t is None for t in temps[5:])
    notes = [r[0] for r in db.rows("SELECT message FROM diagnostics WHERE source='gpu'")]
    assert any("temp" in n for n in notes), notes


def test_no_driver_marks_gpu_telemetry_unavailable_and_run_continues(db, monkeypatch, capsys):
    # GIVEN a machine where libnvidia-ml cannot be loaded
    monkeypatch.setenv("GPUPROF_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
    # WHEN a run uses the default backend
    prof = idle_run(db, seconds=0.2)
    # THEN the run completes, has no GPU samples, and says why
    assert db.one("SELECT status, gpu_backend FROM runs") == ("ok", "none")
    assert db.one("SELECT count(*) FROM gpu_samples") == 0
    available, reason = db.one(
        "SELECT available, reason FROM telemetry_status WHERE source='gpu'")
    assert available == 0 and "libnvidia-ml.so.1" in reason
    assert prof.run_id == 1


def test_mock_backend_scripts_several_gpus(db):
    idle_run(db, gpu="mock", mock_gpus=4, sample_hz=50)
    assert db.one("SELECT gpu_backend, gpu_count FROM runs") == (
        "mock", 1 if TRAINS_ON_ONE_CUDA_DEVICE else 4)
    assert db.one("SELECT count(*) FROM gpus") == 4
    per_gpu = db.rows("SELECT gpu_index, count(*), min(util_pct), max(util_pct) "
                      "FROM gpu_samples GROUP BY gpu_index ORDER BY gpu_index")
    assert [r[0] for r in per_gpu] == [0, 1, 2, 3]
    assert all(r[1] >= 10 and 0 <= r[2] <= r[3] <= 100 for r in per_gpu)


class Squares(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        s = 0
        for k in range(20000):  # burn CPU in the worker
            s += k * i
        return torch.tensor([float(i)])


def test_host_telemetry_sees_dataloader_workers(db):
    # GIVEN a DataLoader with two worker processes
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
    with gpuprof.profile("host", db=db.path, gpu="none", host_hz=20, summary=False):
        for _ in range(3):
            for _batch in loader:
                pass
        # (the process tree is rescanned once per second; persistent workers stay alive)
        time.sleep(1.5)
    # THEN host samples carry CPU, memory and page cache
    cpu, mem, total, cache = db.rows(
        "SELECT cpu_pct, mem_used_bytes, mem_total_bytes, page_cache_bytes FROM host_samples "
        "WHERE cpu_pct IS NOT NULL ORDER BY ts_ns DESC LIMIT 1")[0]
    assert 0 <= cpu <= 100 and 0 < mem <= total and cache >= 0
    # AND the process tree includes the main process and two child workers
    pids = db.rows("SELECT role, count(DISTINCT pid) FROM worker_samples GROUP BY role")
    roles = dict(pids)
    assert roles.get("main") == 1
    assert roles.get("child", 0) >= 2


@pytest.mark.parametrize("kwargs, reason", [
    (dict(host=False), "host telemetry disabled (host=False)"),
    (dict(host_hz=0), "host telemetry disabled (host_hz=0)"),
    (dict(host=False, host_hz=0), "host telemetry disabled (host=False)"),
])
def test_disabled_host_telemetry_names_the_option_that_turned_it_off(db, kwargs, reason):
    # GIVEN host telemetry turned off by host=False or by a host rate of 0
    idle_run(db, seconds=0.3, gpu="none", **kwargs)
    # THEN no host samples are stored and the reason names the option the user passed
    assert db.one("SELECT COUNT(*) FROM host_samples") == 0
    assert db.one("SELECT available, reason FROM telemetry_status WHERE source='host'") == (
        0, reason)
