"""Option defaults from ``[tool.linescope]`` in the nearest pyproject.toml."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

OPTION_NAMES = ("backend", "gpu", "memory", "root", "include", "exclude", "display", "output",
                "sample_rate", "notebooks", "child_notebooks", "spark")


def find_pyproject(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest pyproject.toml at or above ``start`` (default: cwd)."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_defaults(
        start: str | os.PathLike[str] | None = None) -> tuple[dict[str, Any], Path | None]:
    """``[tool.linescope]`` of the nearest pyproject.toml; relative paths in ``root`` and
    ``output`` are taken relative to that file's directory. Unknown keys raise ValueError."""
    path = find_pyproject(start)
    if path is None:
        return {}, None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read [tool.linescope] from {path}: {e}") from None
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ValueError(f"[tool] in {path} must be a table (it holds [tool.linescope])")
    section = tool.get("linescope", {})
    if not isinstance(section, dict):
        raise ValueError(f"[tool.linescope] in {path} must be a table")
    unknown = sorted(set(section) - set(OPTION_NAMES))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} in [tool.linescope] of {path}; "
                         f"valid: {', '.join(OPTION_NAMES)}")
    out = dict(section)
    for key in ("root", "output"):
        if isinstance(out.get(key), str) and not os.path.isabs(out[key]):
            out[key] = str(path.parent / out[key])
    return out, path
