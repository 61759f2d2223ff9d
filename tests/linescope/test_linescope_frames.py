"""How the `trace` backend tells frames apart (it learns most calls from their first line
event on 3.12+): callbacks from unrecorded code, several calls on one line, a session
started inside a running function, deep recursion."""

from __future__ import annotations

import sys

from linescope import profile

MS = 1_000_000


def run(ws, fn, *args):
    with profile(root=ws.root, display="none") as session:
        fn(*args)
    return session.result


def test_time_in_a_dependency_between_callbacks_is_not_charged_to_the_callback(ws):
    # GIVEN a dependency outside the root that calls a user callback, then works 30 ms
    ws.dependency("cbdep", """
        import time
        def drive(cb, n):
            out = []
            for i in range(n):
                out.append(cb(i))
                time.sleep(0.03)
            return out
    """)
    mod = ws.module("cbuser.py", """
        import cbdep
        def cb(i):
            return i * 2
        def main():
            return cbdep.drive(cb, 3)
    """)
    # WHEN
    r = run(ws, mod.main)
    # THEN the callback ran three times and cost ~nothing; the 90 ms are the calling line's
    path = str(ws.root / "cbuser.py")
    assert r.function("cb").calls == 3
    assert r.line(path, 3).hits == 3
    assert r.line(path, 3).wall_time_ns < 10 * MS
    assert r.function("cb").total_time_ns < 10 * MS
    assert r.line(path, 5).wall_time_ns >= 90 * MS
    assert r.line(path, 5).self_time_ns >= 85 * MS
    assert r.metadata["stack_repairs"] == 0


def test_calls_from_builtins_and_several_calls_on_one_line_are_counted(ws):
    mod = ws.module("oneline.py", """
        def f(x):
            return x + 1
        def key(x):
            return -x
        def main():
            a = f(1) + f(2) + f(3)
            b = sorted([3, 1, 2], key=key)
            c = list(map(f, range(4)))
            return a, b, c
    """)
    r = run(ws, mod.main)
    path = str(ws.root / "oneline.py")
    assert r.function("f").calls == 7
    assert r.line(path, 2).hits == 7
    assert r.function("key").calls == 3
    assert r.line(path, 6).hits == 1
    assert r.metadata["stack_repairs"] == 0


def test_session_started_inside_a_running_function_adopts_it(ws):
    # GIVEN a function that starts the session itself and then calls itself once
    mod = ws.module("adopt.py", """
        from linescope import profile
        def f(depth, root):
            if depth == 0:
                session = profile(root=root, display="none")
                session.start()
                inner = f(1, root)
                session.stop()
                return session.result
            return depth
    """)
    # WHEN
    r = mod.f(0, str(ws.root))
    # THEN the running frame is not a call, the nested one is; lines after start() count
    path = str(ws.root / "adopt.py")
    assert r.function("f").calls == 1
    assert r.line(path, 6).hits == 1
    assert r.line(path, 7) is None  # the stop() line is the profiler's own
    assert r.line(path, 3).hits == 1  # only by the nested call
    assert r.line(path, 9).hits == 1


def test_a_running_frame_whose_next_line_is_its_loop_header_is_adopted_not_called(ws):
    # GIVEN a function that starts the session inside a loop body: its next line event is the
    # loop header, reached by a backward jump (before the point where it was at start)
    mod = ws.module("loop_adopt.py", """
        from linescope import profile
        S = {}
        def caller(root):
            for i in range(3):
                if i == 0:
                    S["s"] = profile(root=root, display="none")
                    S["s"].start()
            S["s"].stop()
            return S["s"].result
    """)
    r = mod.caller(str(ws.root))
    path = str(ws.root / "loop_adopt.py")
    # THEN it is adopted (no call) and its lines after start() count
    assert r.function("caller").calls == 0
    assert r.line(path, 4).hits == 3  # the header: after iterations 0, 1 and the exit test
    assert r.line(path, 5).hits == 2


def test_deep_recursion_counts_every_call_and_keeps_the_stack_consistent(ws):
    mod = ws.module("deep.py", """
        import sys
        def down(n):
            if n == 0:
                return 0
            return 1 + down(n - 1)
        def main():
            sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
            return down(1500) + down(10)
    """)
    r = run(ws, mod.main)
    path = str(ws.root / "deep.py")
    assert r.function("down").calls == 1501 + 11
    assert r.line(path, 3).hits == 1512
    assert r.line(path, 5).hits == 1510
    assert r.function("down").own_time_ns <= r.function("down").total_time_ns
    assert r.metadata["stack_repairs"] == 0


def test_a_thread_running_the_same_function_is_not_mixed_in(ws):
    # GIVEN another thread running the profiled function while the owner runs it too
    mod = ws.module("samefn.py", """
        import threading
        import time
        def work(n):
            total = 0
            for i in range(n):
                total += i
                time.sleep(0.001)
            return total
        def main():
            t = threading.Thread(target=work, args=(20,))
            t.start()
            work(5)
            t.join()
    """)
    r = run(ws, mod.main)
    path = str(ws.root / "samefn.py")
    # THEN only the owner's 5 iterations are recorded
    assert r.function("work").calls == 1
    assert r.line(path, 6).hits == 5
    if sys.version_info >= (3, 12):  # sys.monitoring events are process-wide
        assert r.metadata["other_thread_events_ignored"] > 0
