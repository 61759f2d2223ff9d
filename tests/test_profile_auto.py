"""Auto-instrumentation through `with gpuprof.profile(...)` on a real (CPU) torch loop."""

from __future__ import annotations

import os
import threading
import time
import warnings

import pytest
import torch
from torch import nn

import gpuprof


def mlp(width: int = 32, depth: int = 3) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def batches(n: int, width: int = 32, delay_s: float = 0.0):
    for _ in range(n):
        if delay_s:
            time.sleep(delay_s)
        yield torch.randn(8, width)


def train(model, opt, data, accumulate: int = 1) -> None:
    for i, x in enumerate(data):
        model(x).square().mean().backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()


def steps_of(db, run_id: int = 1) -> list[tuple]:
    return db.rows("SELECT step, wait_ns, forward_calls, backward_calls, optimizer_calls "
                   "FROM steps WHERE run_id=? ORDER BY step", run_id)


def phase_calls(db, name: str, run_id: int = 1) -> list[int]:
    return [r[0] for r in db.rows("SELECT calls FROM phases WHERE run_id=? AND name=? "
                                  "ORDER BY step", run_id, name)]


def test_each_optimizer_step_is_a_step_with_forward_backward_optimizer_phases(db, capsys):
    # GIVEN a plain loop of 12 iterations
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # WHEN it runs inside gpuprof.profile
    with gpuprof.profile("plain", db=db.path, gpu="none") as prof:
        train(model, opt, batches(12))
    # THEN 12 steps are stored, each with one outermost forward/backward/optimizer call
    rows = steps_of(db)
    assert [r[0] for r in rows] == list(range(12))
    assert all(r[2:] == (1, 1, 1) for r in rows)
    for name in ("forward", "backward", "optimizer"):
        assert phase_calls(db, name) == [1] * 12
    # AND step 0 has no inter-step gap (unknown), later steps have one
    assert rows[0][1] is None
    assert all(r[1] is not None and r[1] >= 0 for r in rows[1:])
    # AND the run is marked ok and the summary is printed with the run's own step count
    assert db.one("SELECT status FROM runs WHERE run_id=1") == "ok"
    out = capsys.readouterr().out
    assert "gpuprof · plain  (12 steps, avg" in out
    assert f"gpuprof insights {db.path} {prof.run_id}" in out


def test_nested_submodules_are_not_counted_as_forward_calls(db):
    # GIVEN a model of 3 levels of nesting (Sequential of Sequentials of Linear)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Sequential(nn.Tanh()))
                            for _ in range(5)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("nested", db=db.path, gpu="none", summary=False) as prof:
        train(model, opt, batches(4, width=16))
        stats = prof.stats()
    # THEN only the outermost call per iteration is a forward call
    assert phase_calls(db, "forward") == [1, 1, 1, 1]
    assert stats["forward_calls"] == 4


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_recompute_is_backward_not_forward(db, reentrant):
    # GIVEN blocks run under torch.utils.checkpoint: their forwards are recomputed inside
    # backward (on the calling thread, on CPU)
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([mlp(64, 2) for _ in range(4)])

        def forward(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=reentrant)
            return x

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("ckpt", db=db.path, gpu="none", summary=False):
        for _ in range(6):
            model(torch.randn(16, 64, requires_grad=True)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    # THEN each step has one forward call (the recomputes are backward's work), and the
    # phases never add up to more than the step
    rows = steps_of(db)
    assert len(rows) == 6 and all(r[2:] == (1, 1, 1) for r in rows)
    assert phase_calls(db, "forward") == [1] * 6
    over = db.rows("SELECT s.step FROM steps s JOIN phases p ON p.run_id=s.run_id AND "
                   "p.step=s.step WHERE s.run_id=1 GROUP BY s.step "
                   "HAVING SUM(p.wall_ns) > MAX(s.end_ns - s.start_ns)")
    assert over == []


def test_gradient_accumulation_is_one_step(db):
    # GIVEN 4 micro-batches per optimizer step, 20 micro-batches
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("accum", db=db.path, gpu="none", summary=False):
        train(model, opt, batches(20), accumulate=4)
    # THEN 5 steps with 4 forward and 4 backward calls each
    rows = steps_of(db)
    assert len(rows) == 5
    assert all(r[2:] == (4, 4, 1) for r in rows)


def test_optimizer_created_lazily_inside_the_block_is_caught(db):
    # GIVEN an optimizer constructed only after the profile started (as trainers do)
    model = mlp()
    with gpuprof.profile("lazy", db=db.path, gpu="none", summary=False):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        train(model, opt, batches(6))
    # THEN its steps are the run's steps
    assert len(steps_of(db)) == 6


def test_several_optimizers_in_one_iteration_are_one_step(db):
    # GIVEN a GAN-like loop: two models, two optimizers stepping each iteration
    g, d = mlp(), mlp()
    og = torch.optim.SGD(g.parameters(), lr=0.01)
    od = torch.optim.Adam(d.parameters(), lr=0.01)
    with gpuprof.profile("gan", db=db.path, gpu="none", summary=False):
        for x in batches(5):
            d(g(x)).mean().backward()
            od.step()
            og.step()
            od.zero_grad()
            og.zero_grad()
    # THEN 5 steps, each with two optimizer calls
    rows = steps_of(db)
    assert len(rows) == 5
    assert all(r[4] == 2 for r in rows)


def test_optimizers_that_each_follow_their_own_backward_make_one_step_each(db):
    # GIVEN a GAN loop whose discriminator and generator each run forward, backward and
    # their optimizer step in turn
    g, d = mlp(), mlp()
    og = torch.optim.SGD(g.parameters(), lr=0.01)
    od = torch.optim.SGD(d.parameters(), lr=0.01)
    with gpuprof.profile("gan-alternating", db=db.path, gpu="none", summary=False):
        for x in batches(4):
            d(g(x).detach()).mean().backward()
            od.step()
            od.zero_grad()
            d(g(x)).mean().backward()
            og.step()
            og.zero_grad()
    # THEN (as documented) each optimizer step ends a step: two per iteration, each with its
    # own forward calls (g, then d), backward and optimizer call
    rows = steps_of(db)
    assert len(rows) == 8
    assert all(r[2:] == (2, 1, 1) for r in rows)


def test_grad_scaler_step_counts_once(db):
    # GIVEN a mixed-precision style loop using GradScaler (CPU device)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    with gpuprof.profile("amp", db=db.path, gpu="none", summary=False):
        for x in batches(6):
            scaler.scale(model(x).square().mean()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    # THEN each iteration is one step with one optimizer call (scaler.step + inner opt.step)
    rows = steps_of(db)
    assert len(rows) == 6
    assert all(r[4] == 1 for r in rows)
    assert phase_calls(db, "optimizer") == [1] * 6


def test_ddp_wrapped_model(db, tmp_path):
    # GIVEN a single-process gloo group and a DDP-wrapped model
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        model = DDP(mlp())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with gpuprof.profile("ddp", db=db.path, gpu="none", summary=False):
            train(model, opt, batches(5))
    finally:
        dist.destroy_process_group()
    # THEN the DDP call is the outermost forward: one per step
    rows = steps_of(db)
    assert len(rows) == 5
    assert phase_calls(db, "forward") == [1] * 5
    # AND its buckets were timed, so comm timing is available
    assert db.rows("SELECT available FROM telemetry_status WHERE run_id=1 AND source='comm'"
                   ) == [(1,)]


def test_a_run_without_ddp_does_not_claim_comm_timing(db):
    # GIVEN a plain single-process loop (no DistributedDataParallel model)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("plain", db=db.path, gpu="none", summary=False):
        train(model, opt, batches(4))
    # THEN comm timing is unavailable with the reason, not "available (DDP comm hook)"
    assert db.rows("SELECT available, reason FROM telemetry_status WHERE run_id=1 AND "
                   "source='comm'") == [
        (0, "no DistributedDataParallel model ran inside the profile")]


def test_slow_loader_is_measured_as_wait_and_diagnosed(db, capsys):
    # GIVEN a loader that takes 30 ms per batch and a fast model
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("slow-loader", db=db.path, gpu="none"):
        train(model, opt, batches(12, delay_s=0.03))
    # THEN each step after the first carries >= 30 ms of gap wait
    waits = [r[1] for r in steps_of(db)[1:]]
    assert all(w >= 29_000_000 for w in waits), waits
    # AND the stored insights and the summary name the loader stall
    rules = [r[0] for r in db.rows("SELECT rule_id FROM insights WHERE run_id=1")]
    assert "dataloader_stall" in rules
    assert "waiting on the loader" in capsys.readouterr().out


class SlowDataset(torch.utils.data.Dataset):
    """`n` samples of `width` floats; each __getitem__ sleeps `delay_s` (decode, augment)."""

    def __init__(self, n: int, delay_s: float, width: int = 32) -> None:
        self.n, self.delay_s, self.width = n, delay_s, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.randn(self.width)


def train_logging(model, opt, data, log_s: float) -> None:
    """A loop that does `log_s` of host work (logging, metrics) after each optimizer step."""
    for x in data:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(log_s)


def waits_of(db, run_id: int = 1) -> list[tuple]:
    return db.rows("SELECT step, wait_ns, wait_source FROM steps WHERE run_id=? ORDER BY step",
                   run_id)


def rule_ids(db, run_id: int = 1) -> list[str]:
    return [r[0] for r in db.rows("SELECT rule_id FROM insights WHERE run_id=?", run_id)]


def test_torch_dataloader_wait_is_measured_inside_next_not_the_whole_gap(db, capsys):
    # GIVEN a DataLoader taking ~20 ms per batch and 15 ms of logging after each step
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(12, 0.010), batch_size=2)
    with gpuprof.profile("dl-wait", db=db.path, gpu="none") as prof:
        train_logging(model, opt, loader, log_s=0.015)
        stats = prof.stats()
    # THEN every step's wait is the time inside the DataLoader, without the logging
    rows = waits_of(db)
    assert len(rows) == 6
    assert all(src == "dataloader" for _, _, src in rows), rows
    assert all(19_000_000 <= w < 34_000_000 for _, w, _ in rows[1:]), rows
    # AND step 0 carries its first batch's wait (it starts at that wait)
    assert rows[0][1] >= 19_000_000
    # AND iter() and every next() (the last one ends the epoch) went through the hook
    assert stats["loader_calls"] == 1 + 6 + 1
    # AND the summary blames the loader for its share and the logging as host work
    out = capsys.readouterr().out
    assert "waiting on the loader (DataLoader next())" in out
    assert {"dataloader_stall", "kernel_launch_overhead"} <= set(rule_ids(db))


def test_host_work_between_steps_with_a_fast_dataloader_is_not_a_loader_stall(db, capsys):
    # GIVEN an instant DataLoader and 25 ms of host work after every optimizer step
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(16, 0.0), batch_size=2)
    with gpuprof.profile("host-gap", db=db.path, gpu="none"):
        train_logging(model, opt, loader, log_s=0.025)
    # THEN the waits are short and measured in the loader
    rows = waits_of(db)
    assert len(rows) == 8 and all(src == "dataloader" for _, _, src in rows)
    assert all(w < 10_000_000 for _, w, _ in rows[1:]), rows
    # AND no loader stall is reported; the time outside loader and phases is
    rules = rule_ids(db)
    assert "dataloader_stall" not in rules and "kernel_launch_overhead" in rules
    assert "waiting on the loader" not in capsys.readouterr().out


def test_a_module_called_inside_the_loader_is_loader_work_not_a_forward(db):
    # GIVEN a collate_fn that runs a module on the batch (num_workers=0: in this process)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    normalise = nn.LayerNorm(32)

    def collate(items):
        with torch.no_grad():
            return normalise(torch.stack(items))

    loader = torch.utils.data.DataLoader(SlowDataset(10, 0.0), batch_size=2, collate_fn=collate)
    with gpuprof.profile("collate", db=db.path, gpu="none", summary=False):
        train(model, opt, loader)
    # THEN each step has exactly the training model's forward
    rows = steps_of(db)
    assert len(rows) == 5
    assert [r[2] for r in rows] == [1] * 5
    assert phase_calls(db, "forward") == [1] * 5


def slow_worker_start(worker_id: int) -> None:
    """A worker's start-up: opening files, building an index (100 ms here)."""
    time.sleep(0.1)


@pytest.mark.parametrize("persistent", [False, True])
def test_each_epochs_loader_start_is_counted_and_a_slow_one_is_named(db, capsys, persistent):
    # GIVEN 6 epochs of 4 batches from 2 workers that take 100 ms to start
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(8, 0.0), batch_size=2, num_workers=2,
                                         worker_init_fn=slow_worker_start,
                                         persistent_workers=persistent)
    with gpuprof.profile("epochs", db=db.path, gpu="none"):
        for _ in range(6):
            train_logging(model, opt, loader, log_s=0.002)
    # THEN each epoch's first step holds the iter(loader) that started its workers (with
    # persistent workers, only the first epoch's), and no other step does
    rows = db.rows("SELECT step, loader_starts, loader_start_ns, wait_ns FROM steps "
                   "WHERE run_id=1 ORDER BY step")
    assert len(rows) == 24
    assert [r[0] for r in rows if r[1]] == ([0] if persistent else [0, 4, 8, 12, 16, 20]), rows
    assert all(r[1] in (0, 1) and r[2] is not None and 0 <= r[2] <= r[3] for r in rows), rows
    # (a start waits for the workers' 100 ms start-up: iter() starts them, next() waits)
    assert all(r[3] >= 100e6 for r in rows if r[1]), rows
    out = capsys.readouterr().out
    if persistent:
        # AND workers kept across epochs are no epoch-start finding
        assert "loader_epoch_start" not in rule_ids(db)
        return
    # AND workers started again each epoch make each start wait, named with the fix
    assert "loader_epoch_start" in rule_ids(db), out
    assert "Each epoch's start waits for the loader: 5 steps, every 4th (4, 8, …, 20)" in out
    assert "persistent_workers=True" in out
    assert "raise DataLoader num_workers" not in out


def test_a_step_that_does_not_call_the_loader_waited_zero_on_it(db, capsys):
    # GIVEN a GAN-like loop: each batch feeds a D step and a G step (each its own backward and
    # optimizer step: two stored steps), a fast DataLoader and 15 ms of logging before G
    disc, gen = mlp(), mlp()
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.01)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(16, 0.0), batch_size=2)
    with gpuprof.profile("gan", db=db.path, gpu="none"):
        for x in loader:
            disc(x).square().mean().backward()
            opt_d.step()
            opt_d.zero_grad()
            time.sleep(0.015)
            gen(x).square().mean().backward()
            opt_g.step()
            opt_g.zero_grad()
    # THEN the D steps carry the DataLoader's waits, the G steps a gap (no loader call)
    rows = waits_of(db)
    assert len(rows) == 16
    assert [src for _, _, src in rows[2::2]] == ["dataloader"] * 7
    assert [src for _, _, src in rows[1::2]] == ["gap"] * 8
    # AND the analysis does not call the logging a loader stall: it is host work
    rules = rule_ids(db)
    assert "dataloader_stall" not in rules and "kernel_launch_overhead" in rules
    assert "waiting on the loader" not in capsys.readouterr().out


def test_a_wrapped_loader_stays_usable_after_next_raises(db):
    # GIVEN a loader whose 4th batch fails, and a loop that skips a bad batch
    class Flaky(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 3:
                raise KeyError(f"bad sample {i}")
            return torch.randn(32)

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    trained, skipped = 0, 0
    with gpuprof.profile("flaky", db=db.path, gpu="none", summary=False) as prof:
        it = iter(prof.wrap_dataloader(torch.utils.data.DataLoader(Flaky(), batch_size=1)))
        while True:
            try:
                x = next(it)
            except KeyError:
                skipped += 1
                continue
            except StopIteration:
                break
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            trained += 1
    # THEN it iterates like the loader itself: 7 batches trained, 1 skipped, 7 steps stored
    assert (trained, skipped) == (7, 1)
    assert len(waits_of(db)) == 7


def test_a_wrapped_dataloader_counts_its_wait_once(db):
    # GIVEN auto mode and a DataLoader wrapped with prof.wrap_dataloader
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(8, 0.010), batch_size=2)
    with gpuprof.profile("wrapped-dl", db=db.path, gpu="none", summary=False) as prof:
        train_logging(model, opt, prof.wrap_dataloader(loader), log_s=0.010)
        stats = prof.stats()
    # THEN each wait is wrap_dataloader's (~20 ms), not doubled and not the whole gap
    rows = waits_of(db)
    assert len(rows) == 4 and all(src == "explicit" for _, _, src in rows), rows
    assert all(19_000_000 <= w < 29_000_000 for _, w, _ in rows[1:]), rows
    # AND one loader wait per iter()/next(): the DataLoader's own hooks nest inside
    assert stats["loader_calls"] == 1 + 4 + 1


def test_a_dataloader_iterated_on_another_thread_is_not_this_loops_wait(db):
    # GIVEN a prefetch thread that drains a slow DataLoader while the loop trains
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    side = torch.utils.data.DataLoader(SlowDataset(4, 0.010), batch_size=1)
    with gpuprof.profile("dl-thread", db=db.path, gpu="none", summary=False) as prof:
        t = threading.Thread(target=lambda: list(side))
        t.start()
        t.join()
        train(model, opt, batches(4))
        stats = prof.stats()
    # THEN its calls are foreign and the loop's waits stay gap waits
    assert stats["loader_calls"] == 0 and stats["foreign_thread_calls"] >= 6
    assert [src for _, _, src in waits_of(db)[1:]] == ["gap"] * 3


def test_a_finished_run_is_freed_without_waiting_for_the_garbage_collector(db):
    # GIVEN a run with every hook installed (DataLoader, FLOP count), with the collector off
    import gc
    import weakref
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(8, 0.0), batch_size=2)
    gc.disable()
    try:
        with gpuprof.profile("freed", db=db.path, gpu="none", summary=False) as prof:
            train(model, opt, loader)
        ref = weakref.ref(prof)
        del prof
        # THEN nothing of gpuprof's keeps it (and its native session) alive in a cycle
        assert ref() is None
    finally:
        gc.enable()


def test_patches_are_restored_on_exit_and_on_raise(db):
    from torch.utils.data import dataloader
    originals = (nn.Module.__dict__["__call__"], torch.Tensor.__dict__["backward"],
                 torch.autograd.backward, dataloader.DataLoader.__dict__["__iter__"],
                 dataloader._BaseDataLoaderIter.__dict__["__next__"])

    def current():
        return (nn.Module.__dict__["__call__"], torch.Tensor.__dict__["backward"],
                torch.autograd.backward, dataloader.DataLoader.__dict__["__iter__"],
                dataloader._BaseDataLoaderIter.__dict__["__next__"])
    # WHEN a profiled loop exits normally
    with gpuprof.profile("restore", db=db.path, gpu="none", summary=False):
        assert all(now is not was for now, was in zip(current(), originals))
    assert current() == originals
    # AND when it raises
    with pytest.raises(KeyError):
        with gpuprof.profile("restore2", db=db.path, gpu="none", summary=False):
            raise KeyError("boom")
    assert current() == originals
    # AND no optimizer hook is left registered
    from torch.optim.optimizer import _global_optimizer_pre_hooks, _global_optimizer_post_hooks
    assert len(_global_optimizer_pre_hooks) == 0 and len(_global_optimizer_post_hooks) == 0


def test_user_exception_propagates_unchanged_and_run_is_failed(db):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    err = RuntimeError("loss went NaN")
    # WHEN the loop raises after 3 steps
    with pytest.raises(RuntimeError) as caught:
        with gpuprof.profile("crash", db=db.path, gpu="none", summary=False):
            train(model, opt, batches(3))
            raise err
    # THEN the very same exception object reaches the caller
    assert caught.value is err
    # AND the run is stored as failed with the error, keeping its steps
    status, error = db.one("SELECT status, error FROM runs WHERE run_id=1")
    assert status == "failed"
    assert error == "RuntimeError: loss went NaN"
    assert len(steps_of(db)) == 3


class _UnprintableError(Exception):
    def __str__(self):
        return "bad sample " + 3  # a library bug: str() of this exception raises TypeError


@pytest.mark.parametrize("make, stored", [
    (_UnprintableError, "_UnprintableError: <exception str() failed>"),
    # a message holding a non-UTF-8 file name, as os.listdir returns it
    (lambda: ValueError("corrupt image " + os.fsdecode(b"img_\xff.jpg")),
     "ValueError: corrupt image img_\\udcff.jpg"),
])
def test_an_exception_whose_text_cannot_be_stored_still_propagates_and_ends_the_run(
        db, make, stored):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    err = make()
    # WHEN the loop raises an exception whose message cannot be read or stored as it is
    with pytest.raises(type(err)) as caught:
        with gpuprof.profile("oddtext", db=db.path, gpu="none", summary=False):
            train(model, opt, batches(3))
            raise err
    # THEN the same exception reaches the caller, and the run is stored as failed with a
    # readable error
    assert caught.value is err
    assert db.one("SELECT status, error FROM runs WHERE run_id=1") == ("failed", stored)
    assert len(steps_of(db)) == 3
    # AND it ended: the next profile() records a run of its own (no session left active)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with gpuprof.profile("after", db=db.path, gpu="none", summary=False):
            train(model, opt, batches(2))
    assert not [w for w in seen if "already active" in str(w.message)]
    assert db.one("SELECT status FROM runs WHERE run_id=2") == "ok"


def test_module_calls_from_other_threads_are_not_recorded(db):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("threads", db=db.path, gpu="none", summary=False) as prof:
        t = threading.Thread(target=lambda: [model(torch.randn(2, 32)) for _ in range(5)])
        t.start()
        t.join()
        train(model, opt, batches(3))
        stats = prof.stats()
    assert stats["foreign_thread_calls"] == 5 * len(list(model.modules()))
    assert phase_calls(db, "forward") == [1, 1, 1]


def test_a_loop_on_another_thread_gets_a_summary_that_says_so(db, capsys):
    # GIVEN profile() entered on this thread and the training run on a worker thread
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuprof.profile("other-thread", db=db.path, gpu="none"):
        t = threading.Thread(target=train, args=(model, opt, batches(4)))
        t.start()
        t.join()
    # THEN no step is recorded and the summary and a diagnostic say why
    out = capsys.readouterr().out
    assert "No steps were recorded" in out
    assert "ran on other threads than the one that entered profile()" in out
    msg = db.one("SELECT message FROM diagnostics WHERE source='threads'")
    count, rest = msg.split(" ", 1)
    assert int(count) >= 4 * len(list(model.modules())) and rest.startswith("model, backward")


def test_nested_profile_warns_and_records_only_the_outer(db):
    with gpuprof.profile("outer", db=db.path, gpu="none", summary=False):
        with pytest.warns(gpuprof.GpuprofWarning, match="already active"):
            with gpuprof.profile("inner", db=db.path, gpu="none", summary=False) as inner:
                assert not inner.active
    assert [r[0] for r in db.rows("SELECT run_name FROM runs")] == ["outer"]


def test_profiler_failure_never_breaks_the_loop(tmp_path):
    # GIVEN a DB path inside a directory that does not exist
    bad = tmp_path / "missing-dir" / "x.db"
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # WHEN profiling cannot start
    with pytest.warns(gpuprof.GpuprofWarning, match="could not start recording"):
        with gpuprof.profile("nodb", db=bad, summary=False) as prof:
            train(model, opt, batches(3))  # THEN the loop still runs
    assert not prof.active
    assert nn.Module.__dict__["__call__"].__class__.__name__ == "function"


@pytest.mark.parametrize("kwargs, message", [
    ({"gpu": "cuda"}, "gpu must be one of"),
    ({"sample_hz": 0}, "sample_hz must be > 0"),
    ({"sample_hz": "fast"}, "sample_hz must be a number"),
    ({"host_hz": -1}, "host_hz must be >= 0"),
    ({"dtype": "int4"}, "dtype must be one of"),
    ({"mock_gpus": 0}, "mock_gpus must be an int"),
    ({"flops_per_step": -5}, "flops_per_step must be > 0"),
    ({"gpu": "mock", "mock_scenario": "tmp=90"}, "mock_scenario: unknown mock scenario key 'tmp'"),
    ({"host_hz": 1e9}, "host_hz must be <= 100"),
    ({"host_hz": float("inf")}, "host_hz must be a finite number"),
    ({"sample_hz": float("inf")}, "sample_hz must be a finite number"),
    ({"flops_per_step": float("inf")}, "flops_per_step must be a finite number"),
    ({"flops_per_step": float("nan")}, "flops_per_step must be a finite number"),
    ({"group": ""}, "group must be a non-empty string"),
])
def test_invalid_options_name_the_problem(db, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        gpuprof.profile("bad", db=db.path, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"group": 7}, "group must be a string, got int 7"),
    ({"auto": "no"}, "auto must be a bool, got str 'no'"),
    ({"summary": "no"}, "summary must be a bool"),
    ({"host": 1}, "host must be a bool, got int 1"),
    ({"cuda_events": None}, "cuda_events must be a bool"),
    ({"comm_hook": "yes"}, "comm_hook must be a bool"),
    ({"db": 123}, "db must be a file path"),
    ({"db": b"x.db"}, "db must be a file path"),
    ({"mock_gpus": "2"}, "mock_gpus must be an int in 1..64, got str '2'"),
    ({"gpu": 0}, "gpu must be a string, one of auto, nvml, neuron, mock, none; got int 0"),
    ({"dtype": 16}, "dtype must be a string, one of bf16, .*; got int 16"),
])
def test_options_of_the_wrong_type_raise_typeerror_naming_them(tmp_path, kwargs, message):
    # GIVEN an option of the wrong type (a job id read as an int, "no" for False, ...)
    # WHEN profile() is called THEN it raises at once, naming the option
    with pytest.raises(TypeError, match="gpuprof.profile: " + message):
        gpuprof.profile("bad", **{"db": str(tmp_path / "x.db"), **kwargs})


def test_a_bad_gpu_backend_from_the_environment_names_the_variable(db, monkeypatch):
    monkeypatch.setenv("GPUPROF_GPU_BACKEND", "cuda")
    with pytest.raises(ValueError, match=r"\$GPUPROF_GPU_BACKEND must be one of .*got 'cuda'"):
        gpuprof.profile("env", db=db.path)


def test_config_json_is_strict_json_and_group_is_stored(db):
    import json

    def no_constants(name):
        raise AssertionError(f"config_json holds {name}")

    with gpuprof.profile("cfg", db=db.path, gpu="none", host_hz=100, flops_per_step=1e300,
                         group="job-7", summary=False):
        pass
    cfg, group = db.one("SELECT config_json, group_id FROM runs")
    assert json.loads(cfg, parse_constant=no_constants)["host_hz"] == 100
    assert group == "job-7"


@pytest.mark.parametrize("group, stored", [("explicit-job", "explicit-job"),
                                           (None, "elastic-42")])
def test_an_explicit_group_wins_over_torchelastic_run_id(db, monkeypatch, group, stored):
    # GIVEN a torchrun environment
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-42")
    # WHEN a run names its group (or not)
    with gpuprof.profile("grp", db=db.path, gpu="none", group=group, summary=False):
        pass
    # THEN the explicit group is stored, else the environment's
    assert db.one("SELECT group_id FROM runs") == stored


def test_numpy_bools_are_bools(db):
    np = pytest.importorskip("numpy")
    with gpuprof.profile("npbool", db=db.path, gpu="none", auto=np.bool_(False),
                         summary=np.bool_(False)) as prof:
        pass
    assert prof.run_id is not None and db.one("SELECT status FROM runs") == "ok"


def test_empty_run_name_is_rejected():
    with pytest.raises(ValueError, match="run_name"):
        gpuprof.profile("  ")
    with pytest.raises(TypeError, match="run_name must be a string, got int 7"):
        gpuprof.profile(7)


@pytest.mark.parametrize("option", ["db", "run_name", "group"])
def test_text_that_cannot_be_stored_as_utf8_is_rejected_naming_it(tmp_path, option):
    # GIVEN a name holding an undecodable byte, as os.fsdecode gives it (b"\xff" -> "\udcff")
    bad = os.fsdecode(b"r\xffn")
    kwargs = {"db": str(tmp_path / "x.db")}
    if option == "db":
        kwargs["db"] = str(tmp_path / bad / "x.db")
    elif option == "group":
        kwargs["group"] = bad
    # WHEN profile() is called THEN it raises at once, naming the option
    with pytest.raises(ValueError, match=f"gpuprof.profile: {option} .* is not valid UTF-8"):
        gpuprof.profile(bad if option == "run_name" else "ok", **kwargs)


def test_internal_failure_becomes_a_warning_and_a_stored_diagnostic(db, monkeypatch):
    # GIVEN torch's optimizer hook registration is broken
    import torch.optim.optimizer as optim_mod

    def broken(hook):
        raise RuntimeError("hook registry unavailable")

    monkeypatch.setattr(optim_mod, "register_optimizer_step_pre_hook", broken)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # WHEN a profiled loop runs
    with pytest.warns(gpuprof.GpuprofWarning, match="auto-instrumentation failed"):
        with gpuprof.profile("broken", db=db.path, gpu="none", summary=False):
            train(model, opt, batches(3))  # THEN the loop runs to the end
    # AND the failure is stored, the patches are gone, the run is ok
    msgs = [r[0] for r in db.rows("SELECT message FROM diagnostics WHERE level='error'")]
    assert any("hook registry unavailable" in m for m in msgs), msgs
    assert nn.Module.__dict__["__call__"].__class__.__name__ == "function"
    assert db.one("SELECT status FROM runs") == "ok"


def test_failing_cuda_callback_is_dropped_with_a_diagnostic(db):
    # GIVEN a hook whose boundary callback raises (as a broken CUDA event would)
    calls = []

    def callback(kind, begin, ts):
        calls.append(kind)
        raise ValueError("event pool exhausted")

    model = mlp()
    with gpuprof.profile("cb", db=db.path, auto=False, gpu="none", summary=False) as prof:
        hook = prof._session.hook(0, nn.Module.__dict__["__call__"], callback)
        with pytest.warns(RuntimeWarning, match="event pool exhausted"):
            out = hook(model, torch.randn(2, 32))
        hook(model, torch.randn(2, 32))
    # THEN the call itself succeeded, the callback ran once and was then dropped
    assert out.shape == (2, 32)
    assert calls == [0]
    msgs = [r[0] for r in db.rows("SELECT message FROM diagnostics WHERE source='cuda_events'")]
    assert any("event pool exhausted" in m for m in msgs), msgs


@pytest.mark.parametrize("run_id", ["none", "", "  "])
def test_torchrun_without_rdzv_id_sets_no_group(db, monkeypatch, run_id):
    # GIVEN plain torchrun's TORCHELASTIC_RUN_ID (the placeholder "none", or an empty value)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
    # WHEN a run leaves out group=
    with gpuprof.profile("grp", db=db.path, gpu="none", summary=False):
        pass
    # THEN it belongs to no group (not to one shared by every such job)
    assert db.one("SELECT group_id FROM runs") is None


def test_an_undecodable_torchelastic_run_id_is_stored_escaped(db, monkeypatch):
    # GIVEN $TORCHELASTIC_RUN_ID holding a byte that is not UTF-8 (every rank reads the same)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", os.fsdecode(b"job-\xff"))
    # WHEN a run starts
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not start recording"
        with gpuprof.profile("elastic", db=db.path, gpu="none", summary=False):
            pass
    # THEN it is recorded, its group the variable's text with the byte escaped
    assert db.one("SELECT group_id FROM runs") == "job-\\udcff"


def test_an_empty_gpu_backend_variable_counts_as_unset(db, monkeypatch):
    # GIVEN GPUPROF_GPU_BACKEND= (set, empty)
    monkeypatch.setenv("GPUPROF_GPU_BACKEND", "")
    # WHEN profile() is called without gpu= THEN it runs with the default backend
    with gpuprof.profile("env", db=db.path, auto=False, summary=False) as prof:
        with prof.step():
            pass
    assert db.one("SELECT gpu_backend FROM runs") != ""
    assert db.one("SELECT count(*) FROM steps") == 1


@pytest.mark.parametrize("kwargs, named", [
    (dict(mock_gpus=4), "mock_gpus"),
    (dict(mock_scenario="temp=90"), "mock_scenario"),
    (dict(mock_gpus=2, mock_scenario="temp=90"), "mock_gpus and mock_scenario"),
])
def test_mock_options_without_the_mock_backend_warn_naming_them(db, kwargs, named):
    # GIVEN mock options with another GPU backend
    # WHEN profile() is called THEN a GpuprofWarning names them, pointing at the caller's line
    with pytest.warns(gpuprof.GpuprofWarning, match=named + r" only apply with gpu=\"mock\"") as w:
        p = gpuprof.profile("m", db=db.path, gpu="none", auto=False, summary=False, **kwargs)
    assert w[0].filename == __file__
    with p:
        pass
    assert db.one("SELECT gpu_backend FROM runs") == "none"


def test_a_run_that_imports_torch_dynamo_leaves_nothing_on_stderr_at_exit(tmp_path):
    # GIVEN a script that first imports torch._dynamo inside a run (torch.compile, or an
    # optimizer built in the block does that), which keeps objects alive to interpreter exit
    import subprocess
    import sys
    script = tmp_path / "dyn.py"
    script.write_text("import torch, gpuprof\n"
                      f"with gpuprof.profile('dyn', db={str(tmp_path / 'd.db')!r}, gpu='none',"
                      " summary=False):\n"
                      "    import torch._dynamo\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    # THEN it exits cleanly with nothing on stderr (no binding-layer "leaked instance" report)
    assert done.returncode == 0
    assert done.stderr == ""


@pytest.mark.parametrize("counting", ["counted", "declared"])
def test_torch_dynamo_never_records_the_hooks_and_the_run_is_freed(tmp_path, counting):
    # GIVEN a fresh process that has imported torch but not torch._dynamo, and an auto run
    # that counts one step's FLOPs (its FlopCounterMode imports torch._dynamo) or declares them
    import subprocess
    import sys
    declared = ", flops_per_step=1e6" if counting == "declared" else ""
    script = tmp_path / "dyn_tables.py"
    script.write_text(f"""
import gc, sys, weakref
import torch, gpuprof
assert "torch._dynamo" not in sys.modules
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with gpuprof.profile("dyn", db={str(tmp_path / 'd.db')!r}, gpu="none", summary=False{declared}) as prof:
    for _ in range(4):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
ref = weakref.ref(prof)
del prof
gc.collect()
import torch._dynamo.utils  # a program that compiles after the run
hooks = [o for o in gc.get_objects() if type(o).__name__ == "CallHook"]
print(ref() is None, len(hooks), torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl)
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    # THEN no gpuprof hook survives the run (torch._dynamo was imported before the patches
    # went in, so its tables hold torch's own functions), and the finished run is freed
    assert done.stdout.split() == ["True", "0", "True"]


def test_evaluation_blocks_are_in_no_step_and_reported_apart(tmp_path):
    """prof.evaluation(): a validation pass inside the training loop is neither a step nor part
    of the next step's time; it is counted in a diagnostic."""
    import sqlite3
    import time

    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    db = tmp_path / "e.db"
    with gpuprof.profile("eval", db=str(db), gpu="none", summary=False) as prof:
        for i in range(9):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if i % 3 == 2:
                with prof.evaluation(), torch.no_grad():
                    for _ in range(4):
                        model(x)
                    time.sleep(0.05)
    con = sqlite3.connect(db)
    steps = con.execute("SELECT step, start_ns, end_ns, forward_calls FROM steps "
                        "ORDER BY step").fetchall()
    (diag,), = con.execute("SELECT message FROM diagnostics WHERE source='evaluation'")
    con.close()
    assert [s[0] for s in steps] == list(range(9))
    assert all(s[3] == 1 for s in steps)
    assert all(end - start < 50_000_000 for _, start, end, _ in steps), steps  # no 50 ms eval
    assert diag.startswith("evaluation: 3 loops") and "12 forward calls" in diag, diag
