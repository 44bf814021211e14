"""``parity gate``: a suite for a port, judged against its baseline, written as
``summary.md`` (small enough for a PR comment), ``junit.xml`` and
``results.parquet`` (the table of :mod:`harness.verdicts.summary`), plus ``gate.json``
(what ran, for merging shards).

A sharded gate (``--shard K/N``) writes the same files for its share; ``parity
merge`` concatenates shard tables and judges the whole, stale entries included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.cases.fields import CaseError
from harness.cases.json_input import read_json
from harness.verdicts.baseline import (
    BaselineEntry,
    SuiteTargets,
    check_baseline_oracle,
    check_baseline_targets,
    pinned_release,
    port_names,
)
from harness.verdicts.judge import BaselineVerdict, apply_baseline
from harness.verdicts.provenance import merged_environment
from harness.verdicts.results_file import RUN_IDENTITY, items_digest
from harness.verdicts.summary import check_prefill_layouts, summarise_table

if TYPE_CHECKING:
    from harness.cases.suites import Suite

RESULTS, META, SUMMARY, JUNIT = "results.parquet", "gate.json", "summary.md", "junit.xml"


@dataclass
class GateOutcome:
    meta: dict[str, Any]
    summary: dict[str, Any]
    verdict: BaselineVerdict

    @property
    def passed(self) -> bool:
        return self.verdict.passed


def meta_port_names(meta: dict[str, Any]) -> frozenset[str]:
    """The names baseline entries may give the gated port: its ``name`` and,
    when the meta records it, the ``--port`` spelling (``port_spec``)."""
    return port_names(meta["port"], meta.get("port_spec"))


def judge(table: pd.DataFrame, meta: dict[str, Any], entries: list[BaselineEntry], check_stale: bool) -> GateOutcome:
    """The verdict on a run's table. A complete table (``check_stale``: an
    unsharded gate, or merged shards) also checks the baseline against what ran
    (:func:`check_table_baseline`), so an entry naming a case, family or port
    the run cannot have is bad input here even if no earlier check caught it."""
    levels = tuple(meta["levels"])
    if check_stale:
        check_table_baseline(entries, table, meta)
    # An external port's prefill layouts against its L1 answers, also across merged shards.
    table = check_prefill_layouts(table)
    verdict = apply_baseline(table, meta_port_names(meta), entries, levels, check_stale)
    summary = summarise_table(verdict.table, meta["suite"], meta["port"], levels, meta.get("l3_compares"))
    return GateOutcome(meta, summary, verdict)


def check_gate_baseline(
    entries: list[BaselineEntry], suite: Suite, port_name: str, port_spec: str | None, oracle: str | None = None
) -> None:
    """Before a gate runs: the baseline was measured against the run's ``oracle``
    (``vllm==X``; None: the pin), every entry names the port under test (by name
    or by ``port_spec``, the ``--port`` spelling) or a known port, and a case or
    family the whole suite has at the entry's level (whatever ``--level`` or
    ``--shard`` select). Raises :class:`CaseError` (exit 2) otherwise."""
    check_baseline_oracle(entries, oracle or pinned_release())
    check_baseline_targets(entries, SuiteTargets.of_suite(suite), port_names(port_name, port_spec))


def check_table_baseline(entries: list[BaselineEntry], table: pd.DataFrame, meta: dict[str, Any]) -> None:
    """:func:`check_gate_baseline` against a complete results table: the items
    at the levels that ran (entries at other levels cannot change the verdict
    and are left to the pre-run check)."""
    targets = SuiteTargets.of_table(meta["suite"], table, meta["levels"])
    check_baseline_targets(entries, targets, meta_port_names(meta))


def write_tables(outcome: GateOutcome, out_dir: Path) -> None:
    """The machine-readable outputs: ``results.parquet`` (every item, baseline
    columns included) and ``gate.json`` (what ran, for merging shards). The
    human-readable ones are the report writers' (reports/gate_summary.py,
    reports/junit.py)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outcome.verdict.table.to_parquet(out_dir / RESULTS, index=False)
    (out_dir / META).write_text(json.dumps(outcome.meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# What every shard of one gate run shares: the results file's run identity (the
# whole run's item digest, port and spelling, harness, oracle, device), the baseline,
# the port's code (not only its spelling), the case files' contents, the DCP backend
# and the port's time limit.
SHARD_IDENTITY = (*RUN_IDENTITY, "baseline", "port_digest", "cases_digest", "dcp_backend", "timeout")


def load_shard(directory: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    meta_path, results_path = directory / META, directory / RESULTS
    for path in (meta_path, results_path):
        if not path.exists():
            raise CaseError(str(path), None, "missing: not a gate output folder")
    meta = read_json(meta_path, what="not a gate output folder's gate.json")
    if not isinstance(meta, dict):
        raise CaseError(str(meta_path), None, "is not a gate output folder's gate.json (not a JSON object)")
    table = pd.read_parquet(results_path).drop(columns=["baseline", "reason", "baseline_entry"], errors="ignore")
    return table, meta


def merge_shards(directories: list[Path]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One table and one meta from shard outputs, refusing shards of different runs."""
    tables, metas = zip(*(load_shard(d) for d in directories), strict=True)
    first = metas[0]
    for directory, meta in zip(directories, metas, strict=True):
        for key in SHARD_IDENTITY:
            if meta.get(key) != first.get(key):
                raise CaseError(str(directory / META), key, f"differs from {directories[0] / META}: not one run")
    shards = sorted(m["shard"] for m in metas if m.get("shard"))
    count = int(first["shard"].split("/")[1]) if first.get("shard") else 0
    expected = [f"{k}/{count}" for k in range(1, count + 1)]
    if shards != sorted(expected):
        raise CaseError(str(directories[0]), "shard", f"have shards {shards}, need all of {expected}")
    table = pd.concat(tables, ignore_index=True).sort_values("index", kind="stable").reset_index(drop=True)
    if table["index"].duplicated().any():
        raise CaseError(str(directories[0]), "index", "an item appears in two shards")
    if items_digest([str(i) for i in table["id"]]) != first.get("items_digest"):
        raise CaseError(
            str(directories[0] / META),
            "items_digest",
            "the shards' items, in suite order, are not the run's item list: not shards of one run",
        )
    meta = {**first, "shard": None, "merged_from": [str(d) for d in directories]}
    # A shard that stopped early (a hung port, its time limit) says so for the whole merge.
    stops = [f"shard {m.get('shard')}: {m['stopped']}" for m in metas if m.get("stopped")]
    meta.pop("stopped", None)
    if stops:
        meta["stopped"] = "; ".join(stops)
    if isinstance(first.get("provenance"), dict):
        environments = [(m.get("provenance") or {}).get("environment") or {} for m in metas]
        meta["provenance"] = {**first["provenance"], "environment": merged_environment(environments)}
    return table, meta
