"""The `trace` backend through the public API: hit counts, time attribution, generators,
coroutines, exceptions, recursion, root filtering, threads and tracer chaining."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from linescope import profile

MS = 1_000_000


def run(ws, fn, *args, **options):
    options.setdefault("root", ws.root)
    options.setdefault("display", "none")
    with profile(**options) as session:
        fn(*args)
    return session.result


def test_exact_hit_counts_for_a_loop(ws):
    # GIVEN a function with a three-iteration loop
    mod = ws.module("loop.py", """
        def f():
            total = 0
            for i in range(3):
                total += i
            return total
    """)
    # WHEN it is profiled
    r = run(ws, mod.f)
    # THEN every line has its exact hit count (the for line: 3 iterations + the exit test)
    path = str(ws.root / "loop.py")
    assert [r.line(path, n).hits for n in (2, 3, 4, 5)] == [1, 4, 3, 1]
    f = r.function("f")
    assert f.calls == 1 and f.first_line == 1
    assert r.line(path, 1) is None  # the def line did not run inside the session


def test_time_in_a_dependency_goes_to_the_calling_line(ws):
    # GIVEN a dependency outside the root that sleeps, called from a user line
    ws.dependency("slowdep", "import time\ndef work():\n    time.sleep(0.05)\n")
    mod = ws.module("user.py", """
        import time
        import slowdep
        def main():
            slowdep.work()
            time.sleep(0.05)
            x = 1
    """)
    # WHEN
    r = run(ws, mod.main)
    # THEN the calling lines get at least 50 ms each, the dependency is not recorded
    path = str(ws.root / "user.py")
    assert r.line(path, 4).wall_time_ns >= 50 * MS
    assert r.line(path, 5).wall_time_ns >= 50 * MS
    assert r.line(path, 6).wall_time_ns < 10 * MS
    assert all("slowdep" not in s.filename for s in r.lines)
    main = r.function("main")
    assert main.total_time_ns >= 100 * MS and main.own_time_ns >= 100 * MS
    assert r.line(path, 4).gpu is None and r.line(path, 4).memory_bytes is None


def test_nested_user_calls_are_inclusive_on_the_line_and_excluded_from_self(ws):
    mod = ws.module("nest.py", """
        import time
        def inner():
            time.sleep(0.03)
        def outer():
            inner()
            return 1
    """)
    r = run(ws, mod.outer)
    path = str(ws.root / "nest.py")
    call_line = r.line(path, 5)
    assert call_line.wall_time_ns >= 30 * MS
    assert call_line.self_time_ns < 5 * MS
    assert r.function("outer").total_time_ns >= 30 * MS
    assert r.function("outer").own_time_ns < 5 * MS
    assert r.function("inner").calls == 1


def test_generator_suspension_is_not_charged_to_the_generator(ws):
    # GIVEN a generator that sleeps 20 ms per item and a consumer that sleeps 30 ms per item
    mod = ws.module("gen.py", """
        import time
        def produce(n):
            for i in range(n):
                time.sleep(0.02)
                yield i
        def consume():
            for item in produce(3):
                time.sleep(0.03)
    """)
    r = run(ws, mod.consume)
    path = str(ws.root / "gen.py")
    # THEN resumes are not calls, and each side gets its own time
    gen = r.function("produce")
    assert gen.calls == 1
    assert 60 * MS <= gen.total_time_ns < 85 * MS
    assert r.line(path, 4).hits == 3 and r.line(path, 4).wall_time_ns >= 60 * MS
    assert r.line(path, 5).hits == 3
    assert r.line(path, 8).hits == 3 and r.line(path, 8).wall_time_ns >= 90 * MS
    # the consumer's for line drives the generator: it includes the generator's time
    assert r.line(path, 7).wall_time_ns >= 60 * MS
    assert r.line(path, 7).self_time_ns < 10 * MS


def test_coroutine_time_while_awaiting_goes_to_the_driving_line(ws):
    mod = ws.module("co.py", """
        import asyncio
        import time
        async def task():
            await asyncio.sleep(0.05)
            time.sleep(0.03)
            return 1
        def main():
            return asyncio.run(task())
    """)
    r = run(ws, mod.main)
    path = str(ws.root / "co.py")
    co = r.function("task")
    assert co.calls == 1
    # awaiting suspends the coroutine: the 50 ms are not its own time...
    assert 30 * MS <= co.total_time_ns < 45 * MS
    assert r.line(path, 4).wall_time_ns < 10 * MS
    # ...but blocking inside it is, and the line running the loop gets everything
    assert r.line(path, 5).wall_time_ns >= 30 * MS
    assert r.line(path, 8).wall_time_ns >= 80 * MS


def test_exceptions_unwind_frames_and_attribute_time(ws):
    mod = ws.module("exc.py", """
        import time
        def fail():
            time.sleep(0.02)
            raise ValueError("x")
        def middle():
            fail()
            return "not reached"
        def main():
            try:
                middle()
            except ValueError:
                time.sleep(0.01)
            return 2
    """)
    r = run(ws, mod.main)
    path = str(ws.root / "exc.py")
    assert r.function("fail").calls == 1 and r.function("middle").calls == 1
    assert r.function("fail").total_time_ns >= 20 * MS
    assert r.function("middle").total_time_ns >= 20 * MS
    assert r.line(path, 7) is None  # never ran
    assert r.line(path, 10).wall_time_ns >= 20 * MS
    assert r.line(path, 12).hits == 1 and r.line(path, 12).wall_time_ns >= 10 * MS
    assert r.line(path, 13).hits == 1
    assert r.metadata["stack_repairs"] == 0


def test_recursion_counts_calls_and_does_not_double_count_totals(ws):
    mod = ws.module("rec.py", """
        def fib(n):
            if n < 2:
                return n
            return fib(n - 1) + fib(n - 2)
    """)
    r = run(ws, mod.fib, 10)
    path = str(ws.root / "rec.py")
    fib = r.function("fib")
    assert fib.calls == 177
    assert fib.total_time_ns <= r.run.elapsed_ns
    assert fib.own_time_ns <= fib.total_time_ns
    assert r.line(path, 2).hits == 177
    assert r.line(path, 3).hits == 89
    assert r.line(path, 4).hits == 88


def test_root_include_and_exclude(ws):
    ws.dependency("helper", "def h():\n    return 1\n")
    mod = ws.module("pkg/main.py", """
        import helper
        def f():
            return helper.h()
    """)
    skip = ws.module("pkg/skipme.py", """
        def g():
            return 2
    """)

    def both():
        mod.f()
        skip.g()

    r_default = run(ws, both)
    r_patterns = run(ws, both, include=[str(ws.deps) + "/*"], exclude=["pkg/skip*"])
    names = lambda r: {s.filename.rsplit("/", 1)[1] for s in r.lines}
    assert names(r_default) == {"main.py", "skipme.py"}
    assert names(r_patterns) == {"main.py", "helper.py"}


def test_the_standard_library_is_a_dependency_even_when_the_root_holds_it(ws):
    # GIVEN a root that contains the interpreter's standard library (pyenv, conda or uv
    # Pythons under the user's home, profiled from the home directory)
    import os
    import sysconfig
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    mod = ws.module("enc.py", """
        import json
        def main():
            return json.dumps({"k": list(range(2000))}, indent=1)
    """)
    user = str(ws.root) + "/*"
    # WHEN the user's code calls into it
    r = run(ws, mod.main, root=os.path.dirname(stdlib), include=[user])
    r_included = run(ws, mod.main, root=os.path.dirname(stdlib), include=[user, "*/json/*"])
    # THEN no standard-library line is recorded and the calling line gets the time; an include
    # still records it
    files = {s.filename for s in r.lines}
    assert files == {str(ws.root / "enc.py")}
    assert r.line(str(ws.root / "enc.py"), 3).hits == 1
    assert any("/json/" in s.filename for s in r_included.lines)


def test_a_root_given_through_a_symbolic_link_records_the_files_under_it(ws, tmp_path):
    # GIVEN a link to the project directory, and modules imported by their real path
    link = tmp_path / "link_to_proj"
    link.symlink_to(ws.root, target_is_directory=True)
    mod = ws.module("real.py", """
        def f():
            return 1
    """)
    # WHEN the root is the link (and, the other way round, the real directory with code
    # loaded through the link)
    by_link = run(ws, mod.f, root=str(link))
    import importlib.util
    spec = importlib.util.spec_from_file_location("ls_via_link", link / "real.py")
    via = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(via)
    by_real = run(ws, via.f, root=str(ws.root))
    # THEN the line is recorded both times, under the path the code was loaded by
    assert by_link.line(str(ws.root / "real.py"), 2).hits == 1
    assert by_real.line(str(link / "real.py"), 2).hits == 1


def test_a_generator_expression_or_lambda_on_the_calling_line_is_not_counted_twice(ws):
    # GIVEN lines that run another code object on the same line (a generator expression, a
    # lambda, a comprehension - inlined on 3.12+), each sleeping 3 x 10 ms in a recorded
    # helper, with the time of each statement taken around it
    mod = ws.module("same_line.py", """
        import time
        def slow(i):
            time.sleep(0.01)
            return i
        def main(took):
            t = time.perf_counter_ns()
            a = sum(slow(i) for i in range(3))
            t = took.append(time.perf_counter_ns() - t) or time.perf_counter_ns()
            b = sorted(range(3), key=lambda i: slow(i))
            t = took.append(time.perf_counter_ns() - t) or time.perf_counter_ns()
            c = [slow(i) for i in range(3)]
            took.append(time.perf_counter_ns() - t)
            return a, b, c
    """)
    took: list[int] = []
    r = run(ws, mod.main, took)
    path = str(ws.root / "same_line.py")
    # THEN each line's time is its statement's time once (not once per frame on the line),
    # and its self time excludes the recorded helper
    for n, actual in zip((7, 9, 11), took):
        line = r.line(path, n)
        assert actual >= 0.029e9
        assert abs(line.wall_time_ns - actual) <= max(0.002e9, 0.1 * actual), (n, line, actual)
        assert 0 <= line.self_time_ns < 0.25 * actual, (n, line)
    main = r.function("main")
    assert sum(r.line(path, n).wall_time_ns for n in (7, 9, 11)) <= main.total_time_ns


def test_the_run_ends_when_stop_is_called_not_after_the_sessions_own_stop_work(ws, monkeypatch):
    # GIVEN the session's own stop work made slow (50 ms before the tracer stops)
    import time
    from linescope import _backends
    original = _backends.TraceBackend._stop_as_of

    def slow_stop(self, t_ns):
        time.sleep(0.05)
        original(self, t_ns)

    monkeypatch.setattr(_backends.TraceBackend, "_stop_as_of", slow_stop)
    mod = ws.module("quick.py", """
        import time
        def work():
            time.sleep(0.02)
    """)
    for stop in ("with", "explicit"):
        if stop == "with":
            with profile(root=ws.root, display="none") as s:
                t = time.perf_counter_ns()
                mod.work()
                took = time.perf_counter_ns() - t
        else:
            s = profile(root=ws.root, display="none")
            s.start()
            t = time.perf_counter_ns()
            mod.work()
            took = time.perf_counter_ns() - t
            s.stop()
        # THEN the elapsed time is the run's (~20 ms), without the 50 ms of stop work
        elapsed = s.result.run.elapsed_ns
        assert took <= elapsed < took + 0.03e9, (stop, elapsed, took)
        assert s.result.function("work").total_time_ns <= elapsed


def test_code_under_a_synthetic_name_is_recorded_by_include_and_dropped_by_exclude(ws):
    # GIVEN code compiled under a synthetic file name (as exec() of a string does)
    ns: dict = {}
    exec(compile("def f():\n    return 1\n", "<generated-1>", "exec"), ns)
    files = lambda r: {s.filename for s in r.lines}
    # THEN it is not recorded by default, is with an include that names it, and an exclude
    # that also names it wins over that include (as for files)
    assert "<generated-1>" not in files(run(ws, ns["f"]))
    assert "<generated-1>" in files(run(ws, ns["f"], include=["<generated-*>"]))
    assert "<generated-1>" not in files(run(ws, ns["f"], include=["<generated-*>"],
                                            exclude=["<generated-1>"]))
    assert files(run(ws, ns["f"], include=["<generated-*>"], exclude=["*"])) == set()


def test_only_the_calling_thread_is_measured(ws):
    mod = ws.module("thr.py", """
        import time
        def worker():
            time.sleep(0.01)
            return 1
        def mine():
            return 2
    """)

    def both():
        t = threading.Thread(target=mod.worker)
        t.start()
        t.join()
        mod.mine()

    r = run(ws, both)
    # worker ran on another thread only: listed from the source, with 0 calls measured here
    assert r.function("worker").calls == 0 and r.function("worker").total_time_ns == 0
    assert r.function("mine").calls == 1
    assert r.capabilities.threads == "calling thread"


def test_an_existing_python_tracer_keeps_working(ws):
    # GIVEN a Python-level tracer (a debugger, coverage) installed before profiling
    seen = []

    def tracer(frame, event, arg):
        if frame.f_code.co_name == "f":
            seen.append(event)
        return tracer

    mod = ws.module("chain.py", """
        def f():
            a = 1
            return a
    """)
    sys.settrace(tracer)
    try:
        r = run(ws, mod.f)
        after = sys.gettrace()
    finally:
        sys.settrace(None)
    # THEN both saw the function, and the previous tracer is back afterwards
    assert "line" in seen and "call" in seen
    assert after is tracer
    assert r.line(str(ws.root / "chain.py"), 2).hits == 1


def test_source_snapshot_is_taken_at_profile_time(ws):
    mod = ws.module("snap.py", """
        def f():
            return 41 + 1
    """)
    r = run(ws, mod.f)
    (ws.root / "snap.py").write_text("# changed later\n")
    assert "return 41 + 1" in r.sources[str(ws.root / "snap.py")]
    assert r.symbols and r.symbols[0].qualname == "f" and r.symbols[0].line == 1


def test_sessions_can_run_one_after_another(ws):
    mod = ws.module("seq.py", """
        def f():
            return 1
    """)
    first = run(ws, mod.f)
    second = run(ws, mod.f)
    assert first.function("f").calls == 1 and second.function("f").calls == 1


def test_code_excluded_by_one_session_is_recorded_by_the_next(ws, tmp_path):
    # GIVEN a function that a first session (another root) does not record
    mod = ws.module("later.py", """
        def f():
            return 1
    """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    first = run(ws, mod.f, root=elsewhere)
    # WHEN a second session's root contains it
    second = run(ws, mod.f)
    # THEN only the second one records it (disabled locations are re-enabled)
    assert first.function("f") is None
    assert second.function("f").calls == 1
    assert second.line(str(ws.root / "later.py"), 2).hits == 1


def test_exception_leaving_the_with_block_still_stops_the_session(ws):
    mod = ws.module("boom.py", """
        def f():
            raise KeyError("k")
    """)
    session = profile(root=ws.root, display="none")
    with pytest.raises(KeyError):
        with session:
            mod.f()
    assert not session.running
    assert session.result.function("f").calls == 1
    with profile(root=ws.root, display="none"):  # nothing was left active
        pass


def test_generator_throw_and_exception_inside_a_generator(ws):
    mod = ws.module("genexc.py", """
        import time
        def gen():
            try:
                yield 1
            except ValueError:
                time.sleep(0.02)
                yield 2
            raise RuntimeError("done")
        def main():
            g = gen()
            next(g)
            g.throw(ValueError("in"))
            try:
                next(g)
            except RuntimeError:
                return 3
    """)
    r = run(ws, mod.main)
    path = str(ws.root / "genexc.py")
    g = r.function("gen")
    assert g.calls == 1
    assert g.total_time_ns >= 20 * MS
    assert r.line(path, 6).wall_time_ns >= 20 * MS
    assert r.line(path, 8).hits == 1
    assert r.line(path, 12).wall_time_ns >= 20 * MS
    assert r.line(path, 15).hits == 1
    assert r.metadata["stack_repairs"] == 0


def test_one_line_functions_lambdas_and_methods_count_every_call(ws):
    # GIVEN functions whose whole body sits on the def line (3.13 reports no LINE event for
    # such a first line unless PY_START stays enabled)
    mod = ws.module("onel.py", """
        import time
        def a(x): return x
        sq = lambda x: x * x
        class C:
            def m(self): return 1
        def nap(): time.sleep(0.002); return 0
        def main():
            c = C()
            for i in range(10):
                a(i); sq(i); c.m(); nap()
    """)
    # WHEN
    r = run(ws, mod.main)
    # THEN each is seen ten times, on its line and as a function, with its time
    path = str(ws.root / "onel.py")
    for qualname in ("a", "<lambda>", "C.m", "nap"):
        assert r.function(qualname).calls == 10, qualname
    assert [r.line(path, n).hits for n in (2, 3, 5, 6)] == [10, 10, 10, 10]
    assert r.function("nap").total_time_ns >= 10 * 2 * MS
    assert r.line(path, 6).wall_time_ns >= 10 * 2 * MS


def test_a_loop_on_one_line_counts_a_hit_per_iteration(ws):
    # GIVEN a loop and a comprehension whose body is on the loop's own line
    mod = ws.module("oneloop.py", """
        def f():
            s = 0
            for i in range(100): s += i
            while s > 0: s -= 1000
            return s
    """)
    # WHEN
    r = run(ws, mod.f)
    # THEN every iteration is a hit, as with the 3.11 trace function (and line_profiler):
    # the first execution plus one per backward jump to the same line
    path = str(ws.root / "oneloop.py")
    assert r.line(path, 3).hits == 101
    # five iterations (4950 -> ... -> -50): the entry plus four backward jumps (the loop
    # test is repeated at the bottom, so the jump goes back to the body)
    assert r.line(path, 4).hits == 5
    assert r.line(path, 2).hits == 1 and r.line(path, 5).hits == 1


def test_line_calls_count_recorded_calls_made_from_the_line(ws):
    ws.dependency("depcall", "def g():\n    return 1\n")
    mod = ws.module("calls.py", """
        import depcall
        def h():
            return 2
        def main():
            for _ in range(4):
                h()
                depcall.g()
    """)
    r = run(ws, mod.main)
    path = str(ws.root / "calls.py")
    assert r.line(path, 6).calls == 4  # four calls of the recorded h()
    assert r.line(path, 7).calls == 0  # the dependency is not recorded: no recorded call
    assert r.line(path, 3).calls == 0


def test_the_line_that_stops_the_session_is_not_recorded(ws):
    # GIVEN a with block and an explicit stop() in recorded code
    mod = ws.module("stopper.py", """
        from linescope import profile
        def with_block(root):
            with profile(root=root, display="none") as s:
                x = 1
            return s.result
        def explicit(root):
            s = profile(root=root, display="none")
            s.start()
            y = 2
            s.stop()
            return s.result
    """)
    path = str(ws.root / "stopper.py")
    # WHEN / THEN the body is recorded, the `with` line and the stop() line are not
    r = mod.with_block(str(ws.root))
    assert r.line(path, 4).hits == 1 and r.line(path, 3) is None
    r = mod.explicit(str(ws.root))
    assert r.line(path, 9).hits == 1 and r.line(path, 10) is None


def test_cprofile_still_works_inside_a_trace_session(ws):
    # GIVEN a program that runs cProfile itself (on 3.12+ cProfile needs sys.monitoring's
    # profiler tool id)
    mod = ws.module("selfprof.py", """
        import cProfile
        import pstats
        def work():
            return sum(i * i for i in range(2000))
        def main():
            prof = cProfile.Profile()
            prof.enable()
            work()
            prof.disable()
            return pstats.Stats(prof).total_calls
    """)
    # WHEN the program runs under a trace session
    out = []
    r = run(ws, lambda: out.append(mod.main()))
    # THEN cProfile ran and counted calls, and linescope recorded the program's lines too
    assert out and out[0] > 0
    path = str(ws.root / "selfprof.py")
    assert r.line(path, 8).hits == 1 and r.function("work").calls == 1


def test_a_session_that_recorded_nothing_says_why(ws, tmp_path):
    # GIVEN code outside the root
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mod = ws.module("outside.py", """
        def f():
            return 1
    """)
    # WHEN the root names another directory
    r = run(ws, mod.f, root=str(elsewhere))
    # THEN nothing is recorded and a warning names the root and what to change
    assert r.lines == []
    said = [w for w in r.warnings if w.startswith("nothing was recorded")]
    assert len(said) == 1 and str(elsewhere) in said[0] and "include=" in said[0]
