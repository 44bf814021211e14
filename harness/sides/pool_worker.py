"""A worker process of the pool (:mod:`harness.sides.pool`): what it opens and its main loop.

A worker opens its own sides from a :class:`WorkerSpec`, which is plain data:
the oracle (the pinned release in-process, or ``--oracle``'s own process), the
device's recipe and shared kernels, and every port by its spec string
(``per_request``, ``mutant:NAME``, ``cmd:COMMAND``...), loaded the first time a
task names it (:class:`WorkerSides`). Nothing live crosses a process boundary:
no port object, no pipe of an external port, no oracle. :func:`worker_main` is
the spawned process's target; it talks to the parent over one pipe.

Invariants:

* Messages. A worker's first message is ``("ready", {"provenance": ...})`` or
  ``("ready", {"error": ..., "usage": ...})``; then, for each ``(run, payload)``
  the parent sends, ``("out", output)`` per output, ended by ``("done", None)``,
  ``("error", one line)`` or ``("interrupt", None)``. ``None`` from the parent,
  or its end of the pipe closing, ends the worker.
* Threads. Every process that compares runs torch on one thread (the
  commands' ``select_device``, which ``WorkerSpec.open_sides`` calls): the
  shared kernels' float results depend on torch's thread count (a divergent
  item's ULP figures do), so a worker must use the count a ``--jobs 1`` run
  uses, and ``N`` workers of several threads each would oversubscribe the cores.
* Signals. Workers ignore SIGINT: Ctrl-C is the parent's. SIGTERM stops a
  worker wherever it is; it closes its ports (an external port's process group
  with them) on the way out. A port's own per-call limit (SIGALRM,
  :func:`harness.sides.time_limits.time_limit`) works in a worker as in the
  parent: tasks run in the worker's main thread.
* A port that raises ``KeyboardInterrupt`` inside a worker is reported as
  ``interrupt``: the parent stops the run as it would in-process.
* Everything here is picklable by name (the spawn context): ``open_sides`` and
  a task's ``run`` are module-level functions, payloads plain data.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.protocol.port import Port


class SidesRefused(Exception):
    """Opening a worker's oracle met a usage error (a drifted fingerprint, an
    oracle that cannot be served); the message is the one line the command
    prints for it in one process."""


# Opens a worker's oracle and shared kernels from its spec: the oracle, its
# provenance, the kernels. The engine's (harness/engine/workers.py's
# open_worker_sides): the sides do not call up into the layers above them.
OpenSides = Callable[["WorkerSpec"], "tuple[Port, dict[str, Any], SharedKernels | None]"]


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker opens its sides from: picklable, no live object.

    ``open_sides`` is a module-level function (a worker gets it by name) that
    selects the device and opens the oracle as the command does in one process.
    ``ports`` are port specs loaded at start-up (so their loading overlaps the
    imports); any other spec a task names is loaded when first asked for.
    ``no_oracle_cache`` is ``--no-oracle-cache`` and ``oracle_cache_dir`` the
    cache's folder (None: the cache's default), carried for the oracle cache.
    ``tensors`` False (a run of the host levels alone): the sides have no kernels."""

    open_sides: OpenSides
    oracle: str | None = None
    allow_drift: bool = False
    device: str = "cpu"
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S
    ports: tuple[str, ...] = ()
    no_oracle_cache: bool = False
    oracle_cache_dir: str | None = None
    # Whether any item the workers run compares tensors: without, a worker selects
    # the host only and never loads torch (harness.engine.device.select_host).
    tensors: bool = True


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


class _Terminate(KeyboardInterrupt):
    """SIGTERM in a worker: a KeyboardInterrupt, the one exception every side's
    error handling lets through, so the worker stops wherever it is."""


def _terminate(signum: int, frame: Any) -> None:
    raise _Terminate()


def _one_line(exc: BaseException) -> str:
    from harness.sides.items import printable

    return printable(f"{type(exc).__name__}: {exc}")[:500]


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
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
