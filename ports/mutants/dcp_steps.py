"""DCP-step mutants: per_request with the right layout but the wrong rows in the
DCP step of a chunk.

Under decode context parallelism each rank holds an interleaved share of every
request's context; a chunk all-gathers the ranks' rows and reorders them
request by request, rank by rank, dropping each rank's padding, before
attending them. These mutants plan and report the layout exactly as
per_request does and get that step wrong (the order of the rows, the padding
kept, a rank's share of a continued request uncapped), so no layout check can
see them: only an L3 item can. Each names its input class in ``aimed_at``.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.model import Case, Chunk
from ports.mutants.base import Mutant, swapped
from ports.per_request import dcp as dcp_module
from ports.per_request import prefill as prefill_module


def _rank_segments(chunk: Chunk) -> list[tuple[int, int, int, int]]:
    """(request k, rank, first row of the rank's segment in the all-gathered
    buffer, real rows) of every request and rank of a DCP chunk, in upstream's order."""
    assert chunk.padded_local_seq_lens is not None and chunk.local_starts is not None
    assert chunk.local_context_lens_allranks is not None and chunk.padded_local_cu_seq_lens is not None
    assert chunk.num_local_context_tokens is not None
    segments = []
    for k, held_by_rank in enumerate(chunk.local_context_lens_allranks):
        for rank, held in enumerate(held_by_rank):
            first = rank * chunk.num_local_context_tokens + chunk.padded_local_cu_seq_lens[k]
            real = dcp_module.rank_rows_in_chunk(held, chunk.local_starts[k], chunk.padded_local_seq_lens[k])
            segments.append((k, rank, first, real))
    return segments


class DcpReorderInContextOrder(Mutant):
    """The reorder puts each request's rows back in context order, interleaving
    the ranks' rows as the cache dealt them out. The rows are the right ones and
    the attention is the same function of them, but upstream attends them rank
    by rank: the keys are summed in another order, and the bits differ."""

    name = "dcp-reorder-context-order"
    aimed_at = "L3: a DCP chunk in which a request has rows on two or more ranks"
    description = (
        "reorders the all-gathered rows into context order (ranks interleaved) instead of upstream's "
        "request-then-rank order: the same keys summed in another order"
    )
    source = "hand port"

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        world, interleave = case.dcp_world_size, case.cp_kv_cache_interleave_size

        def context_ordered(chunk: Chunk, world_size: int) -> list[int]:
            assert chunk.local_starts is not None
            keyed = []
            for k, rank, first, real in _rank_segments(chunk):
                for j in range(real):
                    local = chunk.local_starts[k] + j
                    position = (local // interleave) * interleave * world + rank * interleave + local % interleave
                    keyed.append(((k, position), first + j))
            return [row for _, row in sorted(keyed)]

        layout = self.plan_layout(case)
        with swapped([(dcp_module, "kept_rows", context_ordered)]):
            return prefill_module.prefill(layout, case.workspace_size, inputs, kernels)


class DcpReorderKeepsPadding(Mutant):
    """The reorder keeps every rank's whole padded segment of a request, padding
    rows included, and the attention takes the first rows it is told of: a rank
    that holds fewer rows than the padded count pushes padding (NaN in the
    harness's caches) and the wrong rows into the chunk."""

    name = "dcp-reorder-keeps-padding"
    aimed_at = "L3: a DCP chunk where a rank holds fewer of a request's rows than the padded count"
    description = "keeps each rank's padded rows of a request in the reorder instead of dropping the padding"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def with_padding(chunk: Chunk, world_size: int) -> list[int]:
            assert chunk.padded_local_seq_lens is not None
            rows = [
                row
                for k, _, first, _ in _rank_segments(chunk)
                for row in range(first, first + chunk.padded_local_seq_lens[k])
            ]
            return rows[: chunk.num_context_tokens]

        return [(dcp_module, "kept_rows", with_padding)]


class DcpSegmentUncapped(Mutant):
    """A rank's rows of a request in a chunk are taken as all it holds past the
    local start, without the cap at the chunk's padded count: right whenever the
    chunk holds the rest of the request, wrong for a request continued in a
    later chunk, whose piece here then reaches into the next request's (or past
    the rank's) segment."""

    name = "dcp-segment-uncapped"
    aimed_at = "L3: a DCP request continued in a later chunk"
    description = (
        "counts a rank's rows of a request in a chunk as all it holds past the local start, without the cap at the "
        "padded count: a request continued in a later chunk takes other rows"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def uncapped(held: int, local_start: int, padded_len: int) -> int:
            return max(held - local_start, 0)

        real_kept_rows = dcp_module.kept_rows

        def kept_without_check(chunk: Chunk, world_size: int) -> list[int]:
            # The port's own count check would refuse the plan; this port has none.
            try:
                return real_kept_rows(chunk, world_size)
            except ValueError:
                rows = [r for _, _, first, real in _rank_segments(chunk) for r in range(first, first + real)]
                limit = world_size * (chunk.num_local_context_tokens or 0)
                return [min(r, limit - 1) for r in rows][: chunk.num_context_tokens]

        return [(dcp_module, "rank_rows_in_chunk", uncapped), (dcp_module, "kept_rows", kept_without_check)]
