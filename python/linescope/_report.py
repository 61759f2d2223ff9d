"""Text and file output of a ProfileResult (the HTML report is a later increment)."""

from __future__ import annotations

import html
import json
import os
from typing import Any, TextIO

from ._model import ProfileResult


def _ms(ns: int | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:10.3f}"


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def render_text(result: ProfileResult, top: int = 15) -> str:
    """A plain-text summary: the most expensive lines and functions."""
    run = result.run
    out = [f"linescope ({result.backend}): {_ms(run.elapsed_ns).strip()} ms elapsed, "
           f"{len(run.lines)} lines in {len({s.filename for s in run.lines})} files, "
           f"{len(run.functions)} functions"]
    for w in result.warnings:
        out.append(f"warning: {w}")
    lines = sorted(run.lines, key=lambda s: s.wall_time_ns, reverse=True)[:top]
    if lines:
        out.append(f"{'time ms':>10} {'hits':>8}  location / source")
        for s in lines:
            src = ""
            text = result.sources.get(s.filename)
            if text is not None:
                rows = text.splitlines()
                if 0 < s.line <= len(rows):
                    src = rows[s.line - 1].strip()
            hits = "—" if s.hits is None else str(s.hits)
            out.append(f"{_ms(s.wall_time_ns)} {hits:>8}  {_rel(s.filename)}:{s.line}  {src}")
    fns = sorted(run.functions, key=lambda f: f.total_time_ns or 0, reverse=True)[:top]
    if fns:
        out.append(f"{'total ms':>10} {'own ms':>10} {'calls':>7}  function")
        for f in fns:
            calls = "—" if f.calls is None else str(f.calls)
            out.append(f"{_ms(f.total_time_ns)} {_ms(f.own_time_ns)} {calls:>7}  "
                       f"{f.qualname} ({_rel(f.filename)}:{f.first_line})")
    return "\n".join(out)


def show(result: ProfileResult, file: TextIO) -> None:
    print(render_text(result), file=file)


def save(result: ProfileResult, path: str | os.PathLike[str]) -> str:
    """Writes the result. ``.html``: a self-contained interim page (text summary plus the JSON
    data embedded); anything else: JSON (format ``linescope-result/1``). Returns the path."""
    path = os.fspath(path)
    if path.endswith((".html", ".htm")):
        text = render_html(result)
    else:
        text = json.dumps(result.to_dict(), indent=None, separators=(",", ":")) + "\n"
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def render_html(result: ProfileResult) -> str:
    """The report as one self-contained HTML page."""
    payload = json.dumps(result.to_dict(), indent=None, separators=(",", ":"))
    embedded = payload.replace("</", "<\\/")
    return ("<!doctype html><meta charset=utf-8><title>linescope</title>"
            "<p>Interim report (the interactive HTML report is not built yet).</p>"
            f"<pre>{html.escape(render_text(result, top=50))}</pre>"
            "<script type=application/json id=linescope-data>"
            f"{embedded}</script>\n")
