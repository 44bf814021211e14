"""Per-chunk metadata for the per-request planner (SPEC section 1b).

Turns :class:`~ports.per_request.planner.PlannedChunk` plans into the harness's
:class:`~harness.model.Layout`: request and token ranges, chunk-local offsets,
the per-row request index, and under DCP the per-rank padded fields.
"""

from __future__ import annotations

from itertools import accumulate

from harness.model import Case, Chunk, Layout
from ports.per_request.planner import Geometry, PlannedChunk, plan_chunks


def rank_context_lens(context_len: int, world: int, interleave: int) -> tuple[int, ...]:
    """Context rows each DCP rank holds when rows are dealt out ``interleave`` at a time."""
    stride = world * interleave
    full_rounds = context_len // stride
    tail = context_len - full_rounds * stride
    return tuple(full_rounds * interleave + min(max(tail - rank * interleave, 0), interleave) for rank in range(world))


def _prefix_sums(values: list[int]) -> tuple[int, ...]:
    return tuple(accumulate(values, initial=0))


def _rows_of(seq_lens: list[int]) -> tuple[int, ...]:
    rows: list[int] = []
    for local_index, length in enumerate(seq_lens):
        rows.extend([local_index] * length)
    return tuple(rows)


def _chunk_metadata(
    index: int, plan: PlannedChunk, case: Case, geometry: Geometry, query_start_loc: list[int]
) -> Chunk:
    starts = [start for start, _ in plan.spans]
    seq_lens = [length for _, length in plan.spans]
    token_base = query_start_loc[plan.first]
    local_qsl = tuple(query_start_loc[r] - token_base for r in range(plan.first, plan.end + 1))
    dcp: dict[str, object] = {}
    if geometry.sharded:
        local_starts = [geometry.padded(start) for start in starts]
        local_lens = [geometry.cost(start, length) for start, length in plan.spans]
        dcp = {
            "local_starts": tuple(local_starts),
            "padded_local_seq_lens": tuple(local_lens),
            "padded_local_cu_seq_lens": _prefix_sums(local_lens),
            "padded_local_token_to_seq": _rows_of(local_lens),
            "local_context_lens_allranks": tuple(
                rank_context_lens(case.context_lens[r], case.dcp_world_size, case.cp_kv_cache_interleave_size)
                for r in range(plan.first, plan.end)
            ),
            "num_local_context_tokens": sum(local_lens),
        }
    return Chunk(
        index=index,
        request_start=plan.first,
        request_end=plan.end,
        token_start=token_base,
        token_end=query_start_loc[plan.end],
        continuation_token_end=query_start_loc[plan.first + 1],
        is_continuation=starts[0] > 0,
        num_context_tokens=sum(seq_lens),
        query_start_loc=local_qsl,
        max_query_len=max(case.query_lens[plan.first : plan.end]),
        cu_seq_lens=_prefix_sums(seq_lens),
        # The gather takes each rank's local offsets under DCP.
        starts=tuple(dcp["local_starts"]) if geometry.sharded else tuple(starts),  # type: ignore[arg-type]
        seq_lens=tuple(seq_lens),
        max_seq_len=max(seq_lens),
        token_to_seq=_rows_of(seq_lens),
        **dcp,  # type: ignore[arg-type]
    )


def build_layout(case: Case) -> Layout:
    """The full per-request layout of ``case``.

    When no request has context there is no chunked-context metadata at all:
    no chunks and no empty token slices.
    """
    geometry = Geometry.for_workspace(
        case.workspace_size,
        case.block_size,
        case.align_to_block,
        case.dcp_world_size,
        case.cp_kv_cache_interleave_size,
    )
    if max(case.context_lens, default=0) == 0:
        return Layout(chunks=())
    query_start_loc = case.query_start_loc
    empty = tuple((query_start_loc[r], query_start_loc[r + 1]) for r, c in enumerate(case.context_lens) if c == 0)
    plans = plan_chunks(list(case.context_lens), geometry)
    chunks = tuple(_chunk_metadata(index, plan, case, geometry, query_start_loc) for index, plan in enumerate(plans))
    return Layout(chunks=chunks, empty_token_slices=empty)
