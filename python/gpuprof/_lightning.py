"""gpuprof.LightningCallback: a profile around a Lightning ``Trainer.fit``.

    trainer = lightning.Trainer(callbacks=[gpuprof.LightningCallback("my-run")])

The profile starts at ``on_fit_start`` (after Lightning has launched its processes, so each
rank of a distributed strategy records itself with its RANK / WORLD_SIZE) and stops at
``on_fit_end`` (status ok) or ``on_exception`` (status failed, with the exception). Inside,
auto mode does the rest: steps are optimizer steps (Lightning's automatic optimization runs
the forward and backward inside ``optimizer.step(closure)``: one step each, see the README),
gradient accumulation makes one step, the DataLoader wait is measured by the patched loader.
Validation loops (the sanity check included) run inside ``prof.evaluation()``: they are in no
training step and are reported apart. Works with ``lightning`` (``lightning.pytorch``) or
``pytorch_lightning``.
"""

from __future__ import annotations

from typing import Any

from ._profile import Profile, profile


def _callback_base() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback as LegacyCallback
        except ImportError as e:
            raise ImportError("gpuprof.LightningCallback needs lightning (or pytorch_lightning)"
                              ": pip install lightning") from e
        return LegacyCallback
    return Callback


def _make() -> type:
    Base = _callback_base()

    class LightningCallback(Base):  # type: ignore[misc, valid-type]
        """Profiles ``Trainer.fit`` with gpuprof: ``LightningCallback(run_name, **options)``,
        options as for ``gpuprof.profile``. ``.profile`` is the run's ``gpuprof.Profile``
        (its ``run_id`` and ``summary`` once fit has ended)."""

        def __init__(self, run_name: str = "lightning", **options: Any) -> None:
            super().__init__()
            profile(run_name, **options)  # the options are checked now, not at fit()
            self.run_name = run_name
            self._options = options
            self.profile: Profile | None = None

        # -- fit ----------------------------------------------------------------------------
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self._stop(None)  # a fit() before that never ended
            self.profile = profile(self.run_name, **self._options)
            self.profile.start()

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self._stop(None)

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            self._stop(f"{type(exception).__name__}: {exception}")

        # -- evaluation inside fit: kept out of the training steps -----------------------------
        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            self._evaluation(True)

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            self._evaluation(False)

        def _evaluation(self, begin: bool) -> None:
            if self.profile is not None:
                self.profile._exclude_edge(begin)

        def _stop(self, error: str | None) -> None:
            if self.profile is not None:
                self.profile.stop(error)  # ends an evaluation left open by an exception

        def state_dict(self) -> dict[str, Any]:
            return {}  # nothing to checkpoint: a resumed fit is a new run

    return LightningCallback


_cls: type | None = None


def lightning_callback_class() -> type:
    global _cls
    if _cls is None:
        _cls = _make()
    return _cls
