"""0.27.1's masked prefill, called: the legacy oracle's sparse L3.

As :mod:`oracle.sparse_prefill`, on 0.27.1's own metadata: its equal-share
chunked context (every chunk spans the whole batch), its
``SparseMLACommonImpl.forward_mha`` and ``_compute_context_mha`` (each chunk
with rows attends with the whole query, folded with plain merges). Replaced,
and only these: the gather (:class:`oracle.legacy_gather.LegacyGatherOps`), the
projection and the attention (the shared kernels).
"""

from __future__ import annotations

import types
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from oracle.sparse_forward import _Seen, run_forward_mha

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.kernels.sparse_prefill import SparsePrefillInputs
    from harness.model import Case
    from harness.model.sparse import SparseCase
    from oracle.sparse import SparseOracle


def legacy_masked_prefill(
    oracle: SparseOracle, case: SparseCase, planned: Case, inputs: SparsePrefillInputs, kernels: SharedKernels
) -> dict[str, torch.Tensor]:
    from oracle.legacy_gather import LegacyGatherOps
    from oracle.numeric import _SharedProjection

    side, dense = oracle.side, inputs.prefill
    spec = dense.spec
    workspace = torch.empty((planned.workspace_size, spec.latent_dim), dtype=dense.q.dtype, device=dense.q.device)
    chunked = side.upstream_metadata(planned, workspace) if any(case.context_lens) else None
    prefill = oracle.mla.MLACommonPrefillMetadata(
        block_table=dense.block_table,
        query_start_loc=dense.query_start_loc,
        max_query_len=dense.max_query_len,
        chunked_context=chunked,
        q_data_type=dense.q.dtype,
    )
    impl = SimpleNamespace(
        kv_cache_dtype="auto",
        kv_lora_rank=spec.kv_lora_rank,
        qk_rope_head_dim=spec.qk_rope_head_dim,
        num_heads=spec.num_heads,
        qk_nope_head_dim=spec.qk_nope_head_dim,
        v_head_dim=spec.v_head_dim,
        kv_b_proj=_SharedProjection(kernels, dense.kv_b_weight),
        _use_flashinfer_concat_mla_k=False,
        dcp_world_size=1,
    )
    impl._concat_k_nope_k_pe = types.MethodType(oracle.mla.MLACommonBaseImpl._concat_k_nope_k_pe, impl)
    return run_forward_mha(
        oracle, case, inputs, kernels, impl, prefill, dense.kv_cache, LegacyGatherOps(kernels), _Seen()
    )


__all__ = ["legacy_masked_prefill"]
