"""memory=True through the public API: a bounded RSS timeline and per-line RSS change / peak,
with the default `trace` backend and with any other backend."""

from __future__ import annotations

import threading

from linescope import (BackendCapabilities, RawBackendResult, RawLine, profile,
                       register_backend)

MiB = 1024 * 1024


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


def test_off_the_main_thread_the_timeline_remains_and_per_line_says_why(ws):
    mod = ws.module("thr.py", """
        import time
        def f():
            block = bytearray(50 * 1024 * 1024)
            time.sleep(0.02)
            return len(block)
    """)
    out = {}

    def body():
        out["r"] = run(ws, mod.f, memory=True)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    r = out["r"]
    assert not r.memory.per_line
    assert "main thread" in r.memory.reason
    assert r.memory.peak_rss_bytes > r.memory.start_rss_bytes
    assert all(s.memory_bytes is None for s in r.lines)
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
    mod = ws.module("cust.py", """
        import time
        def f():
            block = bytearray(80 * 1024 * 1024)
            time.sleep(0.02)
            return len(block)
    """)
    _NoMemoryBackend.path = str(ws.root / "cust.py")
    register_backend("no-memory", _NoMemoryBackend, replace=True)
    r = run(ws, mod.f, backend="no-memory", memory=True)
    line = r.line(_NoMemoryBackend.path, 3)
    assert line.wall_time_ns == 1_000  # the backend's own timing
    assert line.memory_bytes > 60 * MiB  # linescope's memory sampler
    assert r.memory.per_line
