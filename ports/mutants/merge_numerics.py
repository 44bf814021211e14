"""Merge-numerics mutants: per_request's merge of two partials with one
numerical fault that shows only on inputs of a rare class.

The merge weighs the prefix's and suffix's outputs by their log-sum-exps. These
faults are invisible on ordinary inputs: skipping a side whose weight is
exactly 0 (its ``x*0 + -0.0`` is not ``-0.0``), dropping a side whose LSE lies
in the gap band where its weight is below fp32's epsilon yet still visible,
ignoring an LSE's token stride (only a transposed LSE view tells), and reading
``prefill_tokens_with_context`` with ``or`` (only 0, no token with context,
tells). The first three run per_request's merge kernel with a fault switch
(:func:`faulty_merge`). Each names its input class and the level that sees it
in ``aimed_at``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from harness.kernels.interpreter import streamline_interpreter
from ports.mutants.base import Mutant, merge_swaps
from ports.per_request import merge_kernel as merge_module

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
    # On CPU tensors Triton's interpreter runs it, without the work it discards.
    streamline_interpreter()

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
        MASKED_FILL: tl.constexpr,
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
        s = tl.load(s_ptr + row_at + lane, mask=inside[:, :, None] & in_head, other=MASKED_FILL)
        p = tl.load(p_ptr + row_at + lane, mask=merge_here, other=MASKED_FILL)
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

        block_t, block_h, block_d = merge_module.device_tile_shape(heads, dim, tokens, out.device)
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
            MASKED_FILL=merge_module.masked_fill(out.device),
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
        return merge_swaps(faulty_merge(MERGE_SKIP_ZERO_WEIGHT_SIDE))


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
        return merge_swaps(faulty_merge(MERGE_DROP_BELOW_FP32_EPS))


class MergeLseTokenStrideOne(Mutant):
    name = "merge-lse-token-stride-one"
    aimed_at = "L2: a transposed LSE view (token stride not 1) with 2 or more heads and tokens"
    description = (
        "indexes each LSE as head * head_stride + token, ignoring its token stride: right for every slice the "
        "context loop takes, wrong on a transposed [tokens, heads] LSE view"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return merge_swaps(faulty_merge(MERGE_EXACT, lse_token_stride_one=True))


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

        return merge_swaps(merge)
