"""Sparse L3 over the external-port protocol (docs/external-port-protocol.md).

The port's own decisions, asked for one op at a time, then run here on the
shared kernels, and folded by the port:

1. ``sparse_layout``: its route, chunks and global-mask verdict;
2. per attention (the suffix, then each chunk), its selection of the batch's
   top-k indices: ``topk_remap`` for per-range indices (the suffix's ranges are
   the requests' new tokens, ``[context, context + query)``; a chunk's its
   requests' rows ``[start, start + seq_len)``), or, when its plan says the
   global mask fits, ``topk_mask`` in the global form with the attention's key
   starts (the suffix's the context lengths, a chunk's its ``starts``);
3. the masked attention of each (this process, the shared kernel);
4. ``sparse_prefill``: what ``prefill`` sends (the suffix and chunk partials,
   the case in the port's sparse workspace, its layout) plus the selections it
   made, and the port answers the folded context partial and the merged output.

On the dense-MHA route steps 2 and 3 are the dense ones (no selections).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from harness.kernels.context_chunks import check_runnable, device_chunks, masked_chunk_partial, planned_chunk_partials
from harness.kernels.masked_attention import PackedMask, RangeIndices, Selection
from harness.kernels.numeric import new_token_kv, new_token_partial
from harness.model.sparse import MaskForm, Route, SparseLayout, TopkMaskCase
from harness.protocol.errors import ExternalPortError

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.kernels.sparse_prefill import SparsePrefillInputs
    from harness.model.sparse import SparseCase


class SparseClient(Protocol):
    """What the sparse half of the protocol asks of the client that speaks it
    (:class:`harness.protocol.external.ExternalPort`)."""

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor: ...

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]: ...

    def plan_sparse(self, case: SparseCase) -> SparseLayout: ...

    def _tensor_call(
        self, op: str, tensors: dict[str, torch.Tensor], extra: dict[str, Any]
    ) -> dict[str, torch.Tensor]: ...


def _selection(
    port: SparseClient,
    case: SparseCase,
    global_mask: bool,
    requests: slice,
    per_request: list[torch.Tensor],
    starts: tuple[int, ...],
    lengths: tuple[int, ...],
    what: str,
) -> tuple[Selection, dict[str, torch.Tensor]]:
    """The port's selection for one attention over ``requests``, and the tensors it returned."""
    topk = [t.clone() for t in per_request[requests]]
    query_lens = tuple(t.shape[0] for t in topk)
    seq_lens = tuple(c + q for c, q in zip(case.context_lens[requests], case.query_lens[requests], strict=True))
    asked = TopkMaskCase(
        name=f"{case.name}/{what}",
        query_lens=query_lens,
        seq_lens=seq_lens,
        index_topk=case.index_topk,
        form=MaskForm.GLOBAL if global_mask else (MaskForm.SINGLE if len(topk) == 1 else MaskForm.BATCHED),
        pattern="uniform",
        seed=0,
        range_starts=starts,
        range_lens=lengths,
        key_starts=starts if global_mask else (),
        family="sparse-prefill",
    )
    if global_mask:
        mask = port.build_topk_mask(asked, topk)
        if mask.dtype != torch.int32 or mask.dim() != 3 or mask.shape[0] != len(topk):
            raise ValueError(
                f"port's {what} mask is {mask.dtype} {list(mask.shape)}, not int32 [{len(topk)}, rows, words]"
            )
        return PackedMask(mask, key_starts=True), {f"{what}.mask": mask}
    remapped = port.remap_topk(asked, topk)
    for i, (got, sent) in enumerate(zip(remapped, topk, strict=True)):
        if got.dtype != torch.int32 or got.shape != sent.shape:
            raise ValueError(
                f"port's {what} remap of request {i} is {got.dtype} {list(got.shape)}, not int32 {list(sent.shape)}"
            )
    return RangeIndices(tuple(remapped)), {f"{what}.remapped.{i}": t for i, t in enumerate(remapped)}


def sparse_prefill_over_protocol(
    port: SparseClient, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
) -> dict[str, torch.Tensor]:

    plan = port.plan_sparse(case)
    if plan.route not in (Route.DENSE_MHA, Route.MASKED_MHA):
        raise ExternalPortError(f"port routes {case.name} {plan.route}, which has no prefill here")
    dense, layout = inputs.prefill, plan.layout
    planned = case.planned_case(plan.workspace_size)
    try:
        check_runnable(layout, planned)
    except ValueError as exc:
        raise ExternalPortError(f"port's layout cannot be run: {exc}") from None
    selections: dict[str, torch.Tensor] = {}
    try:
        if plan.route == Route.DENSE_MHA:
            partials = planned_chunk_partials(layout, planned, dense, kernels)
            suffix_output, suffix_lse = new_token_partial(dense, kernels)
        else:
            per_request = list(torch.split(inputs.topk, list(case.query_lens)))
            use_global = bool(plan.global_mask_fits)
            everyone = slice(0, len(case.query_lens))
            selection, returned = _selection(
                port, case, use_global, everyone, per_request, case.context_lens, case.query_lens, "suffix"
            )
            selections |= returned
            k, v = new_token_kv(dense, kernels)
            qsl = dense.query_start_loc
            suffix_output, suffix_lse = kernels.masked_attention(dense.q, k, v, qsl, qsl, True, dense.scale, selection)
            workspace = torch.empty(
                (plan.workspace_size, dense.spec.latent_dim), dtype=dense.q.dtype, device=dense.q.device
            )
            partials = []
            for i, item in enumerate(device_chunks(layout, dense.q.device)):
                chunk = item.chunk
                requests = slice(chunk.request_start, chunk.request_end)
                selection, returned = _selection(
                    port, case, use_global, requests, per_request, chunk.starts, chunk.seq_lens, f"chunk.{i}"
                )
                selections |= returned
                out, lse = masked_chunk_partial(item, dense, kernels, workspace, selection)
                partials.append((out.clone(), lse.clone()))
    except ValueError as exc:
        raise ExternalPortError(f"port's selections cannot be run: {exc}") from None
    tensors: dict[str, Any] = {"suffix_output": suffix_output, "suffix_lse": suffix_lse, **selections}
    for i, (output, lse) in enumerate(partials):
        tensors[f"chunk_output.{i}"], tensors[f"chunk_lse.{i}"] = output, lse
    returned_tensors = port._tensor_call(
        "sparse_prefill",
        tensors,
        {
            "case": planned.to_json(),
            "sparse_case": case.to_json(),
            "layout": layout.to_json(),
            "route": plan.route,
            "v_head_dim": dense.spec.v_head_dim,
        },
    )
    expected = ("context_output", "context_lse", "output", "lse") if layout.chunks else ("output", "lse")
    if sorted(returned_tensors) != sorted(expected):
        raise ExternalPortError(
            f"port's sparse_prefill outputs are {', '.join(sorted(returned_tensors)) or 'nothing'}, "
            f"not {', '.join(expected)}"
        )
    return returned_tensors
