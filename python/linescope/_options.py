"""A session's options: ``profile(...)``'s arguments over ``[tool.linescope]``, validated.

An invalid value raises TypeError / ValueError when the session is created (not when it
starts); one that came from pyproject.toml names that file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _config
from ._backends import BackendFactory, check_utf8_path, get_backend_factory, is_utf8

DISPLAY = ("none", "end")


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


# The default of every profile(...) argument: "not given here" (pyproject.toml, then the
# built-in default, decides). Typed Any so that it fits each argument's annotation.
UNSET: Any = _Unset()


@dataclass
class Options:
    """The validated options of one session (see ``resolve``)."""

    backend: str
    factory: BackendFactory
    gpu: bool
    memory: bool
    root: str | None  # absolute; None: the current directory at start
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    display: str
    output: str | None  # absolute
    sample_rate: float | None
    notebooks: bool  # inside IPython / Jupyter: record the cells that run ("cell N")
    child_notebooks: bool  # accepted for LineScope code; child notebooks are not profiled yet
    spark: bool  # record PySpark actions (python/linescope/_spark.py)
    config_path: Path | None  # the pyproject.toml the defaults came from
    from_config: set[str]  # the options whose value came from that file


def resolve(explicit: dict[str, Any]) -> Options:
    """The session's options: ``explicit`` (the arguments given, by name) over the nearest
    pyproject.toml's ``[tool.linescope]`` over the built-in defaults; each checked in turn."""
    defaults, config_path = _config.load_defaults()
    opts: dict[str, Any] = dict(backend="trace", gpu=False, memory=False, root=None,
                                include=(), exclude=(), display="end", output=None,
                                sample_rate=None, notebooks=True, child_notebooks=True,
                                spark=False)
    opts.update(defaults)
    opts.update(explicit)
    # Options whose value came from pyproject.toml (errors name the file).
    from_config: set[str] = set(defaults) - set(explicit)

    def blame(name: str) -> contextlib.AbstractContextManager[None]:
        return _blame(name, from_config, config_path)

    with blame("backend"):
        if not isinstance(opts["backend"], str):
            raise TypeError(f"backend must be a string, not {opts['backend']!r}")
        backend: str = opts["backend"]
        factory = get_backend_factory(backend)  # unknown -> ValueError
    with blame("gpu"):
        gpu = _bool("gpu", opts["gpu"])
    with blame("memory"):
        memory = _bool("memory", opts["memory"])
    with blame("notebooks"):
        notebooks = _bool("notebooks", opts["notebooks"])
    with blame("child_notebooks"):
        child_notebooks = _bool("child_notebooks", opts["child_notebooks"])
    with blame("spark"):
        spark = _bool("spark", opts["spark"])
    root_v = opts["root"]
    with blame("root"):
        if root_v is not None and not isinstance(root_v, (str, os.PathLike)):
            raise TypeError(f"root must be a path or None, not {root_v!r}")
        if root_v is not None and not os.path.isdir(root_v):
            raise ValueError(f"root {os.fspath(root_v)!r} is not a directory")
    root: str | None = None if root_v is None else os.path.abspath(root_v)
    with blame("root"):
        if root is not None:
            check_utf8_path("root", root)
        else:  # the default root: checked again at start (the directory may change)
            check_utf8_path("the current directory (the default root)", os.getcwd())
    with blame("include"):
        include = packages_as_patterns(_patterns("include", opts["include"]))
    with blame("exclude"):
        exclude = packages_as_patterns(_patterns("exclude", opts["exclude"]))
    with blame("display"):
        if opts["display"] not in DISPLAY:
            raise ValueError(f"display must be one of {', '.join(map(repr, DISPLAY))}, "
                             f"not {opts['display']!r}")
    display: str = opts["display"]
    with blame("output"):
        out = opts["output"]
        output: str | None = None if out is None else output_path(out)
    rate = opts["sample_rate"]
    with blame("sample_rate"):
        if rate is not None and (isinstance(rate, bool)
                                 or not isinstance(rate, (int, float)) or not rate > 0):
            raise ValueError(f"sample_rate must be a positive number of samples per "
                             f"second or None, not {rate!r}")
    sample_rate = None if rate is None else float(rate)
    return Options(backend=backend, factory=factory, gpu=gpu, memory=memory, root=root,
                   include=include, exclude=exclude, display=display, output=output,
                   sample_rate=sample_rate, notebooks=notebooks,
                   child_notebooks=child_notebooks, spark=spark, config_path=config_path,
                   from_config=from_config)


def _patterns(name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, os.PathLike)):
        value = (value,)
    if isinstance(value, (Mapping, bytes)):  # its keys / bytes are no patterns
        raise TypeError(f"{name} must be a string or a sequence of glob patterns, "
                        f"not {type(value).__name__}")
    try:
        items = tuple(os.fspath(p) if isinstance(p, os.PathLike) else p for p in value)
    except TypeError:
        raise TypeError(f"{name} must be a string or a sequence of glob patterns, "
                        f"not {type(value).__name__}") from None
    for p in items:
        if not isinstance(p, str) or not p:
            raise ValueError(f"{name} patterns must be non-empty strings, got {p!r}")
        if not is_utf8(p):
            raise ValueError(f"{name} pattern {os.fsencode(p)!r} is not valid UTF-8: linescope "
                             "matches files by their UTF-8 paths; write the pattern as UTF-8 "
                             "text (a file whose name is not UTF-8 cannot be recorded)")
    return items


_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


def packages_as_patterns(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """include / exclude take globs, paths and importable package or module names: a name
    such as ``mypkg`` or ``mypkg.sub`` that is no existing path and that the import system
    finds becomes its directory's pattern (``/abs/mypkg/*``; a plain module: its file). A
    name found nowhere stays a glob (``utils.py`` is a file pattern)."""
    out: list[str] = []
    for p in patterns:
        out.append(p)
        if not _MODULE_NAME.match(p) or os.path.exists(p):
            continue
        where = _module_location(p)
        if where is not None:
            out[-1] = where
    return tuple(out)


def _module_location(name: str) -> str | None:
    """The pattern of module or package `name` (its directory's ``/*``, or its file), found
    without importing it (a dotted name imports its parent packages, as Python must)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    except Exception:  # a parent package that fails to import: not a package name here
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return os.path.join(os.path.abspath(locations[0]), "*")
    if spec.origin and spec.has_location and os.path.isfile(spec.origin):
        return os.path.abspath(spec.origin)
    return None


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


@contextlib.contextmanager
def _blame(name: str, from_config: set[str], config_path: Path | None) -> Iterator[None]:
    """An invalid value of option `name` that came from pyproject.toml says so."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if name not in from_config:
            raise
        raise type(e)(f"{e} (set by [tool.linescope] in {config_path})") from None


def output_path(out: Any) -> str:
    """The absolute report path (relative paths: against the current directory now, so a
    later os.chdir does not move the report); refuses one that cannot be written."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"output must be a path or None, not {out!r}")
    path = os.path.abspath(os.fspath(out))
    if os.path.isdir(path):
        raise ValueError(f"output {path!r} is a directory; give a file name ending in .html "
                         "(the HTML report) or .json")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise ValueError(f"output {path!r} exists and is not writable; choose another path")
        try:
            with open(path, "ab"):  # opens as saving will (leaves the content alone)
                pass
        except OSError as e:
            raise ValueError(f"output {path!r} cannot be written: {e.strerror}") from None
        return path
    ancestor = os.path.dirname(path)
    while not os.path.exists(ancestor):  # missing parents are created when saving
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(f"output {path!r} cannot be written: {ancestor!r} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"output {path!r} cannot be written: no write permission in "
                         f"{ancestor!r}")
    # Permissions do not tell everything (a read-only or special file system, also for root):
    # a file is created there and removed again.
    try:
        fd, probe = tempfile.mkstemp(prefix=".linescope-probe-", dir=ancestor)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"output {path!r} cannot be written: {e.strerror} in "
                         f"{ancestor!r}") from None
    return path
