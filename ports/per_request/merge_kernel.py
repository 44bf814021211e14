"""The port's merge of two attention partials (SPEC section 1c), as a Triton kernel.

One source is meant for both devices: Triton's interpreter runs it on CPU
tensors (``TRITON_INTERPRET=1``, set by the harness before Triton is first used)
and the same source compiles for the GPU (on the H200 it is bit-exact with the
oracle's kernel on every L2 case of the gpu suite: reports/gpu/).

Per (token, head), for tokens below ``tokens_with_context``:

* an LSE of +inf (FA2's "nothing attended") counts as -inf;
* ``m = max(lp, ls)``, ``ep = exp(lp - m)``, ``es = exp(ls - m)``, ``total = ep + es``;
* ``out = p * (ep / total) + s * (es / total)`` in fp32, stored in the output dtype;
* ``lse = log(total) + m``;
* both sides -inf: ``out = 0``, ``lse = -inf``.

Tokens at or past ``tokens_with_context`` take the suffix partial as it is, LSE
included. The weights are formed before they touch the values; folding
``exp`` into the values would lose the stability the max subtraction buys.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl


@functools.cache
def _merge_program() -> Any:
    # Built on first use so that the interpreter setting in force then applies.
    @triton.jit
    def merge_partials(
        out_ptr,
        out_lse_ptr,
        p_ptr,
        p_lse_ptr,
        s_ptr,
        s_lse_ptr,
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
        BLOCK: tl.constexpr,
    ):
        token = tl.program_id(0)
        head = tl.program_id(1)
        lanes = tl.arange(0, BLOCK)
        in_head = lanes < HEAD_DIM
        value_at = token * value_token_stride + head * value_head_stride + lanes
        out_at = token * out_token_stride + head * out_head_stride + lanes
        s_lse = tl.load(s_lse_ptr + head * s_lse_head_stride + token * s_lse_token_stride)
        out_lse_at = out_lse_ptr + head * out_lse_head_stride + token * out_lse_token_stride
        if token >= tokens_with_context:
            tl.store(out_lse_at, s_lse)
            tl.store(out_ptr + out_at, tl.load(s_ptr + value_at, mask=in_head), mask=in_head)
            return
        p_lse = tl.load(p_lse_ptr + head * p_lse_head_stride + token * p_lse_token_stride)
        p_lse = float("-inf") if p_lse == float("inf") else p_lse
        s_lse = float("-inf") if s_lse == float("inf") else s_lse
        top = tl.maximum(p_lse, s_lse)
        p_weight = tl.exp(p_lse - top)
        s_weight = tl.exp(s_lse - top)
        total = p_weight + s_weight
        empty = top == float("-inf")
        tl.store(out_lse_at, tl.where(empty, float("-inf"), tl.log(total) + top))
        p = tl.load(p_ptr + value_at, mask=in_head)
        s = tl.load(s_ptr + value_at, mask=in_head)
        merged = p * (p_weight / total) + s * (s_weight / total)
        merged = tl.where(empty, 0.0, merged)
        tl.store(out_ptr + out_at, merged, mask=in_head)

    return merge_partials


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
    tokens]`` fp32) into ``out``/``out_lse``, which may alias ``prefix``.

    ``prefix`` and ``suffix`` must share their token and head strides; ``out`` may differ.
    """
    tokens, heads, dim = out.shape
    if tokens == 0:
        return
    assert prefix.stride()[:2] == suffix.stride()[:2], "prefix and suffix must share their strides"
    _merge_program()[(tokens, heads)](
        out,
        out_lse,
        prefix,
        prefix_lse,
        suffix,
        suffix_lse,
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
        BLOCK=triton.next_power_of_2(dim),
    )
