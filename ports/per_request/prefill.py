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

from dataclasses import dataclass

import torch

from harness.kernels import SharedKernels
from harness.model import Chunk, Layout
from harness.numeric import PrefillInputs, new_token_partial
from ports.per_request.merge_kernel import merge_partials

Partial = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DeviceChunk:
    """A chunk with its index tensors already on the device, built once per
    layout before the loop (as upstream's metadata builder does), so the loop
    itself never waits on a host-to-device copy."""

    chunk: Chunk
    cu_seq_lens: torch.Tensor
    token_to_seq: torch.Tensor
    starts: torch.Tensor
    query_start_loc: torch.Tensor


def device_chunks(layout: Layout, device: torch.device) -> tuple[DeviceChunk, ...]:
    def index(values: tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device, non_blocking=True)

    return tuple(
        DeviceChunk(c, index(c.cu_seq_lens), index(c.token_to_seq), index(c.starts), index(c.query_start_loc))
        for c in layout.chunks
    )


def chunk_partial(
    planned: DeviceChunk, inputs: PrefillInputs, kernels: SharedKernels, workspace: torch.Tensor
) -> Partial:
    """Attention of the chunk's query tokens over the chunk's gathered context rows."""
    chunk, spec = planned.chunk, inputs.spec
    rows = chunk.num_context_tokens
    kernels.gather(
        inputs.kv_cache,
        workspace,
        inputs.block_table[chunk.request_start : chunk.request_end],
        planned.cu_seq_lens,
        planned.token_to_seq,
        planned.starts,
        rows,
    )
    latent = workspace[:rows]
    kv = kernels.kv_b_proj(inputs.kv_b_weight, latent[:, : spec.kv_lora_rank])
    per_head = kv.view(-1, spec.num_heads, spec.qk_nope_head_dim + spec.v_head_dim)
    k_nope, v = torch.split(per_head, [spec.qk_nope_head_dim, spec.v_head_dim], dim=-1)
    k_rope = latent[:, spec.kv_lora_rank :].unsqueeze(1).expand(-1, spec.num_heads, -1)
    k = torch.cat([k_nope, k_rope], dim=-1)
    q = inputs.q[chunk.token_start : chunk.token_end]
    return kernels.attention(
        q,
        k,
        v,
        planned.query_start_loc,
        planned.cu_seq_lens,
        False,
        inputs.scale,
        chunk.max_query_len,
        chunk.max_seq_len,
    )


def context_partial(
    layout: Layout,
    workspace_rows: int,
    inputs: PrefillInputs,
    kernels: SharedKernels,
    planned: tuple[DeviceChunk, ...] | None = None,
) -> Partial:
    """Fold every chunk's partial into one context partial over all prefill tokens.

    ``planned`` is :func:`device_chunks` of ``layout``, built here when not given.
    """
    spec = inputs.spec
    if planned is None:
        planned = device_chunks(layout, inputs.q.device)
    workspace = torch.empty((workspace_rows, spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    running: Partial | None = None
    for item in planned:
        chunk = item.chunk
        out, lse = chunk_partial(item, inputs, kernels, workspace)
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
