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

from ._flops import TransformerArch
from ._deepspeed import wrap_deepspeed_engine
from ._profile import GpuprofWarning, Profile, Step, profile

__all__ = ["profile", "Profile", "Step", "TransformerArch", "GpuprofWarning", "LightningCallback",
           "HFTrainerCallback", "wrap_deepspeed_engine", "__version__"]


def __getattr__(name: str):  # the trainer integrations import their framework on first use
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

try:
    from ._native import __version__
except ImportError:  # pragma: no cover - a broken install; the error surfaces on profile()
    __version__ = "0+unknown"
