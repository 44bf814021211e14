"""The ``sparse-decisions`` family: sparse batches built in pairs, so that every
condition of every sparse decision (harness/search/decisions_sparse.py) has an
item on each side of it with the others held still, the pair MC/DC asks for.

Generated from the declared tables, not listed by hand:

- every entry of the masked-MHA threshold table (each backend, TP size and
  bucket): the longest query at the entry's minimum and one below, with the
  longest sequence at the bucket's edge; and every bucket edge, the longest
  sequence at the edge and one past it with a query the two buckets read
  differently (edges whose buckets share a minimum have none);
- the dense-route edge (longest sequence at ``index_topk`` and one past) under
  ``force_mqa`` and ``force_masked_mha`` on and off;
- the mask workspace at each fit's edge (the suffix mask, the mask over the
  longest chunk's keys, the global mask): exactly the words it needs, and one
  fewer;
- masked runs that overflow by one word at one mask position alone (the
  suffix, the only chunk, the first, an inner and the last of three chunks),
  each beside the same batch in a workspace of exactly the words it needs;
- DCP worlds 1 and 2, with and without context, under each forcing flag
  (none, dense, masked, MQA), within ``index_topk`` and past it;
- forced masked MHA with context under DCP worlds 2 and 1, the mask workspace
  at the suffix mask's edge: the suffix's run comes before the context loop's
  DCP refusal, so one word fewer turns the refusal into an overflow.

The arithmetic here only aims: every item is judged by both sides, and the
MC/DC measurement reads the oracle's answers, never these numbers.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from harness.model.sparse import (
    MASKED_MHA_THRESHOLDS,
    SEQ_LEN_EDGES,
    SparseCase,
    edge_query,
    mask_words,
)

FAMILY = "sparse-decisions"
# A sparse workspace of 512 rows: 8 * max_model_len (64) binds, under 1 * 2048 (seqs * topk).
SMALL_WORKSPACE = {"max_model_len": 64, "max_num_seqs": 1, "block_size": 16, "index_topk": 2048}
SMALL_ROWS = 512
LONG = {"max_model_len": 163840, "max_num_seqs": 256, "block_size": 64, "index_topk": 2048}


def _case(context: list[int], query: list[int], **settings: Any) -> SparseCase:
    return SparseCase("", tuple(context), tuple(query), family=FAMILY, **settings)


def _threshold_cases() -> list[SparseCase]:
    cases = []
    for (backend, tp), minimums in MASKED_MHA_THRESHOLDS.items():
        row = {"backend": backend, "tensor_parallel_size": tp, **LONG}
        for bucket, needed in enumerate(minimums):
            edge = SEQ_LEN_EDGES[bucket]
            if needed is not None:
                cases += [_case([edge - q], [q], **row) for q in (needed - 1, needed) if 0 < q <= edge]
            query = edge_query(minimums, bucket)
            if query is not None:
                cases += [_case([seq - query], [query], **row) for seq in (edge, edge + 1)]
    return cases


def _route_edge_cases() -> list[SparseCase]:
    # Past index_topk the batch still takes MHA by the threshold (FLASHMLA TP 8: 512 from 2048 up).
    cases = []
    for force_mqa, force_masked, seq in itertools.product((False, True), (False, True), (2048, 2049)):
        cases.append(
            _case(
                [seq - 600],
                [600],
                tensor_parallel_size=8,
                force_mqa=force_mqa,
                force_masked_mha=force_masked,
                **LONG,
            )
        )
    return cases


def _at_fit_edges(case: SparseCase, words: int) -> list[SparseCase]:
    return [replace(case, mask_workspace_words=w) for w in (words, words - 1)]


def _fit_cases() -> list[SparseCase]:
    settings = {"tensor_parallel_size": 8, **SMALL_WORKSPACE}
    suffix_only = _case([0, 0], [600, 300], **settings)
    with_context = _case([SMALL_ROWS, 100], [40, 20], **settings)
    masked = replace(with_context, force_masked_mha=True)
    return (
        _at_fit_edges(suffix_only, mask_words(2, 600, 600))
        # The longest chunk (512 keys) needs more words than the suffix (40 keys).
        + _at_fit_edges(with_context, mask_words(2, 40, SMALL_ROWS))
        + _at_fit_edges(masked, mask_words(2, 40, SMALL_ROWS + 40, key_starts_word=True))
    )


def _overflow_cases() -> list[SparseCase]:
    """Each request fills one chunk of the 512-row workspace; a query of 129 rows
    pads to 256 and doubles its chunk's mask. Forced masked MHA (within index_topk)."""
    forced = {"force_masked_mha": True, **SMALL_WORKSPACE}
    full = SMALL_ROWS
    layouts = {
        "suffix": ([full, full, full], [256, 256, 256]),
        "only_chunk": ([full], [129]),
        "first_chunk": ([full, full, full], [129, 1, 1]),
        "inner_chunk": ([full, full, full], [1, 129, 1]),
        "last_chunk": ([full, full, full], [1, 1, 129]),
    }
    cases = []
    for context, query in layouts.values():
        batch, longest_query = len(query), max(query)
        chunk_masks = [mask_words(1, q, full) for q in query]
        largest = max(mask_words(batch, longest_query, longest_query), *chunk_masks)
        cases += _at_fit_edges(_case(context, query, **forced), largest)
    return cases


def _forcing_cases() -> list[SparseCase]:
    flags: tuple[dict[str, bool], ...] = (
        {},
        {"force_dense_mha": True},
        {"force_masked_mha": True},
        {"force_mqa": True},
    )
    cases = []
    for flag, world, context, seq in itertools.product(flags, (1, 2), (0, 256), (1024, 4096)):
        query = seq - context
        cases.append(
            _case(
                [context, 0],
                [query, 16],
                dcp_world_size=world,
                tensor_parallel_size=8,
                **flag,
                **LONG,
            )
        )
    return cases


def _refusal_order_cases() -> list[SparseCase]:
    settings = {"force_masked_mha": True, "tensor_parallel_size": 8, **SMALL_WORKSPACE}
    with_context = _case([SMALL_ROWS, 100], [40, 20], **settings)
    # The chunk's 512 keys need more words than the suffix's 40: past the suffix, a chunk overflows.
    suffix_words = mask_words(2, 40, 40)
    return [
        replace(case, dcp_world_size=world) for world in (2, 1) for case in _at_fit_edges(with_context, suffix_words)
    ]


def decision_cases() -> list[SparseCase]:
    """Every aimed batch of the family, unnamed, in a fixed order (a new kind
    of batch goes at the end, so that the earlier items keep their names)."""
    return (
        _threshold_cases()
        + _route_edge_cases()
        + _fit_cases()
        + _overflow_cases()
        + _forcing_cases()
        + _refusal_order_cases()
    )


def generate_decision_cases(seed: int, count: int) -> list[SparseCase]:
    """The family's first ``count`` batches (all of them at most once), named as
    the other sparse families' items are."""
    aimed = decision_cases()[:count]
    return [replace(case, name=f"{FAMILY}-{seed % 10000:04d}-{i:04d}") for i, case in enumerate(aimed)]
