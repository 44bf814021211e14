"""The port's sparse prefill (SPEC 1d): the masked loop of upstream b38e111d3e.

On the dense-MHA route the batch is the section 1c loop in the sparse
workspace (:func:`ports.per_request.prefill.prefill`). On the masked-MHA route:

* every request's top-k rows are its slice of the batch's rows, in token order;
* the suffix is masked, causal attention of all new tokens over themselves,
  each token's indices taken relative to its request's context (``t - context``
  when ``context <= t < context + query``);
* each chunk gathers and up-projects its rows, then its own tokens
  (``[token_start, token_end)``) attend over them, each seeing the indices that
  fall in its request's rows of the chunk (``t - start`` for
  ``start <= t < start + seq_len``);
* the chunk partials fold into the context partial as in section 1c, and the
  output is ``merge(context, suffix)``.

When the global mask fits (the plan's ``global_mask_fits``) it is built once
over whole sequences and each attention reads it with key starts (the suffix's
are the context lengths, a chunk's its requests' ``starts``); otherwise each
attention builds its own per-range mask from the indices remapped to its key
ranges, as upstream does (the masked kernel reads masks). The shared kernel
gives both forms the same bits, so the form is the plan's business (L1), the
selection this loop's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from harness.kernels import SharedKernels
from harness.kernels.context_chunks import DeviceChunk, Partial, device_chunks, masked_chunk_partial
from harness.kernels.masked_attention import PackedMask, Selection
from harness.kernels.numeric import new_token_kv
from harness.kernels.sparse_prefill import SparsePrefillInputs
from harness.model import Chunk
from harness.model.sparse import SparseCase, SparseLayout
from ports.per_request import sparse
from ports.per_request.prefill import final_merge, fold_partials, prefill

__all__ = [
    "chunk_ranges",
    "fold_partials",
    "global_mask",
    "masked_chunk_partial",
    "masked_prefill",
    "range_mask",
    "sparse_prefill",
    "suffix_ranges",
    "topk_per_request",
    "with_key_starts",
]


def topk_per_request(topk: torch.Tensor, query_lens: tuple[int, ...]) -> list[torch.Tensor]:
    """Request ``r``'s rows of the batch's ``[tokens, index_topk]`` indices."""
    return list(torch.split(topk, list(query_lens)))


def global_mask(case: SparseCase, per_request: list[torch.Tensor]) -> torch.Tensor:
    """The mask over whole sequences, one reserved word per row (left for the key starts)."""
    shape = sparse.topk_mask_shape(len(per_request), case.max_query_len, case.max_seq_len, key_starts_word=True)
    mask = torch.zeros(shape, dtype=torch.int32, device=per_request[0].device)
    sparse.pack_topk(per_request, mask[:, :, : -(-case.max_seq_len // sparse.KEY_BITS)])
    return mask


def with_key_starts(mask: torch.Tensor, starts: torch.Tensor | list[int] | tuple[int, ...]) -> Selection:
    """``mask`` (the global mask's rows of some requests) read from each
    request's key start: written into the reserved word of its row 0 (from a
    device tensor where the chunk has one: no host copy in the loop)."""
    if not isinstance(starts, torch.Tensor):
        starts = torch.tensor(starts, dtype=torch.int32)
    mask[:, 0, -1] = starts.to(device=mask.device, dtype=torch.int32)
    return PackedMask(mask, key_starts=True)


def suffix_ranges(case: SparseCase) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The suffix attention's key range per request: its new tokens, which start
    at its context length in its sequence (key starts and remap starts alike)."""
    return case.context_lens, case.query_lens


def chunk_ranges(chunk: Chunk) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A chunk attention's key range per request of the chunk: its rows of that
    request's context, ``[start, start + seq_len)`` (a continuation piece's
    start is the piece's own, not its request's)."""
    return chunk.starts, chunk.seq_lens


def range_mask(
    per_request: list[torch.Tensor], ranges: tuple[tuple[int, ...], tuple[int, ...]], max_query: int, max_keys: int
) -> Selection:
    """The per-range mask of one attention: each request's indices remapped to
    its key range (``t - start`` inside it, -1 elsewhere), packed over keys
    ``[0, max_keys)`` into rows padded to the tile: the mask the masked kernel
    reads when the global one does not fit."""
    remapped = sparse.remap_topk(per_request, *ranges)
    mask = torch.zeros(
        sparse.topk_mask_shape(len(remapped), max_query, max_keys), dtype=torch.int32, device=per_request[0].device
    )
    sparse.pack_topk(remapped, mask)
    return PackedMask(mask)


def masked_prefill(
    case: SparseCase,
    plan: SparseLayout,
    inputs: SparsePrefillInputs,
    kernels: SharedKernels,
    planned: tuple[DeviceChunk, ...] | None = None,
) -> dict[str, torch.Tensor]:
    """The masked route's forward (module docstring). ``planned`` is
    :func:`device_chunks` of the plan's layout, built here when not given (a
    benchmark builds it before timing, as upstream builds its metadata)."""
    dense = inputs.prefill
    layout = plan.layout
    per_request = topk_per_request(inputs.topk, case.query_lens)
    mask = global_mask(case, per_request) if plan.global_mask_fits else None
    ranges = suffix_ranges(case)
    suffix_selection: Selection = (
        with_key_starts(mask, ranges[0])
        if mask is not None
        else range_mask(per_request, ranges, case.max_query_len, case.max_query_len)
    )
    k, v = new_token_kv(dense, kernels)
    qsl = dense.query_start_loc
    suffix = kernels.masked_attention(dense.q, k, v, qsl, qsl, True, dense.scale, suffix_selection)
    if not layout.chunks:
        return {"output": suffix[0], "lse": suffix[1]}
    workspace = torch.empty((plan.workspace_size, dense.spec.latent_dim), dtype=dense.q.dtype, device=dense.q.device)

    def partials() -> Iterator[Partial]:
        for item in planned if planned is not None else device_chunks(layout, dense.q.device):
            chunk = item.chunk
            requests = slice(chunk.request_start, chunk.request_end)
            selection: Selection = (
                with_key_starts(mask[requests], item.starts)
                if mask is not None
                else range_mask(per_request[requests], chunk_ranges(chunk), chunk.max_query_len, chunk.max_seq_len)
            )
            yield masked_chunk_partial(item, dense, kernels, workspace, selection)

    context = fold_partials(layout, dense.num_tokens, partials())
    return final_merge(context, suffix, dense.spec.v_head_dim)


def sparse_prefill(case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
    """The batch on the port's own route: dense MHA or masked MHA (L3 covers no other)."""
    plan = sparse.plan_sparse(case)
    if plan.route == "dense-mha":
        return prefill(plan.layout, plan.workspace_size, inputs.prefill, kernels)
    if plan.route != "masked-mha":
        raise ValueError(f"the port routes {case.name} {plan.route}, which has no prefill loop here")
    return masked_prefill(case, plan, inputs, kernels)
