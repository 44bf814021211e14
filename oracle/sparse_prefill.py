"""L3 of the sparse path: the installed release's own masked prefill, called.

``SparseMLACommonImpl.forward_mha`` runs unbound on the dense L3's stand-in impl
(:func:`oracle.numeric._upstream`: upstream's chunked-context metadata in the
case's sparse workspace, the shared gather and projection) with the sparse
attributes it reads added, and upstream's own ``_compute_context_mha``,
``_run_masked_mha``, ``_try_build_global_mask``, ``_remap_topk_to_ranges``,
``_slice_topk_per_req`` and ``_project_kv`` bound to it. Upstream builds every
mask itself (its Triton kernels, interpreted on the CPU) and folds with its own
``init_mla_context_partial`` / ``accumulate_mla_context_chunk`` and merge.

Replaced, and only these: the paged gather and ``kv_b_proj`` (the shared
kernels, as for dense L3), and ``flash_attn_varlen_func`` (FlashAttention 4,
Blackwell only) by :meth:`SharedKernels.masked_attention` on the mask upstream
built: ``dense_mask_mod`` reads it as is, ``offset_dense_mask_mod`` with each
sequence's key start from its reserved word. What
``SparseMLACommonMetadataBuilder.build`` would add to the prefill metadata is
filled in from the case (``query_lens_cpu``, ``prefill_max_seq_len``,
``topk_tokens``, a mask workspace of the release's size, no decode tokens), and
``forward_mha``'s final merge, which writes no LSE, gets a buffer for one. A
batch on the dense-MHA route runs the release's dense L3 oracle in the sparse
workspace (:mod:`oracle.numeric`): the loop ``forward_mha`` hands such a batch
to (``MLACommonBaseImpl.forward_mha``), called directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from harness.kernels.sparse_prefill import L3_ROUTES
from oracle.sparse_forward import (
    _Seen,
    run_forward_mha,
)

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.kernels.sparse_prefill import SparsePrefillInputs
    from harness.model.sparse import SparseCase
    from oracle.sparse import SparseOracle


class RouteNotCompared(Exception):
    """The release routes the batch where it has no prefill to compare: sparse
    MQA (decode-style, compared at L1 only), or a masked run it cannot make
    (``masked-mha-unavailable``, ``masked-mha-overflow``). A refusal: the class
    of batch is the release's own, stated without the batch's name."""

    refusal = True


def sparse_prefill(
    oracle: SparseOracle, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
) -> dict[str, torch.Tensor]:
    """The release's prefill of ``case`` on the route it decides (its L1 plan)."""
    plan = oracle.plan(case)
    if plan.route not in L3_ROUTES:
        raise RouteNotCompared(f"its sparse prefill cannot run: it routes the batch {plan.route}")
    planned = case.planned_case(plan.workspace_size)
    if plan.route == "dense-mha":
        result: dict[str, torch.Tensor] = oracle.side.prefill(planned, inputs.prefill, kernels)
        return result
    if oracle.legacy:
        from oracle.sparse_legacy import legacy_masked_prefill

        return legacy_masked_prefill(oracle, case, planned, inputs, kernels)
    return masked_forward(oracle, case, inputs, kernels)()


def masked_forward(
    oracle: SparseOracle, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
) -> Callable[[], dict[str, torch.Tensor]]:
    """0.28.0's metadata for ``case`` in its sparse workspace, built now, and a
    call that runs ``forward_mha``'s masked path over it (split so a benchmark
    times the forward pass alone, as upstream builds metadata before it)."""
    from oracle.numeric import _shared_ops, _SharedGatherOps, _upstream

    plan = oracle.plan(case)
    upstream = _upstream(case.planned_case(plan.workspace_size), inputs.prefill, kernels)

    def run() -> dict[str, torch.Tensor]:
        with _shared_ops(upstream, kernels):
            return run_forward_mha(
                oracle,
                case,
                inputs,
                kernels,
                upstream.impl,
                upstream.attn_metadata.prefill,
                upstream.kv_cache,
                _SharedGatherOps(kernels),
                _Seen(),
            )

    return run
