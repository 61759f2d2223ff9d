"""The native `sampler` backend through the public API: time, CPU time and samples per line,
function totals, GPU collection through the real NVML loading path (fake libnvidia-ml.so.1),
and the unavailable reasons when there is no GPU."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuprof_testutil import native_build_dir
from linescope import GPUStats, profile

MS = 1_000_000
REPO = Path(__file__).resolve().parents[2]


def run(ws, fn, *args, **options):
    options.setdefault("root", ws.root)
    options.setdefault("display", "none")
    options.setdefault("backend", "sampler")
    with profile(**options) as session:
        fn(*args)
    return session.result


@pytest.fixture
def work(ws):
    return ws.module("work.py", """
        import time

        def hot(n):
            s = 0
            for i in range(n):
                s += i % 7
            return s

        def outer():
            hot(600_000)
            time.sleep(0.12)
            return 1
    """)


def spin_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_hot_line_and_sleep_line_get_their_time(ws, work):
    # WHEN a CPU-bound loop and a 120 ms sleep run under the sampler
    r = run(ws, work.outer)
    path = str(ws.root / "work.py")
    loop, sleep = r.line(path, 6), r.line(path, 11)
    # THEN the loop body and the sleep line carry the time, sampled (hits unknown, not 0)
    assert loop is not None and sleep is not None
    assert loop.hits is None and loop.samples >= 5
    assert sleep.wall_time_ns >= 100 * MS
    # AND the sleep burned almost no CPU while the loop did
    assert sleep.cpu_time_ns < 0.3 * sleep.wall_time_ns
    assert loop.cpu_time_ns > 0 and loop.cpu_time_ns <= loop.wall_time_ns + 2 * MS
    # AND the intervals tile the session: line times add up to the elapsed time
    total = sum(s.wall_time_ns for s in r.lines) + r.metadata["unattributed_ns"]
    assert abs(total - r.run.elapsed_ns) < 5 * MS
    # AND no memory or GPU values were asked for, so none exist
    assert all(s.memory_bytes is None and s.gpu is None for s in r.lines)
    assert r.memory is None and r.gpu is None


def test_function_own_and_total_time(ws, work):
    r = run(ws, work.outer)
    outer, hot = r.function("outer"), r.function("hot")
    # THEN hot's time is its own; outer's total includes hot and the sleep
    assert hot.total_time_ns == hot.own_time_ns > 0
    assert outer.total_time_ns >= hot.total_time_ns + 100 * MS
    assert outer.own_time_ns >= 100 * MS  # the sleep line is outer's own
    assert outer.calls is None  # a sampler does not count calls


def test_time_in_a_dependency_goes_to_the_calling_line(ws, tmp_path, monkeypatch):
    # GIVEN a pure-Python dependency outside the root
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "slowdep_s.py").write_text(
        "import time\ndef work():\n    end = time.perf_counter() + 0.15\n"
        "    while time.perf_counter() < end:\n        pass\n")
    monkeypatch.syspath_prepend(str(deps))
    mod = ws.module("user_s.py", """
        import slowdep_s
        def main():
            slowdep_s.work()
            return 2
    """)
    r = run(ws, mod.main)
    # THEN its time is on the user line that called it, and no dependency line is recorded
    assert r.line(str(ws.root / "user_s.py"), 3).wall_time_ns >= 120 * MS
    assert not any("slowdep_s" in s.filename for s in r.lines)


def test_sample_rate_sets_the_interval_and_is_validated(ws):
    mod = ws.module("rate.py", """
        import time
        def f():
            time.sleep(0.01)
    """)
    r = run(ws, lambda: [mod.f() for _ in range(20)], sample_rate=200)
    assert r.metadata["sample_interval_ns"] == 5 * MS
    assert r.options["sample_rate"] == 200.0
    with pytest.raises(ValueError, match="above the sampler's maximum"):
        profile(backend="sampler", sample_rate=1e6, display="none").start()


def test_the_sampler_needs_the_main_thread(ws):
    errors = []

    def body():
        try:
            profile(backend="sampler", root=ws.root, display="none").start()
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert errors and "samples the main thread" in errors[0]
    with profile(display="none"):  # nothing was left active
        pass


def test_no_signal_is_taken_and_busy_python_threads_do_not_starve_sampling(ws, work):
    # GIVEN another Python thread that keeps the interpreter switching the GIL
    import signal

    stop = threading.Event()

    def churn():
        x = 0
        while not stop.is_set():
            x += 1

    before = {s: signal.getsignal(s) for s in (signal.SIGURG, signal.SIGALRM, signal.SIGPROF)}
    t = threading.Thread(target=churn)
    t.start()
    threads_before = set(threading.enumerate())
    seen = {}

    def profiled():
        seen["threads"] = set(threading.enumerate())
        seen["timers"] = (signal.getitimer(signal.ITIMER_REAL), signal.getitimer(signal.ITIMER_PROF))
        work.outer()

    try:
        r = run(ws, profiled)
    finally:
        stop.set()
        t.join()
    # THEN the main thread was still sampled regularly (a GIL switch on the other thread can
    # clear the main thread's evaluation breaker; the sampler re-sets it): the busy line got
    # at least one sample per 4 ms of its time at the 1 kHz default — the other thread holds
    # the GIL about half of the time, and a starved sampler gets one or two in all
    loop = r.line(str(ws.root / "work.py"), 6)
    assert loop is not None and loop.samples >= 5
    assert loop.samples >= loop.wall_time_ns / (4 * MS)
    # AND nothing the program could see was installed: no signal handler, no interval timer,
    # no thread visible to `threading`; the metadata names the mechanism and its wake-ups
    assert before == {s: signal.getsignal(s) for s in before}
    assert seen["timers"] == ((0.0, 0.0), (0.0, 0.0))
    assert seen["threads"] == threads_before
    assert r.metadata["sampler"] == "pending-call"
    assert r.metadata["sampler_wakeups"] >= r.metadata["samples"]


def test_gpu_without_a_driver_is_unavailable_with_the_reason(ws, work, monkeypatch, tmp_path):
    # GIVEN no NVIDIA driver (an NVML path that does not exist)
    monkeypatch.setenv("GPUPROF_NVML_LIBRARY", str(tmp_path / "no" / "libnvidia-ml.so.1"))
    # WHEN gpu=True
    r = run(ws, work.outer, gpu=True)
    # THEN CPU profiling continued and GPU values are unknown with the reason recorded
    loop = r.line(str(ws.root / "work.py"), 6)
    assert loop.wall_time_ns > 0 and loop.cpu_time_ns > 0
    assert loop.gpu == GPUStats(time_ns=None, peak_memory_bytes=None)
    g = r.gpu
    assert g.method is None and not g.time_available and not g.memory_available
    assert "cannot load" in g.memory_reason and "libnvidia-ml.so.1" in g.memory_reason
    assert any("GPU measurements unavailable" in w for w in r.warnings)
    assert sum("GPU" in w for w in r.warnings) == 1  # said once


def test_the_mock_gpu_collector_is_said_to_be_simulated(ws, work, monkeypatch, tmp_path):
    # GIVEN gpuprof's mock collector selected (as for gpuprof demos)
    monkeypatch.setenv("GPUPROF_GPU_BACKEND", "mock")
    r = run(ws, work.outer, gpu=True, output=tmp_path / "mock.html")
    # THEN its numbers are not passed off as measurements: the method, the first warning and
    # the report's label say they are simulated
    assert r.gpu.method == "mock-sampled"
    assert r.warnings[0].startswith("GPU values are simulated: GPUPROF_GPU_BACKEND=mock")
    from linescope_report_util import read_payload
    label = read_payload(tmp_path / "mock.html")["gpu"]["method_label"]
    assert label.startswith("simulated by gpuprof's mock GPU collector") and "not measured" in label


def test_gpu_time_is_utilization_times_time_and_memory_is_per_process(ws, fake_nvml):
    # GIVEN one GPU at a constant 60% with this process holding 3 GiB on it
    fake_nvml("""
        devices 1
        gpu * name NVIDIA H200
        gpu * util 60
        gpu 0 process self 3221225472
    """)
    mod = ws.spin_module("gpuwork.py")
    # WHEN a line runs for 0.4 s
    r = run(ws, mod.spin, 0.4, gpu=True)
    hot = r.line(str(ws.root / "gpuwork.py"), 4)
    # THEN its GPU time is ~60% of its driver time, a separate quantity
    assert hot.gpu.time_ns == pytest.approx(0.6 * hot.wall_time_ns, rel=0.15)
    # AND its GPU peak memory is this process's device memory
    assert hot.gpu.peak_memory_bytes == 3221225472
    g = r.gpu
    assert g.method == "nvml-sampled" and g.time_available and g.memory_available
    assert g.devices == ["NVIDIA H200"] and g.utilization_scope == "device"
    assert any("other processes" in d for d in g.diagnostics)
    assert not any("unavailable" in w for w in r.warnings)


def test_gpu_time_is_this_processes_own_utilization_when_the_driver_reports_it(ws, fake_nvml):
    # GIVEN a GPU at 90% where this process's own share is 30% (another process runs the
    # rest), with per-process samples every 1/6 s as drivers record them
    fake_nvml("""
        devices 1
        gpu * name NVIDIA H200
        gpu * util 90
        gpu 0 process self 1000000
        gpu 0 process_util self 30
        gpu 0 process_util 4242 60
        gpu 0 process_util_period 167
    """)
    mod = ws.spin_module("ownwork.py")
    # WHEN a line runs for 0.5 s
    r = run(ws, mod.spin, 0.5, gpu=True)
    hot = r.line(str(ws.root / "ownwork.py"), 4)
    # THEN its GPU time is ~30% of its driver time: this process's share, not the device's 90%
    assert hot.gpu.time_ns == pytest.approx(0.3 * hot.wall_time_ns, rel=0.15)
    # AND the collection says the utilization was per-process, and not that others are included
    g = r.gpu
    assert g.method == "nvml-sampled" and g.time_available
    assert g.utilization_scope == "process"
    assert any("this process's own utilization (NVML per-process accounting)" in d
               for d in g.diagnostics)
    assert not any("other processes" in d for d in g.diagnostics)


def test_per_process_utilization_not_supported_stays_device_wide_and_says_so(ws, fake_nvml):
    # GIVEN a GPU at 70% whose driver does not support per-process utilization (MIG, vGPU, ...)
    fake_nvml("""
        devices 1
        gpu * util 70
        gpu 0 process self 1000000
        gpu 0 process_util self 20
        gpu 0 not_supported proc_util
    """)
    r = run(ws, spin_for, 0.3, gpu=True, include=[__file__])
    here = [s for s in r.lines if s.filename == __file__ and s.gpu and s.gpu.time_ns]
    busy = sum(s.gpu.time_ns for s in here)
    wall = sum(s.wall_time_ns for s in here)
    # THEN GPU time is the device-wide 70% of the driver time
    assert busy == pytest.approx(0.7 * wall, rel=0.2)
    # AND the scope is the device, with the diagnostic that others can be included, and why
    g = r.gpu
    assert g.utilization_scope == "device"
    assert any("other processes" in d and "proc_util not supported by this device" in d
               for d in g.diagnostics)


def test_other_processes_gpus_do_not_count(ws, fake_nvml):
    # GIVEN two busy GPUs; this process holds memory only on GPU 1
    fake_nvml("""
        devices 2
        gpu * util 50
        gpu 1 process self 1000000
    """)
    r = run(ws, spin_for, 0.3, gpu=True, include=[__file__])
    here = [s for s in r.lines if s.filename == __file__ and s.gpu and s.gpu.time_ns]
    busy = sum(s.gpu.time_ns for s in here)
    wall = sum(s.wall_time_ns for s in here)
    # THEN only GPU 1's 50% counts (not 100% over both)
    assert busy == pytest.approx(0.5 * wall, rel=0.2)
    assert any("holds memory count (gpu1)" in d for d in r.gpu.diagnostics)


def test_a_process_without_gpu_memory_is_told_why_its_gpu_time_is_zero(ws, fake_nvml):
    # GIVEN a busy GPU on which only another process holds memory
    fake_nvml("""
        devices 1
        gpu * util 60
        gpu 0 process 4242 5000000000
    """)
    r = run(ws, spin_for, 0.2, gpu=True, include=[__file__])
    here = [s for s in r.lines if s.filename == __file__ and s.gpu]
    # THEN no GPU time is charged, and the warnings say why (not that other processes' work
    # may be included)
    assert here and all(s.gpu.time_ns == 0 for s in here)
    said = [w for w in r.warnings if "held no memory on any GPU" in w]
    assert len(said) == 1 and "GPU time 0" in said[0]
    assert not any("can include other processes' work" in w for w in r.warnings)
    assert any("held no memory on any GPU" in d for d in r.gpu.diagnostics)


def test_no_per_process_memory_keeps_time_and_says_why(ws, fake_nvml):
    # GIVEN a driver without per-process accounting (as with WDDM)
    fake_nvml("""
        devices 1
        gpu * util 40
        gpu * not_supported proc_mem
    """)
    r = run(ws, spin_for, 0.25, gpu=True, include=[__file__])
    g = r.gpu
    # THEN GPU time is still sampled, GPU peak memory is unknown with the reason
    assert g.time_available and not g.memory_available
    assert "per-process device memory" in g.memory_reason
    assert "time sampling continued" in g.memory_reason
    lines = [s for s in r.lines if s.filename == __file__]
    assert any(s.gpu.time_ns for s in lines)
    assert all(s.gpu.peak_memory_bytes is None for s in lines)
    assert any("GPU peak memory unavailable" in w for w in r.warnings)


def test_failing_gpu_reads_mid_run_are_diagnosed(ws, fake_nvml):
    # GIVEN a GPU whose utilization read fails from the 5th sample on
    fake_nvml("""
        devices 1
        gpu * util 70
        gpu 0 process self 1000
        gpu * fail util after 5
    """)
    r = run(ws, spin_for, 0.3, gpu=True, include=[__file__])
    # THEN the early samples have GPU time, and the failure is in the diagnostics
    assert r.gpu.time_available
    assert any("GPU collector" in d and "util" in d for d in r.gpu.diagnostics)
    assert r.run.elapsed_ns >= 250 * MS


@pytest.mark.parametrize("failure, warning", [
    ("gpu * fail util after 5",
     "GPU utilization reads failed in {k} of {n} readings (gpu0: Unknown Error (NVML error 999))"),
    ("gpu 0 fail proc_mem after 5",
     "GPU memory reads failed in {k} of {n} readings (gpu0: Unknown Error (NVML error 999))"),
    ("gpu * lost after 5",
     "GPU readings failed in {k} of {n} samples (gpu0 lost: GPU is lost (NVML error 15))"),
], ids=["utilization", "memory", "device-lost"])
def test_gpu_reads_failing_mid_run_are_in_the_warnings(ws, fake_nvml, failure, warning):
    # GIVEN a GPU whose reads start failing after the 5th sample
    fake_nvml(f"""
        devices 1
        gpu * util 70
        gpu 0 process self 2147483648
        {failure}
    """)
    r = run(ws, spin_for, 0.3, gpu=True, include=[__file__])
    # THEN the values of the early samples stay available
    assert r.gpu.time_available and r.gpu.memory_available
    assert r.gpu.time_reason is None and r.gpu.memory_reason is None
    # AND the failure, with its count and NVML's error, is in result.warnings, once
    head = warning.split(" {k}")[0] if "{k}" in warning else warning
    said = [w for w in r.warnings if w.startswith(head)]
    assert len(said) == 1, r.warnings
    if "{k}" in warning:
        import re
        m = re.search(r"in (\d+) of (\d+) ", said[0])
        k, n = int(m.group(1)), int(m.group(2))
        assert 0 < k < n
        assert said[0].startswith(warning.format(k=k, n=n))
    else:
        assert said[0].startswith(warning)
    assert "have no GPU" in said[0]
    assert said[0] in r.gpu.diagnostics
    assert r.run.elapsed_ns >= 250 * MS


def test_every_gpu_read_failing_names_the_nvml_error(ws, fake_nvml):
    # GIVEN a GPU whose utilization and per-process memory reads fail from the start
    fake_nvml("""
        devices 1
        gpu * util 70
        gpu 0 process self 2147483648
        gpu * fail util after 0
        gpu * fail proc_mem after 0
    """)
    r = run(ws, spin_for, 0.2, gpu=True, include=[__file__])
    g = r.gpu
    # THEN both are unavailable, and the reasons name the real cause, not "not supported"
    assert not g.time_available and not g.memory_available
    for reason in (g.time_reason, g.memory_reason):
        assert "Unknown Error (NVML error 999)" in reason
        assert "not supported" not in reason and "WDDM" not in reason
    assert g.time_reason.startswith("every GPU utilization read failed")
    assert g.memory_reason.startswith("every per-process device memory read failed")
    # AND the same reasons are in result.warnings, once each
    assert [w for w in r.warnings if "NVML error 999" in w] == [
        f"GPU time unavailable: {g.time_reason}", f"GPU peak memory unavailable: {g.memory_reason}"]
    # AND the lines have no GPU values (unknown, not 0)
    assert all(s.gpu.time_ns is None and s.gpu.peak_memory_bytes is None
               for s in r.lines if s.filename == __file__)


def test_device_wide_utilization_is_a_warning_once(ws, fake_nvml):
    # GIVEN a GPU whose driver gives no per-process utilization
    fake_nvml("devices 1\ngpu * util 60\ngpu 0 process self 1000000\n")
    r = run(ws, spin_for, 0.2, gpu=True, include=[__file__])
    # THEN result.warnings says once that other processes' work can be included
    assert r.gpu.utilization_scope == "device"
    assert sum("other processes' work" in w for w in r.warnings) == 1
    assert any(w.startswith("GPU utilization is device-wide") for w in r.warnings)


def test_per_process_utilization_has_no_device_wide_warning(ws, fake_nvml):
    fake_nvml("""
        devices 1
        gpu * util 90
        gpu 0 process self 1000000
        gpu 0 process_util self 30
        gpu 0 process_util_period 167
    """)
    r = run(ws, spin_for, 0.3, gpu=True, include=[__file__])
    assert r.gpu.utilization_scope == "process"
    assert not any("device-wide" in w for w in r.warnings)


def test_gpu_false_collects_no_gpu_values(ws, fake_nvml):
    fake_nvml("devices 1\ngpu * util 90\ngpu 0 process self 1000\n")
    r = run(ws, spin_for, 0.1, gpu=False, include=[__file__])
    assert r.gpu is None
    assert all(s.gpu is None for s in r.lines)


def test_memory_per_line_with_the_sampler(ws):
    mod = ws.module("mem_s.py", """
        import time
        def grow():
            block = bytearray(120 * 1024 * 1024)
            time.sleep(0.02)
            return len(block)
    """)
    r = run(ws, mod.grow, memory=True)
    line = r.line(str(ws.root / "mem_s.py"), 3)
    assert line.memory_bytes > 100 * 1024 * 1024
    assert r.memory.peak_rss_bytes >= r.memory.start_rss_bytes + 100 * 1024 * 1024
    assert r.memory.per_line and r.memory.timeline


@pytest.mark.skipif(sys.platform != "linux", reason="signals and /proc: Linux")
def test_cli_sampler_with_gpu_on_a_machine_without_one(tmp_path):
    import json
    import subprocess

    target = tmp_path / "t.py"
    target.write_text("import time\nfor _ in range(3):\n    time.sleep(0.02)\n")
    exe = Path(sys.executable).parent / "linescope"
    env = dict(__import__("os").environ, GPUPROF_NVML_LIBRARY=str(tmp_path / "none.so"))
    p = subprocess.run([str(exe), "--backend", "sampler", "--gpu", "-d", "none", "-o",
                        "out.json", "t.py"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["gpu"]["time_available"] is False
    assert "cannot load" in data["gpu"]["time_reason"]
    assert any(line["line"] == 3 for line in data["run"]["lines"])


FAKE_CUPTI = native_build_dir() / "fake_cupti" / "libcupti.so"


@pytest.fixture
def fake_cupti(fake_nvml, monkeypatch):
    """The fake GPU plus the fake CUPTI: returns the fake's control library (ctypes)."""
    import ctypes

    assert FAKE_CUPTI.exists(), f"{FAKE_CUPTI} missing: the test build makes it (make setup)"
    fake_nvml("devices 1\ngpu * name NVIDIA H200\ngpu * util 30\ngpu 0 process self 2000000\n")
    monkeypatch.setenv("GPUPROF_CUPTI_LIBRARY", str(FAKE_CUPTI))
    monkeypatch.setenv("GPUPROF_CUPTI", "1")
    lib = ctypes.PyDLL(str(FAKE_CUPTI))
    lib.fake_cupti_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint32]
    lib.fake_cupti_launch.restype = ctypes.c_uint32
    lib.fake_cupti_reset()
    yield lib
    lib.fake_cupti_reset()


def test_cupti_measures_kernel_time_per_launching_line(ws, fake_cupti):
    # GIVEN lines that launch kernels of known device time, one of them from a worker thread
    # (as autograd and NCCL launch), each line lasting well over a sampling interval
    kern = ws.module("kern.py", """
        import threading
        import time

        def spin(s):
            end = time.perf_counter() + s
            while time.perf_counter() < end:
                pass

        def worker(lib):
            lib.fake_cupti_launch(b"bwd", 3_000_000, 1)
            time.sleep(0.03)

        def step(lib):
            spin(0.03)
            lib.fake_cupti_launch(b"gemm", 5_000_000, 0); spin(0.03)
            lib.fake_cupti_launch(b"relu", 1_000_000, 0); lib.fake_cupti_launch(b"relu", 1_000_000, 0); spin(0.03)
            t = threading.Thread(target=worker, args=(lib,)); t.start(); t.join()
            spin(0.03)
    """)
    # WHEN profiled with gpu=True
    r = run(ws, kern.step, fake_cupti, gpu=True)
    path = str(ws.root / "kern.py")
    # THEN each line's GPU time is exactly the device time of the kernels it launched: read
    # from the launching frame on the main thread...
    assert r.line(path, 15).gpu.time_ns == 5_000_000
    assert r.line(path, 16).gpu.time_ns == 2_000_000
    # ...and, for a launch from another thread (as autograd and NCCL launch), charged to the
    # line the main thread was on (waiting for that thread)
    assert r.line(path, 17).gpu.time_ns == 3_000_000
    assert r.line(path, 6).gpu.time_ns == 0  # measured: spin's loop launched no kernel
    # AND it is marked as measured, with GPU peak memory still from the driver
    g = r.gpu
    assert g.method == "cupti" and g.time_available and g.memory_available
    assert g.utilization_scope is None  # not estimated from utilization
    assert any("measured kernel time (CUPTI" in d for d in g.diagnostics)
    assert r.line(path, 17).gpu.peak_memory_bytes == 2000000
    assert r.metadata["kernel_count"] == 4
    # AND driver time stays a separate quantity
    assert r.line(path, 17).wall_time_ns >= 25 * MS


@pytest.mark.parametrize("gil", ["held", "released"])
def test_cupti_charges_a_launch_to_its_line_before_any_sample_saw_the_code(ws, fake_cupti, gil):
    # GIVEN launches on the first line of a profiled function and in the first call of
    # another (code no sample has seen yet), with the GIL held during the launch (as a PyDLL
    # call, or torch) or released (a CDLL call), and a launch from code that is not recorded
    # with no recorded frame on the stack
    import ctypes
    lib = fake_cupti if gil == "held" else ctypes.CDLL(str(FAKE_CUPTI))
    lib.fake_cupti_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint32]
    kern = ws.module("first.py", """
        import time

        def spin(s):
            end = time.perf_counter() + s
            while time.perf_counter() < end:
                pass

        def fresh(lib):
            lib.fake_cupti_launch(b"k1", 11_000_000, 0)
            return 1

        def step(lib):
            lib.fake_cupti_launch(b"k0", 40_000_000, 0)
            spin(0.03)
            fresh(lib)
            spin(0.03)
    """)
    with profile(root=ws.root, display="none", backend="sampler", gpu=True) as session:
        lib.fake_cupti_launch(b"outside", 20_000_000, 0)  # this test's own (unrecorded) line
        kern.step(lib)
    r = session.result
    path = str(ws.root / "first.py")
    # THEN each kernel is on the line that launched it, and the unrecorded launch on none
    assert r.line(path, 13).gpu.time_ns == 40_000_000
    assert r.line(path, 9).gpu.time_ns == 11_000_000
    assert r.line(path, 5).gpu.time_ns == 0  # spin's loop, which the next samples land on
    assert sum(s.gpu.time_ns for s in r.lines if s.gpu and s.gpu.time_ns) == 51_000_000
    assert r.metadata["unattributed_kernel_ns"] == 20_000_000
    assert any("could not be charged to a recorded line" in d for d in r.gpu.diagnostics)
    # AND a launching line no sample landed on has the sampler's zero-sample estimates of
    # driver and CPU time, like any other line without samples (not a mix of 0 and unknown)
    launch = r.line(path, 9)
    cpu_read = any(s.cpu_time_ns is not None for s in r.lines if s.samples)
    if launch.samples == 0:
        assert launch.wall_time_ns == 0 and launch.cpu_time_ns == (0 if cpu_read else None)


def test_without_cupti_gpu_time_stays_estimated_and_says_why(ws, fake_nvml, monkeypatch, tmp_path):
    fake_nvml("devices 1\ngpu * util 50\ngpu 0 process self 1000\n")
    monkeypatch.setenv("GPUPROF_CUPTI_LIBRARY", str(tmp_path / "nope" / "libcupti.so"))
    monkeypatch.setenv("GPUPROF_CUPTI", "1")
    r = run(ws, spin_for, 0.1, gpu=True, include=[__file__])
    assert r.gpu.method == "nvml-sampled"
    assert any("CUPTI kernel tracing unavailable" in d and "nope" in d
               for d in r.gpu.diagnostics)


def test_apple_mps_is_unavailable_with_the_reason(ws, work, monkeypatch, tmp_path):
    # GIVEN a Mac (no NVIDIA driver; MPS would need PyTorch instrumentation)
    import linescope._sampling as sampling

    monkeypatch.setattr(sampling.sys, "platform", "darwin")
    monkeypatch.setenv("GPUPROF_NVML_LIBRARY", str(tmp_path / "none" / "libnvidia-ml.so.1"))
    r = run(ws, work.outer, gpu=True)
    # THEN both GPU values are unavailable with the MPS reason, and profiling continued
    assert "Apple MPS metrics are unavailable" in r.gpu.time_reason
    assert r.gpu.memory_reason == r.gpu.time_reason
    assert any("Apple MPS" in w for w in r.warnings)
    assert r.line(str(ws.root / "work.py"), 11).wall_time_ns >= 100 * MS


def test_sample_now_takes_one_sample_on_the_starting_thread_only(ws):
    # (the hook bench/linescope_gpu/sample_cost.py measures a sample's cost with)
    from gpuprof import _native

    mod = ws.module("now.py", """
        def take(s, n):
            for _ in range(n):
                s.sample_now()
    """)
    # GIVEN a sampler that asks for samples only once a second
    s = _native.LineSampler([str(ws.root)], [], [], str(ws.root), interval_ns=10**9,
                            attribute=True, memory=False, gpu_backend="off")
    with pytest.raises(RuntimeError, match="not running"):
        s.sample_now()
    s.start()
    try:
        # WHEN a recorded line takes 50 samples directly
        mod.take(s, 50)
        # THEN they are attributed to that line; another thread is refused
        errors = []

        def other():
            try:
                s.sample_now()
            except RuntimeError as e:
                errors.append(str(e))

        t = threading.Thread(target=other)
        t.start()
        t.join()
    finally:
        s.stop()
    assert errors and "thread that started" in errors[0]
    # (rows: filename, line, samples, wall, cpu, rss delta, rss peak, gpu time, gpu memory)
    samples = {(f.rsplit("/", 1)[-1], ln): n for f, ln, n, *_ in s.lines()}
    assert samples.get(("now.py", 3), 0) >= 50
    assert s.stats()["samples"] >= 50


def test_a_sampler_session_that_recorded_nothing_says_why(ws, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run(ws, spin_for, 0.05, root=str(elsewhere))
    assert r.lines == []
    said = [w for w in r.warnings if w.startswith("nothing was recorded")]
    assert len(said) == 1 and str(elsewhere) in said[0] and "was sampled" in said[0]
