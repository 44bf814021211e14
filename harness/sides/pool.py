"""Work spread over worker processes (``--jobs N``), its results in a fixed order.

A :class:`WorkerPool` holds ``N`` spawned processes. Each opens its own sides
from a :class:`WorkerSpec`, which is plain data: the oracle (the pinned release
in-process, or ``--oracle``'s own process), the device's recipe and shared
kernels, and every port by its spec string (``per_request``, ``mutant:NAME``,
``cmd:COMMAND``...), loaded the first time a task names it. Nothing live crosses
a process boundary: no port object, no pipe of an external port, no oracle.

Invariants:

* Order. :meth:`WorkerPool.run` takes a list of :class:`Task` and yields every
  task's outputs in list order, and each task's outputs in the order the task
  produced them, however the work was spread; a task never starts before a task
  earlier in the list has been handed out. Whatever a caller derives from the
  outputs (a results file, a JSON report, a table) is therefore the same bytes
  for any ``N``.
* ``--jobs 1`` never builds a pool: the callers run in-process, exactly as
  before the option existed (:func:`resolve_jobs`).
* Start-up. Spawned workers import torch and the pinned vLLM (about ten
  seconds each): they are started as early as a command can (an explicit
  ``--jobs``: before it loads the port and the suite), so their imports overlap
  its own work, and kept for every later :meth:`WorkerPool.run` (a night's
  ports, its kill matrix and its search share one pool). A run whose items all
  go to workers takes its provenance from theirs
  (:meth:`WorkerPool.oracle_provenance`) and opens no oracle of its own unless
  something asks for one (the gate's shrinking). Every worker's provenance
  must equal the first's (the pinned release, its commit, every fingerprint),
  and the caller's own oracle's when it opened one
  (:meth:`WorkerPool.expect_provenance`): a worker whose oracle differs stops
  the run (:class:`PoolStartError`). The spawn context, not fork:
  torch's and OpenMP's threads do not survive a fork.
* Real DCP ranks. A DCP prefill item on real ranks (``--dcp-backend gloo`` or
  ``nccl``) runs in the parent when its turn comes, as in one process: its
  ranks are processes of their own, started by :mod:`harness.sides.dcp_ranks`.
* Threads. Every process that compares runs torch on one thread (the
  commands' ``select_device``, which ``WorkerSpec.open_sides`` calls): the
  shared kernels' float results depend on torch's thread count (a divergent
  item's ULP figures do), so a worker must use the count a ``--jobs 1`` run
  uses, and ``N`` workers of several threads each would oversubscribe the cores.
* Signals. Workers ignore SIGINT: Ctrl-C is the parent's, which stops the run,
  keeps every output already received (:meth:`WorkerPool.unreported`) and ends
  the workers (SIGTERM, then SIGKILL after :data:`TERMINATE_GRACE_S`); a worker
  closes its ports (an external port's process group with them) on the way out.
  A port's own per-call limit (SIGALRM, :func:`harness.sides.time_limits.time_limit`)
  works in a worker as in the parent: tasks run in the worker's main thread.
* A port that raises ``KeyboardInterrupt`` inside a worker stops the run as it
  would in-process: the parent raises ``KeyboardInterrupt``.
* A worker that dies while running a task: a task with a ``recover`` (a chunk
  of items) makes the item it was on a ``not-run`` row naming the exit code
  and goes on with the rest on a fresh worker; any other task ends the run with
  :class:`PoolError`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels
    from harness.protocol.port import Port
    from harness.sides.dcp_ranks import RealRanks
    from harness.sides.items import CaseResult
    from harness.sides.runner import Shard

# The longest a fresh worker may take to import the pinned vLLM and open its sides.
STARTUP_S = 300.0
# How long ended workers get to close their ports before they are killed.
TERMINATE_GRACE_S = 5.0
# Below this much estimated single-process work, the default --jobs runs in-process:
# starting workers (about ten seconds of imports each) would cost more than it saves.
POOL_PAYS_OFF_S = 20.0
# Rough single-process seconds per item on the CPU, for the default --jobs and for
# cutting a run into chunks (ci suite, 2 cores): a chunk is about CHUNK_S of work,
# so a worker asks for work a few times a second and no chunk holds the tail up.
ITEM_COST_S = {"layout": 0.003, "workspace": 0.0001, "merge": 0.07, "prefill": 0.5, "sparse-prefill": 1.3}
CHUNK_S = 0.25
# A worker's resident memory once it has imported the pinned vLLM and opened its
# sides and run the smoke suite (measured: 762 MiB peak, benchmarks/worker_memory.py); --jobs
# never starts more than fit.
WORKER_MEMORY_BYTES = 800 << 20
CHUNK_ITEMS = 256
CHUNKS_PER_WORKER = 8


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS says)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def estimated_seconds(kinds: Iterable[str]) -> float:
    """Single-process seconds for items of these runner kinds (a rough CPU figure)."""
    return sum(ITEM_COST_S.get(kind, ITEM_COST_S["layout"]) for kind in kinds)


def machine_workers() -> int:
    """How many workers this machine holds at once: its cores
    (:func:`available_cores`), and no more than its available memory holds at
    :data:`WORKER_MEMORY_BYTES` each (at least 1). What ``--jobs auto`` asks for."""
    workers = available_cores()
    available = available_memory_bytes()
    if available is not None:
        workers = min(workers, available // WORKER_MEMORY_BYTES)
    return max(1, workers)


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo; None where the OS does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_CUT_REPORTED: set[tuple[int, int]] = set()


def capped_jobs(requested: int) -> int:
    """``requested`` workers, cut to :func:`machine_workers`; a cut is said in
    one line on stderr (once per process): each worker imports vLLM, and more
    of them than the machine holds would stall it, not speed it up."""
    limit = machine_workers()
    if requested <= limit:
        return requested
    if (requested, limit) not in _CUT_REPORTED:
        _CUT_REPORTED.add((requested, limit))
        print(
            f"parity: --jobs {requested} cut to {limit}: this machine has {available_cores()} cores and memory for "
            f"{max(1, (available_memory_bytes() or 0) // WORKER_MEMORY_BYTES)} workers of about "
            f"{WORKER_MEMORY_BYTES >> 20} MiB (--jobs auto uses them all)",
            file=sys.stderr,
        )
    return limit


def resolve_jobs(requested: int | None, estimated_s: float, tasks: int) -> int:
    """The number of worker processes to use; 1 means none (run in-process).

    An explicit ``--jobs N`` (``auto`` is :func:`machine_workers`) is used as
    given, cut to what the machine holds (:func:`capped_jobs`) and never more
    workers than tasks. Without it: the machine's workers when the work is
    estimated at :data:`POOL_PAYS_OFF_S` or more, else 1."""
    if requested is None:
        requested = machine_workers() if estimated_s >= POOL_PAYS_OFF_S else 1
    return max(1, min(capped_jobs(requested), tasks))


def provenance_difference(first: dict[str, Any], other: dict[str, Any], where: str = "provenance") -> str | None:
    """The first key (in ``first``'s order, nested) whose value ``other`` does not
    share, said as ``provenance.KEY: A != B``; None when the two are equal."""
    for key in [*first, *(k for k in other if k not in first)]:
        a, b = first.get(key), other.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = provenance_difference(a, b, f"{where}.{key}")
            if inner is not None:
                return inner
        elif a != b:
            return f"{where}.{key}: {a!r} != {b!r}"
    return None


class SidesRefused(Exception):
    """Opening a worker's oracle met a usage error (a drifted fingerprint, an
    oracle that cannot be served); the message is the one line the command
    prints for it in one process."""


# Opens a worker's oracle and shared kernels from its spec: the oracle, its
# provenance, the kernels. The command layer's (harness/commands/common.py's
# open_worker_sides): the harness does not call up into the commands.
OpenSides = Callable[["WorkerSpec"], "tuple[Port, dict[str, Any], SharedKernels]"]


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker opens its sides from: picklable, no live object.

    ``open_sides`` is a module-level function (a worker gets it by name) that
    selects the device and opens the oracle as the command does in one process.
    ``ports`` are port specs loaded at start-up (so their loading overlaps the
    imports); any other spec a task names is loaded when first asked for.
    ``no_oracle_cache`` is ``--no-oracle-cache``, carried for the oracle cache."""

    open_sides: OpenSides
    oracle: str | None = None
    allow_drift: bool = False
    device: str = "cpu"
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S
    ports: tuple[str, ...] = ()
    no_oracle_cache: bool = False


class WorkerSides:
    """A worker's own oracle, kernels and ports (by spec), kept for its life."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.device = spec.device
        self.timeout_s = spec.timeout_s
        self.oracle, self.provenance, self.kernels = spec.open_sides(spec)
        self._ports: dict[str, Port] = {}
        for port_spec in spec.ports:
            self.port(port_spec)

    def port(self, port_spec: str) -> Port:
        if port_spec not in self._ports:
            from harness.sides.loading import load_port

            self._ports[port_spec] = load_port(port_spec, self.timeout_s)
        return self._ports[port_spec]

    def close(self) -> None:
        """End the ports' and the oracle's processes, if they have any (an
        external port, another release's oracle); what ``close`` raises is
        the worker's last word, never its end."""
        for side in [*self._ports.values(), self.oracle]:
            close = getattr(side, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()
        self._ports.clear()


# A task's work in a worker: its outputs, one by one.
TaskRun = Callable[[WorkerSides, Any], Iterable[Any]]
# What a task whose worker died after ``done`` outputs still yields, and what is
# left of it to run on another worker (None: nothing).
TaskRecover = Callable[[Any, int, "int | None"], tuple[list[Any], Any]]


@dataclass
class Task:
    """One unit of work: ``run(sides, payload)`` in a worker (``run`` a
    module-level function, ``payload`` picklable), or ``inline()`` in the parent
    when its turn comes (work that must not leave the parent)."""

    run: TaskRun | None = None
    payload: Any = None
    recover: TaskRecover | None = None
    inline: Callable[[], Iterable[Any]] | None = None
    what: str = "a task"


class PoolError(RuntimeError):
    """The pool cannot go on (a worker failed to start or died); one line."""


class PoolStartError(PoolError):
    """A worker could not open its sides; the message is its one-line reason.
    ``usage``: the reason is a usage error the CLI words itself (an oracle
    fingerprint that drifted, an oracle that cannot be served), to be shown as is."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


# -- the worker ---------------------------------------------------------------------------


class _Terminate(KeyboardInterrupt):
    """SIGTERM in a worker: a KeyboardInterrupt, the one exception every side's
    error handling lets through, so the worker stops wherever it is."""


def _terminate(signum: int, frame: Any) -> None:
    raise _Terminate()


def _one_line(exc: BaseException) -> str:
    from harness.sides.items import printable

    return printable(f"{type(exc).__name__}: {exc}")[:500]


def _worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """A worker: its sides, then tasks until the parent sends None or goes away.
    Its first message says it is ready, with its oracle's provenance, or why not."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)
    sides: WorkerSides | None = None
    try:
        import warnings

        # The CLI filters the same Triton noise in the parent.
        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        try:
            sides = WorkerSides(spec)
        except SidesRefused as exc:
            conn.send(("ready", {"error": str(exc), "usage": True}))
            return
        conn.send(("ready", {"provenance": sides.provenance}))
        _serve(conn, sides)
    except _Terminate:
        pass
    except BaseException as exc:
        if sides is None:
            with contextlib.suppress(OSError):
                conn.send(("ready", {"error": _one_line(exc), "usage": False}))
        else:
            raise
    finally:
        # Ignore a second SIGTERM while closing; the parent kills a worker that lingers.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if sides is not None:
            sides.close()
    # Its ports are closed and nothing else of it outlives it: tearing down an
    # interpreter that holds torch and vLLM takes seconds the parent would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(conn: Connection, sides: WorkerSides) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        run, payload = message
        try:
            for output in run(sides, payload):
                conn.send(("out", output))
        except _Terminate:
            raise
        except KeyboardInterrupt:
            # A port raised it: the run stops as it would in one process.
            conn.send(("interrupt", None))
            continue
        except (BrokenPipeError, ConnectionResetError):
            return
        except BaseException as exc:
            conn.send(("error", _one_line(exc)))
            continue
        conn.send(("done", None))


# -- the parent ---------------------------------------------------------------------------


@dataclass
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False
    started: float = 0.0  # time.monotonic() at its spawn
    task: int | None = None  # the position of the task it runs
    outputs: int = 0  # outputs of that task it has sent


@dataclass
class _RunState:
    tasks: list[Task]
    payloads: list[Any]
    outputs: list[list[Any]]
    reported: list[int]
    done: list[bool]
    pending: deque[int]
    head: int = 0


@dataclass
class WorkerPool:
    """``jobs`` spawned workers opened from ``spec``; see the module docstring.
    Use as a context manager, or call :meth:`close`."""

    jobs: int
    spec: WorkerSpec
    _workers: list[_Worker] = field(default_factory=list)
    _state: _RunState | None = None
    _provenance: dict[str, Any] | None = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Spawn the workers without waiting for them (their imports overlap the caller's)."""
        while len(self._workers) < self.jobs:
            self._workers.append(self._spawn())

    def _spawn(self) -> _Worker:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        process = context.Process(target=_worker_main, args=(child_end, self.spec), name="parity-worker", daemon=True)
        process.start()
        child_end.close()
        return _Worker(process, parent_end, started=time.monotonic())

    def oracle_provenance(self) -> dict[str, Any]:
        """The provenance of the workers' oracle (as the first worker to be
        ready opened it, with ``WorkerSpec.open_sides``), waiting for that worker: a
        parent that runs no item itself need not import the oracle to say what ran."""
        self.start()
        try:
            while self._provenance is None:
                self._receive(None)
        except BaseException:
            self.terminate()
            raise
        return self._provenance

    def expect_provenance(self, provenance: dict[str, Any]) -> None:
        """The provenance of the caller's own oracle, which its outputs carry:
        every worker's must equal it (a worker already ready is checked now,
        the others as they become ready)."""
        if self._provenance is None:
            self._provenance = provenance
            return
        differs = provenance_difference(provenance, self._provenance)
        if differs is not None:
            self.terminate()
            raise PoolStartError(f"the workers opened another oracle than this process: {differs}", usage=False)

    def run(self, tasks: Sequence[Task]) -> Iterator[Any]:
        """Every task's outputs, in task order (see the module docstring). On
        any exception (Ctrl-C included) the workers are ended; what they had
        computed and the caller had not received is :meth:`unreported`."""
        state = _RunState(
            list(tasks),
            [t.payload for t in tasks],
            [[] for _ in tasks],
            [0] * len(tasks),
            [False] * len(tasks),
            deque(i for i, t in enumerate(tasks) if t.inline is None),
        )
        self._state = state
        if state.pending:
            self.start()
        try:
            while state.head < len(state.tasks):
                self._dispatch(state)
                yield from self._report(state)
                if state.head < len(state.tasks):
                    self._receive(state)
        except BaseException:
            self._drain(state)
            self.terminate()
            raise

    def _report(self, state: _RunState) -> Iterator[Any]:
        """The head task's outputs not yet yielded; an inline head runs here.
        What is yielded is no longer held (a night yields tens of thousands of
        results: the caller keeps what it needs); its place stays, as None."""
        while state.head < len(state.tasks):
            head = state.head
            task, outputs = state.tasks[head], state.outputs[head]
            if task.inline is not None and not state.done[head]:
                for output in task.inline():
                    outputs.append(None)
                    state.reported[head] += 1
                    yield output
                state.done[head] = True
            while state.reported[head] < len(outputs):
                index = state.reported[head]
                state.reported[head] += 1
                output, outputs[index] = outputs[index], None
                yield output
            if not state.done[head]:
                return
            state.outputs[head] = []
            state.head += 1
            # Keep workers busy while the caller digests what was yielded.
            self._dispatch(state)

    def _dispatch(self, state: _RunState) -> None:
        for worker in self._workers:
            if not state.pending:
                return
            if worker.ready and worker.task is None:
                position = state.pending.popleft()
                task = state.tasks[position]
                worker.task, worker.outputs = position, 0
                worker.conn.send((task.run, state.payloads[position]))

    def _receive(self, state: _RunState | None) -> None:
        """Wait for any worker's message (or death) and act on it."""
        waiting = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
        starting = [w.started for w in self._workers if not w.ready]
        timeout = max(0.0, min(starting) + STARTUP_S - time.monotonic()) if starting else None
        ready = wait(waiting, timeout=timeout)
        if not ready and starting:
            raise PoolError(f"a worker process did not start within {STARTUP_S:g} s")
        for worker in list(self._workers):
            if worker.conn in ready:
                self._read(worker, state)
        for worker in list(self._workers):
            if worker.process.sentinel in ready and worker in self._workers:
                self._read(worker, state)
                self._died(worker, state)

    def _read(self, worker: _Worker, state: _RunState | None) -> None:
        while True:
            try:
                if not worker.conn.poll():
                    return
                kind, value = worker.conn.recv()
            except (EOFError, OSError):
                return
            self._handle(worker, kind, value, state)

    def _handle(self, worker: _Worker, kind: str, value: Any, state: _RunState | None) -> None:
        if kind == "ready":
            if "error" in value:
                raise PoolStartError(value["error"], usage=value["usage"])
            if self._provenance is None:
                self._provenance = value["provenance"]
            else:
                # Rows from two oracles must never share one report.
                differs = provenance_difference(self._provenance, value["provenance"])
                if differs is not None:
                    raise PoolStartError(f"a worker opened another oracle than the run's: {differs}", usage=False)
            worker.ready = True
            return
        position = worker.task
        if position is None or state is None:
            raise PoolError(f"a worker sent {kind!r} with no task")
        if kind == "out":
            state.outputs[position].append(value)
            worker.outputs += 1
            return
        worker.task = None
        if kind == "done":
            state.done[position] = True
        elif kind == "interrupt":
            raise KeyboardInterrupt
        else:
            raise PoolError(f"{state.tasks[position].what} failed in a worker process: {value}")

    def _died(self, worker: _Worker, state: _RunState | None) -> None:
        """A worker's process ended: recover its task or stop the run."""
        self._workers.remove(worker)
        with contextlib.suppress(OSError):
            worker.conn.close()
        worker.process.join(timeout=1)
        code = worker.process.exitcode
        if not worker.ready:
            raise PoolStartError(f"a worker process exited during its start-up (exit code {code})")
        position = worker.task
        if position is None or state is None:
            raise PoolError(f"a worker process exited (exit code {code})")
        task = state.tasks[position]
        if task.recover is None:
            raise PoolError(f"a worker process died (exit code {code}) during {task.what}")
        extra, rest = task.recover(state.payloads[position], worker.outputs, code)
        state.outputs[position] += extra
        if rest is None:
            state.done[position] = True
        else:
            state.payloads[position] = rest
            state.pending.appendleft(position)
        if state.pending:
            self._workers.append(self._spawn())

    def _drain(self, state: _RunState) -> None:
        """Take in what the workers already sent (without waiting), for :meth:`unreported`."""
        for worker in self._workers:
            with contextlib.suppress(BaseException):
                while worker.conn.poll():
                    kind, value = worker.conn.recv()
                    if kind == "out" and worker.task is not None:
                        state.outputs[worker.task].append(value)

    def unreported(self) -> list[Any]:
        """After :meth:`run` stopped early: the outputs the workers had computed
        that it had not yielded, in task order."""
        state = self._state
        if state is None:
            return []
        self._drain(state)
        out: list[Any] = []
        for position in range(state.head, len(state.tasks)):
            out += state.outputs[position][state.reported[position] :]
            state.reported[position] = len(state.outputs[position])
        return out

    def terminate(self) -> None:
        """End every worker now: SIGTERM (each closes its ports), then SIGKILL."""
        workers, self._workers = self._workers, []
        for worker in workers:
            if worker.process.is_alive():
                with contextlib.suppress(OSError):
                    worker.process.terminate()
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for worker in workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for worker in workers:
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=TERMINATE_GRACE_S)
            with contextlib.suppress(OSError):
                worker.conn.close()

    def close(self) -> None:
        """Let idle workers finish (they close their ports), end any other."""
        for worker in self._workers:
            if worker.ready and worker.task is None:
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for worker in self._workers:
            if worker.ready and worker.task is None:
                worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        self.terminate()


# -- a run's items ------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutFigures:
    """What a results row needs of a layout that matched the oracle's: its
    chunk count, rows used and digest. A pooled run that writes no layouts (no
    ``--json``) sends these instead of the chunks, whose row indices are most
    of a suite's bytes (hundreds of MB for ci); :meth:`to_json` is refused."""

    num_chunks: int
    rows: int
    layout_digest: str = ""

    def rows_used(self) -> int:
        return self.rows

    def digest(self) -> str:
        return self.layout_digest

    def to_json(self) -> dict[str, Any]:
        raise RuntimeError("this layout's chunks stayed in its worker process (the run keeps no layouts)")


@dataclass(frozen=True)
class ItemChunk:
    """Consecutive items of one run: ``(suite index, kind, item)`` each, compared
    against ``port_spec``; ``keep_layouts`` False sends figures for matching layouts."""

    port_spec: str
    items: tuple[tuple[int, str, Any], ...]
    keep_layouts: bool = True


def run_chunk(sides: WorkerSides, chunk: ItemChunk) -> Iterator[CaseResult]:
    """In a worker: each item of ``chunk`` through :func:`harness.sides.runner.run_item`."""
    from harness.sides.runner import run_item

    port = sides.port(chunk.port_spec)
    for index, kind, item in chunk.items:
        result = run_item(sides.oracle, port, kind, item, sides.kernels, sides.device, sides.timeout_s)
        result.index = index
        yield result if chunk.keep_layouts else _without_chunks(result)


def _without_chunks(result: CaseResult) -> CaseResult:
    from typing import cast

    from harness.model import Layout
    from harness.sides.items import PARITY

    if result.kind != "layout" or result.status != PARITY:
        return result
    for name in ("oracle_layout", "port_layout"):
        layout: Layout | None = getattr(result, name)
        if layout is not None:
            # Stands in for the Layout wherever a row reads it (num_chunks, rows_used).
            figures = LayoutFigures(layout.num_chunks, layout.rows_used(), layout.digest())
            setattr(result, name, cast(Layout, figures))
    return result


def recover_chunk(chunk: ItemChunk, finished: int, exitcode: int | None) -> tuple[list[CaseResult], ItemChunk | None]:
    """The item a dead worker was on is ``not-run`` (its process crashed, the
    port's doing or the oracle's: nothing was compared, so no baseline entry
    can expect it and the run cannot pass); the items after it run again elsewhere."""
    from harness.sides.items import NOT_RUN, CaseResult

    if finished >= len(chunk.items):
        # It died after its chunk's last result and before saying it was done:
        # every item has its row, nothing is left to run.
        return [], None
    index, kind, item = chunk.items[finished]
    row = CaseResult(
        item.name,
        getattr(item, "family", "workspace-size"),
        kind,
        NOT_RUN,
        row_budget=getattr(item, "row_budget", 0) if kind == "layout" else 0,
        error=f"not compared: the worker process comparing this item died (exit code {exitcode}): "
        "the port or the oracle crashed it",
    )
    row.index = index
    rest = chunk.items[finished + 1 :]
    return [row], (ItemChunk(chunk.port_spec, rest, chunk.keep_layouts) if rest else None)


def cost_chunks(
    planned: Sequence[tuple[int, str, Any]],
    jobs: int,
    alone: Callable[[int, str, Any], bool] = lambda index, kind, item: False,
) -> list[list[tuple[int, str, Any]]]:
    """``planned`` items cut, in order, into chunks of about :data:`CHUNK_S` of
    work each (by :data:`ITEM_COST_S`) and at least :data:`CHUNKS_PER_WORKER`
    per worker of ``jobs`` (a slow port's items cost more than the estimate: a
    short run still spreads); an item ``alone`` says is a chunk of its own."""
    chunks: list[list[tuple[int, str, Any]]] = []
    chunk: list[tuple[int, str, Any]] = []
    cost = 0.0
    most = max(1, min(CHUNK_ITEMS, -(-len(planned) // (jobs * CHUNKS_PER_WORKER))))

    def flush() -> None:
        nonlocal chunk, cost
        if chunk:
            chunks.append(chunk)
        chunk, cost = [], 0.0

    for index, kind, item in planned:
        if alone(index, kind, item):
            flush()
            chunks.append([(index, kind, item)])
            continue
        chunk.append((index, kind, item))
        cost += ITEM_COST_S.get(kind, ITEM_COST_S["layout"])
        if cost >= CHUNK_S or len(chunk) >= most:
            flush()
    flush()
    return chunks


def item_tasks(
    port_spec: str,
    planned: Sequence[tuple[int, str, Any]],
    keep_layouts: bool,
    jobs: int,
    inline: Callable[[int, str, Any], bool] = lambda index, kind, item: False,
    run_inline: Callable[[int, str, Any], CaseResult] | None = None,
) -> list[Task]:
    """``planned`` items as :func:`cost_chunks` cuts them, a task each; an item
    ``inline`` says must stay in the parent is a task of its own that
    ``run_inline`` runs there."""
    tasks: list[Task] = []
    stays = inline if run_inline is not None else (lambda index, kind, item: False)
    for chunk in cost_chunks(planned, jobs, stays):
        index, kind, item = chunk[0]
        if run_inline is not None and len(chunk) == 1 and inline(index, kind, item):
            tasks.append(
                Task(inline=functools.partial(_one_inline, run_inline, index, kind, item), what=f"item {index}")
            )
            continue
        payload = ItemChunk(port_spec, tuple(chunk), keep_layouts)
        tasks.append(Task(run=run_chunk, payload=payload, recover=recover_chunk, what=f"items {index}..{chunk[-1][0]}"))
    return tasks


def _one_inline(run_inline: Callable[[int, str, Any], CaseResult], index: int, kind: str, item: Any) -> list[Any]:
    return [run_inline(index, kind, item)]


def planned_items(
    suite: Suite, levels: tuple[str, ...], shard: Shard | None = None, skip: frozenset[str] = frozenset()
) -> list[tuple[int, str, Any]]:
    """The items a run compares, as :func:`harness.sides.runner.run_items` walks them."""
    from harness.sides.items import item_id
    from harness.sides.runner import plan_items

    return [
        (index, kind, item)
        for index, (kind, item) in enumerate(plan_items(suite, levels))
        if (shard is None or shard.owns(index)) and item_id(kind, item.name) not in skip
    ]


class ItemStream:
    """A run's results in suite order: in-process (:func:`harness.sides.runner.run_items`)
    or from a pool. After an interruption, :meth:`unreported` holds the results
    the workers had finished beyond what was yielded; :meth:`close` ends the
    iteration (and, on an interruption, the workers)."""

    def __init__(self, results: Iterator[CaseResult], pool: WorkerPool | None) -> None:
        self._results, self._pool = results, pool

    def __iter__(self) -> Iterator[CaseResult]:
        return self._results

    def unreported(self) -> list[CaseResult]:
        return self._pool.unreported() if self._pool is not None else []

    def close(self) -> None:
        close = getattr(self._results, "close", None)
        if callable(close):
            close()


def stream_items(
    oracle: Port | None,
    port: Port,
    port_spec: str,
    suite: Suite,
    levels: tuple[str, ...],
    shard: Shard | None = None,
    kernels: SharedKernels | None = None,
    skip: frozenset[str] = frozenset(),
    device: str = "cpu",
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
    real_ranks: RealRanks | None = None,
    pool: WorkerPool | None = None,
    keep_layouts: bool = True,
) -> ItemStream:
    """The results of :func:`harness.sides.runner.run_items` with these arguments,
    in the same order with the same values, from ``pool``'s workers when given
    (loading the port from ``port_spec``). A DCP prefill item on real ranks
    stays in this process (the ranks are processes of their own); the rest go
    to the workers. ``keep_layouts`` False: matching layouts come back as
    :class:`LayoutFigures` (enough for results rows, not for a JSON report).
    ``oracle`` is this process's; it may be None when every item runs in a
    worker (a pool, and no real ranks)."""
    from harness.sides.runner import run_item, run_items

    if pool is None:
        assert oracle is not None, "a run in this process needs its oracle"
        return ItemStream(
            run_items(oracle, port, suite, levels, shard, kernels, skip, device, timeout_s, real_ranks), None
        )
    if kernels is None:
        from harness.kernels import kernels_for

        kernels = kernels_for(device)
    parent_kernels = kernels

    def on_real_ranks(index: int, kind: str, item: Any) -> bool:
        return real_ranks is not None and kind == "prefill" and item.dcp_world_size > 1

    def run_here(index: int, kind: str, item: Any) -> CaseResult:
        assert oracle is not None, "an item on real ranks runs in this process, with its oracle"
        result = run_item(oracle, port, kind, item, parent_kernels, device, timeout_s, real_ranks)
        result.index = index
        return result

    planned = planned_items(suite, levels, shard, skip)
    tasks = item_tasks(port_spec, planned, keep_layouts, pool.jobs, on_real_ranks, run_here)
    return ItemStream(pool.run(tasks), pool)
