"""Helpers of the dashboard's browser tests: a real `gpuprof serve` on 127.0.0.1 serving the web
files from this checkout, runs recorded with the public API in subprocesses (mock GPUs) and
pushed with `gpuprof push`, a live run pushed while a page watches, and a page wrapper that
records every request, WebSocket, console error and page error."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
API_KEY = "dash-key"
PASSWORD = "dash-pass"


def gpuprof_exe() -> str:
    """The native CLI installed next to this interpreter (the venv's bin), else on PATH."""
    exe = Path(sys.executable).parent / "gpuprof"
    if exe.exists():
        return str(exe)
    found = shutil.which("gpuprof")
    if not found:
        raise RuntimeError("the gpuprof executable is not installed (run make setup)")
    return found


class Server:
    """`gpuprof serve --port 0` on a SQLite store in `root`, serving the app embedded in the
    installed build (as users get it); GPUPROF_DASH_TEST_WEB_DIR=web makes it read web/ from
    that directory instead (edit-and-rerun while developing the pages)."""

    def __init__(self, root: Path, viewing: bool = True) -> None:
        self.root = root
        self.viewing = viewing
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> "Server":
        env = dict(os.environ)
        env.pop("GPUPROF_WEB_DIR", None)
        if os.environ.get("GPUPROF_DASH_TEST_WEB_DIR"):
            env["GPUPROF_WEB_DIR"] = os.environ["GPUPROF_DASH_TEST_WEB_DIR"]
        viewer = ["--viewer-password", PASSWORD] if self.viewing else []
        self.proc = subprocess.Popen(
            [gpuprof_exe(), "serve", "--port", "0", "--api-key", API_KEY, *viewer,
             "--storage-url", f"sqlite://{self.root / 'server.db'}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+) ", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"gpuprof serve did not start: {line!r} {self.proc.stderr.read()}")
        self.url = m.group(1)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


# One training run with the public API: auto=False, prof.step()/s.phase(), mock GPUs. argv:
# name, db ('-' for none), steps, seconds per step, server URL ('-' for none), stop file
# ('-' for none: run all steps). RANK / WORLD_SIZE and DASH_GROUP come from the environment.
TRAIN = r"""
import os, sys, time
import gpuprof
name, db, steps, step_s, server, stop = sys.argv[1:7]
steps, step_s = int(steps), float(step_s)
kw = dict(auto=False, gpu="mock", mock_gpus=4, sample_hz=20, host_hz=10, summary=False,
          group=os.environ.get("DASH_GROUP") or None)
if os.environ.get("DASH_DASHBOARD"):
    kw["dashboard"] = True
if server != "-":
    kw.update(server=server, api_key=os.environ["DASH_API_KEY"])
with gpuprof.profile(name, db=db if db != "-" else os.path.join(os.environ["DASH_TMP"], name + ".db"), **kw) as prof:
    for i in range(steps):
        if stop != "-" and os.path.exists(stop):
            break
        with prof.step(i) as s:
            with s.phase("forward"):
                time.sleep(step_s * 0.35)
            with s.phase("backward"):
                time.sleep(step_s * 0.5)
            with s.phase("optimizer"):
                time.sleep(step_s * 0.1)
"""


def start_training(tmp: Path, name: str, *, steps: int, step_s: float, db: Path | None = None,
                   server: str | None = None, stop: Path | None = None, rank: int | None = None,
                   world_size: int | None = None, group: str | None = None,
                   dashboard: bool = False) -> subprocess.Popen:
    env = {**os.environ, "DASH_TMP": str(tmp), "DASH_API_KEY": API_KEY,
           "GPUPROF_BUFFER_DIR": str(tmp / "spool"),
           "GPUPROF_WEB_DIR": os.environ.get("GPUPROF_DASH_TEST_WEB_DIR", "")}
    for var in ("RANK", "WORLD_SIZE", "DASH_GROUP", "GPUPROF_SERVER", "GPUPROF_API_KEY",
                "TORCHELASTIC_RUN_ID"):
        env.pop(var, None)
    if rank is not None:
        env["RANK"] = str(rank)
    if world_size is not None:
        env["WORLD_SIZE"] = str(world_size)
    if group is not None:
        env["DASH_GROUP"] = group
    if dashboard:
        env["DASH_DASHBOARD"] = "1"
    return subprocess.Popen(
        [sys.executable, "-c", TRAIN, name, str(db) if db else "-", str(steps), str(step_s),
         server or "-", str(stop) if stop else "-"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 60) -> None:
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"training process failed ({proc.returncode}): {out}")


def push(db: Path, server: str) -> None:
    res = subprocess.run([gpuprof_exe(), "push", str(db), "--server", server, "--api-key", API_KEY],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"gpuprof push failed: {res.stderr}{res.stdout}")


class Watched:
    """A page of a browser context with everything it does recorded: request and WebSocket
    URLs, console errors and uncaught exceptions (`expected` console texts are allowed)."""

    def __init__(self, context, base: str) -> None:
        self.context = context
        self.base = base
        self.page = context.new_page()
        self.requests: list[str] = []
        self.sockets: list[str] = []
        self.errors: list[str] = []
        self.expected: list[str] = []
        self.refused: list[str] = []  # "STATUS URL" of answers >= 400 (to explain errors)
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("response", lambda r: r.status >= 400 and self.refused.append(f"{r.status} {r.url}"))
        self.page.on("websocket", lambda ws: self.sockets.append(ws.url))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("console", self._console)

    def _console(self, msg) -> None:
        if msg.type != "error":
            return
        if any(e in msg.text for e in self.expected):
            return
        self.errors.append(f"console: {msg.text}")

    def goto(self, hash_: str, view: str | None = None) -> None:
        """Opens the app at `hash_` and waits for the view's first render."""
        self.page.goto(self.base + "/" + hash_)
        if view:
            self.wait_view(view)

    def wait_view(self, view: str, timeout: float = 15000) -> None:
        self.page.wait_for_selector(f'body[data-ready="1"][data-view="{view}"]', timeout=timeout)

    def login(self, password: str = PASSWORD) -> None:
        self.page.goto(self.base + "/#/runs")
        self.page.wait_for_selector("#login-form")
        self.page.fill("#password", password)
        self.page.click("#login-submit")
        self.wait_view("runs")

    def series_requests(self) -> list[str]:
        return [u for u in self.requests if "/series?" in u]

    def offsite(self) -> list[str]:
        """Requests and sockets that went anywhere but this server (data: URLs are no request
        to anyone)."""
        host = self.base.split("://", 1)[1]
        ok = (f"http://{host}/", f"ws://{host}/")
        return [u for u in self.requests + self.sockets
                if not u.startswith(ok) and not u.startswith("data:")]

    def check(self) -> None:
        assert self.errors == [], (self.errors, self.refused)
        assert self.offsite() == [], f"requests off 127.0.0.1: {self.offsite()}"


def wait_until(predicate, timeout: float, page=None, interval: float = 0.1,
               what: str = "condition"):
    """Polls `predicate` until it is truthy. With a page, waits through the page
    (wait_for_timeout), so that Playwright keeps delivering its events (requests) meanwhile;
    a plain sleep would hold them back."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        if page is not None:
            page.wait_for_timeout(interval * 1000)
        else:
            time.sleep(interval)
