"""`gpuprof serve` (the team server's ingest side) and `gpuprof push`, through the real
executable over real HTTP on 127.0.0.1: a run pushed to the server gives the same report there
as in the local file, a push repeated stores nothing twice, keys are checked, bad input is a 4xx
with a message, and the server stops cleanly on SIGTERM."""

from __future__ import annotations

import gzip
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import gpuprof
from gpuprof_testutil import gpuprof_exe, run_cli


class ServerStorage:
    """Where a test server keeps its runs: a SQLite file or a PostgreSQL database (its URL)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def insights(self, *args: str, **kwargs):
        return run_cli("insights", "--storage-url", self.url, *args, **kwargs)


@pytest.fixture
def server(tmp_path, request):
    """A `gpuprof serve` on a free port with two write keys; yields (base URL, storage, process).
    Storage is SQLite unless the test is parametrized with "postgres" (indirect)."""
    if getattr(request, "param", "sqlite") == "postgres":
        store = ServerStorage(request.getfixturevalue("pg_database"))
    else:
        store = ServerStorage(f"sqlite://{tmp_path / 'server.db'}")
    keys = tmp_path / "keys.txt"
    keys.write_text("# rotation: the new key is added before the old one goes\nnew-key\n")
    proc = subprocess.Popen([gpuprof_exe(), "serve", "--port", "0", "--api-key", "old-key",
                             "--api-key-file", str(keys), "--storage-url", store.url,
                             "--viewer-password", "view-pass"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://127\.0\.0\.1:\d+) \(storage (sqlite|postgresql)://.*, "
                  r"2 write keys, viewing on\)", line)
    assert m, line + proc.stderr.read() if proc.poll() is not None else line
    try:
        yield m.group(1), store, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        proc.stdout.close()
        proc.stderr.close()


def call(base: str, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def record_run(db: Path) -> None:
    with gpuprof.profile("pushed", db=str(db), auto=False, gpu="mock", summary=False) as prof:
        for i in range(30):
            with prof.step(i) as s:
                with s.phase("forward"):
                    time.sleep(0.004)
                with s.phase("backward"):
                    time.sleep(0.006)


def report_without_paths(db, run: str) -> dict:
    """The report of run `run` of a local file or a server's storage, without its run id."""
    if isinstance(db, ServerStorage):
        doc = json.loads(db.insights(run, "--json", check=True).stdout)
    else:
        doc = json.loads(run_cli("insights", str(db), run, "--json", check=True).stdout)
    doc["run"].pop("run_id", None)
    return doc


@pytest.mark.parametrize("server", ["sqlite", "postgres"], indirect=True)
def test_a_pushed_run_reports_the_same_on_the_server_and_a_second_push_stores_nothing(
        server, tmp_path):
    base, store, _ = server
    local = tmp_path / "local.db"
    record_run(local)
    # WHEN the run is pushed (small batches, so that there are many)
    first = run_cli("push", str(local), "--server", base, "--api-key", "new-key",
                    "--batch-rows", "50", check=True)
    assert re.search(r"pushed run 1 of .* server run 1 \(.*\), \d+ batches, \d+ rows stored$",
                     first.stdout.strip()), first.stdout
    # THEN the server's store gives the same report as the local file
    assert report_without_paths(store, "1") == report_without_paths(local, "1")
    # AND pushing it again (a retry after a failure, or twice by mistake) stores nothing new
    rows = int(re.search(r"(\d+) rows stored", first.stdout).group(1))
    assert rows > 100
    second = run_cli("push", str(local), "1", "--server", base, "--batch-rows", "50",
                     env={"GPUPROF_API_KEY": "old-key", "PATH": "/usr/bin:/bin"}, check=True)
    assert "0 rows stored" in second.stdout and "batches were already there" in second.stdout
    assert report_without_paths(store, "1") == report_without_paths(local, "1")
    # AND /metrics counts what came in, and names no key
    status, metrics = call(base, "GET", "/metrics")
    assert status == 200
    assert f"gpuprof_ingest_rows_total {rows}\n" in metrics
    assert "gpuprof_runs_live 0\n" in metrics
    assert "new-key" not in metrics and "old-key" not in metrics


@pytest.mark.parametrize("server", ["sqlite", "postgres"], indirect=True)
def test_a_traced_cpu_runs_operators_are_pushed_with_the_run(server, tmp_path):
    """The CPU operators of traced steps (cpu_ops) travel with `gpuprof push`: the server's
    report has the same top-operators table and the same sdpa_suboptimal finding."""
    base, store, _ = server
    local = tmp_path / "local.db"
    rec = subprocess.run([sys.executable, str(Path(__file__).parent / "traces_train.py"),
                          str(local), "attention", "6", "auto",
                          json.dumps({"trace_every_n_steps": 2})],
                         capture_output=True, text=True, timeout=180)
    assert rec.returncode == 0, rec.stderr[-2000:]
    run_cli("push", str(local), "--server", base, "--api-key", "new-key", check=True)
    here, there = report_without_paths(local, "1"), report_without_paths(store, "1")
    assert here["top_kernels"]["kind"] == "cpu_operators"
    assert here["top_kernels"]["traced_steps"] == 5  # steps 0, 1, 2, 4 and 5 (warm-up)
    assert there == here
    assert "sdpa_suboptimal" in {i["rule_id"] for i in there["insights"]}


def test_keys_and_bad_input_get_a_4xx_that_says_what_was_wrong(server):
    base, _, _ = server
    run = json.dumps({"run": {"run_name": "x", "hostname": "h", "pid": 1, "start_unix_ns": 1,
                              "start_mono_ns": 0, "status": "running",
                              "gpuprof_version": "0.1.0"}}).encode()
    json_type = {"Content-Type": "application/json"}
    # No key, a wrong key, the right key
    status, body = call(base, "PUT", "/api/v1/runs/r1", run, json_type)
    assert status == 401 and "X-API-Key" in json.loads(body)["error"]
    status, body = call(base, "PUT", "/api/v1/runs/r1", run, {**json_type, "X-API-Key": "nope"})
    assert status == 403 and "nope" not in body
    writer = {**json_type, "X-API-Key": "old-key"}
    assert call(base, "PUT", "/api/v1/runs/r1", run, writer)[0] == 201
    # A row with a wrong type is refused, naming it
    bad = json.dumps({"batch_id": "b1", "rows": {"steps": [
        {"step": "one", "start_ns": 0, "end_ns": 1, "forward_calls": 0, "backward_calls": 0,
         "optimizer_calls": 0}]}}).encode()
    status, body = call(base, "POST", "/api/v1/runs/r1/batches", bad, writer)
    assert status == 400
    assert json.loads(body)["error"] == "steps[0].step: expected an integer, got string"
    # gzip is accepted; a gzip bomb and a body over the limit are 413, a broken one 400
    good = json.dumps({"batch_id": "b2", "rows": {"host_stalls": [
        {"start_ns": 5, "duration_ns": 20000000}]}}).encode()
    status, body = call(base, "POST", "/api/v1/runs/r1/batches", gzip.compress(good),
                        {**writer, "Content-Encoding": "gzip"})
    assert status == 200 and json.loads(body)["stored"] == 1
    bomb = gzip.compress(b" " * (64 << 20))
    assert call(base, "POST", "/api/v1/runs/r1/batches", bomb,
                {**writer, "Content-Encoding": "gzip"})[0] == 413
    assert call(base, "POST", "/api/v1/runs/r1/batches", b"x" * (33 << 20), writer)[0] == 413
    assert call(base, "POST", "/api/v1/runs/r1/batches", gzip.compress(good)[:20],
                {**writer, "Content-Encoding": "gzip"})[0] == 400
    # Unknown endpoints and methods
    assert call(base, "GET", "/nope")[0] == 404
    assert call(base, "GET", "/api/v1/runs/r1/batches")[0] == 405
    assert json.loads(call(base, "GET", "/healthz")[1])["status"] == "ok"


def test_serve_refuses_to_start_without_a_key_or_with_an_unknown_storage(tmp_path):
    no_key = run_cli("serve", "--port", "0", "--storage-url", f"sqlite://{tmp_path / 's.db'}")
    assert no_key.returncode == 2
    assert "at least one write key" in no_key.stderr
    # A PostgreSQL that cannot be reached: exit 1 with libpq's reason, the password redacted
    pg = run_cli("serve", "--api-key", "k", "--storage-url",
                 "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=3")
    assert pg.returncode == 1, pg.stderr
    assert "postgres://u:***@127.0.0.1:1/db" in pg.stderr and "connect:" in pg.stderr
    assert "s3cret" not in pg.stderr
    other = run_cli("serve", "--api-key", "k", "--storage-url", "mysql://u@h/db")
    assert other.returncode == 2 and "is not sqlite://PATH or postgres://" in other.stderr
    # And push names what it needs
    missing = run_cli("push", str(tmp_path / "none.db"), "--server", "http://127.0.0.1:9",
                      env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2 and "GPUPROF_API_KEY" in missing.stderr


def test_push_to_a_server_that_is_not_there_fails_with_the_reason(tmp_path):
    local = tmp_path / "local.db"
    record_run(local)
    r = run_cli("push", str(local), "--server", "http://127.0.0.1:9", "--api-key", "k")
    assert r.returncode == 1
    assert "cannot reach http://127.0.0.1:9" in r.stderr


def test_sigterm_stops_the_server(server):
    base, _, proc = server
    assert call(base, "GET", "/healthz")[0] == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert "gpuprof serve: stopped" in proc.stdout.read()


# ---- the live push: profile(server=..., api_key=...) / $GPUPROF_SERVER -------------------------

def live_run(db: Path, steps: int = 60, **kwargs) -> list:
    """A short manual run (25 ms a step) pushed live; returns the warnings it raised."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gpuprof.profile("live", db=str(db), auto=False, gpu="mock", summary=False,
                             **kwargs) as prof:
            for i in range(steps):  # 1.5 s: the 1 s push period sends rows during the run
                with prof.step(i) as s:
                    with s.phase("forward"):
                        time.sleep(0.025)
    return [w for w in caught if issubclass(w.category, gpuprof.GpuprofWarning)]


@pytest.mark.parametrize("server", ["sqlite", "postgres"], indirect=True)
def test_a_run_pushed_live_reports_the_same_on_the_server(server, tmp_path, monkeypatch):
    base, store, _ = server
    spool = tmp_path / "spool"
    monkeypatch.setenv("GPUPROF_BUFFER_DIR", str(spool))
    local = tmp_path / "local.db"
    # WHEN a run is profiled with the server and a key (longer than the 1 s push period)
    problems = live_run(local, server=base, api_key="new-key")
    # THEN nothing went wrong, nothing is spooled, and the server's report is the local one
    assert problems == []
    assert not spool.exists() or not list(spool.iterdir())
    assert report_without_paths(store, "1") == report_without_paths(local, "1")
    status, metrics = call(base, "GET", "/metrics")
    assert "gpuprof_runs_live 0\n" in metrics
    # (rows went during the run, not only at its end)
    batches = int(re.search(r"gpuprof_ingest_batches_total (\d+)", metrics).group(1))
    assert batches >= 2, metrics  # one at the 1 s tick, the rest at the end
    # AND the key is nowhere in the local file
    assert b"new-key" not in local.read_bytes()


@pytest.mark.parametrize("server", ["sqlite", "postgres"], indirect=True)
def test_a_server_down_for_the_whole_run_is_one_warning_and_a_spool_that_drain_delivers(
        server, tmp_path, monkeypatch):
    base, store, _ = server
    spool = tmp_path / "spool"
    monkeypatch.setenv("GPUPROF_BUFFER_DIR", str(spool))
    monkeypatch.setenv("GPUPROF_SERVER", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("GPUPROF_API_KEY", "new-key")
    local = tmp_path / "local.db"
    # WHEN the run is profiled with the server unreachable
    t0 = time.monotonic()
    problems = live_run(local)
    elapsed = time.monotonic() - t0
    # THEN the training ran through, with one warning saying why and where the rows are
    assert len(problems) == 1, [str(w.message) for w in problems]
    text = str(problems[0].message)
    assert "could not push run" in text and "cannot reach http://127.0.0.1:9" in text
    assert "gpuprof drain --server http://127.0.0.1:9" in text
    assert elapsed < 1.5 + 10  # the run, plus at most the 5 s exit wait and the analysis
    files = list(spool.glob("run-*.jsonl"))
    assert len(files) == 1 and str(files[0]) in text
    # AND a drain the server refuses (a wrong key) keeps the file and says so (exit status 1)
    refused = run_cli("drain", "--server", base, "--dir", str(spool), "--api-key", "wrong")
    assert refused.returncode == 1
    assert "kept (0 of" in refused.stdout and "answered 403" in refused.stdout
    assert files[0].exists()
    # AND a file that is not a spool file is left alone
    junk_dir = tmp_path / "junk"
    junk_dir.mkdir()
    (junk_dir / "run-x.jsonl").write_text('{"batch_id": "b"}\n')
    junk = run_cli("drain", "--server", base, "--dir", str(junk_dir), "--api-key", "new-key")
    assert junk.returncode == 1 and "not a gpuprof spool file" in junk.stdout
    assert (junk_dir / "run-x.jsonl").exists()
    # AND gpuprof drain delivers it to the server that is up, then removes the file
    drained = run_cli("drain", "--server", base, "--dir", str(spool), check=True,
                      env={"GPUPROF_API_KEY": "old-key", "PATH": "/usr/bin:/bin"})
    assert "file removed" in drained.stdout, drained.stdout
    assert not files[0].exists()
    assert report_without_paths(store, "1") == report_without_paths(local, "1")
    # AND a second drain finds nothing to do
    again = run_cli("drain", "--server", base, "--dir", str(spool), "--api-key", "new-key",
                    check=True)
    assert "nothing to send" in again.stdout


def test_a_wrong_key_is_one_warning_naming_the_refusal(server, tmp_path, monkeypatch):
    base, _, _ = server
    monkeypatch.setenv("GPUPROF_BUFFER_DIR", str(tmp_path / "spool"))
    problems = live_run(tmp_path / "local.db", server=base, api_key="not-a-key")
    assert len(problems) == 1
    assert "answered 403" in str(problems[0].message)
    assert "not-a-key" not in str(problems[0].message)


def test_push_options_are_checked(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUPROF_SERVER", raising=False)
    monkeypatch.delenv("GPUPROF_API_KEY", raising=False)
    with pytest.raises(ValueError, match="must be http://HOST"):
        gpuprof.profile("x", db=str(tmp_path / "a.db"), server="https://example.com",
                        api_key="k")
    with pytest.raises(ValueError, match="no write key"):
        gpuprof.profile("x", db=str(tmp_path / "a.db"), server="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="api_key= was given without server="):
        gpuprof.profile("x", db=str(tmp_path / "a.db"), api_key="k")
    # From the environment a bad setting is a warning, and the run is profiled unpushed
    monkeypatch.setenv("GPUPROF_SERVER", "http://127.0.0.1:9")
    with pytest.warns(gpuprof.GpuprofWarning, match=r"\$GPUPROF_SERVER is set but no write key"):
        prof = gpuprof.profile("x", db=str(tmp_path / "a.db"), auto=False, summary=False)
    with prof:
        pass


# ---- viewers: login, runs, the engine's report, series ---------------------------------------

@pytest.mark.parametrize("server", ["sqlite", "postgres"], indirect=True)
def test_a_viewer_logs_in_and_reads_what_gpuprof_insights_reads(server, tmp_path):
    base, store, proc = server
    local = tmp_path / "local.db"
    record_run(local)
    run_cli("push", str(local), "--server", base, "--api-key", "new-key", check=True)
    # Secrets are not in the process title
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    assert b"view-pass" not in cmdline and b"old-key" not in cmdline
    # WHEN a viewer logs in
    req = urllib.request.Request(base + "/api/v1/login",
                                 data=json.dumps({"password": "view-pass"}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as res:
        cookies = [v.split(";")[0] for k, v in res.headers.items() if k == "Set-Cookie"]
        csrf = json.loads(res.read())["csrf"]
    viewer = {"Cookie": "; ".join(cookies)}
    # THEN it lists the runs and reads the report the engine gives gpuprof insights
    status, body = call(base, "GET", "/api/v1/runs?name=pushed", headers=viewer)
    assert status == 200 and [r["run_name"] for r in json.loads(body)["runs"]] == ["pushed"]
    status, body = call(base, "GET", "/api/v1/runs/1", headers=viewer)
    assert status == 200
    assert json.loads(body) == json.loads(store.insights("1", "--json", check=True).stdout)
    # AND a host series, downsampled
    status, body = call(base, "GET", "/api/v1/runs/1/series?metric=host_cpu&points=3",
                        headers=viewer)
    assert status == 200 and len(json.loads(body)["points"]) <= 3
    # AND a write key cannot read, the wrong password cannot log in
    assert call(base, "GET", "/api/v1/runs", headers={"X-API-Key": "new-key"})[0] == 401
    assert call(base, "POST", "/api/v1/login", json.dumps({"password": "no"}).encode(),
                {"Content-Type": "application/json"})[0] == 401
    # AND logout needs the CSRF token
    assert call(base, "POST", "/api/v1/logout", b"{}",
                {**viewer, "Content-Type": "application/json"})[0] == 403
    assert call(base, "POST", "/api/v1/logout", b"{}",
                {**viewer, "Content-Type": "application/json", "X-CSRF-Token": csrf})[0] == 200


def test_the_viewer_password_can_come_from_a_file(tmp_path):
    pw = tmp_path / "viewer.txt"
    pw.write_text("from-file  \r\nsecond line ignored\n")
    both = run_cli("serve", "--api-key", "k", "--viewer-password", "p",
                   "--viewer-password-file", str(pw))
    assert both.returncode == 2 and "not both" in both.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    none = run_cli("serve", "--api-key", "k", "--viewer-password-file", str(empty))
    assert none.returncode == 2 and "cannot be empty" in none.stderr
    proc = subprocess.Popen([gpuprof_exe(), "serve", "--port", "0", "--api-key", "k",
                             "--viewer-password-file", str(pw),
                             "--storage-url", f"sqlite://{tmp_path / 's.db'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = re.search(r"(http://127\.0\.0\.1:\d+)", proc.stdout.readline()).group(1)
        login = lambda p: call(base, "POST", "/api/v1/login", json.dumps({"password": p}).encode(),
                               {"Content-Type": "application/json"})[0]
        assert login("from-file") == 200  # the first line, its line end and spaces trimmed
        assert login("second line ignored") == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        proc.stdout.close()
        proc.stderr.close()


# ---- PostgreSQL storage ------------------------------------------------------------------------

def start_serve(url: str) -> tuple[subprocess.Popen, str, str]:
    """`gpuprof serve` on `url`; (process, base URL, its first output line)."""
    proc = subprocess.Popen([gpuprof_exe(), "serve", "--port", "0", "--api-key", "k",
                             "--storage-url", url, "--viewer-password", "pw"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert m, line + (proc.stderr.read() if proc.poll() is not None else "")
    return proc, m.group(1), line


def stop_serve(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    return out


def test_postgres_storage_keeps_the_password_out_of_sight_and_sessions_across_restarts(
        pg_database, tmp_path):
    # GIVEN a database URL with a password (the test cluster trusts local users, so any works)
    # (and one as a libpq `password=` parameter)
    url = pg_database.replace("postgresql:///", "postgresql://gpuprof:hunter2@/", 1)
    url += "&password=hunter3"
    # WHEN insights reads a database no server has used yet, it says so (password redacted)
    empty = run_cli("insights", "--storage-url", url)
    assert empty.returncode == 1 and "no gpuprof schema" in empty.stderr, empty.stderr
    assert "hunter2" not in empty.stderr and "gpuprof:***@" in empty.stderr
    assert "hunter3" not in empty.stderr and "password=***" in empty.stderr
    assert run_cli("insights", "--storage-url", url, "1", "2").returncode == 2
    proc, base, line = start_serve(url)
    assert "hunter2" not in line and "gpuprof:***@" in line and "hunter3" not in line
    try:
        # (the server created the schema; still no runs)
        none = run_cli("insights", "--storage-url", url)
        assert none.returncode == 1 and "holds no runs yet" in none.stderr, none.stderr
        # THEN the password is in neither the process title nor the output
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert b"hunter2" not in cmdline and b"hunter3" not in cmdline
        local = tmp_path / "local.db"
        record_run(local)
        run_cli("push", str(local), "--server", base, "--api-key", "k", check=True)
        req = urllib.request.Request(base + "/api/v1/login",
                                     data=json.dumps({"password": "pw"}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as res:
            cookie = "; ".join(v.split(";")[0] for k, v in res.headers.items()
                               if k == "Set-Cookie")
    finally:
        out = stop_serve(proc)
    assert "hunter2" not in out
    # AND a server started again on the same database (no --secret-file: the signing secret is
    # kept in the database) still honours the session
    proc, base, _ = start_serve(url)
    try:
        status, body = call(base, "GET", "/api/v1/runs", headers={"Cookie": cookie})
        assert status == 200 and [r["run_name"] for r in json.loads(body)["runs"]] == ["pushed"]
    finally:
        stop_serve(proc)
    # AND gpuprof insights reads the run from PostgreSQL as from the local file
    assert report_without_paths(ServerStorage(url), "1") == report_without_paths(local, "1")


# ---- live updates over WebSocket ----------------------------------------------------------------

class LiveSocket:
    """A minimal WebSocket client of GET /api/v1/live (RFC 6455 frames from the server arrive
    unmasked): enough to read the server's JSON events."""

    def __init__(self, base: str, path: str, cookie: str) -> None:
        import base64
        import os
        import socket
        host, port = base[len("http://"):].split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Version: 13\r\nCookie: {cookie}\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            assert chunk, "the server closed the connection during the handshake"
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.status = int(head.split()[1])

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the live socket"
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def next(self) -> dict:
        """The next text message, as JSON (pings are skipped)."""
        while True:
            b0, b1 = self._take(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(self._take(2), "big")
            elif n == 127:
                n = int.from_bytes(self._take(8), "big")
            payload = self._take(n)
            if b0 & 0x0F == 1:
                return json.loads(payload)

    def close(self) -> None:
        self.sock.close()


def viewer_cookie(base: str) -> str:
    req = urllib.request.Request(base + "/api/v1/login",
                                 data=json.dumps({"password": "view-pass"}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as res:
        return "; ".join(v.split(";")[0] for k, v in res.headers.items() if k == "Set-Cookie")


@pytest.mark.parametrize("server", ["sqlite", "postgres"], indirect=True)
def test_a_viewer_watches_a_live_run_over_websocket(server, tmp_path, monkeypatch):
    base, store, _ = server
    monkeypatch.setenv("GPUPROF_BUFFER_DIR", str(tmp_path / "spool"))
    cookie = viewer_cookie(base)
    # A write key or no session cannot open it
    assert LiveSocket(base, "/api/v1/live", "").status == 401
    # GIVEN a viewer on the live socket
    live = LiveSocket(base, "/api/v1/live", cookie)
    assert live.status == 101
    assert live.next()["type"] == "hello"
    # WHEN a run is profiled and pushed live (3 s; the push thread sends once a second, so
    # batches with whole seconds of GPU rollups arrive while it runs)
    import threading
    done = threading.Event()
    seen_metrics = []

    def watch_metrics():
        while not done.is_set():
            status, text = call(base, "GET", "/metrics")
            if "gpuprof_gpu_utilization_percent{" in text:
                seen_metrics.append(text)
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_metrics)
    watcher.start()
    try:
        problems = live_run(tmp_path / "local.db", steps=120, server=base, api_key="new-key")
    finally:
        done.set()
        watcher.join(timeout=30)
    assert problems == []
    # THEN the viewer heard of the run, its batches while it ran, and its end
    events = []
    while not (events and events[-1]["type"] == "run" and events[-1]["status"] == "ok"):
        events.append(live.next())
        assert len(events) < 200, events
    live.close()
    assert events[0]["type"] == "run" and events[0]["created"] is True
    assert events[0]["run_name"] == "live" and events[0]["status"] == "running"
    batches = [e for e in events if e["type"] == "batch"]
    assert batches and sum(b["rows"].get("steps", 0) for b in batches) == 120
    assert max(b["last_step"] for b in batches if "last_step" in b) == 119
    # AND while it ran, /metrics showed its GPUs' newest second (mock GPUs), named by run
    assert seen_metrics, "no live GPU gauges in /metrics while the run was live"
    assert re.search(r'gpuprof_gpu_utilization_percent\{run_id="1",run_name="live",gpu="0"\} ',
                     seen_metrics[0])
    assert "gpuprof_live_viewers 1\n" in seen_metrics[0]
