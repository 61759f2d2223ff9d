"""linescope's single-file HTML report through the public API: profile(output=...),
profile.save(), the CLI; custom backends drive the GPU and memory sections with known values.
The page itself is tested in Chromium (tests/browser)."""

from __future__ import annotations

import dataclasses
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


def test_file_names_are_relative_to_the_default_root_too(ws, tmp_path, monkeypatch):
    # GIVEN files in a package under the current directory (the default root) and a library
    # file outside it that an include pattern records
    lib = ws.dependency("or_displib", "def g():\n    return 2\n")
    pkg = ws.module("src/mod.py", """
        import or_displib
        def f():
            return or_displib.g()
    """)
    monkeypatch.chdir(ws.root)
    out = tmp_path / "d.html"
    # WHEN it is profiled without root=
    with profile(include=[str(lib)], output=out, display="none"):
        pkg.f()
    # THEN the files under the root are named relative to it, the other one by its path from
    # the files' common directory
    names = sorted(f["display"] for f in read_payload(out)["files"])
    assert "src/mod.py" in names, names
    assert any(n.endswith("or_displib.py") and n != str(lib) for n in names), names


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


def test_gpu_with_trace_has_no_gpu_section_and_the_warning_on_the_overview(ws, tmp_path):
    mod = ws.module("t.py", """
        def k():
            return 3
    """)
    with pytest.warns(RuntimeWarning):
        with profile(root=ws.root, gpu=True, output=tmp_path / "t.html", display="none"):
            mod.k()
    data = read_payload(tmp_path / "t.html")
    # THEN the diagnostic is among the warnings, and there is no GPU section or column: the
    # trace backend does not collect GPU measurements
    assert sum("'trace' backend" in w for w in data["warnings"]) == 1
    assert data["gpu"] is None and data["columns"]["gpu"] is False
    assert all("gpu_time_ns" not in entry for entry in data["lines"])
    assert all("gpu_time_ns" not in f for f in data["files"])


def test_custom_backend_with_per_line_gpu_values_only(tmp_path):
    # GIVEN a backend that declares gpu=True and returns GPU values only through RawLine.gpu
    # (no GPUCollection)
    out = tmp_path / "custom.html"
    session = run_scripted(tmp_path, dataclasses.replace(gpu_scenario(), gpu=None), gpu=True,
                           output=out, name="withgpu")
    assert session.result.gpu is None
    data = read_payload(out)
    g = data["gpu"]
    # THEN the report shows the per-line GPU values and the card totals, without a notice
    assert data["columns"]["gpu"] is True
    assert by_location(data, 4)["gpu_time_ns"] == 30_000_000
    assert by_location(data, 4)["gpu_peak_bytes"] == 512 * MiB
    assert by_location(data, 7)["gpu_time_ns"] is None
    assert g["time"] == {"value_ns": 32_000_000, "available": True, "notice": None}
    assert g["memory"] == {"peak_bytes": 520 * MiB, "available": True, "notice": None}
    # AND a neutral method label, no claim that the backend collects nothing
    assert g["method"] is None and g["method_label"] == "reported by the 'withgpu' backend"
    assert "does not collect" not in json.dumps(data)


def test_every_gpu_read_failing_makes_no_method_claim(ws, fake_nvml, tmp_path):
    # GIVEN the sampler on a GPU whose utilization and memory reads all fail
    fake_nvml("""
        devices 1
        gpu * util 70
        gpu 0 process self 2147483648
        gpu * fail util after 0
        gpu * fail proc_mem after 0
    """)
    mod = ws.spin_module("spin.py")
    out = tmp_path / "allfail.html"
    with profile(backend="sampler", gpu=True, root=ws.root, output=out, display="none"):
        mod.spin(0.15)
    g = read_payload(out)["gpu"]
    # THEN the GPU view's headline says nothing was measured instead of naming an estimate
    assert g["measured"] is False
    assert g["headline"] == "No GPU values were measured (collection method: nvml-sampled)."
    assert "estimated" not in g["headline"]
    # AND the cards' notices name NVML's error
    assert "Unknown Error (NVML error 999)" in g["time"]["notice"]
    assert "Unknown Error (NVML error 999)" in g["memory"]["notice"]


def test_sampler_report_says_gpu_time_is_summed_over_gpus(ws, fake_nvml, tmp_path):
    # GIVEN two GPUs at 50 % each, this process holding memory on both
    fake_nvml("""
        devices 2
        gpu * util 50
        gpu 0 process self 1000000
        gpu 1 process self 1000000
    """)
    mod = ws.spin_module("two.py")
    out = tmp_path / "two.html"
    with profile(backend="sampler", gpu=True, root=ws.root, output=out, display="none") as s:
        mod.spin(0.3)
    here = [x for x in s.result.lines if x.filename == str(ws.root / "two.py") and x.gpu
            and x.gpu.time_ns]
    # THEN GPU time is the busy time summed over both GPUs: ~100 % of the lines' wall time
    assert sum(x.gpu.time_ns for x in here) == pytest.approx(
        sum(x.wall_time_ns for x in here), rel=0.2)
    g = read_payload(out)["gpu"]
    assert g["aggregation"] == "sum" and "summed over GPUs (2 devices here)" in g["aggregation_note"]


def test_text_summary_has_gpu_columns_when_gpu_was_measured(tmp_path, capsys):
    # GIVEN a GPU-capable backend that measured lines 4 (30 ms, 512 MiB) and 5 (2 ms, 520 MiB)
    session = run_scripted(tmp_path, gpu_scenario(), gpu=True)
    session.show()
    text = capsys.readouterr().out
    rows = text.splitlines()
    head = next(r for r in rows if "location / source" in r)
    # THEN the lines table has GPU time and GPU peak memory beside the driver time
    assert head.split()[:6] == ["driver", "ms", "hits", "GPU", "ms", "GPU"]
    row4 = next(r for r in rows if "train.py:4 " in r)
    assert row4.split()[:4] == ["8.000", "10", "30.000", "512.0"]
    # AND a line without GPU values shows "—" for both, never 0
    row7 = next(r for r in rows if "train.py:7 " in r)
    assert row7.split()[:4] == ["12.000", "10", "—", "—"]


def test_text_summary_keeps_its_columns_when_values_are_unknown(tmp_path, capsys):
    # GIVEN a backend that knows one function's total but not its own time or calls
    from linescope import (BackendCapabilities, RawBackendResult, RawFunction, RawLine,
                           register_backend)
    here = str(tmp_path / "m.py")
    Path(here).write_text("a = 1\nb = 2\n")  # lines outside a captured source are left out

    class Partial:
        capabilities = BackendCapabilities(function_stats=True)
        def __init__(self, options): pass
        def start(self): pass
        def stop(self): pass
        def result(self):
            return RawBackendResult(
                lines=[RawLine(here, 1, None, hits=1), RawLine(here, 2, 1_000_000, hits=None)],
                functions=[RawFunction(here, "f", 1, total_time_ns=3_000_000,
                                       own_time_ns=None, calls=None),
                           RawFunction(here, "g", 1, total_time_ns=2_000_000,
                                       own_time_ns=1_000_000, calls=2)])

    register_backend("partial-summary", Partial)
    with profile(backend="partial-summary", display="end"):
        pass
    rows = capsys.readouterr().err.splitlines()
    # THEN every "—" sits in its column: the name starts where it does in a known row
    f_row = next(r for r in rows if r.endswith(" f (m.py:1)") or " f (" in r)
    g_row = next(r for r in rows if " g (" in r)
    assert f_row.index(" f (") == g_row.index(" g (")
    assert f_row.split()[:3] == ["3.000", "—", "—"]
    line_rows = [r for r in rows if "m.py:" in r and "(" not in r]
    assert len({r.index("m.py:") for r in line_rows}) == 1


def test_text_summary_has_no_gpu_columns_without_gpu(tmp_path, capsys):
    session = run_scripted(tmp_path, gpu_scenario(), gpu=False)
    session.show()
    text = capsys.readouterr().out
    assert "GPU" not in text
    assert any(r.split()[:2] == ["time", "ms"] for r in text.splitlines())


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


# ---- lines outside the captured source, run status, sampling, functions that never ran ----

def _outside_run(tmp_path, **kwargs):
    """A custom GPU backend reporting train.py:4 (inside its 13 lines), worker.py:99 (a
    6-line file) and a line of a file without a captured source, each of the two with 1000 s
    of GPU time."""
    from linescope import (BackendCapabilities, GPUStats, RawBackendResult, RawLine,
                           register_backend)
    from linescope_report_util import write_train
    train = str(write_train(tmp_path))
    worker = tmp_path / "worker.py"
    worker.write_text("a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nf = 6\n")
    gone = str(tmp_path / "generated" / "gone.py")

    class Outside:
        capabilities = BackendCapabilities(gpu=True)
        def __init__(self, options): pass
        def start(self): pass
        def stop(self): pass
        def result(self):
            return RawBackendResult(lines=[
                RawLine(train, 4, 8_000_000, 10, gpu=GPUStats(30_000_000, None)),
                RawLine(str(worker), 99, 1_000_000, 1, gpu=GPUStats(10**12, None)),
                RawLine(gone, 4, 2_000_000, 1, gpu=GPUStats(10**12, None)),
            ], elapsed_ns=50_000_000)

    register_backend("outside-source", Outside, replace=True)
    with profile(backend="outside-source", gpu=True, root=tmp_path, **kwargs) as session:
        pass
    return session


def test_lines_outside_the_captured_source_are_left_out_of_the_report(tmp_path):
    # GIVEN a backend reporting worker.py:99 in a 6-line file and a file with no source
    out = tmp_path / "outside.html"
    _outside_run(tmp_path, display="none", output=out)
    payload = read_payload(out)
    # THEN the GPU totals count only train.py:4 (not 2000 s more: "33 min")
    assert payload["gpu"]["time"]["value_ns"] == 30_000_000
    assert [(payload["files"][entry["file"]]["display"], entry["line"])
            for entry in payload["lines"]] == [("train.py", 4)]
    assert payload["overview"]["executed_lines"] == 1
    assert payload["overview"]["line_time_ns"] == 8_000_000
    assert {f["display"] for f in payload["files"]} == {"train.py", "worker.py"}
    # AND the left-out lines are named, with why
    dropped = payload["dropped"]
    assert dropped["count"] == 2
    assert dropped["message"] == (
        "2 lines outside the captured source were left out of every table and total: "
        "generated/gone.py:4 (no source was captured), worker.py:99 (the file has 6 lines).")


def test_text_summary_does_not_count_lines_outside_the_captured_source(tmp_path, capsys):
    session = _outside_run(tmp_path, display="none")
    session.show()
    text = capsys.readouterr().out
    # THEN the header counts the one line inside a source, the table lists only it
    assert text.splitlines()[0].endswith("1 line in 1 file, 0 functions")
    assert "train.py:4" in text
    assert not any(r.lstrip().startswith(("1.000", "2.000")) for r in text.splitlines())
    # AND a warning names the others
    warning = next(r for r in text.splitlines() if "outside the captured source" in r)
    assert "2 lines outside the captured source were left out" in warning
    assert "worker.py:99 (the file has 6 lines)" in warning
    assert "gone.py:4 (no source was captured)" in warning


def test_text_summary_of_a_sampling_backend_has_no_hits_column(ws, capsys):
    mod = ws.module("spin.py", """
        def spin():
            t = 0
            for i in range(300000):
                t += i * i
            return t
        """)
    with profile(backend="sampler", root=ws.root, display="none") as session:
        mod.spin()
    session.show()
    head = next(r for r in capsys.readouterr().out.splitlines() if "location / source" in r)
    assert "hits" not in head


def test_report_payload_has_the_run_status_and_the_call_targets(ws, tmp_path):
    mod = ws.module("calls.py", """
        def helper(x):
            return x + 1

        def main():
            return helper(1)
        """)
    out = tmp_path / "calls.html"
    with profile(root=ws.root, output=out, display="none"):
        mod.main()
    payload = read_payload(out)
    # THEN a run that did not fail is "success", with no error
    assert payload["status"] == "success" and payload["error"] is None
    # AND each profiled function is a call target at its definition line
    targets = {s["name"]: s["line"] for s in payload["symbols"]}
    assert targets["helper"] == 1 and targets["main"] == 4
    assert payload["columns"]["hits"] is True


def test_a_failed_run_is_failed_in_the_report_with_its_error(ws, tmp_path):
    mod = ws.module("fails.py", """
        def fail():
            raise KeyError("missing")
        """)
    out = tmp_path / "fails.html"
    with pytest.raises(KeyError):
        with profile(root=ws.root, output=out, display="none"):
            mod.fail()
    payload = read_payload(out)
    assert payload["status"] == "failed"
    assert "missing" in payload["error"]
