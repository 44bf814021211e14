"""Power-of-two mutants: per_request with arithmetic that is right only when a
size is a power of two.

Block sizes and DCP worlds are powers of two in most configurations, and on
those a shift for a division, a bit mask for a round-down, ``max`` for an lcm,
or rounding up before capping at 65536 give the right answer. They do not for
block sizes such as 528, 544 or 1056, or DCP worlds of 3 or 6, and only such
inputs can tell. Each mutant names that input class and the level that sees it
in ``aimed_at``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ports.per_request as per_request_package
from harness.model import WorkspaceConfig, alignment_unit
from ports.mutants.base import Mutant
from ports.per_request import DENSE_WORKSPACE_CAP
from ports.per_request import metadata as metadata_module
from ports.per_request import planner as planner_module
from ports.per_request.planner import Geometry


def _power_of_two_log2(value: int) -> int:
    """log2 as a port computes it for a shift: exact only when ``value`` is a power of two."""
    return value.bit_length() - 1


def _round_down_by_mask(value: int, unit: int) -> int:
    """``value & ~(unit - 1)``: rounding down to ``unit`` only when ``unit`` is a power of two."""
    return value & ~(unit - 1)


class _MaxAlignmentGeometry(Geometry):
    """Geometry whose DCP alignment is ``max(block, I*D)``, not their lcm."""

    @classmethod
    def for_workspace(
        cls, workspace_size: int, block_size: int, align_to_block: bool, dcp_world_size: int, interleave: int
    ) -> Geometry:
        geometry = Geometry.for_workspace(workspace_size, block_size, align_to_block, dcp_world_size, interleave)
        if dcp_world_size == 1:
            return geometry
        alignment = max(block_size if align_to_block else 1, dcp_world_size * interleave)
        return dataclasses.replace(geometry, alignment=alignment, max_span=workspace_size // alignment * alignment)


def _max_alignment_unit(block_size: int, dcp_world_size: int, interleave: int, align_to_block: bool = True) -> int:
    unit = block_size if align_to_block else 1
    return max(unit, dcp_world_size * interleave) if dcp_world_size > 1 else unit


class AlignmentMaxNotLcm(Mutant):
    name = "align-max-not-lcm"
    aimed_at = (
        "L1: DCP where block size and I*D do not divide one another (block 16 with D=3, block 528 with "
        "I*D=64), in a case that splits or in the workspace grid"
    )
    description = (
        "takes the DCP alignment as max(block_size, I*D) instead of lcm: the same on powers of two, "
        "not for block 528 or a world of 3"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return [
            (metadata_module, "Geometry", _MaxAlignmentGeometry),
            (per_request_package, "alignment_unit", _max_alignment_unit),
        ]


class _MaskedSpanGeometry(Geometry):
    """Geometry whose largest span is rounded down to the alignment by a bit mask."""

    @classmethod
    def for_workspace(
        cls, workspace_size: int, block_size: int, align_to_block: bool, dcp_world_size: int, interleave: int
    ) -> Geometry:
        geometry = Geometry.for_workspace(workspace_size, block_size, align_to_block, dcp_world_size, interleave)
        max_span = _round_down_by_mask(workspace_size, geometry.alignment)
        if max_span <= 0:
            raise ValueError(f"workspace of {workspace_size} rows is below one alignment unit")
        return dataclasses.replace(geometry, max_span=max_span)


def _largest_split_by_mask(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
    """per_request's split with its round-down done by a bit mask."""
    unit = geometry.alignment
    longest = min(geometry.max_span, _round_down_by_mask(remaining - 1, unit))
    lo, hi = 0, longest // unit
    while lo < hi:
        units = (lo + hi + 1) // 2
        if geometry.cost(start, units * unit) <= free_rows:
            lo = units
        else:
            hi = units - 1
    return lo * unit


class RoundDownByMask(Mutant):
    name = "round-down-by-mask"
    aimed_at = (
        "L1: an alignment unit that is not a power of two (block 528, 544, 1056, or a DCP lcm of 48) whose "
        "round-down differs, e.g. block 528, workspace 1584, a context above 1584"
    )
    description = (
        "rounds down to the alignment with x & ~(unit - 1), right only when the unit is a power of two "
        "(not for block 528, 544, 1056 or a DCP world of 3)"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return [
            (metadata_module, "Geometry", _MaskedSpanGeometry),
            (planner_module, "_largest_split", _largest_split_by_mask),
        ]


class DcpPaddedByShift(Mutant):
    name = "dcp-padded-by-shift"
    aimed_at = "L1: DCP with I*D not a power of two (world 3 or 6, or such an interleave)"
    description = (
        "DCP padded(n) = ((n + I*D - 1) >> log2(I*D)) << log2(I): right only when world and interleave are "
        "powers of two"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def padded(geometry: Geometry, rows: int) -> int:
            if not geometry.sharded:
                return rows
            stride = geometry.interleave * geometry.dcp_world_size
            rounds = (rows + stride - 1) >> _power_of_two_log2(stride)
            return rounds << _power_of_two_log2(geometry.interleave)

        return [(Geometry, "padded", padded)]


class DcpRankLensByMask(Mutant):
    name = "dcp-rank-lens-by-mask"
    aimed_at = "L1: DCP with I*D not a power of two (world 3 or 6, or such an interleave)"
    description = (
        "per-rank DCP context lengths with a shift and a mask for the full rounds and the tail: right only when "
        "I*D is a power of two"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def rank_context_lens(context_len: int, world: int, interleave: int) -> tuple[int, ...]:
            stride = world * interleave
            full_rounds = context_len >> _power_of_two_log2(stride)
            tail = context_len & (stride - 1)
            return tuple(
                full_rounds * interleave + min(max(tail - rank * interleave, 0), interleave) for rank in range(world)
            )

        return [(metadata_module, "rank_context_lens", rank_context_lens)]


class WorkspaceRoundThenCap(Mutant):
    name = "workspace-round-then-cap"
    aimed_at = (
        "L1 workspace grid: an alignment unit that does not divide 65536 (block 528, DCP world 3) with the "
        "heuristic capped (8 x max_model_len above 65536)"
    )
    description = (
        "rounds the workspace heuristic up to the alignment before capping it at 65536, not after: the cap is "
        "then not a multiple of a unit that does not divide 65536"
    )
    source = "hand port"

    def workspace_size(self, config: WorkspaceConfig) -> int:
        unit = alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
        wanted = max(8 * config.max_model_len, 4 * config.max_num_seqs * config.block_size, unit)
        return min(-(-wanted // unit) * unit, max(DENSE_WORKSPACE_CAP, unit))
