"""The port's DCP context step (decode context parallelism, SPEC 1b's DCP fields).

Under DCP a rank's cache holds only its interleaved share of each request's
context, so one chunk's context rows come together in three steps:

1. *Local gather.* Each rank gathers, for every request ``k`` of the chunk,
   ``padded_local_seq_lens[k]`` rows of its own cache from local position
   ``local_starts[k]``, into rows ``[padded_local_cu_seq_lens[k], ...[k+1])``
   of a buffer of ``num_local_context_tokens`` rows. Every rank reads the same
   padded count; a rank that holds fewer of the request's rows reads padding.
2. *All-gather.* The buffers of ranks ``0..D-1`` are concatenated, rank-major
   (the collective: :mod:`harness.model.dcp`).
3. *Reorder.* For each request in chunk order, then each rank in rank order,
   keep the rank's real rows of that request in this chunk,
   ``min(max(0, local_context_lens_allranks[k][rank] - local_starts[k]),
   padded_local_seq_lens[k])`` of them from the start of the rank's segment,
   and drop its padding. A request's rows thus come rank by rank, which is the
   key order the attention sees (upstream's order, not context order: the
   attention is the same function of either order, but not the same bits).

The rows, once reordered, are up-projected and attended exactly as a chunk
without DCP (the harness's shared kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.kernels import SharedKernels
from harness.kernels.context_chunks import Partial, context_rows_partial
from harness.kernels.numeric import PrefillInputs
from harness.model import Chunk, Layout


@dataclass(frozen=True)
class DcpDeviceChunk:
    """A DCP chunk's index tensors on the device, built once per layout: the
    local gather's (``local_cu_seq_lens``, ``local_token_to_seq``,
    ``local_starts``), the reorder's ``kept_rows`` (indices into the
    all-gathered buffer, in attention order) and the attention's offsets."""

    chunk: Chunk
    local_cu_seq_lens: torch.Tensor
    local_token_to_seq: torch.Tensor
    local_starts: torch.Tensor
    kept_rows: torch.Tensor
    query_start_loc: torch.Tensor
    cu_seq_lens: torch.Tensor


def rank_rows_in_chunk(held: int, local_start: int, padded_len: int) -> int:
    """How many real rows one rank contributes for one request of a chunk."""
    return min(max(held - local_start, 0), padded_len)


def kept_rows(chunk: Chunk, world_size: int) -> list[int]:
    """Indices into the all-gathered buffer (``world_size`` rank segments of
    ``num_local_context_tokens`` rows each) of the rows the attention sees, in
    its order: request by request, rank by rank, padding dropped."""
    assert chunk.padded_local_seq_lens is not None and chunk.local_starts is not None
    assert chunk.local_context_lens_allranks is not None and chunk.padded_local_cu_seq_lens is not None
    assert chunk.num_local_context_tokens is not None
    segment = chunk.num_local_context_tokens
    kept: list[int] = []
    for k, (padded_len, local_start, held_by_rank) in enumerate(
        zip(chunk.padded_local_seq_lens, chunk.local_starts, chunk.local_context_lens_allranks, strict=True)
    ):
        for rank, held in enumerate(held_by_rank):
            first = rank * segment + chunk.padded_local_cu_seq_lens[k]
            kept.extend(range(first, first + rank_rows_in_chunk(held, local_start, padded_len)))
    if len(kept) != chunk.num_context_tokens:
        raise ValueError(
            f"chunk {chunk.index}: the ranks hold {len(kept)} of its rows, its layout says {chunk.num_context_tokens}"
        )
    return kept


def dcp_device_chunks(layout: Layout, world_size: int, device: torch.device) -> tuple[DcpDeviceChunk, ...]:
    def index(values: tuple[int, ...] | list[int] | None) -> torch.Tensor:
        assert values is not None
        return torch.tensor(values, dtype=torch.int32).to(device, non_blocking=True)

    return tuple(
        DcpDeviceChunk(
            c,
            index(c.padded_local_cu_seq_lens),
            index(c.padded_local_token_to_seq),
            index(c.local_starts),
            torch.tensor(kept_rows(c, world_size), dtype=torch.long).to(device, non_blocking=True),
            index(c.query_start_loc),
            index(c.cu_seq_lens),
        )
        for c in layout.chunks
    )


def dcp_chunk_partial(planned: DcpDeviceChunk, inputs: PrefillInputs, kernels: SharedKernels) -> Partial:
    """The chunk's partial under DCP: every rank's local gather, the all-gather,
    the reorder, then up-projection and attention as without DCP."""
    dcp, chunk = inputs.dcp, planned.chunk
    assert dcp is not None and chunk.num_local_context_tokens is not None
    rows = chunk.num_local_context_tokens

    def local_rows(rank: int) -> torch.Tensor:
        cache = dcp.cache(rank)
        local = torch.empty((rows, inputs.spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
        kernels.gather(
            cache.kv_cache,
            local,
            cache.block_table[chunk.request_start : chunk.request_end],
            planned.local_cu_seq_lens,
            planned.local_token_to_seq,
            planned.local_starts,
            rows,
        )
        return local

    gathered = dcp.collective.all_gather(local_rows)
    latent = gathered.index_select(0, planned.kept_rows)
    return context_rows_partial(chunk, planned.query_start_loc, planned.cu_seq_lens, latent, inputs, kernels)
