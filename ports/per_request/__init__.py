"""The project's own port of upstream b38e111d3e's per-request chunk planner.

Written from SPEC section 1b; it never imports or copies vLLM. ``PORT`` is the
object the harness loads as ``--port per_request``.
"""

from __future__ import annotations

from harness.model import Case, Layout, WorkspaceConfig, alignment_unit
from ports.per_request.metadata import build_layout

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


PORT = PerRequestPort()
