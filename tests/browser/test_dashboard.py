"""The dashboard (web/dashboard/) in a real Chromium against a real `gpuprof serve` on
127.0.0.1: login and logout (CSRF), the runs list, a run's GPU charts for 4 mock GPUs, a run
pushed live moving the page's last step, the crosshair shared across charts, the time window
(buttons and drag-zoom re-query /series), the comparison of two runs and a group of two
ranks. Every test also checks that the page logged no error and reached nothing but the
server. Runs are recorded once per module with the public API (mock GPUs) and pushed with
`gpuprof push`."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from dashboard_util import (PASSWORD, Server, Watched, finish, gpuprof_exe, push,
                            start_training, wait_until)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server holding four finished runs: alpha and beta (4 GPUs each) and the two ranks of
    group g1. Yields (server, tmp dir)."""
    try:
        gpuprof_exe()
    except RuntimeError as e:
        pytest.skip(str(e))
    tmp = tmp_path_factory.mktemp("dashboard")
    srv = Server(tmp).start()
    try:
        procs = [
            start_training(tmp, "alpha", steps=50, step_s=0.06, db=tmp / "alpha.db"),
            start_training(tmp, "beta", steps=40, step_s=0.05, db=tmp / "beta.db"),
            start_training(tmp, "g1-rank0", steps=30, step_s=0.04, db=tmp / "r0.db", rank=0,
                           world_size=2, group="g1"),
            start_training(tmp, "g1-rank1", steps=30, step_s=0.05, db=tmp / "r1.db", rank=1,
                           world_size=2, group="g1"),
        ]
        for p in procs:
            finish(p)
        # Rank 0 as if torchrun had started it beside rank 1 on one host: the host sampler's
        # job_cpu_pct (measured for real in tests/test_distributed.py), here to be drawn.
        with sqlite3.connect(tmp / "r0.db") as c:
            c.execute("UPDATE host_samples SET job_cpu_pct = 80.0 WHERE proc_cpu_pct IS NOT NULL")
        for name in ("alpha", "beta", "r0", "r1"):
            push(tmp / f"{name}.db", srv.url)
        yield srv, tmp
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def viewer(browser, server):
    """One logged-in browser context for the module (one login: the server allows 10 a
    minute per address)."""
    srv, _ = server
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    w = Watched(context, srv.url)
    w.login()
    yield w
    context.close()


@pytest.fixture
def page(viewer):
    """The module's logged-in page; after each test, no errors and nothing off 127.0.0.1."""
    viewer.errors.clear()
    yield viewer
    viewer.check()


def run_ids(w: Watched) -> dict[str, int]:
    """Run name -> run id, from the API with the context's session cookie."""
    res = w.context.request.get(w.base + "/api/v1/runs")
    assert res.ok, res.text()
    return {r["run_name"]: r["run_id"] for r in res.json()["runs"]}


def test_login_wrong_password_then_logout_clears_the_session(browser, server):
    srv, _ = server
    context = browser.new_context()
    w = Watched(context, srv.url)
    # The wrong password's 401 is expected: Chromium logs the failed request as an error.
    w.expected.append("status of 401")
    try:
        w.page.goto(srv.url + "/")
        w.page.wait_for_selector("#login-form")
        w.page.fill("#password", "not-the-password")
        w.page.click("#login-submit")
        error = w.page.wait_for_selector("#login-error:not([hidden])")
        # The server's own message is shown
        res = context.request.post(srv.url + "/api/v1/login", data=json.dumps({"password": "nope"}),
                                   headers={"Content-Type": "application/json"})
        assert res.status == 401
        assert error.inner_text() == res.json()["error"]
        # The right password opens the runs list
        w.page.fill("#password", PASSWORD)
        w.page.click("#login-submit")
        w.wait_view("runs")
        assert context.request.get(srv.url + "/api/v1/runs").ok
        # A logout without the CSRF token is refused, and the session stays
        assert context.request.post(srv.url + "/api/v1/logout").status == 403
        assert context.request.get(srv.url + "/api/v1/runs").ok
        # The button logs out (CSRF-protected POST): back to the login page, session gone
        w.page.click("#logout")
        w.page.wait_for_selector("#login-form")
        assert context.request.get(srv.url + "/api/v1/runs").status == 401
        assert not any(c["name"] == "gpuprof_session" for c in context.cookies())
        w.check()
    finally:
        context.close()


def test_runs_list_shows_the_runs_with_name_and_status(page):
    page.goto("#/runs", "runs")
    rows = page.page.eval_on_selector_all(
        "#runs-table-box tbody tr[data-run-id]",
        "trs => trs.map(t => [t.dataset.name, t.dataset.status, t.querySelector('.badge').innerText.trim()])")
    by_name = {n: (s, b) for n, s, b in rows}
    for name in ("alpha", "beta", "g1-rank0", "g1-rank1"):
        assert by_name[name] == ("ok", "ok"), by_name
    # The group column links to the group view; the name filter narrows the list
    assert page.page.locator('a[data-group-link="g1"]').count() == 2
    page.page.fill("#filter-name", "alph")
    page.page.wait_for_function(
        "() => document.querySelectorAll('#runs-table-box tbody tr[data-run-id]').length === 1")
    page.page.fill("#filter-name", "")


def test_run_view_draws_a_line_per_gpu_on_each_gpu_chart(page):
    ids = run_ids(page)
    page.goto(f"#/runs/{ids['alpha']}", "run")
    assert page.page.inner_text("#run-name") == "alpha"
    for chart in ("gpu_util", "gpu_mem", "gpu_power", "gpu_temp"):
        labels = page.page.evaluate(f"() => window.__gpuprof.charts.{chart}.getLabels()")
        assert labels == ["x", "GPU 0", "GPU 1", "GPU 2", "GPU 3"], (chart, labels)
        assert page.page.locator(f'[data-chart="{chart}"] canvas').count() >= 1
        legend = page.page.locator(f'[data-chart="{chart}"] .legend-item')
        assert legend.count() == 4
    # Power is shown in watts, host charts and the step breakdown are drawn
    assert re.search(r"\d W$", page.page.locator('[data-chart="gpu_power"] .legend-value').first.inner_text())
    assert page.page.evaluate("() => window.__gpuprof.charts.host_cpu.numRows()") > 0
    phases = page.page.evaluate("() => window.__gpuprof.charts.steps.getLabels()")[1:]
    assert {"forward", "backward", "optimizer"} <= set(phases), phases
    assert page.page.inner_text('[data-testid="last-step"]') == "49"
    # The report arrives on its own (never holding up the charts)
    page.page.wait_for_selector("#insights .insights, #insights [data-empty]")
    page.page.wait_for_selector("#kernels table, #kernels [data-recorded='false']")
    assert page.page.evaluate("() => performance.getEntriesByName('gpuprof:render').length") >= 1


def test_the_process_cpu_chart_adds_the_jobs_other_ranks_only_where_they_were_read(page):
    ids = run_ids(page)
    # GIVEN a run no launcher started beside other ranks: the process tree alone
    page.goto(f"#/runs/{ids['alpha']}", "run")
    page.page.wait_for_function("() => window.__gpuprof.charts.proc_cpu.numRows() > 0")
    assert page.page.evaluate("() => window.__gpuprof.charts.proc_cpu.getLabels()") == [
        "x", "process tree"]
    # GIVEN rank 0 with the job's other rank read on its host: a second line, at its value
    page.goto(f"#/runs/{ids['g1-rank0']}", "run")
    page.page.wait_for_function(
        "() => window.__gpuprof.charts.proc_cpu.getLabels().length === 3")
    assert page.page.evaluate("() => window.__gpuprof.charts.proc_cpu.getLabels()") == [
        "x", "process tree", "job's other ranks on this host"]
    values = page.page.evaluate("""() => {
        const c = window.__gpuprof.charts.proc_cpu;
        const out = [];
        for (let i = 0; i < c.numRows(); ++i) out.push(c.getValue(i, 2));
        return out.filter(v => v !== null && !Number.isNaN(v));
    }""")
    assert values and all(v == 80.0 for v in values), values


def test_crosshair_on_one_chart_selects_the_same_time_on_the_others(page):
    ids = run_ids(page)
    page.goto(f"#/runs/{ids['alpha']}", "run")
    box = page.page.locator('[data-chart="gpu_util"] .plot').bounding_box()
    page.page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)
    page.page.wait_for_function("() => window.__gpuprof.charts.gpu_temp.getSelection() >= 0")
    for other in ("gpu_mem", "gpu_power", "gpu_temp", "host_cpu", "host_mem"):
        assert page.page.evaluate(f"() => window.__gpuprof.charts.{other}.getSelection()") >= 0, other
        assert page.page.get_attribute(f'[data-chart="{other}"]', "data-selected") == "1", other
    # The legends name the same time (hh:mm:ss) as the hovered chart's
    hovered = page.page.inner_text('[data-chart="gpu_util"] .legend-x')
    assert re.match(r"\d\d:\d\d:\d\d", hovered)
    assert page.page.inner_text('[data-chart="gpu_temp"] .legend-x')[:8] == hovered[:8]
    page.page.mouse.move(5, 5)


def test_window_buttons_and_drag_zoom_requery_the_series(page):
    ids = run_ids(page)
    page.goto(f"#/runs/{ids['alpha']}", "run")
    first = [u for u in page.series_requests() if f"/runs/{ids['alpha']}/" in u]
    assert first and all("from_ns" not in u for u in first), first  # "all": the whole run
    seen = len(page.requests)
    # "last 5 min" asks for a window (the run is shorter: from 0 to its newest data)
    page.page.click('[data-window="5m"]')
    page.page.wait_for_selector('[data-window="5m"][aria-pressed="true"]')
    wait_until(lambda: [u for u in page.requests[seen:] if "/series?" in u and "from_ns=" in u],
               5, page.page, what="a windowed /series request")
    assert "w=5m" in page.page.evaluate("location.hash")
    # A drag on a chart zooms every chart to that range and re-queries it
    seen = len(page.requests)
    box = page.page.locator('[data-chart="gpu_mem"] .plot').bounding_box()
    y = box["y"] + box["height"] / 2
    page.page.mouse.move(box["x"] + box["width"] * 0.35, y)
    page.page.mouse.down()
    page.page.mouse.move(box["x"] + box["width"] * 0.55, y, steps=5)
    page.page.mouse.move(box["x"] + box["width"] * 0.75, y, steps=5)
    page.page.mouse.up()
    zoomed = wait_until(lambda: [u for u in page.requests[seen:] if "/series?" in u],
                        5, page.page, what="a /series request after the zoom")
    q = parse_qs(urlparse(zoomed[-1]).query)
    assert int(q["from_ns"][0]) > 0 and int(q["to_ns"][0]) > int(q["from_ns"][0])
    hash_ = page.page.evaluate("location.hash")
    assert f"from={q['from_ns'][0]}" in hash_ and f"to={q['to_ns'][0]}" in hash_
    page.page.wait_for_function("() => performance.getEntriesByName('gpuprof:window').length >= 2")
    # Both time-chart groups show the new window
    ranges = page.page.evaluate(
        "() => ['gpu_util', 'host_disk_read'].map(c => window.__gpuprof.charts[c].xAxisRange())")
    assert ranges[0] == ranges[1]
    # "all" asks for the whole run again
    seen = len(page.requests)
    page.page.click('[data-window="all"]')
    whole = wait_until(lambda: [u for u in page.requests[seen:] if "/series?" in u], 5, page.page,
                       what="a /series request for the whole run")
    assert "from_ns" not in whole[-1]
    assert "from=" not in page.page.evaluate("location.hash")


def test_a_run_pushed_live_appears_and_its_last_step_moves(page, server):
    srv, tmp = server
    page.goto("#/runs", "runs")
    stop = tmp / "live.stop"
    proc = start_training(tmp, "live-run", steps=400, step_s=0.05, server=srv.url, stop=stop)
    try:
        # The runs list follows the live socket: the new run shows up as live
        row = page.page.wait_for_selector('tr[data-name="live-run"]', timeout=15000)
        page.page.wait_for_selector('tr[data-name="live-run"] .badge-live', timeout=5000)
        run_id = row.get_attribute("data-run-id")
        page.page.click(f'a[data-run-link="{run_id}"]')
        page.wait_view("run")
        last = page.page.locator('[data-testid="last-step"]')
        wait_until(lambda: last.get_attribute("data-value"), 10, page.page, what="a first step")
        before = int(last.get_attribute("data-value"))
        wait_until(lambda: int(last.get_attribute("data-value") or -1) > before, 10, page.page,
                   what="the last step to move")
        assert page.page.locator("#live-state[data-state='open']").count() == 1
    finally:
        stop.touch()
        finish(proc)


def test_compare_two_runs_from_the_list(page):
    page.goto("#/runs", "runs")
    ids = run_ids(page)
    page.page.check(f'input[data-pick="{ids["alpha"]}"]')
    page.page.check(f'input[data-pick="{ids["beta"]}"]')
    page.page.click("#compare")
    page.wait_view("compare")
    assert page.page.evaluate("location.hash") == f"#/compare?runs={ids['alpha']},{ids['beta']}"
    head = page.page.inner_text("#compare-table thead")
    assert "alpha" in head and "beta" in head
    assert page.page.locator(".compare-insights .panel").count() == 2
    labels = page.page.evaluate("() => window.__gpuprof.charts.compare_hist.getLabels()")
    assert labels == ["x", f"alpha #{ids['alpha']}", f"beta #{ids['beta']}"]


def test_group_view_lists_both_ranks_and_overlays_their_steps(page):
    page.goto("#/groups/g1", "group")
    ranks = page.page.eval_on_selector_all("#ranks tbody tr", "trs => trs.map(t => t.dataset.rank)")
    assert ranks == ["0", "1"]
    assert "g1-rank0" in page.page.inner_text("#ranks") and "g1-rank1" in page.page.inner_text("#ranks")
    # AND ranks whose clocks were never aligned (RANK set, no process group) say so, never 0
    clock = page.page.eval_on_selector_all(
        "#ranks tbody tr td:last-child", "tds => tds.map(t => [t.innerText, t.querySelector('.unknown')?.title])")
    assert [c[0] for c in clock] == ["—", "—"], clock
    assert all(c[1] == "not aligned: no clock alignment recorded" for c in clock), clock
    assert "clocks not aligned" in page.page.inner_text("[data-clock-basis]")
    # AND the time each rank waited for the others is unknown without bucket timings, never 0
    waiting = page.page.evaluate("""() => {
        const heads = [...document.querySelectorAll("#ranks thead th")].map(t => t.innerText.trim());
        const i = heads.findIndex(h => h.startsWith("Waiting for others"));
        return [i, [...document.querySelectorAll("#ranks tbody tr")].map(tr => {
            const td = tr.children[i];
            return [td.innerText, td.querySelector('.unknown')?.title];
        })];
    }""")
    assert waiting[0] > 0, waiting
    assert waiting[1] == [["—", "no bucket timed by this rank and another one"]] * 2, waiting
    assert page.page.evaluate("() => window.__gpuprof.charts.rank_steps.getLabels()") == [
        "x", "rank 0", "rank 1"]
    page.page.wait_for_selector("#insights .insights, #insights [data-empty]")


def test_pure_functions_evaluated_in_the_page(page):
    """The dashboard's pure modules (series merging, units, window and route parsing, the
    throttled refresher), imported by the page from the server."""
    page.goto("#/runs", "runs")
    got = page.page.evaluate("""async () => {
        const s = await import("/lib/series.js");
        const u = await import("/lib/units.js");
        const w = await import("/app/window.js");
        const r = await import("/app/route.js");
        const { Refresher } = await import("/app/refresher.js");
        // A refresher on a fake clock: one run at once, later requests folded into one.
        let now = 0, calls = 0, release = null;
        const timers = [];
        const ref = new Refresher(() => { calls++; return new Promise((ok) => { release = ok; }); },
            1000, { now: () => now, setTimer: (fn, ms) => timers.push([fn, ms]), clearTimer: () => {} });
        ref.request();
        const firstWait = timers[0][1];
        timers.shift()[0]();
        ref.request(); ref.request();
        const queuedWhileRunning = timers.length;
        release(); await new Promise((ok) => setTimeout(ok, 0));
        const nextWait = timers.length ? timers[0][1] : null;
        return {
            merged: s.mergeSeries([[[0, 0], [10, 10]], [[5, 1], [15, 3]]]),
            dropped: s.mergeSeries([[[1, null], [2, 3]], []]),
            nearest: [14, 16, -5, 99, 5].map((x) => s.nearestIndex([0, 10, 20], x)),
            hist: s.sharedHistogram([[1, 2, 3], [3, 3]], 2),
            histWeighted: s.sharedHistogram([[1, 3]], 2, [[4, 1]]).counts,
            extent: s.xExtent([[[1, 0], [5, 0]], [], [[0, 1]]]),
            ticks: s.niceTicks(0, 14.7 * 2 ** 30, 6, s.byteUnit(14.7 * 2 ** 30)).map((v) => v / 2 ** 30),
            units: [u.formatPct(87.25), u.formatPct(null), u.formatWatts(245.3), u.formatWatts(1234),
                    u.formatCelsius(67), u.formatCelsius(67.25), u.formatByteRate(1.5 * 2 ** 20),
                    u.formatByteRate(undefined)],
            windows: ["w=5m", "w=1h", "from=5&to=9", "from=9&to=5", "w=2d", ""].map(
                (q) => w.parseWindow(new URLSearchParams(q))),
            resolved: [w.resolveWindow({ kind: "last", ns: 300e9 }, 100e9),
                       w.resolveWindow({ kind: "last", ns: 300e9 }, 400e9),
                       w.resolveWindow({ kind: "last", ns: 300e9 }, null),
                       w.resolveWindow({ kind: "all" }, 5)],
            zoom: w.rangeFromZoom(1000, 2000, 500),
            routes: ["", "#/runs", "#/runs/12?w=5m", "#/compare?runs=1,2,x", "#/groups/a%2Fb", "#/nope"].map(
                (h) => r.matchRoute(r.parseHash(h))),
            hashes: [r.buildHash(["groups", "a/b"]), r.buildHash(["compare"], { runs: "1,2" }),
                     r.buildHash(["runs", 3], w.windowParams({ kind: "range", from_ns: 1, to_ns: 2 }))],
            refresher: [firstWait, queuedWhileRunning, nextWait, calls],
        };
    }""")
    assert got["merged"] == [[0, 0, None], [5, 5, 1], [10, 10, 2], [15, None, 3]]
    assert got["dropped"] == [[2, 3, None]]
    assert got["nearest"] == [1, 2, 0, 2, 0]
    assert got["hist"]["edges"] == [1, 2, 3] and got["hist"]["counts"] == [[1, 2], [0, 2]]
    assert got["histWeighted"] == [[4, 1]]
    assert got["extent"] == [0, 5]
    assert got["ticks"] == [0, 5, 10]
    assert got["units"] == ["87.3%", "—", "245 W", "1.23 kW", "67 °C", "67.3 °C", "1.50 MiB/s", "—"]
    assert got["windows"] == [{"kind": "last", "key": "5m", "ns": 300e9},
                              {"kind": "last", "key": "1h", "ns": 3600e9},
                              {"kind": "range", "from_ns": 5, "to_ns": 9},
                              {"kind": "all"}, {"kind": "all"}, {"kind": "all"}]
    assert got["resolved"] == [{"from_ns": 0, "to_ns": 100e9}, {"from_ns": 100e9, "to_ns": 400e9},
                               None, None]
    assert got["zoom"] == {"kind": "range", "from_ns": 500e6, "to_ns": 1500e6}
    assert got["routes"] == [{"view": "runs"}, {"view": "runs"}, {"view": "run", "id": 12},
                             {"view": "compare", "ids": [1, 2]}, {"view": "group", "name": "a/b"},
                             {"view": "notfound"}]
    assert got["hashes"] == ["#/groups/a%2Fb", "#/compare?runs=1,2", "#/runs/3?from=1&to=2"]
    # first run at once; none started while one runs; the next one an interval later
    assert got["refresher"] == [0, 0, 1000, 1]


def test_a_server_without_viewer_password_says_viewing_is_off(browser, tmp_path):
    srv = Server(tmp_path, viewing=False).start()
    context = browser.new_context()
    try:
        w = Watched(context, srv.url)
        w.goto("", "runs")
        assert "viewing is off on this server" in w.page.inner_text('[data-testid="viewing-off"]')
        assert "--viewer-password" in w.page.inner_text('[data-testid="viewing-off"]')
        w.check()
    finally:
        context.close()
        srv.stop()


def test_the_in_process_dashboard_logs_in_with_the_printed_url_once(browser, tmp_path):
    """profile(dashboard=True): the page without the token asks for the printed URL; the URL
    logs the browser in and opens the run, live; a second browser cannot reuse the token."""
    stop = tmp_path / "stop"
    proc = start_training(tmp_path, "inproc", steps=600, step_s=0.04, db=tmp_path / "in.db",
                          stop=stop, dashboard=True)
    contexts = []
    try:
        line = proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+)(/login\?token=\S+)", line)
        assert m, line
        base, login = m.group(1), m.group(1) + m.group(2)
        first = Watched(browser.new_context(), base)
        contexts.append(first.context)
        first.goto("", "login")
        assert "token is single-use" in first.page.inner_text('[data-testid="token-note"]')
        first.page.goto(login)
        first.wait_view("run")
        assert first.page.inner_text("#run-name") == "inproc"
        assert first.page.locator("#logout").is_hidden()
        # The GPU charts fill in as the first seconds of telemetry arrive
        first.page.wait_for_function("() => window.__gpuprof.charts.gpu_util", timeout=10000)
        labels = first.page.evaluate("() => window.__gpuprof.charts.gpu_util.getLabels()")
        assert labels == ["x", "GPU 0", "GPU 1", "GPU 2", "GPU 3"]
        last = first.page.locator('[data-testid="last-step"]')
        before = int(wait_until(lambda: last.get_attribute("data-value"), 10, first.page,
                                what="a first step"))
        wait_until(lambda: int(last.get_attribute("data-value")) > before, 10, first.page,
                   what="the last step to move")
        first.check()
        # The token was used: another browser is refused, and the app asks it for the URL
        second = Watched(browser.new_context(), base)
        contexts.append(second.context)
        # Expected errors: the refused link's 403, and the /favicon.ico (404) that the browser
        # asks for on that server-rendered page
        second.expected += ["status of 403", "status of 404"]
        assert second.page.goto(login).status == 403
        second.goto("", "login")
        assert second.page.locator('[data-testid="token-note"]').count() == 1
        second.check()
    finally:
        for c in contexts:
            c.close()
        stop.touch()
        finish(proc)


def test_a_cpu_runs_kernels_panel_shows_its_traced_operators_as_cpu_time(browser, tmp_path):
    """A CPU run traced with trace_every_n_steps: the run view's kernels panel becomes "Top
    CPU operators", with self CPU time (host time), never a GPU time column."""
    import subprocess
    import sys
    db = tmp_path / "cpu.db"
    rec = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "traces_train.py"),
                          str(db), "attention", "6", "auto",
                          json.dumps({"trace_every_n_steps": 2})],
                         capture_output=True, text=True, timeout=180)
    assert rec.returncode == 0, rec.stderr[-2000:]
    srv = Server(tmp_path).start()
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        push(db, srv.url)
        w = Watched(context, srv.url)
        w.login()
        w.goto("#/runs/1", "run")
        w.page.wait_for_selector("#kernels table")
        assert w.page.inner_text("#h-kernels") == "Top CPU operators"
        headers = w.page.locator("#kernels thead th").all_inner_texts()
        assert any("Self CPU time" in h for h in headers), headers
        assert not any("GPU time" in h for h in headers), headers
        names = w.page.locator("#kernels tbody code").all_inner_texts()
        assert "aten::bmm" in names, names
        note = w.page.inner_text('#kernels [data-kind="cpu_operators"]')
        assert "self CPU time" in note and "5 traced windows" in note, note  # 0, 1, 2, 4, 5
        w.check()
    finally:
        context.close()
        srv.stop()
