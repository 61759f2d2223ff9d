"""How the `trace` backend tells frames apart (it learns most calls from their first line
event on 3.12+): callbacks from unrecorded code, several calls on one line, a session
started inside a running function, deep recursion."""

from __future__ import annotations

import sys

import pytest

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


def test_the_callers_of_the_function_that_starts_the_session_carry_its_time(ws):
    # GIVEN run() -> outer() -> begin(), where begin() starts the session and sleeps 50 ms,
    # outer() then sleeps 10 ms and run() stops the session
    mod = ws.module("callers.py", """
        import time
        from linescope import profile
        def begin(root):
            profile.start(root=root, display="none")
            time.sleep(0.05)
        def outer(root):
            begin(root)
            time.sleep(0.01)
        def run(root):
            outer(root)
            profile.stop()
            return profile.result
    """)
    r = mod.run(str(ws.root))
    path = str(ws.root / "callers.py")
    # THEN each caller's waiting line holds the time from start() until its callee returned,
    # with no hit (it began before the session) and no call counted
    assert r.line(path, 7).hits == 0 and r.line(path, 7).wall_time_ns >= 50 * MS
    assert r.line(path, 10).hits == 0 and r.line(path, 10).wall_time_ns >= 60 * MS
    assert r.line(path, 4) is None  # the line that started the session is the profiler's
    assert r.line(path, 5).hits == 1 and r.line(path, 5).wall_time_ns >= 50 * MS
    # AND a caller's total includes its callee's (inclusive), none is a call
    begin, outer, run_ = (r.function(n) for n in ("begin", "outer", "run"))
    assert begin.total_time_ns >= 50 * MS and outer.total_time_ns >= begin.total_time_ns + 10 * MS
    assert run_.total_time_ns >= outer.total_time_ns
    assert begin.calls == outer.calls == run_.calls == 0
    assert r.run.elapsed_ns - run_.total_time_ns < 5 * MS


def test_a_frame_one_session_did_not_record_is_recorded_by_the_next(ws, tmp_path):
    # GIVEN a function running two sessions in turn: the first records another directory
    # only, the second (default filters) this file
    other = tmp_path / "elsewhere"
    other.mkdir()
    mod = ws.module("twice.py", """
        import time
        from linescope import profile
        def work():
            time.sleep(0.01)
        def epochs(root, other):
            with profile(root=other, display="none"):
                work()
            with profile(root=root, display="none") as s:
                work()
                time.sleep(0.02)
            return s.result
    """)
    r = mod.epochs(str(ws.root), str(other))
    path = str(ws.root / "twice.py")
    # THEN the second session records the running frame's lines (3.11 had turned its line
    # events off in the first session)
    assert r.line(path, 9).hits == 1 and r.line(path, 10).hits == 1
    assert r.line(path, 10).wall_time_ns >= 20 * MS
    assert r.function("work").calls == 1


def test_a_session_whose_thread_ended_measures_no_other_thread(ws):
    # GIVEN a worker thread that starts a session and ends without stopping it, and later
    # threads (whose thread state may reuse the dead one's memory) running recorded code
    mod = ws.module("deadowner.py", """
        import threading
        import time
        from linescope import profile
        S = {}
        def starter(root):
            S["s"] = profile(root=root, display="none")
            S["s"].start()
            time.sleep(0.01)
        def other():
            for i in range(3):
                time.sleep(0.001)
        def main(root):
            t = threading.Thread(target=starter, args=(root,))
            t.start()
            t.join()
            for _ in range(3):
                t = threading.Thread(target=other)
                t.start()
                t.join()
            return S["s"].stop()
    """)
    r = mod.main(str(ws.root))
    path = str(ws.root / "deadowner.py")
    # THEN only the starter's line is recorded, and the result says the thread ended
    assert r.line(path, 8).hits == 1
    # (the other threads' function is listed as defined in the file, with 0 calls measured)
    assert r.function("other").calls == 0 and r.line(path, 11) is None
    assert any("ended before stop()" in w for w in r.warnings)


def test_code_that_saves_and_restores_the_trace_function_keeps_the_session(ws):
    # GIVEN code that saves sys.gettrace() and restores it afterwards (doctest, pdb do)
    mod = ws.module("restore.py", """
        import sys
        import time
        def work():
            time.sleep(0.005)
        def main():
            work()
            saved = sys.gettrace()
            sys.settrace(None)
            sys.settrace(saved)
            work()
            time.sleep(0.01)
    """)
    r = run(ws, mod.main)
    path = str(ws.root / "restore.py")
    # THEN nothing after the restore is lost (3.11: the C trace function comes back)
    assert r.function("work").calls == 2
    assert r.line(path, 10).hits == 1 and r.line(path, 10).calls == 1
    assert r.line(path, 11).hits == 1 and r.line(path, 11).wall_time_ns >= 10 * MS
    # AND no warning: no other tracer got the session's events, and the moment without one
    # was too short to lose time (3.11 misses `sys.settrace(saved)`'s own line event)
    assert not [w for w in r.warnings if "replaced the trace function" in w]
    if sys.version_info >= (3, 12):
        assert r.line(path, 9).hits == 1


@pytest.mark.parametrize("between", ["nothing", "untraced work"])
def test_putting_the_same_tracer_back_loses_nothing_and_says_nothing(ws, between):
    # GIVEN code that reinstalls the current trace function, or turns tracing off around
    # 30 ms of work and then puts the session's back
    mod = ws.module(f"same_{between[0]}.py", f'''
        import sys
        import time
        def main():
            saved = sys.gettrace()
            sys.settrace({"saved" if between == "nothing" else "None"})
            time.sleep(0.03)
            sys.settrace(saved)
            time.sleep(0.001)
    ''')
    r = run(ws, mod.main)
    path = str(ws.root / f"same_{between[0]}.py")
    replaced = [w for w in r.warnings if "replaced the trace function" in w]
    assert r.line(path, 8).hits == 1
    if between == "nothing" or sys.version_info >= (3, 12):
        # THEN every line is recorded and nothing is flagged
        assert r.line(path, 6).hits == 1 and r.line(path, 6).wall_time_ns >= 30 * MS
        assert not replaced
    else:
        # THEN on 3.11 the untraced 30 ms lost their line, and the warning says so
        assert r.line(path, 6) is None
        assert len(replaced) == 1 and "later put linescope's back" in replaced[0], r.warnings


def test_lines_run_under_a_tracer_swapped_in_and_out_are_flagged_on_311(ws):
    # GIVEN code that swaps in its own tracer around a 30 ms call, then restores linescope's
    mod = ws.module("swap.py", '''
        import sys
        import time
        def work():
            time.sleep(0.03)
        def other(frame, event, arg):
            return None
        def main():
            saved = sys.gettrace()
            sys.settrace(other)
            work()
            sys.settrace(saved)
            work()
    ''')
    r = run(ws, mod.main)
    path = str(ws.root / "swap.py")
    # THEN the call after the restore is recorded
    assert r.line(path, 12).hits == 1 and r.line(path, 12).wall_time_ns >= 30 * MS
    if sys.version_info < (3, 12):
        # AND on 3.11 the swapped-out lines are missing, and the warning names the gap
        assert r.line(path, 10) is None and r.function("work").calls == 1
        assert any("later put linescope's back" in w for w in r.warnings), r.warnings
    else:
        # AND on 3.12 sys.monitoring is not affected by sys.settrace
        assert r.line(path, 10).hits == 1 and r.function("work").calls == 2
        assert not [w for w in r.warnings if "replaced the trace function" in w]


def test_a_thread_that_ended_just_before_stop_is_seen_as_ended_every_time(ws):
    # GIVEN a worker thread that starts a session and ends, and stop() right after join()
    # (its thread-local clean-up may not have run yet)
    mod = ws.module("justended.py", """
        import threading
        import time
        from linescope import profile
        def starter(root, box):
            box.append(profile(root=root, display="none").start())
            time.sleep(0.005)
        def once(root):
            box = []
            t = threading.Thread(target=starter, args=(root, box))
            t.start()
            t.join()
            return box[0].stop()
    """)
    for _ in range(5):
        r = mod.once(str(ws.root))
        # THEN the warning says so every time, and elapsed runs to the stop
        assert any("ended before stop()" in w for w in r.warnings), r.warnings
        assert not [w for w in r.warnings if "replaced the trace function" in w]
        assert r.run.elapsed_ns >= 5 * MS
        assert r.line(str(ws.root / "justended.py"), 6).hits == 1


def test_a_tracer_installed_during_the_session_gets_its_events_and_stays(ws):
    # GIVEN profiled code that installs its own sys.settrace tracer midway
    mod = ws.module("usertracer.py", """
        import sys
        events = []
        def tracer(frame, event, arg):
            events.append(event)
            return tracer
        def work():
            return sum(range(10))
        def main():
            work()
            sys.settrace(tracer)
            work()
            work()
    """)
    try:
        r = run(ws, mod.main)
        # THEN that tracer sees the later calls and is still installed after the session
        assert mod.events.count("call") >= 2, mod.events
        assert sys.gettrace() is mod.tracer
    finally:
        sys.settrace(None)
    # AND on 3.11 (one trace function per thread) the session says it was replaced there
    if sys.version_info < (3, 12):
        assert any("replaced the trace function" in w for w in r.warnings), r.warnings
    assert r.function("work").calls >= 1
