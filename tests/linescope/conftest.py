"""Fixtures for linescope tests: workloads are written into a temporary project root and
imported, so that their line numbers are known exactly."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import uuid
from pathlib import Path
from types import ModuleType

import pytest


class Workspace:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> None:
        self.root = root
        self._monkeypatch = monkeypatch
        self.deps = root.parent / "deps"  # outside the root: a "library"

    def dependency(self, name: str, source: str) -> Path:
        """Writes module `name` into a directory OUTSIDE the root and puts that directory on
        sys.path for this test (restored afterwards), so user modules can `import name`."""
        self.deps.mkdir(exist_ok=True)
        path = self.deps / f"{name}.py"
        path.write_text(textwrap.dedent(source).lstrip("\n"))
        if self._monkeypatch is not None and str(self.deps) not in sys.path:
            self._monkeypatch.syspath_prepend(str(self.deps))
        return path

    def write(self, relpath: str, source: str) -> Path:
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"))
        return path

    def spin_module(self, relpath: str) -> ModuleType:
        """A module whose `spin(seconds)` busy-waits on its line 4 (pure Python)."""
        return self.module(relpath, """
            def spin(seconds):
                import time
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    pass
        """)

    def alloc_module(self, relpath: str, mib: int) -> ModuleType:
        """A module whose `f()` allocates `mib` MiB on its line 3, then holds it 20 ms."""
        return self.module(relpath, f"""
            import time
            def f():
                block = bytearray({mib} * 1024 * 1024)
                time.sleep(0.02)
                return len(block)
        """)

    def profile_call(self, fn, **options):
        """Runs fn() in a linescope session (root: this workspace, no display unless given);
        returns the session's result."""
        from linescope import profile

        options.setdefault("root", self.root)
        options.setdefault("display", "none")
        with profile(**options) as session:
            fn()
        return session.result

    def module(self, relpath: str, source: str) -> ModuleType:
        """Writes and imports a module. Line 1 is the first line of the dedented source."""
        path = self.write(relpath, source)
        name = f"ls_{path.stem}_{uuid.uuid4().hex[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    root = tmp_path / "proj"
    root.mkdir()
    return Workspace(root, monkeypatch)


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Run from a directory without pyproject.toml above it ([tool.linescope] is tested apart).
    monkeypatch.chdir(tmp_path)
