"""linescope's HTML report in Chromium: navigation, sorting (unknown last), links to source
lines, the heat scale, the GPU and memory views, offline operation and the pure JS functions.
Reports are produced through the public API (profile(output=...), scripted backends)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from linescope import GPUStats, profile
from linescope_report_util import (TRAIN_SOURCE, MiB, Scenario, gpu_scenario,
                                   memory_scenario, read_payload, run_scripted)

LINES = "table.lines"


@pytest.fixture
def traced_report(tmp_path: Path) -> Path:
    """A real `trace` profile of a small program with two files."""
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "helpers.py").write_text(
        "def square(x):\n"
        "    return x * x\n")
    (root / "main.py").write_text(
        "from pkg.helpers import square\n"
        "\n"
        "def busy(n):\n"
        "    total = 0\n"
        "    for i in range(n):\n"
        "        total += square(i)\n"
        "    return total\n"
        "\n"
        "def run():\n"
        "    return busy(3000)\n")
    import importlib
    import sys
    sys.path.insert(0, str(root))
    try:
        for name in ("main", "pkg.helpers", "pkg"):
            sys.modules.pop(name, None)
        main = importlib.import_module("main")
        out = tmp_path / "trace.html"
        with profile(root=root, output=out, display="none"):
            main.run()
    finally:
        sys.path.remove(str(root))
        for name in ("main", "pkg.helpers", "pkg"):
            sys.modules.pop(name, None)
    return out


def test_navigation_between_views(report, traced_report):
    # GIVEN a trace report WHEN the sidebar is used THEN each view shows, marked current
    report.open(traced_report)
    assert report.heading() == "Overview"
    cards = report.page.inner_text(".cards")
    for label in ("Elapsed", "Source snapshots", "Functions", "Executed lines"):
        assert label in cards
    for view, title in (("files", "Files"), ("functions", "Functions"), ("overview", "Overview")):
        report.nav(view)
        assert report.heading() == title
        assert report.page.get_attribute(f'#sidebar a[data-nav="{view}"]',
                                         "aria-current") == "page"
    # no memory or GPU view without memory / gpu collection
    assert report.page.query_selector('#sidebar a[data-nav="memory"]') is None
    assert report.page.query_selector('#sidebar a[data-nav="gpu"]') is None
    # a file from the sidebar opens its source view; the browser's back button returns
    report.page.click('#sidebar .sources a:text-is("main.py")')
    assert report.wait_heading("main.py") == "main.py"
    assert "for i in range(n):" in report.page.inner_text("table.source")
    report.page.go_back()
    assert report.heading() == "Overview"
    # the files table links to each source view
    report.nav("files")
    report.page.click('table.files a:text-is("pkg/helpers.py")')
    assert report.wait_heading("pkg/helpers.py") == "pkg/helpers.py"


def test_function_names_link_to_their_definition(report, tmp_path):
    # GIVEN a long file whose function `deep` is defined at line 2500
    source = "".join(f"x{i} = {i}\n" for i in range(1, 2500)) + "def deep():\n    return 1\n"
    scenario = Scenario(lines=[(n, 1000 * n, 1, None, None, None) for n in range(1, 2502)],
                        functions=[("deep", 2500, 5_000, 5_000, 1)])
    out = tmp_path / "long.html"
    run_scripted(tmp_path, scenario, gpu=False, output=out, source=source)
    report.open(out)
    report.nav("functions")
    # WHEN its name is clicked
    report.page.click('table.functions a.fn:text-is("deep")')
    # THEN the source view shows the definition line, highlighted and scrolled into view
    assert report.page.evaluate("location.hash") == "#file=0&line=2500"
    row = report.page.locator('table.source tr[data-line="2500"].target')
    row.wait_for(timeout=5000)
    assert "target" in row.get_attribute("class")
    assert "def deep():" in row.inner_text()
    assert row.is_visible()
    box = row.bounding_box()
    assert 0 <= box["y"] <= 800, box
    # a deep link opens the same place directly
    report.open(out, "#file=0&line=1200")
    row = report.page.locator('table.source tr[data-line="1200"]')
    assert "target" in row.get_attribute("class") and 0 <= row.bounding_box()["y"] <= 800


def test_every_table_sorts_and_unknown_sorts_last_both_ways(report, tmp_path):
    # GIVEN lines whose hits are partly unknown (None)
    out = tmp_path / "gpu.html"
    run_scripted(tmp_path, gpu_scenario(), gpu=True, output=out)
    report.open(out)
    # the most expensive lines start by time, descending
    assert report.page.get_attribute(f'{LINES} th[data-key="time"]', "aria-sort") == "descending"
    assert report.column_texts(LINES, "location")[0] == "train.py:13"  # the 50 ms line
    # WHEN Hits is clicked: descending, unknown last
    report.sort(LINES, "hits")
    assert report.column_texts(LINES, "hits") == ["10", "10", "10", "10", "1", "—"]
    assert report.page.get_attribute(f'{LINES} th[data-key="hits"]', "aria-sort") == "descending"
    # AND again: ascending, unknown still last
    report.sort(LINES, "hits")
    assert report.column_texts(LINES, "hits") == ["1", "10", "10", "10", "10", "—"]
    assert report.page.get_attribute(f'{LINES} th[data-key="hits"]', "aria-sort") == "ascending"
    # text columns sort too
    report.sort(LINES, "location")
    locs = report.column_texts(LINES, "location")
    assert locs == sorted(locs, key=lambda s: int(s.split(":")[1]))
    # every header of every table is a button that sorts
    for view, table in (("files", "table.files"), ("functions", "table.functions"),
                        ("gpu", "table.gpu-lines")):
        report.nav(view)
        for key in report.headers(table):
            report.sort(table, key)
            assert report.page.get_attribute(f'{table} th[data-key="{key}"]', "aria-sort") in (
                "ascending", "descending")


def test_heat_scale_is_present_and_ordered(report, tmp_path):
    out = tmp_path / "heat.html"
    run_scripted(tmp_path, gpu_scenario(), gpu=True, output=out)
    report.open(out, "#file=0")
    # the legend runs from light (little time) to dark (most time)
    levels = report.js("""() => [...document.querySelectorAll('.heat-legend .swatch')].map((s) => {
        const [r, g, b] = getComputedStyle(s).backgroundColor.match(/\\d+/g).map(Number);
        return [Number(s.dataset.level), 0.2126 * r + 0.7152 * g + 0.0722 * b];
    })""")
    assert [lvl for lvl, _ in levels] == list(range(1, 10))
    lum = [l for _, l in levels]
    assert all(a > b for a, b in zip(lum, lum[1:])), lum
    # each executed line's time cell carries a heat level that grows with its time
    rows = report.js("""() => [...document.querySelectorAll('table.source tr.executed')].map((r) =>
        [Number(r.dataset.line), Number(r.querySelector('.heat[data-kind="time"]').dataset.heat)])""")
    payload = read_payload(out)
    time_of = {l["line"]: l["time_ns"] for l in payload["lines"]}
    ordered = sorted(rows, key=lambda r: time_of[r[0]])
    heats = [h for _, h in ordered]
    assert heats == sorted(heats) and heats[-1] == 9 and heats[0] >= 1
    # GPU time cells have their own heat, the most GPU time at the top of the scale
    gpu_heat = report.page.get_attribute(
        'table.source tr[data-line="4"] .heat[data-kind="gpu"]', "data-heat")
    assert gpu_heat == "9"
    # and the heat colours are kept when the page is printed
    adjust = report.js("""() => getComputedStyle(document.querySelector('.heat[data-kind="time"]'))
                                .printColorAdjust""")
    assert adjust == "exact"


def test_gpu_view_cards_table_and_links(report, tmp_path):
    # GIVEN gpu=True with a backend that measured lines 4 (30 ms, 512 MiB) and 5 (2 ms, 520 MiB)
    out = tmp_path / "gpu.html"
    run_scripted(tmp_path, gpu_scenario(), gpu=True, output=out)
    report.open(out)
    # WHEN GPU is selected in the sidebar
    report.nav("gpu")
    assert report.heading() == "GPU"
    # THEN the three cards show the attributed GPU time, the GPU peak and the driver time
    value = lambda card: report.page.inner_text(f'[data-card="{card}"] .card-value')  # noqa: E731
    label = lambda card: report.page.inner_text(f'[data-card="{card}"] .card-label')  # noqa: E731
    assert (label("gpu-time"), value("gpu-time")) == ("Attributed GPU time", "32.0 ms")
    assert (label("gpu-memory"), value("gpu-memory")) == ("GPU peak memory", "520 MiB")
    assert (label("driver-time"), value("driver-time")) == ("Driver time", "9.00 ms")
    assert report.page.query_selector('[data-card="gpu-memory"] .notice') is None
    # which method produced the numbers
    assert report.page.inner_text(".method strong") == "nvml-sampled"
    assert "estimated from sampled GPU utilization" in report.page.inner_text(".method")
    assert "other processes" in report.page.inner_text(".facts")
    # the measured lines, most GPU time first; sortable
    table = "table.gpu-lines"
    assert report.column_texts(table, "gpu_time") == ["30.0 ms", "2.00 ms"]
    assert report.column_texts(table, "gpu_memory") == ["512 MiB", "520 MiB"]
    assert report.column_texts(table, "driver") == ["8.00 ms", "1.00 ms"]
    assert report.column_texts(table, "source") == ["y = x @ w", "loss = y.sum()"]
    report.sort(table, "gpu_memory")
    assert report.column_texts(table, "gpu_memory") == ["520 MiB", "512 MiB"]
    # the location links to the exact captured source line
    report.page.click(f'{table} a:text-is("train.py:4")')
    assert report.wait_heading("train.py") == "train.py"
    row = report.page.locator('table.source tr[data-line="4"]')
    assert "target" in row.get_attribute("class") and "y = x @ w" in row.inner_text()
    # and the source view has GPU time and GPU peak memory columns
    assert {"gpu_time", "gpu_memory"} <= set(report.headers("table.source"))
    assert report.column_texts("table.source", "gpu_time")[3] == "30.0 ms"  # line 4
    assert report.column_texts("table.source", "gpu_time")[6] == "—"  # line 7: not measured


def test_gpu_peak_memory_unavailable_shows_the_reason_in_red(report, tmp_path):
    reason = "NVML: per-process memory is not supported (WDDM driver)"
    out = tmp_path / "reason.html"
    run_scripted(tmp_path, gpu_scenario(memory_reason=reason, memory_available=False),
                 gpu=True, output=out)
    report.open(out, "#view=gpu")
    card = '[data-card="gpu-memory"]'
    assert report.page.inner_text(f"{card} .card-value") == "—"
    notice = report.page.locator(f"{card} .notice")
    assert notice.inner_text() == reason
    r, g, b = report.js("""(sel) => getComputedStyle(document.querySelector(sel)).color
                           .match(/\\d+/g).slice(0, 3).map(Number)""", f"{card} .notice")
    assert r > 150 and g < 80 and b < 80, (r, g, b)  # red
    value_box = report.page.locator(f"{card} .card-value").bounding_box()
    assert notice.bounding_box()["y"] >= value_box["y"] + value_box["height"] - 1  # under it
    # time sampling continues: the GPU time card has no notice
    assert report.page.query_selector('[data-card="gpu-time"] .notice') is None
    assert report.column_texts("table.gpu-lines", "gpu_memory") == ["—", "—"]


def test_gpu_peak_memory_unavailable_without_a_reason(report, tmp_path):
    out = tmp_path / "noreason.html"
    run_scripted(tmp_path, gpu_scenario(memory_available=False), gpu=True, output=out)
    report.open(out, "#view=gpu")
    assert (report.page.inner_text('[data-card="gpu-memory"] .notice')
            == "no GPU memory measurements were recorded")


def test_gpu_false_has_no_gpu_view_and_no_gpu_columns(report, tmp_path):
    # GIVEN the same GPU-capable backend with gpu=False
    out = tmp_path / "off.html"
    run_scripted(tmp_path, gpu_scenario(), gpu=False, output=out)
    report.open(out)
    # THEN there is no GPU view, a link to it falls back to the overview, and no table has
    # GPU columns
    assert report.page.query_selector('#sidebar a[data-nav="gpu"]') is None
    report.open(out, "#view=gpu")
    assert report.heading() == "Overview"
    assert "gpu_time" not in report.headers(LINES)
    report.open(out, "#file=0")
    assert not {"gpu_time", "gpu_memory"} & set(report.headers("table.source"))
    assert "GPU" not in report.page.inner_text("table.source thead")


def test_trace_with_gpu_has_no_gpu_view_and_shows_the_warning(report, tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    (root / "w.py").write_text("def w():\n    return 1\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("ls_browser_w", root / "w.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "tracegpu.html"
    with pytest.warns(RuntimeWarning):
        with profile(root=root, gpu=True, output=out, display="none"):
            mod.w()
    report.open(out)
    # the diagnostic is shown with the other warnings on the overview
    assert "'trace' backend" in report.page.inner_text(".warnings li")
    # the trace backend does not collect GPU values: no GPU view, no GPU sidebar entry, no
    # GPU headline and no GPU columns anywhere
    assert report.page.query_selector('#sidebar a[data-nav="gpu"]') is None
    assert report.page.query_selector(".gpu-headline") is None
    assert "gpu_time" not in report.headers(LINES)
    report.open(out, "#view=gpu")
    assert report.heading() == "Overview"
    report.open(out, "#file=0")
    assert not {"gpu_time", "gpu_memory"} & set(report.headers("table.source"))
    assert "GPU" not in report.page.inner_text("table.source thead")


def test_custom_backend_with_per_line_gpu_values_only(report, tmp_path):
    # GIVEN a backend declaring gpu=True that returns GPU values only through RawLine.gpu
    out = tmp_path / "custom.html"
    run_scripted(tmp_path, dataclasses.replace(gpu_scenario(), gpu=None), gpu=True,
                 output=out, name="withgpu")
    report.open(out)
    assert "reported by the 'withgpu' backend" in report.page.inner_text(".gpu-headline")
    report.nav("gpu")
    # THEN the cards have the totals and no notice; the headline is a neutral label
    value = lambda card: report.page.inner_text(f'[data-card="{card}"] .card-value')  # noqa: E731
    assert value("gpu-time") == "32.0 ms" and value("gpu-memory") == "520 MiB"
    assert report.page.query_selector(".card .notice") is None
    assert report.page.inner_text(".method") == "GPU numbers: reported by the 'withgpu' backend"
    assert "does not collect" not in report.page.inner_text("main")
    # AND the measured lines show their values; unknown is "—"
    table = "table.gpu-lines"
    assert report.column_texts(table, "gpu_time") == ["30.0 ms", "2.00 ms"]
    assert report.column_texts(table, "gpu_memory") == ["512 MiB", "520 MiB"]
    # AND the source view has the GPU columns with the per-line values
    report.open(out, "#file=0")
    assert {"gpu_time", "gpu_memory"} <= set(report.headers("table.source"))
    assert report.column_texts("table.source", "gpu_time")[3] == "30.0 ms"  # line 4
    assert report.column_texts("table.source", "gpu_memory")[3] == "512 MiB"
    assert report.column_texts("table.source", "gpu_time")[6] == "—"  # line 7: not measured


def _nothing_measured(method: str | None) -> Scenario:
    reason = ("every GPU utilization read failed (gpu0: Unknown Error (NVML error 999))"
              if method else "no supported GPU was found")
    base = gpu_scenario(method=method)
    return dataclasses.replace(
        base, lines=[(ln, wall, hits, GPUStats(None, None) if g else None, mem, peak)
                     for ln, wall, hits, g, mem, peak in base.lines],
        gpu=dataclasses.replace(base.gpu, time_available=False, memory_available=False,
                                time_reason=reason, memory_reason=reason,
                                devices=[] if method is None else base.gpu.devices))


@pytest.mark.parametrize("method, headline", [
    ("nvml-sampled", "No GPU values were measured (collection method: nvml-sampled)."),
    (None, "No GPU values were measured: no GPU collection method was recorded."),
])
def test_headline_when_nothing_was_measured(report, tmp_path, method, headline):
    # GIVEN a GPU collection that measured nothing (every read failed / no device)
    out = tmp_path / "nothing.html"
    scenario = _nothing_measured(method)
    run_scripted(tmp_path, scenario, gpu=True, output=out)
    report.open(out)
    # THEN the overview and the GPU view say so in one clean sentence, claiming no estimate
    assert report.page.inner_text(".gpu-headline") == headline
    report.nav("gpu")
    text = report.page.inner_text(".method")
    assert text == headline
    assert "estimated" not in text and "\u2014" not in text
    assert report.page.query_selector('.facts [data-fact="aggregation"]') is None
    # AND the cards carry the recorded reason
    assert (report.page.inner_text('[data-card="gpu-time"] .notice')
            == scenario.gpu.time_reason)


@pytest.mark.parametrize("method, words", [("nvml-sampled", "summed over GPUs (2 devices here)"),
                                           ("scalene-nvml", "averaged over GPUs (2 devices here)")])
def test_gpu_view_says_how_gpu_time_combines_over_gpus(report, tmp_path, method, words):
    base = gpu_scenario(method=method)
    scenario = dataclasses.replace(base, gpu=dataclasses.replace(
        base.gpu, devices=["NVIDIA H200", "NVIDIA H200"]))
    out = tmp_path / "two.html"
    run_scripted(tmp_path, scenario, gpu=True, output=out)
    report.open(out, "#view=gpu")
    assert words in report.page.inner_text('.facts [data-fact="aggregation"]')


def test_memory_view_when_memory_was_collected(report, tmp_path):
    out = tmp_path / "mem.html"
    run_scripted(tmp_path, memory_scenario(), gpu=False, memory=True, output=out)
    report.open(out)
    report.nav("memory")
    assert report.heading() == "Memory"
    assert report.page.inner_text('[data-card="rss-peak"] .card-value') == "400 MiB"
    assert report.page.inner_text('[data-card="rss-change"] .card-value') == "+5.00 MiB"
    assert "31.0 ms" in report.page.inner_text('[data-card="rss-peak"]')
    # the RSS timeline is drawn with its peak marked
    assert report.page.locator("svg.chart path.line").count() == 1
    assert report.page.locator("svg.chart circle.peak").count() == 1
    # per-line memory: sorted by change, unknown last in both directions
    table = "table.memory-lines"
    assert report.column_texts(table, "memory") == ["+3.00 MiB", "\u22121.00 MiB", "—"]
    report.sort(table, "memory")
    assert report.column_texts(table, "memory") == ["\u22121.00 MiB", "+3.00 MiB", "—"]
    report.sort(table, "memory_peak")
    assert report.column_texts(table, "memory_peak") == ["400 MiB", "300 MiB", "—"]
    # memory columns in the source view
    report.open(out, "#file=0")
    assert {"memory", "memory_peak"} <= set(report.headers("table.source"))


def test_works_from_file_url_with_the_network_blocked(report, tmp_path):
    out = tmp_path / "all.html"
    scenario = gpu_scenario()
    scenario.memory = memory_scenario().memory
    run_scripted(tmp_path, scenario, gpu=True, memory=True, output=out)
    report.open(out)
    for view in ("files", "functions", "memory", "gpu", "source-0", "overview"):
        report.nav(view)
        report.page.wait_for_timeout(20)
    # the fixture also checks: no http(s) request attempted, no CSP violation, no error
    assert report.requests and all(u.startswith("file://") for u in report.requests), \
        report.requests
    assert report.blocked == []


def test_pure_functions_evaluated_in_the_page(report, tmp_path):
    out = tmp_path / "fn.html"
    run_scripted(tmp_path, gpu_scenario(), gpu=True, output=out)
    report.open(out)
    got = report.js("""() => {
        const m = globalThis.__linescope.modules;
        const f = m["lib/format.js"], s = m["lib/sort.js"], l = m["report/links.js"];
        const c = m["lib/chart.js"];
        return {
            ns: [null, undefined, NaN, 0, 850, 1500, 4.56e6, 999.96e6, 1.234e9, 125e9,
                 99960, 9996, 59999999999, 59.96e9, 59.94e9, 7200e9, 200000e9].map(f.formatNs),
            bytes: [null, 512, 1536, 12 * 2 ** 20, 3 * 2 ** 30, 102359].map(f.formatBytes),
            signed: [-1024, 2048, 0, null].map(f.formatSignedBytes),
            count: [1234567, 7, null].map(f.formatCount),
            pct: [0.1234, 0, 0.0001, null].map(f.formatPercent),
            asc: s.sortRows([3, null, 1, NaN, 2], (x) => x, "asc"),
            desc: s.sortRows([3, null, 1, NaN, 2], (x) => x, "desc"),
            strs: s.sortRows(["b", null, "a"], (x) => x, "desc"),
            stable: s.sortRows([[1, "x"], [0, "y"], [1, "z"]], (r) => r[0], "desc").map((r) => r[1]),
            cmp: [s.compareValues(null, 5, "asc"), s.compareValues(null, 5, "desc"),
                  s.compareValues(null, null, "asc")],
            next: [s.nextDirection("a", "desc", "a"), s.nextDirection("a", "asc", "b", "desc")],
            hash: [l.parseHash("#file=2&line=14"), l.parseHash("#view=gpu"),
                   l.parseHash("#view=bogus"), l.parseHash("#file=x")],
            href: l.lineHref(3, 9),
            chartPeaks: (c.lineChartSvg([[0, 1], [1, 9], [2, 3]], {}).match(/class="peak"/g) || []).length,
        };
    }""")
    assert got["ns"] == ["—", "—", "—", "0 ns", "850 ns", "1.50 µs", "4.56 ms", "1.00 s",
                         "1.23 s", "2 min 5 s", "100 µs", "10.0 µs", "1 min 0 s", "1 min 0 s",
                         "59.9 s", "2 h 0 min", "55 h 33 min"]
    assert got["bytes"] == ["—", "512 B", "1.50 KiB", "12.0 MiB", "3.00 GiB", "100 KiB"]
    assert got["signed"] == ["\u22121.00 KiB", "+2.00 KiB", "0 B", "—"]
    assert got["count"] == ["1,234,567", "7", "—"]
    assert got["pct"] == ["12.3%", "0.0%", "<0.1%", "—"]
    # unknown (null, NaN) last in both directions
    unknown = lambda v: v is None or v != v  # noqa: E731  (null or NaN)
    assert got["asc"][:3] == [1, 2, 3] and all(map(unknown, got["asc"][3:]))
    assert got["desc"][:3] == [3, 2, 1] and all(map(unknown, got["desc"][3:]))
    assert got["strs"] == ["b", "a", None]
    assert got["stable"] == ["x", "z", "y"]
    assert got["cmp"] == [1, 1, 0]
    assert got["next"] == ["asc", "desc"]
    assert got["hash"] == [{"view": "source", "file": 2, "line": 14},
                           {"view": "gpu", "file": None, "line": None},
                           {"view": "overview", "file": None, "line": None},
                           {"view": "overview", "file": None, "line": None}]
    assert got["href"] == "#file=3&line=9"
    assert got["chartPeaks"] == 1


def test_a_few_thousand_lines_stay_fast(report, tmp_path):
    # GIVEN a 4000-line file, every line executed
    n = 4000
    source = "".join(f"v{i} = {i} * 2\n" for i in range(1, n + 1))
    scenario = Scenario(lines=[(i, (i * 7919) % 100_003 + 1, i % 13 or None, None, None, None)
                               for i in range(1, n + 1)])
    out = tmp_path / "big.html"
    run_scripted(tmp_path, scenario, gpu=False, output=out, source=source)
    report.open(out)
    # WHEN its source view opens and is sorted by time (timed in the page, layout included),
    # next to a bare <table> with the same rows and cells built the same way (the floor that
    # the browser and this machine set)
    t = report.js("""async () => {
        const settle = () => new Promise((r) => setTimeout(r, 0));
        let t0 = performance.now();
        location.hash = "#file=0";
        while (!document.querySelector("table.source")) await settle();
        document.body.offsetHeight;
        const open = performance.now() - t0;
        const button = document.querySelector('table.source th[data-key="time"] button');
        t0 = performance.now();
        button.click();
        document.body.offsetHeight;
        const sort = performance.now() - t0;
        const table = document.querySelector("table.source");
        const rows = table.tBodies[0].rows.length, cells = table.tBodies[0].rows[0].cells.length;
        const bare = document.createElement("table");
        document.body.append(bare);
        t0 = performance.now();
        const html = [];
        for (let i = 0; i < rows; i++) {
            let tr = "<tr>";
            for (let c = 0; c < cells; c++) tr += `<td>${c ? "1.23 ms" : i}</td>`;
            html.push(tr + "</tr>");
        }
        bare.innerHTML = "<tbody>" + html.join("") + "</tbody>";
        document.body.offsetHeight;
        const floor = performance.now() - t0;
        bare.remove();
        return { open, sort, floor, rows };
    }""")
    # THEN every row is there, and opening / sorting cost a small multiple of the bare table
    assert t["rows"] == n
    print(f"source view of {n} lines: open {t['open']:.0f} ms, sort {t['sort']:.0f} ms, "
          f"bare table {t['floor']:.0f} ms")
    assert t["open"] <= 4 * t["floor"] + 500, t
    assert t["sort"] <= 4 * t["floor"] + 500, t
    first = report.column_texts("table.source", "time")[:2]
    assert all(first)


def test_files_source_column_sorts_by_the_line_count_it_shows(report, tmp_path):
    # GIVEN three profiled files whose snapshots have 8, 6 and 7 lines
    root = tmp_path / "counts"
    root.mkdir()
    import importlib.util
    import sys
    fns = []
    for name, n in (("eight", 8), ("six", 6), ("seven", 7)):
        path = root / f"{name}.py"
        path.write_text("def f():\n    return 1\n" + "".join(f"# {i}\n" for i in range(n - 2)))
        spec = importlib.util.spec_from_file_location(f"ls_count_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        fns.append(mod.f)
    out = tmp_path / "counts.html"
    with profile(root=root, display="none", output=out):
        for f in fns:
            f()
    report.open(out)
    report.nav("files")
    # WHEN the Source column is sorted, both ways
    report.sort("table.files", "snapshot")
    first = report.column_texts("table.files", "snapshot")
    report.sort("table.files", "snapshot")
    second = report.column_texts("table.files", "snapshot")
    # THEN the order follows the counts shown
    counts = [[int(t.split()[0]) for t in texts] for texts in (first, second)]
    assert sorted(counts) == [[6, 7, 8], [8, 7, 6]]


def test_a_narrow_screen_keeps_cards_notices_and_counts_in_view(report, tmp_path):
    # GIVEN a GPU report with a memory notice, and a source line far wider than a phone
    reason = "NVML: per-process memory is not supported (WDDM driver)"
    source = TRAIN_SOURCE.replace("y = x @ w", "y = x @ w  # " + "wide " * 600)
    out = tmp_path / "narrow.html"
    run_scripted(tmp_path, gpu_scenario(memory_reason=reason, memory_available=False),
                 gpu=True, output=out, source=source)
    report.page.set_viewport_size({"width": 375, "height": 740})
    report.open(out)
    width = 375
    # THEN the page is no wider than the screen: the overview's cards and the sidebar's
    # counts are in view, the wide table scrolls inside the content
    assert report.js("() => document.documentElement.scrollWidth") <= width
    for box in report.page.locator(".cards .card").all():
        b = box.bounding_box()
        assert b["x"] >= 0 and b["x"] + b["width"] <= width + 1, b
    for count in report.page.locator("#sidebar .count").all():
        b = count.bounding_box()
        assert b["x"] + b["width"] <= width + 1, b
    # AND the GPU memory card's red notice with its reason is in view
    report.nav("gpu")
    notice = report.page.locator('[data-card="gpu-memory"] .notice')
    assert notice.inner_text() == reason
    b = notice.bounding_box()
    assert b["x"] >= 0 and b["x"] + b["width"] <= width + 1, b
    # AND following a sidebar link shows the view (the sidebar sits above it here)
    report.nav("functions")
    top = report.page.locator("main h1").bounding_box()["y"]
    assert 0 <= top < 740, top


def test_sort_buttons_show_keyboard_focus(report, traced_report):
    report.open(traced_report)
    button = report.page.locator(f"{LINES} th button").first
    button.focus()
    report.page.keyboard.press("Shift+Tab")
    report.page.keyboard.press("Tab")  # focused from the keyboard: :focus-visible applies
    style = report.js("""() => { const b = document.activeElement;
        return [b.tagName, b.classList.contains("sort"), getComputedStyle(b).outlineStyle]; }""")
    assert style[:2] == ["BUTTON", True] and style[2] != "none", style


def test_the_source_column_sorts_by_the_text_it_shows(report, traced_report):
    report.open(traced_report)
    report.sort(LINES, "source")
    texts = report.column_texts(LINES, "source")
    assert texts == sorted(texts)
    report.sort(LINES, "source")
    assert report.column_texts(LINES, "source") == sorted(texts, reverse=True)


def test_inline_notebook_report_navigates_inside_its_frame(report, tmp_path):
    # GIVEN the report as the cell magic shows it (an <iframe srcdoc>) in a notebook-like page
    from linescope._magic import report_iframe

    session = run_scripted(tmp_path, gpu_scenario(), gpu=True)
    page_path = tmp_path / "notebook.html"
    page_path.write_text("<!doctype html><title>notebook</title><h1>notebook page</h1>"
                         + report_iframe(session.result))
    report.page.goto(page_path.resolve().as_uri())
    frame = report.page.frame_locator("iframe")
    frame.locator("body[data-ready]").wait_for()
    # WHEN the GPU entry of its sidebar is clicked, then a measured line's location link
    frame.locator('#sidebar a[data-nav="gpu"]').click()
    frame.locator('[data-card="gpu-time"]').wait_for()
    inner = report.page.frames[1]
    assert inner.url == "about:srcdoc"  # still the report, not the notebook page
    assert inner.locator("h1").first.inner_text() != "notebook page"
    frame.locator("table.gpu-lines tbody tr a").first.click()
    # THEN the source view opens on that line, inside the frame
    target = frame.locator("table.source tr.target")
    target.wait_for()
    assert inner.url == "about:srcdoc"
    assert target.get_attribute("data-line") in ("4", "5")


def test_a_long_source_line_wraps_and_keeps_the_sidebar_in_view(report, tmp_path):
    # GIVEN a profiled file with a 400-character line
    root = tmp_path / "proj"
    root.mkdir()
    url = "https://example.com/" + "a" * 380
    (root / "longline.py").write_text(f'import time\nURL = "{url}"\ndef f():\n'
                                      "    time.sleep(0.001)\nf()\n")
    out = tmp_path / "long.html"
    with profile(root=root, output=out, display="none"):
        exec(compile((root / "longline.py").read_text(), str(root / "longline.py"), "exec"), {})
    # WHEN its source view opens at a line on a desktop-sized window
    report.open(out, "#file=0&line=4")
    # THEN the page is no wider than the window, nothing is scrolled sideways, the sidebar is
    # in view, and the long line is all there (wrapped inside its cell)
    assert report.js("() => document.documentElement.scrollWidth") <= 1280
    assert report.js("() => window.scrollX") == 0
    assert report.page.locator("#sidebar").bounding_box()["x"] == 0
    src = report.page.locator("table.source tr", has_text="URL =").locator("td.src")
    assert url in src.inner_text()
    b = src.bounding_box()
    assert b["x"] + b["width"] <= 1280 and b["height"] > 30  # several visual lines


# ---- highlighting, call links, find box, top bar, theme, memory hover, sampling ----------

HIGHLIGHT_SOURCE = '''\
import functools

@functools.lru_cache(maxsize=8)
def helper(n):
    """Doc string
    spanning "lines" # not a comment
    """
    return n * 2  # twice


def main():
    label = f"n={helper(21)!r} {{literal}}"
    print(len(label), 0x1F, 3.5e-3)
    return helper(4)
'''


def _run_real(tmp_path: Path, files: dict[str, str], entry: str, call: str, **kwargs) -> Path:
    """Profiles `entry.call()` from files written under tmp_path/proj (a real trace run)."""
    import importlib
    import sys
    root = tmp_path / "proj"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    mods = [n[:-3].replace("/", ".") for n in files] + ["pkg"]
    sys.path.insert(0, str(root))
    try:
        for name in mods:
            sys.modules.pop(name, None)
        mod = importlib.import_module(entry)
        out = tmp_path / "real.html"
        with profile(root=root, output=out, display="none", **kwargs):
            getattr(mod, call)()
    finally:
        sys.path.remove(str(root))
        for name in mods:
            sys.modules.pop(name, None)
    return out


def test_source_view_highlights_python_in_both_themes(report, tmp_path):
    # GIVEN a real trace report of a file with a decorator, a docstring over three lines,
    # an f-string, comments, numbers, keywords and builtins
    out = _run_real(tmp_path, {"hl.py": HIGHLIGHT_SOURCE}, "hl", "main")
    report.open(out, "#file=0")
    tokens = report.js("""() => {
        const rows = {};
        for (const tr of document.querySelectorAll('table.source tbody tr')) {
            rows[tr.dataset.line] = [...tr.querySelectorAll('code.py [class^="tok-"]')]
                .map((s) => [s.className.split(" ")[0], s.textContent]);
        }
        return rows;
    }""")
    has = lambda line, cls, text: [cls, text] in tokens[str(line)]  # noqa: E731
    # THEN each kind of token carries its class
    assert has(1, "tok-kw", "import")
    assert has(3, "tok-dec", "@functools.lru_cache") and has(3, "tok-num", "8")
    assert has(4, "tok-kw", "def") and has(4, "tok-def", "helper")
    # the triple-quoted string is a string on every line it spans, "#" inside it too
    assert has(5, "tok-str", '"""Doc string')
    assert tokens["6"] == [["tok-str", '    spanning "lines" # not a comment']]
    assert has(7, "tok-str", '    """')
    assert has(8, "tok-com", "# twice") and has(8, "tok-kw", "return")
    # an f-string: the literal parts are string, the {expression} is code
    assert has(12, "tok-str", 'f"n=') and has(12, "tok-fx", "{") and has(12, "tok-num", "21")
    assert has(12, "tok-str", ' {{literal}}"')
    assert has(13, "tok-bi", "print") and has(13, "tok-bi", "len")
    assert has(13, "tok-num", "0x1F") and has(13, "tok-num", "3.5e-3")
    # the text itself is unchanged
    assert report.page.inner_text('table.source tr[data-line="12"] td.src') == \
        '    label = f"n={helper(21)!r} {{literal}}"'
    # AND the colours differ by kind, and differ between the light and the dark theme
    colours = """() => {
        const c = (sel) => getComputedStyle(document.querySelector(sel)).color;
        return [c('tr[data-line="4"] .tok-kw'), c('tr[data-line="5"] .tok-str'),
                c('tr[data-line="8"] .tok-com'), c('tr[data-line="13"] .tok-num'),
                getComputedStyle(document.body).backgroundColor];
    }"""
    light = report.js(colours)
    assert len(set(light[:4])) == 4, light
    report.page.click("#theme-toggle")
    dark = report.js(colours)
    assert len(set(dark[:4])) == 4, dark
    assert all(a != b for a, b in zip(light, dark)), (light, dark)


def test_a_call_name_jumps_to_its_definition(report, traced_report):
    # GIVEN the trace report of main.py, whose busy() calls square() from pkg/helpers.py
    report.open(traced_report)
    report.page.click('#sidebar .sources a:text-is("main.py")')
    report.wait_heading("main.py")
    # THEN the calls of profiled functions are links; a builtin call is not
    line6 = 'table.source tr[data-line="6"]'
    assert report.page.locator(f"{line6} a.call-link").all_inner_texts() == ["square"]
    assert report.page.locator('table.source tr[data-line="5"] a.call-link').count() == 0
    # WHEN square is clicked
    report.page.click(f'{line6} a.call-link:text-is("square")')
    # THEN its definition opens, in the other file, on its line
    assert report.wait_heading("pkg/helpers.py") == "pkg/helpers.py"
    row = report.page.locator('table.source tr.target')
    row.wait_for()
    assert row.get_attribute("data-line") == "1" and "def square(x):" in row.inner_text()
    # AND within a file: run() -> busy()
    report.page.go_back()
    report.wait_heading("main.py")
    report.page.click('table.source tr[data-line="10"] a.call-link:text-is("busy")')
    report.page.wait_for_function(
        "() => (document.querySelector('table.source tr.target') || {}).dataset?.line === '3'")
    assert report.page.evaluate("location.hash").endswith("&line=3")
    # the overview's source cells link the same way
    report.nav("overview")
    assert report.page.locator(f"{LINES} a.call-link").count() >= 1


def test_find_a_source_filters_as_you_type_and_works_from_the_keyboard(report, traced_report):
    report.open(traced_report)
    sources = lambda: report.page.locator("#sidebar .sources li:visible a").all_inner_texts()  # noqa: E731
    assert sources() == ["main.py", "pkg/helpers.py"]
    box = report.page.locator("#find-source")
    assert box.get_attribute("placeholder").startswith("Find a source")
    # WHEN a part of a name is typed THEN only the matching sources stay, as one types
    box.focus()
    report.page.keyboard.type("HELP")
    assert sources() == ["pkg/helpers.py"]
    assert report.page.inner_text("#find-status") == "1 of 2 sources"
    # words match the name or the path, in any order
    box.fill("py pkg")
    assert sources() == ["pkg/helpers.py"]
    box.fill("nothing-like-this")
    assert sources() == [] and report.page.inner_text("#find-status") == "No source matches"
    # Escape clears; Enter opens the first match
    report.page.keyboard.press("Escape")
    assert sources() == ["main.py", "pkg/helpers.py"]
    report.page.keyboard.type("main")
    report.page.keyboard.press("Enter")
    assert report.wait_heading("main.py") == "main.py"
    # the arrow keys move from the box into the matches and back
    box.fill("")
    box.focus()
    report.page.keyboard.press("ArrowDown")
    assert report.js("() => document.activeElement.textContent") == "main.py"
    report.page.keyboard.press("ArrowDown")
    assert report.js("() => document.activeElement.textContent") == "pkg/helpers.py"
    report.page.keyboard.press("ArrowUp")
    report.page.keyboard.press("ArrowUp")
    assert report.js("() => document.activeElement.id") == "find-source"
    report.page.keyboard.press("ArrowDown")
    report.page.keyboard.press("ArrowDown")
    report.page.keyboard.press("Enter")
    assert report.wait_heading("pkg/helpers.py") == "pkg/helpers.py"


def test_top_bar_shows_status_and_backend(report, traced_report):
    report.open(traced_report)
    bar = report.page.locator("#topbar")
    assert report.page.get_attribute("#topbar .status", "data-status") == "success"
    assert "success" in bar.inner_text()
    assert report.page.inner_text('#topbar [data-fact="backend"]') == "backend trace"
    assert report.page.locator("#topbar .run-error").count() == 0


def test_top_bar_shows_a_failed_run_prominently_with_its_error(report, tmp_path):
    # GIVEN a run whose profiled code raised
    root = tmp_path / "proj"
    root.mkdir()
    (root / "boom.py").write_text("def boom():\n    return 1 / 0\n")
    import sys
    sys.path.insert(0, str(root))
    out = tmp_path / "failed.html"
    try:
        sys.modules.pop("boom", None)
        import boom
        with pytest.raises(ZeroDivisionError):
            with profile(root=root, output=out, display="none"):
                boom.boom()
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("boom", None)
    assert read_payload(out)["status"] == "failed"
    report.open(out)
    # THEN the top bar says "failed", in the error colour, with the error
    status = report.page.locator("#topbar .status")
    assert status.get_attribute("data-status") == "failed"
    assert "failed" in status.inner_text()
    alert = report.page.locator('#topbar .run-error[role="alert"]')
    assert "ZeroDivisionError" in alert.inner_text()
    bg = report.js("() => getComputedStyle(document.querySelector('#topbar .status')).backgroundColor")
    assert bg not in ("rgba(0, 0, 0, 0)", "transparent")


def test_theme_follows_the_system_and_the_toggle_persists(report, traced_report, browser):
    dark_bg = "rgb(20, 23, 28)"
    bg = "() => getComputedStyle(document.body).backgroundColor"
    # GIVEN a light system: the page is light
    report.open(traced_report)
    assert report.js(bg) == "rgb(255, 255, 255)"
    assert report.js("() => document.documentElement.dataset.theme") == "light"
    # WHEN the toggle is clicked THEN the page is dark, and stays dark after a reload
    report.page.click("#theme-toggle")
    assert report.js(bg) == dark_bg
    assert report.js("() => document.documentElement.dataset.theme") == "dark"
    report.page.reload()
    report.page.wait_for_selector("body[data-ready]")
    assert report.js(bg) == dark_bg
    assert report.page.get_attribute("#theme-toggle", "data-theme") == "dark"
    report.page.click("#theme-toggle")
    report.page.reload()
    report.page.wait_for_selector("body[data-ready]")
    assert report.js(bg) == "rgb(255, 255, 255)"
    # AND with a dark system and no stored choice, the page starts dark
    context = browser.new_context(color_scheme="dark")
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(traced_report.resolve().as_uri())
        page.wait_for_selector("body[data-ready]")
        assert page.evaluate(bg) == dark_bg
        # AND without a choice it follows the system when that changes while it is open
        page.emulate_media(color_scheme="light")
        page.wait_for_function("() => document.documentElement.dataset.theme === 'light'")
        assert page.evaluate(bg) == "rgb(255, 255, 255)"
        assert errors == []
    finally:
        context.close()


def test_theme_toggle_works_where_storage_throws(report, tmp_path):
    # GIVEN the report in a sandboxed iframe without same-origin (localStorage throws there)
    import html as html_mod
    session = run_scripted(tmp_path, gpu_scenario(), gpu=True)
    from linescope._report import render_html
    doc = render_html(session.result)
    page_path = tmp_path / "sandboxed.html"
    page_path.write_text('<!doctype html><iframe sandbox="allow-scripts" style="width:900px;'
                         f'height:600px" srcdoc="{html_mod.escape(doc)}"></iframe>')
    report.page.goto(page_path.resolve().as_uri())
    frame = report.page.frame_locator("iframe")
    frame.locator("body[data-ready]").wait_for()
    # WHEN the toggle is clicked THEN the theme switches, without an error
    frame.locator("#theme-toggle").click()
    theme = report.page.frames[1].evaluate("document.documentElement.dataset.theme")
    assert theme == "dark"
    # (the fixture asserts that no page error or console error happened)


def test_memory_chart_shows_time_and_rss_under_the_pointer(report, tmp_path):
    # GIVEN the memory scenario: 50 samples 1 ms apart, 400 MiB at 31 ms
    out = tmp_path / "mem.html"
    run_scripted(tmp_path, memory_scenario(), gpu=False, memory=True, output=out)
    report.open(out, "#view=memory")
    svg = report.page.locator("svg.chart")
    box = svg.bounding_box()
    scale = box["width"] / 720
    readout = report.page.locator(".chart-readout")
    assert readout.is_hidden()
    # WHEN the pointer is over the 31 ms sample (viewBox x = 72 + 632 * 31/49)
    x = box["x"] + (72 + 632 * 31 / 49) * scale
    report.page.mouse.move(x, box["y"] + box["height"] / 2)
    # THEN the readout shows its time and RSS, and a marker sits on it
    assert readout.is_visible()
    assert readout.inner_text() == "31.0 ms \u00b7 RSS 400 MiB"
    assert report.page.get_attribute("svg.chart g.hover", "visibility") == "visible"
    # another point, at the start
    report.page.mouse.move(box["x"] + 72 * scale + 1, box["y"] + box["height"] / 2)
    assert readout.inner_text() == "0 ns \u00b7 RSS 200 MiB"
    # leaving the chart hides it; the keyboard steps through the points
    report.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] + 80)
    assert readout.is_hidden()
    svg.focus()
    report.page.keyboard.press("End")
    assert readout.inner_text().startswith("49.0 ms \u00b7 RSS ")
    report.page.keyboard.press("ArrowLeft")
    assert readout.inner_text().startswith("48.0 ms")


def test_a_sampling_backend_has_no_hits_or_avg_columns(report, tmp_path):
    # GIVEN a real run of the native sampling backend (no hit counts)
    work = "def spin():\n    t = 0\n    for i in range(300000):\n        t += i * i\n    return t\n"
    out = _run_real(tmp_path, {"spin.py": work}, "spin", "spin", backend="sampler")
    payload = read_payload(out)
    assert payload["columns"]["hits"] is False and payload["sampled"] is True
    report.open(out)
    # THEN no table anywhere has a Hits or Avg/hit column; Samples are shown instead
    assert report.page.get_attribute('#topbar [data-fact="backend"] .badge', "class") == "badge"
    for where in ("#view=overview", "#file=0", "#view=files", "#view=functions"):
        report.open(out, where)
        for table in report.page.locator("main table.data").all():
            keys = table.evaluate("(t) => [...t.tHead.rows[0].cells].map((th) => th.dataset.key)")
            assert "hits" not in keys and "avg" not in keys, (where, keys)
            assert "Hits" not in table.locator("thead").inner_text()
    report.open(out, "#file=0")
    assert "samples" in report.headers("table.source")


def test_functions_that_never_ran_show_zero_calls_and_no_bar(report, tmp_path):
    # GIVEN `step` listed with 0 calls (defined, never called) beside `train`
    scenario = gpu_scenario()
    scenario.functions = [("step", 3, 0, 0, 0), ("train", 9, 49_000_000, 100, 1)]
    out = tmp_path / "never.html"
    run_scripted(tmp_path, scenario, gpu=False, output=out)
    report.open(out, "#view=functions")
    table = "table.functions"
    rows = dict(zip(report.column_texts(table, "name"), report.column_texts(table, "calls")))
    # THEN its calls read 0 (a count, not "—"), it is marked, and it has no time bar
    assert rows == {"train": "1", "step never ran": "0"}
    never = report.page.locator(f"{table} tr.never-ran")
    assert never.count() == 1 and "never ran" in never.inner_text()
    assert never.locator(".bar").count() == 0
    assert report.page.locator(f"{table} tr:not(.never-ran) .bar").count() == 1
    assert report.column_texts(table, "avg")[1] == "—"
    report.nav("overview")
    assert "1 never ran" in report.page.inner_text('[data-card="functions"]')


def test_lines_outside_the_captured_source_are_left_out_and_listed(report, tmp_path):
    # GIVEN a custom backend reporting worker.py:99 (a 6-line file) and a line of a file that
    # has no captured source, each with 1000 s of GPU time, beside a measured train.py line
    out = tmp_path / "outside.html"
    worker = tmp_path / "worker.py"
    worker.write_text("a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nf = 6\n")
    _outside_backend(tmp_path, worker, out)
    report.open(out)
    # THEN the overview lists them in a diagnostic
    warnings = report.page.inner_text(".warnings")
    assert "2 lines outside the captured source were left out" in warnings
    assert "worker.py:99 (the file has 6 lines)" in warnings
    assert "(no source was captured)" in warnings
    # AND the GPU view counts only the line inside the source, and says why
    report.nav("gpu")
    assert report.page.inner_text('[data-card="gpu-time"] .card-value') == "30.0 ms"
    assert report.column_texts("table.gpu-lines", "location") == ["train.py:4"]
    assert "left out" in report.page.inner_text(".notice.dropped")


def _outside_backend(root: Path, worker: Path, out: Path) -> None:
    from linescope import (BackendCapabilities, RawBackendResult, RawLine, register_backend)
    from linescope_report_util import write_train
    train = str(write_train(root))
    gone = str(root / "generated" / "gone.py")

    class Outside:
        capabilities = BackendCapabilities(line_time=True, hit_counts=True, gpu=True)

        def __init__(self, options) -> None:
            pass

        def start(self) -> None:
            pass

        def stop(self) -> None:
            pass

        def result(self) -> RawBackendResult:
            return RawBackendResult(lines=[
                RawLine(train, 4, 8_000_000, 10, gpu=GPUStats(30_000_000, None)),
                RawLine(str(worker), 99, 1_000_000, 1, gpu=GPUStats(10**12, None)),
                RawLine(gone, 4, 1_000_000, 1, gpu=GPUStats(10**12, None)),
            ], elapsed_ns=50_000_000)

    register_backend("outside", Outside, replace=True)
    with profile(backend="outside", gpu=True, root=root, display="none", output=out):
        pass


def test_spark_action_page_shows_the_operator_tree(report, tmp_path):
    # GIVEN a report of a session with spark=True (a real local Spark)
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    root = tmp_path / "proj"
    root.mkdir()
    (root / "sjob.py").write_text("def run(spark):\n"
                                  "    df = spark.range(500).selectExpr('id % 3 AS k').groupBy('k').count()\n"
                                  "    return df.collect()\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("sjob_spark_report", root / "sjob.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "spark.html"
    try:
        with profile(root=root, spark=True, output=out, display="none"):
            mod.run(spark)
    finally:
        spark.stop()  # later tests make their own session, with their own settings
    # WHEN the Spark view is opened and the action followed
    report.open(out)
    report.page.click('a[data-nav="spark"]')
    report.page.wait_for_selector('section[data-view="spark"]')
    assert report.heading() == "Spark"
    report.page.click('a[data-spark-action="0"]')
    report.page.wait_for_selector('section[data-view="spark-0"]')
    # THEN the action page shows the operator tree with metrics, plan tabs and stage costs
    assert report.heading() == "Spark: collect"
    assert report.page.locator('li[data-operator="HashAggregate"]').count() >= 1
    assert report.page.locator('li[data-metric="number of output rows"]').count() >= 1
    report.page.click('button[data-plan-tab="optimized"]')
    assert "Aggregate" in report.page.inner_text("pre.spark-plan")
    assert report.page.locator("table.spark-stages tbody tr").count() >= 1
    # AND the action's line, in the source view, carries a badge linking back to it
    report.page.click('section[data-view="spark-0"] p.meta a[href^="#file="]')
    report.page.wait_for_selector('tr[data-line="3"]')
    badge = report.page.locator('tr[data-line="3"] a.spark-badge')
    assert badge.count() == 1 and "collect" in badge.inner_text()
    badge.click()
    report.page.wait_for_selector('section[data-view="spark-0"]')
    assert report.heading() == "Spark: collect"
