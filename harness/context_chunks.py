"""A chunk's attention partial on the shared kernels: the device work of one
step of the context loop (SPEC section 1c), given the chunk a side planned.

Every side's context loop runs this for each of its own chunks: the oracle's
through upstream's code on the same kernels, the Python ports directly, and an
external port through the harness (the ``prefill`` op of
docs/external-port-protocol.md hands it the partials of its own layout's
chunks). What differs between sides is then their layout and how they fold
these partials, never the partials' arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.kernels import SharedKernels
from harness.model import Chunk, Layout
from harness.numeric import PrefillInputs

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
    """Attention of the chunk's query tokens ``[token_start, token_end)`` over the
    chunk's context rows, gathered into ``workspace`` and up-projected: output
    ``[token_end - token_start, heads, v_head_dim]`` in the inputs' dtype, LSE
    ``[heads, token_end - token_start]`` fp32."""
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


def planned_chunk_partials(
    layout: Layout, workspace_rows: int, inputs: PrefillInputs, kernels: SharedKernels
) -> list[Partial]:
    """Every chunk's partial, in layout order, for a layout planned by a port
    outside this process; each is a fresh tensor (no chunk's buffer is reused).

    The layout is the port's: a chunk that does not fit the workspace, or whose
    token or request span lies outside the batch, raises ``ValueError`` naming
    the chunk (the item is the port's error).
    """
    num_tokens, num_requests = inputs.num_tokens, int(inputs.block_table.shape[0])
    for i, chunk in enumerate(layout.chunks):
        if chunk.num_context_tokens > workspace_rows:
            raise ValueError(
                f"layout chunk {i} holds {chunk.num_context_tokens} context rows, the workspace {workspace_rows}"
            )
        if not 0 <= chunk.token_start <= chunk.token_end <= num_tokens:
            raise ValueError(f"layout chunk {i} spans tokens [{chunk.token_start}, {chunk.token_end}) of {num_tokens}")
        if not 0 <= chunk.request_start <= chunk.request_end <= num_requests:
            raise ValueError(
                f"layout chunk {i} spans requests [{chunk.request_start}, {chunk.request_end}) of {num_requests}"
            )
    workspace = torch.empty((workspace_rows, inputs.spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    return [chunk_partial(planned, inputs, kernels, workspace) for planned in device_chunks(layout, inputs.q.device)]
