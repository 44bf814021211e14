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

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch

from harness.masked_attention import PackedMask
from harness.sparse_prefill import L3_ROUTES
from oracle.sparse import FLASH_MODULE, MASK_MODULE

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.sparse_model import SparseCase
    from harness.sparse_prefill import SparsePrefillInputs
    from oracle.sparse import SparseOracle

# The stand-in mask functions: what upstream passes as ``mask_mod`` names the form.
DENSE_MASK_MOD, OFFSET_MASK_MOD = "dense_mask_mod", "offset_dense_mask_mod"


class RouteNotCompared(Exception):
    """The release routes the batch where it has no prefill to compare: sparse
    MQA (decode-style, compared at L1 only), or a masked run it cannot make
    (``masked-mha-unavailable``, ``masked-mha-overflow``). A refusal: the class
    of batch is the release's own, stated without the batch's name."""

    refusal = True


@dataclass
class _Seen:
    """What the run hands back beyond the layer output."""

    context: tuple[torch.Tensor, torch.Tensor] | None = None
    attention_lse: list[torch.Tensor] = field(default_factory=list)
    merged_lse: list[torch.Tensor] = field(default_factory=list)


@contextlib.contextmanager
def _masked_kernel(kernels: SharedKernels, seen: _Seen) -> Iterator[None]:
    """``vllm.vllm_flash_attn`` and the mask-function module, stood in for: the
    attention call runs the shared masked kernel on the mask it is handed."""

    def flash_attn_varlen_func(**kwargs: Any) -> Any:
        mask_mod = kwargs["mask_mod"]
        assert mask_mod in (DENSE_MASK_MOD, OFFSET_MASK_MOD), f"unknown mask_mod {mask_mod!r}"
        (mask,) = kwargs["aux_tensors"]
        out, lse = kernels.masked_attention(
            kwargs["q"],
            kwargs["k"],
            kwargs["v"],
            kwargs["cu_seqlens_q"],
            kwargs["cu_seqlens_k"],
            kwargs["causal"],
            kwargs["softmax_scale"],
            PackedMask(mask, key_starts=mask_mod == OFFSET_MASK_MOD),
        )
        seen.attention_lse.append(lse)
        return (out, lse) if kwargs["return_softmax_lse"] else out

    mask_module = types.ModuleType(MASK_MODULE)
    mask_module.dense_mask_mod = DENSE_MASK_MOD  # type: ignore[attr-defined]
    mask_module.offset_dense_mask_mod = OFFSET_MASK_MOD  # type: ignore[attr-defined]
    flash_module = types.ModuleType(FLASH_MODULE)
    flash_module.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
    with mock.patch.dict(sys.modules, {MASK_MODULE: mask_module, FLASH_MODULE: flash_module}):
        yield


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


def bind_sparse_impl(impl: Any, cls: Any, case: SparseCase, inputs: SparsePrefillInputs, seen: _Seen) -> None:
    """Give the dense stand-in impl what ``SparseMLACommonImpl.forward_mha`` reads,
    and the release's own methods of the masked path bound to it;
    ``_compute_context_mha``'s result is recorded in ``seen``."""
    impl.scale = inputs.prefill.scale
    impl.topk_indices_buffer = inputs.topk
    impl.masked_mha_available = case.masked_kernel
    impl._sparse_mla_force_dense_mha = case.force_dense_mha
    impl._sparse_mla_force_masked_mha = case.force_masked_mha
    for name in ("_run_masked_mha", "_project_kv"):
        setattr(impl, name, types.MethodType(getattr(cls, name), impl))
    for name in ("_try_build_global_mask", "_slice_topk_per_req", "_remap_topk_to_ranges"):
        setattr(impl, name, getattr(cls, name))  # static methods

    def compute_context_mha(this: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # The release's loop, unchanged; its result is recorded on the way out.
        seen.context = cls._compute_context_mha(this, *args, **kwargs)
        return seen.context

    impl._compute_context_mha = types.MethodType(compute_context_mha, impl)


def keeping_final_lse(merge: Any, seen: _Seen) -> Any:
    """``merge`` where a call without ``output_lse`` (forward_mha's final merge)
    gets a buffer for it, kept in ``seen``; every other call passes through."""

    def merge_attn_states(**kwargs: Any) -> None:
        if kwargs.get("output_lse") is None:
            kwargs["output_lse"] = torch.empty_like(kwargs["suffix_lse"])
            seen.merged_lse.append(kwargs["output_lse"])
        merge(**kwargs)

    return merge_attn_states


def run_forward_mha(
    oracle: SparseOracle,
    case: SparseCase,
    inputs: SparsePrefillInputs,
    kernels: SharedKernels,
    impl: Any,
    prefill: Any,
    kv_cache: torch.Tensor,
    gather_ops: Any,
    seen: _Seen,
) -> dict[str, torch.Tensor]:
    """``SparseMLACommonImpl.forward_mha`` on ``impl`` over ``prefill`` (the
    release's prefill metadata), the gather through ``gather_ops``; the result
    as :func:`sparse_prefill` returns it."""
    sparse, dense = oracle.sparse, inputs.prefill
    spec = dense.spec
    # SparseMLACommonMetadataBuilder.build's additions to the prefill metadata.
    prefill.query_lens_cpu = torch.tensor(case.query_lens, dtype=torch.int32)
    prefill.topk_mask_workspace = torch.empty(oracle._mask_words(case), dtype=torch.int32, device=dense.q.device)
    attn_metadata = SimpleNamespace(
        prefill=prefill, prefill_max_seq_len=case.max_seq_len, topk_tokens=case.index_topk, num_decode_tokens=0
    )
    cls = sparse.SparseMLACommonImpl
    bind_sparse_impl(impl, cls, case, inputs, seen)
    device = dense.q.device
    output = torch.empty((dense.num_tokens, spec.num_heads * spec.v_head_dim), dtype=dense.q.dtype, device=device)
    k_scale = torch.ones((), dtype=torch.float32, device=device)
    with (
        mock.patch.object(sparse, "ops", gather_ops),
        mock.patch.object(sparse, "merge_attn_states", keeping_final_lse(sparse.merge_attn_states, seen)),
        _masked_kernel(kernels, seen),
        oracle._host_tensors(),
    ):
        cls.forward_mha(impl, dense.q, dense.new_kv_c, dense.new_k_pe, kv_cache, attn_metadata, k_scale, output)
    result = {"output": output.view(-1, spec.num_heads, spec.v_head_dim)}
    if prefill.chunked_context is None:
        # One masked attention over the new tokens, its output the layer's.
        assert len(seen.attention_lse) == 1 and seen.context is None and not seen.merged_lse
        return {**result, "lse": seen.attention_lse[0]}
    assert seen.context is not None and len(seen.merged_lse) == 1
    context_output, context_lse = seen.context
    return {"context_output": context_output, "context_lse": context_lse, **result, "lse": seen.merged_lse[0]}


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
