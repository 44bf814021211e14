"""Running a request's items, in this process or pooled: the port and suite
loaded, the oracle opened, every row streamed to the results file as it
finishes, and the table every output is made from."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from harness.sides.runner import INTERRUPTED_WHY, LOST_WHY, unfinished_items


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


def reproduce_meta(request: RunRequest, suite: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """What a run's reproduce lines are made from (:func:`harness.verdicts.reproduce.reproduce_from_meta`):
    the options that define its items and how they were compared, and how a
    pasted line starts (``launch``: the interpreter and PYTHONPATH this run used)."""
    from harness.verdicts.reproduce import program_words

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


def execute(
    request: RunRequest, before_run: Callable[[Port, Suite], None] | None = None, keep_layouts: bool = True
) -> Execution:
    """Load, check the oracle, run with progress; rows go to --results as they finish.

    ``before_run`` checks the loaded port and suite before any work (the gate's
    baseline against what the suite holds). With ``--jobs`` above 1 the items
    run in worker processes (:mod:`harness.sides.pool`), started before this process
    opens its oracle so their start-up overlaps it; the rows, the table and the
    results file are the same as in-process, in the same order.
    ``keep_layouts`` False (nothing will write the layouts' chunks: no JSON
    report) lets workers send only the figures a row needs of a matching layout."""
    import pandas as pd

    from harness.protocol.port import l3_compares
    from harness.sides.item_stream import stream_items
    from harness.sides.items import computes_tensors
    from harness.sides.pool import PoolError
    from harness.sides.runner import selected_item_ids
    from harness.verdicts.results_file import ResultsWriter, items_digest
    from harness.verdicts.summary import COLUMNS, apply_table_verdicts, check_prefill_layouts, result_row

    if request.resume and not request.results:
        raise UsageError("--resume needs --results FILE (the file to resume)")
    real_ranks = real_ranks_of(request)
    # An explicit --jobs N starts its workers first: their imports overlap loading the port and the suite.
    pool = start_pool(request, None, (), None, [request.port]) if (request.jobs or 1) > 1 else None
    try:
        prepare_device(request.device)
        levels = selected_levels(request.level)
        if computes_tensors(levels):
            prepare_tensor_levels()
        port = load_port(request.port, request.timeout)
        suite = select_suite(request)
        shard = parse_shard(request.shard)
        item_ids = selected_item_ids(suite, levels, shard)
        if computes_tensors(levels) and request.size is None and not request.cases:
            refuse_uncovered_inputs(suite, levels)
        try:
            refuse_empty(len(item_ids), describe_selection(suite, levels, shard))
            if before_run is not None:
                before_run(port, suite)
        except Exception:
            close_port(port)
            raise
        note_unimplemented(port, levels)
        if pool is None:
            pool = start_pool(request, suite, levels, shard, [request.port])
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    try:
        kernels = None
        if computes_tensors(levels):
            kernels = select_device(request.device)
        else:
            select_host(request.device)
        if real_ranks is not None:
            from harness.sides.dcp_ranks import prestart

            # The rank workers import the oracle while this process opens its own.
            prestart(real_ranks, request.device, largest_dcp_world(suite, levels, shard))
        oracle: Port | None = None
        if pool is not None and real_ranks is None:
            # Every item runs in a worker: their oracle's provenance is the run's, and
            # this process does not import the oracle (seconds of CPU the workers need).
            provenance = pool.oracle_provenance()
        else:
            oracle, provenance = open_oracle(
                request.allow_oracle_drift, request.oracle, request.oracle_cache, request.oracle_cache_dir
            )
            if pool is not None:
                pool.expect_provenance(provenance)
        banner = drift_banner(provenance)
        if banner:
            print(banner, file=sys.stderr)
        writer = None
        if request.results:
            header = {
                "items_digest": items_digest(item_ids),
                "items": len(item_ids),
                "suite": suite.name,
                "levels": list(levels),
                "size": request.size,
                "shard": request.shard,
                "port_spec": request.port,
                "port": port.name,
                "device": request.device,
                **dcp_settings(request),
                "pin": f"{provenance['release']} @ {provenance['upstream_commit']}",
                "oracle_drift_overridden": provenance["oracle_drift_overridden"],
                **harness_identity(),
            }
            writer = ResultsWriter(Path(request.results), header, request.resume, item_ids)
        skip = writer.done_ids if writer else frozenset()
        bar, advance = progress_bar(len(item_ids) - len(skip))
        result = RunResult(suite=suite.name, port=port.name, levels=levels)
        started = time.perf_counter()
        interrupted = False

        def record(item: Any) -> None:
            result.results.append(item)
            if writer is not None:
                writer.write(result_row(item))
            if advance is not None:
                advance(item)

        stream = stream_items(
            oracle, port, request.port, suite, levels, shard, kernels, skip, request.device, request.timeout,
            real_ranks, pool, keep_layouts,
        )  # fmt: skip
        try:
            for item in stream:
                record(item)
        except KeyboardInterrupt:
            interrupted = True
            # What workers finished beyond the last row in order is kept too.
            for item in stream.unreported():
                record(item)
            todo = len(item_ids) - len(skip)
            print(f"\nparity: interrupted after {len(result.results)} of {todo} items", file=sys.stderr)
        finally:
            stream.close()
            if bar is not None:
                bar.stop()
            if writer is not None:
                writer.close()
    except PoolError as exc:
        raise pool_failure(exc) from None
    finally:
        if pool is not None:
            pool.close()
    result.seconds = time.perf_counter() - started
    result.provenance = {**provenance, **dcp_settings(request)}
    rows = (writer.done if writer else []) + [result_row(r) for r in result.results]
    finished = skip | {r.id for r in result.results}
    if interrupted or not finished.issuperset(item_ids):
        # Every selected item has its row: one the run never compared (interrupted,
        # or lost to a harness fault) is not-run, and the verdict cannot be PASS.
        why = INTERRUPTED_WHY if interrupted else LOST_WHY
        rows += [result_row(r) for r in unfinished_items(suite, levels, shard, finished, why)]
    table = pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("index", kind="stable").reset_index(drop=True)
    table = check_prefill_layouts(table)
    apply_table_verdicts(table, result.results)
    result.l3_compares = l3_compares(port)
    return Execution(
        table, result, port, suite, provenance, interrupted, oracle,
        lambda: open_oracle(request.allow_oracle_drift, request.oracle)[0],
    )  # fmt: skip
