"""The mutants, one realistic bug each (see ``ports/mutants/__init__.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.model import Case, Chunk, Layout, WorkspaceConfig, alignment_unit
from ports.per_request import PerRequestPort, dense_workspace_size
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


MUTANTS: dict[str, type[Mutant]] = {
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
    )
}
