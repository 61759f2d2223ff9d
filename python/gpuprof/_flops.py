"""Model FLOPs for MFU: the declared transformer shape and the one-step automatic count.

The FLOP formula lives in the native core (cpp/core/analysis/flops.h); this module holds what
must touch Python objects: the public ``TransformerArch`` dataclass and the torch glue that
runs ``torch.utils.flop_counter.FlopCounterMode`` around one training step.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import threading
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

_REQUIRED_INTS = ("layers", "hidden", "heads", "seq_len", "vocab")
_OPTIONAL_INTS = ("kv_heads", "ffn_hidden", "moe_experts", "moe_top_k", "lora_rank")
_BOOLS = ("gated_mlp", "grad_checkpoint")


@dataclass(frozen=True, kw_only=True)
class TransformerArch:
    """The shape of a decoder-only transformer, for MFU:
    ``gpuprof.profile(..., arch=TransformerArch(...), tokens_per_step=N, dtype="bf16")``.

    Required (positive ints): ``layers``, ``hidden`` (model width), ``heads`` (attention
    heads; must divide ``hidden``), ``seq_len`` (tokens per sequence, for the attention T²
    term), ``vocab`` (LM-head width).

    Optional:

    * ``kv_heads``: key/value heads (grouped-query or multi-query attention); must divide
      ``heads``. None means ``heads`` (plain multi-head attention).
    * ``ffn_hidden``: the MLP's inner width. None means 4 × ``hidden`` (GPT-2/3 style); gated
      MLPs are usually narrower (Llama-2-7B: 11008 for hidden 4096), so pass it for them.
    * ``gated_mlp``: a gated MLP (SwiGLU, GeGLU: three weight matrices instead of two).
    * ``moe_experts`` and ``moe_top_k``: a mixture-of-experts MLP with that many experts per
      layer, of which ``moe_top_k`` run for each token (Mixtral: 8 and 2). Both or neither;
      None means a dense MLP.
    * ``lora_rank``: LoRA adapters of this rank on the block linears, with the base weights
      frozen. None means a full fine-tune.
    * ``grad_checkpoint``: activation (gradient) checkpointing is on. It is recorded for the
      ``gradient_checkpointing_detected`` rule; MFU counts model FLOPs, which exclude the
      recomputed forward.

    Invalid values raise ``ValueError`` (``TypeError`` for a wrong type) naming the field.
    The counting convention is in the README ("MFU").
    """

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    gated_mlp: bool = False
    moe_experts: int | None = None
    moe_top_k: int | None = None
    lora_rank: int | None = None
    grad_checkpoint: bool = False

    def __post_init__(self) -> None:
        for name in _REQUIRED_INTS + _OPTIONAL_INTS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_INTS:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                kind = "an int or None" if name in _OPTIONAL_INTS else "an int"
                raise TypeError(f"gpuprof.TransformerArch: {name} must be {kind}, got "
                                f"{type(value).__name__} {value!r}")
            if abs(value) > 2**62:  # the native formula takes 64-bit integers
                raise ValueError(f"gpuprof.TransformerArch: {name} must be at most 2**62, got "
                                 f"{value}")
        for name in _BOOLS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"gpuprof.TransformerArch: {name} must be a bool, got "
                                f"{type(value).__name__} {value!r}")
        if (self.moe_experts is None) != (self.moe_top_k is None):
            raise ValueError("gpuprof.TransformerArch: moe_experts and moe_top_k go together "
                             "(experts per layer, and experts each token is routed to, e.g. 8 "
                             "and 2 for Mixtral); pass both or neither")
        # Values (positive, heads divides hidden, ...) are checked where the formula lives.
        try:
            from . import _native
        except ImportError:  # a broken install; profile() reports it
            return
        try:
            _native.transformer_flops(self.as_dict())
        except ValueError as e:
            raise ValueError(f"gpuprof.TransformerArch: {e}") from None

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (None = the field's default); stored in the run's
        config_json under "arch"."""
        return dataclasses.asdict(self)

    def flops_per_token(self) -> dict[str, float]:
        """FLOPs per token from the native formula: ``model`` (training: forward + backward,
        what MFU uses), ``hardware`` (``model`` plus the recomputed forward when
        ``grad_checkpoint``), ``forward``, and the forward's parts ``attention_proj``,
        ``attention_scores``, ``mlp``, ``lm_head``, ``lora_adapters``."""
        from . import _native
        d = _native.transformer_flops(self.as_dict())
        return {k: float(d[k]) for k in ("attention_proj", "attention_scores", "mlp", "lm_head",
                                         "lora_adapters", "forward", "model", "hardware")}


class _GlobalOnlyTracker:
    """Stands in for FlopCounterMode's ModuleTracker: every FLOP goes to the "Global" total.
    The tracker would register global module hooks, which make torch.compile'd modules warn
    ("Using `torch.compile(module)` when there are global hooks ...") and cost a hook call per
    module; gpuprof needs the total only."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _GlobalOnlyTracker:
        return self

    def __exit__(self, *_: Any) -> None:
        return None


def _count_globally_only(counter: Any) -> None:
    """Swaps the per-module tracker of a FlopCounterMode (torch 2.4+) for _GlobalOnlyTracker;
    leaves other versions' counters as they are."""
    tracker = getattr(counter, "mod_tracker", None)
    if tracker is not None and hasattr(tracker, "parents") and hasattr(tracker, "__enter__"):
        counter.mod_tracker = _GlobalOnlyTracker()


def import_dynamo() -> None:
    """Imports torch._dynamo (1-2 s on a CPU machine) at the start of an auto-mode run, BEFORE
    torch is patched: at import it records torch's functions in tables of its own
    (nn.Module.__call__, Tensor.backward, torch.autograd.backward), and imported while the
    patches are in, it would record gpuprof's hooks there — torch.compile would then see
    them after the run, and they would keep the run's native session alive for the life of
    the process. It is imported anyway by the first FlopCounterMode (the automatic FLOP
    count) and by torch.compile; this way no step is timed with the import either.

    The import runs on a thread of its own: torch keeps exceptions it caught while importing
    (optional dependencies it probes), whose tracebacks hold the importing frames and, through
    them, every caller's (the user's training function and its model, the Profile) for the
    life of the process."""
    import_off_thread("torch._dynamo")  # a failure: the count itself reports what fails


def import_off_thread(name: str) -> Any:
    """The module `name`, imported (when not yet) on a short-lived thread of its own, so that
    what the import keeps (exceptions it caught, with their tracebacks) holds that thread's
    frames, not the caller's. None when the import fails there."""
    if name not in sys.modules:
        def load() -> None:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the caller decides what a missing module means
                pass

        thread = threading.Thread(target=load, name=f"gpuprof-import-{name}", daemon=True)
        thread.start()
        thread.join()
    return sys.modules.get(name)


class StepFlopCounter:
    """Counts the FLOPs of ONE training step with ``torch.utils.flop_counter.FlopCounterMode``
    (profile(auto=True) with neither ``arch=`` nor ``flops_per_step=``). The counted step is
    the one the step assembler stores (record/step_assembler.h), so that MFU divides the
    FLOPs of a step by the time of the same kind of step.

    Optimizer mode (no ``prof.step()``; a stored step ends at an optimizer step): the window
    runs from the end of the ``COUNT_AFTER``-th ``optimizer.step()`` (torch's global
    optimizer-step post hook) through the next one (to its post hook): the forward and
    backward passes of step index 2 in a loop with one optimizer, every micro-batch of a
    gradient-accumulation step included, and a closure's (``optimizer.step(closure)``:
    LBFGS, Lightning) that runs inside the optimizer step. When no forward ran inside the
    optimizer step, the count stops at its pre hook, so an optimizer's own matmuls (Muon,
    Shampoo) are not model FLOPs. A window that counts nothing (it fell between two
    optimizers of one iteration) or that spans two steps (a GradScaler skipped the optimizer
    step of the first: the window saw two outermost optimizer calls, from
    ``optimizer_calls``, the native hook counter) is discarded and opened again at the next
    post hook, at most ``MAX_WINDOWS`` times. An evaluation (``prof.evaluation()``) drops an
    open window.

    Step mode (the loop groups its iterations with ``prof.step()``; each block is a stored
    step, whatever optimizers run in it, e.g. a GAN's D and G steps): from the first
    ``step_begin()`` on, the optimizer hooks are dropped (with any window or count they
    made) and the window is the ``COUNT_AFTER + 1``-th ``prof.step()`` block, from
    ``step_begin()`` to ``step_end()``. A block that counts nothing, or that raised, is
    discarded and the next block is counted instead, at most ``MAX_WINDOWS`` times.

    Either way the counted step is stored step 2 in a plain loop, the last warmup step (runs
    of 6 steps or more leave steps 0-2 out of the steady state), so the counting overhead —
    every op goes through a Python dispatch mode — does not reach the steady-state step time
    MFU divides by.

    A hook cannot remove itself (torch iterates the hook dict while calling it): after a count
    at the post hook, the next pre hook removes the post hook and stays as a one-attribute
    no-op until ``finish()``. Only the thread that entered profile() is counted (dispatch modes are
    thread-local). Nothing here raises into the training loop: a failure is kept as text and
    reported by ``finish()``.
    """

    COUNT_AFTER = 2
    MAX_WINDOWS = 8

    def __init__(self, optimizer_calls: Callable[[], int],
                 forward_calls: Callable[[], int] = lambda: 0) -> None:
        self._optimizer_calls = optimizer_calls
        self._forward_calls = forward_calls
        self._calls_at_open = 0
        self._owner = threading.get_ident()
        self._handles: dict[str, Any] = {}
        self._counter: Any = None
        self._stuck: Any = None  # a counter that could not be exited (not on top of the stack)
        self._posts = 0
        self._windows = 0
        self._done = False
        self._step_mode = False  # prof.step() blocks are the steps (see the class comment)
        self._step_blocks = 0     # prof.step() blocks begun (step mode)
        self._raised = False      # a counted prof.step() block ended by an exception
        self._loader_saved: dict[Any, dict[Any, int]] | None = None  # see loader_edge
        # The window's count and forward calls at the pre hook of the optimizer step it runs
        # through (None: not inside that step yet).
        self._at_pre: tuple[int, int] | None = None
        self.flops: int | None = None
        self.counted_after: int | None = None  # optimizer steps before the counted window
        self.counted_window: str | None = None  # the counted step, in words
        self._window_text = ""
        self.problem: str | None = None  # why no count, for the diagnostic
        self.failed = False  # the problem is a failure (warning), not just a short run

    def install(self) -> None:
        import_dynamo()  # a no-op when profile() imported it before patching
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        self._handles["pre"] = register_optimizer_step_pre_hook(self._pre)
        self._handles["post"] = register_optimizer_step_post_hook(self._post)

    # torch treats a hook's non-None return value as replacement arguments: these return None.
    def _post(self, *_: Any) -> None:
        if self._step_mode or threading.get_ident() != self._owner:
            return
        if self._done:
            return
        self._posts += 1
        if self._counter is not None and self._at_pre is not None:
            self._end_window()
            if self._done:
                return
        if self._counter is None and self._posts >= self.COUNT_AFTER:
            try:
                from torch.utils.flop_counter import FlopCounterMode
                counter: Any = FlopCounterMode(display=False)  # torch: untyped methods
                _count_globally_only(counter)
                self._calls_at_open = self._optimizer_calls()
                self._at_pre = None
                counter.__enter__()
                self._counter = counter
                self._windows += 1
            except Exception as e:
                self._fail(f"automatic FLOP count failed: starting FlopCounterMode raised {e!r}",
                           inside="post")

    def _pre(self, *_: Any) -> None:
        if self._done:
            # Counted at the last post hook, which could not remove itself (torch iterates
            # that dict while calling it): it goes now; this pre hook stays a no-op.
            if "post" in self._handles:
                self._remove_hooks(inside="pre")
            return
        if (self._step_mode or self._counter is None
                or threading.get_ident() != self._owner):
            return
        # The window goes on through this optimizer step: its closure, when it has one
        # (optimizer.step(closure): LBFGS, Lightning), runs a forward and backward of the step.
        try:
            self._at_pre = (int(self._counter.get_total_flops()), self._forward_calls())
        except Exception as e:
            self._close(inside="pre")
            self._fail(f"automatic FLOP count failed: reading the count raised {e!r}",
                       inside="pre")

    def _end_window(self) -> None:
        """At the post hook of the optimizer step that ends the window."""
        at_pre, self._at_pre = self._at_pre, None
        counter = self._close(inside="post")
        if counter is None or at_pre is None:
            return
        try:
            total = int(counter.get_total_flops())
            closure = self._forward_calls() > at_pre[1]
            # Outermost optimizer calls (optimizer.step, GradScaler.step) begun in the window:
            # more than 1 means a step whose optimizer.step() never ran (a GradScaler skipping
            # an inf/NaN step), so the window holds two steps' work.
            calls = self._optimizer_calls() - self._calls_at_open
        except Exception as e:
            self._fail(f"automatic FLOP count failed: reading the count raised {e!r}",
                       inside="post")
            return
        # Without a forward inside the optimizer step, its own work (an optimizer that runs
        # matmuls, as Muon or Shampoo do) is not the model's: the count stops at its begin.
        flops = total if closure else at_pre[0]
        if flops > 0 and calls == 1:
            self.flops = flops
            self.counted_after = self._posts - 1
            self.counted_window = (
                f"the step after optimizer step {self._posts - 1}, its closure included "
                "(forward and backward inside optimizer.step)" if closure
                else f"the step after optimizer step {self._posts - 1}")
            self._done = True  # the next pre hook removes the post hook (see _pre)
        elif self._windows >= self.MAX_WINDOWS:
            self._fail(f"automatic FLOP count found no clean one-step window in "
                       f"{self._windows} tries (none with FLOPs FlopCounterMode counts — matmul, "
                       "convolution, attention — and exactly one optimizer step); pass arch= or "
                       "flops_per_step= to profile()", inside="post", failure=False)

    def exclude_begin(self) -> None:
        """An evaluation begins (prof.evaluation()): an open window would count its forwards,
        so it is dropped; the next optimizer step's post hook opens another."""
        if (self._done or self._counter is None or threading.get_ident() != self._owner):
            return
        self._at_pre = None
        self._close(inside=None)
        if self._windows >= self.MAX_WINDOWS and not self._done:
            self._fail(f"automatic FLOP count found no clean one-step window in "
                       f"{self._windows} tries (each was interrupted by an evaluation); pass "
                       "arch= or flops_per_step= to profile()", inside=None, failure=False)

    def step_begin(self, index: int) -> None:
        """A ``prof.step(index)`` block was entered (any thread; only the owner's count)."""
        if threading.get_ident() != self._owner:
            return
        if not self._step_mode:
            self._step_mode = True
            # From here on a stored step is a prof.step() block, not an optimizer step:
            # whatever the optimizer hooks opened or counted does not describe it.
            self._remove_hooks(inside=None)
            if self._counter is not None and self._close(inside=None) is None:
                return  # a failure, recorded by _close
            if not self.failed:  # a count or a give-up of optimizer mode no longer applies
                self.flops = self.counted_after = self.counted_window = None
                self.problem = None
                self._done = False
                self._windows = 0
        if self._done:
            return
        self._step_blocks += 1
        if self._counter is not None:  # entered again without exit: that block never ended
            if self._close(inside=None) is None:
                return
        if self._step_blocks > self.COUNT_AFTER:
            self._open(index)

    def step_end(self, ok: bool) -> None:
        """The open ``prof.step()`` block was left (``ok``: without an exception)."""
        if (not self._step_mode or self._done or self._counter is None
                or threading.get_ident() != self._owner):
            return
        counter = self._close(inside=None)
        if counter is None:
            return
        try:
            total = int(counter.get_total_flops())
        except Exception as e:
            self._fail(f"automatic FLOP count failed: reading the count raised {e!r}",
                       inside=None)
            return
        if ok and total > 0:
            self.flops = total
            self.counted_window = self._window_text
            self._done = True
            return
        self._raised = self._raised or not ok
        if self._windows >= self.MAX_WINDOWS:
            self._fail(f"automatic FLOP count found no prof.step() block with FLOPs "
                       f"FlopCounterMode counts (matmul, convolution, attention) that ended "
                       f"without an exception in {self._windows} tries; pass arch= or "
                       "flops_per_step= to profile()", inside=None, failure=False)

    def loader_edge(self, kind: int, begin: bool, ts: int) -> None:
        """Leaves the work inside a DataLoader's iter()/next() (a collate_fn or transform
        that runs a module, with num_workers=0) out of the open count: the counts are saved
        when the loader is entered and put back when it returns. Never raises."""
        counter = self._counter
        if counter is None:  # no window open: the common case, kept to one test
            return
        try:
            counts = counter.flop_counts
            if begin:
                self._loader_saved = {k: dict(v) for k, v in counts.items()}
            elif self._loader_saved is not None:
                saved, self._loader_saved = self._loader_saved, None
                counts.clear()
                for k, v in saved.items():
                    counts[k].update(v)
        except Exception:  # noqa: BLE001 - a torch without flop_counts: the loader is counted
            self._loader_saved = None

    def _open(self, index: int) -> None:
        try:
            from torch.utils.flop_counter import FlopCounterMode
            counter: Any = FlopCounterMode(display=False)  # torch: untyped methods
            _count_globally_only(counter)
            counter.__enter__()
            self._counter = counter
            self._windows += 1
            self._window_text = (f"prof.step({index}), step block {self._step_blocks} of the "
                                 "run")
        except Exception as e:
            self._fail(f"automatic FLOP count failed: starting FlopCounterMode raised {e!r}",
                       inside=None)

    def _close(self, inside: str | None) -> Any:
        """Exits the open FlopCounterMode; returns it, or None after a failure. ``inside``
        names the hook being run ("pre"), None outside any hook."""
        counter, self._counter = self._counter, None
        if counter is None:
            return None
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode
            top = _get_current_dispatch_mode()
            if top is not getattr(counter, "mode", None):
                # Exiting would pop someone else's mode off the stack; finish() tries again.
                self._stuck = counter
                self._fail("automatic FLOP count failed: another torch dispatch mode was "
                           f"entered during the counted step and is still active ({top!r})",
                           inside=inside)
                return None
            counter.__exit__(None, None, None)
            return counter
        except Exception as e:
            self._fail(f"automatic FLOP count failed: leaving FlopCounterMode raised {e!r}",
                       inside=inside)
            return None

    def _fail(self, message: str, inside: str | None, failure: bool = True) -> None:
        if self.problem is None:
            self.problem = message
            self.failed = failure
        self._stop_hooks(inside)

    def _stop_hooks(self, inside: str | None) -> None:
        """Stops counting and removes the hooks, except the one torch is iterating now
        (``inside``: "pre" or "post"; removing it would break torch's loop over the hooks)."""
        self._done = True
        self._remove_hooks(inside)

    def _remove_hooks(self, inside: str | None) -> None:
        for name in ("pre", "post"):
            if name == inside:
                continue
            handle = self._handles.pop(name, None)
            if handle is not None:
                try:
                    handle.remove()
                except Exception:  # pragma: no cover - torch internals changed
                    pass

    def finish(self) -> None:
        """At the end of the run (training thread, never inside a hook): closes an open window
        (the count is then incomplete and dropped), removes the hooks, and leaves the outcome
        in ``flops`` / ``problem``."""
        if self._stuck is not None:
            self._counter, self._stuck = self._stuck, None
            if self._close(inside=None) is None:
                self.problem = (f"{self.problem}; FlopCounterMode could not be left and stays "
                                "active under that mode")
        elif self._counter is not None:
            if self._close(inside=None) is not None and self.problem is None:
                self.problem = ("automatic FLOP count incomplete: the run ended inside the "
                                "counted step " + ("(its prof.step() block was not left)"
                                                   if self._step_mode else
                                                   "(no optimizer.step() after it)"))
        self._stop_hooks(inside=None)
        if self.flops is None and self.problem is None:
            if self._step_mode and self._raised:
                self.problem = ("automatic FLOP count incomplete: the counted prof.step() "
                                "block raised, and no later block was counted")
            elif self._step_mode:
                n = self._step_blocks
                self.problem = (f"automatic FLOP count: the run ended after {n} prof.step() "
                                f"block{'s' if n != 1 else ''}; the count takes the block "
                                f"after the first {self.COUNT_AFTER}")
            else:
                self.problem = (f"automatic FLOP count: the run ended after {self._posts} "
                                f"optimizer step{'s' if self._posts != 1 else ''}; the count "
                                f"takes the step after the first {self.COUNT_AFTER}")
