"""Regenerates the dashboard screenshots in docs/images/ from real runs (never hand-edited).

    .venv/bin/python scripts/screenshots.py [--out docs/images] [--seconds 20]

Records real CPU training runs under gpuprof (4 mock GPUs for the GPU charts): a loader-bound
"baseline", a "tuned" run with loader workers, and a real 2-rank DistributedDataParallel job
under torchrun (gloo, group "ddp-demo", rank 1's loader slower: a straggler, and gpuprof's
DDP comm hook timing the gradient buckets on both ranks); pushes them to a `gpuprof serve` on
127.0.0.1, logs in through the app's login page in Debian's Chromium (Playwright) and saves
the run, compare and group views as PNGs. Needs the set-up of `make test` (chromium,
playwright).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CHROMIUM = os.environ.get("LINESCOPE_CHROMIUM", "/usr/bin/chromium")

TRAIN = r'''
import sys, time, torch, gpuprof
from torch import nn
from torch.utils.data import DataLoader, Dataset

name, db, seconds, workers, delay, group = sys.argv[1:7]

class Slow(Dataset):
    def __len__(self): return 10_000_000
    def __getitem__(self, i):
        time.sleep(float(delay))
        g = torch.Generator().manual_seed(i)
        return torch.randn(128, generator=g), i % 10

if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(Slow(), batch_size=32, num_workers=int(workers))
    with gpuprof.profile(name, db=db, gpu="mock", mock_gpus=4, sample_hz=20, summary=False,
                         group=group or None,
                         mock_scenario="util=70,util_amp=25,period_s=8,throttle=1,"
                                       "throttle_after_s=8"):
        end = time.monotonic() + float(seconds)
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            if time.monotonic() > end:
                break
'''


DDP_TRAIN = r'''
import os, sys, time, torch, gpuprof
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

seconds, out = float(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])

class Slow(Dataset):
    def __len__(self): return 10_000_000
    def __getitem__(self, i):
        time.sleep(0.0002 + 0.0003 * rank)  # rank 1's loader is slower: the straggler
        g = torch.Generator().manual_seed(i)
        return torch.randn(128, generator=g), i % 10

if __name__ == "__main__":
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 10)), bucket_cap_mb=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(Slow(), batch_size=32, num_workers=0)
    with gpuprof.profile("ddp-demo", db=f"{out}/rank{rank}.db", gpu="mock", mock_gpus=4,
                         sample_hz=20, summary=False, group="ddp-demo",
                         mock_scenario="util=70,util_amp=25,period_s=8"):
        end = time.monotonic() + seconds
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            done = torch.tensor([1.0 if time.monotonic() > end else 0.0])
            dist.all_reduce(done, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if done.item():
                break
    dist.destroy_process_group()
'''


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(tmp: Path, seconds: float) -> list[Path]:
    script = tmp / "train.py"
    script.write_text(TRAIN)
    py = str(BIN / "python")
    dbs = []
    for name, workers, delay in (("baseline", 0, 0.0004), ("tuned", 2, 0.0004)):
        db = tmp / f"{name}.db"
        subprocess.run([py, str(script), name, str(db), str(seconds), str(workers), str(delay),
                        ""], check=True)
        dbs.append(db)
    ddp = tmp / "ddp_train.py"
    ddp.write_text(DDP_TRAIN)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([str(BIN / "torchrun"), "--nproc-per-node=2", f"--master-port={free_port()}",
                    str(ddp), str(seconds), str(tmp)], check=True, env=env)
    return [*dbs, tmp / "rank0.db", tmp / "rank1.db"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "images"))
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each recorded run")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        dbs = record(tmp, args.seconds)
        server = subprocess.Popen([str(BIN / "gpuprof"), "serve", "--port", "0", "--api-key",
                                   "k", "--viewer-password", "demo", "--storage-url",
                                   f"sqlite://{tmp / 'server.db'}"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", server.stdout.readline())
            if not m:
                raise SystemExit("gpuprof serve did not start")
            base = m.group(1)
            for db in dbs:
                subprocess.run([str(BIN / "gpuprof"), "push", str(db), "--server", base,
                                "--api-key", "k"], check=True, stdout=subprocess.DEVNULL)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1440, "height": 1000},
                                        device_scale_factor=1)
                page.goto(base + "/")
                page.wait_for_selector('body[data-ready][data-view="login"]', state="attached")
                page.fill("#password", "demo")
                page.click("#login-submit")
                page.wait_for_selector('body[data-ready][data-view="runs"]', state="attached")
                shots = (("dashboard-runs.png", "#/runs", "runs"),
                         ("dashboard-run.png", "#/runs/1", "run"),
                         ("dashboard-compare.png", "#/compare?runs=1,2", "compare"),
                         ("dashboard-group.png", "#/groups/ddp-demo", "group"))
                for name, route, view in shots:
                    page.goto(base + "/" + route)
                    page.reload()  # a fresh render of the view
                    page.wait_for_selector(f'body[data-ready][data-view="{view}"]',
                                           state="attached", timeout=60_000)
                    page.wait_for_timeout(1500)  # the report panels that load after the charts
                    page.screenshot(path=str(out / name), full_page=True)
                    print(f"wrote {out / name}")
                browser.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
