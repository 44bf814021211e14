"""The project's own port of upstream b38e111d3e's per-request chunk planner.

Written from SPEC section 1b; it never imports or copies vLLM. ``PORT`` is the
object the harness loads as ``--port per_request``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.model import Case, Layout, WorkspaceConfig, alignment_unit
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig
from ports.per_request import sparse
from ports.per_request.metadata import build_layout

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs, PrefillInputs
    from harness.kernels.sparse_prefill import SparsePrefillInputs
    from harness.model.sparse import TopkMaskCase

# Upstream's dense workspace heuristic (SPEC section 1b): room for 8 full-length
# requests or 4 pages per sequence, capped so the up-projected context stays bounded.
DENSE_WORKSPACE_CAP = 65536


def dense_workspace_size(config: WorkspaceConfig) -> int:
    """The dense workspace, rounded up to the alignment unit and at least one unit.

    Per-request packing needs room for one aligned chunk step only, so there is
    no ``max_num_seqs * block_size`` floor (seeds/004 removed its reintroduction).
    """
    unit = alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
    wanted = min(max(8 * config.max_model_len, 4 * config.max_num_seqs * config.block_size), DENSE_WORKSPACE_CAP)
    wanted = max(wanted, unit)
    return -(-wanted // unit) * unit


class PerRequestPort:
    name = "per_request"

    def plan_layout(self, case: Case) -> Layout:
        return build_layout(case)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return dense_workspace_size(config)

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        from ports.per_request.merge_kernel import merge_partials

        out = torch.empty_like(inputs.prefix_output)
        out_lse = torch.empty_like(inputs.prefix_lse)
        merge_partials(
            inputs.prefix_output,
            inputs.prefix_lse,
            inputs.suffix_output,
            inputs.suffix_lse,
            out,
            out_lse,
            inputs.prefill_tokens_with_context,
        )
        return out, out_lse

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        from ports.per_request.prefill import prefill

        return prefill(build_layout(case), case.workspace_size, inputs, kernels)

    # -- the sparse path (SPEC 1d) -------------------------------------------------------

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        return sparse.plan_sparse(case)

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        return sparse.sparse_workspace_size(config)

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        return sparse.build_topk_mask(case, topk)

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        return sparse.remap_topk(topk, case.range_starts, case.range_lens)

    def sparse_prefill(
        self, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
    ) -> dict[str, torch.Tensor]:
        from ports.per_request.sparse_prefill import sparse_prefill

        return sparse_prefill(case, inputs, kernels)


PORT = PerRequestPort()
