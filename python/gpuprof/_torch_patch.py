"""Auto-instrumentation of torch inside a profile() block.

Patched (and restored on exit, also when the loop raises):
  nn.Module.__call__          -> forward phase (outermost module call only; depth is native)
  Tensor.backward,
  torch.autograd.backward     -> backward phase (shared depth: the inner call is not counted)
  optimizer steps             -> torch's global optimizer step pre/post hooks, so optimizers
                                 created lazily inside the block are caught
  GradScaler.step             -> optimizer phase (shares the optimizer depth: counts once,
                                 also when the scaler skips the inner step on inf/NaN)
  DataLoader.__iter__,
  _BaseDataLoaderIter.__next__ -> dataloader wait (worker start-up and each batch), so the
                                 wait is measured where it happens and the rest of the gap
                                 between steps is host work, not loader time; a module called
                                 inside (a collate_fn or transform) is the loader's work
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable


class TorchPatches:
    def __init__(self, session: Any, kinds: dict[str, int], timer: Any,
                 loader_callback: Callable[[int, bool, int], None] | None = None) -> None:
        self._session = session
        self._kinds = kinds
        self._timer = timer
        self._loader_callback = loader_callback  # loader wait edges (the FLOP count's)
        self._restore: list[tuple[Any, str, Any, Any]] = []  # (owner, attr, original, hook)
        self._handles: list[Any] = []

    def _patch(self, owner: Any, attr: str, kind: int,
               callback: Callable[..., Any] | None = None) -> None:
        # Take the attribute from the owner's own namespace (not an inherited one), so that
        # restoring puts back exactly what was there.
        if isinstance(owner, type):
            original = owner.__dict__.get(attr)
        else:
            original = getattr(owner, attr, None)
        if original is None:
            return
        hook = self._session.hook(kind, original, callback)
        setattr(owner, attr, hook)
        self._restore.append((owner, attr, original, hook))

    def install(self, torch: Any) -> None:
        k, timer, edge = self._kinds, self._timer, self._loader_callback
        self._patch(torch.nn.Module, "__call__", k["FORWARD"], timer)
        self._patch(torch.Tensor, "backward", k["BACKWARD"], timer)
        self._patch(torch.autograd, "backward", k["BACKWARD"], timer)
        try:
            from torch.amp.grad_scaler import GradScaler
            self._patch(GradScaler, "step", k["OPTIMIZER"], timer)
        except ImportError:
            pass
        try:
            from torch.utils.data import dataloader
            # iter(loader) starts the loader (its workers): steps.loader_starts counts it
            self._patch(dataloader.DataLoader, "__iter__", k["LOADER_START"], edge)
            self._patch(dataloader._BaseDataLoaderIter, "__next__", k["LOADER"], edge)
        except (ImportError, AttributeError):  # pragma: no cover - torch internals changed
            pass  # the inter-step gap stands in for the wait
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        # torch treats a hook's non-None return value as replacement arguments: these return None.
        pre, post = self._session.optimizer_pre_hook, self._session.optimizer_post_hook
        if self._timer is not None:
            pre, post = self._timer.wrap_optimizer_hooks(self._session.optimizer_pre,
                                                         self._session.optimizer_post)
        self._handles.append(register_optimizer_step_pre_hook(pre))
        self._handles.append(register_optimizer_step_post_hook(post))

    def uninstall(self) -> list[str]:
        """Restores everything; returns problems as text (never raises)."""
        problems: list[str] = []
        for handle in reversed(self._handles):
            try:
                handle.remove()
            except Exception as e:  # pragma: no cover - torch internals changed
                problems.append(f"could not remove optimizer hook: {e!r}")
        self._handles.clear()
        for owner, attr, original, hook in reversed(self._restore):
            try:
                current = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(
                    owner, attr, None)
                if current is hook:
                    setattr(owner, attr, original)
                else:
                    # Someone patched on top of us; putting ours back would drop theirs.
                    problems.append(f"{getattr(owner, '__name__', owner)}.{attr} was replaced "
                                    "by other code during the run; left as it is")
            except Exception as e:  # pragma: no cover
                problems.append(f"could not restore {attr}: {e!r}")
        self._restore.clear()
        return problems
