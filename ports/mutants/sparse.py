"""The sparse path's mutants: per_request with one realistic bug in its sparse
workspace, route, mask shapes, mask builder or remap (seen at sparse-layout or
sparse-mask), or in its masked prefill loop (seen at sparse-prefill only: exact
at the other two).

Each swaps one function of ``ports/per_request/sparse.py`` or
``ports/per_request/sparse_prefill.py`` for the duration of a call
(:class:`~ports.mutants.base.Mutant`); ``aimed_at`` names the input class
and the level that sees it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from harness.kernels import SharedKernels
from harness.kernels.context_chunks import DeviceChunk, Partial
from harness.kernels.masked_attention import PackedMask, Selection, masked_reference_attention
from harness.kernels.numeric import PrefillInputs
from harness.model import Layout
from harness.model.sparse import Shape, SparseCase, SparseWorkspaceConfig
from ports.mutants.base import Mutant
from ports.per_request import sparse as sparse_module
from ports.per_request import sparse_prefill as loop_module
from ports.per_request.merge_kernel import merge_partials


class SparseWorkspaceFloor(Mutant):
    name = "sparse-workspace-floor"
    description = "floors the sparse workspace at max_num_seqs * block_size again (the regression seeds/004 undid)"
    source = "seeds/004"
    aimed_at = "sparse workspace configs where max_num_seqs * block_size passes the min (sparse-layout)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = sparse_module.sparse_workspace_size

        def size(config: SparseWorkspaceConfig) -> int:
            return max(real(config), config.max_num_seqs * config.block_size)

        return [(sparse_module, "sparse_workspace_size", size)]


class RouteStrictTopk(Mutant):
    name = "sparse-route-lt-topk"
    description = "takes dense MHA only when the longest sequence is shorter than index_topk (< for <=)"
    source = "hand port"
    aimed_at = "a batch whose longest sequence is exactly index_topk (sparse-layout)"
    conditions = (("sparse.use_dense_mha", "within_topk"), ("sparse.dense_route", "within_topk"))

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return [(sparse_module, "within_topk", lambda max_seq, topk: max_seq < topk)]


class MaskShapeWithoutReservedWord(Mutant):
    name = "sparse-mask-no-reserved-word"
    description = "sizes the global mask without its reserved key-starts word"
    source = "hand port"
    aimed_at = "any batch with context (its global mask shape, sparse-layout) and global masks (sparse-mask)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = sparse_module.topk_mask_shape

        def shape(batch: int, max_query_len: int, max_key_len: int, key_starts_word: bool = False) -> Shape:
            return real(batch, max_query_len, max_key_len)

        return [(sparse_module, "topk_mask_shape", shape)]


class RemapKeepsRangeEnd(Mutant):
    name = "sparse-remap-keeps-end"
    description = "remap keeps an index t == start + len (<= for <): one key past the range"
    source = "hand port"
    aimed_at = "an index on the row after a range (sparse-mask)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def remap(topk_per_request: list[torch.Tensor], starts: Any, lengths: Any) -> list[torch.Tensor]:
            out = []
            for topk, start, length in zip(topk_per_request, starts, lengths, strict=True):
                inside = (topk >= start) & (topk <= start + length)
                out.append(torch.where(inside, topk - start, torch.full_like(topk, -1)))
            return out

        return [(sparse_module, "remap_topk", remap)]


class RemapByRequestStart(Mutant):
    name = "sparse-remap-request-start"
    description = "remaps a continuation piece by its request's start (0), not the piece's own start"
    source = "hand port"
    aimed_at = "a key range starting mid-sequence (a continuation piece) with indices in it (sparse-mask)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = sparse_module.remap_topk

        def remap(topk_per_request: list[torch.Tensor], starts: Any, lengths: Any) -> list[torch.Tensor]:
            return real(topk_per_request, [0] * len(starts), lengths)

        return [(sparse_module, "remap_topk", remap)]


class BitsMostSignificantFirst(Mutant):
    name = "sparse-mask-msb-first"
    description = "packs key 32*w + b at bit 31 - b of its word (most significant first)"
    source = "hand port"
    aimed_at = "any selected key whose bit is not 15 or 16 of its word (sparse-mask)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = sparse_module.bit_weights
        return [(sparse_module, "bit_weights", lambda: real().flip(0))]


# -- the masked prefill loop (L3) -------------------------------------------------------------


class ChunkWithWholeQuery(Mutant):
    name = "sparse-l3-whole-query"
    description = "attends a chunk with the batch's queries from token 0, not the chunk's own token slice"
    source = "hand port"
    aimed_at = "a masked batch with a chunk whose tokens do not start at token 0 (sparse-prefill)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = loop_module.masked_chunk_partial

        def partial(
            planned: DeviceChunk, inputs: PrefillInputs, kernels: SharedKernels, workspace: Any, selection: Selection
        ) -> Partial:
            chunk = planned.chunk
            shifted = dataclasses.replace(chunk, token_start=0, token_end=chunk.token_end - chunk.token_start)
            return real(dataclasses.replace(planned, chunk=shifted), inputs, kernels, workspace, selection)

        return [(loop_module, "masked_chunk_partial", partial)]


class SuffixByQueryStart(Mutant):
    name = "sparse-l3-suffix-by-query-start"
    description = "takes the suffix's key ranges from the batch's query offsets, not the requests' context lengths"
    source = "hand port"
    aimed_at = (
        "a masked batch with context whose requests' context lengths differ from their query offsets (sparse-prefill)"
    )

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def ranges(case: SparseCase) -> tuple[tuple[int, ...], tuple[int, ...]]:
            offsets = tuple(sum(case.query_lens[:r]) for r in range(len(case.query_lens)))
            return offsets, case.query_lens

        return [(loop_module, "suffix_ranges", ranges)]


class GlobalMaskWithoutKeyStarts(Mutant):
    name = "sparse-l3-global-mask-no-key-starts"
    description = "reads the global mask from key 0 in every attention (no key starts: dense_mask_mod for offset_)"
    source = "hand port"
    aimed_at = "a masked batch with context whose global mask fits (sparse-prefill)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return [(loop_module, "with_key_starts", lambda mask, starts: PackedMask(mask, key_starts=False))]


class KeylessRowsAsZeroWeight(Mutant):
    name = "sparse-l3-keyless-zero-weight"
    description = (
        "folds a chunk row that selects no key of the chunk as zero weight (LSE -inf), not as the kernel reports it"
    )
    source = "hand port"
    aimed_at = "a masked batch under the finite keyless-row behaviour with a row keyless in a chunk (sparse-prefill)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = loop_module.masked_chunk_partial

        def partial(
            planned: DeviceChunk, inputs: PrefillInputs, kernels: SharedKernels, workspace: Any, selection: Selection
        ) -> Partial:
            out, lse = real(planned, inputs, kernels, workspace, selection)
            chunk, rows = planned.chunk, planned.chunk.num_context_tokens
            q = inputs.q[chunk.token_start : chunk.token_end, :1, :1]
            keys = workspace[:rows, None, :1]
            _, _, keyless = masked_reference_attention(
                q, keys, keys, planned.query_start_loc, planned.cu_seq_lens, False, 1.0, selection
            )
            return out.masked_fill(keyless[:, None, None], 0.0), lse.masked_fill(keyless[None, :], float("-inf"))

        return [(loop_module, "masked_chunk_partial", partial)]


class PiecesFoldedLastFirst(Mutant):
    name = "sparse-l3-fold-last-first"
    description = "folds the chunks last to first (a request's pieces merged in reverse order)"
    source = "hand port"
    aimed_at = "a masked batch with a request in three or more pieces (sparse-prefill)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def fold(layout: Layout, num_tokens: int, partials: Any) -> Partial:
            done = list(zip(layout.chunks, partials, strict=True))
            first_out, first_lse = done[0][1]
            total_out = torch.zeros((num_tokens, *first_out.shape[1:]), dtype=first_out.dtype)
            total_lse = torch.full((first_lse.shape[0], num_tokens), float("-inf"), dtype=first_lse.dtype)
            seen = torch.zeros(num_tokens, dtype=torch.bool)
            for chunk, (out, lse) in reversed(done):
                span = slice(chunk.token_start, chunk.token_end)
                fresh = ~seen[span]
                merged_out, merged_lse = torch.empty_like(out), torch.empty_like(lse)
                merge_partials(total_out[span], total_lse[:, span], out, lse, out=merged_out, out_lse=merged_lse)
                total_out[span] = torch.where(fresh[:, None, None], out, merged_out)
                total_lse[:, span] = torch.where(fresh[None, :], lse, merged_lse)
                seen[span] = True
            return total_out, total_lse

        return [(loop_module, "fold_partials", fold)]


class ChunkRangesFromFirstStart(Mutant):
    name = "sparse-l3-chunk-first-start"
    description = "remaps every request of a chunk by the chunk's first start (its continuation piece's), not its own"
    source = "hand port"
    aimed_at = "a per-range chunk holding a continuation piece and the requests after it (sparse-prefill)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        def ranges(chunk: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
            return (chunk.starts[0],) * len(chunk.starts), chunk.seq_lens

        return [(loop_module, "chunk_ranges", ranges)]


class DropsLastSlot(Mutant):
    name = "sparse-l3-drops-last-slot"
    description = "reads index_topk - 1 slots of each token's top-k row (the last one dropped)"
    source = "hand port"
    aimed_at = "a masked batch whose tokens fill their top-k rows to the last slot (sparse-prefill)"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = loop_module.topk_per_request

        def split(topk: torch.Tensor, query_lens: tuple[int, ...]) -> list[torch.Tensor]:
            kept = topk.clone()
            kept[:, -1] = -1
            return real(kept, query_lens)

        return [(loop_module, "topk_per_request", split)]


SPARSE_L3_MUTANTS: tuple[type[Mutant], ...] = (
    ChunkWithWholeQuery,
    SuffixByQueryStart,
    GlobalMaskWithoutKeyStarts,
    KeylessRowsAsZeroWeight,
    PiecesFoldedLastFirst,
    ChunkRangesFromFirstStart,
    DropsLastSlot,
)

SPARSE_MUTANTS: tuple[type[Mutant], ...] = (
    SparseWorkspaceFloor,
    RouteStrictTopk,
    MaskShapeWithoutReservedWord,
    RemapKeepsRangeEnd,
    RemapByRequestStart,
    BitsMostSignificantFirst,
    *SPARSE_L3_MUTANTS,
)
