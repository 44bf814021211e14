"""Measured coverage of the sparse path (features ``sparse.*``, ``mask.*`` and
``sparse_grid.*`` of :mod:`harness.search.coverage`): what a suite's sparse items make
upstream's sparse backend decide, read from the *oracle's* sparse layouts.

- ``sparse``: every sparse batch's route, the ``index_topk`` classes, the
  threshold table's sequence-length buckets and their edges (one below, at,
  one above), the dense-route edge (longest sequence vs ``index_topk``), the
  longest query against its bucket's minimum, both fit verdicts with their
  by-one edges, the 128/256 tile switch, global vs per-range masks, the forcing
  flags;
- ``mask``: the forms, the tile switch and the 32-key word edges of the mask
  cases, the indices that sit on a range's end (the row after a range) and
  in continuation pieces, and rows full, single and empty;
- ``sparse_grid``: which term of the sparse workspace size binds;
- ``sparse_l3``: the sparse L3 batches' routes and mask forms (global, per
  range, suffix only), dtypes, keyless-row behaviours and selection patterns,
  rows full, single and empty, batches routed to masked MHA by the threshold
  rather than forced, and what their top-k indices make the masked loop do: continuation pieces,
  chunks of many requests, indices on a piece's first or last row, and tokens
  that select no key of a chunk (keyless rows inside a chunk).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from harness.model.sparse import (
    MASK_FORMS,
    MASKED_MHA_THRESHOLDS,
    PINNED_MASK_WORKSPACE_WORDS,
    ROUTES,
    SEQ_LEN_EDGES,
    Route,
)
from harness.search.coverage_feature import Feature, FeatureTally

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.protocol.port import Port

BUCKETS = ("2048", "4096", "8192", "16384", "32768", "beyond")
EDGE_LABELS = tuple(f"{edge}{d}" for edge in BUCKETS[:-1] for d in ("-1", "", "+1"))
ROUTE_LABELS: tuple[str, ...] = ROUTES
FIT_LABELS = ("fits", "misses", "fits-exactly", "misses-by-one")
TERMS = ("8*max_model_len", "4*max_num_seqs*block_size", "65536", "max_num_seqs*index_topk", "block_size floor")
MINIMUMS = MASKED_MHA_THRESHOLDS
EDGES = SEQ_LEN_EDGES
L3_FORMS = ("global", "per-range", "suffix-only")
# A top-k row by its valid indices: index_topk of them, exactly one, none.
ROW_FILLS = ("full", "single", "empty")


def _row_fills(tally: FeatureTally, feature: str, topk: Any, index_topk: int) -> None:
    valid = (topk >= 0).sum(dim=-1)
    for label, count in (("full", index_topk), ("single", 1), ("empty", 0)):
        if bool((valid == count).any()):
            tally.add(feature, label)


def sparse_features(make: Any) -> tuple[Feature, ...]:
    """The sparse features, built by :mod:`harness.search.coverage`'s ``_f``."""
    return (
        make("sparse.cases", "count", "sparse batches measured (the oracle planned them)"),
        make("sparse.oracle_refused", "count", "sparse batches the oracle could not plan"),
        make("sparse.routes", "set", "routes the oracle took", labels=ROUTE_LABELS),
        make("sparse.topk", "set", "index_topk values of the sparse batches", element="int"),
        make("sparse.buckets", "histogram", "batches by threshold sequence-length bucket", labels=BUCKETS),
        make(
            "sparse.bucket_edges", "set", "longest sequences one below, at, one above a bucket edge", labels=EDGE_LABELS
        ),
        make("sparse.topk_edges", "set", "longest sequence vs index_topk", labels=("topk-1", "topk", "topk+1")),
        make("sparse.query_edges", "set", "longest query vs its bucket's minimum", labels=("min-1", "min", "min+1")),
        make("sparse.masks_fit", "set", "the suffix/chunk mask fit verdicts and edges", labels=FIT_LABELS),
        make("sparse.global_mask", "set", "the global mask verdicts and edges", labels=FIT_LABELS),
        make("sparse.tile_queries", "set", "longest queries at the 128/256 tile switch", element="int"),
        make(
            "sparse.forced", "set", "forcing flags and a missing kernel", labels=("dense", "masked", "mqa", "no-kernel")
        ),
        make("mask.cases", "count", "top-k mask cases measured"),
        make("mask.forms", "set", "mask forms", labels=MASK_FORMS),
        make("mask.tile_queries", "set", "mask cases' longest queries at the tile switch", element="int"),
        make("mask.key_word_edges", "set", "key lengths vs a 32-key word", labels=("below", "at", "above")),
        make("mask.range_end_indices", "count", "indices on the row right after their remap range"),
        make("mask.continuation_indices", "count", "indices inside a range that starts mid-sequence"),
        make("mask.padding", "count", "-1 padding slots"),
        make("mask.row_fill", "set", "rows with index_topk, one or no valid indices", labels=ROW_FILLS),
        make("sparse_grid.configs", "count", "sparse workspace configurations measured"),
        make("sparse_grid.oracle_refused", "count", "sparse workspace configurations the oracle could not size"),
        make("sparse_grid.binding_terms", "set", "which term of the sparse size binds", labels=TERMS),
        make("sparse_l3.cases", "count", "sparse L3 batches measured"),
        make("sparse_l3.routes", "set", "the oracle's routes of the sparse L3 batches", labels=ROUTE_LABELS),
        make("sparse_l3.forms", "set", "masked batches' selection forms", labels=L3_FORMS),
        make("sparse_l3.dtypes", "set", "dtypes of the sparse L3 batches", labels=("bf16", "fp16", "fp32")),
        make("sparse_l3.keyless_rows", "set", "keyless-row behaviours", labels=("neg-inf", "pos-inf", "finite")),
        make("sparse_l3.selections", "set", "top-k selection patterns", element="text"),
        make("sparse_l3.row_fill", "set", "token rows with index_topk, one or no valid indices", labels=ROW_FILLS),
        make(
            "sparse_l3.threshold_masked",
            "count",
            "sparse L3 batches the oracle routes to masked MHA by the threshold (no forcing flag)",
        ),
        make("sparse_l3.continuation_chunks", "count", "masked batches' continuation chunks"),
        make("sparse_l3.crowded_chunks", "count", "masked batches' chunks of 3 requests or more"),
        make(
            "sparse_l3.shared_piece_chunks",
            "count",
            "per-range chunks whose first request is a continuation piece, with requests after it",
        ),
        make(
            "sparse_l3.future_indices", "count", "masked batches' indices past their token (the suffix's causal mask)"
        ),
        make("sparse_l3.piece_edge_indices", "count", "indices on a chunk piece's first or last row"),
        make(
            "sparse_l3.chunk_keyless_tokens",
            "count",
            "(token, chunk) pairs where the token selects no key of the chunk",
        ),
    )


def _fit_labels(verdict: bool, needed: int, words: int) -> list[str]:
    labels = ["fits" if verdict else "misses"]
    if verdict and needed == words:
        labels.append("fits-exactly")
    if not verdict and needed == words + 1:
        labels.append("misses-by-one")
    return labels


def _words(shape: tuple[int, int, int]) -> int:
    return math.prod(shape)


def _measure_batch(tally: FeatureTally, case: Any, layout: Any) -> None:
    tally.count("sparse.cases")
    tally.add("sparse.routes", layout.route)
    tally.add("sparse.topk", case.index_topk)
    max_seq, max_query = layout.prefill_max_seq_len, layout.prefill_max_query_len
    bucket = next((i for i, edge in enumerate(EDGES) if max_seq <= edge), len(EDGES))
    tally.bucket("sparse.buckets", BUCKETS[bucket])
    for edge in EDGES:
        if abs(max_seq - edge) <= 1:
            tally.add("sparse.bucket_edges", str(edge) + {-1: "-1", 0: "", 1: "+1"}[max_seq - edge])
    if abs(max_seq - case.index_topk) <= 1:
        tally.add("sparse.topk_edges", {-1: "topk-1", 0: "topk", 1: "topk+1"}[max_seq - case.index_topk])
    minimums = MINIMUMS.get((case.backend, case.tensor_parallel_size))
    if minimums is not None and bucket < len(EDGES) and minimums[bucket] is not None:
        gap = max_query - minimums[bucket]
        if abs(gap) <= 1:
            tally.add("sparse.query_edges", {-1: "min-1", 0: "min", 1: "min+1"}[gap])
    # The verdicts are the oracle's; an edge (fits exactly, misses by one) is
    # counted only where the harness's word count agrees with that verdict.
    words = 0 if not case.masked_kernel else case.mask_workspace_words
    words = PINNED_MASK_WORKSPACE_WORDS if words is None else words
    if layout.masks_fit is not None and case.masked_kernel:
        longest = max((c.max_seq_len for c in layout.layout.chunks), default=0)
        tile = 128 if max_query <= 128 else 256
        needed = len(case.query_lens) * (-(-max_query // tile) * tile) * (-(-max(max_query, longest) // 32))
        for label in _fit_labels(layout.masks_fit, needed, words):
            tally.add("sparse.masks_fit", label)
    if layout.global_mask_shape is not None and layout.global_mask_fits is not None and case.masked_kernel:
        for label in _fit_labels(layout.global_mask_fits, _words(layout.global_mask_shape), words):
            tally.add("sparse.global_mask", label)
    if max_query in (127, 128, 129, 255, 256, 257):
        tally.add("sparse.tile_queries", max_query)
    # A flag counts where it decided the oracle's route, not where it is merely set.
    within = max_seq <= case.index_topk
    if case.force_dense_mha and layout.route == Route.DENSE_MHA and not within:
        tally.add("sparse.forced", "dense")
    if case.force_masked_mha and layout.route.startswith("masked") and within:
        tally.add("sparse.forced", "masked")
    if case.force_mqa and layout.route == Route.MQA and (within or layout.use_masked_mha):
        tally.add("sparse.forced", "mqa")
    if not case.masked_kernel and layout.masked_threshold:
        tally.add("sparse.forced", "no-kernel")


def _measure_mask(tally: FeatureTally, case: Any) -> None:
    from harness.cases.sparse_inputs import materialise_topk

    tally.count("mask.cases")
    tally.add("mask.forms", case.form)
    if max(case.query_lens) in (127, 128, 129, 255, 256, 257):
        tally.add("mask.tile_queries", max(case.query_lens))
    # Only a key length one below, at or one above a word's end counts.
    for length in case.seq_lens:
        edge = {31: "below", 0: "at", 1: "above"}.get(length % 32)
        if edge is not None:
            tally.add("mask.key_word_edges", edge)
    for request, topk in enumerate(materialise_topk(case)):
        start, span = case.range_starts[request], case.range_lens[request]
        tally.count("mask.range_end_indices", int((topk == start + span).sum()))
        if start > 0:
            tally.count("mask.continuation_indices", int(((topk >= start) & (topk < start + span)).sum()))
        tally.count("mask.padding", int((topk == -1).sum()))
        _row_fills(tally, "mask.row_fill", topk, case.index_topk)


def _binding_term(config: Any, size: int) -> str | None:
    """The term of the sparse size the oracle's ``size`` equals (None where DCP
    rounding moved it off every term)."""
    terms = {
        "8*max_model_len": 8 * config.max_model_len,
        "4*max_num_seqs*block_size": 4 * config.max_num_seqs * config.block_size,
    }
    larger = max(terms, key=lambda k: terms[k])
    capped = {larger: terms[larger], "65536": 65536, "max_num_seqs*index_topk": config.max_num_seqs * config.index_topk}
    chosen = min(capped, key=lambda k: capped[k])
    if capped[chosen] < config.block_size:
        return "block_size floor" if size == config.block_size else None
    return chosen if size == capped[chosen] else None


def _measure_l3(tally: FeatureTally, case: Any, layout: Any) -> None:
    """A sparse L3 batch: its route and form by the oracle's plan; what its
    indices do in the oracle's chunks (positions in each request's sequence)."""
    import torch

    from harness.kernels.sparse_prefill import case_topk

    assert case.numeric is not None
    tally.count("sparse_l3.cases")
    tally.add("sparse_l3.routes", layout.route)
    tally.add("sparse_l3.dtypes", case.numeric.dtype)
    tally.add("sparse_l3.keyless_rows", case.numeric.keyless_rows)
    tally.add("sparse_l3.selections", case.selection)
    _row_fills(tally, "sparse_l3.row_fill", case_topk(case), case.index_topk)
    if layout.route != Route.MASKED_MHA:
        return
    if not (case.force_dense_mha or case.force_masked_mha or case.force_mqa):
        tally.count("sparse_l3.threshold_masked")
    chunks = layout.layout.chunks
    tally.add(
        "sparse_l3.forms", "suffix-only" if not chunks else ("global" if layout.global_mask_fits else "per-range")
    )
    offsets = [sum(case.query_lens[:r]) for r in range(len(case.query_lens) + 1)]
    topk = case_topk(case)
    for request, (context, query) in enumerate(zip(case.context_lens, case.query_lens, strict=True)):
        position = context + torch.arange(query)[:, None]
        tally.count("sparse_l3.future_indices", int((topk[offsets[request] : offsets[request + 1]] > position).sum()))
    for chunk in chunks:
        tally.count("sparse_l3.continuation_chunks", int(chunk.is_continuation))
        tally.count("sparse_l3.crowded_chunks", int(chunk.request_end - chunk.request_start >= 3))
        shared = chunk.request_end - chunk.request_start >= 2 and chunk.starts[0] > 0
        tally.count("sparse_l3.shared_piece_chunks", int(shared and not layout.global_mask_fits))
        for k, request in enumerate(range(chunk.request_start, chunk.request_end)):
            rows = topk[offsets[request] : offsets[request + 1]]
            start, span = chunk.starts[k], chunk.seq_lens[k]
            inside = (rows >= start) & (rows < start + span)
            tally.count("sparse_l3.chunk_keyless_tokens", int((~inside.any(dim=1)).sum()))
            if span:
                tally.count("sparse_l3.piece_edge_indices", int(((rows == start) | (rows == start + span - 1)).sum()))


def measure_sparse(tally: FeatureTally, suite: Suite, oracle: Port) -> None:
    for case in suite.sparse_cases:
        try:
            layout = oracle.plan_sparse(case)  # type: ignore[attr-defined]
        except Exception:
            tally.count("sparse.oracle_refused")
            continue
        _measure_batch(tally, case, layout)
        if case.numeric is not None:
            _measure_l3(tally, case, layout)
    for mask_case in suite.mask_cases:
        _measure_mask(tally, mask_case)
    for config in suite.sparse_workspace_configs:
        try:
            size = oracle.sparse_workspace_size(config)  # type: ignore[attr-defined]
        except Exception:
            tally.count("sparse_grid.oracle_refused")
            continue
        tally.count("sparse_grid.configs")
        term = _binding_term(config, size)
        if term is not None:
            tally.add("sparse_grid.binding_terms", term)
