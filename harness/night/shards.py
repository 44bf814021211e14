"""One night from the outputs of ``parity nightly --shard K/N`` runs
(:func:`merge_nightly_shards`, ``parity nightly --from-shards``).

Invariants a reader must keep: shards merge only when they are of one run (the
same suite, levels and ports) and share :func:`shard_identity` (the pin, the
drift override, the device, the baselines, and the code of the ports and of the
harness by content); every port's items, in suite order, must be exactly the
night's item list (its ``items_digest``): a shard missing, given twice, or of
another run is a :class:`CaseError`, never a smaller night. Each port is judged
against the baseline its shards carry; coverage and the explore search are the
night's, taken from the shard that ran them (shard 1). The merged night is
complete only when every shard is, and only a complete night joins the history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from harness.cases.fields import CaseError
from harness.night.baselines import PortBaseline, judge_port
from harness.night.data import Night, PortNight
from harness.night.drift import latest_drift_report
from harness.night.folder import NIGHT_META, WriteReport, nightly_lock, read_meta, write_night
from harness.night.gpu_report import GPU_REPORTS, latest_gpu_report
from harness.night.history import append_history, read_history
from harness.search.coverage_verdicts import JudgedCoverage
from harness.verdicts.provenance import merged_environment
from harness.verdicts.results_file import items_digest
from harness.verdicts.summary import check_prefill_layouts, summarise_table


def shard_identity(meta: dict[str, Any]) -> dict[str, Any]:
    """What every shard of one night must share besides the suite: the pin, the
    drift override, the device (a night is one oracle on one device), the
    baselines its ports are judged against, and the code of its ports and of
    the harness by content."""
    provenance = meta.get("provenance", {})
    oracle = provenance.get("oracle", {})
    return {
        "pin": f"{oracle.get('release')} @ {oracle.get('upstream_commit')}",
        "oracle_drift_overridden": oracle.get("oracle_drift_overridden"),
        "device": provenance.get("environment", {}).get("device"),
        "baselines": meta.get("baselines", {}),
        "port_digests": meta.get("port_digests"),
        "harness_sources": meta.get("harness_sources"),
    }


def merge_nightly_shards(
    directories: list[Path],
    out_dir: Path,
    history: Path,
    *,
    write_report: WriteReport,
    gpu_reports: Path = GPU_REPORTS,
) -> Night:
    """One night from the outputs of ``parity nightly --shard K/N`` runs, written
    to ``out_dir`` under ``out_dir``'s parent's lock; each port is judged against
    the baseline its shards carry."""
    metas = [read_meta(directory) for directory in directories]
    first = metas[0]
    for directory, meta in zip(directories, metas, strict=True):
        if (meta["suite"], meta["levels"], meta["ports"]) != (first["suite"], first["levels"], first["ports"]):
            raise CaseError(str(directory / NIGHT_META), "suite", "shards of different runs")
        for key, value in shard_identity(meta).items():
            if value != shard_identity(first)[key]:
                shown = value if key != "baselines" else sorted(value)
                theirs = shard_identity(first)[key] if key != "baselines" else sorted(shard_identity(first)[key])
                raise CaseError(str(directory / NIGHT_META), key, f"is {shown!r} but {directories[0]} has {theirs!r}")
    levels = tuple(first["levels"])
    with nightly_lock(out_dir.parent):
        past = read_history(history)
        night = Night(
            first["date"],
            first["suite"],
            sum(m["expected_items"] for m in metas),
            provenance={
                **first["provenance"],
                "environment": merged_environment([m["provenance"].get("environment", {}) for m in metas]),
                "shard": None,
                "merged_from": [str(d) for d in directories],
            },
            complete=all(m["complete"] for m in metas),
            gpu=latest_gpu_report(gpu_reports),
            drift=latest_drift_report(),
            coverage=next(
                (JudgedCoverage.from_json(m["coverage"]) for m in metas if m.get("coverage") is not None), None
            ),
            explore=next((m["explore"] for m in metas if m.get("explore")), []),
            explore_budget_s=max(float(m.get("explore_budget_s", 0.0)) for m in metas),
            baselines={port: PortBaseline.from_json(b) for port, b in first.get("baselines", {}).items()},
            sizes=first.get("sizes") or {},
            port_specs=first.get("port_specs") or {},
        )
        unfinished = [d for d, m in zip(directories, metas, strict=True) if not m["complete"]]
        night.interrupted = bool(unfinished)
        night.pending = [f"shard {d}" for d in unfinished]
        for port in first["ports"]:
            table = pd.concat(
                [pd.read_parquet(d / f"results-{port}.parquet") for d in directories], ignore_index=True
            ).sort_values("index", kind="stable")
            table = table.reset_index(drop=True)
            if (
                first.get("items_digest") is None
                or items_digest([str(i) for i in table["id"]]) != first["items_digest"]
            ):
                raise CaseError(
                    str(directories[0] / NIGHT_META),
                    "items_digest",
                    f"port {port}: the shards' items, in suite order, are not the night's item list "
                    "(a shard missing, given twice, or of another run)",
                )
            baseline = night.baselines.get(port)
            table = judge_port(check_prefill_layouts(table), port, baseline, levels)
            summary = summarise_table(table, night.suite, port, levels)
            night.ports.append(PortNight(port, table, summary, baseline=baseline.source if baseline else None))
        if night.complete:
            past = append_history(history, night)
        write_night(night, out_dir, past, write_report, first.get("items_digest"), levels)
    return night
