"""gpuprof.wrap_deepspeed_engine: profiling around a DeepSpeed engine's training.

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, ...)
    engine = gpuprof.wrap_deepspeed_engine(engine, "my-run")

The run starts now (after deepspeed.initialize, so the process group and the rank are known)
and ends at ``engine.close()`` (or ``engine.gpuprof.stop()``) or, if never ended, when the
interpreter exits (ok, or failed with the exception that ended the program). Auto mode records
the engine as any model: its forward is the forward, ``engine.backward(loss)`` the backward,
and the steps are optimizer steps — ``engine.step()`` steps the optimizer only at a
gradient-accumulation boundary, so the micro-batches between make one step. ``engine.eval()`` ...
``engine.train()`` brackets an evaluation (a ``prof.evaluation()`` block: in no step).
"""

from __future__ import annotations

from typing import Any

from ._profile import Profile, profile


def wrap_deepspeed_engine(engine: Any, run_name: str = "deepspeed", **options: Any) -> Any:
    """Starts a gpuprof run over ``engine``'s training and returns the engine (the same
    object), with ``engine.gpuprof``, the run's ``gpuprof.Profile``, and ``engine.close()``,
    which ends the run. Options as for ``gpuprof.profile``."""
    for attr in ("backward", "step", "train", "module"):
        if not hasattr(engine, attr):
            raise TypeError(f"gpuprof.wrap_deepspeed_engine: {type(engine).__name__} is not a "
                            f"DeepSpeed engine (it has no .{attr}); pass what "
                            "deepspeed.initialize() returned first")
    existing = getattr(engine, "gpuprof", None)
    if isinstance(existing, Profile) and existing._state == "running":
        raise RuntimeError("gpuprof.wrap_deepspeed_engine: this engine is already profiled "
                           f"(run {existing.run_id}); stop engine.gpuprof first")
    prof = profile(run_name, **options)
    original_train, original_eval = engine.train, engine.eval

    def mode_edge(training: bool) -> None:
        if training:
            prof._exclude_edge(False)  # a no-op without an open evaluation
        elif not prof._excluding:
            prof._exclude_edge(True)

    def train(mode: bool = True) -> Any:
        """engine.train(False) begins an evaluation, engine.train() ends it."""
        mode_edge(bool(mode))
        return original_train(mode)

    def eval() -> Any:  # DeepSpeedEngine.eval() does not go through train()
        mode_edge(False)
        return original_eval()

    original_close = getattr(engine, "close", None)

    def close() -> Any:
        """Ends the gpuprof run (and calls the engine's own close(), if it has one)."""
        prof.stop()
        return original_close() if callable(original_close) else None

    engine.train = train
    engine.eval = eval
    engine.close = close
    engine.gpuprof = prof
    prof.start()
    if not getattr(engine, "training", True):  # wrapped while in eval mode
        prof._exclude_edge(True)
    return engine
