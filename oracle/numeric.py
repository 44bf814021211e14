"""The oracle's numeric levels: upstream's merge kernel (L2) and upstream's own
prefill context loop plus final merge (L3), called, never copied.

Only what cannot run here is replaced, and only by the harness's shared
kernels: the paged-cache gather (``ops.gather_and_maybe_dequant_cache``), the
prefill backend's context attention, and ``kv_b_proj``. Everything else,
``_compute_prefill_context``, ``init_mla_context_partial``,
``accumulate_mla_context_chunk`` and ``merge_attn_states`` with its Triton
kernel, is upstream's code as installed.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch

from harness.kernels import SharedKernels
from harness.model import Case
from harness.numeric import MergeInputs, PrefillInputs, new_token_partial
from oracle.environment import import_vllm_module
from oracle.pin import MLA

MERGE_MODULE = "vllm.v1.attention.ops.merge_attn_states"


def merge_states(inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream ``merge_attn_states`` (its Triton kernel) with the merged LSE."""
    merge = import_vllm_module(MERGE_MODULE).merge_attn_states
    output = torch.empty_like(inputs.prefix_output)
    output_lse = torch.empty_like(inputs.prefix_lse)
    merge(
        output=output,
        prefix_output=inputs.prefix_output,
        prefix_lse=inputs.prefix_lse,
        suffix_output=inputs.suffix_output,
        suffix_lse=inputs.suffix_lse,
        output_lse=output_lse,
        prefill_tokens_with_context=inputs.prefill_tokens_with_context,
    )
    return output, output_lse


class _SharedGatherOps:
    """Stands in for ``vllm._custom_ops`` inside the context loop: the gather
    is the harness's. Any other op the loop reaches for is missing on purpose."""

    def __init__(self, kernels: SharedKernels) -> None:
        self._kernels = kernels

    def gather_and_maybe_dequant_cache(
        self,
        src_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        token_to_seq: torch.Tensor,
        num_tokens: int,
        kv_cache_dtype: str,
        scale: torch.Tensor,
        seq_starts: torch.Tensor | None = None,
    ) -> None:
        assert kv_cache_dtype == "auto" and seq_starts is not None
        self._kernels.gather(src_cache, dst, block_table, cu_seq_lens, token_to_seq, seq_starts, num_tokens)


class _SharedAttentionBackend:
    """Stands in for the prefill backend: the context chunk's attention is the harness's."""

    def __init__(self, kernels: SharedKernels, scale: float) -> None:
        self._kernels, self._scale = kernels, scale

    def run_prefill_context_chunk(
        self, chunk: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        longest_q, longest_k = chunk.max_query_len, chunk.max_seq_len
        return self._kernels.attention(
            q, k, v, chunk.query_start_loc, chunk.cu_seq_lens, False, self._scale, longest_q, longest_k
        )


class _SharedProjection:
    """Stands in for ``kv_b_proj`` (a ColumnParallelLinear returns ``(out, bias)``)."""

    def __init__(self, kernels: SharedKernels, weight: torch.Tensor) -> None:
        self._kernels, self.weight = kernels, weight
        self.params_dtype = weight.dtype

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self._kernels.kv_b_proj(self.weight, x), None


@contextlib.contextmanager
def _shared_ops(mla: Any, kernels: SharedKernels) -> Iterator[None]:
    with mock.patch.object(mla, "ops", _SharedGatherOps(kernels)):
        yield


Partial = tuple[torch.Tensor, torch.Tensor]


def context_loop(case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> Callable[[], Partial] | None:
    """Upstream's metadata for ``case``, built now, and a call that runs upstream's
    ``_compute_prefill_context`` over it (None when no request has context).

    Split so a benchmark times the loop alone, as the metadata builder runs once
    per step upstream, before the forward pass.
    """
    mla = import_vllm_module(MLA)
    spec = inputs.spec
    workspace = torch.empty((case.workspace_size, spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    metadata = mla.build_mla_chunked_context_metadata(
        context_lens_cpu=torch.tensor(case.context_lens, dtype=torch.int32),
        prefill_query_start_loc_cpu=inputs.query_start_loc.cpu(),
        chunked_prefill_workspace=workspace,
        chunked_prefill_workspace_size=case.workspace_size,
        block_size=case.block_size,
        align_chunk_to_block=case.align_to_block,
        device=inputs.q.device,
        dcp_world_size=1,
        dcp_local_block_size=1,
        dcp_virtual_block_size=1,
    )
    if metadata is None:
        return None
    impl = SimpleNamespace(
        kv_cache_dtype="auto",
        kv_lora_rank=spec.kv_lora_rank,
        num_heads=spec.num_heads,
        qk_nope_head_dim=spec.qk_nope_head_dim,
        v_head_dim=spec.v_head_dim,
        kv_b_proj=_SharedProjection(kernels, inputs.kv_b_weight),
        _use_flashinfer_concat_mla_k=False,
    )
    impl._concat_k_nope_k_pe = functools.partial(mla.MLACommonBaseImpl._concat_k_nope_k_pe, impl)
    attn_metadata = SimpleNamespace(
        prefill=SimpleNamespace(
            prefill_backend=_SharedAttentionBackend(kernels, inputs.scale),
            chunked_context=metadata,
            block_table=inputs.block_table,
            q_data_type=inputs.q.dtype,
        )
    )
    k_scale = torch.ones((), dtype=torch.float32, device=inputs.q.device)

    def run() -> Partial:
        with _shared_ops(mla, kernels):
            output, lse = mla.MLACommonBaseImpl._compute_prefill_context(
                impl, inputs.q, inputs.kv_cache, attn_metadata, k_scale
            )
        return output, lse

    return run


def prefill(case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
    """Upstream's context loop and final merge for ``case``.

    Returns ``context_output``/``context_lse`` (the context partial, absent when
    no request has context) and ``output``/``lse`` (after the final merge).
    """
    mla = import_vllm_module(MLA)
    loop = context_loop(case, inputs, kernels)
    suffix_output, suffix_lse = new_token_partial(inputs, kernels)
    if loop is None:
        # forward_mha without chunked context: the suffix partial is the output.
        return {"output": suffix_output, "lse": suffix_lse}
    context_output, context_lse = loop()
    output = torch.empty_like(suffix_output)
    output_lse = torch.empty_like(suffix_lse)
    # As forward_mha: both partials cut to v_head_dim, then upstream's merge.
    mla.merge_attn_states(
        output=output,
        prefix_output=context_output[..., : inputs.spec.v_head_dim],
        prefix_lse=context_lse,
        suffix_output=suffix_output[..., : inputs.spec.v_head_dim],
        suffix_lse=suffix_lse,
        output_lse=output_lse,
    )
    return {"context_output": context_output, "context_lse": context_lse, "output": output, "lse": output_lse}
