"""Three-piece mutants: per_request with a fault that is right for a request in
one or two pieces and wrong only from the third.

A request longer than a chunk is split across chunks, and each continuation
piece is merged into what the earlier pieces left. A port that merges into the
previous chunk's partial instead of the running one is right while that
partial is all there is, so only a request split into three or more pieces can
tell.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.model import Chunk, Layout
from ports.mutants.base import Mutant
from ports.per_request import merge_kernel as merge_module
from ports.per_request import prefill as prefill_module


def context_partial_merging_previous_chunk(
    layout: Layout,
    workspace_rows: int,
    inputs: Any,
    kernels: Any,
    planned: tuple[prefill_module.DeviceChunk, ...] | None = None,
) -> prefill_module.Partial:
    """per_request's context loop, except that a continuation merges into the
    previous chunk's own partial of its request instead of the running partial.
    Right for a request in two pieces (the previous chunk's partial is then all
    the running partial holds for it); a third piece loses the first."""
    spec = inputs.spec
    if planned is None:
        planned = prefill_module.device_chunks(layout, inputs.q.device)
    workspace = torch.empty((workspace_rows, spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    running: prefill_module.Partial | None = None
    previous: tuple[Chunk, torch.Tensor, torch.Tensor] | None = None
    for item in planned:
        chunk = item.chunk
        out, lse = prefill_module.chunk_partial(item, inputs, kernels, workspace)
        if running is None:
            if layout.num_chunks == 1 and not layout.empty_token_slices:
                return out, lse
            running = (
                torch.empty((inputs.num_tokens, *out.shape[1:]), dtype=out.dtype, device=out.device),
                torch.empty((lse.shape[0], inputs.num_tokens), dtype=lse.dtype, device=lse.device),
            )
            for start, stop in layout.empty_token_slices:
                running[0][start:stop] = 0
                running[1][:, start:stop] = float("-inf")
        total_out, total_lse = running
        first_visit = chunk.token_start
        if chunk.is_continuation and previous is not None:
            first_visit = chunk.continuation_token_end
            merged = first_visit - chunk.token_start
            prev_chunk, prev_out, prev_lse = previous
            rows = slice(chunk.token_start - prev_chunk.token_start, first_visit - prev_chunk.token_start)
            span = slice(chunk.token_start, first_visit)
            merge_module.merge_partials(
                prev_out[rows],
                prev_lse[:, rows],
                out[:merged],
                lse[:, :merged],
                out=total_out[span],
                out_lse=total_lse[:, span],
            )
        done = first_visit - chunk.token_start
        total_out[first_visit : chunk.token_end] = out[done:]
        total_lse[:, first_visit : chunk.token_end] = lse[:, done:]
        previous = (chunk, out, lse)
    assert running is not None, "a layout with chunks produced no partial"
    return running


class ContinuationMergesPreviousChunk(Mutant):
    name = "continuation-merges-previous-chunk"
    aimed_at = "L3: a request split into three or more pieces"
    description = (
        "merges a continuation into the previous chunk's partial, not the running one: a request's third piece "
        "drops its first"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return [(prefill_module, "context_partial", context_partial_merging_previous_chunk)]
