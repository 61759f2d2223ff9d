"""Helpers for tests of linescope's HTML report: scripted backends that return known GPU and
memory values through the public backend API (register_backend + RawBackendResult), and a
reader for the payload the report inlines (format linescope-report/1, docs/linescope.md)."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linescope import (BackendCapabilities, GPUStats, RawBackendResult, RawLine, profile,
                       register_backend)
from linescope._model import GPUCollection, MemoryProfile, RawFunction

MiB = 1 << 20

# A small "training" file whose lines the scripted backends report on.
TRAIN_SOURCE = textwrap.dedent("""\
    import math

    def step(x, w):
        y = x @ w
        loss = y.sum()
        loss.backward()
        return loss.item()

    def train(n):
        for i in range(n):
            step(i, i)

    train(10)
    """)


@dataclass
class Scenario:
    """What a scripted backend returns. Lines: (line, wall_ns, hits, gpu: GPUStats | None,
    memory_bytes, memory_peak_bytes)."""

    lines: list[tuple[int, int, int | None, GPUStats | None, int | None, int | None]]
    gpu: GPUCollection | None = None
    memory: MemoryProfile | None = None
    elapsed_ns: int | None = 100_000_000
    warnings: list[str] = field(default_factory=list)
    functions: list[tuple[str, int, int | None, int | None, int | None]] = field(
        default_factory=list)  # (qualname, first_line, total_ns, own_ns, calls)


def write_train(root: Path, source: str = TRAIN_SOURCE) -> Path:
    path = root / "train.py"
    path.write_text(source)
    return path


def run_scripted(root: Path, scenario: Scenario, *, gpu: bool, memory: bool = False,
                 output: Path | None = None, name: str = "scripted",
                 source: str = TRAIN_SOURCE) -> profile:
    """Profiles nothing with a backend that returns `scenario` for root/train.py (whose text
    is `source`)."""
    src = str(write_train(root, source))

    class Scripted:
        capabilities = BackendCapabilities(line_time=True, hit_counts=True, gpu=True,
                                           memory=True, function_stats=True)

        def __init__(self, options: Any) -> None:
            self.options = options

        def start(self) -> None:
            pass

        def stop(self) -> None:
            pass

        def result(self) -> RawBackendResult:
            lines = [RawLine(src, ln, wall, hits, mem, g, None, memory_peak=peak)
                     for ln, wall, hits, g, mem, peak in scenario.lines]
            fns = [RawFunction(src, q, first, total, own, calls)
                   for q, first, total, own, calls in scenario.functions]
            return RawBackendResult(lines=lines, functions=fns, elapsed_ns=scenario.elapsed_ns,
                                    warnings=list(scenario.warnings), memory=scenario.memory,
                                    gpu=scenario.gpu)

    register_backend(name, Scripted, replace=True)
    with profile(backend=name, gpu=gpu, memory=memory, root=root, display="none",
                 output=output) as session:
        pass
    return session


def gpu_scenario(memory_reason: str | None = None, memory_available: bool = True,
                 method: str = "nvml-sampled") -> Scenario:
    """Two GPU-measured lines (4: 30 ms / 512 MiB, 5: 2 ms / 520 MiB), one line with an empty
    GPUStats (6), and CPU-only lines. When memory is unavailable the peaks are None."""
    peak4 = 512 * MiB if memory_available else None
    peak5 = 520 * MiB if memory_available else None
    return Scenario(
        lines=[(4, 8_000_000, 10, GPUStats(30_000_000, peak4), None, None),
               (5, 1_000_000, 10, GPUStats(2_000_000, peak5), None, None),
               (6, 3_000_000, 10, GPUStats(None, None), None, None),
               (7, 12_000_000, 10, None, None, None),
               (11, 25_000_000, None, None, None, None),
               (13, 50_000_000, 1, None, None, None)],
        functions=[("step", 3, 24_000_000, 24_000_000, 10), ("train", 9, 49_000_000, 100, 1)],
        gpu=GPUCollection(method=method, time_available=True, memory_available=memory_available,
                          memory_reason=memory_reason, devices=["NVIDIA H200"],
                          utilization_scope="device"))


def memory_scenario() -> Scenario:
    timeline = [(i * 1_000_000, 200 * MiB + (i % 7) * MiB) for i in range(50)]
    timeline[31] = (31 * 1_000_000, 400 * MiB)
    return Scenario(
        lines=[(4, 8_000_000, 10, None, 3 * MiB, 300 * MiB),
               (5, 1_000_000, 10, None, -1 * MiB, None),
               (7, 12_000_000, 10, None, None, 400 * MiB)],
        memory=MemoryProfile(timeline=timeline, start_rss_bytes=200 * MiB,
                             peak_rss_bytes=400 * MiB, end_rss_bytes=205 * MiB,
                             interval_ns=1_000_000, per_line=True))


_DATA = re.compile(r'<script type="application/json" id="linescope-data">(.*?)</script>', re.S)


def read_payload(html_path: Path) -> dict[str, Any]:
    """The linescope-report/1 payload inlined in a report."""
    match = _DATA.search(Path(html_path).read_text(encoding="utf-8"))
    assert match, "the report has no inline data script"
    return json.loads(match.group(1))
