"""Per-condition mutants: per_request with one condition of one declared
decision (harness/search/decisions_sparse.py, decisions_dense.py) got wrong,
the three ways a hand port gets a condition wrong: an operand dropped, an
operand negated or ignored, a boundary moved by one.

Each names its condition in ``condition`` (``(decision id, condition name)``);
the condition's MC/DC pair on ci is an item that kills it (tests/test_mcdc_mutants.py).
The threshold table's mutants are generated from the port's own table, one per
entry (the minimum one higher) and one per row and bucket edge (the edge one
higher for that row alone), so a table that grows grows its mutants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from harness.model import Layout, alignment_unit
from harness.model.sparse import PINNED_MASK_WORKSPACE_WORDS, Shape, SparseCase, SparseWorkspaceConfig
from ports.mutants.base import Mutant
from ports.per_request import metadata as metadata_module
from ports.per_request import planner as planner_module
from ports.per_request import sparse as sparse_module
from ports.per_request.planner import Geometry, PlannedChunk

CAP = sparse_module.DENSE_WORKSPACE_CAP


class ConditionMutant(Mutant):
    """A mutant aimed at one condition of one declared decision (``conditions``).

    Its fault is a planning decision, compared exactly at the level that plans:
    the kill matrix searches it there only (``shows_at``), not at the numeric
    levels, which would run every numeric item for each of these mutants."""

    shows_at = ("sparse-layout",)


def _one(target: Any, name: str, replacement: Any) -> list[tuple[Any, str, Any]]:
    return [(target, name, replacement)]


# -- the sparse workspace ---------------------------------------------------------------


def _workspace(config: SparseWorkspaceConfig, fault: str) -> int:
    """The sparse workspace size with one term or step wrong (``fault``)."""
    by_len, by_seqs = 8 * config.max_model_len, 4 * config.max_num_seqs * config.block_size
    larger = by_seqs if fault == "no-len-term" else max(by_len, by_seqs)
    terms = [larger, config.max_num_seqs * config.index_topk]
    if fault != "no-cap":
        terms.append(CAP)
    if fault == "no-topk-term":
        terms.pop(1)
    wanted = min(terms)
    if fault != "no-floor":
        wanted = max(wanted, config.block_size)
    if config.dcp_world_size > 1 and fault != "no-dcp-rounding":
        unit = alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
        if fault == "rounds-to-block":
            unit = config.block_size
        wanted = max(-(-wanted // unit) * unit, unit)
    return wanted


def _workspace_mutant(fault: str, condition: str, description: str) -> type[ConditionMutant]:
    def swaps(self: Mutant) -> list[tuple[Any, str, Any]]:
        return _one(sparse_module, "sparse_workspace_size", lambda config: _workspace(config, fault))

    return type(
        f"SparseWorkspace_{fault}",
        (ConditionMutant,),
        {
            "name": f"sparse-ws-{fault}",
            "description": description,
            "source": "hand port",
            "conditions": (("sparse.workspace", condition),),
            "aimed_at": f"the sparse workspace's {condition} condition (sparse-layout)",
            "swaps": swaps,
        },
    )


WORKSPACE_MUTANTS = (
    _workspace_mutant("no-len-term", "len_larger", "max(8*max_model_len, 4*seqs*block) loses its first term"),
    _workspace_mutant("no-cap", "under_cap", "the sparse workspace loses its 65,536 cap"),
    _workspace_mutant("no-topk-term", "topk_least", "the sparse workspace loses its max_num_seqs * index_topk term"),
    _workspace_mutant("no-floor", "below_block", "the sparse workspace is not floored at one block"),
    _workspace_mutant("no-dcp-rounding", "dcp", "under DCP the sparse workspace is not rounded to the alignment"),
    _workspace_mutant(
        "rounds-to-block", "unaligned", "under DCP the sparse workspace is rounded up to the block, not lcm(block, D*I)"
    ),
)


# -- the route: one small function of the port each ----------------------------------------


def _route_mutant(
    name: str,
    condition: tuple[str, str],
    description: str,
    function: str,
    replacement: Callable[..., Any],
    also: tuple[tuple[str, str], ...] = (),
) -> type[ConditionMutant]:
    """A mutant that swaps one decision function of the port; ``also``: the other
    conditions the same fault gets wrong (an overflow check that skips the last
    chunk skips a batch's only chunk too)."""

    def swaps(self: Mutant) -> list[tuple[Any, str, Any]]:
        return _one(sparse_module, function, replacement)

    return type(
        "Route_" + name.replace("-", "_"),
        (ConditionMutant,),
        {
            "name": name,
            "description": description,
            "source": "hand port",
            "conditions": (condition, *also),
            "aimed_at": f"{condition[0]}: {condition[1]} (sparse-layout)",
            "swaps": swaps,
        },
    )


def _fits_suffix_keys_dropped(case: SparseCase, layout: Layout, words: int) -> bool:
    longest = max((c.max_seq_len for c in layout.chunks), default=0)
    shape = sparse_module.topk_mask_shape(len(case.query_lens), case.max_query_len, longest)
    return case.masked_kernel and math.prod(shape) <= words


def _fits_chunks_dropped(case: SparseCase, layout: Layout, words: int) -> bool:
    shape = sparse_module.topk_mask_shape(len(case.query_lens), case.max_query_len, case.max_query_len)
    return case.masked_kernel and math.prod(shape) <= words


def _overflow_of(pick: Callable[[tuple[Shape, ...]], tuple[Shape, ...]]) -> Callable[..., bool]:
    def overflows(chunk_shapes: tuple[Shape, ...], words: int) -> bool:
        return any(math.prod(shape) > words for shape in pick(chunk_shapes))

    return overflows


_masked_outcome = sparse_module.masked_outcome


def _refusal_first(case: SparseCase, suffix_shape: Shape, chunk_shapes: tuple[Shape, ...], words: int) -> str:
    """The masked route's checks with the DCP refusal moved ahead of the suffix's mask."""
    if case.masked_kernel and sparse_module.context_loop_refused(case):
        return "masked-mha-unavailable"
    return _masked_outcome(case, suffix_shape, chunk_shapes, words)


within = sparse_module.within_topk
ROUTE_MUTANTS = (
    _route_mutant(
        "sparse-dense-flag-ignores-mqa",
        ("sparse.use_dense_mha", "force_mqa"),
        "use_dense_mha ignores force_mqa",
        "dense_mha_flag",
        lambda case: within(case.max_seq_len, case.index_topk),
    ),
    _route_mutant(
        "sparse-workspace-without-kernel",
        ("sparse.global_fits", "global_words_fit"),
        "a batch without the masked kernel still has the 128 MiB mask workspace",
        "mask_workspace",
        lambda case: PINNED_MASK_WORKSPACE_WORDS if case.mask_workspace_words is None else case.mask_workspace_words,
    ),
    _route_mutant(
        "sparse-fit-longest-chunk-only",
        ("sparse.masks_fit", "suffix_fits"),
        "masks_fit sizes the mask over the longest chunk's keys, not the longer of those and the suffix's",
        "masks_fit",
        _fits_suffix_keys_dropped,
    ),
    _route_mutant(
        "sparse-fit-suffix-only",
        ("sparse.masks_fit", "chunk_keys_fit"),
        "masks_fit sizes the suffix mask only, not the chunks' keys",
        "masks_fit",
        _fits_chunks_dropped,
    ),
    _route_mutant(
        "sparse-masked-ignores-dcp",
        ("sparse.use_masked_mha", "no_dcp"),
        "use_masked_mha without the DCP check",
        "masked_mha_flag",
        lambda case, threshold, fits: case.masked_kernel and threshold and fits,
    ),
    _route_mutant(
        "sparse-masked-ignores-threshold",
        ("sparse.use_masked_mha", "threshold"),
        "use_masked_mha without the threshold",
        "masked_mha_flag",
        lambda case, threshold, fits: case.masked_kernel and case.dcp_world_size <= 1 and fits,
    ),
    _route_mutant(
        "sparse-masked-ignores-fit",
        ("sparse.use_masked_mha", "masks_fit"),
        "use_masked_mha without the mask fit",
        "masked_mha_flag",
        lambda case, threshold, fits: case.masked_kernel and case.dcp_world_size <= 1 and threshold,
    ),
    _route_mutant(
        "sparse-mha-dense-only",
        ("sparse.use_mha", "use_masked_mha"),
        "MHA only when use_dense_mha (use_masked_mha dropped)",
        "takes_mha",
        lambda case, dense, masked: dense and not case.force_mqa,
    ),
    _route_mutant(
        "sparse-mha-masked-only",
        ("sparse.use_mha", "use_dense_mha"),
        "MHA only when use_masked_mha (use_dense_mha dropped)",
        "takes_mha",
        lambda case, dense, masked: masked and not case.force_mqa,
    ),
    _route_mutant(
        "sparse-mha-ignores-force-mqa",
        ("sparse.use_mha", "force_mqa"),
        "force_mqa does not stop MHA",
        "takes_mha",
        lambda case, dense, masked: dense or masked,
    ),
    _route_mutant(
        "sparse-route-ignores-force-dense",
        ("sparse.dense_route", "force_dense"),
        "force_dense_mha does not force the dense kind",
        "prefers_dense",
        lambda case: within(case.max_seq_len, case.index_topk) and not case.force_masked_mha,
    ),
    _route_mutant(
        "sparse-route-ignores-force-masked",
        ("sparse.dense_route", "force_masked"),
        "force_masked_mha does not force the masked kind",
        "prefers_dense",
        lambda case: case.force_dense_mha or within(case.max_seq_len, case.index_topk),
    ),
    _route_mutant(
        "sparse-runs-without-kernel",
        ("sparse.masked_runnable", "masked_kernel"),
        "the masked route is taken without the masked kernel (no kernel check): its masks then overflow the "
        "workspace it does not have",
        "masked_outcome",
        lambda case, *masks: _masked_outcome(replace(case, masked_kernel=True), *masks),
    ),
    _route_mutant(
        "sparse-refuses-before-suffix",
        ("sparse.masked_runnable", "suffix_overflows"),
        "the context loop's DCP refusal is checked before the suffix's mask",
        "masked_outcome",
        _refusal_first,
    ),
    _route_mutant(
        "sparse-refuses-any-dcp",
        ("sparse.masked_runnable", "has_context"),
        "the masked route refuses DCP with or without context",
        "context_loop_refused",
        lambda case: case.dcp_world_size > 1,
    ),
    _route_mutant(
        "sparse-refuses-any-context",
        ("sparse.masked_runnable", "dcp"),
        "the masked route refuses context with or without DCP",
        "context_loop_refused",
        lambda case: any(case.context_lens),
    ),
    _route_mutant(
        "sparse-overflow-skips-suffix",
        ("sparse.overflow", "suffix"),
        "the overflow check skips the suffix mask",
        "suffix_mask_overflows",
        lambda suffix_shape, words: False,
    ),
    _route_mutant(
        "sparse-overflow-skips-first-chunk",
        ("sparse.overflow", "only_chunk"),
        "the overflow check reads the chunk masks from the second on",
        "chunk_masks_overflow",
        _overflow_of(lambda chunks: chunks[1:]),
        also=(("sparse.overflow", "first_chunk"),),
    ),
    _route_mutant(
        "sparse-overflow-last-chunk-only",
        ("sparse.overflow", "first_chunk"),
        "the overflow check reads the last chunk's mask only",
        "chunk_masks_overflow",
        _overflow_of(lambda chunks: chunks[-1:]),
        also=(("sparse.overflow", "inner_chunk"),),
    ),
    _route_mutant(
        "sparse-overflow-ends-only",
        ("sparse.overflow", "inner_chunk"),
        "the overflow check reads the first and the last chunk's masks only",
        "chunk_masks_overflow",
        _overflow_of(lambda chunks: chunks[:1] + chunks[1:][-1:]),
    ),
    _route_mutant(
        "sparse-overflow-skips-last-chunk",
        ("sparse.overflow", "last_chunk"),
        "the overflow check reads every chunk's mask but the last",
        "chunk_masks_overflow",
        _overflow_of(lambda chunks: chunks[:-1]),
        also=(("sparse.overflow", "only_chunk"),),
    ),
    _route_mutant(
        "sparse-global-without-context",
        ("sparse.mask_form", "has_context"),
        "a batch without context has a global mask too",
        "global_mask_shape",
        lambda case: sparse_module.topk_mask_shape(
            len(case.query_lens), case.max_query_len, case.max_seq_len, key_starts_word=True
        ),
    ),
    _route_mutant(
        "sparse-global-ignores-fit",
        ("sparse.mask_form", "global_fits"),
        "a batch with context reads the global mask whether it fits or not",
        "reads_global_mask",
        lambda shape, global_fits: shape is not None,
    ),
)


GLOBAL_FIT_STRICT = _route_mutant(
    "sparse-global-fit-strict",
    ("sparse.global_fits", "global_words_fit"),
    "the global mask fits only below the workspace's words (< for <=)",
    "global_mask_fits",
    lambda shape, words: math.prod(shape) < words,
)


# -- the threshold table: generated from the port's own rows ----------------------------------


def _threshold_mutant(
    name: str, conditions: tuple[tuple[str, str], ...], description: str, wrong: Callable[..., bool]
) -> type[ConditionMutant]:
    real = sparse_module.masked_threshold

    def threshold(backend: str, tensor_parallel_size: int, query_len: int, seq_len: int) -> bool:
        return wrong(real, backend, tensor_parallel_size, query_len, seq_len)

    def swaps(self: Mutant) -> list[tuple[Any, str, Any]]:
        return _one(sparse_module, "masked_threshold", threshold)

    return type(
        "Threshold_" + name.replace("-", "_"),
        (ConditionMutant,),
        {
            "name": name,
            "description": description,
            "source": "hand port",
            "conditions": conditions,
            "aimed_at": f"{conditions[0][0]}: {conditions[0][1]} (sparse-layout)",
            "swaps": swaps,
        },
    )


_ROW_ALIASES = {"FLASHMLA_SPARSE": "flashmla", "FLASHINFER_MLA_SPARSE": "flashinfer"}


def _entry_mutants() -> list[type[ConditionMutant]]:
    """For every row of the port's table: its minimum one higher, and its
    sequence ceiling one higher (a sequence one past the ceiling read under it)."""
    edges = sparse_module.SEQ_LEN_BUCKETS
    mutants = []
    for row in sparse_module.MASKED_MHA_MIN_QUERY:
        backend, tp, ceiling, least = row
        decision = f"sparse.threshold[{backend}/tp{tp}]"
        bucket = edges.index(ceiling)
        tag = f"{_ROW_ALIASES.get(backend, backend.lower())}-tp{tp}-{ceiling}"

        def raised(real: Any, b: str, t: int, q: int, s: int, row: Any = row) -> bool:
            if (b, t) == (row.backend, row.tensor_parallel_size) and q == row.least_query_len:
                governing = next((e for e in sparse_module.SEQ_LEN_BUCKETS if s <= e), None)
                if governing == row.longest_seq_len:
                    return False
            return bool(real(b, t, q, s))

        mutants.append(
            _threshold_mutant(
                f"sparse-threshold-{tag}-min+1",
                ((decision, f"query>={least}@{bucket}"),),
                f"{backend} TP {tp}: the minimum query under the {ceiling} ceiling is {least + 1}, not {least}",
                raised,
            )
        )

    for backend, tp in _row_ceilings():
        decision = f"sparse.threshold[{backend}/tp{tp}]"
        for edge in edges:
            if not _edge_matters(backend, tp, edge):
                continue  # both sides of it read alike: moving it changes nothing

            def moved(real: Any, b: str, t: int, q: int, s: int, key: Any = (backend, tp), edge: int = edge) -> bool:
                if (b, t) == key and s == edge + 1:
                    s = edge
                return bool(real(b, t, q, s))

            mutants.append(
                _threshold_mutant(
                    f"sparse-threshold-{_ROW_ALIASES.get(backend, backend.lower())}-tp{tp}-edge{edge}+1",
                    ((decision, f"seq<={edge}"),),
                    f"{backend} TP {tp}: a longest sequence of {edge + 1} is read under the {edge} ceiling",
                    moved,
                )
            )
    return mutants


def _edge_matters(backend: str, tp: int, edge: int) -> bool:
    """Some query length that the port's table reads differently at ``edge`` and one past it."""
    real = sparse_module.masked_threshold
    queries = {1, edge} | {r.least_query_len for r in sparse_module.MASKED_MHA_MIN_QUERY}
    return any(real(backend, tp, q, edge) != real(backend, tp, q, edge + 1) for q in queries if q <= edge)


def _has_table(backend: str) -> bool:
    return any(r.backend == backend for r in sparse_module.MASKED_MHA_MIN_QUERY)


def _has_rows(backend: str, tp: int) -> bool:
    return any((r.backend, r.tensor_parallel_size) == (backend, tp) for r in sparse_module.MASKED_MHA_MIN_QUERY)


def _row_ceilings() -> dict[tuple[str, int], list[int]]:
    rows: dict[tuple[str, int], list[int]] = {}
    for row in sparse_module.MASKED_MHA_MIN_QUERY:
        rows.setdefault((row.backend, row.tensor_parallel_size), []).append(row.longest_seq_len)
    return rows


THRESHOLD_ROW_MUTANTS = (
    _threshold_mutant(
        "sparse-threshold-any-backend",
        (("sparse.threshold_row", "backend_has_table"),),
        "a backend without a table reads FLASHMLA_SPARSE's rows",
        lambda real, b, t, q, s: bool(real(b if _has_table(b) else "FLASHMLA_SPARSE", t, q, s)),
    ),
    _threshold_mutant(
        "sparse-threshold-any-tp",
        (("sparse.threshold_row", "tp_has_row"),),
        "a TP size without rows reads the backend's TP 8 rows",
        lambda real, b, t, q, s: bool(real(b, t if _has_rows(b, t) else 8, q, s)),
    ),
    _threshold_mutant(
        "sparse-threshold-any-row-says-yes",
        (("sparse.threshold_row", "row_says_yes"),),
        "a backend and TP size with rows take masked MHA under any ceiling, whatever the query",
        lambda real, b, t, q, s: _has_rows(b, t) and s <= sparse_module.SEQ_LEN_BUCKETS[-1],
    ),
)


# -- the dense planner ---------------------------------------------------------------------


class DenseConditionMutant(ConditionMutant):
    """A mutant aimed at a condition of the dense planner (seen at the layout level)."""

    shows_at = ("layout",)


class FitsStrictly(DenseConditionMutant):
    name = "dense-fits-strictly"
    description = "a request joins its chunk whole only below the budget (< for <=)"
    source = "hand port"
    conditions = (("dense.take_whole", "fits"),)
    aimed_at = "a request whose cost fills the chunk's free rows exactly (layout)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return _one(planner_module, "fits_whole", lambda geometry, used, need: used + need < geometry.budget)


class UnitFitsStrictly(DenseConditionMutant):
    name = "dense-unit-fits-strictly"
    description = "a request that does not fit is cut only when one alignment unit costs less than the free rows"
    source = "hand port"
    conditions = (("dense.split", "unit_fits"),)
    aimed_at = "a cut of one alignment unit into exactly that many free rows (layout)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = planner_module._largest_split

        def split(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
            if geometry.cost(start, geometry.alignment) >= free_rows:
                return 0
            return real(geometry, start, remaining, free_rows)

        return _one(planner_module, "_largest_split", split)


class CutUnderFreeRows(DenseConditionMutant):
    name = "dense-cut-under-free-rows"
    description = "a cut must cost less than the free rows (< for <=)"
    source = "hand port"
    conditions = (("dense.cut_by_free_rows", "free_rows_bind"),)
    aimed_at = "a cut whose cost is exactly the free rows (layout)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = planner_module._largest_split

        def split(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
            return real(geometry, start, remaining, free_rows - 1) if free_rows > 0 else 0

        return _one(planner_module, "_largest_split", split)


class DropsRemainder(DenseConditionMutant):
    name = "dense-drops-remainder"
    description = "the rest of a cut request is not continued by the next chunk"
    source = "hand port"
    conditions = (("dense.continuation", "previous_cut"),)
    aimed_at = "a request cut across chunks (layout)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = planner_module.plan_chunks

        def plan(context_lens: list[int], geometry: Geometry) -> list[PlannedChunk]:
            chunks = []
            for chunk in real(context_lens, geometry):
                if chunk.spans[0][0] > 0:
                    chunk = PlannedChunk(chunk.first + 1, chunk.spans[1:])
                if chunk.spans:
                    chunks.append(chunk)
            return chunks

        # The metadata builder calls the planner by the name it imported.
        return _one(metadata_module, "plan_chunks", plan)


class PaddedFloor(DenseConditionMutant):
    name = "dense-dcp-padded-floor"
    description = "DCP padded(n) rounds down: floor(n / (I*D)) * I"
    source = "hand port"
    conditions = (("dense.dcp_rounding", "off_stride"),)
    aimed_at = "a DCP span boundary off the I*D stride (layout)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def padded(geometry: Geometry, rows: int) -> int:
            if not geometry.sharded:
                return rows
            return rows // (geometry.interleave * geometry.dcp_world_size) * geometry.interleave

        return _one(Geometry, "padded", padded)


CONDITION_MUTANTS: tuple[type[ConditionMutant], ...] = (
    *WORKSPACE_MUTANTS,
    *THRESHOLD_ROW_MUTANTS,
    *_entry_mutants(),
    *ROUTE_MUTANTS,
    GLOBAL_FIT_STRICT,
    FitsStrictly,
    UnitFitsStrictly,
    CutUnderFreeRows,
    DropsRemainder,
    PaddedFloor,
)
