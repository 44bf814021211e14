"""The port's prefill context loop and final merge (SPEC section 1c).

The device work of a chunk (gather, up-projection, attention) is the harness's
shared kernels; what is the port's own is the order of work and the folding of
chunk partials into the running context partial:

* the running partial covers every prefill token; empty token slices start as
  (output 0, LSE -inf);
* a continuation chunk *merges* its first request's tokens
  ``[token_start, continuation_token_end)`` into the partial and *writes* the
  rest; any other chunk writes all of its tokens (their first visit);
* a batch that is one chunk with no empty slices uses that chunk's partial as is;
* the output is ``merge(context partial, new-token partial)`` cut to ``v_head_dim``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from harness.kernels import SharedKernels

# The chunk's device work (gather, up-projection, attention on the shared
# kernels) is the harness's; imported into this module so the loop below reads
# them from here (the mutants replace them here).
from harness.kernels.context_chunks import DeviceChunk, Partial, chunk_partial, device_chunks
from harness.kernels.numeric import PrefillInputs, new_token_partial
from harness.model import Layout
from ports.per_request.dcp import dcp_chunk_partial, dcp_device_chunks
from ports.per_request.merge_kernel import merge_partials

__all__ = [
    "DeviceChunk",
    "Partial",
    "chunk_partial",
    "context_partial",
    "device_chunks",
    "final_merge",
    "fold_partials",
    "prefill",
]


def context_partial(
    layout: Layout,
    workspace_rows: int,
    inputs: PrefillInputs,
    kernels: SharedKernels,
    planned: tuple[DeviceChunk, ...] | None = None,
) -> Partial:
    """Every chunk's partial on the shared kernels, folded into one context
    partial over all prefill tokens (:func:`fold_partials`).

    ``planned`` is :func:`device_chunks` of ``layout``, built here when not given.
    Under DCP (``inputs.dcp``) each chunk's rows come from every rank's cache
    through the all-gather and the port's reorder (:mod:`ports.per_request.dcp`).
    """
    if inputs.dcp is not None:
        dcp_planned = dcp_device_chunks(layout, inputs.dcp.world_size, inputs.q.device)
        return fold_partials(layout, inputs.num_tokens, (dcp_chunk_partial(c, inputs, kernels) for c in dcp_planned))
    if planned is None:
        planned = device_chunks(layout, inputs.q.device)
    workspace = torch.empty((workspace_rows, inputs.spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    # A generator: each chunk's partial is folded before the next one reuses the workspace.
    partials = (chunk_partial(item, inputs, kernels, workspace) for item in planned)
    return fold_partials(layout, inputs.num_tokens, partials)


def fold_partials(layout: Layout, num_tokens: int, partials: Iterable[Partial]) -> Partial:
    """Fold the chunks' partials (one per chunk of ``layout``, in order) into the
    running context partial ``[num_tokens, ...]``: the loop of the module
    docstring. ``layout`` has at least one chunk."""
    running: Partial | None = None
    for chunk, (out, lse) in zip(layout.chunks, partials, strict=True):
        if running is None:
            if layout.num_chunks == 1 and not layout.empty_token_slices:
                return out, lse
            running = (
                torch.empty((num_tokens, *out.shape[1:]), dtype=out.dtype, device=out.device),
                torch.empty((lse.shape[0], num_tokens), dtype=lse.dtype, device=lse.device),
            )
            for start, stop in layout.empty_token_slices:
                running[0][start:stop] = 0
                running[1][:, start:stop] = float("-inf")
        total_out, total_lse = running
        first_visit = chunk.token_start
        if chunk.is_continuation:
            first_visit = chunk.continuation_token_end
            merged = first_visit - chunk.token_start
            span = slice(chunk.token_start, first_visit)
            merge_partials(
                total_out[span],
                total_lse[:, span],
                out[:merged],
                lse[:, :merged],
                out=total_out[span],
                out_lse=total_lse[:, span],
            )
        done = first_visit - chunk.token_start
        total_out[first_visit : chunk.token_end] = out[done:]
        total_lse[:, first_visit : chunk.token_end] = lse[:, done:]
    assert running is not None, "a layout with chunks produced no partial"
    return running


def final_merge(context: Partial, suffix: Partial, v_head_dim: int) -> dict[str, torch.Tensor]:
    """``merge(context partial, suffix partial)`` cut to ``v_head_dim``, with both partials' tensors."""
    (context_out, context_lse), (suffix_out, suffix_lse) = context, suffix
    output, lse = torch.empty_like(suffix_out), torch.empty_like(suffix_lse)
    merge_partials(
        context_out[..., :v_head_dim], context_lse, suffix_out[..., :v_head_dim], suffix_lse, out=output, out_lse=lse
    )
    return {"context_output": context_out, "context_lse": context_lse, "output": output, "lse": lse}


def prefill(
    layout: Layout, workspace_rows: int, inputs: PrefillInputs, kernels: SharedKernels
) -> dict[str, torch.Tensor]:
    """``context_output``/``context_lse`` (when any request has context) and the
    final ``output``/``lse``."""
    suffix_out, suffix_lse = new_token_partial(inputs, kernels)
    if not layout.chunks:
        return {"output": suffix_out, "lse": suffix_lse}
    context = context_partial(layout, workspace_rows, inputs, kernels)
    return final_merge(context, (suffix_out, suffix_lse), inputs.spec.v_head_dim)
