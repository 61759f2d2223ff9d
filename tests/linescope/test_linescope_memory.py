"""memory=True through the public API: a bounded RSS timeline and per-line RSS change / peak,
with the default `trace` backend and with any other backend."""

from __future__ import annotations

import threading

from linescope import (BackendCapabilities, RawBackendResult, RawLine, profile,
                       register_backend)

MiB = 1024 * 1024


def in_thread(fn):
    """fn() on a new thread; its return value."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def run(ws, fn, *args, **options):
    options.setdefault("root", ws.root)
    options.setdefault("display", "none")
    with profile(**options) as session:
        fn(*args)
    return session.result


def test_trace_with_memory_attributes_allocation_and_release_to_lines(ws):
    # GIVEN a function that allocates 150 MiB on one line and frees it on another (each line
    # lasts longer than the 1 ms sampling interval: a change is charged to the line running
    # at the next sample)
    mod = ws.module("mem.py", """
        import time
        def work():
            block = bytearray(150 * 1024 * 1024)
            time.sleep(0.01)
            del block; time.sleep(0.01)
            return 1
    """)
    # WHEN profiled with memory=True (the trace backend does not measure memory itself)
    r = run(ws, mod.work, memory=True)
    path = str(ws.root / "mem.py")
    grow, free = r.line(path, 3), r.line(path, 5)
    # THEN the allocating line has +~150 MiB and the freeing line -~150 MiB
    assert grow.memory_bytes > 120 * MiB
    assert free.memory_bytes < -120 * MiB
    # AND the peak RSS while the allocating line ran is the high level
    assert grow.memory_peak_bytes >= r.memory.start_rss_bytes + 120 * MiB
    # AND the timing columns are still the trace backend's exact ones
    assert grow.hits == 1 and free.hits == 1
    # AND the session has an RSS timeline that spans it, with its extremes
    m = r.memory
    assert m.per_line and m.reason is None and m.source == "rss"
    assert m.peak_rss_bytes >= m.start_rss_bytes + 120 * MiB
    assert m.end_rss_bytes < m.peak_rss_bytes - 100 * MiB
    ts = [t for t, _ in m.timeline]
    assert ts == sorted(ts) and ts[0] == 0 and len(ts) >= 10
    assert max(v for _, v in m.timeline) == m.peak_rss_bytes
    assert m.interval_ns >= 1_000_000


def test_lines_that_allocate_nothing_have_small_changes_not_unknown(ws):
    mod = ws.module("flat.py", """
        def f():
            x = 1
            return x + 1
    """)
    r = run(ws, mod.f, memory=True)
    line = r.line(str(ws.root / "flat.py"), 2)
    # A line that ran but got no memory sample is unknown (None); one that got a sample has
    # a measured change. Either way it is never a made-up 0 for an unmeasured line.
    assert line.memory_bytes is None or abs(line.memory_bytes) < 4 * MiB


def test_memory_off_means_no_memory_values(ws):
    mod = ws.module("off.py", """
        def f():
            return bytearray(10)
    """)
    r = run(ws, mod.f)
    assert r.memory is None
    assert all(s.memory_bytes is None and s.memory_peak_bytes is None for s in r.lines)


def test_memory_of_a_long_c_call_lands_on_the_line_that_made_it(ws):
    # GIVEN lines that allocate and free ~230 MiB inside single C operations (no bytecode
    # runs while they last), followed by lines that run no longer than an instant
    mod = ws.module("ccall.py", """
        import time
        def work():
            x = [0] * 30_000_000
            y = 1
            del x
            z = 2
            time.sleep(0.02)
    """)
    # WHEN profiled with the trace backend and memory=True
    r = run(ws, mod.work, memory=True)
    path = str(ws.root / "ccall.py")
    grow, free, after = r.line(path, 3), r.line(path, 5), r.line(path, 7)
    # THEN the change is on the allocating and the freeing line, not on a later line
    assert grow.memory_bytes > 180 * MiB and grow.memory_peak_bytes >= r.memory.start_rss_bytes
    assert free.memory_bytes < -180 * MiB
    assert after.memory_bytes is None or abs(after.memory_bytes) < 40 * MiB


def test_trace_attributes_memory_per_line_off_the_main_thread_too(ws):
    mod = ws.alloc_module("thr.py", 50)
    r = in_thread(lambda: run(ws, mod.f, memory=True))
    assert r.memory.per_line and r.memory.reason is None
    assert r.memory.peak_rss_bytes > r.memory.start_rss_bytes
    assert r.line(str(ws.root / "thr.py"), 3).memory_bytes > 40 * MiB
    assert r.line(str(ws.root / "thr.py"), 3).hits == 1


class _NoMemoryBackend:
    """A custom backend without memory capability: linescope's sampler adds memory."""

    capabilities = BackendCapabilities(line_time=True, hit_counts=True)

    def __init__(self, options):
        self.options = options

    def start(self):
        pass

    def stop(self):
        pass

    def result(self):
        return RawBackendResult(lines=[RawLine(self.path, 3, 1_000, 1)], elapsed_ns=5_000)


def test_memory_works_with_a_custom_backend(ws):
    mod = ws.alloc_module("cust.py", 80)
    _NoMemoryBackend.path = str(ws.root / "cust.py")
    register_backend("no-memory", _NoMemoryBackend, replace=True)
    r = run(ws, mod.f, backend="no-memory", memory=True)
    line = r.line(_NoMemoryBackend.path, 3)
    assert line.wall_time_ns == 1_000  # the backend's own timing
    assert line.memory_bytes > 60 * MiB  # linescope's memory sampler
    assert r.memory.per_line


def test_without_a_line_source_off_the_main_thread_per_line_memory_says_why(ws):
    # GIVEN a backend that publishes no current line (a custom one), run on another thread
    mod = ws.alloc_module("cthr.py", 50)
    _NoMemoryBackend.path = str(ws.root / "cthr.py")
    register_backend("no-memory", _NoMemoryBackend, replace=True)
    r = in_thread(lambda: run(ws, mod.f, backend="no-memory", memory=True))
    # THEN the timeline remains, per-line memory is unknown with the reason
    assert not r.memory.per_line and "main thread" in r.memory.reason
    assert r.memory.peak_rss_bytes > r.memory.start_rss_bytes
    assert all(s.memory_bytes is None for s in r.lines)
