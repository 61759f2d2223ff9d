"""Text and file output of a ProfileResult: the terminal summary, the JSON result and the
single-file HTML report (built in C++: gpuprof._native.build_report_payload /
render_report_html, cpp/core/lines/report.h)."""

from __future__ import annotations

import json
import os
from typing import TextIO

from ._model import LineStats, ProfileResult
from ._text import source_lines


def _ms(ns: int | None) -> str:
    """Milliseconds in a 10-wide column; unknown is "—" in the same width."""
    return f"{'—':>10}" if ns is None else f"{ns / 1e6:10.3f}"


def _known_first(ns: int | None) -> tuple[bool, int]:
    """A descending sort key that puts unknown (None) after every known value."""
    return ns is not None, ns or 0


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _bytes(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# The most characters of a source line the summary shows: a longer one (generated code, a
# data literal megabytes long) is cut with "…" and keeps its place and line number.
SUMMARY_SOURCE_WIDTH = 100


def _clip(text: str, width: int = SUMMARY_SOURCE_WIDTH) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


# The most left-out lines the summary names (as the HTML report: lines::kMaxDroppedListed).
DROPPED_LISTED = 10


def _outside_source(result: ProfileResult,
                    rows_of: dict[str, list[str]]) -> tuple[list[LineStats], str | None]:
    """The lines inside a captured source, and the diagnostic for the others (None when there
    are none). A line whose file has no snapshot, or whose number is not a line of it (a
    custom backend's worker.py:99 in a 6-line file), is left out of every total, as the HTML
    report does (lines::BuildReportPayload)."""
    inside: list[LineStats] = []
    left_out: dict[tuple[str, int], str] = {}
    for s in result.run.lines:
        text = result.sources.get(s.filename)
        rows = None
        if text is not None:
            rows = rows_of.get(s.filename)
            if rows is None:
                rows = rows_of[s.filename] = source_lines(text)
        if rows is not None and 0 < s.line <= len(rows):
            inside.append(s)
        else:
            why = ("no source was captured" if rows is None
                   else f"the file has {_count(len(rows), 'line')}")
            left_out.setdefault((s.filename, s.line), why)
    if not left_out:
        return inside, None
    n = len(left_out)
    named = ", ".join(f"{_rel(f)}:{ln} ({why})"
                      for (f, ln), why in sorted(left_out.items())[:DROPPED_LISTED])
    more = f" and {n - DROPPED_LISTED} more" if n > DROPPED_LISTED else ""
    were = "line outside the captured source was" if n == 1 else \
        "lines outside the captured source were"
    return inside, f"{n} {were} left out of every table and total: {named}{more}."


def render_text(result: ProfileResult, top: int = 15) -> str:
    """A plain-text summary: the most expensive lines and functions. When the result has GPU
    values (a GPU collection or per-line GPUStats), the lines table has GPU time and GPU peak
    memory columns of their own, beside (never added to) the driver time. Lines outside the
    captured source are left out (and named in a warning); a sampling backend, which counts
    no hits, has no hits column."""
    run = result.run
    rows_of: dict[str, list[str]] = {}  # each file split once
    inside, left_out = _outside_source(result, rows_of)
    files = len({s.filename for s in inside})
    elapsed = ("elapsed time unknown" if run.elapsed_ns is None
               else f"{_ms(run.elapsed_ns).strip()} ms elapsed")
    out = [f"linescope ({result.backend}): {elapsed}, "
           f"{_count(len(inside), 'line')} in {_count(files, 'file')}, "
           f"{_count(len(run.functions), 'function')}"]
    for w in result.warnings:
        out.append(f"warning: {w}")
    if left_out:
        out.append(f"warning: {left_out}")
    gpu = result.gpu is not None or any(s.gpu is not None for s in inside)
    caps = result.capabilities
    show_hits = (any(s.hits is not None for s in inside)
                 or (caps.hit_counts and not caps.sampled))
    # Most expensive first; what has an unknown time after everything known.
    lines = sorted(inside, key=lambda s: _known_first(s.wall_time_ns), reverse=True)[:top]
    if lines:
        gpu_head = f" {'GPU ms':>10} {'GPU peak':>10}" if gpu else ""
        time_head = "driver ms" if gpu else "time ms"  # GPU time is its own column
        hits_head = f" {'hits':>8}" if show_hits else ""
        out.append(f"{time_head:>10}{hits_head}{gpu_head}  location / source")
        for s in lines:
            rows = rows_of[s.filename]
            src = _clip(rows[s.line - 1].strip())
            hits = (f" {'—' if s.hits is None else str(s.hits):>8}" if show_hits else "")
            gpu_cols = ""
            if gpu:
                g = s.gpu
                gpu_cols = (f" {_ms(g.time_ns if g else None):>10} "
                            f"{_bytes(g.peak_memory_bytes if g else None):>10}")
            out.append(f"{_ms(s.wall_time_ns)}{hits}{gpu_cols}  "
                       f"{_rel(s.filename)}:{s.line}  {src}")
    fns = sorted(run.functions, key=lambda f: _known_first(f.total_time_ns), reverse=True)[:top]
    if fns:
        out.append(f"{'total ms':>10} {'own ms':>10} {'calls':>7}  function")
        for f in fns:
            calls = "—" if f.calls is None else str(f.calls)
            out.append(f"{_ms(f.total_time_ns)} {_ms(f.own_time_ns)} {calls:>7}  "
                       f"{f.qualname} ({_rel(f.filename)}:{f.first_line})")
    out.extend(_spark_text(result, top))  # profile(spark=True)
    return "\n".join(out)


def show(result: ProfileResult, file: TextIO) -> None:
    print(render_text(result), file=file)


def render_html(result: ProfileResult) -> str:
    """The self-contained HTML report of ``result`` (one file, no external requests)."""
    from gpuprof import _native  # the shared native core

    data = json.dumps(result.to_dict(), separators=(",", ":"), ensure_ascii=False)
    # A source snapshot may hold lone surrogates (undecodable bytes); they become "?".
    data = data.encode("utf-8", "replace").decode("utf-8")
    payload = _native.build_report_payload(data)
    return _native.render_report_html(payload)


def save(result: ProfileResult, path: str | os.PathLike[str]) -> str:
    """Writes the result. ``.html`` / ``.htm``: the self-contained HTML report; anything else:
    JSON (format ``linescope-result/1``). Returns the path."""
    path = os.fspath(path)
    if path.lower().endswith((".html", ".htm")):
        text = render_html(result)
    else:
        text = json.dumps(result.to_dict(), separators=(",", ":")) + "\n"
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        # Checked at profile(), but the file system may change during the run.
        why = e.strerror or str(e)
        where = f" ({e.filename})" if e.filename and os.fspath(e.filename) != path else ""
        raise OSError(f"cannot write the linescope report to {path}: {why}{where}") from None
    return path



def open_in_browser(result: ProfileResult, output: str | None) -> str:
    """Writes the HTML report (to `output` when it names an .html file, else to a temporary
    file) and opens it in the default web browser. Returns the file's path."""
    import tempfile
    import webbrowser
    from pathlib import Path

    if output is not None and output.lower().endswith((".html", ".htm")):
        path = save(result, output)
    else:
        with tempfile.NamedTemporaryFile("w", suffix=".html", prefix="linescope-",
                                         encoding="utf-8", delete=False) as f:
            f.write(render_html(result))
            path = f.name
    webbrowser.open(Path(path).resolve().as_uri(), new=2)
    return path


def _spark_text(result: ProfileResult, top: int) -> list[str]:
    """The Spark section: the summary and the costliest actions by driver time, driver and
    executor time in separate columns (never added)."""
    spark = getattr(result, "spark", None)
    if spark is None:
        return []
    out = ["", "Spark"]
    if not spark.available or spark.reason:
        out.append(f"  {spark.reason}")
    execs = result.run.spark_executions
    if not execs:
        return out
    driver, executor = _ms(spark.driver_time_ns).strip(), _ms(spark.executor_time_ns).strip()
    out.append(f"  {_count(len(execs), 'action')} ({spark.failed} failed) · driver {driver} ms"
               f" · executor {executor} ms (sum of task run time; not part of driver time)")
    out.append(f"{'driver ms':>10} {'executor ms':>12} {'rows':>8}  action @ location")
    ranked = sorted(execs, key=lambda e: _known_first(e.driver_time_ns), reverse=True)[:top]
    for e in ranked:
        where = "—" if e.location is None else f"{_rel(e.location.filename)}:{e.location.line}"
        rows = "—" if e.stats.output_rows is None else str(e.stats.output_rows)
        failed = "  FAILED" if e.status == "failed" else ""
        out.append(f"{_ms(e.driver_time_ns)} {_ms(e.executor_time_ns):>12} {rows:>8}  "
                   f"{e.name} @ {where}{failed}")
    return out
