"""Dashboard speed on a long run, measured in Chromium with the Performance API.

    bench/long_run/run.sh 24 8                       # once: the 24 h x 8 GPU run's file
    .venv/bin/python bench/dashboard_render.py [--db build/long_run/long_run.db] [--repeat 7]

Serves the file with `gpuprof serve` (SQLite storage, 127.0.0.1), logs in through the app,
then for --repeat fresh page loads of the run view measures:

* first render: navigation start -> the `gpuprof:render` mark (the view's charts drawn: 8 GPUs
  x 4 metrics, host, step breakdown; the insights report is loaded after it);
* window changes: a click on "last 5 min", "last 1 h", "all", and a drag-zoom over an hour
  in the middle of the run -> the `gpuprof:window` mark (each re-queries the server, which
  downsamples the window with LTTB).

Prints median and max per figure against the issue's targets (first render < 1 s, window
change < 200 ms). Not a pass/fail test. Chromium: Debian's, through Playwright.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("LINESCOPE_CHROMIUM", "/usr/bin/chromium")

# Clicks a window button and resolves with the time from the click to the next window mark.
WINDOW_JS = """async (sel) => {
  const before = performance.getEntriesByName("gpuprof:window").length;
  const t0 = performance.now();
  document.querySelector(sel).click();
  for (;;) {
    const marks = performance.getEntriesByName("gpuprof:window");
    if (marks.length > before) return marks[marks.length - 1].startTime - t0;
    await new Promise((r) => setTimeout(r, 5));
  }
}"""

# Zooms the GPU utilization chart to [a, b] (fractions of the run) the way a drag does.
ZOOM_JS = """async ([a, b]) => {
  const g = window.__gpuprof.charts.gpu_util;
  const [x0, x1] = g.xAxisExtremes();
  const before = performance.getEntriesByName("gpuprof:window").length;
  const t0 = performance.now();
  const lo = x0 + (x1 - x0) * a, hi = x0 + (x1 - x0) * b;
  g.updateOptions({ dateWindow: [lo, hi] });
  const cb = g.getOption("zoomCallback");
  if (cb) cb.call(g, lo, hi, g.yAxisRanges());
  for (;;) {
    const marks = performance.getEntriesByName("gpuprof:window");
    if (marks.length > before) return marks[marks.length - 1].startTime - t0;
    await new Promise((r) => setTimeout(r, 5));
  }
}"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=str(ROOT / "build" / "long_run" / "long_run.db"))
    ap.add_argument("--run", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    if not Path(args.db).exists():
        raise SystemExit(f"{args.db} does not exist: run bench/long_run/run.sh 24 8 first")
    from playwright.sync_api import sync_playwright

    exe = Path(sys.executable).parent / "gpuprof"
    with tempfile.TemporaryDirectory() as d:
        secret = Path(d) / "secret"
        secret.write_bytes(os.urandom(32))
        server = subprocess.Popen([str(exe), "serve", "--port", "0", "--api-key", "k",
                                   "--viewer-password", "p", "--secret-file", str(secret),
                                   "--storage-url", f"sqlite://{args.db}"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", server.stdout.readline())
            if not m:
                raise SystemExit("gpuprof serve did not start")
            base = m.group(1)
            figures: dict[str, list[float]] = {k: [] for k in
                                               ("first render", "last 5 min", "last 1 h", "all",
                                                "drag-zoom 1 h")}
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
                login = ctx.request.post(base + "/api/v1/login", data={"password": "p"})
                if login.status != 200:
                    raise SystemExit(f"login: {login.status} {login.text()}")
                for i in range(args.repeat + 1):  # the first load warms the server's caches
                    page = ctx.new_page()
                    page.goto(f"{base}/#/runs/{args.run}")
                    page.wait_for_selector('body[data-ready="1"][data-view="run"]',
                                           timeout=120_000)
                    render = page.evaluate(
                        "performance.getEntriesByName('gpuprof:render')[0].startTime")
                    if i == 0:
                        page.close()
                        continue
                    figures["first render"].append(render)
                    for key, label in (("5m", "last 5 min"), ("1h", "last 1 h"), ("all", "all")):
                        figures[label].append(page.evaluate(WINDOW_JS, f'[data-window="{key}"]'))
                    figures["drag-zoom 1 h"].append(page.evaluate(ZOOM_JS, [0.5, 0.5 + 1 / 24]))
                    page.close()
                browser.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    print(f"# dashboard run view on {args.db} (run {args.run}), {args.repeat} page loads, "
          f"Chromium {CHROMIUM}")
    print(f"{'figure':<16}{'median ms':>12}{'max ms':>10}{'target':>10}")
    for label, values in figures.items():
        target = "< 1000" if label == "first render" else "< 200"
        print(f"{label:<16}{statistics.median(values):>12.1f}{max(values):>10.1f}{target:>10}")


if __name__ == "__main__":
    main()
