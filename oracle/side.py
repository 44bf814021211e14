"""The oracle side: the pinned vLLM's own planner, metadata builder and workspace
sizing, called (never copied) and translated into the harness's data model."""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING, Any

from harness.model import Case, Chunk, Layout, WorkspaceConfig
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig, TopkMaskCase

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs, PrefillInputs
    from harness.kernels.sparse_prefill import SparsePrefillInputs
from oracle.environment import import_vllm_module, module_source_file
from oracle.pin import MLA
from oracle.vllm_config import workspace_vllm_config


def _ints(tensor: Any) -> tuple[int, ...]:
    return tuple(tensor.tolist())


def _optional_ints(values: Any) -> tuple[int, ...] | None:
    if values is None:
        return None
    return _ints(values) if hasattr(values, "tolist") else tuple(int(v) for v in values)


class SparseSideMixin:
    """The sparse path's oracle methods (:mod:`oracle.sparse`) for a release's side."""

    _sparse_oracle: Any = None

    def _sparse(self) -> Any:
        if self._sparse_oracle is None:
            from oracle.sparse import SparseOracle

            self._sparse_oracle = SparseOracle(self)
        return self._sparse_oracle

    def sparse_source_digest(self) -> str:
        """SHA-256 over the installed source files of the vLLM modules the sparse
        path runs (its backend and the MLA module). The pin's fingerprints cover
        the dense symbols only: the oracle cache keeps sparse answers on disk
        under these bytes, so an edited or reinstalled sparse backend is another key."""
        from oracle.sparse import SPARSE

        # Found, not imported: a run answered from the cache never imports vLLM.
        digest = hashlib.sha256()
        for module in (SPARSE, MLA):
            digest.update(module.encode() + b"\0" + module_source_file(module).read_bytes() + b"\0")
        return digest.hexdigest()

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        layout: SparseLayout = self._sparse().plan(case)
        return layout

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        return int(self._sparse().workspace_size(config))

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        mask: torch.Tensor = self._sparse().build_topk_mask(case, topk)
        return mask

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        remapped: list[torch.Tensor] = self._sparse().remap_topk(case, topk)
        return remapped

    def sparse_prefill(
        self, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
    ) -> dict[str, torch.Tensor]:
        from oracle.sparse_prefill import sparse_prefill

        return sparse_prefill(self._sparse(), case, inputs, kernels)


class OracleSide(SparseSideMixin):
    """Upstream b38e111d3e through the installed vllm==0.28.0.

    Implements the same interface as a port (:class:`harness.protocol.port.Port`).
    """

    name = "oracle"

    @functools.cached_property
    def _torch(self) -> Any:
        # Imported on the first question, as vLLM is (:attr:`_mla`): a layout-only
        # run answered from the oracle cache never loads torch.
        return import_vllm_module("torch")

    @functools.cached_property
    def _workspace_stub(self) -> Any:
        # The layout never touches the workspace tensor; a stub stands in for it.
        return self._torch.empty(0)

    def import_upstream(self) -> None:
        """Import now the vLLM module every level calls (otherwise imported on the
        first question): the trace records what answering enters, not the import."""
        self._mla  # noqa: B018  (the property imports)

    @functools.cached_property
    def _mla(self) -> Any:
        # Imported on the first question: a run answered from the oracle cache
        # never imports vLLM (oracle.pin_record checks the pin without it).
        return import_vllm_module(MLA)

    def upstream_metadata(self, case: Case) -> Any:
        """Upstream's ``ChunkedContextMetadata`` for ``case`` (None without context)."""
        torch = self._torch
        return self._mla.build_mla_chunked_context_metadata(
            context_lens_cpu=torch.tensor(case.context_lens, dtype=torch.int32),
            prefill_query_start_loc_cpu=torch.tensor(case.query_start_loc, dtype=torch.int32),
            chunked_prefill_workspace=self._workspace_stub,
            chunked_prefill_workspace_size=case.workspace_size,
            block_size=case.block_size,
            align_chunk_to_block=case.align_to_block,
            device=torch.device("cpu"),
            dcp_world_size=case.dcp_world_size,
            dcp_local_block_size=case.cp_kv_cache_interleave_size,
            dcp_virtual_block_size=case.cp_kv_cache_interleave_size * case.dcp_world_size,
        )

    def upstream_plan(self, case: Case) -> Any:
        """Upstream's planner alone (``plan_mla_context_chunks``), without DCP; for timing."""
        unit = case.alignment
        workspace = case.workspace_size
        return self._mla.plan_mla_context_chunks(
            list(case.context_lens), workspace, workspace // unit * unit, unit, lambda rows: rows
        )

    def plan_layout(self, case: Case) -> Layout:
        metadata = self.upstream_metadata(case)
        if metadata is None:
            return Layout(chunks=())
        chunks = tuple(self._chunk(c) for c in metadata.chunks)
        empty = tuple((s.start, s.stop) for s in metadata.empty_token_slices)
        return Layout(chunks=chunks, empty_token_slices=empty)

    @staticmethod
    def _chunk(c: Any) -> Chunk:
        sharded = c.local_starts is not None
        return Chunk(
            index=c.index,
            request_start=c.request_slice.start,
            request_end=c.request_slice.stop,
            token_start=c.token_slice.start,
            token_end=c.token_slice.stop,
            continuation_token_end=c.continuation_token_end,
            is_continuation=bool(c.is_continuation),
            num_context_tokens=c.num_context_tokens,
            query_start_loc=_ints(c.query_start_loc),
            max_query_len=c.max_query_len,
            cu_seq_lens=_ints(c.cu_seq_lens),
            starts=_ints(c.starts),
            seq_lens=_ints(c.seq_lens),
            max_seq_len=c.max_seq_len,
            token_to_seq=_ints(c.token_to_seq),
            local_starts=_optional_ints(c.local_starts),
            padded_local_seq_lens=_optional_ints(c.padded_local_seq_lens),
            padded_local_cu_seq_lens=_optional_ints(c.padded_local_cu_seq_lens),
            padded_local_token_to_seq=_optional_ints(c.padded_local_token_to_seq),
            local_context_lens_allranks=(
                tuple(tuple(int(v) for v in ranks) for ranks in c.local_context_lens_allranks)
                if c.local_context_lens_allranks is not None
                else None
            ),
            num_local_context_tokens=c.num_local_context_tokens if sharded else None,
        )

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """L2: upstream ``merge_attn_states`` and its Triton kernel."""
        from oracle.numeric import merge_states

        return merge_states(inputs)

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        """L3: upstream's context loop and final merge on the shared kernels."""
        from oracle.numeric import prefill

        return prefill(case, inputs, kernels)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        sizing = self._mla.MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size
        return int(sizing(workspace_vllm_config(config)))
