"""profile(webhook=URL): a Slack-compatible message when the run ends, against loopback HTTP
(and HTTPS) servers: delivered with the run's status and top insights with fixes; one retry
after a 5xx; a dead endpoint, a 500 that stays and a slow endpoint are GpuprofWarnings within
the documented bound (at most 10 s added to the end of the run), never exceptions; an
untrusted certificate is refused; a bad URL fails at profile()."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from torch import nn

import gpuprof


class Hook:
    """A loopback endpoint answering the statuses in turn (then 200), after `delay_s`."""

    def __init__(self, statuses=(200,), delay_s: float = 0.0, tls_context=None) -> None:
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        statuses, hook = list(statuses), self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.bodies.append(json.loads(body))
                hook.headers.append(dict(self.headers))
                time.sleep(delay_s)
                status = statuses.pop(0) if statuses else 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls_context is not None:
            self.server.socket = tls_context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        scheme = "https" if tls_context is not None else "http"
        host = "localhost" if tls_context is not None else "127.0.0.1"
        self.url = f"{scheme}://{host}:{self.server.server_address[1]}/services/T0/B0/secret"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def train(tmp_path, webhook: str, name: str = "hooked"):
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile(name, db=str(tmp_path / "w.db"), gpu="none", summary=False,
                         webhook=webhook) as prof:
        for _ in range(8):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.01)  # the loop waits: dataloader_stall fires
    return prof


def test_the_message_names_the_run_its_status_and_top_insights(tmp_path, recwarn):
    hook = Hook()
    try:
        prof = train(tmp_path, hook.url, name="bert-ft")
    finally:
        hook.close()
    assert len(hook.bodies) == 1 and set(hook.bodies[0]) == {"text"}
    assert hook.headers[0]["Content-Type"] == "application/json"
    text = hook.bodies[0]["text"]
    assert f"`bert-ft` (run {prof.run_id}) ended *ok*" in text, text
    assert "8 steps" in text
    assert "• [" in text and "→ " in text  # an insight and its fix
    assert not [w for w in recwarn if issubclass(w.category, gpuprof.GpuprofWarning)]


def test_one_retry_after_a_5xx(tmp_path, recwarn):
    hook = Hook(statuses=(503,))
    try:
        train(tmp_path, hook.url)
    finally:
        hook.close()
    assert len(hook.bodies) == 2
    assert not [w for w in recwarn if issubclass(w.category, gpuprof.GpuprofWarning)]


def test_a_500_that_stays_is_a_warning_naming_it_not_the_secret_path(tmp_path):
    hook = Hook(statuses=(500, 500, 500))
    try:
        with pytest.warns(gpuprof.GpuprofWarning, match="answered 500") as caught:
            train(tmp_path, hook.url)
    finally:
        hook.close()
    assert len(hook.bodies) == 2
    assert all("secret" not in str(w.message) for w in caught)


def test_a_dead_endpoint_is_a_warning_at_once(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.warns(gpuprof.GpuprofWarning, match="cannot reach"):
        train(tmp_path, f"http://127.0.0.1:{port}/hook")
    assert time.monotonic() - t0 < 8


def test_a_slow_endpoint_delays_the_end_of_the_run_by_the_bound_at_most(tmp_path):
    hook = Hook(delay_s=30)
    try:
        t0 = time.monotonic()
        with pytest.warns(gpuprof.GpuprofWarning, match="did not answer within 10 s"):
            train(tmp_path, hook.url)
        elapsed = time.monotonic() - t0
    finally:
        hook.server.server_close()
    assert elapsed < 13, elapsed


@pytest.fixture
def tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx, cert


def test_https_is_verified_against_the_trusted_certificates(tmp_path, tls, monkeypatch):
    ctx, cert = tls
    hook = Hook(tls_context=ctx)
    try:
        # not trusted: refused, with the reason
        with pytest.warns(gpuprof.GpuprofWarning, match="certificate verify failed"):
            train(tmp_path, hook.url)
        assert hook.bodies == []
        # trusted through $SSL_CERT_FILE (as a private CA would be): delivered
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        train(tmp_path, hook.url)
        assert len(hook.bodies) == 1 and "ended *ok*" in hook.bodies[0]["text"]
    finally:
        hook.close()


@pytest.mark.parametrize("url, error", [("ftp://x/y", ValueError), ("http://h:0/", ValueError),
                                        ("hooks.slack.com/x", ValueError), (42, TypeError)])
def test_a_bad_webhook_fails_at_profile(tmp_path, url, error):
    with pytest.raises(error, match="webhook"):
        gpuprof.profile("x", db=str(tmp_path / "x.db"), webhook=url)


def test_a_run_pushed_to_a_team_server_links_its_page(tmp_path):
    import re
    import signal

    from gpuprof_testutil import gpuprof_exe
    serve = subprocess.Popen([gpuprof_exe(), "serve", "--port", "0", "--api-key", "k",
                              "--storage-url", f"sqlite://{tmp_path / 'srv.db'}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hook = Hook()
    try:
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", serve.stdout.readline())
        assert m, serve.stderr.read() if serve.poll() is not None else "no listening line"
        model = nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with gpuprof.profile("pushed", db=str(tmp_path / "w.db"), gpu="none", summary=False,
                             server=m.group(1), api_key="k", webhook=hook.url):
            for _ in range(4):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
        text = hook.bodies[0]["text"]
        assert f"<{m.group(1)}/#/runs/1|Open the run's dashboard>" in text, text
    finally:
        hook.close()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=20)
        serve.stdout.close()
        serve.stderr.close()
