"""The port's merge of two attention partials (SPEC section 1c), as a Triton kernel.

One source is meant for both devices: Triton's interpreter runs it on CPU
tensors (``TRITON_INTERPRET=1``, set by the harness before Triton is first used)
and the same source compiles for the GPU (on the H200 it is bit-exact with the
oracle's kernel on every L2 and L3 case of the gpu suite: reports/gpu/).

Per (token, head), for tokens below ``tokens_with_context``:

* an LSE of +inf (FA2's "nothing attended") counts as -inf;
* ``m = max(lp, ls)``, ``ep = exp(lp - m)``, ``es = exp(ls - m)``, ``total = ep + es``;
* ``out = p * (ep / total) + s * (es / total)`` in fp32, stored in the output dtype;
* ``lse = log(total) + m``;
* both sides -inf: ``out = 0``, ``lse = -inf``.

Tokens at or past ``tokens_with_context`` take the suffix partial as it is, LSE
included. The weights are formed before they touch the values; folding
``exp`` into the values would lose the stability the max subtraction buys.

Geometry: one program merges a tile of ``BLOCK_T`` tokens by ``BLOCK_H`` heads
(all of each head's lanes), so each program moves several kilobytes and the
kernel runs at the device's memory bandwidth; a program per (token, head)
moves a few hundred bytes and leaves most of it idle. The arithmetic of each
element is the per-element recipe above, whatever the tile: the tile only
decides which program computes an element, never how.
On CPU tensors (Triton's interpreter) a program costs a fixed Python overhead
per operation whatever its size, so there a tile is as large as
:data:`INTERPRETED_TILE_ELEMENTS` allows (capped at the tokens there are): the
same elements, the same recipe, a few programs instead of thousands.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl

from harness.kernels.interpreter import streamline_interpreter

# Elements (tokens x heads x padded lanes) one program merges: with four warps,
# 16 a thread; enough loads in flight per program to hold an H200 at 90-100% of
# its copy bandwidth on every benchmark shape (reports/gpu/).
TILE_ELEMENTS = 2048
# Elements one program merges in Triton's interpreter (CPU tensors), where each
# program's every operation pays Python's overhead: a 3,000-token, 16-head,
# 128-lane merge takes 17 s in 2,048-element tiles and 1 s in these.
INTERPRETED_TILE_ELEMENTS = 1 << 18
# At most this many heads a program.
MAX_TILE_HEADS = 16
# A head this wide or wider fills a program's row alone and the tile grows along
# tokens: measured faster for 576-lane heads (padded to 1024) than two heads of one token.
WIDE_HEAD_LANES = 512


@functools.cache
def _merge_program() -> Any:
    # Built on first use so that the interpreter setting in force then applies.
    # On CPU tensors Triton's interpreter runs it, without the work it discards.
    streamline_interpreter()

    @triton.jit
    def merge_partial_tiles(
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
    ):
        # Heads vary fastest across programs, so programs running side by side
        # stream neighbouring memory (a token's heads are contiguous). Plain
        # integer arithmetic, not tl.cdiv: a library @jit helper that Triton built
        # before the interpreter was switched on (torch imports Triton) cannot be
        # called from an interpreted kernel.
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
        # Lanes outside the mask are never stored; what they load is
        # masked_fill(device): 0.0 compiled, 1.0 in Triton's interpreter.
        s = tl.load(s_ptr + row_at + lane, mask=inside[:, :, None] & in_head, other=MASKED_FILL)
        p = tl.load(p_ptr + row_at + lane, mask=merge_here, other=MASKED_FILL)
        if ROUND_ONCE:
            merged = tl.fma(p, p_scale, s * s_scale)
        else:
            merged = p * p_scale + s * s_scale
        merged = tl.where(empty[:, :, None], 0.0, merged)
        tl.store(out_ptr + out_row_at + lane, merged, mask=merge_here)
        tl.store(out_ptr + out_row_at + lane, s, mask=copying[:, :, None] & in_head)

        # The LSE last: out_lse may alias p_lse, and the compiler may load an
        # LSE again where it needs it in another register layout; every such
        # load must come before the store that overwrites it.
        out_lse_at = out_lse_ptr + head * out_lse_head_stride + token * out_lse_token_stride
        tl.store(out_lse_at, merged_lse, mask=merging)
        tl.store(out_lse_at, s_lse, mask=copying)

    return merge_partial_tiles


def tile_shape(heads: int, head_dim: int, tokens: int | None = None) -> tuple[int, int, int]:
    """``(BLOCK_T, BLOCK_H, BLOCK_D)`` for ``heads`` heads of ``head_dim`` lanes:
    every lane of a head (padded to a power of two), as many heads as fit in
    :data:`TILE_ELEMENTS` (at most :data:`MAX_TILE_HEADS`, one for a head of
    :data:`WIDE_HEAD_LANES` or more), then tokens.

    ``tokens`` given: the interpreter's tile, :data:`INTERPRETED_TILE_ELEMENTS`
    with its tokens capped at ``tokens`` (padded to a power of two)."""
    elements = TILE_ELEMENTS if tokens is None else INTERPRETED_TILE_ELEMENTS
    block_d = triton.next_power_of_2(head_dim)
    fit = max(1, elements // block_d)
    block_h = 1 if block_d >= WIDE_HEAD_LANES else min(triton.next_power_of_2(heads), fit, MAX_TILE_HEADS)
    block_t = max(1, elements // (block_h * block_d))
    if tokens is not None:
        block_t = min(block_t, triton.next_power_of_2(max(tokens, 1)))
    return block_t, block_h, block_d


def device_tile_shape(heads: int, head_dim: int, tokens: int, device: torch.device) -> tuple[int, int, int]:
    """:func:`tile_shape` for tensors on ``device``: the interpreter's tile on
    CPU, the compiled kernel's on a GPU."""
    return tile_shape(heads, head_dim, tokens if device.type == "cpu" else None)


def masked_fill(device: torch.device) -> float:
    """What the kernel's masked-out value lanes load (never stored): 0.0 for the
    compiled kernel, and 1.0 in Triton's interpreter (CPU tensors), which
    converts a bfloat16 zero, as a subnormal, on a slow path for the whole tile
    wherever one appears (a 300-token, 576-lane merge: 2.7 s with 0.0, 1.4 s)."""
    return 1.0 if device.type == "cpu" else 0.0


def rounds_once(device: torch.device) -> bool:
    """Whether upstream's kernel rounds ``p * a + s * b`` once (as ``fma(p, a,
    s * b)``) on ``device``: compiled for a GPU with Triton's floating-point
    fusion on (its default), it does; the interpreter rounds each product and
    the sum. The port writes the form out instead of leaving it to the
    compiler, whose choice to fuse depends on the tile's register layout."""
    if device.type == "cpu":
        return False
    language: Any = getattr(getattr(triton, "knobs", None), "language", None)
    if hasattr(language, "fp_fusion_enabled"):  # Triton 3.9
        return bool(language.fp_fusion_enabled(None))
    if hasattr(language, "default_fp_fusion"):
        return bool(language.default_fp_fusion)
    return os.environ.get("TRITON_DEFAULT_FP_FUSION", "1") != "0"


def merge_partials(
    prefix: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix: torch.Tensor,
    suffix_lse: torch.Tensor,
    out: torch.Tensor,
    out_lse: torch.Tensor,
    tokens_with_context: int | None = None,
) -> None:
    """Merge ``prefix`` and ``suffix`` (``[tokens, heads, dim]``, LSE ``[heads,
    tokens]`` fp32) into ``out``/``out_lse``, which may alias ``prefix``/``prefix_lse``
    element for element (each program reads its tile before it writes it).

    ``prefix`` and ``suffix`` must share their token and head strides; ``out`` may differ.
    """
    tokens, heads, dim = out.shape
    if tokens == 0:
        return
    assert prefix.stride()[:2] == suffix.stride()[:2], "prefix and suffix must share their strides"
    block_t, block_h, block_d = device_tile_shape(heads, dim, tokens, out.device)
    tiles = triton.cdiv(tokens, block_t) * triton.cdiv(heads, block_h)
    _merge_program()[(tiles,)](
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
        prefix_lse.stride(1),
        suffix_lse.stride(0),
        suffix_lse.stride(1),
        out_lse.stride(0),
        out_lse.stride(1),
        tokens if tokens_with_context is None else tokens_with_context,
        HEAD_DIM=dim,
        BLOCK_D=block_d,
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        ROUND_ONCE=rounds_once(out.device),
        MASKED_FILL=masked_fill(out.device),
    )
