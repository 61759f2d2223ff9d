"""linescope's single-file HTML report through the public API: profile(output=...),
profile.save(), the CLI; custom backends drive the GPU and memory sections with known values.
The page itself is tested in Chromium (tests/browser)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from linescope import profile
from linescope_report_util import (MiB, gpu_scenario, memory_scenario, read_payload,
                                   run_scripted)


def by_location(payload, line):
    for entry in payload["lines"]:
        if entry["line"] == line:
            return entry
    raise AssertionError(f"line {line} is not in the report")


def test_output_html_writes_a_self_contained_report(ws, tmp_path):
    # GIVEN a workload under the root
    mod = ws.module("work.py", """
        def f(n):
            total = 0
            for i in range(n):
                total += i
            return total
    """)
    out = tmp_path / "report.html"
    # WHEN it is profiled with output=*.html
    with profile(root=ws.root, output=out, display="none"):
        mod.f(50)
    # THEN one HTML file holds the page, its script, its style and the data
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>")
    assert "default-src 'none'" in page  # a policy that forbids any request
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "<link" not in page and "<script src" not in page
    data = read_payload(out)
    assert data["format"] == "linescope-report/1"
    assert data["files"][0]["display"] == "work.py"
    assert data["files"][0]["source"][0] == "def f(n):"
    assert by_location(data, 4)["hits"] == 50
    fn = next(f for f in data["functions"] if f["name"] == "f")
    assert (fn["line"], fn["calls"]) == (1, 1)
    assert data["overview"]["functions"] == len(data["functions"]) == 1
    # gpu=False: no GPU section, no GPU columns
    assert data["gpu"] is None and data["columns"]["gpu"] is False
    assert all("gpu_time_ns" not in entry for entry in data["lines"])
    assert data["memory"] is None


def test_save_html_htm_and_json(ws, tmp_path):
    mod = ws.module("s.py", """
        def g():
            return 2
    """)
    profile.start(root=ws.root, display="none")
    mod.g()
    profile.stop()
    for name in ("a.html", "b.HTM"):
        path = profile.save(tmp_path / name)
        assert read_payload(Path(path))["overview"]["functions"] == 1
    data = json.loads(Path(profile.save(tmp_path / "c.json")).read_text())
    assert data["format"] == "linescope-result/1"


def test_sources_cannot_break_out_of_the_page(ws, tmp_path):
    # GIVEN source text that contains a closing script tag
    mod = ws.module("evil.py", """
        def h():
            return "</script><script>document.title='pwned'</script><!--"
    """)
    out = tmp_path / "evil.html"
    with profile(root=ws.root, output=out, display="none"):
        mod.h()
    page = out.read_text(encoding="utf-8")
    # THEN the page keeps its own two script elements and the text survives as data
    assert page.count("</script>") == 2
    assert "pwned" in read_payload(out)["files"][0]["source"][1]


def test_cli_writes_the_report_also_when_the_script_fails(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("def work():\n    return sum(range(100))\nwork()\nraise SystemExit(4)\n")
    exe = Path(sys.executable).parent / "linescope"
    p = subprocess.run([str(exe), "-d", "none", "-o", "out.html", "job.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 4, p.stderr
    data = read_payload(tmp_path / "out.html")
    assert by_location(data, 2)["hits"] == 1
    assert data["files"][0]["display"] == "job.py"


def test_cli_help_describes_the_html_report():
    exe = Path(sys.executable).parent / "linescope"
    p = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert "HTML report" in p.stdout and "interim" not in p.stdout


def test_gpu_section_from_a_custom_backend(tmp_path):
    # GIVEN a GPU-capable backend that measured two lines (30 ms + 2 ms, peaks 512/520 MiB)
    out = tmp_path / "gpu.html"
    run_scripted(tmp_path, gpu_scenario(), gpu=True, output=out)
    g = read_payload(out)["gpu"]
    # THEN the cards hold the sum of GPU time, the max of the peaks and the driver time of the
    # measured lines; nothing is unavailable
    assert g["time"] == {"value_ns": 32_000_000, "available": True, "notice": None}
    assert g["memory"] == {"peak_bytes": 520 * MiB, "available": True, "notice": None}
    assert g["driver"]["time_ns"] == 9_000_000 and g["driver"]["basis"] == "measured-lines"
    assert g["method"] == "nvml-sampled" and "estimated" in g["method_label"]
    assert "other processes" in g["scope_note"]
    data = read_payload(out)
    assert sorted(data["lines"][i]["line"] for i in g["lines"]) == [4, 5]
    assert data["columns"]["gpu"] is True
    assert by_location(data, 7)["gpu_time_ns"] is None  # not measured: unknown, not 0


def test_gpu_memory_unavailable_with_and_without_a_reason(tmp_path):
    reason = "NVML: per-process memory is not supported (WDDM driver)"
    run_scripted(tmp_path, gpu_scenario(memory_reason=reason, memory_available=False), gpu=True,
                 output=tmp_path / "r.html")
    mem = read_payload(tmp_path / "r.html")["gpu"]["memory"]
    assert mem == {"peak_bytes": None, "available": False, "notice": reason}
    run_scripted(tmp_path, gpu_scenario(memory_available=False), gpu=True,
                 output=tmp_path / "n.html")
    mem = read_payload(tmp_path / "n.html")["gpu"]["memory"]
    assert mem["notice"] == "no GPU memory measurements were recorded"


def test_gpu_false_has_no_gpu_section_even_with_a_gpu_backend(tmp_path):
    run_scripted(tmp_path, gpu_scenario(), gpu=False, output=tmp_path / "off.html")
    data = read_payload(tmp_path / "off.html")
    assert data["gpu"] is None and data["columns"]["gpu"] is False


def test_gpu_with_trace_records_why_in_the_report(ws, tmp_path):
    mod = ws.module("t.py", """
        def k():
            return 3
    """)
    with pytest.warns(RuntimeWarning):
        with profile(root=ws.root, gpu=True, output=tmp_path / "t.html", display="none"):
            mod.k()
    data = read_payload(tmp_path / "t.html")
    assert any("'trace' backend" in w for w in data["warnings"])
    assert data["gpu"]["collected"] is False and data["columns"]["gpu"] is False
    assert "'trace' backend does not collect GPU" in data["gpu"]["memory"]["notice"]


def test_memory_section_when_memory_was_collected(tmp_path):
    run_scripted(tmp_path, memory_scenario(), gpu=False, memory=True, output=tmp_path / "m.html")
    data = read_payload(tmp_path / "m.html")
    m = data["memory"]
    assert (m["start_bytes"], m["peak_bytes"], m["end_bytes"]) == (200 * MiB, 400 * MiB,
                                                                    205 * MiB)
    assert m["change_bytes"] == 5 * MiB and m["peak_t_ns"] == 31_000_000
    assert data["lines"][m["top_growth"]]["line"] == 4
    assert data["columns"]["memory"] and data["columns"]["memory_peak"]
    # without memory=True: no memory section
    run_scripted(tmp_path, memory_scenario(), gpu=False, memory=False, output=tmp_path / "x.html")
    assert read_payload(tmp_path / "x.html")["memory"] is None
