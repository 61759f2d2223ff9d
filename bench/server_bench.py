"""Team server benchmarks (not pass/fail): ingest rate, 256 simulated ranks pushing 1 Hz batches
(request latency), and a 24 h x 8 GPU series window downsampled to 2,000 points.
Run: .venv/bin/python bench/server_bench.py [--postgres] [--ingest-only] [--gpuprof PATH]
(starts its own `gpuprof serve` on 127.0.0.1 over a SQLite file, or with --postgres over a
throwaway PostgreSQL cluster started by scripts/pg_cluster.sh; --gpuprof: another build's
executable than the venv's)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

EXE = str(Path(sys.executable).parent / "gpuprof")
KEY = "bench-key"


def start(storage_url: str, exe: str = EXE):
    proc = subprocess.Popen([exe, "serve", "--port", "0", "--api-key", KEY, "--viewer-password",
                             "view", "--storage-url", storage_url,
                             "--max-body-mb", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stdout.readline())
    return proc, int(m.group(1))


class Client:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call(self, method, path, body: bytes | None = None, headers=None):
        h = {"Content-Type": "application/json", "X-API-Key": KEY, **(headers or {})}
        self.conn.request(method, path, body=body, headers=h)
        res = self.conn.getresponse()
        data = res.read()
        assert res.status < 300, (res.status, data[:200])
        return res, data


RUN = {"run_name": "bench", "hostname": "h", "pid": 1, "start_unix_ns": 1, "start_mono_ns": 0,
       "status": "running", "gpuprof_version": "0.1.0"}


GPU_COLUMNS = ["ts_ns", "gpu_index", "util_pct", "mem_util_pct", "mem_used_bytes",
               "mem_total_bytes", "power_mw", "temp_c", "sm_clock_mhz", "clock_reasons",
               "pcie_rx_bps", "pcie_tx_bps"]


def gpu_rows(n: int, t0: int, gpus: int = 8) -> list:
    return [{"ts_ns": t0 + (i // gpus) * 10_000_000, "gpu_index": i % gpus, "util_pct": 87.5,
             "mem_util_pct": 40.0, "mem_used_bytes": 60 << 30, "mem_total_bytes": 80 << 30,
             "power_mw": 650000, "temp_c": 71.0, "sm_clock_mhz": 1980, "clock_reasons": 0,
             "pcie_rx_bps": 1.5e9, "pcie_tx_bps": 2e8} for i in range(n)]


def gpu_table(n: int, t0: int, layout: str) -> object:
    """n GPU sample rows from t0 (100 Hz, 8 GPUs) in the batch's `objects` or `columns` layout
    (docs/server.md); the client's push sends `columns`."""
    rows = gpu_rows(n, t0)
    if layout == "objects":
        return rows
    return {"columns": GPU_COLUMNS, "rows": [[r[c] for c in GPU_COLUMNS] for r in rows]}


def ingest_rate(port: int, layout: str, clients: int = 2, batches: int = 60,
                rows: int = 10_000) -> float:
    """Rows/s stored from `clients` connections each sending `batches` pre-encoded batches of
    `rows` GPU samples (a run each, timestamps going on as a run's would)."""
    bodies = []
    for k in range(clients):
        run = f"ingest-{layout}-{k}"
        Client(port).call("PUT", f"/api/v1/runs/{run}", json.dumps({"run": RUN}).encode())
        # Encoded before the clock starts, so that the clients only send. Each batch goes on
        # where the last ended (100 Hz of 8 GPUs), as a run's batches do.
        span = rows // 8 * 10_000_000
        bodies.append((run, [json.dumps({"batch_id": f"b{i}", "rows": {
            "gpu_samples": gpu_table(rows, i * span, layout)}}).encode()
            for i in range(batches)]))
    size = sum(len(b) for _, bs in bodies for b in bs) / (clients * batches * rows)

    def send(k):
        run, mine = bodies[k]
        cl = Client(port)
        for b in mine:
            cl.call("POST", f"/api/v1/runs/{run}/batches", b)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=send, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    total = clients * batches * rows
    print(f"ingest ({layout} layout, {size:.0f} bytes a row): {total:,} GPU sample rows in "
          f"{dt:.2f} s = {total / dt:,.0f} rows/s ({clients} clients, {rows:,} rows a batch, "
          f"JSON over HTTP)", flush=True)
    return total / dt


def ranks(port: int, n: int = 256, seconds: int = 10) -> None:
    lat = []
    lock = threading.Lock()

    def rank(r):
        cl = Client(port)
        cl.call("PUT", f"/api/v1/runs/rank-{r}", json.dumps({"run": {**RUN, "rank": r}}).encode())
        body = {"rows": {"gpu_samples": gpu_rows(100, 0), "steps": [
            {"step": s, "start_ns": s, "end_ns": s + 1, "forward_calls": 1, "backward_calls": 1,
             "optimizer_calls": 1} for s in range(10)]}}
        start = time.monotonic()
        for i in range(seconds):
            time.sleep(max(0.0, start + i + (r % 100) / 100 - time.monotonic()))
            b = json.dumps({**body, "batch_id": f"s{i}"}).encode()
            t = time.perf_counter()
            cl.call("POST", f"/api/v1/runs/rank-{r}/batches", b)
            with lock:
                lat.append(time.perf_counter() - t)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3
    print(f"{n} ranks x 1 Hz for {seconds} s: {len(lat)} batches, request latency p50 "
          f"{p(0.5):.1f} ms, p99 {p(0.99):.1f} ms, max {lat[-1] * 1e3:.1f} ms")


def series(port: int) -> None:
    c = Client(port)
    c.call("PUT", "/api/v1/runs/day", json.dumps({"run": RUN}).encode())
    # 24 h x 8 GPUs of 1 s rollups: 691,200 rows
    per = 20000
    n = 86400 * 8
    for first in range(0, n, per):
        rows = [{"ts_ns": ((first + i) // 8) * 1_000_000_000, "gpu_index": (first + i) % 8,
                 "samples": 10, "util_samples": 10, "util_mean_pct": 50.0 + ((first + i) % 97),
                 "power_samples": 10, "thermal_samples": 10, "throttled_samples": 0,
                 "throttled_by_reason_samples": 0, "pcie_rx_samples": 0,
                 "pcie_rx_high_samples": 0} for i in range(min(per, n - first))]
        c.call("POST", "/api/v1/runs/day/batches",
               json.dumps({"batch_id": f"d{first}", "rows": {"gpu_samples_1s": rows}}).encode())
    run_id = json.loads(c.call("PUT", "/api/v1/runs/day",
                               json.dumps({"run": RUN}).encode())[1])["run_id"]
    v = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    v.request("POST", "/api/v1/login", body=json.dumps({"password": "view"}),
              headers={"Content-Type": "application/json"})
    res = v.getresponse()
    cookie = "; ".join(h.split(";")[0] for k, h in res.getheaders() if k == "Set-Cookie")
    res.read()
    times = []
    for _ in range(20):
        t = time.perf_counter()
        v.request("GET", f"/api/v1/runs/{run_id}/series?metric=gpu_util&gpu=3&points=2000",
                  headers={"Cookie": cookie})
        r = v.getresponse()
        doc = json.loads(r.read())
        times.append(time.perf_counter() - t)
    print(f"series: 24 h of one GPU ({doc['source_points']} points) to {len(doc['points'])} "
          f"points: median {statistics.median(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms "
          f"(request to parsed answer)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--ingest-only", action="store_true")
    ap.add_argument("--gpuprof", default=EXE, help="the gpuprof executable to serve with")
    ap.add_argument("--clients", type=int, default=2, help="ingest: concurrent clients")
    ap.add_argument("--batches", type=int, default=60, help="ingest: batches per client")
    ap.add_argument("--layout", action="append", choices=["columns", "objects"],
                    help="the batches' row layout (repeatable; default: both)")
    args = ap.parse_args()
    postgres = args.postgres
    script = Path(__file__).resolve().parent.parent / "scripts" / "pg_cluster.sh"
    with tempfile.TemporaryDirectory() as d:
        if postgres:
            state = Path(d) / "pg.state"
            subprocess.run(["bash", str(script), "start", str(state)], check=True)
            url = state.read_text().splitlines()[0]
        else:
            url = f"sqlite://{Path(d) / 'server.db'}"
        print(f"storage: {'PostgreSQL (throwaway cluster, unix socket)' if postgres else 'SQLite'}")
        proc, port = start(url, args.gpuprof)
        try:
            for layout in args.layout or ["columns", "objects"]:
                ingest_rate(port, layout, clients=args.clients, batches=args.batches)
            if not args.ingest_only:
                ranks(port)
                series(port)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            if postgres:
                subprocess.run(["bash", str(script), "stop", str(state)], check=False)


if __name__ == "__main__":
    main()
