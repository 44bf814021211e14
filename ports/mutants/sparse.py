"""The sparse path's mutants (issue 28): per_request with one realistic bug in
its sparse workspace, route, mask shapes, mask builder or remap.

Each swaps one function of ``ports/per_request/sparse.py`` for the duration of
a call (:class:`~ports.mutants.catalogue.Mutant`); ``aimed_at`` names the input
class and the level that sees it.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.sparse_model import Shape, SparseWorkspaceConfig
from ports.mutants.catalogue import Mutant
from ports.per_request import sparse as sparse_module


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


SPARSE_MUTANTS: tuple[type[Mutant], ...] = (
    SparseWorkspaceFloor,
    RouteStrictTopk,
    MaskShapeWithoutReservedWord,
    RemapKeepsRangeEnd,
    RemapByRequestStart,
    BitsMostSignificantFirst,
)
