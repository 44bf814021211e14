"""The machinery of the release's own masked prefill, shared by the pinned
release's path (:mod:`oracle.sparse_prefill`) and the legacy one
(:mod:`oracle.sparse_legacy`): what the run saw (:class:`_Seen`), the shared
masked kernel in place of FlashAttention 4, upstream's methods bound to the
stand-in impl, and ``SparseMLACommonImpl.forward_mha`` run over them."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch

from harness.kernels.masked_attention import PackedMask
from oracle.environment import stood_in_modules
from oracle.sparse import FLASH_MODULE, MASK_MODULE

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.kernels.sparse_prefill import SparsePrefillInputs
    from harness.model.sparse import SparseCase
    from oracle.sparse import SparseOracle

# The stand-in mask functions: what upstream passes as ``mask_mod`` names the form.
DENSE_MASK_MOD, OFFSET_MASK_MOD = "dense_mask_mod", "offset_dense_mask_mod"


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
    with stood_in_modules({MASK_MODULE: mask_module, FLASH_MODULE: flash_module}):
        yield


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
