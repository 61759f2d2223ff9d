"""MFU inputs through the public API: gpuprof.TransformerArch, flops_per_step=, and the
automatic one-step FLOP count (torch.utils.flop_counter.FlopCounterMode)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.modules.module as module_mod
import torch.optim.optimizer as optim_mod
import torch.utils.flop_counter as flop_counter_mod
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

import gpuprof
from gpuprof_testutil import cuda_available

REAL_FLOP_COUNTER = flop_counter_mod.FlopCounterMode
GPUPROF_EXE = str(Path(sys.executable).parent / "gpuprof")
WIDTH, BATCH = 32, 16


# ------------------------------------------------------------------ helpers

def hand_training_flops_per_token(a: gpuprof.TransformerArch) -> float:
    """The README's convention, written out independently of the native formula: 2 FLOPs per
    multiply-add; forward = 2 × (active weights the token multiplies) + the attention
    T² term 4·seq·hidden per layer; training = 3 × forward, or with LoRA 2 × the frozen base
    + 3 × (attention T² term + adapters)."""
    head_dim = a.hidden // a.heads
    kv = (a.kv_heads or a.heads) * head_dim
    ffn = a.ffn_hidden or 4 * a.hidden
    mats = 3 if a.gated_mlp else 2
    top_k = a.moe_top_k or 1
    router = a.hidden * a.moe_experts if (a.moe_experts or 1) > 1 else 0
    attn_weights = a.hidden * a.hidden * 2 + a.hidden * kv * 2          # Q, O + K, V
    mlp_weights = top_k * mats * a.hidden * ffn + router
    base_fwd = 2 * (a.layers * (attn_weights + mlp_weights) + a.hidden * a.vocab)
    t2_fwd = a.layers * 4 * a.seq_len * a.hidden
    if not a.lora_rank:
        return 3 * (base_fwd + t2_fwd)
    r = a.lora_rank
    adapter_weights = r * ((a.hidden + a.hidden) * 2 + (a.hidden + kv) * 2
                           + top_k * mats * (a.hidden + ffn))
    adapters_fwd = 2 * a.layers * adapter_weights
    return 2 * base_fwd + 3 * (t2_fwd + adapters_fwd)


TINY = gpuprof.TransformerArch(layers=2, hidden=64, heads=4, kv_heads=2, seq_len=128,
                               vocab=1000, ffn_hidden=172, gated_mlp=True)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                         nn.Linear(WIDTH, WIDTH))


def fixed_batch() -> torch.Tensor:
    return torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(0))


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def reference_flops(model: nn.Module, x: torch.Tensor) -> int:
    """What the test itself counts for one forward + backward of the same model and batch."""
    with REAL_FLOP_COUNTER(display=False) as counter:
        loss_of(model, x).backward()
    model.zero_grad()
    return counter.get_total_flops()


def train(model: nn.Module, opts: list, steps: int, accumulate: int = 1,
          on_iteration=None) -> None:
    x = fixed_batch()
    for i in range(steps):
        if on_iteration is not None:
            on_iteration(i)
        for _ in range(accumulate):
            loss_of(model, x).backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()


def global_hooks() -> tuple[int, int, int, int]:
    return (len(optim_mod._global_optimizer_pre_hooks), len(optim_mod._global_optimizer_post_hooks),
            len(module_mod._global_forward_pre_hooks), len(module_mod._global_forward_hooks))


def run_cli(*args: str) -> str:
    """The native `gpuprof` CLI installed next to this interpreter; returns its stdout."""
    proc = subprocess.run([GPUPROF_EXE, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def run_row(db, *cols: str):
    return db.one(f"SELECT {', '.join(cols)} FROM runs WHERE run_id=1")


def flops_diagnostics(db) -> list[tuple[str, str]]:
    return db.rows("SELECT level, message FROM diagnostics WHERE run_id=1 AND source='flops'")


def insights_json(db) -> dict:
    return json.loads(run_cli("insights", str(db.path), "1", "--json"))


class CountingFlopCounter(REAL_FLOP_COUNTER):
    """FlopCounterMode that counts how often a window was opened."""
    enters = 0

    def __enter__(self):
        type(self).enters += 1
        return super().__enter__()


@pytest.fixture
def spy(monkeypatch):
    cls = type("Spy", (CountingFlopCounter,), {"enters": 0})
    monkeypatch.setattr(flop_counter_mod, "FlopCounterMode", cls)
    return cls


# ------------------------------------------------------------------ TransformerArch

def test_transformer_arch_is_public_frozen_and_keeps_none_defaults():
    # GIVEN an arch with only the required fields
    arch = gpuprof.TransformerArch(layers=2, hidden=64, heads=4, seq_len=16, vocab=100)
    # THEN it is exported, frozen, and leaves the defaults as None / False
    assert "TransformerArch" in gpuprof.__all__
    assert (arch.kv_heads, arch.ffn_hidden, arch.moe_experts, arch.lora_rank) == (None,) * 4
    assert arch.grad_checkpoint is False and arch.gated_mlp is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        arch.layers = 3  # type: ignore[misc]
    # AND None means kv_heads = heads and ffn_hidden = 4 × hidden
    explicit = dataclasses.replace(arch, kv_heads=4, ffn_hidden=256)
    assert arch.flops_per_token()["model"] == explicit.flops_per_token()["model"]


BASE = dict(layers=2, hidden=64, heads=4, seq_len=16, vocab=100)


@pytest.mark.parametrize("override, error, message", [
    ({"layers": 0}, ValueError, "layers must be > 0, got 0"),
    ({"vocab": -1}, ValueError, "vocab must be > 0, got -1"),
    ({"seq_len": 0}, ValueError, "seq_len must be > 0"),
    ({"heads": 5}, ValueError, r"heads \(5\) must divide hidden \(64\)"),
    ({"kv_heads": 3}, ValueError, r"kv_heads \(3\) must divide heads \(4\)"),
    ({"kv_heads": 8}, ValueError, r"kv_heads \(8\) must divide heads \(4\)"),
    ({"ffn_hidden": 0}, ValueError, "ffn_hidden must be > 0"),
    ({"moe_experts": 4, "moe_top_k": 5}, ValueError, r"moe_top_k \(5\) must be <= moe_experts \(4\)"),
    ({"moe_experts": 4}, ValueError, "moe_experts and moe_top_k go together"),
    ({"moe_top_k": 2}, ValueError, "moe_experts and moe_top_k go together"),
    ({"lora_rank": 0}, ValueError, "lora_rank must be > 0"),
    ({"hidden": 64.0}, TypeError, "hidden must be an int, got float"),
    ({"layers": True}, TypeError, "layers must be an int"),
    ({"kv_heads": "2"}, TypeError, "kv_heads must be an int or None"),
    ({"grad_checkpoint": 1}, TypeError, "grad_checkpoint must be a bool"),
    ({"gated_mlp": None}, TypeError, "gated_mlp must be a bool"),
])
def test_transformer_arch_validation_names_the_field(override, error, message):
    with pytest.raises(error, match="gpuprof.TransformerArch: " + message):
        gpuprof.TransformerArch(**{**BASE, **override})


@pytest.mark.parametrize("arch", [
    TINY,
    dataclasses.replace(TINY, grad_checkpoint=True),  # model FLOPs exclude the recompute
    dataclasses.replace(TINY, gated_mlp=False, ffn_hidden=None, kv_heads=None),
    dataclasses.replace(TINY, moe_experts=8, moe_top_k=2),
    dataclasses.replace(TINY, lora_rank=8),
    dataclasses.replace(TINY, moe_experts=4, moe_top_k=1, lora_rank=4),
], ids=["gqa-swiglu", "grad-ckpt", "gpt-defaults", "moe", "lora", "moe-lora"])
def test_flops_per_token_matches_the_documented_formula(arch):
    assert arch.flops_per_token()["model"] == hand_training_flops_per_token(arch)


def test_grad_checkpoint_adds_the_recompute_to_hardware_flops_only():
    plain = TINY.flops_per_token()
    ckpt = dataclasses.replace(TINY, grad_checkpoint=True).flops_per_token()
    layers_forward = plain["forward"] - plain["lm_head"]
    assert ckpt["model"] == plain["model"]
    assert ckpt["hardware"] == plain["model"] + layers_forward


# ------------------------------------------------------------------ profile(arch=...)

def test_arch_sets_flops_per_step_method_and_declared_checkpointing(db):
    # GIVEN a transformer arch and 8 sequences of 128 tokens per optimizer step
    arch = dataclasses.replace(TINY, grad_checkpoint=True)
    tokens = 8 * arch.seq_len
    # WHEN a run declares them (manual API: no torch patching involved)
    with gpuprof.profile("arch", db=db.path, gpu="none", auto=False, summary=False,
                         arch=arch, tokens_per_step=tokens, dtype="bf16") as prof:
        for i in range(4):
            with prof.step(i):
                pass
    # THEN runs.flops_per_step is the documented per-token formula × tokens per step
    flops, method, dtype, config = run_row(db, "flops_per_step", "flops_method", "dtype",
                                           "config_json")
    assert flops == hand_training_flops_per_token(arch) * tokens
    assert method == "arch" and dtype == "bf16"
    # AND config_json declares the checkpointing (read by gradient_checkpointing_detected)
    config = json.loads(config)
    assert config["grad_checkpoint"] is True
    assert config["arch"]["layers"] == 2 and config["tokens_per_step"] == tokens
    # AND the report names the method next to the FLOPs
    assert f"FLOPs/step {flops:.3g} (arch)" in run_cli("insights", str(db.path), "1")


def test_declared_flops_per_step_is_stored_as_declared_and_nothing_is_counted(db, spy):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("declared", db=db.path, gpu="none", summary=False,
                         flops_per_step=1.5e9, dtype="fp32"):
        train(model, [opt], 6)
    assert run_row(db, "flops_per_step", "flops_method") == (1.5e9, "declared")
    assert spy.enters == 0
    # AND without an arch, gradient checkpointing is not declared: the key is absent
    assert "grad_checkpoint" not in json.loads(run_row(db, "config_json"))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"arch": TINY, "tokens_per_step": 128, "flops_per_step": 1e9}, ValueError,
     "either arch= or flops_per_step=, not both"),
    ({"arch": TINY}, ValueError, "arch= needs tokens_per_step="),
    ({"tokens_per_step": 128}, ValueError, "tokens_per_step only applies with arch="),
    ({"arch": TINY, "tokens_per_step": 0}, ValueError, "tokens_per_step must be > 0"),
    ({"arch": TINY, "tokens_per_step": 12.5}, TypeError, "tokens_per_step must be an int"),
    ({"arch": {"layers": 2}, "tokens_per_step": 1}, TypeError,
     "arch must be a gpuprof.TransformerArch"),
])
def test_invalid_mfu_options_raise_at_profile(db, kwargs, error, message):
    with pytest.raises(error, match=message):
        gpuprof.profile("bad", db=db.path, **kwargs)


# ------------------------------------------------------------------ automatic count

def test_automatic_count_equals_flop_counter_mode_on_one_step(db, spy):
    # GIVEN a CPU MLP and what FlopCounterMode counts for one forward+backward of its batch
    model = mlp()
    expected = reference_flops(model, fixed_batch())
    # (3 linears: forward 2·B·W² each; backward 2·B·W² for each weight gradient and for the
    # input gradients of layers 2 and 3)
    assert expected == 2 * BATCH * WIDTH * WIDTH * (3 + 3 + 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counting_at: list[int] = []
    hooks_before = global_hooks()

    def probe(i: int) -> None:
        if isinstance(_get_current_dispatch_mode(), flop_counter_mod._FlopCounterMode):
            counting_at.append(i)

    # WHEN a plain loop of 8 steps runs with neither arch= nor flops_per_step=
    with gpuprof.profile("counted", db=db.path, gpu="none", summary=False):
        train(model, [opt], 8, on_iteration=probe)
    # THEN one step (index 2, the last warmup step) was counted, once
    assert counting_at == [2]
    assert spy.enters == 1
    # AND the stored FLOPs per step are that count, marked "counted"
    assert run_row(db, "flops_per_step", "flops_method") == (expected, "counted")
    # AND every hook and dispatch mode it used is gone
    assert global_hooks() == hooks_before
    assert _get_current_dispatch_mode() is None


def test_automatic_count_covers_gradient_accumulation_and_several_optimizers(db, spy):
    # GIVEN a loop with 2 accumulated micro-batches and 3 optimizers stepping per iteration
    model = mlp()
    expected = 2 * reference_flops(model, fixed_batch())
    opts = [torch.optim.SGD(layer.parameters(), lr=0.01) for layer in model if
            isinstance(layer, nn.Linear)]
    with gpuprof.profile("accum", db=db.path, gpu="none", summary=False):
        train(model, opts, 6, accumulate=2)
    # THEN the count is one full optimizer step: both micro-batches' forward and backward
    assert run_row(db, "flops_per_step", "flops_method") == (expected, "counted")
    # AND the window that fell between two optimizers of one iteration (nothing counted) was
    # opened again once at the next optimizer's end
    assert spy.enters == 2


@pytest.mark.parametrize("wrapped", [False, True])
def test_module_work_inside_the_dataloader_is_not_counted(db, wrapped):
    # GIVEN a DataLoader whose collate_fn runs a Linear on the batch (num_workers=0: in this
    # process, inside next()), feeding the model the counted step trains on
    model = mlp()
    expected = reference_flops(model, fixed_batch())
    augment = nn.Linear(WIDTH, WIDTH)
    x = fixed_batch()

    def collate(_items):
        with torch.no_grad():
            augment(x)  # loader work: FLOPs, but not the model's
        return x

    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=1, collate_fn=collate)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("collate-flops", db=db.path, gpu="none", summary=False) as prof:
        for batch in (prof.wrap_dataloader(loader) if wrapped else loader):
            loss_of(model, batch).backward()
            opt.step()
            opt.zero_grad()
    # THEN the counted FLOPs are the model's forward and backward alone
    assert run_row(db, "flops_per_step", "flops_method") == (expected, "counted")


def test_a_step_skipped_by_grad_scaler_does_not_double_the_count(db, spy):
    # GIVEN a GradScaler loop whose step 2 overflows, so the scaler skips its optimizer.step()
    model = mlp()
    expected = reference_flops(model, fixed_batch())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x = fixed_batch()
    with gpuprof.profile("scaler", db=db.path, gpu="none", summary=False):
        for i in range(8):
            loss = loss_of(model, x) * (float("inf") if i == 2 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    # THEN the window holding steps 2 and 3 (two forward+backward) was discarded, and the next
    # window counted exactly one step
    assert run_row(db, "flops_per_step", "flops_method") == (expected, "counted")
    assert spy.enters == 2


class Gan:
    """A GAN-style iteration: D's forward/backward/step, then G's, each with its own Adam."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1)
        self.D, self.G = nn.Linear(WIDTH, 1), nn.Linear(8, WIDTH)
        self.oD = torch.optim.Adam(self.D.parameters())
        self.oG = torch.optim.Adam(self.G.parameters())
        self.z = torch.randn(BATCH, 8, generator=gen)
        self.real = torch.randn(BATCH, WIDTH, generator=gen)

    def d_half(self) -> None:
        loss = self.D(self.G(self.z).detach()).mean() - self.D(self.real).mean()
        loss.backward()
        self.oD.step()
        self.oD.zero_grad()

    def g_half(self) -> None:
        (-self.D(self.G(self.z)).mean()).backward()
        self.oG.step()
        self.oG.zero_grad()

    def counted(self, *halves) -> int:
        with REAL_FLOP_COUNTER(display=False) as counter:
            for half in halves:
                half()
        return counter.get_total_flops()


def test_prof_step_grouping_counts_the_whole_step_of_a_two_optimizer_loop(db, spy):
    # GIVEN a GAN loop (two optimizers, a forward between their steps) grouped with prof.step()
    gan = Gan()
    whole, d_only = gan.counted(gan.d_half, gan.g_half), gan.counted(gan.d_half)
    assert whole > d_only > 0  # the halves differ, so a half-step count would show
    counting_at: list[int] = []
    hooks_before = global_hooks()
    # WHEN it runs in auto mode with neither arch= nor flops_per_step=
    with gpuprof.profile("gan", db=db.path, gpu="none", summary=False) as prof:
        for i in range(8):
            with prof.step(i):
                if isinstance(_get_current_dispatch_mode(), flop_counter_mod._FlopCounterMode):
                    counting_at.append(i)
                gan.d_half()
                gan.g_half()
    # THEN the counted window is one whole prof.step() block (step 2, a warmup step), once
    assert counting_at == [2] and spy.enters == 1
    assert db.one("SELECT COUNT(*) FROM steps WHERE run_id=1") == 8
    # AND the FLOPs per step are those of the whole step, both optimizers' halves
    assert run_row(db, "flops_per_step", "flops_method") == (whole, "counted")
    (level, message), = flops_diagnostics(db)
    assert level == "info" and "prof.step(2)" in message
    assert global_hooks() == hooks_before and _get_current_dispatch_mode() is None


def test_prof_step_block_without_flops_or_that_raised_is_retried_on_the_next(db, spy):
    # GIVEN a prof.step() loop whose block 2 runs no matmul and whose block 3 raises (caught
    # by the loop outside the block)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    expected = reference_flops(model, fixed_batch())
    x = fixed_batch()
    with gpuprof.profile("retry", db=db.path, gpu="none", summary=False) as prof:
        for i in range(8):
            try:
                with prof.step(i):
                    if i == 2:
                        continue
                    loss_of(model, x).backward()
                    if i == 3:
                        raise ValueError("bad batch")
                    opt.step()
                    opt.zero_grad()
            except ValueError:
                opt.zero_grad()
    # THEN both were discarded and block 4 was counted: one forward + backward
    assert run_row(db, "flops_per_step", "flops_method") == (expected, "counted")
    assert spy.enters == 3
    assert "prof.step(4)" in flops_diagnostics(db)[0][1]


def test_short_prof_step_run_leaves_flops_unknown_with_the_reason(db):
    # GIVEN 2 prof.step() blocks: the counted block (the 3rd) never comes
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("short-steps", db=db.path, gpu="none", summary=False) as prof:
        for i in range(2):
            with prof.step(i):
                train(model, [opt], 2)
    # THEN FLOPs are unknown and the reason counts prof.step() blocks, not optimizer steps
    assert run_row(db, "flops_per_step", "flops_method") == (None, None)
    (level, message), = flops_diagnostics(db)
    assert level == "info" and "2 prof.step() blocks" in message


def test_hooks_are_released_after_the_count_not_at_exit_only(db):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    post_hooks: list[int] = []
    outside = len(optim_mod._global_optimizer_post_hooks)
    with gpuprof.profile("release", db=db.path, gpu="none", summary=False):
        train(model, [opt], 6,
              on_iteration=lambda i: post_hooks.append(len(optim_mod._global_optimizer_post_hooks)))
    # THEN gpuprof's own step hook plus the counter's until step 2 is counted (at the post hook
    # of its optimizer step, which cannot remove itself: the next pre hook removes it), then
    # its own only
    assert post_hooks == [outside + 2] * 4 + [outside + 1] * 2


def test_short_run_leaves_flops_unknown_with_the_reason(db):
    # GIVEN a run of 2 steps: the counted step (index 2) never comes
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hooks_before = global_hooks()
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpuprof.GpuprofWarning)  # not a failure: no warning
        with gpuprof.profile("short", db=db.path, gpu="none", summary=False):
            train(model, [opt], 2)
    # THEN FLOPs stay unknown (NULL, never 0) and a diagnostic says why
    assert run_row(db, "flops_per_step", "flops_method") == (None, None)
    (level, message), = flops_diagnostics(db)
    assert level == "info" and "automatic FLOP count incomplete" in message
    assert global_hooks() == hooks_before and _get_current_dispatch_mode() is None


def test_counting_failure_is_a_warning_and_a_diagnostic_and_training_goes_on(db, monkeypatch):
    # GIVEN FlopCounterMode fails to start
    class Broken(REAL_FLOP_COUNTER):
        def __enter__(self):
            raise RuntimeError("boom")

    monkeypatch.setattr(flop_counter_mod, "FlopCounterMode", Broken)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hooks_before = global_hooks()
    # WHEN the loop runs
    with pytest.warns(gpuprof.GpuprofWarning, match="automatic FLOP count failed"):
        with gpuprof.profile("broken", db=db.path, gpu="none", summary=False):
            train(model, [opt], 6)
    # THEN every step ran and was recorded, MFU's FLOPs are unknown, and the reason is stored
    assert db.one("SELECT COUNT(*) FROM steps WHERE run_id=1") == 6
    assert run_row(db, "flops_per_step") is None
    (level, message), = flops_diagnostics(db)
    assert level == "warning" and "RuntimeError('boom')" in message
    assert global_hooks() == hooks_before and _get_current_dispatch_mode() is None


def test_a_dispatch_mode_left_open_across_the_window_is_not_popped(db):
    # GIVEN a loop that enters its own dispatch mode during the counted step (2) and leaves it
    # only after that step's optimizer.step()
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mine = PassThrough()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = fixed_batch()
    with pytest.warns(gpuprof.GpuprofWarning, match="another torch dispatch mode"):
        with gpuprof.profile("modes", db=db.path, gpu="none", summary=False):
            for i in range(6):
                if i == 2:
                    mine.__enter__()
                loss_of(model, x).backward()
                opt.step()
                opt.zero_grad()
                if i == 2:
                    # THEN gpuprof did not pop the user's mode: it is still on top
                    assert _get_current_dispatch_mode() is mine
                    mine.__exit__(None, None, None)
    # AND gpuprof left its own mode at exit; FLOPs are unknown with the reason stored
    assert _get_current_dispatch_mode() is None
    assert run_row(db, "flops_per_step") is None
    (level, message), = flops_diagnostics(db)
    assert level == "warning" and "another torch dispatch mode" in message


def test_loop_that_raises_inside_the_counted_step_restores_everything(db):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hooks_before = global_hooks()

    def explode(i: int) -> None:
        if i == 2:
            raise KeyError("loop failed")

    with pytest.raises(KeyError, match="loop failed"):
        with gpuprof.profile("raises", db=db.path, gpu="none", summary=False):
            train(model, [opt], 6, on_iteration=explode)
    assert db.one("SELECT status FROM runs WHERE run_id=1") == "failed"
    assert global_hooks() == hooks_before and _get_current_dispatch_mode() is None


# ------------------------------------------------------------------ MFU in the report

@pytest.mark.skipif(cuda_available(), reason="asserts what a machine without CUDA records")
def test_mock_gpu_on_cpu_keeps_mfu_unknown(db):
    # GIVEN a CPU training loop with a mock H100, bf16 and an arch
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("mock", db=db.path, gpu="mock", summary=False, dtype="bf16",
                         arch=TINY, tokens_per_step=BATCH * TINY.seq_len):
        train(model, [opt], 8)
    # THEN the inputs are stored, but the compute ran on the CPU: MFU is unknown, not faked
    assert run_row(db, "gpu_model", "device_kind", "flops_method") == (
        "NVIDIA H100 80GB HBM3", "cpu", "arch")
    doc = insights_json(db)
    assert doc["mfu"]["value"] is None
    assert doc["mfu"]["reason"].startswith("MFU unknown: CPU run (")
    reasons = {n["rule_id"]: n["reason"] for n in doc["not_evaluated"]}
    assert reasons["low_mfu"].startswith("MFU unknown: CPU run (")
    # AND with the arch declared, the checkpointing rule is evaluated (not "not declared")
    assert "gradient_checkpointing_detected" not in reasons


def test_checkpointing_rule_is_not_evaluated_without_an_arch(db):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("noarch", db=db.path, gpu="none", summary=False):
        train(model, [opt], 8)
    reasons = {n["rule_id"]: n["reason"] for n in insights_json(db)["not_evaluated"]}
    assert "gradient checkpointing not declared" in reasons["gradient_checkpointing_detected"]


H100_NVML = "devices 1\ngpu * name NVIDIA H100 80GB HBM3\ngpu * util 90\n"


def _bf16_manual_run(db, flops: str, gpu: str) -> tuple[dict, str]:
    """A manual-API run without torch (bf16, declared FLOPs) on `gpu`; its insights JSON and
    report text."""
    script = MFU_SCRIPT.replace("{FLOPS}", f"dict(flops_per_step={flops})").replace(
        "{GPU}", gpu)
    proc = subprocess.run([sys.executable, "-c", script, str(db.path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return insights_json(db), run_cli("insights", str(db.path), "1")


@pytest.mark.parametrize("flops", ["1e12", "1e18"])
def test_a_mock_gpu_gives_no_mfu_and_no_cost_without_torch(db, flops):
    # GIVEN a manual-API run on a mock H100 without torch (not marked as a CPU run), with
    # bf16 and declared FLOPs (a plausible and an impossible amount); WHEN the report is read
    doc, text = _bf16_manual_run(db, flops, "mock")
    # THEN MFU is unknown because the GPU is simulated, everywhere the report gives it
    assert doc["mfu"]["value"] is None
    assert "simulated" in doc["mfu"]["reason"]
    reasons = {n["rule_id"]: n["reason"] for n in doc["not_evaluated"]}
    assert reasons["low_mfu"] == doc["mfu"]["reason"]
    assert "simulated" in reasons["small_batch"]
    mfu_line = next(line for line in text.splitlines() if line.strip().startswith("MFU "))
    assert "simulated" in mfu_line and "%" not in mfu_line
    # AND no cost is invented for simulated GPUs
    assert "simulated" in reasons["cost"]
    assert "cost" not in {i["rule_id"] for i in doc["insights"]}


def test_mfu_above_100_percent_is_not_evaluated_in_the_report(db, fake_nvml):
    # GIVEN a run on an H100 that declares far more FLOPs per step than the GPU can do
    fake_nvml(H100_NVML)
    # WHEN the report is read
    doc, text = _bf16_manual_run(db, "1e18", "nvml")
    # THEN MFU is null with the reason low_mfu gives, and the summary line prints no number
    assert doc["mfu"]["value"] is None
    assert "likely counts more than this process's GPU work" in doc["mfu"]["reason"]
    reasons = {n["rule_id"]: n["reason"] for n in doc["not_evaluated"]}
    assert reasons["low_mfu"] == doc["mfu"]["reason"]
    mfu_line = next(line for line in text.splitlines() if line.strip().startswith("MFU "))
    assert mfu_line.strip() == "MFU          " + doc["mfu"]["reason"]


MFU_SCRIPT = textwrap.dedent("""
    import sys, time
    import gpuprof
    assert "torch" not in sys.modules  # no torch: the run is not marked as a CPU run
    kwargs = {FLOPS}
    with gpuprof.profile("gpu-mfu", db=sys.argv[1], gpu="{GPU}", auto=False, dtype="bf16",
                         summary=False, **kwargs) as prof:
        for i in range(8):
            with prof.step(i):
                time.sleep(0.004)
""")


@pytest.mark.parametrize("flops_kwargs, method, label", [
    ("dict(arch=gpuprof.TransformerArch(layers=2, hidden=64, heads=4, seq_len=128, "
     "vocab=1000), tokens_per_step=4096)", "arch", "FLOPs: TransformerArch"),
    ("dict(flops_per_step=2.5e12)", "declared", "FLOPs: declared flops_per_step"),
])
def test_report_mfu_line_names_the_flops_method(db, fake_nvml, flops_kwargs, method, label):
    # GIVEN a run on an H100 (the fake NVML library) with bf16 and FLOPs from arch= or
    # flops_per_step=
    fake_nvml(H100_NVML)
    script = MFU_SCRIPT.replace("{FLOPS}", flops_kwargs).replace("{GPU}", "nvml")
    proc = subprocess.run([sys.executable, "-c", script, str(db.path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # WHEN the report is read
    doc = insights_json(db)
    text = run_cli("insights", str(db.path), "1")
    # THEN MFU is FLOPs per step / steady-state mean step time / the H100 bf16 peak
    flops = run_row(db, "flops_per_step")
    durations = [end - start for start, end in
                 db.rows("SELECT start_ns, end_ns FROM steps WHERE run_id=1 ORDER BY step")]
    steady = durations[3:]  # 8 steps: the first 3 are warmup
    expected = flops / (sum(steady) / len(steady) * 1e-9) / 989e12
    assert doc["mfu"]["value"] == pytest.approx(expected, rel=1e-9)
    assert doc["mfu"]["flops_method"] == method
    # AND the MFU line says which method produced the FLOPs
    mfu_line = next(line for line in text.splitlines() if line.strip().startswith("MFU "))
    assert label in mfu_line and "989 TFLOPs bf16 peak" in mfu_line


def test_the_automatic_flop_count_does_not_stall_a_step(tmp_path):
    # GIVEN a fresh process (torch's tracing machinery not imported yet) whose loop has no
    # torch.optim optimizer, grouped with prof.step(): FLOPs are counted automatically
    script = tmp_path / "stall.py"
    script.write_text(textwrap.dedent(f"""
        import json, sqlite3, torch, gpuprof
        w = torch.randn(64, 64, requires_grad=True)
        with gpuprof.profile("stall", db={str(tmp_path / "s.db")!r}, gpu="none",
                             summary=False) as prof:
            for i in range(6):
                with prof.step(i):
                    loss = (torch.randn(16, 64) @ w).pow(2).mean()
                    loss.backward()
                    with torch.no_grad():
                        w -= 0.01 * w.grad
                        w.grad = None
        con = sqlite3.connect({str(tmp_path / "s.db")!r})
        print(json.dumps([r[0] for r in con.execute(
            "SELECT end_ns - start_ns FROM steps ORDER BY step")]))
        print(con.execute("SELECT flops_method FROM runs").fetchone()[0])
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    spans, method = done.stdout.split("\n")[:2]
    spans = json.loads(spans)
    # THEN the FLOPs were counted, and no step after the first took the count's one-off
    # set-up (about a second on this machine kind): each is well under 0.3 s
    assert method == "counted"
    assert len(spans) == 6 and max(spans[1:]) < 0.3e9, spans
