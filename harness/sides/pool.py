"""Work spread over worker processes (``--jobs N``), its results in a fixed order.

A :class:`WorkerPool` holds ``N`` spawned processes, each a
:mod:`harness.sides.pool_worker` opened from one
:class:`~harness.sides.pool_worker.WorkerSpec`. How many workers a run gets is
:mod:`harness.sides.job_sizing`'s; a run's items as tasks of this pool are
:mod:`harness.sides.item_stream`'s.

Invariants:

* Order. :meth:`WorkerPool.run` takes a list of :class:`Task` and yields every
  task's outputs in list order, and each task's outputs in the order the task
  produced them, however the work was spread. Tasks are handed out in list
  order, but the heavy ones first (:func:`dispatch_order`). Whatever a caller derives from the
  outputs (a results file, a JSON report, a table) is therefore the same bytes
  for any ``N``.
* ``--jobs 1`` never builds a pool: the callers run in-process, exactly as
  before the option existed (:func:`harness.sides.job_sizing.resolve_jobs`).
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
* Signals. Ctrl-C is the parent's (workers ignore SIGINT): it stops the run,
  keeps every output already received (:meth:`WorkerPool.unreported`) and ends
  the workers (SIGTERM, then SIGKILL after :data:`TERMINATE_GRACE_S`).
* A port that raises ``KeyboardInterrupt`` inside a worker stops the run as it
  would in-process: the parent raises ``KeyboardInterrupt``.
* A worker that dies while running a task: a task with a ``recover`` (a chunk
  of items) makes the item it was on a ``not-run`` row naming the exit code
  and goes on with the rest on a fresh worker; any other task ends the run with
  :class:`PoolError`.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol, Self

from harness.sides.pool_timeline import PoolTimeline
from harness.sides.pool_worker import WorkerSides, WorkerSpec, worker_main

# The longest a fresh worker may take to import the pinned vLLM and open its sides.
STARTUP_S = 300.0
# How long ended workers get to close their ports before they are killed.
TERMINATE_GRACE_S = 5.0


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


# A task's work in a worker: its outputs, one by one.
TaskRun = Callable[[WorkerSides, Any], Iterable[Any]]
# What a task whose worker died after ``done`` outputs still yields, and what is
# left of it to run on another worker (None: nothing).
TaskRecover = Callable[[Any, int, "int | None"], tuple[list[Any], Any]]
# What is left of a task whose worker died after ``done`` outputs, the output it
# was on included, to run again elsewhere (None: nothing): an executor that
# retries (harness.sides.ray_pool) uses it; this pool recovers instead.
TaskRetry = Callable[[Any, int], Any]


class Executor(Protocol):
    """What a run spreads its tasks over: this module's :class:`WorkerPool`
    (``--jobs``), or :class:`harness.sides.ray_pool.RayPool` (``--executor ray``).
    Both keep the invariants of this module's docstring."""

    jobs: int

    def __enter__(self) -> Executor: ...
    def __exit__(self, *exc: object) -> None: ...
    def start(self) -> None: ...
    def oracle_provenance(self) -> dict[str, Any]: ...
    def expect_provenance(self, provenance: dict[str, Any]) -> None: ...
    def run(self, tasks: Sequence[Task]) -> Iterator[Any]: ...
    def unreported(self) -> list[Any]: ...
    def terminate(self) -> None: ...
    def close(self) -> None: ...


@dataclass
class Task:
    """One unit of work: ``run(sides, payload)`` in a worker (``run`` a
    module-level function, ``payload`` picklable), or ``inline()`` in the parent
    when its turn comes (work that must not leave the parent)."""

    run: TaskRun | None = None
    payload: Any = None
    recover: TaskRecover | None = None
    retry: TaskRetry | None = None
    # Estimated seconds of work (harness.sides.job_sizing): a task of HEAVY_TASK_S or
    # more is handed out before the others, so no heavy task is left for the end.
    cost_s: float = 0.0
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


@dataclass
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False
    started: float = 0.0  # time.monotonic() at its spawn
    task: int | None = None  # the position of the task it runs
    outputs: int = 0  # outputs of that task it has sent
    dispatched: float = 0.0  # when that task was handed to it (the timeline's clock)


def ready_provenance(known: dict[str, Any] | None, hello: dict[str, Any], who: str) -> dict[str, Any]:
    """The run's provenance once a worker said it is ready (``hello``): its own
    when it is the first; refused (:class:`PoolStartError`) when it could not
    open its sides or opened another oracle than the first (rows from two
    oracles must never share one report)."""
    if "error" in hello:
        raise PoolStartError(hello["error"], usage=hello["usage"])
    if known is None:
        return dict(hello["provenance"])
    differs = provenance_difference(known, hello["provenance"])
    if differs is not None:
        raise PoolStartError(f"{who} opened another oracle than the run's: {differs}", usage=False)
    return known


# A task estimated at this many seconds or more goes to a worker before the lighter ones.
HEAVY_TASK_S = 1.0


def dispatch_order(tasks: Sequence[Task]) -> list[int]:
    """The order workers are handed ``tasks`` (those not run inline): the first
    one, then the heavy ones (:data:`HEAVY_TASK_S`), heaviest first, then the
    rest in list order. A run's time is at least its heaviest task's: started
    last, one would hold the run up while every other worker idles. The first
    goes first because what is yielded in list order decides when a run stops
    (a hung port's timeouts in a row, ``--time-limit``): the head never waits
    behind heavy work. Outputs are still yielded in list order (the pool's
    invariant): only when work starts moves."""
    pooled = [i for i, t in enumerate(tasks) if t.inline is None]
    head = pooled[:1]
    heavy = sorted((i for i in pooled[1:] if tasks[i].cost_s >= HEAVY_TASK_S), key=lambda i: -tasks[i].cost_s)
    chosen = set(head + heavy)
    return head + heavy + [i for i in pooled if i not in chosen]


@dataclass
class RunState:
    """One :meth:`WorkerPool.run`'s tasks and what came of them, as any executor
    keeps them: per task its payload (what is left of it to run), its outputs
    not yet yielded, how many it yielded, whether it is done; the tasks waiting
    for a worker; the head (the first task not fully yielded). ``deaths``
    counts, per (task, output count), the workers that died there."""

    tasks: list[Task]
    payloads: list[Any]
    outputs: list[list[Any]]
    reported: list[int]
    done: list[bool]
    pending: deque[int]
    head: int = 0
    deaths: dict[tuple[int, int], int] = field(default_factory=dict)

    @classmethod
    def of(cls, tasks: Sequence[Task]) -> RunState:
        listed = list(tasks)
        return cls(
            listed,
            [t.payload for t in listed],
            [[] for _ in listed],
            [0] * len(listed),
            [False] * len(listed),
            deque(dispatch_order(listed)),
        )

    def report(self, dispatch: Callable[[], None]) -> Iterator[Any]:
        """The head task's outputs not yet yielded; an inline head runs here.
        What is yielded is no longer held (a night yields tens of thousands of
        results: the caller keeps what it needs); its place stays, as None.
        ``dispatch`` keeps the workers busy while the caller digests a task's outputs."""
        while self.head < len(self.tasks):
            head = self.head
            task, outputs = self.tasks[head], self.outputs[head]
            if task.inline is not None and not self.done[head]:
                for output in task.inline():
                    outputs.append(None)
                    self.reported[head] += 1
                    yield output
                self.done[head] = True
            while self.reported[head] < len(outputs):
                index = self.reported[head]
                self.reported[head] += 1
                output, outputs[index] = outputs[index], None
                yield output
            if not self.done[head]:
                return
            self.outputs[head] = []
            self.head += 1
            dispatch()

    def drive(
        self, dispatch: Callable[[], None], receive: Callable[[], None], stop: Callable[[], None]
    ) -> Iterator[Any]:
        """Every task's outputs in list order: hand tasks out (``dispatch``), yield
        what the head has, wait for the workers' next messages (``receive``); on any
        exception (Ctrl-C included) ``stop`` (take in what was sent, end the workers)."""
        try:
            while self.head < len(self.tasks):
                dispatch()
                yield from self.report(dispatch)
                if self.head < len(self.tasks):
                    receive()
        except BaseException:
            stop()
            raise

    def take(self, position: int, message: str, value: Any, where: str) -> bool:
        """A worker's message about task ``position``: True for an output (kept),
        False when the task ended (done; the interrupt and an error raise)."""
        if message == "out":
            self.outputs[position].append(value)
            return True
        if message == "done":
            self.done[position] = True
            return False
        if message == "interrupt":
            raise KeyboardInterrupt
        raise PoolError(f"{self.tasks[position].what} failed in {where}: {value}")

    def goes_on(self, position: int, rest: Any) -> None:
        """Task ``position`` lost its worker: what is ``rest`` of it runs next, on
        another worker (None: nothing is left, the task is done)."""
        if rest is None:
            self.done[position] = True
        else:
            self.payloads[position] = rest
            self.pending.appendleft(position)

    def unreported(self) -> list[Any]:
        """The outputs received and not yielded, in task order (then counted as yielded)."""
        out: list[Any] = []
        for position in range(self.head, len(self.tasks)):
            out += self.outputs[position][self.reported[position] :]
            self.reported[position] = len(self.outputs[position])
        return out


class PoolBase:
    """What every executor of this module's invariants shares: the ordered run
    over a :class:`RunState`, the check that every worker's oracle is the
    caller's, and the outputs left when a run stops early. An executor provides
    ``start``, ``_dispatch``, ``_receive``, ``_drain``, ``terminate`` and ``close``."""

    jobs: int
    _state: RunState | None
    _provenance: dict[str, Any] | None
    # Who the workers are, in messages.
    workers_said = "the workers"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            raise PoolStartError(f"{self.workers_said} opened another oracle than this process: {differs}", usage=False)

    def run(self, tasks: Sequence[Task]) -> Iterator[Any]:
        """Every task's outputs, in task order (see the module docstring). On
        any exception (Ctrl-C included) the workers are ended; what they had
        computed and the caller had not received is :meth:`unreported`."""
        state = RunState.of(tasks)
        self._state = state
        if state.pending:
            self.start()
        yield from state.drive(lambda: self._dispatch(state), lambda: self._receive(state), lambda: self._stop(state))

    def _stop(self, state: RunState) -> None:
        self._drain(state)
        self.terminate()

    def unreported(self) -> list[Any]:
        """After :meth:`run` stopped early: the outputs the workers had computed
        that it had not yielded, in task order."""
        state = self._state
        if state is None:
            return []
        self._drain(state)
        return state.unreported()

    def start(self) -> None:
        raise NotImplementedError

    def _dispatch(self, state: RunState) -> None:
        raise NotImplementedError

    def _receive(self, state: RunState | None) -> None:
        raise NotImplementedError

    def _drain(self, state: RunState) -> None:
        raise NotImplementedError

    def terminate(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


@dataclass
class WorkerPool(PoolBase):
    """``jobs`` spawned workers opened from ``spec``; see the module docstring.
    Use as a context manager, or call :meth:`close`."""

    jobs: int
    spec: WorkerSpec
    _workers: list[_Worker] = field(default_factory=list)
    _state: RunState | None = None
    _provenance: dict[str, Any] | None = None
    timeline: PoolTimeline = field(default_factory=PoolTimeline)

    def start(self) -> None:
        """Spawn the workers without waiting for them (their imports overlap the caller's)."""
        while len(self._workers) < self.jobs:
            self._workers.append(self._spawn())

    def _spawn(self) -> _Worker:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        process = context.Process(target=worker_main, args=(child_end, self.spec), name="parity-worker", daemon=True)
        process.start()
        child_end.close()
        return _Worker(process, parent_end, started=time.monotonic())

    def _dispatch(self, state: RunState) -> None:
        for worker in self._workers:
            if not state.pending:
                return
            if worker.ready and worker.task is None:
                position = state.pending.popleft()
                task = state.tasks[position]
                worker.task, worker.outputs = position, 0
                worker.dispatched = self.timeline.task_started()
                worker.conn.send((task.run, state.payloads[position]))

    def _receive(self, state: RunState | None) -> None:
        """Wait for any worker's message (or death) and act on it."""
        waiting = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
        starting = [w.started for w in self._workers if not w.ready]
        timeout = max(0.0, min(starting) + STARTUP_S - time.monotonic()) if starting else None
        before = time.perf_counter()
        ready = wait(waiting, timeout=timeout)
        self.timeline.waited(time.perf_counter() - before)
        if not ready and starting:
            raise PoolError(f"a worker process did not start within {STARTUP_S:g} s")
        for worker in list(self._workers):
            if worker.conn in ready:
                self._read(worker, state)
        for worker in list(self._workers):
            if worker.process.sentinel in ready and worker in self._workers:
                self._read(worker, state)
                self._died(worker, state)

    def _read(self, worker: _Worker, state: RunState | None) -> None:
        while True:
            try:
                if not worker.conn.poll():
                    return
                message, value = worker.conn.recv()
            except (EOFError, OSError):
                return
            self._handle(worker, message, value, state)

    def _handle(self, worker: _Worker, message: str, value: Any, state: RunState | None) -> None:
        if message == "ready":
            self._provenance = ready_provenance(self._provenance, value, "a worker")
            worker.ready = True
            self.timeline.worker_ready()
            return
        position = worker.task
        if position is None or state is None:
            raise PoolError(f"a worker sent {message!r} with no task")
        if state.take(position, message, value, "a worker process"):
            worker.outputs += 1
            return
        worker.task = None
        self.timeline.task_ended(id(worker), worker.dispatched)

    def _died(self, worker: _Worker, state: RunState | None) -> None:
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
        self.timeline.task_ended(id(worker), worker.dispatched)
        if task.recover is None:
            raise PoolError(f"a worker process died (exit code {code}) during {task.what}")
        extra, rest = task.recover(state.payloads[position], worker.outputs, code)
        state.outputs[position] += extra
        state.goes_on(position, rest)
        if state.pending:
            self._workers.append(self._spawn())

    def _drain(self, state: RunState) -> None:
        """Take in what the workers already sent (without waiting), for :meth:`unreported`."""
        for worker in self._workers:
            with contextlib.suppress(BaseException):
                while worker.conn.poll():
                    message, value = worker.conn.recv()
                    if message == "out" and worker.task is not None:
                        state.outputs[worker.task].append(value)

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
        self.timeline.write()
        for worker in self._workers:
            if worker.ready and worker.task is None:
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for worker in self._workers:
            if worker.ready and worker.task is None:
                worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        self.terminate()
