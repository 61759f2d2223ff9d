"""gpuprof.HFTrainerCallback: a profile around a Hugging Face ``Trainer.train``.

    trainer = transformers.Trainer(..., callbacks=[gpuprof.HFTrainerCallback("my-run")])

The profile starts at ``on_train_begin`` (each process of an ``accelerate`` / ``torchrun``
launch records its own rank) and stops at ``on_train_end``. Steps are the trainer's optimizer
steps (auto mode: gradient accumulation makes one step); the DataLoader wait is measured in
torch's DataLoader under accelerate's shard. An evaluation during training
(``eval_strategy``) is kept out of the steps: the trainer decides it in ``on_step_end`` /
``on_epoch_end`` (``control.should_evaluate``) and reports its end with ``on_evaluate``, so
the stretch between them is a ``prof.evaluation()`` block. A ``train()`` that raises never
reaches ``on_train_end``: the run is then stopped at interpreter exit, failed with the
exception that ended the program (as any ``Profile.start()`` left running).
"""

from __future__ import annotations

from typing import Any

from ._profile import Profile, profile


def _callback_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as e:
        raise ImportError("gpuprof.HFTrainerCallback needs transformers: pip install "
                          "transformers") from e
    return TrainerCallback


def _make() -> type:
    Base = _callback_base()

    class HFTrainerCallback(Base):  # type: ignore[misc, valid-type]
        """Profiles ``Trainer.train`` with gpuprof: ``HFTrainerCallback(run_name,
        **options)``, options as for ``gpuprof.profile``. ``.profile`` is the run's
        ``gpuprof.Profile`` (its ``run_id`` and ``summary`` once training has ended)."""

        def __init__(self, run_name: str = "hf-trainer", **options: Any) -> None:
            super().__init__()
            profile(run_name, **options)  # the options are checked now, not at train()
            self.run_name = run_name
            self._options = options
            self.profile: Profile | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._stop()
            self.profile = profile(self.run_name, **self._options)
            self.profile.start()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._stop()

        # An evaluation follows on_step_end / on_epoch_end when the trainer's flow callback
        # (always first in the list) set should_evaluate; on_evaluate ends it.
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._maybe_evaluation(control)

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._maybe_evaluation(control)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._end_evaluation()  # should_evaluate was set, but no evaluation ran

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._end_evaluation()

        def _maybe_evaluation(self, control: Any) -> None:
            prof = self.profile
            if prof is not None and not prof._excluding and getattr(control, "should_evaluate",
                                                                      False):
                prof._exclude_edge(True)

        def _end_evaluation(self) -> None:
            if self.profile is not None:
                self.profile._exclude_edge(False)  # a no-op without an open evaluation

        def _stop(self) -> None:
            if self.profile is not None:
                self.profile.stop()

    return HFTrainerCallback


_cls: type | None = None


def hf_trainer_callback_class() -> type:
    global _cls
    if _cls is None:
        _cls = _make()
    return _cls
