"""L3 of the legacy oracle (vllm==0.27.1, :mod:`oracle.legacy`): its
``MLACommonBaseImpl.forward_mha`` on the harness's shared kernels, with its
``_compute_prefill_context`` (the chunk loop, ``mask_empty_context``, the
in-loop merges) and its final merge, all 0.27.1's own code, called unchanged.

Only what cannot run on this machine is replaced, as for the pinned oracle
(:mod:`oracle.numeric`): the paged-cache gather, the prefill backend's two
attentions and ``kv_b_proj`` are the shared kernels. Under decode context
parallelism its loop's ``get_dcp_group().all_gather`` is
:class:`_NumericDcpGroup`: the rank-major concatenation of every rank's local
gather of the chunk, each from that rank's own cache. 0.27.1's
``_context_parallel_compute_prefill_context`` and its ``reorg_kvcache`` run
once per rank this process holds, and every rank must give the same bits. A
plan 0.27.1 refuses is refused first, with the class the layout level gives it.
"""

from __future__ import annotations

import contextlib
import types
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol
from unittest import mock

from harness.model import Case
from oracle.legacy_gather import LegacyGatherOps
from oracle.numeric import _Observed, _SharedAttentionBackend, _SharedProjection

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.numeric import PrefillInputs


class LegacyPlanner(Protocol):
    """What the legacy prefill asks of its side (:class:`oracle.legacy.LegacyOracleSide`):
    0.27.1's MLA module, its chunked-context metadata for a case, and the check
    that its DCP loop can run that metadata."""

    _mla: Any

    def upstream_metadata(self, case: Case, workspace: Any = None) -> Any: ...

    def check_dcp_loop(self, case: Case, metadata: Any) -> None: ...


class _LegacySharedBackend(_SharedAttentionBackend):
    """0.27.1's prefill backend interface on the shared kernels: its context
    chunks are named by index, and a backend reads the chunk's key offsets and
    longest span from the chunked-context metadata (as its FlashAttention
    backend does) and the query offsets from the prefill metadata."""

    chunked: Any = None

    def run_prefill_context_chunk(  # type: ignore[override]
        self, chunk_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        chunked = self.chunked
        return self._kernels.attention(
            q,
            k,
            v,
            self._query_start_loc,
            chunked.cu_seq_lens[chunk_idx],
            False,
            self._scale,
            self._max_query_len,
            int(chunked.max_seq_lens[chunk_idx]),
        )


class _NumericDcpGroup:
    """0.27.1's DCP group as its context loop uses it, for rank ``rank``:
    ``all_gather(local, dim=0)`` returns the rank-major concatenation of every
    rank's local gather of the same chunk.

    The calling rank's buffer is the one 0.27.1's loop gathered; every other
    rank's is that rank's gather of the chunk (its own cache and block table,
    0.27.1's own local metadata of the chunk, the shared gather), or, with real
    ranks, what the collective brings back. 0.27.1's builder takes no rank, so
    every rank's metadata is the same one. Its loop skips a chunk with no
    local rows (``toks == 0``) without calling the group, so the ``k``-th call
    is the ``k``-th chunk with rows.
    """

    def __init__(self, inputs: PrefillInputs, kernels: SharedKernels, rank: int, chunked: Any) -> None:
        assert inputs.dcp is not None
        self.world_size = inputs.dcp.world_size
        self._inputs, self._kernels, self._rank, self._chunked = inputs, kernels, rank, chunked
        self._chunk_of_call = [j for j, toks in enumerate(chunked.seq_tot) if int(toks) != 0]
        self.calls = 0

    def _rank_local(self, rank: int, chunk: int) -> torch.Tensor:
        import torch

        assert self._inputs.dcp is not None
        cache = self._inputs.dcp.cache(rank)
        chunked, toks = self._chunked, int(self._chunked.seq_tot[chunk])
        local = torch.empty((toks, cache.kv_cache.shape[-1]), dtype=cache.kv_cache.dtype, device=cache.kv_cache.device)
        self._kernels.gather(
            cache.kv_cache,
            local,
            cache.block_table,
            chunked.padded_local_cu_seq_lens[chunk],
            chunked.padded_local_token_to_seq[chunk],
            chunked.starts[chunk],
            toks,
        )
        return local

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        assert self._inputs.dcp is not None
        assert dim == 0, f"0.27.1's DCP loop all-gathers along dim 0, not {dim}"
        assert self.calls < len(self._chunk_of_call), "all_gather called more often than there are chunks with rows"
        chunk = self._chunk_of_call[self.calls]
        self.calls += 1
        assert tensor.shape[0] == int(self._chunked.seq_tot[chunk]), "the local buffer is not the chunk's rows"
        return self._inputs.dcp.collective.all_gather(
            lambda rank: tensor if rank == self._rank else self._rank_local(rank, chunk)
        )


def legacy_prefill(
    side: LegacyPlanner, case: Case, inputs: PrefillInputs, kernels: SharedKernels
) -> dict[str, torch.Tensor]:
    """0.27.1's ``forward_mha`` for ``case``, keys as :func:`oracle.numeric.prefill`:
    ``context_output``/``context_lse`` (its ``_compute_prefill_context``'s
    result, or under DCP its ``_context_parallel_compute_prefill_context``'s;
    absent without context) and ``output``/``lse`` after its final merge.

    Under DCP a plan 0.27.1 refuses at the layout level is refused here with
    the same class (its builder, then the shape-only run of its loop,
    :meth:`oracle.legacy.LegacyOracleSide.check_dcp_loop`); otherwise every rank this
    process holds runs 0.27.1's DCP loop on its own cache, every rank's
    tensors must be the same bits (:func:`oracle.numeric.check_ranks_agree`),
    and the result is this process's rank's.
    """
    from oracle.numeric import check_ranks_agree

    if case.dcp_world_size == 1:
        return _legacy_rank_prefill(side, case, inputs, kernels, 0)
    if inputs.dcp is None or inputs.dcp.world_size != case.dcp_world_size:
        raise ValueError(f"a DCP case (world {case.dcp_world_size}) needs per-rank inputs of that world")
    metadata = side.upstream_metadata(case)
    if metadata is not None:
        side.check_dcp_loop(case, metadata)
    own = inputs.dcp.rank
    results = {
        rank: _legacy_rank_prefill(side, case, inputs, kernels, rank)
        for rank in range(case.dcp_world_size)
        if inputs.dcp.collective.holds(rank)
    }
    for rank, tensors in results.items():
        check_ranks_agree(results[own], tensors, own, rank)
    return results[own]


def _legacy_rank_prefill(
    side: LegacyPlanner, case: Case, inputs: PrefillInputs, kernels: SharedKernels, rank: int
) -> dict[str, torch.Tensor]:
    """0.27.1's ``forward_mha`` as DCP rank ``rank`` runs it (the only rank without DCP)."""
    import torch

    mla, spec, device = side._mla, inputs.spec, inputs.q.device
    world = case.dcp_world_size
    seen = _Observed()
    kv_cache, block_table, rows = inputs.kv_cache, inputs.block_table, case.workspace_size
    if world > 1:
        assert inputs.dcp is not None
        cache = inputs.dcp.cache(rank)
        kv_cache, block_table = cache.kv_cache, cache.block_table
        # Its builder's __init__ allocates W + W // D rows under DCP: W / D for
        # the local gather, W for the all-gather.
        rows = case.workspace_size + case.workspace_size // world
    workspace = torch.empty((rows, spec.latent_dim), dtype=inputs.q.dtype, device=device)
    chunked = side.upstream_metadata(case, workspace)
    backend = _LegacySharedBackend(kernels, inputs.scale, inputs.query_start_loc, inputs.max_query_len, seen)
    backend.chunked = chunked
    prefill = mla.MLACommonPrefillMetadata(
        block_table=block_table,
        query_start_loc=inputs.query_start_loc,
        max_query_len=inputs.max_query_len,
        chunked_context=chunked,
        q_data_type=inputs.q.dtype,
        prefill_backend=backend,
    )
    impl = SimpleNamespace(
        kv_cache_dtype="auto",
        kv_lora_rank=spec.kv_lora_rank,
        qk_rope_head_dim=spec.qk_rope_head_dim,
        num_heads=spec.num_heads,
        qk_nope_head_dim=spec.qk_nope_head_dim,
        v_head_dim=spec.v_head_dim,
        kv_b_proj=_SharedProjection(kernels, inputs.kv_b_weight),
        # The copy fallback of _concat_k_nope_k_pe, as for the pinned oracle.
        _use_flashinfer_concat_mla_k=False,
        dcp_world_size=world,
    )
    base = mla.MLACommonBaseImpl
    impl._concat_k_nope_k_pe = types.MethodType(base._concat_k_nope_k_pe, impl)

    def compute_prefill_context(this: SimpleNamespace, q: torch.Tensor, cache: torch.Tensor, *args: Any) -> Any:
        # 0.27.1's method, unchanged; its result is recorded on the way out.
        output, lse = base._compute_prefill_context(this, q, cache, *args)
        seen.context = (output, lse)
        return output, lse

    def context_parallel_compute_prefill_context(
        this: SimpleNamespace, q: torch.Tensor, cache: torch.Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        # 0.27.1's DCP twin, unchanged; its result is recorded on the way out.
        output, lse = base._context_parallel_compute_prefill_context(this, q, cache, *args, **kwargs)
        seen.context = (output, lse)
        return output, lse

    impl._compute_prefill_context = types.MethodType(compute_prefill_context, impl)
    impl._context_parallel_compute_prefill_context = types.MethodType(context_parallel_compute_prefill_context, impl)
    attn_metadata = SimpleNamespace(prefill=prefill, num_prefills=case.num_requests)
    k_scale = torch.ones((), dtype=torch.float32, device=device)
    output = torch.empty((inputs.num_tokens, spec.num_heads * spec.v_head_dim), dtype=inputs.q.dtype, device=device)
    merge = mla.merge_attn_states

    def merge_with_lse(**kwargs: Any) -> None:
        # forward_mha's final merge passes no output_lse; a buffer for it only adds the store.
        if kwargs.get("output_lse") is None:
            kwargs["output_lse"] = torch.empty_like(kwargs["suffix_lse"])
            seen.merged_lse.append(kwargs["output_lse"])
        merge(**kwargs)

    group = _NumericDcpGroup(inputs, kernels, rank, chunked) if world > 1 and chunked is not None else None
    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(mla, "ops", LegacyGatherOps(kernels)))
        patches.enter_context(mock.patch.object(mla, "merge_attn_states", merge_with_lse))
        if group is not None:
            patches.enter_context(mock.patch.object(mla, "get_dcp_group", lambda: group))
        base.forward_mha(impl, inputs.q, inputs.new_kv_c, inputs.new_k_pe, kv_cache, attn_metadata, k_scale, output)
    if group is not None:
        # Every chunk with local rows went through the all-gather, once.
        assert group.calls == sum(1 for toks in chunked.seq_tot if int(toks) != 0), "a chunk skipped the all-gather"
    result = {"output": output.view(-1, spec.num_heads, spec.v_head_dim)}
    if chunked is None:
        assert seen.suffix_lse is not None and seen.context is None and not seen.merged_lse
        return {**result, "lse": seen.suffix_lse}
    assert seen.context is not None and len(seen.merged_lse) == 1
    context_output, context_lse = seen.context
    return {"context_output": context_output, "context_lse": context_lse, **result, "lse": seen.merged_lse[0]}
