"""The legacy context loop over the equal-share grid (SPEC section 1a).

Every chunk spans the whole prefill batch. The first chunk's partial is the
running partial; every later chunk is merged into it over all tokens. A request
that contributes no rows to a chunk has its rows' partial neutralised (output 0,
LSE -inf) before the merge: a finite LSE there was the upstream bug of seeds/003.

The per-chunk device work (the harness's), the merge kernel and the DCP step of
a chunk (local gather, all-gather, reorder) did not change in b38e111d3e, so
this port reuses per_request's merge kernel and DCP step. The final merge is
the legacy one (vllm==0.27.1's ``forward_mha``): it covers only the tokens
before ``qsl[number of prefills with context]`` (:func:`tokens_with_context`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.kernels import SharedKernels
from harness.kernels.context_chunks import DeviceChunk, chunk_partial, device_chunks
from harness.kernels.numeric import PrefillInputs, new_token_partial
from harness.model import Layout
from ports.per_request.dcp import dcp_chunk_partial, dcp_device_chunks
from ports.per_request.merge_kernel import merge_partials


def rowless_tokens(seq_lens: tuple[int, ...], qsl: tuple[int, ...]) -> torch.Tensor:
    """A ``[tokens]`` mask of the tokens whose request has no rows in this chunk."""
    mask = torch.zeros(qsl[-1], dtype=torch.bool)
    for request, rows in enumerate(seq_lens):
        if rows == 0:
            mask[qsl[request] : qsl[request + 1]] = True
    return mask


@dataclass(frozen=True)
class GridChunk:
    """A grid chunk's device tensors, built once per layout before the loop: its
    index tensors and the mask of its tokens whose request has no rows in it."""

    planned: DeviceChunk
    rowless: torch.Tensor


def grid_chunks(layout: Layout, device: torch.device) -> tuple[GridChunk, ...]:
    return tuple(
        GridChunk(planned, rowless_tokens(planned.chunk.seq_lens, planned.chunk.query_start_loc).to(device))
        for planned in device_chunks(layout, device)
    )


def neutralise_empty_rows(rowless: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Zero output, -inf LSE on the ``rowless`` tokens (in place), whatever the
    attention backend reported there: -inf, FlashAttention's +inf, or a finite
    LSE over undefined output (seeds/003). The shared kernels play each of
    those (``numeric.keyless_rows``); after this step the loop's result is the
    same bits under all three, and without it the ``equal-share-no-neutralise``
    mutant is caught."""
    out.masked_fill_(rowless[:, None, None], 0.0)
    lse.masked_fill_(rowless[None, :], float("-inf"))


def context_partial(
    layout: Layout,
    workspace_rows: int,
    inputs: PrefillInputs,
    kernels: SharedKernels,
    planned: tuple[GridChunk, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid's running partial: chunk 0's partial, every later chunk merged in.

    ``planned`` is :func:`grid_chunks` of ``layout``, built here when not given.
    """
    device = inputs.q.device
    if planned is None:
        planned = grid_chunks(layout, device)
    workspace = torch.empty((workspace_rows, inputs.spec.latent_dim), dtype=inputs.q.dtype, device=device)
    dcp_planned = dcp_device_chunks(layout, inputs.dcp.world_size, device) if inputs.dcp is not None else None
    total: tuple[torch.Tensor, torch.Tensor] | None = None
    for index, item in enumerate(planned):
        if dcp_planned is not None:
            out, lse = dcp_chunk_partial(dcp_planned[index], inputs, kernels)
        else:
            out, lse = chunk_partial(item.planned, inputs, kernels, workspace)
        neutralise_empty_rows(item.rowless, out, lse)
        if total is None:
            total = (out, lse)
            continue
        merge_partials(total[0], total[1], out, lse, out=total[0], out_lse=total[1])
    assert total is not None, "a layout with chunks produced no partial"
    return total


def tokens_with_context(layout: Layout) -> int:
    """``qsl[number of prefills with context]``: the legacy final merge covers
    the tokens before it and takes the suffix as it is from there on.

    The engine of the legacy release orders zero-context prefills last, so that
    count is a prefix of the batch there; in a batch that places one before a
    request with context, the later request's tokens lose their context (as
    vllm==0.27.1's final merge does). Chunk 0 covers every request's first
    window, so its requests with rows are exactly those with context.
    """
    first = layout.chunks[0]
    return first.query_start_loc[sum(1 for rows in first.seq_lens if rows > 0)]


def final_merge(
    context: tuple[torch.Tensor, torch.Tensor],
    suffix: tuple[torch.Tensor, torch.Tensor],
    v_head_dim: int,
    merged_tokens: int,
) -> dict[str, torch.Tensor]:
    """``merge(context partial, suffix partial)`` cut to ``v_head_dim`` over the
    first ``merged_tokens`` tokens, the suffix copied bit for bit after them."""
    (context_out, context_lse), (suffix_out, suffix_lse) = context, suffix
    output, lse = torch.empty_like(suffix_out), torch.empty_like(suffix_lse)
    merge_partials(
        context_out[..., :v_head_dim],
        context_lse,
        suffix_out[..., :v_head_dim],
        suffix_lse,
        out=output,
        out_lse=lse,
        tokens_with_context=merged_tokens,
    )
    return {"context_output": context_out, "context_lse": context_lse, "output": output, "lse": lse}


def prefill(
    layout: Layout, workspace_rows: int, inputs: PrefillInputs, kernels: SharedKernels
) -> dict[str, torch.Tensor]:
    suffix = new_token_partial(inputs, kernels)
    if not layout.chunks:
        return {"output": suffix[0], "lse": suffix[1]}
    context = context_partial(layout, workspace_rows, inputs, kernels)
    return final_merge(context, suffix, inputs.spec.v_head_dim, tokens_with_context(layout))
