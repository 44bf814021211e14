"""The generated sparse L3 (``sparse-prefill``) cases, aimed at the masked
loop: the drawn families (:data:`PREFILL_FAMILIES`) and the aimed
:data:`ROWS_FAMILY`. Cases only, no tensors: loading a suite imports no torch
(their tensors are :mod:`harness.kernels.sparse_prefill`'s)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from harness.model import KEYLESS_ROWS, PRESETS
from harness.model.sparse import ROW_SELECTIONS, SELECTIONS, SparseCase

PREFILL_FAMILIES = ("sparse-masked-global", "sparse-masked-ranges", "sparse-masked-suffix", "sparse-dense-route")
# Aimed, not drawn: full rows on batches that take masked MHA by the threshold
# (not forced), with the global mask and per range; the other row selections.
ROWS_FAMILY = "sparse-l3-rows"


def _workspace_rows(max_model_len: int, max_num_seqs: int, block: int, topk: int) -> int:
    """The sparse workspace this generator aims at (its own arithmetic; both sides
    still size it themselves)."""
    return max(min(max(8 * max_model_len, 4 * max_num_seqs * block), 65536, max_num_seqs * topk), block)


def _mask_words(batch: int, max_query: int, max_keys: int, reserve: bool = False) -> int:
    tile = 128 if max_query <= 128 else 256
    return batch * (-(-max_query // tile) * tile) * (-(-max_keys // 32) + int(reserve))


def _prefill_case(rng: random.Random, family: str, name: str, index: int) -> SparseCase:
    block = rng.choice((1, 16, 16, 64))
    requests = rng.randint(1, 6)
    query = [rng.choice((1, rng.randint(1, 40), rng.randint(100, 140))) for _ in range(requests)]
    if family == "sparse-masked-suffix":
        context = [0] * requests
    elif family == "sparse-masked-ranges":
        # A long request first, short ones after: its last piece shares a chunk
        # with the requests that follow it.
        requests = max(requests, 3)
        query += [rng.randint(1, 40) for _ in range(requests - len(query))]
        context = [rng.randint(150, 400)] + [rng.choice((0, rng.randint(1, 40))) for _ in range(requests - 1)]
    else:
        context = [rng.choice((0, rng.randint(1, 40), rng.randint(60, 400))) for _ in range(requests)]
        if not any(context):
            context[rng.randrange(requests)] = rng.randint(60, 400)
    max_seq = max(c + q for c, q in zip(context, query, strict=True))
    # A small workspace (the 8 * max_model_len term) cuts contexts into pieces.
    max_model_len = rng.choice((4, 8, 16, 32))
    max_num_seqs = rng.choice((1, 2, 4))
    topk = max_seq + rng.choice((0, 1, 100))
    mask_words = None
    if family == "sparse-masked-ranges":
        # A 128-row workspace (4 * 2 sequences * 16 rows): room for the suffix's
        # and every chunk's per-range mask, not for the global one.
        max_model_len, max_num_seqs, block = 8, 2, 16
        workspace = _workspace_rows(max_model_len, max_num_seqs, block, topk)
        mask_words = _mask_words(requests, max(query), max(max(query), workspace))
    dtypes = ("bf16", "fp16", "fp32")
    numeric = replace(
        PRESETS[rng.choice(("tiny", "narrow"))],
        dtype=dtypes[index % 3],
        seed=rng.randrange(1 << 31),
        keyless_rows=KEYLESS_ROWS[(index // 3) % len(KEYLESS_ROWS)],
    )
    return SparseCase(
        name,
        tuple(context),
        tuple(query),
        block,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        index_topk=topk,
        backend="FLASHMLA_SPARSE",
        tensor_parallel_size=8,
        mask_workspace_words=mask_words,
        # Masked MHA on a batch within index_topk is forced; the dense route is
        # what such a batch takes unforced.
        force_masked_mha=family != "sparse-dense-route",
        family=family,
        numeric=numeric,
        selection=SELECTIONS[index % len(SELECTIONS)],
    )


def _rows_cases(seed: int) -> list[SparseCase]:
    """Full rows where masked MHA is reached by the threshold on the CPU
    (FLASHMLA_SPARSE, TP 8: a longest query of 512 under the 2048 ceiling;
    index_topk 64 below the longest sequence, so not dense), the narrow heads
    keeping 552 tokens affordable: a request of 512 new tokens after 600 of
    context (three chunks of the 256-row sparse workspace: 4 sequences x 64) and
    one of 40 without context, once with the global mask (the 128 MiB workspace)
    and once per range (a workspace that holds the per-range masks, not the
    global one). Then each other row selection on a small forced masked batch
    (index_topk the longest sequence: its last token's row is full)."""
    cases = []
    # The per-range batch first, the small ones next, the global one last: ci takes the first four.
    shapes: list[tuple[str, dict[str, Any]]] = [
        ("full", {"context": (600, 0), "query": (512, 40), "topk": 64, "words": 20000, "forced": False}),
    ]
    shapes += [
        (selection, {"context": (150, 0, 20), "query": (40, 7, 20), "topk": 190, "words": 3000, "forced": True})
        for selection in ROW_SELECTIONS[1:]
    ]
    shapes.append(("full", {"context": (600, 0), "query": (512, 40), "topk": 64, "words": None, "forced": False}))
    for index, (selection, shape) in enumerate(shapes):
        numeric = replace(
            PRESETS["narrow"],
            dtype=("bf16", "fp16", "fp32")[index % 3],
            seed=seed + index,
            keyless_rows=KEYLESS_ROWS[index % len(KEYLESS_ROWS)],
        )
        cases.append(
            SparseCase(
                f"{ROWS_FAMILY}-{seed % 10000:04d}-{index:04d}",
                shape["context"],
                shape["query"],
                16,
                max_model_len=163840 if not shape["forced"] else 8,
                max_num_seqs=4 if not shape["forced"] else 2,
                index_topk=shape["topk"],
                backend="FLASHMLA_SPARSE",
                tensor_parallel_size=8,
                mask_workspace_words=shape["words"],
                force_masked_mha=shape["forced"],
                family=ROWS_FAMILY,
                numeric=numeric,
                selection=selection,
            )
        )
    return cases


def generate_sparse_prefill(seed: int, count: int, families: list[str] | None = None) -> list[SparseCase]:
    """``count`` sparse L3 cases dealt round-robin over ``families`` (default the
    drawn ones), or the first ``count`` of the aimed :data:`ROWS_FAMILY` named alone."""
    if families == [ROWS_FAMILY]:
        return _rows_cases(seed)[:count]
    rng = random.Random(seed)
    chosen = families or list(PREFILL_FAMILIES)
    out = []
    for i in range(count):
        family = chosen[i % len(chosen)]
        out.append(_prefill_case(rng, family, f"{family}-{seed % 10000:04d}-{i:04d}", i))
    return out
