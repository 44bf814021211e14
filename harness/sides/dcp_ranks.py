"""L3 of a DCP case on real ranks: ``D`` processes over ``torch.distributed``,
one rank each (``--dcp-backend gloo``, or ``nccl`` on GPUs).

Each rank builds only its own cache (:class:`harness.model.dcp.TorchDistributedRanks`),
runs the oracle's prefill and then the port's prefill as that rank, and writes
both sides' tensors to a folder the parent reads back. The all-gather is the
real collective: the port's through :meth:`TorchDistributedRanks.all_gather`,
the oracle's through upstream's own ``MLADCPManager.kv_gather`` (set up by its
``init_kv_gather`` over the group, so upstream picks the collective itself).

The parent then requires every rank of a side to have returned the same bits
(:func:`oracle.numeric.check_ranks_agree`; a disagreement is that side's error
and names the rank) and compares rank 0's oracle and port tensors with the
runner's one verdict (:func:`harness.sides.runner.compare_prefill`).

Worker processes are spawned once (importing the pinned vLLM takes seconds)
and kept for later items of any world size: an item takes the first ``D`` of
them, each joins a fresh process group on a fresh file store, and leaves it
when the item is done. A worker that dies, hangs or is left inside a
collective by another rank's error ends the whole pool, which the next item
starts again; the item gets a one-line error, the run goes on.

Invariants: only the pinned oracle runs here (the CLI refuses another
``--oracle`` with real ranks); each rank loads the port from the spec the CLI
got; the shared kernels are :func:`harness.kernels.kernels_for` the device,
under the case's keyless-row behaviour, as the CLI's are.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from harness.model import Case

REAL_RANK_BACKENDS = ("gloo", "nccl")
# ``--dcp-backend``'s values (:data:`harness.model.dcp.DCP_BACKENDS`, named here so the
# CLI's parser does not import torch).
DCP_BACKEND_CHOICES = ("one-process", *REAL_RANK_BACKENDS)
# The longest a fresh worker may take to import the pinned vLLM and say so.
STARTUP_S = 300.0
# What the oracle's all-gather is under real ranks, for the run's settings.
ORACLE_KV_GATHER = "upstream MLADCPManager.kv_gather (init_kv_gather over the process group)"

ORACLE, PORT = "oracle", "port"
# How a rank's error starts when the harness's own work failed (building a side's
# inputs, writing a side's tensors), not a side's: the item is then not run.
HARNESS_FAULT = "the harness could not build the inputs: "


@dataclass(frozen=True)
class RealRanks:
    """How DCP items run on real ranks: the collective's ``backend`` (gloo or
    nccl) and the port's spec, which every rank loads the port from."""

    backend: str
    port_spec: str

    def __post_init__(self) -> None:
        if self.backend not in REAL_RANK_BACKENDS:
            raise ValueError(f"real DCP ranks run over {' or '.join(REAL_RANK_BACKENDS)}, not {self.backend!r}")


@dataclass
class RankOutcome:
    """Rank 0's tensors of each side, or that side's one-line error (the oracle's
    error wins: the port is not judged against an oracle that failed)."""

    oracle: dict[str, torch.Tensor] | None = None
    port: dict[str, torch.Tensor] | None = None
    oracle_error: str | None = None
    port_error: str | None = None


# -- the parent --------------------------------------------------------------------------


@dataclass
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False


@dataclass
class _RankState:
    """What the parent heard from one rank during one item."""

    reported: dict[str, str | None] = field(default_factory=dict)  # side -> None (ok) or its error
    done: bool = False
    # Its process ended: the cause of any error the other ranks then report.
    died: bool = False

    def mark_death(self, rank: int, exitcode: int | None) -> None:
        phase = PORT if ORACLE in self.reported else ORACLE
        self.reported[phase] = f"DCP rank {rank}'s process ended (exit code {exitcode}) during the {phase}'s prefill"
        self.done = self.died = True


class RankPool:
    """Spawned workers for one (backend, device), reused across items."""

    def __init__(self, backend: str, device: str) -> None:
        self.backend, self.device = backend, device
        self._workers: list[_Worker] = []

    def start(self, count: int) -> None:
        """Spawn workers until there are ``count``, without waiting for them:
        their imports overlap whatever the caller does next."""
        context = multiprocessing.get_context("spawn")
        while len(self._workers) < count:
            parent_end, child_end = context.Pipe()
            rank = len(self._workers)
            process = context.Process(
                target=_worker_main,
                args=(child_end, self.device, self.backend, rank),
                name=f"parity-dcp-rank{rank}",
                daemon=True,
            )
            process.start()
            child_end.close()
            self._workers.append(_Worker(process, parent_end))

    def take(self, count: int, startup_s: float) -> list[_Worker]:
        """The first ``count`` workers, started now if there are fewer, once each
        said it is ready; raises :class:`RuntimeError` (one line) if one cannot start."""
        self.start(count)
        deadline = time.monotonic() + startup_s
        for rank, worker in enumerate(self._workers[:count]):
            if worker.ready:
                continue
            message = _receive(worker, deadline)
            if message is None:
                self.close()
                raise RuntimeError(f"DCP rank {rank}'s process did not start within {startup_s:g} s")
            if message[0] != "ready" or message[1] is not None:
                self.close()
                reason = message[1] if message[0] == "ready" else f"unexpected message {message[0]!r}"
                raise RuntimeError(f"DCP rank {rank}'s process could not start: {reason}")
            worker.ready = True
        return self._workers[:count]

    def close(self) -> None:
        """End every worker (they may sit inside a collective that never returns)."""
        for worker in self._workers:
            with contextlib.suppress(Exception):
                worker.conn.close()
            if worker.process.is_alive():
                worker.process.kill()
        for worker in self._workers:
            worker.process.join(timeout=10)
        self._workers = []


_pools: dict[tuple[str, str], RankPool] = {}


def close_pools() -> None:
    """End every worker this process started (also at exit)."""
    for pool in _pools.values():
        pool.close()
    _pools.clear()


atexit.register(close_pools)


def prestart(ranks: RealRanks, device: str, count: int) -> None:
    """Begin spawning the ``count`` workers a run will need (the largest DCP
    world among its prefill items), so their start overlaps the run's own."""
    _pool(ranks.backend, device).start(count)


def _pool(backend: str, device: str) -> RankPool:
    key = (backend, device)
    if key not in _pools:
        _pools[key] = RankPool(backend, device)
    return _pools[key]


def _receive(worker: _Worker, deadline: float) -> tuple[Any, ...] | None:
    """The worker's next message, or None if it died or the deadline passed."""
    remaining = deadline - time.monotonic()
    if remaining > 0 and wait([worker.conn, worker.process.sentinel], timeout=remaining):
        with contextlib.suppress(EOFError, OSError):
            if worker.conn.poll():
                message: tuple[Any, ...] = worker.conn.recv()
                return message
    return None


def prefill_on_ranks(case: Case, ranks: RealRanks, device: str, timeout_s: float) -> RankOutcome:
    """Run ``case``'s L3 on ``case.dcp_world_size`` real ranks and return rank 0's
    tensors of each side, or each side's error.

    The oracle's part of a rank (joining the group included) may take
    ``timeout_s``; the port's part another ``timeout_s`` from when every rank
    finished the oracle's. A rank that dies or overruns is its side's error.
    """
    world = case.dcp_world_size
    pool = _pool(ranks.backend, device)
    outcome = RankOutcome()
    try:
        workers = pool.take(world, max(timeout_s, STARTUP_S))
    except RuntimeError as exc:
        outcome.oracle_error = str(exc)
        return outcome
    except Exception as exc:  # spawning itself failed (no processes, no pipes)
        pool.close()
        outcome.oracle_error = f"cannot start the DCP rank processes: {_one_line(exc)}"
        return outcome
    folder = tempfile.mkdtemp(prefix="parity-dcp-")
    try:
        states = _run_item(workers, case, ranks, timeout_s, folder)
        if not all(state.done for state in states):
            # Some rank may be stuck in a collective: only a fresh pool is safe.
            pool.close()
        _judge(outcome, states, world, ranks.backend, timeout_s, folder, device)
    except BaseException:
        pool.close()
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return outcome


def _run_item(workers: list[_Worker], case: Case, ranks: RealRanks, timeout_s: float, folder: str) -> list[_RankState]:
    """Hand the item to every rank and collect what they report until each is
    done, some rank's side failed, or a deadline passed."""
    world = len(workers)
    store = os.path.join(folder, "store")
    for rank, worker in enumerate(workers):
        job = {
            "case": case,
            "rank": rank,
            "world_size": world,
            "store": store,
            "folder": folder,
            "port_spec": ranks.port_spec,
            "timeout_s": timeout_s,
        }
        try:
            worker.conn.send(job)
        except (OSError, ValueError):
            pass  # a dead worker: its sentinel says so below
    states = [_RankState() for _ in workers]
    deadline = time.monotonic() + timeout_s
    port_deadline_set = False
    while not all(state.done for state in states):
        if _settled(states):
            break
        if not port_deadline_set and all(ORACLE in state.reported for state in states):
            deadline, port_deadline_set = time.monotonic() + timeout_s, True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        waiting: dict[Any, int] = {}
        for rank, worker in enumerate(workers):
            if not states[rank].done:
                waiting[worker.conn] = rank
                waiting[worker.process.sentinel] = rank
        for ready in wait(list(waiting), timeout=remaining):
            rank = waiting[ready]
            worker, state = workers[rank], states[rank]
            if state.done:
                continue
            message = None
            with contextlib.suppress(EOFError, OSError):
                if worker.conn.poll():
                    message = worker.conn.recv()
            if message is None:
                # Its sentinel or a closed pipe: the process is ending (reaping
                # it can lag its closed sockets by a moment).
                worker.process.join(timeout=1.0)
                if not worker.process.is_alive():
                    state.mark_death(rank, worker.process.exitcode)
                continue
            what = message[0]
            if what == "done":
                state.done = True
            elif what in (ORACLE, PORT):
                state.reported[what] = message[1]
    # A rank's death shows first as another's broken collective: look for it
    # among the ranks still out, briefly, so the error names the cause.
    out = [(rank, worker) for rank, worker in enumerate(workers) if not states[rank].done]
    if out:
        ended = wait([worker.process.sentinel for _, worker in out], timeout=1.0)
        for rank, worker in out:
            if worker.process.sentinel in ended:
                worker.process.join(timeout=1.0)
                states[rank].mark_death(rank, worker.process.exitcode)
    return states


def _settled(states: list[_RankState]) -> bool:
    """Whether the item's outcome is known although some rank is not done: an
    oracle error anywhere, or a port error once every rank's oracle reported."""
    reported = [state.reported for state in states]
    if any(r.get(ORACLE) is not None for r in reported):
        return True
    oracle_done = all(ORACLE in r for r in reported)
    return oracle_done and any(r.get(PORT) is not None for r in reported)


def _judge(
    outcome: RankOutcome,
    states: list[_RankState],
    world: int,
    backend: str,
    timeout_s: float,
    folder: str,
    device: str,
) -> None:
    """Fill ``outcome`` from what the ranks reported and wrote."""
    from oracle.numeric import check_ranks_agree

    for side in (ORACLE, PORT):
        # A rank that died first: its death is the cause of the others' errors.
        ordered = sorted(enumerate(states), key=lambda pair: not pair[1].died)
        errors = [(rank, s.reported[side]) for rank, s in ordered if s.reported.get(side) is not None]
        missing = [rank for rank, s in enumerate(states) if side not in s.reported]
        error = None
        if errors:
            rank, text = errors[0]
            error = text if text and text.startswith("DCP rank") else f"{text} (DCP rank {rank} of {world})"
        elif missing:
            ranks = f"DCP rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {world}"
            if side == PORT:
                error = f"PortTimeout: port call exceeded the {timeout_s:g} s time limit ({ranks} did not finish)"
            else:
                error = f"the oracle's prefill did not finish within {timeout_s:g} s on {ranks}"
        else:
            try:
                results = [_load(folder, side, rank, device) for rank in range(world)]
                for rank in range(1, world):
                    check_ranks_agree(results[0], results[rank], 0, rank)
            except BaseException as exc:
                _reraise_interrupt(exc)
                error = f"{type(exc).__name__}: {' '.join(str(exc).split())} (over {backend})"
            else:
                setattr(outcome, side, results[0])
        if error is not None:
            setattr(outcome, f"{side}_error", error)
            return  # the oracle's error stands alone; the port's is the last


def _path(folder: str, side: str, rank: int) -> str:
    return os.path.join(folder, f"{side}-rank{rank}.safetensors")


def _load(folder: str, side: str, rank: int, device: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = _path(folder, side, rank)
    with safe_open(path, framework="pt") as handle:
        order = json.loads((handle.metadata() or {}).get("order", "[]"))
    tensors = load_file(path, device=device)
    return {name: tensors[name] for name in order}


def _reraise_interrupt(exc: BaseException) -> None:
    from harness.sides.items import reraise_interrupt

    reraise_interrupt(exc)


# -- a worker ----------------------------------------------------------------------------


def _worker_main(conn: Connection, device: str, backend: str, rank: int) -> None:
    """One rank's process: the oracle's environment first (as the parent's), then
    items until the parent closes the pipe. Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from oracle.environment import use_device

        use_device(device)
        _quiet_warnings()
        from oracle.side import OracleSide

        oracle = OracleSide()
        if backend == "nccl":
            import torch

            torch.cuda.set_device(rank)
    except BaseException as exc:
        conn.send(("ready", _one_line(exc)))
        return
    conn.send(("ready", None))
    ports: dict[str, Any] = {}
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        try:
            _run_job(job, oracle, ports, device, backend, conn)
        finally:
            conn.send(("done",))


def _quiet_warnings() -> None:
    # The parent's CLI filters the same Triton noise; upstream's (and the port's)
    # all_gather_into_tensor is deprecated in favour of a newer name on recent torch.
    warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
    warnings.filterwarnings("ignore", ".*all_gather_into_tensor.*deprecated", FutureWarning)


def _one_line(exc: BaseException) -> str:
    from harness.sides.items import printable

    try:
        text = printable(str(exc))
    except Exception:
        text = "(its message cannot be printed)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _run_job(
    job: dict[str, Any], oracle: Any, ports: dict[str, Any], device: str, backend: str, conn: Connection
) -> None:
    """One item as one rank: join the group, the oracle's prefill, the port's."""
    import torch.distributed as dist

    from harness.kernels import kernels_for, kernels_for_case
    from harness.kernels.numeric import case_prefill_inputs
    from harness.model.dcp import TorchDistributedRanks
    from oracle.numeric import UpstreamKvGather

    case, rank, world, folder = job["case"], job["rank"], job["world_size"], job["folder"]
    timeout = timedelta(seconds=job["timeout_s"])
    try:
        store = dist.FileStore(job["store"], world)  # type: ignore[attr-defined]
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    except BaseException as exc:
        conn.send((ORACLE, f"cannot join the {backend} group as DCP rank {rank}: {_one_line(exc)}"))
        return
    try:
        try:
            # The harness's own work, outside either side's handler: a fault here is the harness's.
            kernels = kernels_for_case(kernels_for(device), case)
            collective = TorchDistributedRanks(world, rank, backend)
            oracle_inputs = case_prefill_inputs(case, device, collective)
            port_inputs = case_prefill_inputs(case, device, collective)
        except BaseException as exc:
            conn.send((ORACLE, f"{HARNESS_FAULT}{_one_line(exc)}"))
            return
        try:
            gathers_before = UpstreamKvGather.calls
            oracle_out = oracle.prefill(case, oracle_inputs, kernels)
            if any(case.context_lens) and UpstreamKvGather.calls == gathers_before:
                raise AssertionError("the oracle's DCP loop never called upstream's MLADCPManager.kv_gather")
            _save(oracle_out, folder, ORACLE, rank)
        except BaseException as exc:
            conn.send((ORACLE, _one_line(exc)))
            return
        conn.send((ORACLE, None))
        try:
            port: Any = ports.get(job["port_spec"])
            if port is None:
                from harness.sides.loading import load_port

                port = ports[job["port_spec"]] = load_port(job["port_spec"], job["timeout_s"])
            checked = _checked_port_out(port.prefill(case, port_inputs, kernels), oracle_out)
        except BaseException as exc:
            conn.send((PORT, _one_line(exc)))
            return
        try:
            _save(checked, folder, PORT, rank)
        except BaseException as exc:
            conn.send((PORT, f"{HARNESS_FAULT}(writing the port's tensors) {_one_line(exc)}"))
            return
        conn.send((PORT, None))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _checked_port_out(port_out: Any, oracle_out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The port's tensors under the oracle's names, each a plain tensor on the
    run's device (as the runner requires; a file keeps neither check): what the
    parent's verdict then compares. A name the port lacks stays missing."""
    from harness.protocol.port import check_tensor

    if not isinstance(port_out, dict):
        raise TypeError(f"prefill returned {type(port_out).__name__}, not a dict of tensors")
    return {
        name: check_tensor(port_out[name], f"port's {name!r}", oracle_out[name].device)
        for name in oracle_out
        if name in port_out
    }


def _save(tensors: dict[str, torch.Tensor], folder: str, side: str, rank: int) -> None:
    from safetensors.torch import save_file

    # Fresh contiguous host copies: a file holds neither views nor shared storage;
    # the bits are unchanged.
    host = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in tensors.items()}
    save_file(host, _path(folder, side, rank), metadata={"order": json.dumps(list(tensors))})
