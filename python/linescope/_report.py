"""Text and file output of a ProfileResult: the terminal summary, the JSON result and the
single-file HTML report (built in C++: gpuprof._native.build_report_payload /
render_report_html, cpp/core/lines/report.h)."""

from __future__ import annotations

import json
import os
from typing import TextIO

from ._model import ProfileResult
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


def render_text(result: ProfileResult, top: int = 15) -> str:
    """A plain-text summary: the most expensive lines and functions. When the result has GPU
    values (a GPU collection or per-line GPUStats), the lines table has GPU time and GPU peak
    memory columns of their own, beside (never added to) the driver time."""
    run = result.run
    files = len({s.filename for s in run.lines})
    elapsed = ("elapsed time unknown" if run.elapsed_ns is None
               else f"{_ms(run.elapsed_ns).strip()} ms elapsed")
    out = [f"linescope ({result.backend}): {elapsed}, "
           f"{_count(len(run.lines), 'line')} in {_count(files, 'file')}, "
           f"{_count(len(run.functions), 'function')}"]
    for w in result.warnings:
        out.append(f"warning: {w}")
    gpu = result.gpu is not None or any(s.gpu is not None for s in run.lines)
    # Most expensive first; what has an unknown time after everything known.
    lines = sorted(run.lines, key=lambda s: _known_first(s.wall_time_ns), reverse=True)[:top]
    rows_of: dict[str, list[str]] = {}  # each file split once
    if lines:
        gpu_head = f" {'GPU ms':>10} {'GPU peak':>10}" if gpu else ""
        time_head = "driver ms" if gpu else "time ms"  # GPU time is its own column
        out.append(f"{time_head:>10} {'hits':>8}{gpu_head}  location / source")
        for s in lines:
            src = ""
            text = result.sources.get(s.filename)
            if text is not None:
                rows = rows_of.get(s.filename)
                if rows is None:
                    rows = rows_of[s.filename] = source_lines(text)
                if 0 < s.line <= len(rows):
                    src = _clip(rows[s.line - 1].strip())
            hits = "—" if s.hits is None else str(s.hits)
            gpu_cols = ""
            if gpu:
                g = s.gpu
                gpu_cols = (f" {_ms(g.time_ns if g else None):>10} "
                            f"{_bytes(g.peak_memory_bytes if g else None):>10}")
            out.append(f"{_ms(s.wall_time_ns)} {hits:>8}{gpu_cols}  "
                       f"{_rel(s.filename)}:{s.line}  {src}")
    fns = sorted(run.functions, key=lambda f: _known_first(f.total_time_ns), reverse=True)[:top]
    if fns:
        out.append(f"{'total ms':>10} {'own ms':>10} {'calls':>7}  function")
        for f in fns:
            calls = "—" if f.calls is None else str(f.calls)
            out.append(f"{_ms(f.total_time_ns)} {_ms(f.own_time_ns)} {calls:>7}  "
                       f"{f.qualname} ({_rel(f.filename)}:{f.first_line})")
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

