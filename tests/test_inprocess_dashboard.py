"""profile(dashboard=True): the in-process dashboard, through the public API and over HTTP.

GIVEN a training script with dashboard=True WHEN it runs THEN its first line is the URL, the
single-use link logs a client in, the API answers with the live run while it trains, and once
the process exits nothing listens any more. (The pages themselves: tests/browser.)"""

from __future__ import annotations

import http.cookiejar
import json
import os
import socket
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import gpuprof

TRAIN = textwrap.dedent("""
    import os, sys, time, gpuprof
    go = sys.argv[2]
    with gpuprof.profile("dash", db=sys.argv[1], auto=False, gpu="mock", mock_gpus=4,
                         sample_hz=50, summary=False, dashboard=True) as prof:
        i = 0
        while not os.path.exists(go) and i < 3000:   # until the test says so (bounded)
            with prof.step(i):
                time.sleep(0.01)
            i += 1
    print("trained", i, flush=True)
    """)


def _client() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def _get_json(opener: urllib.request.OpenerDirector, url: str) -> dict:
    with opener.open(url, timeout=10) as r:
        return json.loads(r.read())


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_url_first_link_logs_in_once_api_live_and_gone_after_exit(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "run.db"), str(go)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline().strip()
        assert first.startswith("gpuprof dashboard: http://127.0.0.1:"), first
        url = first.split(" ", 2)[2]
        base = url.split("/login?")[0]
        port = int(base.rsplit(":", 1)[1])
        assert "token=" in url and len(url.split("token=")[1]) >= 32

        # The API needs the login first.
        anon = _client()
        with pytest.raises(urllib.error.HTTPError) as denied:
            anon.open(base + "/api/v1/runs", timeout=10)
        assert denied.value.code == 401
        assert _get_json(anon, base + "/api/v1/session")["mode"] == "dashboard"

        viewer = _client()
        with viewer.open(url, timeout=10) as page:  # 303 to the app, which is served
            assert page.status == 200
            assert b"/vendor/dygraphs/dygraph.min.js" in page.read()
        session = _get_json(viewer, base + "/api/v1/session")
        assert session["logged_in"] is True
        run_id = session["run_id"]

        # The link works once: another client is refused.
        with pytest.raises(urllib.error.HTTPError) as used:
            _client().open(url, timeout=10)
        assert used.value.code == 403

        # Live: the step count grows while the run trains, and the run is "running".
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(set(seen)) < 2:
            runs = _get_json(viewer, base + "/api/v1/runs")["runs"]
            mine = [r for r in runs if r["run_id"] == run_id][0]
            assert mine["status"] == "running"
            if mine["steps"]:
                seen.append(mine["steps"])
            time.sleep(0.3)
        assert len(set(seen)) >= 2, f"steps never grew: {seen}"
        # The 1 s GPU rollups of the 4 mock GPUs arrive once their first second is over.
        gpus: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(gpus) < 4:
            series = _get_json(viewer, f"{base}/api/v1/runs/{run_id}/series"
                                       "?metric=gpu_util&gpu=all&points=100")
            gpus = sorted(s["gpu"] for s in series["series"])
            time.sleep(0.3)
        assert gpus == [0, 1, 2, 3]

        go.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "trained" in out
        assert "Traceback" not in err
        assert not _listening(port), "the dashboard still listens after the process exited"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dashboard_serves_after_the_run_until_exit(tmp_path: Path) -> None:
    # GIVEN a run that ended WHEN the process lives on THEN the dashboard still answers, and the
    # run is "ok" there.
    code = textwrap.dedent(f"""
        import sys, time, urllib.request, json, gpuprof
        with gpuprof.profile("after", db={str(tmp_path / 'a.db')!r}, auto=False, gpu="mock",
                             summary=False, dashboard=True) as prof:
            with prof.step(0):
                pass
        base = prof.dashboard_url.split("/login?")[0]
        with urllib.request.urlopen(base + "/api/v1/session", timeout=10) as r:
            print("session", json.loads(r.read())["run_id"] == prof.run_id)
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("gpuprof dashboard: http://127.0.0.1:")
    assert "session True" in lines


def test_a_forked_child_exits_without_touching_the_parents_server(tmp_path: Path) -> None:
    # GIVEN a dashboard WHEN the process forks and the child exits normally (atexit runs) THEN
    # the child does not hang on the parent's threads and the parent's dashboard still answers.
    code = textwrap.dedent(f"""
        import os, sys, urllib.request, gpuprof
        with gpuprof.profile("fork", db={str(tmp_path / 'f.db')!r}, auto=False, gpu="mock",
                             summary=False, dashboard=True) as prof:
            pid = os.fork()
            if pid == 0:
                sys.exit(0)
            _, status = os.waitpid(pid, 0)
            print("child", os.waitstatus_to_exitcode(status), flush=True)
            base = prof.dashboard_url.split("/login?")[0]
            with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
                print("healthz", r.status, flush=True)
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "child 0" in r.stdout and "healthz 200" in r.stdout


def test_a_taken_port_is_a_warning_and_the_run_is_still_recorded(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.warns(gpuprof.GpuprofWarning, match="dashboard could not start"):
            with gpuprof.profile("busy", db=str(tmp_path / "b.db"), auto=False, gpu="none",
                                 summary=False, dashboard=port) as prof:
                with prof.step(0):
                    pass
    assert prof.dashboard_url is None
    out = subprocess.run([str(Path(sys.executable).parent / "gpuprof"), "insights",
                          str(tmp_path / "b.db"), "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["run"]["run_name"] == "busy"
    assert any("dashboard not started" in d["message"] for d in report.get("diagnostics", []))


@pytest.mark.parametrize("bad", ["yes", -1, 70000, 1.5])
def test_bad_dashboard_values_are_clear_errors(bad: object, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dashboard must be True, False or a port number"):
        gpuprof.profile("x", db=str(tmp_path / "x.db"), dashboard=bad)  # type: ignore[arg-type]


def test_no_dashboard_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with gpuprof.profile("plain", db=str(tmp_path / "p.db"), auto=False, gpu="none",
                         summary=False) as prof:
        with prof.step(0):
            pass
    assert prof.dashboard_url is None
    assert "gpuprof dashboard" not in capsys.readouterr().out


def test_environment_web_dir_is_served(tmp_path: Path) -> None:
    # GPUPROF_WEB_DIR (development) makes the dashboard serve web/ from that tree.
    web = tmp_path / "web" / "dashboard"
    web.mkdir(parents=True)
    (web / "index.html").write_text("<p>dev copy</p>")
    code = textwrap.dedent(f"""
        import urllib.request, gpuprof
        with gpuprof.profile("dev", db={str(tmp_path / 'w.db')!r}, auto=False, gpu="none",
                             summary=False, dashboard=True) as prof:
            base = prof.dashboard_url.split("/login?")[0]
            with urllib.request.urlopen(base + "/", timeout=10) as r:
                print(r.read().decode())
        """)
    env = dict(os.environ, GPUPROF_WEB_DIR=str(tmp_path / "web"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert "<p>dev copy</p>" in r.stdout


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "live_dashboard.py"


def test_live_dashboard_example_runs_and_exits(tmp_path: Path) -> None:
    # GIVEN the demo WHEN it trains 3 s without lingering THEN its first line is the URL and it
    # exits 0 with the run stored.
    r = subprocess.run([sys.executable, str(EXAMPLE), "--seconds", "3", "--linger", "0",
                        "--db", str(tmp_path / "demo.db")], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("gpuprof dashboard: http://127.0.0.1:"), lines[:3]
    assert any(line.startswith("training done: run 1") for line in lines)


def test_live_dashboard_example_ctrl_c_exits_cleanly(tmp_path: Path) -> None:
    # GIVEN the demo serving after training WHEN Ctrl-C (SIGINT) THEN it says so, prints no
    # traceback and exits 130; the dashboard's port is closed.
    # (SIGINT at its default in the demo, as in a terminal: a test run started in the background
    # by a shell without job control inherits SIGINT ignored, and Python keeps it so.)
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--seconds", "1",
                             "--db", str(tmp_path / "demo.db")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stdout.readline()
        port = int(first.split("http://127.0.0.1:")[1].split("/")[0])
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and not line.startswith("training done"):
            line = proc.stdout.readline()
        assert line.startswith("training done"), line
        assert _listening(port)
        proc.send_signal(2)  # SIGINT, as Ctrl-C
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "stopped (Ctrl-C)" in out
        assert "Traceback" not in err
        assert not _listening(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
