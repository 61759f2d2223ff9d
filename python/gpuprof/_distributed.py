"""Distributed runs: the rank environment, a group id every rank agrees on, clock alignment
between the ranks, and per-bucket timing of DDP's gradient collectives.

What touches torch.distributed lives here (the measuring and deciding is native): the ranks
talk through torch's own store and process group, and the results go to the native session
(runs.group_id / rank / world_size, config_json "distributed", comm_buckets rows).

Safety: a collective that not every rank enters hangs the job. Clock alignment therefore first
asks, through the process group's store, whether every rank runs gpuprof; rank 0 decides and
the decision is a single compare-and-set, so every rank acts on the same answer. The group id is
agreed with one compare-and-set per rank (the first proposal wins): no rank waits for another.
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
import threading
import time
from collections import deque
from typing import Any
from collections.abc import Callable

ROUNDS = 64                # ping-pong round trips with each peer
# Rank 0 waits this long for every rank to reach the alignment (ranks of one SPMD script get
# there within a fraction of a second: they have just met in init_process_group or in a DDP
# step); when only some ranks run gpuprof, this is what the ones that do lose, once.
_ARRIVE_TIMEOUT_S = 20.0
_DECIDE_TIMEOUT_S = 30.0  # the other ranks wait this long for rank 0's decision
_STORE_CONNECT_S = 10.0


def _int_env(name: str) -> int | None:
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() else None


def rank_environment() -> dict[str, Any]:
    """The launcher's description of this process (torchrun, torch.distributed.launch, SLURM
    with the usual variables): rank, world_size, local_rank, local_world_size, node_rank and
    torchrun's run id and restart count, each only when set."""
    env: dict[str, Any] = {}
    for var, key in (("RANK", "rank"), ("WORLD_SIZE", "world_size"),
                     ("LOCAL_RANK", "local_rank"), ("LOCAL_WORLD_SIZE", "local_world_size"),
                     ("GROUP_RANK", "node_rank"),
                     ("TORCHELASTIC_RESTART_COUNT", "restart_count")):
        v = _int_env(var)
        if v is not None:
            env[key] = v
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is not None:
        env["torchelastic_run_id"] = run_id
    return env


def rendezvous_group() -> str | None:
    """torchrun's rendezvous id when it names a job. Plain torchrun (no --rdzv-id) sets
    TORCHELASTIC_RUN_ID=none: that names no job (every such job would share one group)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id.lower() != "none":
        return run_id
    return None


def group_proposal(run_name: str) -> str:
    """A fresh group id, readable in `gpuprof insights --group` listings."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in run_name)[:40] or "run"
    return f"{name}-{stamp}-{secrets.token_hex(3)}"


def _agree(store: Any, key: str, proposal: str) -> str:
    """Every rank proposes; the first compare-and-set wins and every rank reads that value."""
    value = store.compare_set(key, "", proposal)
    return value.decode() if isinstance(value, bytes) else str(value)


def agree_group_through_launcher(run_name: str) -> tuple[str | None, str | None]:
    """Before the process group exists: torchrun's agent store (torchrun hosts a TCPStore on
    MASTER_ADDR:MASTER_PORT and tells its workers to use it). Returns (group id, problem)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None, None
    host = os.environ.get("MASTER_ADDR")
    port = _int_env("MASTER_PORT")
    if not host or port is None:
        return None, None
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]
        store = TCPStore(host, port, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=_STORE_CONNECT_S))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return _agree(store, f"gpuprof/group_id/{restart}", group_proposal(run_name)), None
    except Exception as e:  # a profiler failure never breaks the training
        return None, f"agreeing a group id through torchrun's store failed: {e!r}"


def _default_store(dist: Any) -> Any:
    return dist.distributed_c10d._get_default_store()


def agree_group_through_process_group(dist: Any, run_name: str) -> str:
    return _agree(_default_store(dist), "gpuprof/group_id", group_proposal(run_name))


def host_key() -> str:
    """This host as every rank on it sees it, and no rank elsewhere: hostname, kernel boot id
    and pid namespace (containers sharing a host's name and kernel see different pids)."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        pass
    try:
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        pass
    return ":".join(parts)


_HOST_PIDS_KEY = "gpuprof/host_pids/"


def publish_host_pid(store: Any) -> None:
    """Adds this process to its host's list in the store (before the ranks' arrival check, so
    that once every rank arrived every list is whole)."""
    store.append(_HOST_PIDS_KEY + host_key(), f"{os.getpid()},")


def other_ranks_on_this_host(store: Any) -> list[int]:
    """The pids of the job's other ranks on this host (publish_host_pid's lists)."""
    raw = store.get(_HOST_PIDS_KEY + host_key())
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    pids = {int(p) for p in text.split(",") if p.strip().isdigit()}
    pids.discard(os.getpid())
    return sorted(pids)


def _everyone_in(store: Any, rank: int, world: int, key: str) -> bool:
    """Whether every rank reached this point (so that the collectives that follow cannot
    hang). Rank 0 decides; a rank that gives up first decides "no"; one compare-and-set."""
    store.add(f"{key}/arrived", 1)
    go = f"{key}/go"
    if rank == 0:
        deadline = time.monotonic() + _ARRIVE_TIMEOUT_S
        while store.add(f"{key}/arrived", 0) < world and time.monotonic() < deadline:
            time.sleep(0.002)
        desired = "1" if store.add(f"{key}/arrived", 0) >= world else "0"
    else:
        deadline = time.monotonic() + _DECIDE_TIMEOUT_S
        while not store.check([go]) and time.monotonic() < deadline:
            time.sleep(0.002)
        desired = "0"
    return _agree(store, go, desired) == "1"


def align_clocks(dist: Any, torch: Any, clock: Callable[[], int],
                 rounds: int = ROUNDS) -> dict[str, Any]:
    """Rank 0 ping-pongs `rounds` times with each peer after a barrier; the round with the
    shortest round trip gives the peer's offset (its clock minus rank 0's, at the same
    instant) with half that round trip as the uncertainty. Every rank returns its own entry.
    Collectives: every rank must call this at the same point of the program."""
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = str(dist.get_backend()).lower()
    use_cuda = "nccl" in backend and "gloo" not in backend
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else "cpu"
    method = f"{'nccl' if use_cuda else 'gloo'} send/recv ping-pong"
    buf = torch.zeros(1, dtype=torch.int64, device=device)

    def settle() -> None:
        if use_cuda:
            torch.cuda.synchronize()

    started = time.perf_counter()
    dist.barrier()
    table = torch.zeros(world, 2, dtype=torch.int64, device=device)
    if rank == 0:
        for peer in range(1, world):
            best: tuple[int, int] | None = None
            for _ in range(rounds):
                t0 = clock()
                dist.send(buf, peer)
                dist.recv(buf, peer)
                peer_time = int(buf.item())  # .item() waits for the receive on a GPU
                t3 = clock()
                rtt = t3 - t0
                if best is None or rtt < best[0]:
                    best = (rtt, peer_time - (t0 + t3) // 2)
            assert best is not None
            table[peer, 0] = best[1]
            table[peer, 1] = (best[0] + 1) // 2
    else:
        for _ in range(rounds):
            dist.recv(buf, 0)
            settle()
            buf.fill_(clock())
            dist.send(buf, 0)
            settle()
    dist.broadcast(table, 0)
    mine = table[rank].tolist()
    return {"clock_offset_ns": int(mine[0]), "clock_uncertainty_ns": int(mine[1]),
            "clock_reference_rank": 0, "clock_rounds": rounds, "clock_method": method,
            "clock_alignment_ms": round((time.perf_counter() - started) * 1e3, 3)}


class Coordinator:
    """Per profile: agrees the group id and aligns the clocks once torch.distributed is
    initialised (at start, or at the first step after it is)."""

    def __init__(self, session: Any, torch: Any, run_name: str, config: dict[str, Any],
                 need_group: bool) -> None:
        self._session = session
        self._torch = torch
        self._run_name = run_name
        self._config = config  # the run's config_json dict; "distributed" is updated here
        self._need_group = need_group
        self.done = False
        info = session.info()
        start_unix, anchor = int(info["start_unix_ns"]), int(info["anchor_mono_ns"])
        from . import _native
        mono = _native.monotonic_ns
        self._clock = lambda: start_unix + (mono() - anchor)

    def _store_config(self, **run_fields: Any) -> None:
        import json
        self._session.update_run(config_json=json.dumps(self._config, sort_keys=True,
                                                        allow_nan=False), **run_fields)

    def _tell_job_pids(self, store: Any) -> None:
        """The job's other ranks on this host, for the host sampler (job_cpu_pct): exact under
        any launcher (torchrun, mp.spawn, srun, mpirun)."""
        try:
            pids = other_ranks_on_this_host(store)
            if pids:
                self._session.set_job_pids(pids)
        except Exception as e:
            self._session.add_diagnostic("warning", "host",
                                         f"the job's other ranks on this host unknown: {e!r}")

    def try_now(self) -> bool:
        """Runs the agreement and alignment when the process group is up; True once done
        (also when it failed: the reason is stored, and it is not tried again)."""
        if self.done:
            return True
        try:
            dist = self._torch.distributed
            if not (dist.is_available() and dist.is_initialized()):
                return False
        except Exception:
            return False
        self.done = True
        dist_cfg = self._config.setdefault("distributed", {})
        fields: dict[str, Any] = {}
        try:
            rank, world = dist.get_rank(), dist.get_world_size()
            dist_cfg.setdefault("rank", rank)
            dist_cfg.setdefault("world_size", world)
            fields.update(rank=rank, world_size=world)
            if world < 2:
                dist_cfg["clock_unaligned_reason"] = "a single-rank process group"
                self._store_config(**fields)
                return True
            if self._need_group:
                group = agree_group_through_process_group(dist, self._run_name)
                fields["group_id"] = group
                dist_cfg["group_source"] = "agreed through the process group's store"
            store = _default_store(dist)
            try:
                publish_host_pid(store)
                published = True
            except Exception:  # a store without append (torch < 2.2): the launcher's guess
                published = False
            if _everyone_in(store, rank, world, "gpuprof/align"):
                if published:
                    self._tell_job_pids(store)
                dist_cfg.update(align_clocks(dist, self._torch, self._clock))
            else:
                dist_cfg["clock_unaligned_reason"] = (
                    "not every rank runs gpuprof (or one reached the alignment over "
                    f"{_ARRIVE_TIMEOUT_S:.0f} s later): clocks are compared as they are")
        except Exception as e:  # a profiler failure never breaks the training
            dist_cfg["clock_unaligned_reason"] = f"clock alignment failed: {e!r}"
            self._session.add_diagnostic("warning", "distributed",
                                         f"distributed set-up failed: {e!r}")
        try:
            self._store_config(**fields)
        except Exception as e:
            self._session.add_diagnostic("warning", "distributed",
                                         f"storing the distributed set-up failed: {e!r}")
        return True


# ---- DDP comm hook --------------------------------------------------------------------------

_MAX_PENDING_EVENTS = 4096


class _Sink:
    """Where timed buckets go while a profile runs (None when none does)."""
    session: Any = None
    cuda: Any = None  # _CudaBucketTimer once a DDP model with CUDA parameters ran


def _cuda_timer_for(tensor: Any) -> Any:
    """The CUDA timer for a bucket on a GPU; None (wall clock) for a bucket in host memory (a
    gloo model in a process that has a GPU too)."""
    cuda = _sink.cuda
    return cuda if cuda is not None and tensor.is_cuda else None


_sink = _Sink()
_lock = threading.Lock()


class _CudaBucketTimer:
    """GPU bucket times from CUDA events: a start event when the hook runs, an end event once
    the collective's future completes (recorded on the streams that future synchronises with),
    resolved later with the non-blocking query(); absolute times from one anchor event recorded
    on an idle GPU (one synchronize, when the timer is made)."""

    def __init__(self, torch: Any, now: Callable[[], int]) -> None:
        self._event: Callable[[], Any] = lambda: torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        self._anchor = self._event()
        self._anchor_ns = now()
        self._anchor.record()
        self._pending: deque[tuple[int, Any, Any, int | None]] = deque()
        self.dropped = 0

    def start(self) -> Any:
        ev = self._event()
        ev.record()
        return ev

    def finish(self, index: int, start: Any, nbytes: int | None) -> None:
        end = self._event()
        end.record()
        with _lock:
            if len(self._pending) >= _MAX_PENDING_EVENTS:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append((index, start, end, nbytes))

    def poll(self, session: Any, wait: bool = False) -> None:
        while True:
            with _lock:
                if not self._pending:
                    return
                index, start, end, nbytes = self._pending[0]
                if not wait and not end.query():
                    return
                self._pending.popleft()
            if wait:
                end.synchronize()
            base = self._anchor_ns
            s = base + int(self._anchor.elapsed_time(start) * 1e6)
            e = base + int(self._anchor.elapsed_time(end) * 1e6)
            session.add_comm_bucket(index, s, e, nbytes)


def _bucket_bytes(bucket: Any) -> int | None:
    try:
        buf = bucket.buffer()
        return int(buf.numel() * buf.element_size())
    except Exception:
        return None


def _report(session: Any, cuda: Any, index: int, start: int, start_ev: Any,
            nbytes: int | None, now: Callable[[], int]) -> None:
    """A bucket's collective completed: its end is taken now (CPU), or an end event is
    recorded for later (CUDA). Never raises into the collective's callback."""
    try:
        if cuda is not None:
            cuda.finish(index, start_ev, nbytes)
        else:
            session.add_comm_bucket(index, start, now(), nbytes)
    except Exception:
        pass


def timed_hook(inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Wraps a DDP comm hook: the inner hook runs unchanged and its future is returned as it
    is; while a profile runs, the bucket's start (hook called) and end (future done) go to the
    native session. A failure to time never affects the collective."""
    from . import _native
    now = _native.monotonic_ns

    # No annotations: DDP checks that "bucket" has none (or GradBucket) and the return none
    # (or Future[Tensor]), and this module's annotations are strings.
    def gpuprof_timed_hook(state, bucket):  # type: ignore[no-untyped-def]
        session = _sink.session
        if session is None:
            return inner(state, bucket)
        start = now()
        cuda = _cuda_timer_for(bucket.buffer())
        start_ev = cuda.start() if cuda is not None else None
        fut = inner(state, bucket)
        try:
            index, nbytes = int(bucket.index()), _bucket_bytes(bucket)

            fut.add_done_callback(
                lambda _: _report(session, cuda, index, start, start_ev, nbytes, now))
            if cuda is not None:
                cuda.poll(session)
        except Exception:
            pass
        return fut

    gpuprof_timed_hook.__name__ = getattr(inner, "__name__", "comm_hook")
    gpuprof_timed_hook.__qualname__ = getattr(inner, "__qualname__",
                                              gpuprof_timed_hook.__name__)
    gpuprof_timed_hook._gpuprof_inner = inner  # type: ignore[attr-defined]
    return gpuprof_timed_hook


def timed_allreduce_hook() -> Callable[[Any, Any], Any]:
    """DDP's default reduction (average by allreduce, as torch's allreduce_hook) with the
    timing folded into the one Python callback that hook has anyway: on CPU the bucket's end is
    taken there, so timing adds no callback to what a Python hook costs."""
    import torch.distributed as dist
    from . import _native
    now = _native.monotonic_ns

    def gpuprof_allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
        session = _sink.session
        start = now()
        tensor = bucket.buffer()
        cuda = _cuda_timer_for(tensor) if session is not None else None
        start_ev = cuda.start() if cuda is not None else None
        group: Any = process_group if process_group is not None else dist.group.WORLD
        nbytes = tensor.numel() * tensor.element_size()
        tensor.div_(group.size())
        index = bucket.index()
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):  # type: ignore[no-untyped-def]
            if session is not None:
                _report(session, cuda, index, start, start_ev, nbytes, now)
            return f.value()[0]

        if cuda is not None and start_ev is not None:  # start_ev: only with a CUDA timer
            try:
                cuda.poll(session)
            except Exception:
                pass
        return fut.then(done)

    # DDP's logging names the hook by its __qualname__: keep it short and recognisable.
    gpuprof_allreduce_hook.__qualname__ = "gpuprof_allreduce_hook"
    gpuprof_allreduce_hook._gpuprof_inner = None  # type: ignore[attr-defined]
    return gpuprof_allreduce_hook


_registration_patched = False


def install_registration_shim() -> None:
    """Makes DistributedDataParallel.register_comm_hook register the user's hook wrapped by
    timed_hook (transparent while no profile runs), so a hook registered before profile()
    starts is still timed inside it. Idempotent; a no-op when torch.distributed is missing."""
    global _registration_patched
    if _registration_patched:
        return
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception:
        return
    original = DDP.register_comm_hook

    def register_comm_hook(self: Any, state: Any, hook: Callable[..., Any]) -> None:
        if callable(hook) and not hasattr(hook, "_gpuprof_inner"):
            hook = timed_hook(hook)
        original(self, state, hook)
        self._gpuprof_hooked = True

    register_comm_hook.__doc__ = original.__doc__
    register_comm_hook._gpuprof_original = original  # type: ignore[attr-defined]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    _registration_patched = True


def _builtin_equivalent(comm_hook_type: Any) -> Callable[..., Any] | None:
    """The Python hook that does what a built-in DDP hook does (FP16_COMPRESS; ALLREDUCE is
    DdpTiming's default)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    name = getattr(comm_hook_type, "name", str(comm_hook_type))
    if name.endswith("FP16_COMPRESS"):
        return default_hooks.fp16_compress_hook
    return None


class DdpTiming:
    """Auto mode: times every DDP model's buckets inside the profile. A DDP model with no hook
    of its own gets DDP's default reduction (allreduce) timed at its first forward: by the
    native hook (gpuprof.ddp_hook, C++, no GIL) when it is built and the model is in host
    memory, else by timed_allreduce_hook (Python); a user's hook registered through
    register_comm_hook is wrapped (see install_registration_shim); the built-in ALLREDUCE hook
    registered inside the block gets the default's timing, FP16_COMPRESS its Python
    equivalent, wrapped."""

    def __init__(self, session: Any, torch: Any) -> None:
        self._session = session
        self._torch = torch
        self._restore: list[tuple[Any, str, Any, Any]] = []
        self._noted: set[str] = set()
        self._models: set[int] = set()  # id() of the DDP models that ran inside the profile
        self._native: Any = None  # gpuprof.ddp_hook's module, when built and connected

    def _note(self, key: str, level: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self._session.add_diagnostic(level, "comm", message)

    def install(self) -> None:
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except Exception:
            return
        install_registration_shim()
        timing = self
        original_forward = DDP.__dict__["forward"]
        original_builtin: Any = DDP.__dict__.get("_register_builtin_comm_hook")

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if id(self) not in timing._models:
                timing._first_forward(self)
            return original_forward(self, *args, **kwargs)

        def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> Any:
            if getattr(comm_hook_type, "name", str(comm_hook_type)).endswith("ALLREDUCE"):
                # DDP's default reduction: what auto mode puts on a model without a hook
                timing._hook_default(self)
                return None
            hook = _builtin_equivalent(comm_hook_type)
            if hook is None or original_builtin is None:
                timing._note(f"builtin:{comm_hook_type}", "info",
                             f"DDP built-in comm hook {comm_hook_type} is not timed: gpuprof "
                             "times Python comm hooks and the ALLREDUCE / FP16_COMPRESS "
                             "built-ins")
                self._gpuprof_hooked = True
                return original_builtin(self, comm_hook_type)
            self.register_comm_hook(self.process_group, hook)

        for attr, new in (("forward", forward),
                          ("_register_builtin_comm_hook", _register_builtin_comm_hook)):
            old = DDP.__dict__.get(attr)
            if old is not None:
                setattr(DDP, attr, new)
                self._restore.append((DDP, attr, old, new))
        _sink.session = self._session
        self._connect_native()
        self._session.set_telemetry_status("comm", True, "DDP comm hook")

    def _connect_native(self) -> None:
        """The native hook (gpuprof.ddp_hook), when built, records into this session: the
        models that already have it (an earlier profile) and those that get it here."""
        try:
            from . import ddp_hook
            native = ddp_hook.load()
            if native is not None:
                native.connect(self._session.comm_bucket_sink())
                self._native = native
        except Exception as e:
            self._note("native", "warning",
                       f"the native DDP comm hook could not be loaded ({e!r}); buckets are "
                       "timed by gpuprof's Python hook")

    def _first_forward(self, ddp: Any) -> None:
        """A DDP model's first forward inside the profile: the CUDA timer when its parameters
        are on a GPU (made here, on the training thread: it synchronizes once), and the timed
        default hook when the model has no hook of its own."""
        self._models.add(id(ddp))
        if _sink.cuda is None:
            try:
                if any(p.is_cuda for p in ddp.module.parameters()):
                    from . import _native
                    _sink.cuda = _CudaBucketTimer(self._torch, _native.monotonic_ns)
            except Exception as e:
                self._note("cuda", "warning", f"CUDA bucket timing unavailable: {e!r}")
        if not getattr(ddp, "_gpuprof_hooked", False):
            self._hook_default(ddp)

    def _hook_default(self, ddp: Any) -> None:
        ddp._gpuprof_hooked = True
        try:
            on_host = not any(p.is_cuda for p in ddp.module.parameters())
        except Exception:
            on_host = False
        if on_host and self._native is not None:
            try:
                self._native.register(ddp.reducer, ddp.process_group)
                try:
                    ddp.logger._set_comm_hook_name("gpuprof_native_allreduce_hook")
                except Exception:
                    pass
                self._session.set_telemetry_status("comm", True, "DDP comm hook (native)")
                return
            except Exception as e:
                self._note("native-register", "warning",
                           f"the native DDP comm hook was refused ({e}); buckets are timed by "
                           "gpuprof's Python hook")
        elif on_host:
            self._note("python-hook", "info",
                       "DDP buckets are timed by gpuprof's Python comm hook, which costs a CPU "
                       "(gloo) step a few percent; `python -m gpuprof.ddp_hook build` builds "
                       "the native one (no GIL per bucket) against this torch")
        try:
            ddp.register_comm_hook(ddp.process_group, timed_allreduce_hook())
        except Exception as e:
            self._note("registered", "info",
                       "comm timing unavailable for a DistributedDataParallel model: DDP "
                       f"refused the timing hook ({e}); a comm hook registered before gpuprof "
                       "was imported cannot be wrapped: import gpuprof before registering it")

    def uninstall(self) -> None:
        if not self._models:
            # Nothing was timed: the run says so instead of "available" (a single-process run
            # is the usual case; a distributed one is noted, its collectives went untimed).
            reason = "no DistributedDataParallel model ran inside the profile"
            try:
                dist = self._torch.distributed
                if dist.is_initialized() and dist.get_world_size() > 1:
                    reason += ("; FSDP, DeepSpeed and hand-written collectives are not timed")
                    self._note("unseen", "info",
                               "no DistributedDataParallel model ran inside the profile: "
                               "collective timing (comm_buckets) is unavailable; FSDP, "
                               "DeepSpeed and hand-written collectives are not timed")
                self._session.set_telemetry_status("comm", False, None, reason)
            except Exception:
                pass
        if self._native is not None:
            try:
                self._native.disconnect()  # before the session can go away
            except Exception:
                pass
            self._native = None
        cuda = _sink.cuda
        _sink.session = None
        _sink.cuda = None
        if cuda is not None:
            try:
                cuda.poll(self._session, wait=True)
                if cuda.dropped:
                    self._note("dropped", "warning",
                               f"{cuda.dropped} bucket timings dropped (CUDA events pending)")
            except Exception as e:
                self._note("cuda-finish", "warning", f"resolving bucket events failed: {e!r}")
        for owner, attr, original, new in reversed(self._restore):
            if owner.__dict__.get(attr) is new:
                setattr(owner, attr, original)
        self._restore.clear()
