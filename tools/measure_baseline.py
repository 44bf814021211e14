"""Write a port's baseline (cases/baselines/equal_share.json) from its gate's results.parquet.

Usage: ``python tools/measure_baseline.py reports/out/gate-equal_share/results.parquet OUT.json``
after ``parity gate --suite ci --port equal_share`` (without a baseline, or with
one: the table's statuses are what is measured). Caps are exactly the measured
maxima per (level, family, status[, first divergent field]) group
(:func:`harness.verdicts.baseline.measure_entries`); a port-error group is split by kind
of error (:data:`PORT_ERRORS`), each entry with its exact item count (``items``:
:mod:`harness.verdicts.judge`); every reason is written from the group's
measurements. Re-run it whenever the ci suite or the oracle's numerics
change; re-measuring the same run gives the same bytes.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from typing import Any

import pandas as pd

from harness.verdicts.baseline import divergent_field, measure_entries

FIELD_WHY: dict[str, str] = {
    "num_chunks": (
        "the grid needs another number of chunks (ceil(max context / equal share) chunks, "
        "each spanning the whole batch)"
    ),
    "request_start": (
        "a grid chunk spans the whole batch from request 0, where the oracle's chunk starts at a later request"
    ),
    "request_end": "a grid chunk spans the whole batch, where the oracle's chunk ends at an earlier request",
    "token_start": "a grid chunk covers every query token from 0",
    "token_end": "a grid chunk covers every query token of the batch",
    "continuation_token_end": "the grid merges every later chunk over the whole batch",
    "is_continuation": "every later grid chunk is a continuation over the whole batch",
    "num_context_tokens": "the grid's equal-share windows gather another number of rows per chunk",
    "query_start_loc": "a grid chunk carries the whole batch's query_start_loc",
    "starts": "the grid's windows start every request at j * share",
    "seq_lens": "the grid's windows cut each request at multiples of the equal share",
    "cu_seq_lens": "the grid's windows cut each request at multiples of the equal share",
    "empty_token_slices": "the grid keeps zero-context requests inside its chunks, so it reports no empty token slices",
    "local_starts": "under DCP the grid's windows start every request at padded(j * share)",
    "workspace_size": "the legacy sizing keeps the max_num_seqs x block_size floor that seeds/004 removed",
}


# Why 0.27.1's sparse plan (ports/equal_share/sparse.py) differs from the pin's, by first field.
SPARSE_FIELD_WHY: dict[str, str] = {
    "workspace_size": "its sparse workspace keeps the max_num_seqs x block_size floor (seeds/004) and no DCP alignment",
    "sparse_workspace_size": (
        "its sparse workspace keeps the max_num_seqs x block_size floor (seeds/004) and no DCP alignment"
    ),
    "masks_fit": "it has no check that the suffix and chunk masks fit the mask workspace (None)",
    "global_mask_fits": "its global mask fits a fixed 64 MiB, not the mask workspace",
    "suffix_mask_shape": "its suffix reads another mask (the global one fits 64 MiB where the pin's misses, or back)",
    "mask_shape": "its chunk attention runs over the whole batch's queries, so each chunk mask spans every request",
    "use_masked_mha": "masked MHA on the threshold alone, without the fit check",
    "route": "masked MHA on the threshold alone, without the fit check",
    **{
        f: f"the equal-share grid plans other chunks ({f})"
        for f in (
            "num_chunks",
            "request_start",
            "request_end",
            "token_start",
            "token_end",
            "continuation_token_end",
            "is_continuation",
            "num_context_tokens",
            "query_start_loc",
            "starts",
            "seq_lens",
            "cu_seq_lens",
            "empty_token_slices",
            "max_seq_len",
            "max_query_len",
            "token_to_seq",
            "local_starts",
        )
    },
}


# "... over N prefills is below one block (B rows)" or "... over N prefills (S rows)
# is not a multiple of the DCP world size D": the refusal is the clause after the
# prefill count, without its numbers.
REFUSAL = re.compile(r" prefills (?:\(\d+ rows\) )?(?P<refusal>.+?)(?: \(\d+ rows\)| \d+)?$")


def refusal_reasons(details: list[str]) -> str:
    """The port's own refusals, one clause per kind with its item count and an
    example, most frequent first: what the reason says is what was measured."""
    by_refusal: dict[str, list[str]] = {}
    for detail in details:
        match = REFUSAL.search(detail)
        assert match is not None, detail
        by_refusal.setdefault(match["refusal"], []).append(detail)
    if len(by_refusal) == 1:
        ((refusal, texts),) = by_refusal.items()
        return f'the equal share of the workspace {refusal}, e.g. "{min(texts)}"'
    ranked = sorted(by_refusal.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return "; ".join(
        f'in {len(texts)} the equal share of the workspace {refusal}, e.g. "{min(texts)}"' for refusal, texts in ranked
    )


EQUAL_SHARE_REFUSAL = "ValueError: equal share of a "
# Each kind of error equal_share may raise, by the text every such error holds,
# and the reason its entry gives.
PORT_ERRORS: dict[str, str] = {
    EQUAL_SHARE_REFUSAL: "",
    "of its rows, its layout says": (
        "under DCP the legacy grid's local windows place another number of rows on the ranks than its chunk "
        "holds, so its DCP step cannot reorder them (vllm 0.27.1, whose windows these are, refuses every one of "
        'these batches too, by its DCP loop\'s assertions); measured: {n} items, e.g. "{example}"'
    ),
    "which has no prefill loop here": (
        "the sparse path as vllm 0.27.1 had it routes these batches to a masked run it cannot make "
        "(masked-mha-overflow: its chunk masks span the whole batch and outgrow the mask workspace the pin's "
        'per-range masks fit), so it has no prefill to compare; measured: {n} items, e.g. "{example}"'
    ),
}


def main(argv: list[str]) -> int:
    table = pd.read_parquet(argv[0])
    out = argv[1]
    entries: list[dict[str, Any]] = measure_entries(table, "equal_share")
    failing = table[table["status"].isin(["divergent", "port-error"])]
    extra: list[dict[str, Any]] = []

    for e in entries:
        g = failing[
            (failing["level"] == e["level"]) & (failing["family"] == e["family"]) & (failing["status"] == e["status"])
        ]
        if "field" in e:
            g = g[[divergent_field(str(d)) == e["field"] for d in g["detail"]]]
        n = len(g)
        # A port-error entry counts its items exactly (per kind of error, below); the others do not.
        measured = e.pop("items")
        assert measured == n, (e, n)
        if e["status"] == "port-error":
            kinds = {kind: [str(d) for d in g["detail"] if kind in str(d)] for kind in PORT_ERRORS}
            unknown = set(map(str, g["detail"])) - {t for texts in kinds.values() for t in texts}
            assert not unknown, f"port errors of no known kind: {sorted(unknown)}"
            # Each error of one kind only: the kinds' counts add up to the group's.
            assert sum(map(len, kinds.values())) == n, (e, {kind: len(texts) for kind, texts in kinds.items()})
            split = []
            for kind, texts in kinds.items():
                if texts:
                    reason = (
                        f"the legacy grid cannot plan these {len(texts)} batches: " + refusal_reasons(texts)
                        if kind == EQUAL_SHARE_REFUSAL
                        else PORT_ERRORS[kind].format(n=len(texts), example=min(texts))
                    )
                    split.append({**e, "error": kind, "items": len(texts), "reason": reason})
            e.update(split[0])
            extra += split[1:]
        elif e["level"] == "sparse-layout":
            field = e.get("field", "")
            why = SPARSE_FIELD_WHY.get(field, f"0.27.1's sparse plan differs first in {field}")
            e["reason"] = f"the sparse path as vllm 0.27.1 had it (SPEC 1d): {why}; measured: {n} items"
        elif e["level"] == "layout":
            field = e["field"]
            why = FIELD_WHY.get(field, f"the grid's chunks differ first in {field}")
            e["reason"] = f"legacy equal-share grid (SPEC 1a): {why}; measured: {n} items diverge first at {field}"
            if field == "workspace_size":
                e["reason"] = f"{why}; measured: {n} configurations"
            if field == "sparse_workspace_size":
                e["reason"] = f"{SPARSE_FIELD_WHY[field]}; measured: {n} configurations"
        elif e["level"] == "sparse-prefill":
            frac = e["max_mismatch_fraction"]
            loop = (
                "the legacy grid in 0.27.1's sparse workspace (the dense-MHA route)"
                if e["family"] == "sparse-dense-route"
                else "0.27.1's masked loop (every chunk with rows attends with the whole batch's queries and is "
                "folded by a plain merge; its final merge covers the tokens before the first request without "
                "context; keyless rows of a chunk's other requests are folded as the kernel reports them)"
            )
            e["reason"] = (
                f"the sparse path as vllm 0.27.1 had it (SPEC 1d): {loop} folds the context in another order: "
                f"measured on {n} items, up to {e['max_ulp']} ULP and up to {frac:.1%} of an item's elements differ"
            )
        else:
            frac = e["max_mismatch_fraction"]
            hist = [json.loads(h) for h in g["histogram"]]
            small = sum(v for h in hist for k, v in h.items() if k in ("1", "2", "3-4", "5-8"))
            total = sum(v for h in hist for v in h.values())
            large = max(sum(v for k, v in h.items() if k in ("257-1024", "1025-1048576")) for h in hist)
            tail = (
                f"; at most {large} elements of an item beyond 256 ULP (results near zero, where cancellation "
                "leaves few significant bits and in bf16 the sign can flip: the ULP distance then counts every value "
                "across zero)"
                if large
                else ""
            )
            e["reason"] = (
                "the grid cuts the context at other chunk boundaries, so the context partial is folded in another "
                f"order and rounds differently: measured on {n} items, up to {e['max_ulp']} ULP and up to "
                f"{frac:.1%} of an item's elements differ; {small / total:.0%} of the differing elements are "
                f"within 8 ULP{tail}"
            )
        # key order: port-less (file port), target, level, status, caps/field/error, count, reason
        e.pop("port")
        order = ["family", "level", "status", "max_ulp", "max_mismatch_fraction", "field", "error", "items", "reason"]
        e_sorted = {k: e[k] for k in order if k in e}
        e.clear()
        e.update(e_sorted)
    for e in extra:
        e.pop("port", None)
    entries += extra
    entries.sort(key=lambda e: (e["family"], e["level"], e["status"], e.get("field", ""), e.get("error", "")))

    with open(out, "w", encoding="utf-8") as f:
        json.dump({"port": "equal_share", "entries": entries}, f, indent=2)
        f.write("\n")
    print(len(entries), "entries;", dict(Counter((e["level"], e["status"]) for e in entries)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
