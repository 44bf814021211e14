"""A run's items compared in worker processes, their results in suite order.

:func:`stream_items` is :func:`harness.sides.runner.run_items` spread over a
:class:`~harness.sides.pool.WorkerPool`: the items it would walk
(:func:`planned_items`), cut into chunks (:func:`item_tasks`, by
:func:`harness.sides.job_sizing.cost_chunks`), each chunk a task a worker runs
(:func:`run_chunk`) against the port it loads from its spec string.

Invariants:

* The same results, in the same order with the same values, as
  :func:`harness.sides.runner.run_items` with the same arguments in one
  process (the pool's order invariant); without a pool it is ``run_items``.
* Real DCP ranks. A DCP prefill item on real ranks (``--dcp-backend gloo`` or
  ``nccl``) runs in the parent when its turn comes, as in one process: its
  ranks are processes of their own, started by :mod:`harness.sides.dcp_ranks`.
* A worker that dies in a chunk: the item it was on is a ``not-run`` row naming
  the exit code (:func:`recover_chunk`), never a compared one; the items after
  it run on another worker.
* ``keep_layouts`` False sends :class:`LayoutFigures` for matching layouts:
  enough for a results row, refused by anything that would write the layout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.model.levels import kind_spec
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S
from harness.sides.job_sizing import cost_chunks, estimated_seconds
from harness.sides.pool import Task

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels
    from harness.protocol.port import Port
    from harness.sides.dcp_ranks import RealRanks
    from harness.sides.items import CaseResult
    from harness.sides.pool import Executor
    from harness.sides.pool_worker import WorkerSides
    from harness.sides.runner import Shard


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
        slim = kind_spec(kind)[0].slim
        yield result if chunk.keep_layouts or slim is None else slim(result)


def without_chunks(result: CaseResult) -> CaseResult:
    """A parity row's layouts as the figures its row reads of them."""
    from typing import cast

    from harness.model import Layout
    from harness.sides.items import PARITY

    if result.status != PARITY:
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
        error="not compared: the worker process comparing this item died "
        + ("every time it was tried" if exitcode is None else f"(exit code {exitcode})")
        + ": the port or the oracle crashed it",
    )
    row.index = index
    rest = chunk.items[finished + 1 :]
    return [row], (ItemChunk(chunk.port_spec, rest, chunk.keep_layouts) if rest else None)


def retry_chunk(chunk: ItemChunk, finished: int) -> ItemChunk | None:
    """The items of ``chunk`` from the one its dead worker was on, to run again elsewhere."""
    rest = chunk.items[finished:]
    return ItemChunk(chunk.port_spec, rest, chunk.keep_layouts) if rest else None


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
        what = f"items {index}..{chunk[-1][0]}"
        cost = estimated_seconds(k for _, k, _ in chunk)
        tasks.append(
            Task(run=run_chunk, payload=payload, recover=recover_chunk, retry=retry_chunk, cost_s=cost, what=what)
        )
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

    def __init__(self, results: Iterator[CaseResult], pool: Executor | None) -> None:
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
    pool: Executor | None = None,
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
    from harness.sides.items import computes_tensors
    from harness.sides.runner import run_item, run_items

    if pool is None:
        assert oracle is not None, "a run in this process needs its oracle"
        return ItemStream(
            run_items(oracle, port, suite, levels, shard, kernels, skip, device, timeout_s, real_ranks), None
        )
    if kernels is None and computes_tensors(levels):
        from harness.kernels import kernels_for

        kernels = kernels_for(device)
    parent_kernels = kernels

    def on_real_ranks(index: int, kind: str, item: Any) -> bool:
        return real_ranks is not None and kind_spec(kind)[0].real_ranks and item.dcp_world_size > 1

    def run_here(index: int, kind: str, item: Any) -> CaseResult:
        assert oracle is not None, "an item on real ranks runs in this process, with its oracle"
        result = run_item(oracle, port, kind, item, parent_kernels, device, timeout_s, real_ranks)
        result.index = index
        return result

    planned = planned_items(suite, levels, shard, skip)
    tasks = item_tasks(port_spec, planned, keep_layouts, pool.jobs, on_real_ranks, run_here)
    return ItemStream(pool.run(tasks), pool)
