"""The benchmark's minimal-hook floor (gpuprof._native_testing.line_floor, used by
bench/linescope): it starts, counts exactly the line events of code under its root, and stops cleanly."""

from __future__ import annotations

import sys

import pytest

from gpuprof import _native_testing


def test_floor_counts_line_events_under_the_root_only(ws):
    # GIVEN a function under the root that calls a helper outside it
    ws.dependency("floorhelper", "def h(x):\n    y = x + 1\n    return y\n")
    mod = ws.module("floorwork.py", """
        import floorhelper
        def f(n):
            s = 0
            for i in range(n):
                s += floorhelper.h(i)
            return s
    """)
    floor = _native_testing.line_floor
    # WHEN the floor hook runs around it
    floor.start(str(ws.root))
    mod.f(10)
    lines, span_ns = floor.stop()
    # THEN it saw the root's line events (s = 0, 11 for-tests, 10 bodies, return) and
    # none of the helper's, with a clock read per event
    assert lines == 1 + 11 + 10 + 1
    assert span_ns > 0
    assert floor.mode == ("sys.monitoring" if sys.version_info >= (3, 12) else "settrace")


def test_floor_rejects_misuse_and_can_run_again(ws):
    mod = ws.module("again.py", """
        def g():
            return 1
    """)
    floor = _native_testing.line_floor
    with pytest.raises(RuntimeError, match="not running"):
        floor.stop()
    floor.start(str(ws.root))
    with pytest.raises(RuntimeError, match="already running"):
        floor.start(str(ws.root))
    floor.stop()
    floor.start(str(ws.root))
    mod.g()
    assert floor.stop()[0] == 1
    assert sys.gettrace() is None
