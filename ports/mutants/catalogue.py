"""The mutants, one realistic bug each (see ``ports/mutants/__init__.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import triton
import triton.language as tl

import ports.per_request as per_request_package
from harness.model import Case, Chunk, Layout, WorkspaceConfig, alignment_unit
from ports.per_request import DENSE_WORKSPACE_CAP, PerRequestPort, dense_workspace_size
from ports.per_request import dcp as dcp_module
from ports.per_request import merge_kernel as merge_module
from ports.per_request import metadata as metadata_module
from ports.per_request import planner as planner_module
from ports.per_request import prefill as prefill_module
from ports.per_request.planner import Geometry, PlannedChunk


@contextlib.contextmanager
def swapped(swaps: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Replace attributes for the duration of a call, and always restore them."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in swaps]
    try:
        for obj, name, value in swaps:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


class Mutant(PerRequestPort):
    """per_request with one fault: ``swaps()`` replaces functions during every
    call; ``rewrite_chunk`` edits each planned chunk."""

    name = "mutant"
    description = ""
    source = ""  # where the bug comes from (a seed document, or "hand port")
    # Issue 12's mutants: the input class that kills it and the level, so a
    # suite's generators can be checked against it.
    aimed_at = ""

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return []

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return chunk

    def plan_layout(self, case: Case) -> Layout:
        with swapped(self.swaps()):
            layout = super().plan_layout(case)
        chunks = tuple(self.rewrite_chunk(c, case) for c in layout.chunks)
        return Layout(chunks, layout.empty_token_slices)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        with swapped(self.swaps()):
            return super().workspace_size(config)

    def merge_states(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with swapped(self.swaps()):
            return super().merge_states(inputs)

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        layout = self.plan_layout(case)
        with swapped(self.swaps()):
            return prefill_module.prefill(layout, case.workspace_size, inputs, kernels)

    # The sparse path (ports/per_request/sparse.py), under the same swaps.
    def plan_sparse(self, case: Any) -> Any:
        with swapped(self.swaps()):
            return super().plan_sparse(case)

    def sparse_workspace_size(self, config: Any) -> int:
        with swapped(self.swaps()):
            return super().sparse_workspace_size(config)

    def build_topk_mask(self, case: Any, topk: list[torch.Tensor]) -> torch.Tensor:
        with swapped(self.swaps()):
            return super().build_topk_mask(case, topk)

    def remap_topk(self, case: Any, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        with swapped(self.swaps()):
            return super().remap_topk(case, topk)

    def sparse_prefill(self, case: Any, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        with swapped(self.swaps()):
            return super().sparse_prefill(case, inputs, kernels)


# -- planning ----------------------------------------------------------------------------------


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


# -- metadata ----------------------------------------------------------------------------------


class ContinuationOverWholeChunk(Mutant):
    name = "continuation-whole-chunk"
    description = "merges a continuation over the chunk's whole token range, not just its first request"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return dataclasses.replace(chunk, continuation_token_end=chunk.token_end) if chunk.is_continuation else chunk


class ContinuationFromLastRequest(Mutant):
    name = "continuation-wrong-request"
    description = "takes the continuation flag from the chunk's last request instead of its first"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return dataclasses.replace(chunk, is_continuation=chunk.starts[-1] > 0)


class QueryStartNotRebased(Mutant):
    name = "query-start-not-rebased"
    description = "chunk-local query_start_loc keeps batch offsets instead of starting at 0"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        offset = chunk.token_start
        return dataclasses.replace(chunk, query_start_loc=tuple(q + offset for q in chunk.query_start_loc))


# -- merging -----------------------------------------------------------------------------------


class FiniteLseOnEmptyRows(Mutant):
    name = "finite-lse-empty-rows"
    description = "leaves a finite LSE (0) on the rows of zero-context requests"
    source = "seeds/003"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = prefill_module.context_partial

        def partial(layout: Layout, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
            out, lse = real(layout, *args)
            for start, stop in layout.empty_token_slices:
                lse[:, start:stop] = 0.0
            return out, lse

        return [(prefill_module, "context_partial", partial)]


class EqualShareNoNeutralise(Mutant):
    """The legacy equal_share port with its neutralisation of rows without keys
    deleted (seeds/003's bug in the loop it fixed): each grid chunk's partial is
    merged as the attention kernel reported it.

    What counts as its kill. It is equal_share in every other respect, so it
    diverges at L1 (the grid) and on most L3 cases wherever equal_share itself
    does; those items prove nothing about neutralisation. Its honest kill is an
    L3 item on which the real equal_share is bit-exact with the oracle and this
    mutant is not: the smoke files ``keyless-finite`` and ``keyless-pos-inf``
    (one request with context among zero-context ones, whose grid cuts the
    context where the oracle does), which are the first prefill items of the
    smoke and ci suites, so the kill matrix names one of them (a test checks
    that equal_share reaches parity there). Under the default ``neg-inf``
    kernels the mutant is equal_share bit for bit, which is why the suites run
    keyless rows under every behaviour.
    """

    name = "equal-share-no-neutralise"
    description = (
        "equal_share without neutralising rows without keys before merging; killed at L3 on a case where "
        "equal_share itself is bit-exact (keyless rows under the finite or +inf kernel behaviour)"
    )
    source = "seeds/003"

    def plan_layout(self, case: Case) -> Layout:
        from ports.equal_share import grid_layout

        return grid_layout(case)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        from ports.equal_share import legacy_workspace_size

        return legacy_workspace_size(config)

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        import ports.equal_share.prefill as legacy

        def keep(rowless: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
            """The deleted step: the kernel's report stands."""

        with swapped([(legacy, "neutralise_empty_rows", keep)]):
            return legacy.prefill(self.plan_layout(case), case.workspace_size, inputs, kernels)


def _merge_swaps(merge: Callable[..., None]) -> list[tuple[Any, str, Any]]:
    return [(merge_module, "merge_partials", merge), (prefill_module, "merge_partials", merge)]


class SwappedLse(Mutant):
    name = "merge-lse-swapped"
    description = "merge with prefix and suffix swapped in the LSE but not in the output"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = merge_module.merge_partials

        def merge(prefix: Any, prefix_lse: Any, suffix: Any, suffix_lse: Any, *rest: Any, **kw: Any) -> None:
            real(prefix, suffix_lse, suffix, prefix_lse, *rest, **kw)

        return _merge_swaps(merge)


def merge_in_bf16(
    prefix: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix: torch.Tensor,
    suffix_lse: torch.Tensor,
    out: torch.Tensor,
    out_lse: torch.Tensor,
    tokens_with_context: int | None = None,
) -> None:
    """SPEC 1c's merge with the weighted sum done in bf16 instead of fp32."""
    n = out.shape[0] if tokens_with_context is None else tokens_with_context
    p_lse, s_lse = prefix_lse[:, :n], suffix_lse[:, :n]
    p_lse = torch.where(p_lse == float("inf"), float("-inf"), p_lse)
    s_lse = torch.where(s_lse == float("inf"), float("-inf"), s_lse)
    top = torch.maximum(p_lse, s_lse)
    empty = top == float("-inf")
    safe = torch.where(empty, 0.0, top)
    p_w, s_w = torch.exp(p_lse - safe), torch.exp(s_lse - safe)
    total = p_w + s_w
    weights_p = (p_w / total).T.unsqueeze(-1).to(torch.bfloat16)
    weights_s = (s_w / total).T.unsqueeze(-1).to(torch.bfloat16)
    merged = prefix[:n].to(torch.bfloat16) * weights_p + suffix[:n].to(torch.bfloat16) * weights_s
    merged = torch.where(empty.T.unsqueeze(-1), 0.0, merged.float())
    lse = torch.where(empty, float("-inf"), torch.log(total) + top)
    rest_out, rest_lse = suffix[n:].clone(), suffix_lse[:, n:].clone()
    out[:n] = merged.to(out.dtype)
    out_lse[:, :n] = lse
    out[n:] = rest_out
    out_lse[:, n:] = rest_lse


class MergeInBf16(Mutant):
    name = "merge-in-bf16"
    description = "computes the merge's weighted sum in bf16 instead of fp32"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return _merge_swaps(merge_in_bf16)


# -- issue 12: integer widths ------------------------------------------------------------------
#
# A port that stores a value in a narrower integer than the value can reach
# wraps it silently. Each of these mutants wraps one value exactly as a C/CUDA
# port (or a torch tensor of that dtype) would; the value reaches the width only
# on inputs past that width, so only such inputs can tell.


def wrap_signed(value: int, bits: int) -> int:
    """``value`` stored in a two's-complement integer of ``bits`` bits."""
    half = 1 << (bits - 1)
    return (value + half) % (1 << bits) - half


def wrap_unsigned(value: int, bits: int) -> int:
    """``value`` stored in an unsigned integer of ``bits`` bits."""
    return value % (1 << bits)


class TokenToSeqUint8(Mutant):
    name = "token-to-seq-uint8"
    aimed_at = "L1: a chunk holding more than 256 requests with context (token_to_seq reaches 256)"
    description = (
        "stores the chunk-local request index (token_to_seq) as uint8: wraps in a chunk of more than 256 requests"
    )
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return dataclasses.replace(chunk, token_to_seq=tuple(wrap_unsigned(v, 8) for v in chunk.token_to_seq))


class DcpTokenToSeqInt8(Mutant):
    name = "dcp-token-to-seq-int8"
    aimed_at = "L1: a DCP chunk holding more than 128 requests with context"
    description = "stores the DCP padded local token_to_seq as int8: wraps in a DCP chunk of more than 128 requests"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        if chunk.padded_local_token_to_seq is None:
            return chunk
        wrapped = tuple(wrap_signed(v, 8) for v in chunk.padded_local_token_to_seq)
        return dataclasses.replace(chunk, padded_local_token_to_seq=wrapped)


class DcpLocalStartsInt16(Mutant):
    name = "dcp-local-starts-int16"
    aimed_at = "L1: a DCP request whose later piece has a local start of 32768 or more (D=2: a start of 65536)"
    description = (
        "stores the DCP local starts (the gather's starts) as int16: wraps once a rank's start passes 32767 rows"
    )
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        if chunk.local_starts is None:
            return chunk
        wrapped = tuple(wrap_signed(v, 16) for v in chunk.local_starts)
        return dataclasses.replace(chunk, local_starts=wrapped, starts=wrapped)


class RequestIndexInt16(Mutant):
    name = "request-index-int16"
    aimed_at = "L1: a batch of more than 32768 requests with a chunk reaching past request 32767"
    description = "stores a chunk's batch request range as int16: wraps in a batch of more than 32768 requests"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return dataclasses.replace(
            chunk,
            request_start=wrap_signed(chunk.request_start, 16),
            request_end=wrap_signed(chunk.request_end, 16),
        )


class DeviceTokenToSeqUint8(Mutant):
    """The layout it reports is right (built from host ints); only the device
    copy the gather reads is narrowed, so no layout check can see it: only an
    L3 chunk of more than 256 requests with context."""

    name = "device-token-to-seq-uint8"
    aimed_at = "L3: a chunk holding more than 256 requests with context"
    description = (
        "packs the device copy of token_to_seq as uint8 (the reported layout stays right): in a chunk of more than "
        "256 requests the gather indexes the wrong request (past the chunk's block table: an IndexError on the CPU "
        "kernels, which is how ci kills it)"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = prefill_module.device_chunks

        def narrowed(layout: Layout, device: torch.device) -> tuple[prefill_module.DeviceChunk, ...]:
            planned = real(layout, device)
            return tuple(dataclasses.replace(p, token_to_seq=p.token_to_seq.remainder(256)) for p in planned)

        return [(prefill_module, "device_chunks", narrowed)]


class WorkspaceInt32(Mutant):
    name = "workspace-int32"
    aimed_at = "L1 workspace grid: max_model_len of 2^28 or more (8 x max_model_len past 2^31)"
    description = (
        "computes the workspace heuristic's 8 x max_model_len and 4 x max_num_seqs x block_size in int32: "
        "they wrap negative past 2^31"
    )
    source = "hand port"

    def workspace_size(self, config: WorkspaceConfig) -> int:
        unit = alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
        by_length = wrap_signed(8 * config.max_model_len, 32)
        by_seqs = wrap_signed(4 * wrap_signed(config.max_num_seqs * config.block_size, 32), 32)
        wanted = max(min(max(by_length, by_seqs), DENSE_WORKSPACE_CAP), unit)
        return -(-wanted // unit) * unit


# -- issue 12: arithmetic that holds only for powers of two ----------------------------------


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


# -- issue 12: merge numerics ------------------------------------------------------------------

# Faults the merge kernel below can carry (one per mutant).
MERGE_EXACT, MERGE_SKIP_ZERO_WEIGHT_SIDE, MERGE_DROP_BELOW_FP32_EPS = 0, 1, 2

# The LSE gap past which a side's weight exp(-gap) is below fp32's epsilon
# (2^-23): the cut-off a porter might take for "cannot change the sum". It is
# wrong in a band: 1 + exp(-gap) still rounds up to 1 + 2^-23 for gaps below
# 24 ln 2 (about 16.64), so the LSE and fp32 outputs there still see that side.
FP32_EPS_GAP = 23 * math.log(2)


@functools.cache
def _faulty_merge_program() -> Any:
    # per_request's merge kernel (ports/per_request/merge_kernel.py: the same
    # tiles, the same per-element order) with a fault switch; built on first use
    # so that the interpreter setting in force applies.
    @triton.jit  # type: ignore[untyped-decorator]
    def merge_partial_tiles(  # type: ignore[no-untyped-def]
        out_ptr,
        out_lse_ptr,
        p_ptr,
        p_lse_ptr,
        s_ptr,
        s_lse_ptr,
        tokens,
        heads,
        value_token_stride,
        value_head_stride,
        out_token_stride,
        out_head_stride,
        p_lse_head_stride,
        p_lse_token_stride,
        s_lse_head_stride,
        s_lse_token_stride,
        out_lse_head_stride,
        out_lse_token_stride,
        tokens_with_context,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_H: tl.constexpr,
        ROUND_ONCE: tl.constexpr,
        FAULT: tl.constexpr,
        CUTOFF_GAP: tl.constexpr,
    ):
        head_tiles = (heads + BLOCK_H - 1) // BLOCK_H
        head_tile = tl.program_id(0) % head_tiles
        token_tile = tl.program_id(0) // head_tiles
        token = (token_tile * BLOCK_T + tl.arange(0, BLOCK_T))[:, None]
        head = (head_tile * BLOCK_H + tl.arange(0, BLOCK_H))[None, :]
        inside = (token < tokens) & (head < heads)
        merging = inside & (token < tokens_with_context)
        copying = inside & (token >= tokens_with_context)

        s_lse = tl.load(s_lse_ptr + head * s_lse_head_stride + token * s_lse_token_stride, mask=inside, other=0.0)
        p_lse = tl.load(p_lse_ptr + head * p_lse_head_stride + token * p_lse_token_stride, mask=merging, other=0.0)
        p_lse = tl.where(p_lse == float("inf"), float("-inf"), p_lse)
        s_seen = tl.where(s_lse == float("inf"), float("-inf"), s_lse)
        top = tl.maximum(p_lse, s_seen)
        p_weight = tl.exp(p_lse - top)
        s_weight = tl.exp(s_seen - top)
        if FAULT == 2:
            p_weight = tl.where(top - p_lse > CUTOFF_GAP, 0.0, p_weight)
            s_weight = tl.where(top - s_seen > CUTOFF_GAP, 0.0, s_weight)
        total = p_weight + s_weight
        empty = top == float("-inf")
        p_scale = (p_weight / total)[:, :, None]
        s_scale = (s_weight / total)[:, :, None]
        merged_lse = tl.where(empty, float("-inf"), tl.log(total) + top)

        row_at = token[:, :, None] * value_token_stride + head[:, :, None] * value_head_stride
        out_row_at = token[:, :, None] * out_token_stride + head[:, :, None] * out_head_stride
        lane = tl.arange(0, BLOCK_D)[None, None, :]
        in_head = lane < HEAD_DIM
        merge_here = merging[:, :, None] & in_head
        s = tl.load(s_ptr + row_at + lane, mask=inside[:, :, None] & in_head, other=0.0)
        p = tl.load(p_ptr + row_at + lane, mask=merge_here, other=0.0)
        s_part = s * s_scale
        if ROUND_ONCE:
            merged = tl.fma(p, p_scale, s_part)
        else:
            merged = p * p_scale + s_part
        if FAULT == 1:
            p_part = p * p_scale
            merged = tl.where(
                p_weight[:, :, None] == 0.0, s_part, tl.where(s_weight[:, :, None] == 0.0, p_part, merged)
            )
        merged = tl.where(empty[:, :, None], 0.0, merged)
        tl.store(out_ptr + out_row_at + lane, merged, mask=merge_here)
        tl.store(out_ptr + out_row_at + lane, s, mask=copying[:, :, None] & in_head)

        out_lse_at = out_lse_ptr + head * out_lse_head_stride + token * out_lse_token_stride
        tl.store(out_lse_at, merged_lse, mask=merging)
        tl.store(out_lse_at, s_lse, mask=copying)

    return merge_partial_tiles


def faulty_merge(fault: int, lse_token_stride_one: bool = False) -> Callable[..., None]:
    """per_request's ``merge_partials`` running the kernel with ``fault``; with
    ``lse_token_stride_one`` its host code passes each LSE's head stride only, as
    though every LSE were a contiguous ``[heads, tokens]`` row per head."""

    def merge(
        prefix: torch.Tensor,
        prefix_lse: torch.Tensor,
        suffix: torch.Tensor,
        suffix_lse: torch.Tensor,
        out: torch.Tensor,
        out_lse: torch.Tensor,
        tokens_with_context: int | None = None,
    ) -> None:
        tokens, heads, dim = out.shape
        if tokens == 0:
            return
        assert prefix.stride()[:2] == suffix.stride()[:2], "prefix and suffix must share their strides"

        def token_stride(lse: torch.Tensor) -> int:
            return 1 if lse_token_stride_one else lse.stride(1)

        block_t, block_h, block_d = merge_module.tile_shape(heads, dim)
        _faulty_merge_program()[(triton.cdiv(tokens, block_t) * triton.cdiv(heads, block_h),)](
            out,
            out_lse,
            prefix,
            prefix_lse,
            suffix,
            suffix_lse,
            tokens,
            heads,
            prefix.stride(0),
            prefix.stride(1),
            out.stride(0),
            out.stride(1),
            prefix_lse.stride(0),
            token_stride(prefix_lse),
            suffix_lse.stride(0),
            token_stride(suffix_lse),
            out_lse.stride(0),
            token_stride(out_lse),
            tokens if tokens_with_context is None else tokens_with_context,
            HEAD_DIM=dim,
            BLOCK_D=block_d,
            BLOCK_T=block_t,
            BLOCK_H=block_h,
            ROUND_ONCE=merge_module.rounds_once(out.device),
            FAULT=fault,
            CUTOFF_GAP=FP32_EPS_GAP,
        )

    return merge


class MergeSkipsZeroWeightSide(Mutant):
    name = "merge-skip-zero-weight-side"
    aimed_at = (
        "L2: a side of weight exactly 0 (LSE -inf, or 104 or more below the other) with a positive output, "
        "the other side's output -0.0 (the reference's x*0 + -0.0 is +0.0)"
    )
    description = (
        "does not load a side whose merge weight is 0 (its LSE -inf or 104 below): the reference's x*0 + -0.0 "
        "is +0.0 where the kept side alone is -0.0 (and an inf or NaN there gives the reference NaN)"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return _merge_swaps(faulty_merge(MERGE_SKIP_ZERO_WEIGHT_SIDE))


class MergeDropsBelowFp32Eps(Mutant):
    name = "merge-drop-below-fp32-eps"
    aimed_at = (
        "L2: finite LSEs 15.95 to about 20 apart with fp32 outputs, or 15.95 to 16.6 apart with the larger LSE "
        "below 2 in magnitude (then the LSE shows it in any dtype)"
    )
    description = (
        "drops the weaker side once its LSE is 23 ln 2 (15.94) below the other's, where exp(-gap) < fp32 epsilon; "
        "1 + exp(-gap) still rounds up below a gap of 16.64, and fp32 outputs see that side up to about 20"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return _merge_swaps(faulty_merge(MERGE_DROP_BELOW_FP32_EPS))


class MergeLseTokenStrideOne(Mutant):
    name = "merge-lse-token-stride-one"
    aimed_at = "L2: a transposed LSE view (token stride not 1) with 2 or more heads and tokens"
    description = (
        "indexes each LSE as head * head_stride + token, ignoring its token stride: right for every slice the "
        "context loop takes, wrong on a transposed [tokens, heads] LSE view"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return _merge_swaps(faulty_merge(MERGE_EXACT, lse_token_stride_one=True))


class MergeTokensWithContextFalsy(Mutant):
    name = "merge-tokens-with-context-falsy"
    aimed_at = "L2: prefill_tokens_with_context = 0"
    description = "reads prefill_tokens_with_context with `or`: 0 (no token has context) merges every token, like None"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = merge_module.merge_partials

        def merge(
            prefix: torch.Tensor,
            prefix_lse: torch.Tensor,
            suffix: torch.Tensor,
            suffix_lse: torch.Tensor,
            out: torch.Tensor,
            out_lse: torch.Tensor,
            tokens_with_context: int | None = None,
        ) -> None:
            tokens = tokens_with_context or out.shape[0]
            real(prefix, prefix_lse, suffix, suffix_lse, out, out_lse, tokens)

        return _merge_swaps(merge)


# -- issue 12: requests in three and more pieces -----------------------------------------------


def context_partial_merging_previous_chunk(
    layout: Layout,
    workspace_rows: int,
    inputs: Any,
    kernels: Any,
    planned: tuple[prefill_module.DeviceChunk, ...] | None = None,
) -> prefill_module.Partial:
    """per_request's context loop, except that a continuation merges into the
    previous chunk's own partial of its request instead of the running partial.
    Right for a request in two pieces (the previous chunk's partial is then all
    the running partial holds for it); a third piece loses the first."""
    spec = inputs.spec
    if planned is None:
        planned = prefill_module.device_chunks(layout, inputs.q.device)
    workspace = torch.empty((workspace_rows, spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    running: prefill_module.Partial | None = None
    previous: tuple[Chunk, torch.Tensor, torch.Tensor] | None = None
    for item in planned:
        chunk = item.chunk
        out, lse = prefill_module.chunk_partial(item, inputs, kernels, workspace)
        if running is None:
            if layout.num_chunks == 1 and not layout.empty_token_slices:
                return out, lse
            running = (
                torch.empty((inputs.num_tokens, *out.shape[1:]), dtype=out.dtype, device=out.device),
                torch.empty((lse.shape[0], inputs.num_tokens), dtype=lse.dtype, device=lse.device),
            )
            for start, stop in layout.empty_token_slices:
                running[0][start:stop] = 0
                running[1][:, start:stop] = float("-inf")
        total_out, total_lse = running
        first_visit = chunk.token_start
        if chunk.is_continuation and previous is not None:
            first_visit = chunk.continuation_token_end
            merged = first_visit - chunk.token_start
            prev_chunk, prev_out, prev_lse = previous
            rows = slice(chunk.token_start - prev_chunk.token_start, first_visit - prev_chunk.token_start)
            span = slice(chunk.token_start, first_visit)
            merge_module.merge_partials(
                prev_out[rows],
                prev_lse[:, rows],
                out[:merged],
                lse[:, :merged],
                out=total_out[span],
                out_lse=total_lse[:, span],
            )
        done = first_visit - chunk.token_start
        total_out[first_visit : chunk.token_end] = out[done:]
        total_lse[:, first_visit : chunk.token_end] = lse[:, done:]
        previous = (chunk, out, lse)
    assert running is not None, "a layout with chunks produced no partial"
    return running


class ContinuationMergesPreviousChunk(Mutant):
    name = "continuation-merges-previous-chunk"
    aimed_at = "L3: a request split into three or more pieces"
    description = (
        "merges a continuation into the previous chunk's partial, not the running one: a request's third piece "
        "drops its first"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return [(prefill_module, "context_partial", context_partial_merging_previous_chunk)]


# -- the DCP step of a chunk (issue 16): the layout is right, the rows are not -----------------


def _rank_segments(chunk: Chunk) -> list[tuple[int, int, int, int]]:
    """(request k, rank, first row of the rank's segment in the all-gathered
    buffer, real rows) of every request and rank of a DCP chunk, in upstream's order."""
    assert chunk.padded_local_seq_lens is not None and chunk.local_starts is not None
    assert chunk.local_context_lens_allranks is not None and chunk.padded_local_cu_seq_lens is not None
    assert chunk.num_local_context_tokens is not None
    segments = []
    for k, held_by_rank in enumerate(chunk.local_context_lens_allranks):
        for rank, held in enumerate(held_by_rank):
            first = rank * chunk.num_local_context_tokens + chunk.padded_local_cu_seq_lens[k]
            real = dcp_module.rank_rows_in_chunk(held, chunk.local_starts[k], chunk.padded_local_seq_lens[k])
            segments.append((k, rank, first, real))
    return segments


class DcpReorderInContextOrder(Mutant):
    """The reorder puts each request's rows back in context order, interleaving
    the ranks' rows as the cache dealt them out. The rows are the right ones and
    the attention is the same function of them, but upstream attends them rank
    by rank: the keys are summed in another order, and the bits differ."""

    name = "dcp-reorder-context-order"
    aimed_at = "L3: a DCP chunk in which a request has rows on two or more ranks"
    description = (
        "reorders the all-gathered rows into context order (ranks interleaved) instead of upstream's "
        "request-then-rank order: the same keys summed in another order"
    )
    source = "hand port"

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        world, interleave = case.dcp_world_size, case.cp_kv_cache_interleave_size

        def context_ordered(chunk: Chunk, world_size: int) -> list[int]:
            assert chunk.local_starts is not None
            keyed = []
            for k, rank, first, real in _rank_segments(chunk):
                for j in range(real):
                    local = chunk.local_starts[k] + j
                    position = (local // interleave) * interleave * world + rank * interleave + local % interleave
                    keyed.append(((k, position), first + j))
            return [row for _, row in sorted(keyed)]

        layout = self.plan_layout(case)
        with swapped([(dcp_module, "kept_rows", context_ordered)]):
            return prefill_module.prefill(layout, case.workspace_size, inputs, kernels)


class DcpReorderKeepsPadding(Mutant):
    """The reorder keeps every rank's whole padded segment of a request, padding
    rows included, and the attention takes the first rows it is told of: a rank
    that holds fewer rows than the padded count pushes padding (NaN in the
    harness's caches) and the wrong rows into the chunk."""

    name = "dcp-reorder-keeps-padding"
    aimed_at = "L3: a DCP chunk where a rank holds fewer of a request's rows than the padded count"
    description = "keeps each rank's padded rows of a request in the reorder instead of dropping the padding"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def with_padding(chunk: Chunk, world_size: int) -> list[int]:
            assert chunk.padded_local_seq_lens is not None
            rows = [
                row
                for k, _, first, _ in _rank_segments(chunk)
                for row in range(first, first + chunk.padded_local_seq_lens[k])
            ]
            return rows[: chunk.num_context_tokens]

        return [(dcp_module, "kept_rows", with_padding)]


class DcpSegmentUncapped(Mutant):
    """A rank's rows of a request in a chunk are taken as all it holds past the
    local start, without the cap at the chunk's padded count: right whenever the
    chunk holds the rest of the request, wrong for a request continued in a
    later chunk, whose piece here then reaches into the next request's (or past
    the rank's) segment."""

    name = "dcp-segment-uncapped"
    aimed_at = "L3: a DCP request continued in a later chunk"
    description = (
        "counts a rank's rows of a request in a chunk as all it holds past the local start, without the cap at the "
        "padded count: a request continued in a later chunk takes other rows"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def uncapped(held: int, local_start: int, padded_len: int) -> int:
            return max(held - local_start, 0)

        real_kept_rows = dcp_module.kept_rows

        def kept_without_check(chunk: Chunk, world_size: int) -> list[int]:
            # The port's own count check would refuse the plan; this port has none.
            try:
                return real_kept_rows(chunk, world_size)
            except ValueError:
                rows = [r for _, _, first, real in _rank_segments(chunk) for r in range(first, first + real)]
                limit = world_size * (chunk.num_local_context_tokens or 0)
                return [min(r, limit - 1) for r in rows][: chunk.num_context_tokens]

        return [(dcp_module, "rank_rows_in_chunk", uncapped), (dcp_module, "kept_rows", kept_without_check)]


DENSE_MUTANTS: dict[str, type[Mutant]] = {
    m.name: m
    for m in (
        LegacyGrid,
        FiniteLseOnEmptyRows,
        EqualShareNoNeutralise,
        WorkspaceFloor,
        ContinuationOverWholeChunk,
        ContinuationFromLastRequest,
        UnalignedSplit,
        SplitTakesWholeRemainder,
        ZeroContextJoinsRun,
        DcpPaddingWithoutInterleave,
        SwappedLse,
        MergeInBf16,
        QueryStartNotRebased,
        # Issue 12: each aimed at an input class the suites must produce.
        TokenToSeqUint8,
        DcpTokenToSeqInt8,
        DcpLocalStartsInt16,
        RequestIndexInt16,
        DeviceTokenToSeqUint8,
        WorkspaceInt32,
        AlignmentMaxNotLcm,
        RoundDownByMask,
        DcpPaddedByShift,
        DcpRankLensByMask,
        WorkspaceRoundThenCap,
        MergeSkipsZeroWeightSide,
        MergeDropsBelowFp32Eps,
        MergeLseTokenStrideOne,
        MergeTokensWithContextFalsy,
        ContinuationMergesPreviousChunk,
        # Issue 16: the DCP step of a chunk, killed at L3 only.
        DcpReorderInContextOrder,
        DcpReorderKeepsPadding,
        DcpSegmentUncapped,
    )
}
