"""Ports with bugs planted for ``parity explore`` to find (tests/test_explore.py)."""

from __future__ import annotations

import dataclasses

from harness.model import Case, Layout, WorkspaceConfig
from ports.per_request import PerRequestPort, dense_workspace_size

# The ranks of one NVLink domain: what a port written for single-node DCP assumes.
RANKS_PER_NODE = 8


class NodeRankTablePort(PerRequestPort):
    """The per-request port with its DCP rank table sized for one node: a chunk's
    ``local_context_lens_allranks`` keeps the first :data:`RANKS_PER_NODE` ranks.

    The input class is a DCP world above 8 (the engine takes any world that
    divides the tensor-parallel size: 16 across two nodes of 8). The case model
    accepts worlds up to 64, but every fixed family deals its world from a list
    that stops at 8 (the sweep's 2, 4, 8; the coverage families' 2, 3, 4, 6, 8),
    so no fixed suite holds such a case; explore draws worlds from the validity
    rules and reaches it.
    """

    name = "node-rank-table"

    def plan_layout(self, case: Case) -> Layout:
        layout = super().plan_layout(case)
        if case.dcp_world_size <= RANKS_PER_NODE:
            return layout
        chunks = tuple(
            dataclasses.replace(
                chunk,
                local_context_lens_allranks=tuple(
                    ranks[:RANKS_PER_NODE] for ranks in chunk.local_context_lens_allranks or ()
                ),
            )
            for chunk in layout.chunks
        )
        return Layout(chunks, layout.empty_token_slices)


class WorkspaceRoundedToBlockPort(PerRequestPort):
    """The per-request port with the dense workspace rounded up to the block size
    instead of the alignment unit (SPEC 1b: ``lcm(block, I*D)`` under DCP). The
    ci suite's workspace grid catches it; the explore tests use it for a workspace
    find and its replay."""

    name = "workspace-rounded-to-block"

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return dense_workspace_size(dataclasses.replace(config, dcp_world_size=1, cp_kv_cache_interleave_size=1))


NODE_RANK_TABLE = NodeRankTablePort()
WORKSPACE_ROUNDED_TO_BLOCK = WorkspaceRoundedToBlockPort()
