"""Write the sparse entries of cases/baselines/equal_share-vs-0.27.1.json from a legacy run.

Usage: ``python tools/measure_legacy_sparse.py RESULTS.parquet`` after
``parity gate --suite ci --port equal_share --oracle vllm==0.27.1 --level sparse-layout``
(and ``--level sparse-mask``, ``--level sparse-prefill``: each level's results
file may be given). Every entry is an oracle refusal of 0.27.1, one per
(family, refusal class), with its exact item count
(:func:`harness.verdicts.baseline.measure_entries`); the baseline's entries of the levels
the given results hold are replaced, the others kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from harness.model.levels import registered_levels
from harness.verdicts.baseline import measure_entries

BASELINE = Path(__file__).resolve().parent.parent / "cases" / "baselines" / "equal_share-vs-0.27.1.json"
SPARSE_LEVELS = tuple(spec.name for spec in registered_levels() if spec.sparse)

# Why 0.27.1 refuses, by a text its refusal class holds.
WHY = {
    "toks <= allgather_offset": (
        "vllm 0.27.1 plans the sparse batch but its DCP context loop cannot run the plan: a chunk's gathered rows "
        "overflow its all-gather slots (where dcp_world_size x interleave does not divide its share)"
    ),
    "reorg_kvcache": (
        "vllm 0.27.1 plans the sparse batch but its DCP reorg_kvcache finds another number of rows than the chunk "
        "holds (its local windows run ahead of the global ones)"
    ),
    "max_context_chunk % dcp_world_size": (
        "vllm 0.27.1 cannot plan the sparse batch: the equal share of its sparse workspace is not a multiple of the "
        "DCP world size (its builder asserts max_context_chunk % dcp_world_size == 0)"
    ),
    "max_context_chunk > 0": (
        "vllm 0.27.1 cannot plan the sparse batch: the equal share of its sparse workspace over the prefills with "
        "context rounds down to no block (its builder asserts max_context_chunk > 0)"
    ),
    "its sparse prefill cannot run: it routes the batch masked-mha-overflow": (
        "vllm 0.27.1 routes the batch to a masked run it cannot make: its chunk masks span the whole batch and the "
        "batch's longest query, and outgrow the mask workspace the pin's per-range masks fit (masked-mha-overflow)"
    ),
    "chunked_prefill_workspace_size % dcp_world_size": (
        "vllm 0.27.1's sparse workspace (no DCP alignment) is not a multiple of the DCP world size, which its "
        "metadata builder asserts before planning any batch"
    ),
}


def main(argv: list[str]) -> int:
    table = pd.concat([pd.read_parquet(path) for path in argv])
    # Only the levels the given results hold are re-measured; the others' entries stay.
    measured = [level for level in SPARSE_LEVELS if (table["level"] == level).any()]
    entries = measure_entries(table[table["level"].isin(measured)], "equal_share", "vllm==0.27.1")
    for entry in entries:
        entry.pop("port")
        if entry["status"] != "oracle-error":
            raise SystemExit(f"not a refusal: {entry} (equal_share must match 0.27.1 wherever it runs)")
        reason = next((why for text, why in WHY.items() if text in entry["error"]), None)
        if reason is None:
            raise SystemExit(f"a refusal of no known class: {entry['error']}")
        entry["reason"] = f"{reason}; measured: {entry['items']} items"
    data = json.loads(BASELINE.read_text(encoding="utf-8"))
    data["entries"] = [e for e in data["entries"] if e["level"] not in measured] + entries
    BASELINE.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"{len(entries)} sparse entries, {sum(e['items'] for e in entries)} items")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
