"""Running the nightly sweep (:func:`run_nightly`): every port over the night's
suite, the mutant kill matrix, the explore search, incremental writes,
interruption and the history.

The report is rewritten after every step, and first of all before any work, so
a run killed at any point leaves a readable report; only a run that finishes
marks it complete and appends to the history store. Until then the night lists
the steps still pending (a port, the mutant kill matrix, a search), so a page
written mid-run says what is still running rather than that the run stopped.
SIGINT and SIGTERM stop the run gracefully: what finished is kept and the night
says where it stopped.

The night's pieces are its siblings': its data and verdict
(harness/night/data.py), each port's baseline (harness/night/baselines.py), its
folder, lock and files (harness/night/folder.py), the GPU report
(harness/night/gpu_report.py), the history store and the night's sizes (what
makes a night *reduced*, harness/night/history.py), and merging shards
(harness/night/shards.py). A write that fails mid-night (a full disk) stops
nothing: ``Night.unwritten`` says what is still unwritten, for the command to
print. This module renders nothing: the report is written by the
``write_report`` callback the command passes in (reports/nightly.py's
``write_report``), so the harness never imports ``reports/``.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.cases.suites import Suite
from harness.night.baselines import PortBaseline, judge_port, nightly_baselines
from harness.night.data import Night, PortNight
from harness.night.drift import latest_drift_report
from harness.night.folder import WriteReport, nightly_lock, unwritable, validate_night_date, write_night
from harness.night.gpu_report import GPU_REPORTS, latest_gpu_report
from harness.night.history import append_history, read_history
from harness.night.sizes import night_sizes
from harness.protocol.port import Port, l3_compares
from harness.search.coverage_verdicts import nightly_coverage
from harness.sides.item_stream import stream_items
from harness.sides.pool import Executor
from harness.sides.runner import INTERRUPTED_WHY, LOST_WHY, Shard, count_items, selected_item_ids, unfinished_items
from harness.sides.work_box import WorkBox
from harness.verdicts.provenance import collect, port_repository
from harness.verdicts.results_file import items_digest
from harness.verdicts.summary import COLUMNS, check_prefill_layouts, result_row, summarise_table

# A progress display for (total, what is counted: "items of port NAME") and its callback.
ProgressFactory = Callable[[int, str], tuple[Any, Any]]
MUTANTS_STEP = "the mutant kill matrix"


@dataclass(frozen=True)
class NightlyPlan:
    date: str
    suite: Suite
    levels: tuple[str, ...]
    shard: Shard | None
    out_dir: Path
    history: Path
    mutants: bool = True
    # The latest GPU report here (benchmarks/gpu_report.py) becomes the night's GPU section.
    gpu_reports: Path = GPU_REPORTS
    # ``parity explore`` for every port after the suite (0: not run). Its folder is
    # not per date, so every night first replays the finds of the nights before.
    explore_budget_s: float = 0.0
    explore_dir: Path | None = None
    # The ``--ports`` spelling of each port, for the finds' reproduce commands.
    port_specs: tuple[str, ...] = ()
    # ``--baseline PORT=FILE`` (harness.night.baselines.parse_baseline_options): by port name or
    # spelling; None judges the port against no baseline. A built-in port not
    # named here gets its default (harness.night.baselines.default_baseline).
    baselines: Mapping[str, Path | None] = field(default_factory=dict)
    # Where the night's items, kill matrix and searches run (harness/sides/pool.py,
    # ``--jobs``): its workers load each port from ``port_specs``. None: in
    # this process. The night's results are the same either way; its owner closes it.
    pool: Executor | None = None
    # ``--size`` and ``--numeric-size`` as given (None: the suite's default), for the page's sizes.
    size: int | None = None
    numeric_size: int | None = None
    # Seconds the whole night may take (``--time-limit``; harness.sides.work_box): None, no limit.
    time_limit_s: float | None = None


def run_nightly(
    plan: NightlyPlan,
    oracle: Port,
    ports: list[Port],
    oracle_provenance: dict[str, Any],
    *,
    write_report: WriteReport,
    progress: ProgressFactory | None = None,
) -> Night:
    """Run the night under ``<out>/.nightly.lock`` (``plan.out_dir``'s parent is
    ``--out``). Bad input (the date, a baseline) is refused before anything is written.
    ``plan.pool`` (when given) runs the night's work in its worker processes."""
    validate_night_date(plan.date)
    if plan.pool is not None and len(plan.port_specs) != len(ports):
        # The workers load each port from its spelling; the Port objects given
        # would otherwise only lend their names to whatever those load.
        raise ValueError(
            f"a night with a worker pool needs the spelling of each of its {len(ports)} ports "
            f"(plan.port_specs holds {len(plan.port_specs)}): the workers load the ports from them"
        )
    specs = list(plan.port_specs or [p.name for p in ports])
    with nightly_lock(plan.out_dir.parent):
        baselines = nightly_baselines(ports, specs, plan.baselines, plan.suite.name, oracle_provenance.get("release"))
        history = read_history(plan.history)
        return _run_locked(plan, oracle, ports, specs, oracle_provenance, baselines, history, write_report, progress)


def _run_locked(
    plan: NightlyPlan,
    oracle: Port,
    ports: list[Port],
    specs: list[str],
    oracle_provenance: dict[str, Any],
    baselines: dict[str, PortBaseline],
    history: pd.DataFrame,
    write_report: WriteReport,
    progress: ProgressFactory | None,
) -> Night:
    per_port = count_items(plan.suite, plan.levels, plan.shard)
    night = Night(plan.date, plan.suite.name, per_port * len(ports), provenance=collect(oracle_provenance))
    night.provenance["shard"] = str(plan.shard) if plan.shard else None
    # Each port's own code (its repository and commit), not the harness's in its place.
    night.provenance["port_repositories"] = {p.name: port_repository(s, p) for p, s in zip(ports, specs, strict=True)}
    night.gpu = latest_gpu_report(plan.gpu_reports)
    night.drift = latest_drift_report()
    night.baselines = baselines
    night.port_specs = {p.name: s for p, s in zip(ports, specs, strict=True)}
    # Only the shard that searches (shard 1, or the whole night) owes a search.
    searches = plan.shard is None or plan.shard.number == 1
    night.explore_budget_s = plan.explore_budget_s if searches else 0.0
    mutants = plan.mutants and plan.shard is None
    night.sizes = night_sizes(
        plan.suite.name, plan.size, plan.numeric_size, plan.levels, mutants, plan.explore_budget_s
    )
    night.pending = [f"port {p.name}" for p in ports]
    night.pending += [MUTANTS_STEP] if mutants else []
    night.pending += [f"parity explore of {spec}" for spec in specs] if night.explore_budget_s > 0 else []
    digest = items_digest(selected_item_ids(plan.suite, plan.levels))

    def save() -> None:
        # A report that cannot be written (a full disk) stops nothing: the night goes on,
        # the next save tries again, and the command prints what is still unwritten.
        try:
            write_night(night, plan.out_dir, history, write_report, digest, plan.levels)
            night.unwritten.pop("report", None)
        except OSError as exc:
            night.unwritten["report"] = unwritable(exc, plan.out_dir, "report")

    # Coverage is the suite's, not a shard's: one shard measures it for the night.
    if searches:
        night.coverage = nightly_coverage(plan.suite, oracle)
    save()

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    night_started = time.monotonic()
    try:
        for port, spec in zip(ports, specs, strict=True):
            # Each port's items stop when it hangs, or when the night's time runs out.
            box, stopped = WorkBox(plan.time_limit_s, started=night_started), None
            bar, advance = progress(per_port, f"items of port {port.name}") if progress else (None, None)
            # The night writes tables: each result becomes its row at once (a divergent
            # port's layouts, tens of thousands of them, are never all held), and the
            # workers do not send the layouts' chunks back.
            rows: list[dict[str, Any]] = []
            started = time.perf_counter()
            stream = stream_items(
                oracle, port, spec, plan.suite, plan.levels, plan.shard, pool=plan.pool, keep_layouts=False
            )
            try:
                for result in stream:
                    rows.append(result_row(result))
                    if advance is not None:
                        advance(result)
                    stopped = box.stop_after(result)
                    if stopped is not None:
                        # What other workers finished past the stop is left out: the same table for any --jobs.
                        if len(rows) >= per_port:
                            stopped = None  # after its last item: nothing was left unrun
                        else:
                            print(f"parity: port {port.name} stopped: {stopped}", file=sys.stderr)
                        break
            except KeyboardInterrupt:
                night.interrupted = True
                # What workers finished past the last result in order is kept too; what
                # the port did not reach is not-run, so its row can never read PASS.
                rows += [result_row(r) for r in stream.unreported()]
            finally:
                stream.close()
                if bar is not None:
                    bar.stop()
            # Every selected item has its row: what the port did not reach (interrupted,
            # or lost to a harness fault) is not-run, so its row can never read PASS.
            why = (
                INTERRUPTED_WHY
                if night.interrupted
                else f"the run stopped early ({box.short})"
                if stopped
                else LOST_WHY
            )
            finished = {str(row["id"]) for row in rows}
            rows += [result_row(r) for r in unfinished_items(plan.suite, plan.levels, plan.shard, finished, why)]
            baseline = baselines.get(port.name)
            table = check_prefill_layouts(pd.DataFrame(rows, columns=list(COLUMNS)))
            table = judge_port(table, port.name, baseline, plan.levels)
            summary = summarise_table(table, plan.suite.name, port.name, plan.levels, l3_compares(port))
            seconds = time.perf_counter() - started
            night.ports.append(
                PortNight(port.name, table, summary, seconds, baseline.source if baseline else None, stopped)
            )
            if stopped is not None and box.out_of_time:
                night.stopped = stopped
            if night.interrupted or night.stopped:
                break
            night.pending.pop(0)
            save()
        if (
            plan.time_limit_s is not None
            and not night.stopped
            and time.monotonic() - night_started >= plan.time_limit_s
        ):
            # The ports finished in time; the steps after them would not.
            night.stopped = f"the night's time limit ({plan.time_limit_s:g} s, --time-limit) ran out after its ports"
        if mutants and not (night.interrupted or night.stopped):
            night.kill_matrix = _kill_matrix(oracle, plan)
            night.pending.pop(0)
            save()
        # Like coverage, the search is the night's, not a shard's: shard 1 runs it.
        if night.explore_budget_s > 0 and not (night.interrupted or night.stopped):
            for port, spec in zip(ports, specs, strict=True):
                night.explore.append(_explore(oracle, port, spec, plan))
                night.pending.pop(0)
                save()
    except KeyboardInterrupt:
        night.interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    night.complete = not (night.interrupted or night.stopped)
    if night.complete:
        try:
            history = append_history(plan.history, night)
        except OSError as exc:
            night.unwritten["history"] = unwritable(exc, plan.history, "history")
    save()
    return night


def explore_seed(date: str) -> int:
    """Each night searches from a new seed (its date), after replaying the database."""
    return int("".join(ch for ch in date if ch.isdigit()) or "0")


def _explore(oracle: Port, port: Port, spec: str, plan: NightlyPlan) -> dict[str, Any]:
    """``parity explore`` of one port at the night's levels; its JSON form plus its Markdown."""
    from harness.kernels import CpuKernels
    from harness.search.explore import explore

    level = plan.levels[0] if len(plan.levels) == 1 else "all"
    root = plan.explore_dir or plan.out_dir.parent / "explore"
    folder = root / "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in spec)
    seed = explore_seed(plan.date)
    result = explore(oracle, port, spec, level, plan.explore_budget_s, seed, folder, CpuKernels(), pool=plan.pool)
    return {**result.to_json(), "markdown": result.to_markdown("###")}


def _kill_matrix(oracle: Port, plan: NightlyPlan) -> dict[str, Any]:
    """The seeded mutants against tonight's suite (no shrinking: a night has a budget)."""
    from harness.kernels import CpuKernels
    from harness.search.mutants import kill_matrix
    from ports.mutants import MUTANTS, fault_probe

    mutants = [m() for m in MUTANTS.values()]
    rows = kill_matrix(oracle, mutants, plan.suite, plan.levels, CpuKernels(), pool=plan.pool, probe=fault_probe)
    return {"suite": plan.suite.name, "levels": list(plan.levels), "mutants": [r.to_json() for r in rows]}
