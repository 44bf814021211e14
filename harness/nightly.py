"""Running the nightly sweep: every port, incremental writes, interruption.

The report is rewritten after every port, and first of all before any work, so
a run killed at any point leaves a readable report; only a run that finishes
marks it complete and appends to the history store. SIGINT and SIGTERM stop
the run gracefully: what finished is kept and the report says INCOMPLETE.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.cases import CaseError
from harness.coverage import JudgedCoverage, nightly_coverage
from harness.port import Port
from harness.provenance import collect
from harness.results_file import items_digest
from harness.runner import CaseResult, Shard, count_items, run_items, selected_item_ids
from harness.suites import Suite
from harness.summary import results_table, summarise_table
from reports.gpu import GPU_REPORTS, latest_gpu_report
from reports.nightly import Night, PortNight, write_night

NIGHT_META = "night.json"


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


def _write_meta(night: Night, plan_levels: tuple[str, ...], out_dir: Path, digest: str | None = None) -> None:
    meta = {
        # Every port's items of the whole night (all shards), so merging can prove its shards add up to it.
        "items_digest": digest,
        "date": night.date,
        "suite": night.suite,
        "levels": list(plan_levels),
        "expected_items": night.expected_items,
        "complete": night.complete,
        "ports": [p.port for p in night.ports],
        "provenance": night.provenance,
        # The suite's coverage (measured once per night: by an unsharded run or shard 1).
        "coverage": night.coverage.to_json() if night.coverage else None,
        # Explore runs once per night (unsharded, or shard 1); its budget says whether it was asked for.
        "explore_budget_s": night.explore_budget_s,
        "explore": night.explore,
    }
    (out_dir / NIGHT_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _save(night: Night, plan: NightlyPlan) -> None:
    write_night(night, plan.out_dir, plan.history)
    _write_meta(night, plan.levels, plan.out_dir, items_digest(selected_item_ids(plan.suite, plan.levels)))


ProgressFactory = Callable[[int], tuple[Any, Any]]


def run_nightly(
    plan: NightlyPlan,
    oracle: Port,
    ports: list[Port],
    oracle_provenance: dict[str, Any],
    progress: ProgressFactory | None = None,
) -> Night:
    per_port = count_items(plan.suite, plan.levels, plan.shard)
    night = Night(plan.date, plan.suite.name, per_port * len(ports), provenance=collect(oracle_provenance))
    night.provenance["shard"] = str(plan.shard) if plan.shard else None
    night.gpu = latest_gpu_report(plan.gpu_reports)
    # Only the shard that searches (shard 1, or the whole night) owes a search.
    searches = plan.shard is None or plan.shard.number == 1
    night.explore_budget_s = plan.explore_budget_s if searches else 0.0
    # Coverage is the suite's, not a shard's: one shard measures it for the night.
    if plan.shard is None or plan.shard.number == 1:
        night.coverage = nightly_coverage(plan.suite, oracle)
    _save(night, plan)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    interrupted = False
    try:
        for port in ports:
            bar, advance = progress(per_port) if progress else (None, None)
            results: list[CaseResult] = []
            started = time.perf_counter()
            try:
                for result in run_items(oracle, port, plan.suite, plan.levels, plan.shard):
                    results.append(result)
                    if advance is not None:
                        advance(result)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                if bar is not None:
                    bar.stop()
            table = results_table(results)
            summary = summarise_table(table, plan.suite.name, port.name, plan.levels)
            night.ports.append(PortNight(port.name, table, summary, time.perf_counter() - started))
            _save(night, plan)
            if interrupted:
                break
        if plan.mutants and plan.shard is None and not interrupted:
            night.kill_matrix = _kill_matrix(oracle, plan)
            _save(night, plan)
        # Like coverage, the search is the night's, not a shard's: shard 1 runs it.
        if night.explore_budget_s > 0 and not interrupted:
            for port, spec in zip(ports, plan.port_specs or [p.name for p in ports], strict=True):
                night.explore.append(_explore(oracle, port, spec, plan))
                _save(night, plan)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    night.complete = not interrupted
    _save(night, plan)
    return night


def explore_seed(date: str) -> int:
    """Each night searches from a new seed (its date), after replaying the database."""
    return int("".join(ch for ch in date if ch.isdigit()) or "0")


def _explore(oracle: Port, port: Port, spec: str, plan: NightlyPlan) -> dict[str, Any]:
    """``parity explore`` of one port at the night's levels; its JSON form plus its Markdown."""
    from harness.explore import explore
    from harness.kernels import CpuKernels

    level = plan.levels[0] if len(plan.levels) == 1 else "all"
    root = plan.explore_dir or plan.out_dir.parent / "explore"
    folder = root / "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in spec)
    result = explore(oracle, port, spec, level, plan.explore_budget_s, explore_seed(plan.date), folder, CpuKernels())
    return {**result.to_json(), "markdown": result.to_markdown("###")}


def _kill_matrix(oracle: Port, plan: NightlyPlan) -> dict[str, Any]:
    """The seeded mutants against tonight's suite (no shrinking: a night has a budget)."""
    from harness.kernels import CpuKernels
    from harness.mutants import kill_matrix
    from ports.mutants import MUTANTS

    rows = kill_matrix(oracle, [m() for m in MUTANTS.values()], plan.suite, plan.levels, CpuKernels())
    return {"suite": plan.suite.name, "levels": list(plan.levels), "mutants": [r.to_json() for r in rows]}


def shard_identity(meta: dict[str, Any]) -> dict[str, Any]:
    """What every shard of one night must share besides the suite: the pin, the
    drift override and the device (a night is one oracle on one device)."""
    provenance = meta.get("provenance", {})
    oracle = provenance.get("oracle", {})
    return {
        "pin": f"{oracle.get('release')} @ {oracle.get('upstream_commit')}",
        "oracle_drift_overridden": oracle.get("oracle_drift_overridden"),
        "device": provenance.get("environment", {}).get("device"),
    }


def merge_nightly_shards(
    directories: list[Path], out_dir: Path, history: Path, gpu_reports: Path = GPU_REPORTS
) -> Night:
    """One night from the outputs of ``parity nightly --shard K/N`` runs."""
    metas = []
    for directory in directories:
        path = directory / NIGHT_META
        if not path.exists():
            raise CaseError(str(path), None, "missing: not a nightly output folder")
        metas.append(json.loads(path.read_text(encoding="utf-8")))
    first = metas[0]
    for directory, meta in zip(directories, metas, strict=True):
        if (meta["suite"], meta["levels"], meta["ports"]) != (first["suite"], first["levels"], first["ports"]):
            raise CaseError(str(directory / NIGHT_META), "suite", "shards of different runs")
        for key, value in shard_identity(meta).items():
            if value != shard_identity(first)[key]:
                raise CaseError(
                    str(directory / NIGHT_META),
                    key,
                    f"is {value!r} but {directories[0]} has {shard_identity(first)[key]!r}",
                )
    levels = tuple(first["levels"])
    night = Night(
        first["date"],
        first["suite"],
        sum(m["expected_items"] for m in metas),
        provenance={**first["provenance"], "shard": None, "merged_from": [str(d) for d in directories]},
        complete=all(m["complete"] for m in metas),
        gpu=latest_gpu_report(gpu_reports),
        coverage=next((JudgedCoverage.from_json(m["coverage"]) for m in metas if m.get("coverage") is not None), None),
        explore=next((m["explore"] for m in metas if m.get("explore")), []),
        explore_budget_s=max(float(m.get("explore_budget_s", 0.0)) for m in metas),
    )
    for port in first["ports"]:
        table = pd.concat(
            [pd.read_parquet(d / f"results-{port}.parquet") for d in directories], ignore_index=True
        ).sort_values("index", kind="stable")
        table = table.reset_index(drop=True)
        if first.get("items_digest") is None or items_digest([str(i) for i in table["id"]]) != first["items_digest"]:
            raise CaseError(
                str(directories[0] / NIGHT_META),
                "items_digest",
                f"port {port}: the shards' items, in suite order, are not the night's item list "
                "(a shard missing, given twice, or of another run)",
            )
        night.ports.append(PortNight(port, table, summarise_table(table, night.suite, port, levels)))
    write_night(night, out_dir, history)
    _write_meta(night, levels, out_dir, first.get("items_digest"))
    return night
