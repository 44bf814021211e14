"""The machine-readable result of a run: one JSON document.

Layout: ``{"summary": ..., "provenance": ..., "cases": [per-item result, ...]}``
where each item holds name, family, kind, status, both sides' chunk counts and
per-chunk layouts (``token_to_seq`` fields run-length encoded), and the first
divergence (chunk, field, oracle value, port value) or the error line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.runner import RunResult
from harness.summary import summarise


def run_document(run: RunResult) -> dict[str, Any]:
    return {
        "summary": summarise(run),
        "provenance": run.provenance,
        "cases": [r.to_json() for r in run.results],
    }


def write_json_report(run: RunResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        json.dump(run_document(run), out, separators=(",", ":"), sort_keys=False)
        out.write("\n")
    tmp.replace(path)
