"""Planning mutants: per_request with one bug in how it cuts a batch's context
into chunks or sizes the workspace.

The planner decides where each chunk starts and ends, where a request too long
for one chunk is cut, how many rows a DCP rank pads a request to, and how large
the workspace is. Each mutant here gets one of those decisions wrong the way a
hand port could: the legacy equal-share grid kept, a request cut off the
alignment boundary or allowed to swallow a remainder shorter than a block, a
zero-context request that does not end a run of chunks, DCP padding that
ignores the interleave size, the old workspace floor kept. On the inputs that
tell, the layout or the workspace size the port reports differs from the
oracle's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from harness.model import Case, Layout, WorkspaceConfig, alignment_unit
from ports.mutants.base import Mutant
from ports.per_request import dense_workspace_size
from ports.per_request import metadata as metadata_module
from ports.per_request import planner as planner_module
from ports.per_request.planner import Geometry, PlannedChunk


class LegacyGrid(Mutant):
    name = "legacy-grid"
    description = "keeps the pre-b38e111d3e equal-share grid"
    source = "seeds/000"

    def plan_layout(self, case: Case) -> Layout:
        from ports.equal_share import grid_layout

        return grid_layout(case)

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        from ports.equal_share.prefill import prefill

        return prefill(self.plan_layout(case), case.workspace_size, inputs, kernels)


class UnalignedSplit(Mutant):
    name = "unaligned-split"
    description = "cuts a request at any row, not on the block (alignment) boundary"
    source = "hand port"
    conditions = (("dense.cut_aligned", "free_rows_unaligned"),)

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = planner_module._largest_split

        def split(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
            return real(dataclasses.replace(geometry, alignment=1), start, remaining, free_rows)

        return [(planner_module, "_largest_split", split)]


class SplitTakesWholeRemainder(Mutant):
    name = "split-takes-remainder"
    description = "lets a split consume the whole remaining request when less than a block would be left"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = planner_module._largest_split

        def split(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
            cut = real(geometry, start, remaining, free_rows)
            return remaining if cut and remaining - cut < geometry.alignment else cut

        return [(planner_module, "_largest_split", split)]


class ZeroContextJoinsRun(Mutant):
    name = "zero-context-joins-run"
    description = "a zero-context request does not end the run: chunks span it with zero rows"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = planner_module.plan_chunks

        def plan(context_lens: list[int], geometry: Geometry) -> list[PlannedChunk]:
            kept = [r for r, c in enumerate(context_lens) if c > 0]
            packed = real([context_lens[r] for r in kept], geometry)
            chunks = []
            for chunk in packed:
                first, last = kept[chunk.first], kept[chunk.end - 1]
                spans = dict(zip(kept[chunk.first : chunk.end], chunk.spans, strict=True))
                chunks.append(PlannedChunk(first, tuple(spans.get(r, (0, 0)) for r in range(first, last + 1))))
            return chunks

        return [(metadata_module, "plan_chunks", plan)]


class DcpPaddingWithoutInterleave(Mutant):
    name = "dcp-padding-no-interleave"
    description = "DCP padded rows computed as ceil(n / world), ignoring the interleave size"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def padded(geometry: Geometry, rows: int) -> int:
            return rows if not geometry.sharded else -(-rows // geometry.dcp_world_size)

        return [(Geometry, "padded", padded)]


class WorkspaceFloor(Mutant):
    name = "workspace-floor"
    description = "keeps the max_num_seqs x block_size workspace floor"
    source = "seeds/004"

    def workspace_size(self, config: WorkspaceConfig) -> int:
        size = max(dense_workspace_size(config), config.max_num_seqs * config.block_size)
        unit = alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
        return -(-size // unit) * unit
