"""Running a request's items, in this process or pooled: the port and suite
loaded, the oracle opened, every row streamed to the results file as it
finishes, and the table every output is made from."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cases.suites import Suite
from harness.engine.device import (
    prepare_device,
    prepare_tensor_levels,
    refuse_uncovered_inputs,
    select_device,
    select_host,
)
from harness.engine.errors import UsageError
from harness.engine.oracles import drift_banner, open_oracle
from harness.engine.progress import progress_bar
from harness.engine.request import RunRequest
from harness.engine.selection import (
    dcp_settings,
    describe_selection,
    largest_dcp_world,
    note_unimplemented,
    parse_shard,
    real_ranks_of,
    refuse_empty,
    select_suite,
)
from harness.engine.workers import pool_failure, start_pool
from harness.protocol.port import Port
from harness.sides.items import RunResult, selected_levels
from harness.sides.loading import close_port, load_port
from harness.sides.runner import INTERRUPTED_WHY, LOST_WHY, Shard, unfinished_items
from harness.sides.work_box import WorkBox

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.sides.dcp_ranks import RealRanks
    from harness.sides.pool import Executor
    from harness.verdicts.results_file import ResultsWriter


@dataclass
class Execution:
    """What run and gate share: the table of every item (resumed ones included),
    the new results in full, and where they came from."""

    table: Any
    result: RunResult
    port: Port
    suite: Suite
    provenance: dict[str, Any]
    # Ctrl-C stopped the run: the table holds what finished, and every item that
    # did not is a ``not-run`` row, so the verdict can be no better than INCOMPLETE.
    interrupted: bool = False
    # Why the run stopped early by itself (harness.sides.work_box), its unreached
    # items ``not-run`` rows as an interrupted run's are; None when it did not.
    stopped: str | None = None
    # This process's oracle, or how to open it: a run whose items all ran in
    # workers opens its own only if something asks for it (the gate's shrinking).
    opened_oracle: Port | None = None
    open_oracle_side: Callable[[], Port] | None = None

    @property
    def oracle(self) -> Port:
        if self.opened_oracle is None:
            assert self.open_oracle_side is not None
            self.opened_oracle = self.open_oracle_side()
        return self.opened_oracle

    def close(self) -> None:
        """End what the run handed on: the port, then the oracle if this process
        opened one (a served release's process among them). Idempotent enough
        for a ``finally``: each is closed as :func:`close_port` closes ports."""
        close_port(self.port)
        if self.opened_oracle is not None:
            close_port(self.opened_oracle)


def reproduce_meta(request: RunRequest, suite: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """What a run's reproduce lines are made from (:func:`harness.verdicts.reproduce.reproduce_from_meta`):
    the options that define its items and how they were compared, and how a
    pasted line starts (``launch``: the interpreter and PYTHONPATH this run used)."""
    from harness.verdicts.launch import program_words

    return {
        "suite": suite,
        "port_spec": request.port,
        "device": request.device,
        "size": request.size,
        "cases": request.cases,
        "timeout": request.timeout,
        "pin": f"{provenance['release']} @ {provenance['upstream_commit']}",
        "oracle_drift_overridden": provenance["oracle_drift_overridden"],
        "launch": program_words(request.port),
    }


def harness_identity() -> dict[str, Any]:
    """The harness's version and commit, for results-file headers."""
    from importlib.metadata import PackageNotFoundError, version

    from harness.verdicts.provenance import repository_state, source_digest

    try:
        harness_version = version("mla-parity")
    except PackageNotFoundError:
        harness_version = None
    return {
        "harness_version": harness_version,
        "harness_commit": repository_state().get("commit"),
        "harness_sources": source_digest(),
    }


@dataclass
class Prepared:
    """Everything :func:`run_prepared` needs, loaded and checked: the port, the
    suite's selected items, the pool (None: this process), the kernels (None:
    host work), the oracle (None: every item runs in a worker) and its
    provenance. The port and the oracle belong to the ``on_failure`` stack
    :func:`prepare` was given, the pool to its ``always`` stack."""

    request: RunRequest
    levels: tuple[str, ...]
    port: Port
    suite: Suite
    shard: Shard | None
    item_ids: list[str]
    pool: Executor | None
    kernels: SharedKernels | None
    oracle: Port | None
    provenance: dict[str, Any]
    real_ranks: RealRanks | None


@dataclass
class Ran:
    """What the run step produced: this run's results in order, the rows a
    resumed results file already held, their ids, and whether Ctrl-C stopped it."""

    result: RunResult
    resumed_rows: list[dict[str, Any]]
    skip: frozenset[str]
    interrupted: bool
    # Why the run stopped before its last item (a hung port, its time limit), or None;
    # and in a few words, for each unreached item's not-run row.
    stopped: str | None = None
    stopped_short: str = ""


def execute(
    request: RunRequest, before_run: Callable[[Port, Suite], None] | None = None, keep_layouts: bool = True
) -> Execution:
    """Load, check the oracle, run with progress; rows go to --results as they finish.

    Three steps: :func:`prepare` (load, check, open), :func:`run_prepared`
    (compare, streaming rows), :func:`tabulate` (the table and its verdicts).
    ``before_run`` checks the loaded port and suite before any work (the gate's
    baseline against what the suite holds). With ``--jobs`` above 1 the items
    run in worker processes (:mod:`harness.sides.pool`), started before this process
    opens its oracle so their start-up overlaps it; the rows, the table and the
    results file are the same as in-process, in the same order.
    ``keep_layouts`` False (nothing will write the layouts' chunks: no JSON
    report) lets workers send only the figures a row needs of a matching layout.

    The pool is closed on every path; the port and the oracle are closed on
    every path but success, where the :class:`Execution` hands them on."""
    from harness.sides.pool import PoolError

    try:
        with contextlib.ExitStack() as always, contextlib.ExitStack() as on_failure:
            prepared = prepare(request, before_run, always, on_failure)
            execution = tabulate(prepared, run_prepared(prepared, keep_layouts))
            on_failure.pop_all()
    except PoolError as exc:
        raise pool_failure(exc, request.executor) from None
    return execution


def prepare(
    request: RunRequest,
    before_run: Callable[[Port, Suite], None] | None,
    always: contextlib.ExitStack,
    on_failure: contextlib.ExitStack,
) -> Prepared:
    """Start the pool (an explicit ``--jobs N`` first: its imports overlap the
    rest), set the device, load the port and the suite, check the selection,
    select the device and open the oracle (or take the workers' provenance)."""
    from harness.sides.items import computes_tensors
    from harness.sides.runner import selected_item_ids

    if request.resume and not request.results:
        raise UsageError("--resume needs --results FILE (the file to resume)")
    real_ranks = real_ranks_of(request)
    early = (request.jobs or 1) > 1 or request.executor == "ray"
    pool = start_pool(request, None, (), None, [request.port]) if early else None
    if pool is not None:
        always.callback(pool.close)
    prepare_device(request.device)
    levels = selected_levels(request.level)
    tensors = computes_tensors(levels)
    if tensors:
        prepare_tensor_levels()
    port = _load_port(request, on_failure)
    suite = select_suite(request)
    shard = parse_shard(request.shard)
    item_ids = selected_item_ids(suite, levels, shard)
    if tensors and not request.cases:
        # A smaller --size is a subset of the suite's items (generation keeps each
        # item whatever the count); a larger one grows items no digest covers: refused.
        refuse_uncovered_inputs(suite, levels, request.size)
    refuse_empty(len(item_ids), describe_selection(suite, levels, shard))
    if before_run is not None:
        before_run(port, suite)
    note_unimplemented(port, levels)
    if pool is None:
        pool = start_pool(request, suite, levels, shard, [request.port])
        if pool is not None:
            always.callback(pool.close)
    kernels = select_device(request.device) if tensors else None
    if not tensors:
        select_host(request.device)
    if real_ranks is not None:
        from harness.sides.dcp_ranks import close_pools, prestart

        # The rank workers import the oracle while this process opens its own;
        # a run that fails ends them (one that succeeds leaves them for the next, or the exit).
        on_failure.callback(close_pools)
        prestart(real_ranks, request.device, largest_dcp_world(suite, levels, shard))
    oracle, provenance = _open_oracle_side(request, pool, real_ranks, on_failure)
    return Prepared(request, levels, port, suite, shard, item_ids, pool, kernels, oracle, provenance, real_ranks)


def _load_port(request: RunRequest, on_failure: contextlib.ExitStack) -> Port:
    """The port (closed by ``on_failure``; :func:`load_port` refuses one whose
    module registers a level as it loads)."""
    port = load_port(request.port, request.timeout)
    on_failure.callback(close_port, port)
    return port


def _open_oracle_side(
    request: RunRequest, pool: Executor | None, real_ranks: RealRanks | None, on_failure: contextlib.ExitStack
) -> tuple[Port | None, dict[str, Any]]:
    """This process's oracle (closed by ``on_failure``) and its provenance; or,
    when every item runs in a worker, None and the workers' provenance: this
    process then never imports the oracle (seconds of CPU the workers need)."""
    oracle: Port | None = None
    if pool is not None and real_ranks is None:
        provenance = pool.oracle_provenance()
    else:
        oracle, provenance = open_oracle(
            request.allow_oracle_drift, request.oracle, request.oracle_cache, request.oracle_cache_dir
        )
        on_failure.callback(close_port, oracle)
        if pool is not None:
            pool.expect_provenance(provenance)
    banner = drift_banner(provenance)
    if banner:
        print(banner, file=sys.stderr)
    return oracle, provenance


def _results_writer(prepared: Prepared) -> ResultsWriter | None:
    """The results file's writer (its header: what the rows are of), or None without --results."""
    from harness.verdicts.results_file import ResultsWriter, items_digest

    request, provenance = prepared.request, prepared.provenance
    if not request.results:
        return None
    header = {
        "items_digest": items_digest(prepared.item_ids),
        "items": len(prepared.item_ids),
        "suite": prepared.suite.name,
        "levels": list(prepared.levels),
        "size": request.size,
        "shard": request.shard,
        "port_spec": request.port,
        "port": prepared.port.name,
        "device": request.device,
        **dcp_settings(request),
        "pin": f"{provenance['release']} @ {provenance['upstream_commit']}",
        "oracle_drift_overridden": provenance["oracle_drift_overridden"],
        **harness_identity(),
    }
    return ResultsWriter(Path(request.results), header, request.resume, prepared.item_ids)


def run_prepared(prepared: Prepared, keep_layouts: bool) -> Ran:
    """Compare every selected item not already in a resumed file, each row
    written as it finishes; Ctrl-C keeps what finished (workers' rows beyond the
    last in order too) and says so."""
    from harness.sides.item_stream import stream_items
    from harness.verdicts.summary import result_row

    p, request = prepared, prepared.request
    writer = _results_writer(p)
    skip = writer.done_ids if writer else frozenset()
    bar, advance = progress_bar(len(p.item_ids) - len(skip))
    result = RunResult(suite=p.suite.name, port=p.port.name, levels=p.levels)
    started = time.perf_counter()
    interrupted = False

    def record(item: Any) -> None:
        result.results.append(item)
        if writer is not None:
            writer.write(result_row(item))
        if advance is not None:
            advance(item)

    stream = stream_items(
        p.oracle, p.port, request.port, p.suite, p.levels, p.shard, p.kernels, skip, request.device,
        request.timeout, p.real_ranks, p.pool, keep_layouts,
    )  # fmt: skip
    box, stopped = WorkBox(request.time_limit), None
    try:
        for item in stream:
            record(item)
            stopped = box.stop_after(item)
            if stopped is not None:
                break
        if stopped is not None:
            # What other workers finished past the stop is left out: the same table for any --jobs.
            if len(result.results) + len(skip) >= len(p.item_ids):
                stopped = None  # it stopped after its last item: nothing was left unrun
            else:
                print(f"\nparity: stopped: {stopped}", file=sys.stderr)
    except KeyboardInterrupt:
        interrupted = True
        for item in stream.unreported():
            record(item)
        todo = len(p.item_ids) - len(skip)
        print(f"\nparity: interrupted after {len(result.results)} of {todo} items", file=sys.stderr)
    finally:
        stream.close()
        if bar is not None:
            bar.stop()
        if writer is not None:
            writer.close()
        if p.pool is not None:
            p.pool.close()  # now, not after tabulating: its workers may hold a GPU (closing twice is harmless)
    result.seconds = time.perf_counter() - started
    result.provenance = {**p.provenance, **dcp_settings(request)}
    return Ran(result, writer.done if writer else [], skip, interrupted, stopped, box.short)


def tabulate(prepared: Prepared, ran: Ran) -> Execution:
    """The table of every selected item, in suite order, with its verdicts: an
    item the run never compared (interrupted, or lost to a harness fault) is a
    not-run row, so the verdict cannot be PASS."""
    import pandas as pd

    from harness.protocol.port import l3_compares
    from harness.verdicts.summary import COLUMNS, apply_table_verdicts, check_prefill_layouts, result_row

    p, result = prepared, ran.result
    rows = ran.resumed_rows + [result_row(r) for r in result.results]
    finished = ran.skip | {r.id for r in result.results}
    if ran.interrupted or ran.stopped or not finished.issuperset(p.item_ids):
        why = (
            INTERRUPTED_WHY
            if ran.interrupted
            else f"the run stopped early ({ran.stopped_short})"
            if ran.stopped
            else LOST_WHY
        )
        rows += [result_row(r) for r in unfinished_items(p.suite, p.levels, p.shard, finished, why)]
    table = pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("index", kind="stable").reset_index(drop=True)
    table = check_prefill_layouts(table)
    apply_table_verdicts(table, result.results)
    result.l3_compares = l3_compares(p.port)
    request = p.request
    return Execution(
        table, result, p.port, p.suite, p.provenance, ran.interrupted, ran.stopped, p.oracle,
        lambda: open_oracle(request.allow_oracle_drift, request.oracle)[0],
    )  # fmt: skip
