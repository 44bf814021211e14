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

import itertools
import sys
from dataclasses import dataclass

import torch

from harness.kernels import SharedKernels, record_definitions
from harness.kernels.masked_attention import Selection
from harness.kernels.numeric import PrefillInputs
from harness.model import Case, Chunk, Layout

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
    latent = gather_chunk(planned, inputs, kernels, workspace)
    return context_rows_partial(planned.chunk, planned.query_start_loc, planned.cu_seq_lens, latent, inputs, kernels)


def gather_chunk(
    planned: DeviceChunk, inputs: PrefillInputs, kernels: SharedKernels, workspace: torch.Tensor
) -> torch.Tensor:
    """The chunk's context rows, gathered in order into ``workspace``: its first
    ``num_context_tokens`` rows."""
    chunk = planned.chunk
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
    return workspace[:rows]


def context_rows_partial(
    chunk: Chunk,
    query_start_loc: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    latent: torch.Tensor,
    inputs: PrefillInputs,
    kernels: SharedKernels,
) -> Partial:
    """The chunk's partial over context rows already gathered in order into
    ``latent`` ``[num_context_tokens, latent_dim]``: the up-projection, the shared
    ``k_pe`` and the non-causal attention of the chunk's tokens (``query_start_loc``
    and ``cu_seq_lens`` on the device)."""
    k, v = context_rows_kv(latent, inputs, kernels)
    q = inputs.q[chunk.token_start : chunk.token_end]
    return kernels.attention(
        q, k, v, query_start_loc, cu_seq_lens, False, inputs.scale, chunk.max_query_len, chunk.max_seq_len
    )


def context_rows_kv(latent: torch.Tensor, inputs: PrefillInputs, kernels: SharedKernels) -> Partial:
    """Keys ``[rows, heads, qk]`` and values ``[rows, heads, v]`` of gathered
    context rows ``latent`` ``[rows, latent_dim]``: the up-projection and the
    shared ``k_pe``."""
    spec = inputs.spec
    kv = kernels.kv_b_proj(inputs.kv_b_weight, latent[:, : spec.kv_lora_rank])
    per_head = kv.view(-1, spec.num_heads, spec.qk_nope_head_dim + spec.v_head_dim)
    k_nope, v = torch.split(per_head, [spec.qk_nope_head_dim, spec.v_head_dim], dim=-1)
    # Two copies into one buffer, the shared rope part broadcast over the heads:
    # torch.cat of an expanded tensor first materialises the expansion (the
    # reason upstream's _concat_k_nope_k_pe is written this way too).
    k = torch.empty(
        (*k_nope.shape[:-1], spec.qk_nope_head_dim + spec.qk_rope_head_dim), dtype=k_nope.dtype, device=k_nope.device
    )
    k[..., : spec.qk_nope_head_dim] = k_nope
    k[..., spec.qk_nope_head_dim :] = latent[:, spec.kv_lora_rank :].unsqueeze(1)
    return k, v


def masked_chunk_partial(
    planned: DeviceChunk, inputs: PrefillInputs, kernels: SharedKernels, workspace: torch.Tensor, selection: Selection
) -> Partial:
    """:func:`chunk_partial` with masked attention: the chunk's tokens over its
    gathered rows, each token seeing only the keys ``selection`` names (per-range
    indices of the chunk's requests, or their packed mask with key starts)."""
    chunk = planned.chunk
    k, v = context_rows_kv(gather_chunk(planned, inputs, kernels, workspace), inputs, kernels)
    q = inputs.q[chunk.token_start : chunk.token_end]
    return kernels.masked_attention(
        q, k, v, planned.query_start_loc, planned.cu_seq_lens, False, inputs.scale, selection
    )


def check_runnable(layout: Layout, case: Case) -> None:
    """Refuse, with a ``ValueError`` naming the chunk and field, a layout whose
    chunks the shared kernels cannot run for ``case``: every index a chunk hands
    the gather and attention must lie inside the case's batch, cache and
    workspace (on a GPU an index out of range is a device-side assert that ends
    the whole run, not one item's error). Only what running needs is checked;
    whether the layout is *right* is for the comparison to say.
    """
    num_requests, num_tokens = len(case.context_lens), sum(case.query_lens)
    for i, chunk in enumerate(layout.chunks):
        where, rows = f"layout chunk {i}", chunk.num_context_tokens
        requests, tokens = chunk.request_end - chunk.request_start, chunk.token_end - chunk.token_start
        if not 0 <= chunk.request_start < chunk.request_end <= num_requests:
            raise ValueError(f"{where} spans requests [{chunk.request_start}, {chunk.request_end}) of {num_requests}")
        if not 0 <= chunk.token_start <= chunk.token_end <= num_tokens:
            raise ValueError(f"{where} spans tokens [{chunk.token_start}, {chunk.token_end}) of {num_tokens}")
        if not 0 <= rows <= case.workspace_size:
            raise ValueError(f"{where} holds {rows} context rows, the workspace {case.workspace_size}")
        for name in ("cu_seq_lens", "query_start_loc", "starts", "seq_lens"):
            wanted = requests + (1 if name in ("cu_seq_lens", "query_start_loc") else 0)
            if len(getattr(chunk, name)) != wanted:
                raise ValueError(f"{where}: {name} has {len(getattr(chunk, name))} entries for {requests} requests")
        cu, seq_lens, starts, qsl = chunk.cu_seq_lens, chunk.seq_lens, chunk.starts, chunk.query_start_loc
        if cu[0] != 0 or cu[-1] != rows or any(cu[k + 1] - cu[k] != seq_lens[k] for k in range(requests)):
            raise ValueError(f"{where}: cu_seq_lens is not the running sum of seq_lens, ending at its {rows} rows")
        for k in range(requests):
            context = case.context_lens[chunk.request_start + k]
            if seq_lens[k] < 0 or starts[k] < 0 or starts[k] + seq_lens[k] > context:
                raise ValueError(
                    f"{where}: request {chunk.request_start + k}'s rows [{starts[k]}, {starts[k] + seq_lens[k]}) "
                    f"lie outside its {context} context tokens"
                )
        if chunk.token_to_seq[:rows] != tuple(k for k in range(requests) for _ in range(seq_lens[k])):
            raise ValueError(f"{where}: token_to_seq does not name each row's request as cu_seq_lens places it")
        query_lens = [b - a for a, b in itertools.pairwise(qsl)]
        if qsl[0] != 0 or qsl[-1] != tokens or min(query_lens, default=0) < 0:
            raise ValueError(f"{where}: query_start_loc does not split its {tokens} tokens")
        if not max(seq_lens, default=0) <= chunk.max_seq_len <= rows:
            raise ValueError(f"{where}: max_seq_len {chunk.max_seq_len} is not within [longest, {rows} rows]")
        if not max(query_lens, default=0) <= chunk.max_query_len <= tokens:
            raise ValueError(f"{where}: max_query_len {chunk.max_query_len} is not within [longest, {tokens} tokens]")


def check_runnable_dcp(layout: Layout, case: Case) -> None:
    """:func:`check_runnable` for a DCP layout's local fields: every local window
    a rank's gather reads must lie inside what the per-rank caches hold for the
    request (:func:`harness.model.dcp.padded_local_len` rows), the local offsets must be
    the running sums of the padded lengths, and the per-rank row counts must be
    ``D`` entries per request."""
    from harness.model.dcp import padded_local_len

    world, interleave = case.dcp_world_size, case.cp_kv_cache_interleave_size
    for i, chunk in enumerate(layout.chunks):
        where, requests = f"layout chunk {i}", chunk.request_end - chunk.request_start
        local = (
            chunk.local_starts,
            chunk.padded_local_seq_lens,
            chunk.padded_local_cu_seq_lens,
            chunk.padded_local_token_to_seq,
            chunk.local_context_lens_allranks,
            chunk.num_local_context_tokens,
        )
        if any(field is None for field in local):
            raise ValueError(f"{where} lacks its DCP fields under DCP world size {world}")
        starts, lens, cu, token_to_seq, allranks, rows = local
        assert starts is not None and lens is not None and cu is not None and token_to_seq is not None
        assert allranks is not None and rows is not None
        if len(starts) != requests or len(lens) != requests or len(cu) != requests + 1 or len(allranks) != requests:
            raise ValueError(f"{where}: its DCP fields do not hold one entry per request ({requests})")
        if not 0 <= rows <= case.row_budget or cu[0] != 0 or cu[-1] != rows:
            raise ValueError(
                f"{where}: num_local_context_tokens {rows} is not the padded lengths' sum within {case.row_budget}"
            )
        if any(cu[k + 1] - cu[k] != lens[k] for k in range(requests)):
            raise ValueError(f"{where}: padded_local_cu_seq_lens is not the running sum of padded_local_seq_lens")
        if token_to_seq[:rows] != tuple(k for k in range(requests) for _ in range(lens[k])) or len(token_to_seq) < rows:
            raise ValueError(f"{where}: padded_local_token_to_seq does not name each local row's request")
        for k in range(requests):
            context = case.context_lens[chunk.request_start + k]
            if starts[k] < 0 or lens[k] < 0 or starts[k] + lens[k] > padded_local_len(context, world, interleave):
                raise ValueError(f"{where}: request {chunk.request_start + k}'s local window lies outside its cache")
            if len(allranks[k]) != world or min(allranks[k], default=0) < 0:
                raise ValueError(f"{where}: local_context_lens_allranks has no {world} counts for request {k}")


def dcp_context_rows(chunk: Chunk, inputs: PrefillInputs, kernels: SharedKernels) -> torch.Tensor:
    """A DCP chunk's context rows as its layout's DCP fields place them, for a
    port outside this process (in process, a port gathers and reorders its own):
    every rank's local gather (``local_starts``, ``padded_local_cu_seq_lens``,
    ``padded_local_token_to_seq`` on its own cache), the rank-major all-gather,
    then for each request and each rank its real rows (``min(max(0,
    local_context_lens_allranks[k][rank] - local_starts[k]),
    padded_local_seq_lens[k])``) with the padding dropped: upstream's order."""
    dcp, device = inputs.dcp, inputs.q.device
    assert dcp is not None and chunk.num_local_context_tokens is not None
    assert chunk.local_starts is not None and chunk.padded_local_seq_lens is not None
    assert chunk.padded_local_cu_seq_lens is not None and chunk.padded_local_token_to_seq is not None
    assert chunk.local_context_lens_allranks is not None
    rows = chunk.num_local_context_tokens

    def index(values: tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device)

    cu, token_to_seq = index(chunk.padded_local_cu_seq_lens), index(chunk.padded_local_token_to_seq)
    starts = index(chunk.local_starts)

    def local_rows(rank: int) -> torch.Tensor:
        cache = dcp.cache(rank)
        local = torch.empty((rows, inputs.spec.latent_dim), dtype=inputs.q.dtype, device=device)
        block_table = cache.block_table[chunk.request_start : chunk.request_end]
        kernels.gather(cache.kv_cache, local, block_table, cu, token_to_seq, starts, rows)
        return local

    gathered = dcp.collective.all_gather(local_rows)
    kept: list[int] = []
    for k, held_by_rank in enumerate(chunk.local_context_lens_allranks):
        for rank, held in enumerate(held_by_rank):
            first = rank * rows + chunk.padded_local_cu_seq_lens[k]
            kept.extend(range(first, first + min(max(held - chunk.local_starts[k], 0), chunk.padded_local_seq_lens[k])))
    if len(kept) != chunk.num_context_tokens:
        raise ValueError(
            f"layout chunk {chunk.index}: its DCP fields place {len(kept)} rows, num_context_tokens says "
            f"{chunk.num_context_tokens}"
        )
    return gathered.index_select(0, torch.tensor(kept, dtype=torch.long, device=device))


def planned_chunk_partials(layout: Layout, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> list[Partial]:
    """Every chunk's partial, in layout order, for a layout planned by a port
    outside this process; each is a fresh tensor (no chunk's buffer is reused).

    The layout is the port's: one the kernels cannot run for ``case``
    (:func:`check_runnable`, and :func:`check_runnable_dcp` under DCP) raises
    ``ValueError`` naming the chunk before any kernel runs (the item is the
    port's error). Under DCP a chunk's rows are :func:`dcp_context_rows`.
    """
    check_runnable(layout, case)
    if inputs.dcp is not None:
        check_runnable_dcp(layout, case)
        partials = []
        for planned in device_chunks(layout, inputs.q.device):
            latent = dcp_context_rows(planned.chunk, inputs, kernels)
            partials.append(
                context_rows_partial(
                    planned.chunk, planned.query_start_loc, planned.cu_seq_lens, latent, inputs, kernels
                )
            )
        return partials
    workspace = torch.empty((case.workspace_size, inputs.spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    return [chunk_partial(planned, inputs, kernels, workspace) for planned in device_chunks(layout, inputs.q.device)]


# What the chunk gather is as the harness defines it (harness.kernels.kernels_untouched).
record_definitions(sys.modules[__name__])
