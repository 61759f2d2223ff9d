"""The ``scalene`` backend's blocking-wait shims: during a session, the main thread's
``Thread.join`` and ``Condition`` waits wake every few milliseconds, so that Python runs the
sampling signal handler and the other threads get samples (see ``WaitShims``).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any


class _PollingWaiter:
    """The lock a ``threading.Condition.wait`` on the main thread waits on, during a session:
    a blocking acquire waits in slices (see ``WaitShims``). The waiter stays in the
    condition's waiter list for the whole wait, so a notify() is never missed."""

    __slots__ = ("_lock", "_shims")

    def __init__(self, lock: Any, shims: WaitShims) -> None:
        self._lock = lock
        self._shims = shims

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking or (timeout < 0 and timeout != -1) or not self._shims.here():
            return bool(self._lock.acquire(blocking, timeout))
        return self._shims.wait(lambda step: self._lock.acquire(True, step),
                                None if timeout == -1 else timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return bool(self._lock.locked())

    def _at_fork_reinit(self) -> None:
        self._lock._at_fork_reinit()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


class WaitShims:
    """Makes the main thread's blocking waits wake up every ``slice_s`` while a session runs.

    Python runs the SIGALRM handler only on the main thread, between bytecodes. A main thread
    blocked on a lock sleeps in a futex wait, which the kernel resumes after the C-level
    handler (the handler is installed with SA_RESTART, as Scalene does, so that native code is
    not handed EINTR), so it would take no sample until the wait ends and the other threads'
    lines would get none. (time.sleep and select / poll waits return EINTR even so, and Python
    runs the handler there.) Scalene's launcher installs shims for this for good
    (``scalene/replacement_thread_join.py``, ``replacement_lock.py``); an in-process session
    installs the equivalent for its lifetime, on the main thread only:

    * ``threading.Thread.join`` (also ``ThreadPoolExecutor.shutdown``, the ``with`` block's
      end) joins in slices;
    * the waiter lock of ``threading.Condition.wait`` (``threading._allocate_lock`` called from
      it): ``queue.Queue.get``, ``Event.wait``, ``Future.result``, ``concurrent.futures.wait``,
      ``Semaphore`` and ``Barrier`` waits.

    During a join or a condition wait Scalene's "sleeping" flag is set for the main thread, as
    Scalene's shims do, so such samples go to the other threads' lines, not to the waiting
    line; not when the main thread has no recorded frame (Scalene then takes the first
    recorded thread for the main one, and would drop its samples as sleeping).

    ``uninstall()`` puts back every original that is still the installed shim (one that
    someone replaced meanwhile stays theirs; ours then passes straight through)."""

    def __init__(self, scalene: Any, slice_s: float,
                 recorded: Callable[[str, str], bool]) -> None:
        self._S = scalene
        self._slice = slice_s
        self._recorded = recorded
        self._main = threading.main_thread().ident
        self._pid = os.getpid()
        self._active = False
        self._installed: list[tuple[Any, str, Any, Any]] = []
        # Threads started (Thread.start) during the session, since the previous
        # threads_may_have_run(), and whether one of them was running at that call.
        self._threads: list[weakref.ref[threading.Thread]] = []
        self._started_since = self._alive_then = False

    def threads_may_have_run(self) -> bool:
        """Whether a thread started during the session may have run since the previous call
        (for the late-sample warning): one was running then, or one has been started since.
        Threads from before the session (an IDE's, a pool's idle ones) do not count."""
        ran = self._alive_then or self._started_since
        self._threads = [r for r in self._threads if (t := r()) is not None and t.is_alive()]
        self._started_since, self._alive_then = False, bool(self._threads)
        return ran

    def here(self) -> bool:
        """True on the main thread of the process that started the session, while it runs."""
        return (self._active and threading.get_ident() == self._main
                and os.getpid() == self._pid)

    def wait(self, attempt: Callable[[float], bool], timeout: float | None) -> bool:
        """Calls attempt(step) with steps of at most the slice until it returns True (True) or
        `timeout` seconds have passed (False); None waits without end."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        tid = threading.get_ident()
        f: Any = sys._getframe(1)
        while f is not None and not self._recorded(f.f_code.co_filename, f.f_code.co_name):
            f = f.f_back
        sleeping = f is not None
        while True:
            step = (self._slice if deadline is None
                    else min(self._slice, max(deadline - time.monotonic(), 0.0)))
            if sleeping:
                self._S.set_thread_sleeping(tid)
            try:
                if attempt(step):
                    return True
            finally:
                if sleeping:
                    self._S.reset_thread_sleeping(tid)
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def install(self) -> None:
        shims = self
        orig_join = threading.Thread.join
        orig_allocate = threading._allocate_lock  # type: ignore[attr-defined]
        wait_code = threading.Condition.wait.__code__

        @functools.wraps(orig_join)
        def join(thread: threading.Thread, timeout: float | None = None) -> None:
            if not shims.here():
                return orig_join(thread, timeout)

            def attempt(step: float) -> bool:
                orig_join(thread, step)  # raises as join() does (not started, current thread)
                return not thread.is_alive()

            shims.wait(attempt, timeout)
            return None

        @functools.wraps(orig_allocate)
        def allocate_lock() -> Any:
            lock = orig_allocate()
            if shims.here() and sys._getframe(1).f_code is wait_code:
                return _PollingWaiter(lock, shims)
            return lock

        orig_start = threading.Thread.start

        @functools.wraps(orig_start)
        def start(thread: threading.Thread) -> None:
            shims._threads.append(weakref.ref(thread))  # see threads_may_have_run()
            shims._started_since = True
            try:
                return orig_start(thread)
            finally:
                # A sample taken while start() waited saw the thread not yet alive.
                shims._started_since = True

        self._installed = [(threading.Thread, "join", orig_join, join),
                           (threading, "_allocate_lock", orig_allocate, allocate_lock),
                           (threading.Thread, "start", orig_start, start)]
        for owner, name, _orig, shim in self._installed:
            setattr(owner, name, shim)
        self._active = True

    def uninstall(self) -> None:
        self._active = False
        for owner, name, orig, shim in self._installed:
            if getattr(owner, name, None) is shim:
                setattr(owner, name, orig)
        self._installed = []
        self._S._Scalene__is_thread_sleeping.pop(self._main, None)
