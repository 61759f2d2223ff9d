"""Notebook cells: a session started inside IPython / Jupyter records the cells that run while
it runs, and names each one ``cell N`` (N: the execution count IPython shows as ``In [N]``),
never the temporary file name the kernel compiles it under."""

from __future__ import annotations

import fnmatch
import sys
from typing import Any

# Where IPython and ipykernel put cell code: the terminal's "<ipython-input-N-hash>", the
# kernel's "/tmp/ipykernel_<pid>/<hash>.py".
CELL_PATTERNS = ("<ipython-input-*>", "*/ipykernel_*/*.py")


def shell() -> Any:
    """The running IPython shell, or None (a plain script; IPython never imported here)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:  # an IPython that cannot answer: no notebook
        return None


def in_kernel() -> bool:
    """Whether this runs in a notebook kernel (Jupyter: it can show HTML in the cell), not in
    a terminal IPython or a plain script."""
    return getattr(shell(), "kernel", None) is not None


def running_cell_number(sh: Any) -> int:
    """The execution count of the cell running now (the innermost frame of a compiled cell;
    while a cell runs, IPython's execution_count already names the next one)."""
    numbers = getattr(sh.compile, "_filename_map", None) or {}
    frame = sys._getframe(1)
    while frame is not None:
        n = numbers.get(frame.f_code.co_filename)
        if isinstance(n, int):
            return n
        frame = frame.f_back  # type: ignore[assignment]
    return int(sh.execution_count)


def is_cell_file(filename: str) -> bool:
    return any(fnmatch.fnmatchcase(filename, p) for p in CELL_PATTERNS)


def cell_labels(filenames: list[str]) -> dict[str, str]:
    """``filename -> "cell N"`` for the names in ``filenames`` that IPython compiled a cell
    under (its compiler keeps the execution count of each). Two files of one execution (the
    cell magic compiles its cell body beside the cell itself) get ``cell N``, ``cell N (2)``."""
    sh = shell()
    numbers: dict[str, int] = {}
    try:
        numbers = dict(getattr(sh.compile, "_filename_map", {}) or {}) if sh is not None else {}
    except Exception:  # an IPython without the map: the names stay
        numbers = {}
    labels: dict[str, str] = {}
    taken: dict[str, int] = {}
    for name in sorted(filenames):
        n = numbers.get(name)
        if not isinstance(n, int) or not is_cell_file(name):
            continue
        label = f"cell {n}"
        taken[label] = taken.get(label, 0) + 1
        labels[name] = label if taken[label] == 1 else f"{label} ({taken[label]})"
    return labels
