"""The oracle's numeric levels: upstream's merge kernel (L2) and upstream's own
``forward_mha`` prefill (L3), called, never copied.

L3 runs ``MLACommonBaseImpl.forward_mha`` unbound on a minimal stand-in impl,
over upstream's ``MLACommonPrefillMetadata`` holding the chunked-context
metadata upstream's ``build_mla_chunked_context_metadata`` built. Every step of
the contract is therefore upstream's code as installed: the new-token
``kv_b_proj`` and ``_concat_k_nope_k_pe``, ``_compute_prefill_context`` (with
``_get_kv_b_proj_input_dtype``, ``init_mla_context_partial``,
``neutralize_empty_context_partials`` and ``accumulate_mla_context_chunk``), the
cut to ``v_head_dim``, and the final ``merge_attn_states`` with its Triton kernel.

Only what cannot run here is replaced, and only by the harness's shared
kernels, which every port calls too on identical inputs: the paged-cache gather
(``ops.gather_and_maybe_dequant_cache``), the prefill backend's two attentions
(``run_prefill_new_tokens``: causal, bottom-right aligned;
``run_prefill_context_chunk``: non-causal) and ``kv_b_proj``.

Two observations are added around upstream's code, neither of which changes a
bit it computes: the context partial ``_compute_prefill_context`` returns is
recorded on its way into the final merge, and that final merge, which
``forward_mha`` calls without ``output_lse``, is handed an ``output_lse`` buffer
so the merged LSE can be compared (the Triton kernel's ``OUTPUT_LSE`` switch
only adds the store). Without context, ``forward_mha`` keeps only the new-token
output; the LSE reported is the one the shared attention returned for it.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch

from harness.kernels import SharedKernels
from harness.kernels.numeric import MergeInputs, PrefillInputs
from harness.model import Case
from oracle.environment import import_vllm_module
from oracle.pin import MLA

MERGE_MODULE = "vllm.v1.attention.ops.merge_attn_states"

Partial = tuple[torch.Tensor, torch.Tensor]


def merge_states(inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream ``merge_attn_states`` (its Triton kernel) with the merged LSE.

    The inputs go in as :func:`harness.kernels.numeric.materialise_merge` laid them out,
    strided and transposed views included: upstream's kernel reads LSEs by their
    strides and partials by their head stride. The outputs are fresh contiguous
    tensors, as ``forward_mha``'s final merge writes into the layer output.
    """
    merge = import_vllm_module(MERGE_MODULE).merge_attn_states
    prefix_output, prefix_lse = inputs.prefix_output, inputs.prefix_lse
    output = torch.empty(prefix_output.shape, dtype=prefix_output.dtype, device=prefix_output.device)
    output_lse = torch.empty(prefix_lse.shape, dtype=prefix_lse.dtype, device=prefix_lse.device)
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

    def gather_mla_context_cache_cpu(
        self,
        *,
        src_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        starts: torch.Tensor,
        cu_seq_lens: torch.Tensor,
    ) -> None:
        """The CPU platform's gather of later releases (0.33.0 on): the same rows
        into ``dst`` (already cut to the chunk's rows), through the shared gather,
        as the GPU path's op is."""
        self._gather_runs(src_cache, dst, block_table, cu_seq_lens, len(cu_seq_lens) - 1, starts)

    def cp_gather_cache(
        self,
        src_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        batch_size: int,
        seq_starts: torch.Tensor | None = None,
    ) -> None:
        """The DCP loop's gather (each rank's local rows, ``dst`` cut to them):
        request ``b``'s rows ``[cu_seq_lens[b], cu_seq_lens[b+1])`` from its local
        position ``seq_starts[b]`` on, through the shared gather."""
        assert seq_starts is not None
        self._gather_runs(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)

    def _gather_runs(
        self,
        src_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        batch_size: int,
        starts: torch.Tensor,
    ) -> None:
        """The shared gather of ``dst``'s rows, request ``b`` owning rows
        ``[cu_seq_lens[b], cu_seq_lens[b+1])`` (ops that take no ``token_to_seq``)."""
        seq_lens = (cu_seq_lens[1 : batch_size + 1] - cu_seq_lens[:batch_size]).long()
        token_to_seq = torch.repeat_interleave(torch.arange(batch_size, device=seq_lens.device), seq_lens)
        self._kernels.gather(src_cache, dst, block_table, cu_seq_lens, token_to_seq, starts, dst.shape[0])


class _StandInDcpManager:
    """Upstream's ``MLADCPManager`` as the DCP loop uses it: only ``kv_gather``,
    whose contract is the rank-major concatenation of every rank's local buffer.

    The calling rank's buffer is the one upstream's loop gathered; every other
    rank's is that rank's gather of the same chunk (its own cache, the chunk's
    own local metadata, the shared gather), or, with real ranks, what the
    collective brings back from the other processes. Upstream calls
    ``kv_gather`` once per chunk, in order; the count says which chunk it is.
    """

    def __init__(self, inputs: PrefillInputs, kernels: SharedKernels, rank: int) -> None:
        assert inputs.dcp is not None
        self._inputs, self._kernels, self._rank = inputs, kernels, rank
        self._chunks: list[Any] = []
        self.calls = 0

    def serve(self, chunks: list[Any]) -> None:
        self._chunks, self.calls = chunks, 0

    def _rank_local(self, rank: int, chunk: Any) -> torch.Tensor:
        assert self._inputs.dcp is not None
        cache = self._inputs.dcp.cache(rank)
        rows = chunk.num_local_context_tokens
        local = torch.empty((rows, cache.kv_cache.shape[-1]), dtype=cache.kv_cache.dtype, device=cache.kv_cache.device)
        self._kernels.gather(
            cache.kv_cache,
            local,
            cache.block_table[chunk.request_slice],
            chunk.padded_local_cu_seq_lens,
            chunk.padded_local_token_to_seq,
            chunk.starts,
            rows,
        )
        return local

    def kv_gather(self, gathered_kv: torch.Tensor, local_kv: torch.Tensor) -> None:
        assert self._inputs.dcp is not None
        assert self.calls < len(self._chunks), "kv_gather called more often than there are chunks"
        chunk = self._chunks[self.calls]
        self.calls += 1
        concatenated = self._inputs.dcp.collective.all_gather(
            lambda rank: local_kv if rank == self._rank else self._rank_local(rank, chunk)
        )
        gathered_kv.copy_(concatenated)


class _GroupCoordinator:
    """The two attributes of vLLM's ``GroupCoordinator`` that ``init_kv_gather``
    reads; hashed by identity, as upstream caches its workspace per group."""

    def __init__(self, world_size: int, device_group: Any) -> None:
        self.world_size, self.device_group = world_size, device_group


class UpstreamKvGather:
    """The DCP manager with real ranks: upstream's own ``MLADCPManager``, only its
    ``kv_gather`` set up, by its own ``init_kv_gather`` over the collective's
    process group (the rest of the manager serves the decode path, which L3
    never reaches; its constructor needs vLLM's initialised DCP group and an
    engine config). ``calls`` counts this rank's all-gathers, over every
    manager built in the process (a run that never reached it is a fault the
    caller can see)."""

    calls = 0

    def __init__(self, workspace: torch.Tensor, workspace_size: int, world_size: int, group: Any) -> None:
        dcp_utils = import_vllm_module("vllm.v1.attention.ops.dcp_utils")
        manager = object.__new__(dcp_utils.MLADCPManager)
        manager.group = _GroupCoordinator(world_size, group)
        manager.num_ubatches = 1
        manager.init_kv_gather(workspace, workspace_size)
        self._manager = manager

    def serve(self, chunks: list[Any]) -> None:
        """Nothing to track: the collective brings every rank's buffer itself."""

    def kv_gather(self, gathered_kv: torch.Tensor, local_kv: torch.Tensor) -> object:
        UpstreamKvGather.calls += 1
        return self._manager.kv_gather(gathered_kv, local_kv)


@dataclass
class _Observed:
    """What the run hands back beyond ``forward_mha``'s ``output``: the context
    partial, the new-token LSE, and the final merge's LSE (each None until seen)."""

    context: Partial | None = None
    suffix_lse: torch.Tensor | None = None
    merged_lse: list[torch.Tensor] = field(default_factory=list)


class _SharedAttentionBackend:
    """Stands in for upstream's ``MLAPrefillBackend``: both attentions are the
    harness's. Like a real backend it knows the batch's query offsets (upstream
    hands them over in ``prepare_metadata``)."""

    def __init__(
        self, kernels: SharedKernels, scale: float, query_start_loc: torch.Tensor, max_query_len: int, seen: _Observed
    ) -> None:
        self._kernels, self._scale = kernels, scale
        self._query_start_loc, self._max_query_len = query_start_loc, max_query_len
        self._seen = seen

    def run_prefill_new_tokens(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        return_softmax_lse: bool,
        out: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # The oracle never fuses an output quantisation, so no `out` is handed in.
        assert out is None and output_scale is None
        qsl, longest = self._query_start_loc, self._max_query_len
        output, lse = self._kernels.attention(q, k, v, qsl, qsl, True, self._scale, longest, longest)
        self._seen.suffix_lse = lse
        return (output, lse) if return_softmax_lse else output

    def run_prefill_context_chunk(
        self, chunk: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert out is None
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


@dataclass
class _Upstream:
    """Everything one L3 run hands to upstream: the stand-in impl (upstream's
    methods bound to it), the attention metadata around upstream's prefill
    metadata, and what the run observed."""

    mla: types.ModuleType
    impl: SimpleNamespace
    attn_metadata: SimpleNamespace
    kv_cache: torch.Tensor
    k_scale: torch.Tensor
    seen: _Observed
    dcp_world_size: int = 1
    dcp_manager: _StandInDcpManager | UpstreamKvGather | None = None

    @property
    def has_context(self) -> bool:
        return self.attn_metadata.prefill.chunked_context is not None

    def compute_prefill_context(self, q: torch.Tensor) -> Partial:
        """Upstream's ``_compute_prefill_context`` (its DCP twin under DCP) on the
        stand-in (context required)."""
        if self.dcp_world_size > 1:
            assert self.dcp_manager is not None
            # Every run of the loop gathers its chunks afresh, from the first.
            self.dcp_manager.serve(self.attn_metadata.prefill.chunked_context.chunks)
            return self.impl._context_parallel_compute_prefill_context(  # type: ignore[no-any-return]
                q, self.kv_cache, self.attn_metadata, self.k_scale, dcp_world_size=self.dcp_world_size
            )
        output, lse = self.impl._compute_prefill_context(q, self.kv_cache, self.attn_metadata, self.k_scale)
        return output, lse


def _upstream(case: Case, inputs: PrefillInputs, kernels: SharedKernels, rank: int | None = None) -> _Upstream:
    """Upstream's metadata for ``case``, built now, on a stand-in impl holding
    only the attributes ``forward_mha`` and ``_compute_prefill_context`` read.

    Under DCP the stand-in is rank ``rank``: its cache and block table, and a
    stand-in DCP manager (:class:`_StandInDcpManager`) for the all-gather. The
    workspace is what upstream's metadata builder allocates then: ``W + W / D``
    rows (the local gather's ``W / D`` and the all-gather's ``W``), after its
    assertion that ``D`` divides ``W``.
    """
    mla = import_vllm_module(MLA)
    spec = inputs.spec
    device = inputs.q.device
    seen = _Observed()
    world = case.dcp_world_size
    rows = case.workspace_size
    kv_cache, block_table = inputs.kv_cache, inputs.block_table
    if rank is None:
        rank = inputs.dcp.rank if inputs.dcp is not None else 0
    manager: _StandInDcpManager | UpstreamKvGather | None = None
    if world > 1:
        assert inputs.dcp is not None and inputs.dcp.world_size == world, "a DCP case needs per-rank inputs"
        # Upstream's MLACommonMetadataBuilder.__init__ under DCP.
        assert case.workspace_size % world == 0, (
            f"upstream's builder asserts chunked_prefill_workspace_size % dcp_world_size == 0 "
            f"({case.workspace_size} % {world})"
        )
        rows = case.workspace_size + case.workspace_size // world
        cache = inputs.dcp.cache(rank)
        kv_cache, block_table = cache.kv_cache, cache.block_table
    workspace = torch.empty((rows, spec.latent_dim), dtype=inputs.q.dtype, device=device)
    if world > 1:
        assert inputs.dcp is not None
        collective = inputs.dcp.collective
        # With real ranks, upstream's own kv_gather over their process group;
        # in one process, the stand-in that builds the concatenation.
        manager = (
            _StandInDcpManager(inputs, kernels, rank)
            if collective.backend == "one-process"
            else UpstreamKvGather(workspace, case.workspace_size, world, getattr(collective, "group", None))
        )
    chunked_context = mla.build_mla_chunked_context_metadata(
        context_lens_cpu=torch.tensor(case.context_lens, dtype=torch.int32),
        prefill_query_start_loc_cpu=inputs.query_start_loc.cpu(),
        chunked_prefill_workspace=workspace,
        chunked_prefill_workspace_size=case.workspace_size,
        block_size=case.block_size,
        align_chunk_to_block=case.align_to_block,
        device=device,
        dcp_world_size=world,
        dcp_local_block_size=case.cp_kv_cache_interleave_size,
        dcp_virtual_block_size=case.cp_kv_cache_interleave_size * world,
        dcp_manager=manager,
    )
    if manager is not None and chunked_context is not None:
        manager.serve(chunked_context.chunks)
    prefill = mla.MLACommonPrefillMetadata(
        block_table=block_table,
        query_start_loc=inputs.query_start_loc,
        max_query_len=inputs.max_query_len,
        chunked_context=chunked_context,
        q_data_type=inputs.q.dtype,
        prefill_backend=_SharedAttentionBackend(
            kernels, inputs.scale, inputs.query_start_loc, inputs.max_query_len, seen
        ),
    )
    impl = SimpleNamespace(
        kv_cache_dtype="auto",
        kv_lora_rank=spec.kv_lora_rank,
        num_heads=spec.num_heads,
        qk_nope_head_dim=spec.qk_nope_head_dim,
        qk_rope_head_dim=spec.qk_rope_head_dim,
        v_head_dim=spec.v_head_dim,
        kv_b_proj=_SharedProjection(kernels, inputs.kv_b_weight),
        # Upstream enables FlashInfer's concat kernel only for DeepSeek-V3 shapes
        # when FlashInfer is installed; the copy fallback gives the same values.
        _use_flashinfer_concat_mla_k=False,
        dcp_world_size=world,
    )
    base = mla.MLACommonBaseImpl
    impl._concat_k_nope_k_pe = types.MethodType(base._concat_k_nope_k_pe, impl)

    def compute_prefill_context(
        this: SimpleNamespace, q: torch.Tensor, cache: torch.Tensor, metadata: Any, k_scale: torch.Tensor
    ) -> Partial:
        # Upstream's method, unchanged; its result is recorded on the way out.
        output, lse = base._compute_prefill_context(this, q, cache, metadata, k_scale)
        seen.context = (output, lse)
        return output, lse

    def context_parallel_compute_prefill_context(
        this: SimpleNamespace, q: torch.Tensor, cache: torch.Tensor, metadata: Any, k_scale: torch.Tensor, **kwargs: Any
    ) -> Partial:
        # Upstream's DCP twin, unchanged; its result is recorded on the way out.
        output, lse = base._context_parallel_compute_prefill_context(this, q, cache, metadata, k_scale, **kwargs)
        seen.context = (output, lse)
        return output, lse

    impl._compute_prefill_context = types.MethodType(compute_prefill_context, impl)
    impl._context_parallel_compute_prefill_context = types.MethodType(context_parallel_compute_prefill_context, impl)
    attn_metadata = SimpleNamespace(prefill=prefill)
    k_scale = torch.ones((), dtype=torch.float32, device=device)
    return _Upstream(mla, impl, attn_metadata, kv_cache, k_scale, seen, world, manager)


@contextlib.contextmanager
def _shared_ops(upstream: _Upstream, kernels: SharedKernels) -> Iterator[None]:
    """Route ``ops`` to the shared gather, and give the one merge that has no
    ``output_lse`` (``forward_mha``'s final merge) a buffer for it."""
    mla, seen = upstream.mla, upstream.seen
    merge = mla.merge_attn_states

    def merge_with_lse(**kwargs: Any) -> None:
        if kwargs.get("output_lse") is None:
            kwargs["output_lse"] = torch.empty_like(kwargs["suffix_lse"])
            seen.merged_lse.append(kwargs["output_lse"])
        merge(**kwargs)

    with (
        mock.patch.object(mla, "ops", _SharedGatherOps(kernels)),
        mock.patch.object(mla, "merge_attn_states", merge_with_lse),
    ):
        yield


def context_loop(case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> Callable[[], Partial] | None:
    """Upstream's metadata for ``case``, built now, and a call that runs upstream's
    ``_compute_prefill_context`` over it (None when no request has context).

    Split so a benchmark times the loop alone, as the metadata builder runs once
    per step upstream, before the forward pass.
    """
    upstream = _upstream(case, inputs, kernels)
    if not upstream.has_context:
        return None

    def run() -> Partial:
        with _shared_ops(upstream, kernels):
            return upstream.compute_prefill_context(inputs.q)

    return run


def prefill(case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
    """Upstream's ``forward_mha`` for ``case``: new-token attention, the context
    loop, and the final merge.

    Returns ``context_output``/``context_lse`` (the context partial as
    ``_compute_prefill_context`` returned it; absent when no request has
    context) and ``output`` ``[tokens, heads, v_head_dim]``/``lse``
    ``[heads, tokens]`` (after the final merge; without context, the new-token
    partial).

    Under DCP every rank this process holds runs upstream's DCP loop on its own
    cache; every rank's tensors must be the same bits (all ranks gather the
    whole context), or the oracle fails with the first rank and tensor that
    differ. The result is this process's rank's.
    """
    if case.dcp_world_size == 1:
        return _rank_prefill(case, inputs, kernels, 0)
    assert inputs.dcp is not None, "a DCP case needs per-rank inputs"
    own = inputs.dcp.rank
    results = {
        rank: _rank_prefill(case, inputs, kernels, rank)
        for rank in range(case.dcp_world_size)
        if inputs.dcp.collective.holds(rank)
    }
    for rank, tensors in results.items():
        check_ranks_agree(results[own], tensors, own, rank)
    return results[own]


def check_ranks_agree(
    reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor], reference_rank: int, other_rank: int
) -> None:
    """Raise ``AssertionError`` naming the tensor where two ranks' prefill results
    differ in any bit (shape, dtype or bit pattern)."""
    from harness.compare.bits import identical_bits

    if reference.keys() != other.keys():
        raise AssertionError(
            f"DCP rank {other_rank} returned {sorted(other)}, rank {reference_rank} {sorted(reference)}"
        )
    for name, tensor in reference.items():
        if not identical_bits(tensor, other[name]):
            raise AssertionError(f"DCP rank {other_rank}'s {name} differs from rank {reference_rank}'s in its bits")


def _rank_prefill(case: Case, inputs: PrefillInputs, kernels: SharedKernels, rank: int) -> dict[str, torch.Tensor]:
    spec = inputs.spec
    upstream = _upstream(case, inputs, kernels, rank)
    # forward_mha writes the layer output flat, as the attention layer hands it over.
    output = torch.empty(
        (inputs.num_tokens, spec.num_heads * spec.v_head_dim), dtype=inputs.q.dtype, device=inputs.q.device
    )
    with _shared_ops(upstream, kernels):
        upstream.mla.MLACommonBaseImpl.forward_mha(
            upstream.impl,
            inputs.q,
            inputs.new_kv_c,
            inputs.new_k_pe,
            upstream.kv_cache,
            upstream.attn_metadata,
            upstream.k_scale,
            output,
        )
    seen = upstream.seen
    result = {"output": output.view(-1, spec.num_heads, spec.v_head_dim)}
    if not upstream.has_context:
        assert seen.suffix_lse is not None and seen.context is None and not seen.merged_lse
        return {**result, "lse": seen.suffix_lse}
    # Exactly one merge ran without output_lse: forward_mha's final one.
    assert seen.context is not None and len(seen.merged_lse) == 1
    context_output, context_lse = seen.context
    return {"context_output": context_output, "context_lse": context_lse, **result, "lse": seen.merged_lse[0]}
