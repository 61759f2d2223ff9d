"""A backend's raw result, checked and merged into the result's per-line statistics.

linescope's own backends are trusted; a custom backend's result is checked value by value,
with errors that name the backend and the line.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from ._model import GPUStats, LineStats, RawBackendResult, RawFunction, RawLine


def check_raw_result(backend: str, raw: Any, values: bool = True) -> None:
    """A backend's result() must be a RawBackendResult of RawLines and RawFunctions: a clear
    TypeError naming the backend otherwise (not an AttributeError from deep inside). With
    `values` (a backend that is not linescope's own) each line's values are checked too."""
    if not isinstance(raw, RawBackendResult):
        raise TypeError(f"backend {backend!r}: result() must return a linescope."
                        f"RawBackendResult, not {type(raw).__name__}")
    for field, kind in (("lines", RawLine), ("functions", RawFunction)):
        items = getattr(raw, field)
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"backend {backend!r}: RawBackendResult.{field} must be a list, "
                            f"not {type(items).__name__}")
        for x in items:
            if not isinstance(x, kind):
                raise TypeError(f"backend {backend!r}: RawBackendResult.{field} must hold "
                                f"linescope.{kind.__name__} items, not {type(x).__name__}")
            if values and isinstance(x, RawLine):
                _check_raw_line(backend, x)


# RawLine fields holding measured amounts: (name, may be None, may be negative).
_RAW_LINE_AMOUNTS = (("wall_time_ns", True, False), ("hits", True, False),
                     ("memory", True, True), ("samples", True, False),
                     ("self_time_ns", True, False), ("memory_peak", True, False),
                     ("cpu_time_ns", True, False), ("calls", True, False))


def _check_raw_line(backend: str, x: RawLine) -> None:
    """A custom backend's line: known amounts are integers (int, numpy integers; unknown:
    None), durations, counts and peaks are not negative, GPU values come as GPUStats. Clear
    errors naming the line."""
    where = f"backend {backend!r}: RawLine {x.filename!r}:{x.line!r}"

    def amount(name: str, value: Any, nullable: bool, signed: bool) -> None:
        if value is None and nullable:
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            kind = "an int or None" if nullable else "an int"
            raise TypeError(f"{where}: {name} must be {kind}, not {type(value).__name__}")
        if value < 0 and not signed:
            raise ValueError(f"{where}: {name} must not be negative, got {value}")

    if not isinstance(x.filename, (str, os.PathLike)) or not os.fspath(x.filename):
        raise TypeError(f"backend {backend!r}: RawLine.filename must be a non-empty path "
                        f"(str or os.PathLike), not {x.filename!r}")
    if isinstance(x.line, bool) or not isinstance(x.line, numbers.Integral) or x.line < 1:
        raise ValueError(f"{where}: line must be a line number (an int >= 1)")
    for name, nullable, signed in _RAW_LINE_AMOUNTS:
        amount(name, getattr(x, name), nullable, signed)
    if x.gpu is not None:
        if not isinstance(x.gpu, GPUStats):
            raise TypeError(f"{where}: gpu must be a linescope.GPUStats or None, "
                            f"not {type(x.gpu).__name__}")
        amount("gpu.time_ns", x.gpu.time_ns, True, False)
        amount("gpu.peak_memory_bytes", x.gpu.peak_memory_bytes, True, False)



def known_int(value: Any) -> int | None:
    return None if value is None else int(value)


def is_own_backend(factory: Any) -> bool:
    """Whether a backend factory is one of linescope's own (trace, sampler, scalene,
    tachyon), whose results need no value checks."""
    return (getattr(factory, "__module__", "") or "").startswith(__package__ + ".")



def sum_known(values: list[int | None]) -> int | None:
    """The total when every part is known, else unknown: an unknown part is not 0."""
    known = [v for v in values if v is not None]
    return sum(known) if len(known) == len(values) else None


def _max_known(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if len(known) == len(values) else None


def merge_duplicate_lines(lines: list[LineStats],
                          from_sampler: set[tuple[str, int]]) -> list[LineStats]:
    """One LineStats per (file, line): a backend that reports a line twice gets it merged,
    additive fields added and peaks maxed, each known only when every part is. Memory that
    the session's own sampler attributed (`from_sampler`) is per line already: taken once."""
    groups: dict[tuple[str, int], list[LineStats]] = {}
    for s in lines:
        groups.setdefault((s.filename, s.line), []).append(s)
    if len(groups) == len(lines):
        return lines
    out = []
    for key, parts in groups.items():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        first = parts[0]
        if key in from_sampler:
            memory, memory_peak = first.memory_bytes, first.memory_peak_bytes
        else:
            memory = sum_known([p.memory_bytes for p in parts])
            memory_peak = _max_known([p.memory_peak_bytes for p in parts])
        gpu = None
        if any(p.gpu is not None for p in parts):
            gpu = GPUStats(
                sum_known([p.gpu.time_ns if p.gpu else None for p in parts]),
                _max_known([p.gpu.peak_memory_bytes if p.gpu else None for p in parts]))
        out.append(LineStats(
            filename=first.filename, line=first.line,
            wall_time_ns=sum_known([p.wall_time_ns for p in parts]),
            hits=sum_known([p.hits for p in parts]),
            self_time_ns=sum_known([p.self_time_ns for p in parts]),
            memory_bytes=memory, gpu=gpu, memory_peak_bytes=memory_peak,
            cpu_time_ns=sum_known([p.cpu_time_ns for p in parts]),
            samples=sum_known([p.samples for p in parts]),
            calls=sum_known([p.calls for p in parts])))
    return out

