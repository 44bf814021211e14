"""L1 workspace sizing: the ports against upstream's own sizing functions."""

from __future__ import annotations

from harness.cases.suites import workspace_grid
from harness.model import WorkspaceConfig
from harness.protocol.port import Port


def test_per_request_matches_oracle_over_grid(oracle: Port, per_request: Port) -> None:
    grid = workspace_grid("full")
    assert len(grid) > 1000
    mismatches = [
        (c, oracle.workspace_size(c), per_request.workspace_size(c))
        for c in grid
        if oracle.workspace_size(c) != per_request.workspace_size(c)
    ]
    assert not mismatches, mismatches[:5]


def test_no_max_num_seqs_floor(oracle: Port, equal_share: Port) -> None:
    """seeds/004: many sequences in a short model no longer inflate the workspace."""
    config = WorkspaceConfig(max_model_len=100, max_num_seqs=4096, block_size=16)
    assert oracle.workspace_size(config) == 65536
    config = WorkspaceConfig(
        max_model_len=1, max_num_seqs=3, block_size=16, dcp_world_size=8, cp_kv_cache_interleave_size=16
    )
    assert oracle.workspace_size(config) == 256
    assert equal_share.workspace_size(WorkspaceConfig(100, 4096 * 4, 16)) > 65536


def test_dcp_alignment_rounds_up(oracle: Port, per_request: Port) -> None:
    config = WorkspaceConfig(
        max_model_len=13, max_num_seqs=1, block_size=64, dcp_world_size=4, cp_kv_cache_interleave_size=64
    )
    assert oracle.workspace_size(config) == per_request.workspace_size(config) == 256
