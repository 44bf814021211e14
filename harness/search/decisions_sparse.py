"""The sparse path's decisions (SPEC 1d), declared for MC/DC (:mod:`harness.search.mcdc`).

Every decision upstream's sparse backend makes before attention, with its
conditions and its formula, and the observer that reads each from one item
and the oracle's answer to it:

- ``sparse.workspace``: which term of ``min(max(8*len, 4*seqs*block), 65536,
  seqs*topk)`` binds, the block floor and the DCP rounding
  (``determine_chunked_prefill_workspace_size``);
- ``sparse.use_dense_mha``: the builder's flag;
- ``sparse.threshold_row`` and one ``sparse.threshold[backend/tpN]`` per row
  of the threshold table (``_use_masked_mha``): every bucket edge and every
  entry's minimum is a condition of its own;
- ``sparse.masks_fit`` (``masked_mha_workspace_fits``): the suffix's keys and
  the longest chunk's keys, each against the mask workspace;
- ``sparse.use_masked_mha``, ``sparse.use_mha``, ``sparse.dense_route`` and
  ``sparse.masked_runnable``: the route (``forward_impl``, ``forward_mha``,
  ``_compute_context_mha``'s DCP refusal, which the suffix's run meets first),
  forcing flags included;
- ``sparse.overflow``: a masked run whose suffix mask or some chunk mask does
  not fit the workspace (``_run_masked_mha``), each mask position a condition;
- ``sparse.global_fits`` and ``sparse.mask_form``: the global mask's fit and
  whether the batch reads it (``_try_build_global_mask``).

Every operand is evaluated on every item where it has a meaning, whether or
not upstream's ``and`` reads it there: a condition shown only by an operand
left out (a wildcard) could be one that no bug in it would change. ``None``
marks an operand with no meaning on the item (no table row for its backend, no
mask workspace to compare a mask with, no global mask without context).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from harness.model.sparse import (
    MASKED_MHA_THRESHOLDS,
    PINNED_MASK_WORKSPACE_WORDS,
    SEQ_LEN_EDGES,
    Route,
    SparseCase,
    SparseLayout,
    SparseWorkspaceConfig,
    edge_query,
    mask_words,
    threshold_says_yes,
)
from harness.search.mcdc import Condition, Decision, Observation

DENSE_CAP = 65536
C = Condition


# -- the workspace size -------------------------------------------------------------------


def _workspace_label(v: Mapping[str, bool]) -> str:
    if v["below_block"]:
        term = "block floor"
    elif v["topk_least"]:
        term = "seqs*topk"
    elif v["under_cap"]:
        term = "8*len" if v["len_larger"] else "4*seqs*block"
    else:
        term = "65536"
    if v["dcp"] and v["unaligned"]:
        return term + " rounded up"
    return term


WORKSPACE = Decision(
    "sparse.workspace",
    "sparse",
    "which term sets the sparse workspace: min(max(8*len, 4*seqs*block), 65536, seqs*topk), "
    "at least a block, rounded up to lcm(block, D*I) under DCP",
    "SparseMLACommonMetadataBuilder.determine_chunked_prefill_workspace_size",
    (
        C("len_larger", "8*max_model_len > 4*max_num_seqs*block_size"),
        C("under_cap", "max(8*len, 4*seqs*block) < 65536"),
        C("topk_least", "max_num_seqs*index_topk < min(max(...), 65536)"),
        C("below_block", "min(...) < block_size (the floor binds)"),
        C("dcp", "dcp_world_size > 1"),
        C("unaligned", "the floored size is not a multiple of lcm(block, D*I)", coupled="read only under DCP"),
    ),
    _workspace_label,
)


def _alignment_unit(block: int, world: int, interleave: int) -> int:
    import math

    return math.lcm(block, world * interleave) if world > 1 else block


def observe_workspace(item: str, config: SparseWorkspaceConfig, size: int) -> Iterator[tuple[Decision, Observation]]:
    """One sizing; a tie between the terms (no term alone binds) is not observed."""
    by_len, by_seqs = 8 * config.max_model_len, 4 * config.max_num_seqs * config.block_size
    larger = max(by_len, by_seqs)
    by_topk = config.max_num_seqs * config.index_topk
    least = min(larger, DENSE_CAP, by_topk)
    if by_len == by_seqs or larger == DENSE_CAP or by_topk == min(larger, DENSE_CAP) or least == config.block_size:
        return
    floored = max(least, config.block_size)
    dcp = config.dcp_world_size > 1
    unit = _alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
    expected = max(-(-floored // unit) * unit, unit) if dcp else floored
    values: dict[str, bool | None] = {
        "len_larger": by_len > by_seqs,
        "under_cap": larger < DENSE_CAP,
        "topk_least": by_topk < min(larger, DENSE_CAP),
        "below_block": least < config.block_size,
        "dcp": dcp,
        "unaligned": floored % unit != 0 if dcp else None,
    }
    label = _workspace_label({k: bool(v) for k, v in values.items()})
    # The oracle's size confirms the term: a size no term gives is a disagreement.
    yield WORKSPACE, Observation(item, values, label if size == expected else f"size {size}")


# -- the route ----------------------------------------------------------------------------

USE_DENSE = Decision(
    "sparse.use_dense_mha",
    "sparse",
    "use_dense_mha = max_seq_len <= index_topk and not force_mqa",
    "SparseMLACommonMetadataBuilder.build",
    (C("within_topk", "prefill_max_seq_len <= index_topk", edge=1), C("force_mqa", "sparse_mla_force_mqa")),
    lambda v: v["within_topk"] and not v["force_mqa"],
    transcribed="the builder's use_dense_mha (SparseMLACommonMetadataBuilder.build), oracle/sparse.py",
)

THRESHOLD_ROW = Decision(
    "sparse.threshold_row",
    "sparse",
    "masked threshold: the backend has a table, the table has a row for the TP size, and the row says yes",
    "_use_masked_mha",
    (
        C("backend_has_table", "backend in the threshold table"),
        C("tp_has_row", "the backend's table has the tensor-parallel size"),
        C("row_says_yes", "the row's bucket minimum is met"),
    ),
    lambda v: v["backend_has_table"] and v["tp_has_row"] and v["row_says_yes"],
)


def _row_formula(minimums: tuple[int | None, ...]) -> object:
    def formula(v: Mapping[str, bool]) -> bool:
        for k in range(len(SEQ_LEN_EDGES)):
            if v[f"seq<={SEQ_LEN_EDGES[k]}"]:
                needed = minimums[k]
                return needed is not None and v[f"query>={needed}@{k}"]
        return False

    return formula


def _row_decision(backend: str, tp: int, minimums: tuple[int | None, ...]) -> Decision:
    conditions = []
    infeasible: dict[str, str] = {}
    for k, edge in enumerate(SEQ_LEN_EDGES):
        name = f"seq<={edge}"
        conditions.append(C(name, f"prefill_max_seq_len <= {edge}", edge=1, coupled="the bucket edges are nested"))
        # Feasible when some query length reads yes on one side of the edge and no on the other.
        if edge_query(minimums, k) is None:
            after = minimums[k + 1] if k + 1 < len(minimums) else "never (past the last bucket)"
            infeasible[name] = (
                f"no query length reads differently at seq {edge} and {edge + 1}: "
                f"the minimums are {minimums[k]} and {after}"
            )
    for k, needed in enumerate(minimums):
        if needed is not None:
            conditions.append(
                C(
                    f"query>={needed}@{k}",
                    f"prefill_max_query_len >= {needed} (bucket <= {SEQ_LEN_EDGES[k]})",
                    edge=1,
                    coupled="one query length is read against every bucket's minimum",
                )
            )
    return Decision(
        f"sparse.threshold[{backend}/tp{tp}]",
        "sparse",
        f"the {backend} TP {tp} row: the first bucket edge >= prefill_max_seq_len, then its minimum",
        "_use_masked_mha",
        tuple(conditions),
        _row_formula(minimums),  # type: ignore[arg-type]
        infeasible,
    )


THRESHOLD_ROWS = {row: _row_decision(*row, minimums) for row, minimums in MASKED_MHA_THRESHOLDS.items()}

MASKS_FIT = Decision(
    "sparse.masks_fit",
    "sparse",
    "masks_fit = a mask workspace exists and mask(batch, max_query, max(max_query, longest chunk)) fits it: "
    "the mask over the suffix's keys and the mask over the longest chunk's keys both fit",
    "SparseMLACommonImpl.masked_mha_workspace_fits",
    (
        C("has_workspace", "a top-k mask workspace is allocated (the masked kernel exists)"),
        C("suffix_fits", "the suffix mask (keys = max_query_len) fits the workspace", edge=1),
        C("chunk_keys_fit", "the mask over the longest chunk's keys fits the workspace", edge=1),
    ),
    lambda v: v["has_workspace"] and v["suffix_fits"] and v["chunk_keys_fit"],
    {
        "has_workspace": "no input makes it matter: without the masked kernel there is no mask workspace, and "
        "its 0 words fit no mask, so suffix_fits is false as well and decides alone"
    },
)

USE_MASKED = Decision(
    "sparse.use_masked_mha",
    "sparse",
    "use_masked_mha = masked kernel and dcp_world_size <= 1 and the threshold and masks_fit",
    "MLAAttention.forward_impl",
    (
        C("masked_kernel", "the masked kernel is available"),
        C("no_dcp", "dcp_world_size <= 1", edge=1),
        C("threshold", "_use_masked_mha (the oracle's answer)"),
        C("masks_fit", "masked_mha_workspace_fits (the oracle's answer)"),
    ),
    lambda v: v["masked_kernel"] and v["no_dcp"] and v["threshold"] and v["masks_fit"],
    {
        "masked_kernel": "no input makes it matter: without the masked kernel there is no mask workspace, so "
        "masks_fit is false as well and decides alone (masked_kernel shows in sparse.masked_runnable)"
    },
    transcribed="MLAAttention.forward_impl's route, oracle/sparse.py",
)

USE_MHA = Decision(
    "sparse.use_mha",
    "sparse",
    "MHA at all: (use_dense_mha or use_masked_mha) and not force_mqa",
    "MLAAttention.forward_impl",
    (
        C("use_dense_mha", "the builder's use_dense_mha (the oracle's)"),
        C("use_masked_mha", "use_masked_mha (the oracle's)"),
        C("force_mqa", "sparse_mla_force_mqa"),
    ),
    lambda v: (v["use_dense_mha"] or v["use_masked_mha"]) and not v["force_mqa"],
    transcribed="MLAAttention.forward_impl's route, oracle/sparse.py",
)

DENSE_ROUTE = Decision(
    "sparse.dense_route",
    "sparse",
    "within MHA, dense: force_dense_mha or (max_seq_len <= index_topk and not force_masked_mha)",
    "SparseMLACommonImpl.forward_mha",
    (
        C("force_dense", "sparse_mla_force_dense_mha"),
        C("within_topk", "prefill_max_seq_len <= index_topk", edge=1),
        C("force_masked", "sparse_mla_force_masked_mha"),
    ),
    lambda v: v["force_dense"] or (v["within_topk"] and not v["force_masked"]),
    transcribed="SparseMLACommonImpl.forward_mha's choice, oracle/sparse.py",
)

RUNNABLE = Decision(
    "sparse.masked_runnable",
    "sparse",
    "a masked route is not refused: the masked kernel exists, and the context loop's DCP refusal is not "
    "reached (the suffix's mask overflows first) or not made: masked_kernel and (suffix_overflows or not "
    "(context and dcp_world_size > 1))",
    "SparseMLACommonImpl.forward_mha / _compute_context_mha",
    (
        C("masked_kernel", "the masked kernel is available"),
        C("suffix_overflows", "the suffix's mask does not fit (forward_mha runs the suffix before the context loop)"),
        C("has_context", "some request has context (the context loop runs)"),
        C("dcp", "dcp_world_size > 1", edge=1),
    ),
    lambda v: v["masked_kernel"] and (v["suffix_overflows"] or not (v["has_context"] and v["dcp"])),
    transcribed="forward_mha's kernel assertion and the order of its runs, oracle/sparse.py (the DCP refusal "
    "is upstream's own, called)",
)

POSITIONS = ("suffix", "only_chunk", "first_chunk", "inner_chunk", "last_chunk")

OVERFLOW = Decision(
    "sparse.overflow",
    "sparse",
    "a masked run overflows: the global mask is not used and the suffix mask or some chunk mask "
    "is larger than the mask workspace",
    "SparseMLACommonImpl._run_masked_mha",
    (
        C("global_form", "the global mask is used (context, and it fits)"),
        C("suffix", "the suffix mask overflows", edge=1),
        C("only_chunk", "the only chunk's mask overflows", edge=1),
        C("first_chunk", "the first of several chunks' mask overflows", edge=1),
        C("inner_chunk", "a mask of a chunk between the first and the last overflows", edge=1),
        C("last_chunk", "the last of several chunks' mask overflows", edge=1),
    ),
    lambda v: not v["global_form"] and any(v[p] for p in POSITIONS),
    {
        "global_form": "no input makes it matter: a global mask that fits is at least as large as every per-range "
        "mask (as many rows or more, more keys, one more word), so where the batch reads it no per-range mask "
        "overflows either"
    },
)

GLOBAL_FITS = Decision(
    "sparse.global_fits",
    "sparse",
    "the global mask (whole sequences, one reserved word per row) fits the mask workspace",
    "SparseMLACommonImpl._try_build_global_mask",
    (C("global_words_fit", "mask(batch, max_query, max_seq_len) + reserved words <= workspace", edge=1),),
    lambda v: v["global_words_fit"],
)

MASK_FORM = Decision(
    "sparse.mask_form",
    "sparse",
    "the suffix and chunks read the global mask: the batch has context and the global mask fits",
    "SparseMLACommonImpl.forward_mha",
    (C("has_context", "some request has context"), C("global_fits", "the global mask fits (the oracle's)")),
    lambda v: v["has_context"] and v["global_fits"],
    transcribed="which mask the suffix reads (forward_mha), oracle/sparse.py (the fit is upstream's own, called)",
)

SPARSE_DECISIONS: tuple[Decision, ...] = (
    WORKSPACE,
    USE_DENSE,
    THRESHOLD_ROW,
    *THRESHOLD_ROWS.values(),
    MASKS_FIT,
    USE_MASKED,
    USE_MHA,
    DENSE_ROUTE,
    RUNNABLE,
    OVERFLOW,
    GLOBAL_FITS,
    MASK_FORM,
)


def _workspace_words(case: SparseCase) -> int:
    if not case.masked_kernel:
        return 0
    return PINNED_MASK_WORKSPACE_WORDS if case.mask_workspace_words is None else case.mask_workspace_words


def observe_case(item: str, case: SparseCase, plan: SparseLayout) -> Iterator[tuple[Decision, Observation]]:
    """Every sparse decision ``case`` reaches, with the oracle's ``plan`` of it."""
    yield from observe_workspace(item, case.workspace_config, plan.workspace_size)
    max_seq, max_query = plan.prefill_max_seq_len, plan.prefill_max_query_len
    batch = len(case.query_lens)
    within = max_seq <= case.index_topk
    topk_gap = {"within_topk": max_seq - case.index_topk}
    yield (
        USE_DENSE,
        Observation(item, {"within_topk": within, "force_mqa": case.force_mqa}, plan.use_dense_mha, topk_gap),
    )
    row = (case.backend, case.tensor_parallel_size)
    has_table = any(backend == case.backend for backend, _ in MASKED_MHA_THRESHOLDS)
    minimums = MASKED_MHA_THRESHOLDS.get(row)
    yield (
        THRESHOLD_ROW,
        Observation(
            item,
            {
                "backend_has_table": has_table,
                "tp_has_row": (minimums is not None) if has_table else None,
                "row_says_yes": threshold_says_yes(minimums, max_seq, max_query) if minimums is not None else None,
            },
            plan.masked_threshold,
        ),
    )
    if minimums is not None:
        values: dict[str, bool | None] = {}
        distances: dict[str, int | None] = {}
        for k, edge in enumerate(SEQ_LEN_EDGES):
            values[f"seq<={edge}"] = max_seq <= edge
            distances[f"seq<={edge}"] = max_seq - edge
            if minimums[k] is not None:
                name = f"query>={minimums[k]}@{k}"
                values[name] = max_query >= minimums[k]  # type: ignore[operator]
                distances[name] = max_query - minimums[k]  # type: ignore[operator]
        yield THRESHOLD_ROWS[row], Observation(item, values, plan.masked_threshold, distances)
    words = _workspace_words(case)
    chunks = plan.layout.chunks
    longest = max((c.max_seq_len for c in chunks), default=0)
    suffix_words = mask_words(batch, max_query, max_query)
    chunk_words = mask_words(batch, max_query, longest)
    if plan.masks_fit is not None:
        # Without a workspace upstream returns first; its 0 words are compared all the same.
        fit: dict[str, bool | None] = {
            "has_workspace": case.masked_kernel,
            "suffix_fits": suffix_words <= words,
            "chunk_keys_fit": chunk_words <= words,
        }
        yield (
            MASKS_FIT,
            Observation(
                item, fit, plan.masks_fit, {"suffix_fits": suffix_words - words, "chunk_keys_fit": chunk_words - words}
            ),
        )
        yield (
            USE_MASKED,
            Observation(
                item,
                {
                    "masked_kernel": case.masked_kernel,
                    "no_dcp": case.dcp_world_size <= 1,
                    "threshold": plan.masked_threshold,
                    "masks_fit": plan.masks_fit,
                },
                plan.use_masked_mha,
                {"no_dcp": case.dcp_world_size - 1},
            ),
        )
    dense_or_masked: dict[str, bool | None] = {
        "use_dense_mha": plan.use_dense_mha,
        "use_masked_mha": plan.use_masked_mha,
        "force_mqa": case.force_mqa,
    }
    yield USE_MHA, Observation(item, dense_or_masked, plan.route != Route.MQA)
    # Every route reports its mask shapes: the global mask's fit and form are decided on each.
    has_context = any(case.context_lens)
    yield from _observe_mask_form(item, case, plan, words, has_context)
    if plan.route == Route.MQA:
        return
    forced = {"force_dense": case.force_dense_mha, "within_topk": within, "force_masked": case.force_masked_mha}
    yield DENSE_ROUTE, Observation(item, forced, plan.route == Route.DENSE_MHA, topk_gap)
    if plan.route == Route.DENSE_MHA:
        return
    runnable = {
        "masked_kernel": case.masked_kernel,
        "suffix_overflows": _suffix_overflows(case, plan, words, has_context),
        "has_context": has_context,
        "dcp": case.dcp_world_size > 1,
    }
    yield (
        RUNNABLE,
        Observation(item, runnable, plan.route != Route.MASKED_MHA_UNAVAILABLE, {"dcp": case.dcp_world_size - 2}),
    )
    if plan.route == Route.MASKED_MHA_UNAVAILABLE:
        return
    yield from _observe_overflow(item, case, plan, words, has_context)


def _suffix_overflows(case: SparseCase, plan: SparseLayout, words: int, has_context: bool) -> bool | None:
    """Whether the suffix's run fails for its mask: where the batch reads the
    global mask, that mask against the workspace (0.28.0 reads it only when it
    fits; 0.27.1 checks it against a fixed 64 MiB and then views the workspace),
    else the per-range suffix mask; no meaning without the masked kernel (no
    workspace)."""
    if not case.masked_kernel:
        return None
    batch, max_query = len(case.query_lens), plan.prefill_max_query_len
    if has_context and plan.global_mask_fits:
        return mask_words(batch, max_query, plan.prefill_max_seq_len, key_starts_word=True) > words
    return mask_words(batch, max_query, max_query) > words


def _observe_mask_form(
    item: str, case: SparseCase, plan: SparseLayout, words: int, has_context: bool
) -> Iterator[tuple[Decision, Observation]]:
    yield (
        MASK_FORM,
        Observation(
            item,
            {"has_context": has_context, "global_fits": plan.global_mask_fits if has_context else None},
            plan.global_mask_shape is not None and plan.suffix_mask_shape == plan.global_mask_shape,
        ),
    )
    if has_context and plan.global_mask_shape is not None:
        batch, max_query, max_seq = len(case.query_lens), plan.prefill_max_query_len, plan.prefill_max_seq_len
        global_words = mask_words(batch, max_query, max_seq, key_starts_word=True)
        yield (
            GLOBAL_FITS,
            Observation(
                item,
                {"global_words_fit": global_words <= words},
                plan.global_mask_fits,
                {"global_words_fit": global_words - words},
            ),
        )


def _observe_overflow(
    item: str, case: SparseCase, plan: SparseLayout, words: int, has_context: bool
) -> Iterator[tuple[Decision, Observation]]:
    global_form = bool(has_context and plan.global_mask_fits)
    # Each per-range mask's words, read whether or not the batch reads the global mask.
    values: dict[str, bool | None] = {"global_form": global_form}
    distances: dict[str, int | None] = {}
    batch, max_query = len(case.query_lens), plan.prefill_max_query_len
    needed: dict[str, list[int]] = {p: [] for p in POSITIONS}
    needed["suffix"].append(mask_words(batch, max_query, max_query))
    chunks = plan.layout.chunks
    for k, chunk in enumerate(chunks):
        position = (
            "only_chunk"
            if len(chunks) == 1
            else ("first_chunk" if k == 0 else "last_chunk" if k == len(chunks) - 1 else "inner_chunk")
        )
        requests = chunk.request_end - chunk.request_start
        needed[position].append(mask_words(requests, chunk.max_query_len, chunk.max_seq_len))
    for position, sizes in needed.items():
        values[position] = any(n > words for n in sizes)
        distances[position] = max(sizes) - words - 1 if sizes else None
    yield OVERFLOW, Observation(item, values, plan.route == Route.MASKED_MHA_OVERFLOW, distances)
