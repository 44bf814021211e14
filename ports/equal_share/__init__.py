"""The legacy equal-share grid (SPEC section 1a), before upstream b38e111d3e.

This is the scheme a port that has not yet taken vllm PR #50613 still carries
(seeds/000): every prefill with context gets an equal, block-aligned share of
the workspace, and chunk ``j`` covers the window ``[j*share, (j+1)*share)`` of
*every* prefill, so a chunk may carry requests that contribute no rows. It is
expected to diverge from the oracle; the harness reports by how much.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

from harness.model import Case, Chunk, Layout, WorkspaceConfig, alignment_unit

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels
    from harness.numeric import MergeInputs, PrefillInputs


def _padded(rows: int, world: int, interleave: int) -> int:
    if world == 1:
        return rows
    stride = world * interleave
    return -(-rows // stride) * interleave


def grid_layout(case: Case) -> Layout:
    """``ceil(max context / share)`` chunks, each spanning the whole prefill batch."""
    with_context = sum(1 for c in case.context_lens if c > 0)
    if with_context == 0:
        return Layout(chunks=())
    unit = case.alignment
    share = case.workspace_size // with_context // unit * unit
    if share <= 0:
        raise ValueError(
            f"equal share of a {case.workspace_size}-row workspace over {with_context} prefills "
            f"is below one alignment unit ({unit} rows)"
        )
    world, interleave = case.dcp_world_size, case.cp_kv_cache_interleave_size
    qsl = case.query_start_loc
    n = case.num_requests
    num_chunks = -(-max(case.context_lens) // share)
    chunks = []
    for j in range(num_chunks):
        window = j * share
        seq_lens = [max(0, min(c, window + share) - window) for c in case.context_lens]
        rows = [r for r, length in enumerate(seq_lens) for _ in range(length)]
        dcp: dict[str, object] = {}
        if world > 1:
            local = [
                _padded(window + s, world, interleave) - _padded(window, world, interleave) if s else 0
                for s in seq_lens
            ]
            dcp = {
                "local_starts": tuple(_padded(window, world, interleave) for _ in seq_lens),
                "padded_local_seq_lens": tuple(local),
                "padded_local_cu_seq_lens": tuple(accumulate(local, initial=0)),
                "padded_local_token_to_seq": tuple(r for r, length in enumerate(local) for _ in range(length)),
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
    """The legacy sizing keeps the ``max_num_seqs * block_size`` floor: an equal
    share must give every sequence at least one block."""
    unit = alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
    size = min(max(8 * config.max_model_len, 4 * config.max_num_seqs * config.block_size), 65536)
    size = max(size, config.max_num_seqs * config.block_size, unit)
    return -(-size // unit) * unit


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


PORT = EqualSharePort()
