"""Work spread over a Ray cluster (``--executor ray``): :class:`RayPool` is
:class:`~harness.sides.pool.WorkerPool` with Ray actors for worker processes.

Each actor is a :class:`WorkerActor`: it opens its sides from the same
:class:`~harness.sides.pool_worker.WorkerSpec` a pool worker does and runs the
same tasks (``run(sides, payload)``), streaming each output back as it comes
(a Ray streaming generator). The parent keeps the pool's bookkeeping, so every
invariant of :mod:`harness.sides.pool` holds here too, and these:

* Order and bytes. Outputs are yielded in task order, each task's in its own
  order: while no worker dies, the rows, the JSON, results.parquet, summary
  and page of a run are the same as ``--jobs`` gives on the same items.
* Faults lose nothing, count nothing twice. An actor that dies in a task (its
  process crashed, or its node went away) is replaced by a fresh one; the
  outputs it had sent stay, and the task goes on from the item it was on, on
  any actor. A death counts against that item only once the actor said it had
  started the task (``("started", None)``). An item whose worker died
  :data:`MAX_ITEM_TRIES` times is not run again: the task's ``recover`` makes
  it a ``not-run`` row (nothing compared), as one death does under ``--jobs``,
  and the rest goes on; a task without ``retry`` (the kill matrix's, explore's)
  is recovered at once, and one without ``recover`` ends the run in one line.
  A run never waits on a dead actor.
* Resources. An actor asks Ray for one CPU, and for one GPU when the run's
  device is CUDA, so a cluster's CPU and GPU nodes serve one run.
* Ctrl-C stops the cluster's work (every actor is killed) and keeps every
  output received (:meth:`RayPool.unreported`): a ``--results`` file resumes.
* Ray is imported only here, and only when a run asks for it; without Ray
  installed, :func:`ray_module` is a one-line usage error saying how to get it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.sides.pool import (
    STARTUP_S,
    PoolBase,
    PoolError,
    PoolStartError,
    RunState,
    Task,
    ready_provenance,
)
from harness.sides.pool_worker import SidesRefused, WorkerSides, WorkerSpec

# How many times an item may take its worker down before it is left not run.
MAX_ITEM_TRIES = 2
# The environment an actor needs as the parent has it (a pool worker inherits the
# whole of it): the harness's own variables (the oracle cache, the plug-ins), where
# ports import from and the cache's default folder, and what decides the kernels'
# arithmetic (torch's CPU capability, numpy's CPU features, Triton and vLLM settings).
CARRIED_VARIABLES = ("PYTHONPATH", "XDG_CACHE_HOME")
CARRIED_PREFIXES = ("PARITY_", "ATEN_", "NPY_", "TRITON_", "VLLM_")
INSTALL_HINT = (
    "--executor ray: Ray is not installed here: install the harness with its ray extra "
    "(pip install -e '.[ray]'; the tox environment .tox/oracle has it)"
)


def ray_module() -> Any:
    """The ``ray`` module, or a usage error (:class:`PoolStartError`) saying how to install it."""
    try:
        import ray
    except ImportError:
        raise PoolStartError(INSTALL_HINT, usage=True) from None
    return ray


class WorkerActor:
    """A worker's sides in a Ray actor process (Ray wraps this class with
    ``ray.remote``); its methods are the pool worker's messages."""

    def __init__(self, spec: WorkerSpec, working_dir: str) -> None:
        import warnings

        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        # A port named by import path imports from where the run was started, as in one process.
        with contextlib.suppress(OSError):
            os.chdir(working_dir)
        if working_dir not in sys.path:
            sys.path.insert(0, working_dir)
        self.sides: WorkerSides | None = None
        self.hello: dict[str, Any]
        try:
            self.sides = WorkerSides(spec)
            self.hello = {"provenance": self.sides.provenance}
        except SidesRefused as exc:
            self.hello = {"error": str(exc), "usage": True}
        except Exception as exc:  # a worker that cannot open its sides says why, in one line
            self.hello = {"error": f"{type(exc).__name__}: {exc}"[:500], "usage": False}

    def ready(self) -> dict[str, Any]:
        return self.hello

    def run(self, run: Any, payload: Any) -> Iterator[tuple[str, Any]]:
        """``("started", None)`` (the task reached this actor: a death after it
        counts against the item it was on), the task's outputs, each as
        ``("out", output)``, then ``("done", None)``, ``("error", one line)`` or
        ``("interrupt", None)``."""
        from harness.sides.items import printable

        assert self.sides is not None
        yield ("started", None)
        try:
            for output in run(self.sides, payload):
                yield ("out", output)
        except KeyboardInterrupt:
            yield ("interrupt", None)
            return
        except Exception as exc:
            yield ("error", printable(f"{type(exc).__name__}: {exc}")[:500])
            return
        yield ("done", None)

    def close(self) -> None:
        if self.sides is not None:
            self.sides.close()


@dataclass
class _Actor:
    handle: Any
    number: int
    started: float = 0.0
    ready: bool = False
    task: int | None = None
    outputs: int = 0
    # Whether the actor said it started its task: a death before that is the
    # actor's or its node's (gone before the task reached it), never the item's.
    began: bool = False
    # Ended by the pool itself (Ctrl-C, the end of a run), not by a fault.
    stopped: bool = False
    stream: threading.Thread | None = None
    dead: bool = False


@dataclass
class RayPool(PoolBase):
    """``jobs`` Ray actors opened from ``spec`` on the cluster at ``address``
    (None: a cluster started in this process, ended with the pool); see the
    module docstring. Use as a context manager, or call :meth:`close`."""

    jobs: int
    spec: WorkerSpec
    address: str | None = None
    _actors: list[_Actor] = field(default_factory=list)
    _messages: queue.Queue[tuple[_Actor, str, Any]] = field(default_factory=queue.Queue)
    _state: RunState | None = None
    _provenance: dict[str, Any] | None = None
    _started_ray: bool = False
    _spawned: int = 0
    _actor_class: Any = None
    _startup_deaths: int = 0
    workers_said = "the Ray actors"

    def _ray(self) -> Any:
        ray = ray_module()
        if not ray.is_initialized():
            carried = {
                name: value
                for name, value in os.environ.items()
                if name in CARRIED_VARIABLES or name.startswith(CARRIED_PREFIXES)
            }
            root = str(Path(__file__).resolve().parents[2])
            search = [os.getcwd(), root, *filter(None, carried.get("PYTHONPATH", "").split(os.pathsep))]
            carried["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(search))
            # No address and no RAY_ADDRESS: a cluster of this run's own (ray.init(None)
            # would join any cluster `ray start` left running on this host).
            address = self.address or os.environ.get("RAY_ADDRESS") or "local"
            try:
                ray.init(
                    address=address,
                    runtime_env={"env_vars": carried},
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level="ERROR",
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise PoolStartError(f"--executor ray: cannot reach {address}: {exc}", usage=True) from None
            self._started_ray = address == "local"
        if self._actor_class is None:
            self._actor_class = ray.remote(WorkerActor)
        return ray

    def start(self) -> None:
        """Create the actors without waiting for them (their imports overlap the caller's);
        ``jobs`` 0 is one actor per CPU of the cluster."""
        ray = self._ray()
        if self.jobs <= 0:
            self.jobs = max(1, int(ray.cluster_resources().get("CPU", 1)))
        while len(self._actors) < self.jobs:
            self._actors.append(self._spawn())

    def _spawn(self) -> _Actor:
        gpus = 1 if self.spec.device.startswith("cuda") else 0
        handle = self._actor_class.options(num_cpus=1, num_gpus=gpus, max_restarts=0).remote(self.spec, os.getcwd())
        self._spawned += 1
        actor = _Actor(handle, self._spawned, started=time.monotonic())
        threading.Thread(target=self._await_ready, args=(actor,), daemon=True).start()
        return actor

    def _await_ready(self, actor: _Actor) -> None:
        ray = self._ray()
        try:
            self._messages.put((actor, "ready", ray.get(actor.handle.ready.remote())))
        except Exception as exc:
            self._messages.put((actor, "died", f"{type(exc).__name__}: {exc}"))

    def _stream(self, actor: _Actor, task: Task, payload: Any) -> None:
        ray = self._ray()
        try:
            for ref in actor.handle.run.options(num_returns="streaming").remote(task.run, payload):
                message, value = ray.get(ref)
                self._messages.put((actor, message, value))
        except Exception as exc:
            self._messages.put((actor, "died", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]))

    def _dispatch(self, state: RunState) -> None:
        for actor in self._actors:
            if not state.pending:
                return
            if actor.ready and actor.task is None and not actor.dead:
                position = state.pending.popleft()
                actor.task, actor.outputs, actor.began = position, 0, False
                actor.stream = threading.Thread(
                    target=self._stream, args=(actor, state.tasks[position], state.payloads[position]), daemon=True
                )
                actor.stream.start()

    def _receive(self, state: RunState | None) -> None:
        """Wait for any actor's message and act on it (and on any that follow at once)."""
        # Only a run with no actor ready waits for one against the clock: a replacement
        # pending for a free CPU (a node went away) waits as long as the others work.
        starting = [a.started for a in self._actors if not a.ready and not a.dead]
        if any(a.ready for a in self._actors):
            starting = []
        timeout = max(0.0, min(starting) + STARTUP_S - time.monotonic()) if starting else None
        try:
            actor, message, value = self._messages.get(timeout=timeout)
        except queue.Empty:
            raise PoolError(f"a Ray actor did not start within {STARTUP_S:g} s") from None
        self._handle(actor, message, value, state)
        while True:
            try:
                actor, message, value = self._messages.get_nowait()
            except queue.Empty:
                return
            self._handle(actor, message, value, state)

    def _handle(self, actor: _Actor, message: str, value: Any, state: RunState | None) -> None:
        if actor.dead:
            return  # a replaced actor's last words: its task went on elsewhere
        if message == "died":
            self._died(actor, value, state)
            return
        if message == "ready":
            self._provenance = ready_provenance(self._provenance, value, "a Ray actor")
            actor.ready = True
            return
        position = actor.task
        if position is None or state is None:
            raise PoolError(f"a Ray actor sent {message!r} with no task")
        if message == "started":
            actor.began = True
            return
        if state.take(position, message, value, "a Ray actor"):
            actor.outputs += 1
            return
        actor.task = None

    def _died(self, actor: _Actor, reason: str, state: RunState | None) -> None:
        """An actor (or its node) is gone: a fresh one takes its place; its task goes on."""
        actor.dead = True
        self._actors.remove(actor)
        with contextlib.suppress(Exception):
            self._ray().kill(actor.handle)
        if not actor.ready:
            # Its node went away before it was ready: another takes its place while
            # others serve the run; with none, the run cannot go on.
            self._startup_deaths += 1
            if self._startup_deaths > 2 * self.jobs or not any(a.ready for a in self._actors):
                raise PoolStartError(f"a Ray actor died during its start-up: {reason}")
            self._actors.append(self._spawn())
            return
        position = actor.task
        if position is None or state is None:
            self._actors.append(self._spawn())
            return
        task = state.tasks[position]
        if task.recover is None:
            raise PoolError(f"a Ray actor died during {task.what}: {reason}")
        key = (position, len(state.outputs[position]))
        # Only a death after the task reached the actor counts against the item.
        state.deaths[key] = state.deaths.get(key, 0) + (1 if actor.began else 0)
        payload = state.payloads[position]
        if task.retry is not None and state.deaths[key] < MAX_ITEM_TRIES:
            rest = task.retry(payload, actor.outputs)
        else:
            extra, rest = task.recover(payload, actor.outputs, None)
            state.outputs[position] += extra
        state.goes_on(position, rest)
        self._actors.append(self._spawn())

    def _drain(self, state: RunState) -> None:
        """Take in what the actors already sent (without waiting), for :meth:`unreported`."""
        while True:
            try:
                actor, message, value = self._messages.get_nowait()
            except queue.Empty:
                return
            if message == "out" and actor.task is not None and (actor.stopped or not actor.dead):
                state.outputs[actor.task].append(value)

    def terminate(self) -> None:
        """Stop every actor now (Ray kills its process; its ports' processes go with it)."""
        actors, self._actors = self._actors, []
        if not actors:
            return
        ray = self._ray()
        for actor in actors:
            actor.dead = actor.stopped = True
            with contextlib.suppress(Exception):
                ray.kill(actor.handle)
        # What a stream had taken in before the kill reaches the queue (for unreported).
        for actor in actors:
            if actor.stream is not None:
                actor.stream.join(timeout=2)

    def close(self) -> None:
        """Let idle actors close their ports, end the rest, and a cluster this pool started."""
        idle = [a for a in self._actors if a.ready and a.task is None and not a.dead]
        if idle:
            ray = self._ray()
            with contextlib.suppress(Exception):
                ray.wait([a.handle.close.remote() for a in idle], num_returns=len(idle), timeout=10)
        self.terminate()
        if self._started_ray:
            with contextlib.suppress(Exception):
                ray_module().shutdown()
            self._started_ray = False
