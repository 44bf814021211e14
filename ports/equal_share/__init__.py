"""The legacy equal-share grid (SPEC section 1a), before upstream b38e111d3e.

This is the scheme a port that has not yet taken vllm PR #50613 still carries
(seeds/000): every prefill with context gets an equal, block-aligned share of
the workspace, and chunk ``j`` covers the window ``[j*share, (j+1)*share)`` of
*every* prefill, so a chunk may carry requests that contribute no rows. It is
expected to diverge from the pinned oracle; the harness reports by how much.
Its authority is vllm==0.27.1 (``--oracle vllm==0.27.1``): the grid, the DCP
local windows and the workspace size follow that release exactly wherever it
can plan and run a batch.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

from harness.model import Case, Chunk, Layout, WorkspaceConfig
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs, PrefillInputs
    from harness.kernels.sparse_prefill import SparsePrefillInputs
    from harness.model.sparse import TopkMaskCase


def _local_rows(rows: int, world: int, interleave: int) -> int:
    """Rows of a ``rows``-long context span the fullest DCP rank holds, padded
    to whole interleave blocks: ``ceil(rows / (I*D)) * I``."""
    return -(-rows // (world * interleave)) * interleave


def _rank_context_lens(context: int, world: int, interleave: int) -> tuple[int, ...]:
    """Each rank's share of a ``context``-row request, dealt round-robin in
    interleave blocks of ``I`` rows, rank 0 first."""
    full_rounds = context // (world * interleave)
    left = context - full_rounds * world * interleave
    return tuple(full_rounds * interleave + min(max(left - rank * interleave, 0), interleave) for rank in range(world))


def equal_share(case: Case) -> int:
    """Each prefill's share of the workspace (SPEC 1a): ``W // n`` rounded down to
    the block size (not widened under DCP), which must stay > 0 and, under DCP,
    be a multiple of the world size (the legacy DCP gather's requirement)."""
    with_context = sum(1 for c in case.context_lens if c > 0)
    share = case.workspace_size // with_context
    if case.align_to_block:
        share = share // case.block_size * case.block_size
    if share <= 0:
        raise ValueError(
            f"equal share of a {case.workspace_size}-row workspace over {with_context} prefills "
            f"is below one block ({case.block_size if case.align_to_block else 1} rows)"
        )
    if case.dcp_world_size > 1 and share % case.dcp_world_size:
        raise ValueError(
            f"equal share of a {case.workspace_size}-row workspace over {with_context} prefills "
            f"({share} rows) is not a multiple of the DCP world size {case.dcp_world_size}"
        )
    return share


def grid_layout(case: Case) -> Layout:
    """``ceil(max context / share)`` chunks, each spanning the whole prefill batch.

    Under DCP every rank's window of chunk ``j`` starts at ``j * local_share``
    local rows, ``local_share = ceil(share / (I*D)) * I``, and a request's local
    span is that window cut to its padded local context ``ceil(c / (I*D)) * I``.
    When ``I*D`` divides the share this is the padded image of the global
    window; when it does not, the local windows run ahead of the global ones.
    """
    if not any(c > 0 for c in case.context_lens):
        return Layout(chunks=())
    share = equal_share(case)
    world, interleave = case.dcp_world_size, case.cp_kv_cache_interleave_size
    qsl = case.query_start_loc
    n = case.num_requests
    num_chunks = -(-max(case.context_lens) // share)
    local_share = _local_rows(share, world, interleave)
    ranks = tuple(_rank_context_lens(c, world, interleave) for c in case.context_lens)
    chunks = []
    for j in range(num_chunks):
        window = j * share
        seq_lens = [max(0, min(c, window + share) - window) for c in case.context_lens]
        rows = [r for r, length in enumerate(seq_lens) for _ in range(length)]
        dcp: dict[str, object] = {}
        if world > 1:
            local_start = j * local_share
            local = [
                max(0, min(_local_rows(c, world, interleave), local_start + local_share) - local_start)
                for c in case.context_lens
            ]
            dcp = {
                "local_starts": tuple([local_start] * n),
                "padded_local_seq_lens": tuple(local),
                "padded_local_cu_seq_lens": tuple(accumulate(local, initial=0)),
                "padded_local_token_to_seq": tuple(r for r, length in enumerate(local) for _ in range(length)),
                "local_context_lens_allranks": ranks,
                "num_local_context_tokens": sum(local),
            }
        chunks.append(
            Chunk(
                index=j,
                request_start=0,
                request_end=n,
                token_start=0,
                token_end=qsl[n],
                # Every later chunk is merged over the whole batch.
                continuation_token_end=qsl[n] if j else qsl[1],
                is_continuation=j > 0,
                num_context_tokens=sum(seq_lens),
                query_start_loc=tuple(qsl),
                max_query_len=max(case.query_lens),
                cu_seq_lens=tuple(accumulate(seq_lens, initial=0)),
                starts=tuple([window] * n),
                seq_lens=tuple(seq_lens),
                max_seq_len=max(seq_lens),
                token_to_seq=tuple(rows),
                **dcp,  # type: ignore[arg-type]
            )
        )
    return Layout(chunks=tuple(chunks))


def legacy_workspace_size(config: WorkspaceConfig) -> int:
    """The legacy sizing: the dense heuristic capped at 65,536 rows, then at
    least one block per sequence (the floor seeds/004 removed later). Neither
    rounded to an alignment nor widened under DCP: the equal share is rounded
    per batch instead."""
    size = min(max(8 * config.max_model_len, 4 * config.max_num_seqs * config.block_size), 65536)
    return max(size, config.max_num_seqs * config.block_size)


class EqualSharePort:
    name = "equal_share"

    def plan_layout(self, case: Case) -> Layout:
        return grid_layout(case)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return legacy_workspace_size(config)

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        # The merge kernel did not change in b38e111d3e: the legacy port's is per_request's.
        from ports.per_request import PORT as per_request

        return per_request.merge_states(inputs)

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        from ports.equal_share.prefill import prefill

        return prefill(grid_layout(case), case.workspace_size, inputs, kernels)

    # -- the sparse path as 0.27.1 had it (ports/equal_share/sparse.py) ---------------------

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        from ports.equal_share.sparse import legacy_plan_sparse

        return legacy_plan_sparse(case)

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        from ports.equal_share.sparse import legacy_sparse_workspace_size

        return legacy_sparse_workspace_size(config)

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        # The mask builder did not change in b38e111d3e.
        from ports.per_request import PORT as per_request

        return per_request.build_topk_mask(case, topk)

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        from ports.per_request import PORT as per_request

        return per_request.remap_topk(case, topk)

    def sparse_prefill(
        self, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
    ) -> dict[str, torch.Tensor]:
        from ports.equal_share.sparse_prefill import sparse_prefill

        return sparse_prefill(case, inputs, kernels)


PORT = EqualSharePort()
