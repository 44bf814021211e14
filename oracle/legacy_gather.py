"""The shared gather as 0.27.1 calls it, for the legacy oracle's dense loop
(:mod:`oracle.legacy_prefill`) and its masked prefill (:mod:`oracle.sparse_legacy`)."""

from __future__ import annotations

from typing import Any

import torch

from oracle.numeric import _SharedGatherOps


class LegacyGatherOps(_SharedGatherOps):
    """The shared gather; 0.27.1 hands the row count as a 0-d tensor without
    DCP, and its DCP loop's gather the whole workspace."""

    def gather_and_maybe_dequant_cache(
        self,
        src_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        token_to_seq: torch.Tensor,
        num_tokens: Any,
        kv_cache_dtype: str,
        scale: torch.Tensor,
        seq_starts: torch.Tensor | None = None,
    ) -> None:
        super().gather_and_maybe_dequant_cache(
            src_cache, dst, block_table, cu_seq_lens, token_to_seq, int(num_tokens), kv_cache_dtype, scale, seq_starts
        )

    def cp_gather_cache(
        self,
        src_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        batch_size: int,
        seq_starts: torch.Tensor | None = None,
    ) -> None:
        """0.27.1's DCP loop hands its whole workspace as ``dst``; the gather
        writes the chunk's local rows, ``cu_seq_lens[batch_size]``, from its start."""
        rows = int(cu_seq_lens[batch_size])
        super().cp_gather_cache(src_cache, dst[:rows], block_table, cu_seq_lens, batch_size, seq_starts)
