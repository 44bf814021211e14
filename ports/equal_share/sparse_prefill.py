"""The masked prefill as vllm 0.27.1 ran it, over the equal-share grid (SPEC 1d).

On the dense-MHA route the batch is the legacy grid loop
(:func:`ports.equal_share.prefill.prefill`) in 0.27.1's sparse workspace. On
the masked-MHA route the suffix is the same as after b38e111d3e, but the
context loop differs:

* a chunk with no rows at all is skipped;
* every other chunk attends with the *whole* batch's queries over its rows (a
  request without rows in it leaves its tokens keyless: the kernel's
  keyless-row behaviour, not neutralised);
* each selection covers every request: the global mask whole with the chunk's
  starts as key starts, or every request's indices remapped to its rows;
* the first chunk's partial is the running partial, every later one is merged
  into it over all tokens (a plain merge, in place);
* the final merge covers the tokens before ``qsl[prefills with context]``.
"""

from __future__ import annotations

import torch

from harness.kernels import SharedKernels
from harness.kernels.context_chunks import device_chunks, masked_chunk_partial
from harness.kernels.masked_attention import RangeIndices, Selection
from harness.kernels.numeric import new_token_kv
from harness.kernels.sparse_prefill import SparsePrefillInputs
from harness.model.sparse import SparseCase, SparseLayout
from ports.equal_share.prefill import final_merge, prefill, tokens_with_context
from ports.equal_share.sparse import legacy_plan_sparse
from ports.per_request.merge_kernel import merge_partials
from ports.per_request.sparse import remap_topk
from ports.per_request.sparse_prefill import global_mask, suffix_ranges, topk_per_request, with_key_starts


def legacy_masked_prefill(
    case: SparseCase, plan: SparseLayout, inputs: SparsePrefillInputs, kernels: SharedKernels
) -> dict[str, torch.Tensor]:
    dense = inputs.prefill
    layout = plan.layout
    per_request = topk_per_request(inputs.topk, case.query_lens)
    mask = global_mask(case, per_request) if plan.global_mask_fits else None
    starts, lengths = suffix_ranges(case)
    suffix_selection: Selection = (
        with_key_starts(mask, starts)
        if mask is not None
        else RangeIndices(tuple(remap_topk(per_request, starts, lengths)))
    )
    k, v = new_token_kv(dense, kernels)
    qsl = dense.query_start_loc
    suffix = kernels.masked_attention(dense.q, k, v, qsl, qsl, True, dense.scale, suffix_selection)
    if not layout.chunks:
        return {"output": suffix[0], "lse": suffix[1]}
    workspace = torch.empty((plan.workspace_size, dense.spec.latent_dim), dtype=dense.q.dtype, device=dense.q.device)
    total: tuple[torch.Tensor, torch.Tensor] | None = None
    for planned in device_chunks(layout, dense.q.device):
        chunk = planned.chunk
        if chunk.num_context_tokens == 0:
            continue
        selection: Selection = (
            with_key_starts(mask, chunk.starts)
            if mask is not None
            else RangeIndices(tuple(remap_topk(per_request, chunk.starts, chunk.seq_lens)))
        )
        out, lse = masked_chunk_partial(planned, dense, kernels, workspace, selection)
        if total is None:
            total = (out, lse)
            continue
        merge_partials(total[0], total[1], out, lse, out=total[0], out_lse=total[1])
    assert total is not None, "a layout with context rows produced no partial"
    return final_merge(total, suffix, dense.spec.v_head_dim, tokens_with_context(layout))


def sparse_prefill(case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
    """The batch on 0.27.1's route: the legacy grid loop or its masked loop."""
    plan = legacy_plan_sparse(case)
    if plan.route == "dense-mha":
        return prefill(plan.layout, plan.workspace_size, inputs.prefill, kernels)
    if plan.route != "masked-mha":
        raise ValueError(f"the port routes {case.name} {plan.route}, which has no prefill loop here")
    return legacy_masked_prefill(case, plan, inputs, kernels)
