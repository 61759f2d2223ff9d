"""The `scalene` backend drives Scalene's internals, so it accepts only the Scalene releases its
adapter is tested with (linescope._scalene.SUPPORTED_SCALENE) and refuses any other at start.

The installed release is read from the package metadata before Scalene is imported, so these
tests need no Scalene installed: the metadata answer is replaced.
"""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from linescope import profile


def _installed_scalene_is(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: version if name == "scalene" else real(name))


@pytest.mark.parametrize("version", ["2.5.0", "2.10.1", "3.0.0", "1.5.55"])
def test_a_scalene_release_outside_the_tested_ones_is_refused_at_start(monkeypatch, version):
    # GIVEN an installed Scalene newer (or older) than the releases the adapter is tested with
    _installed_scalene_is(monkeypatch, version)
    ran = []
    # WHEN a scalene session starts
    # THEN it refuses before the body runs, naming the installed release, the supported ones
    # and how to get one
    with pytest.raises(RuntimeError, match=(
            rf"supports Scalene 2\.0 to 2\.4 .*not the installed Scalene {re.escape(version)}"
            r".*pip install 'scalene>=2\.0,<2\.5'")):
        with profile(backend="scalene", display="none"):
            ran.append(1)
    assert ran == []


def test_an_unreadable_scalene_version_is_refused(monkeypatch):
    # GIVEN package metadata whose version is not major.minor
    _installed_scalene_is(monkeypatch, "unknown")
    # THEN the session refuses rather than patching a release it cannot identify
    with pytest.raises(RuntimeError, match=r"not the installed Scalene unknown"):
        with profile(backend="scalene", display="none"):
            pass
