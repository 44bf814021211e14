"""The machine-readable result of a run: one JSON document.

Layout: ``{"summary": ..., "provenance": ..., "cases": [per-item result, ...]}``
where each item holds name, family, kind, status, both sides' chunk counts and
per-chunk layouts (``token_to_seq`` fields run-length encoded), tensor
verdicts (``max_ulp``: the raw distance, ``2**62`` when an infinity differs and
``2**63 - 1`` when a NaN does; ``max_ulp_of_larger``: the error in ULPs of the
larger value; ``nan_mismatches`` and ``inf_mismatches``; the histogram in
numeric bucket order), and the first divergence (chunk, field, oracle value, port value) or
the error line. The document holds no timings, so the same run gives the same
bytes. Items resumed from a results file (``--resume``) are counted in the
summary but their layouts are not re-derived: ``cases`` lists what this
process computed, ``resumed_items`` how many came from the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.sides.items import RunResult
from harness.verdicts.summary import summarise_table


def run_document(run: RunResult, table: pd.DataFrame) -> dict[str, Any]:
    return {
        "summary": summarise_table(table, run.suite, run.port, run.levels, run.l3_compares),
        "provenance": run.provenance,
        "resumed_items": len(table) - len(run.results),
        "cases": [r.to_json() for r in run.results],
    }


def write_json_report(run: RunResult, path: Path, table: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        json.dump(run_document(run, table), out, separators=(",", ":"))
        out.write("\n")
    tmp.replace(path)
