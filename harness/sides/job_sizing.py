"""How many worker processes a run gets, and how its items are cut into chunks.

The figures here are estimates on the CPU; they decide how work is spread,
never what it computes. Every figure a worker pool is sized by lives here: the
estimated cost of an item per runner kind (:func:`item_cost_s`), what a worker
costs in memory (:data:`WORKER_MEMORY_BYTES`, measured by
``benchmarks/worker_memory.py``), and when a pool pays off at all
(:data:`POOL_PAYS_OFF_S`).

Invariants:

* ``--jobs 1`` never builds a pool: :func:`resolve_jobs` returns 1 and the
  callers run in-process, exactly as before the option existed.
* ``--jobs`` never starts more workers than the machine holds
  (:func:`capped_jobs`: its cores, and its available memory at
  :data:`WORKER_MEMORY_BYTES` each), nor more workers than tasks; a cut is said
  once per process on stderr.
* :func:`cost_chunks` keeps the items' order: the chunks, read in order, are
  ``planned`` again. How items are cut never changes a result, only which
  worker computes it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from harness.model.levels import kind_spec

# Below this much estimated single-process work, the default --jobs runs in-process:
# starting workers (about ten seconds of imports each) would cost more than it saves.
POOL_PAYS_OFF_S = 20.0
# Rough single-process seconds per item on the CPU, for the default --jobs and for
# cutting a run into chunks (ci suite, 2 cores): a chunk is about CHUNK_S of work,
# so a worker asks for work a few times a second and no chunk holds the tail up.
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


def item_cost_s(kind: str) -> float:
    """Rough single-process seconds of one item of ``kind`` on the CPU (its
    level's registered ``cost_s``, ci suite, 2 cores): what sizes the default
    ``--jobs`` and the chunks a run is cut into."""
    return kind_spec(kind)[0].cost_s


def estimated_seconds(kinds: Iterable[str]) -> float:
    """Single-process seconds for items of these runner kinds (a rough CPU figure)."""
    return sum(item_cost_s(kind) for kind in kinds)


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


# An item's kind (harness.sides.items.Kind, or its text): whatever the chunks are cut from they hold.
_Kind = TypeVar("_Kind", bound=str)


def cost_chunks(
    planned: Sequence[tuple[int, _Kind, Any]],
    jobs: int,
    alone: Callable[[int, _Kind, Any], bool] = lambda index, kind, item: False,
) -> list[list[tuple[int, _Kind, Any]]]:
    """``planned`` items cut, in order, into chunks of about :data:`CHUNK_S` of
    work each (by :func:`item_cost_s`) and at least :data:`CHUNKS_PER_WORKER`
    per worker of ``jobs`` (a slow port's items cost more than the estimate: a
    short run still spreads); an item ``alone`` says is a chunk of its own."""
    chunks: list[list[tuple[int, _Kind, Any]]] = []
    chunk: list[tuple[int, _Kind, Any]] = []
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
        cost += item_cost_s(kind)
        if cost >= CHUNK_S or len(chunk) >= most:
            flush()
    flush()
    return chunks
