"""gpuprof: why is my training slow? One-sentence diagnoses for PyTorch training loops.

Public API::

    import gpuprof
    with gpuprof.profile("my-experiment"):
        for batch in dataloader:
            ...

The measuring, storing and deciding happen in the native core (``gpuprof._native``); this
package only holds what must touch Python objects.
"""

from __future__ import annotations

import sys
from typing import Any

from ._flops import TransformerArch
from ._deepspeed import wrap_deepspeed_engine
from ._profile import GpuprofWarning, Profile, Step, profile

__all__ = ["profile", "Profile", "Step", "TransformerArch", "GpuprofWarning", "LightningCallback",
           "HFTrainerCallback", "wrap_deepspeed_engine", "__version__"]


def __getattr__(name: str) -> Any:  # the trainer integrations import their framework on use
    if name == "LightningCallback":
        from ._lightning import lightning_callback_class
        return lightning_callback_class()
    if name == "HFTrainerCallback":
        from ._hf import hf_trainer_callback_class
        return hf_trainer_callback_class()
    raise AttributeError(f"module 'gpuprof' has no attribute {name!r}")

if "torch" in sys.modules:
    # A DDP comm hook registered from here on is wrapped (transparently) so that a profile
    # started later still times its buckets; see _distributed.install_registration_shim.
    from ._distributed import install_registration_shim as _shim
    _shim()


def _version() -> str:
    """The one version, pyproject.toml's, as installed (the extension carries the same)."""
    from importlib import metadata
    try:
        return metadata.version("gpuprof")
    except metadata.PackageNotFoundError:  # run from a source tree or a staging directory
        try:
            from . import _native
        except ImportError:  # pragma: no cover - a broken install; profile() says why
            return "0+unknown"
        # (getattr: nanobind's stubgen leaves __version__ out of _native.pyi)
        return str(getattr(_native, "__version__", "0+unknown"))


__version__ = _version()
