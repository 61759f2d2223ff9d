"""The names code written for LineScope 0.1.0 uses: ``Config``, ``Session``,
``ProfileController`` (``profile`` / ``profiler``) and its enums. They are thin: a Session is a
``profile`` session, a Config the validated options of one (docs/linescope.md, "Coming from
LineScope")."""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass
from typing import Any

from . import _options
from ._model import ProfileResult
from ._session import profile


class Backend(enum.StrEnum):
    """The built-in backends (a registered custom backend is named by its string)."""

    TRACE = "trace"
    SAMPLER = "sampler"
    SCALENE = "scalene"
    TACHYON = "tachyon"


class DisplayMode(enum.StrEnum):
    """What a session shows when it stops: ``end`` the text summary (the cell magic: the
    report inline), ``none`` nothing."""

    END = "end"
    NONE = "none"


class SourceKind(enum.StrEnum):
    PYTHON = "python"
    NOTEBOOK = "notebook"


class SymbolKind(enum.StrEnum):
    FUNCTION = "function"
    CLASS = "class"
    METHOD = "method"
    NOTEBOOK = "notebook"


@dataclass(frozen=True)
class Config:
    """The options of one session, validated when made (a bad value raises TypeError or
    ValueError naming the option). ``Session(config)`` uses them as given: pyproject's
    ``[tool.linescope]`` applies to keyword options only (``Session(**options)``,
    ``profile(...)``). ``child_notebooks`` is accepted; child notebooks are not profiled yet."""

    backend: str = "trace"
    memory: bool = False
    gpu: bool = False
    root: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    spark: bool = False
    notebooks: bool = True
    child_notebooks: bool = True
    display: str = "end"
    output: str | None = None
    sample_rate: float | None = None

    def __post_init__(self) -> None:
        o = _options.resolve(self._explicit())  # raises on a bad value, naming it
        for name in ("include", "exclude"):
            object.__setattr__(self, name, getattr(o, name))
        object.__setattr__(self, "backend", str(o.backend))
        object.__setattr__(self, "display", str(o.display))
        object.__setattr__(self, "root", o.root)
        object.__setattr__(self, "output", o.output)

    def _explicit(self) -> dict[str, Any]:
        """profile()'s keyword arguments for these options."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class Session(profile):
    """A profiling session: ``Session(config)`` or ``Session(**options)`` (the options of
    ``profile(...)``); the same object ``profile(...)`` makes. ``with Session(...) as s:``,
    ``s.start()`` / ``s.stop()``, ``s.state``, ``s.result``, ``s.save(path)`` (also while it
    runs), ``s.html()``, ``s.show(inline=...)``."""

    def __init__(self, config: Config | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("Session() takes a Config or keyword options, not both")
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"Session(config) needs a linescope.Config, not "
                            f"{type(config).__name__}")
        super().__init__(**(config._explicit() if config is not None else options))


class ProfileController:
    """An independent ``profile`` controller: ``controller(**options)`` makes a Session;
    ``start(**options)`` / ``stop()`` / ``result`` / ``save(path)`` / ``show()`` /
    ``html()`` act on the session it started. The package's ``profile`` and ``profiler``
    are the module-level controller."""

    def __init__(self) -> None:
        self._session: Session | None = None

    def __call__(self, **options: Any) -> Session:
        return Session(**options)

    def start(self, **options: Any) -> Session:
        if self._session is not None and self._session.running:
            raise RuntimeError("this controller's session is already running; stop() it "
                               "before starting another")
        session = Session(**options)
        session.start()
        self._session = session
        return session

    def _current(self) -> Session:
        if self._session is None:
            raise RuntimeError("this controller has not started a session; call start() "
                               "first")
        return self._session

    def stop(self) -> ProfileResult:
        result: ProfileResult = self._current().stop()
        return result

    @property
    def result(self) -> ProfileResult:
        return self._current()._get_result()

    def save(self, path: str | os.PathLike[str]) -> str:
        return self._current()._save(path)

    def html(self) -> str:
        return self._current()._html()

    def show(self, *, inline: bool | None = None) -> None:
        self._current().show(inline=inline)
