"""The shared kernels: the device work both sides run, on identical inputs.

The oracle's context loop and every port's call these same functions for the
paged gather, the up-projection (``kv_b_proj``) and attention, so when two sides'
bits differ the difference lies in their planning or merging, never here.

:class:`SharedKernels` is the interface; :class:`CpuKernels` fills it with plain
PyTorch (fp32 accumulation, one request at a time, so results depend only on
the inputs and the call's shapes); :class:`CudaKernels` fills it on the GPU
with FlashAttention-2's varlen operator and cuBLAS. ``--device`` picks one
(:func:`kernels_for`); both sides of a comparison always get the same object.
"""

from __future__ import annotations

from typing import Protocol

import torch


class SharedKernels(Protocol):
    def gather(
        self,
        kv_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        token_to_seq: torch.Tensor,
        starts: torch.Tensor,
        num_rows: int,
    ) -> None:
        """Fill ``dst[:num_rows]`` from the paged cache.

        Row ``i`` belongs to request ``s = token_to_seq[i]`` (chunk-local, indexing
        ``block_table`` and ``starts``) at context position
        ``p = starts[s] + i - cu_seq_lens[s]``, stored at
        ``kv_cache[block_table[s, p // block_size], p % block_size]``.
        """
        ...

    def kv_b_proj(self, weight: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """``latent @ weight.T``: ``[rows, kv_lora_rank]`` to ``[rows, heads * (nope + v)]``."""
        ...

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        max_q: int | None = None,
        max_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Varlen attention with LSE.

        ``q``: ``[tokens, heads, qk]``, ``k``: ``[rows, heads, qk]``, ``v``:
        ``[rows, heads, v_dim]``; sequence ``i`` is ``q[cu_q[i]:cu_q[i+1]]`` against
        ``k[cu_k[i]:cu_k[i+1]]``. Causal masking is bottom-right aligned (the last
        query sees every key). Returns the output ``[tokens, heads, v_dim]`` in
        ``q.dtype`` and the LSE ``[heads, tokens]`` in fp32; a query that sees no
        key gets output 0 and LSE -inf.
        """
        ...


def paged_gather(
    kv_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    starts: torch.Tensor,
    num_rows: int,
) -> None:
    """The gather of :meth:`SharedKernels.gather` in tensor indexing, on any device
    (no host synchronisation: every index is computed where the cache lives)."""
    if num_rows == 0:
        return
    block_size = kv_cache.shape[1]
    seq = token_to_seq[:num_rows].long()
    rows = torch.arange(num_rows, device=kv_cache.device)
    position = starts.long()[seq] + rows - cu_seq_lens.long()[seq]
    block = block_table.long()[seq, position // block_size]
    dst[:num_rows] = kv_cache[block, position % block_size]


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`SharedKernels.attention` one sequence at a time in fp32 einsum."""
    tokens, heads, _ = q.shape
    out = torch.zeros((tokens, heads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.full((heads, tokens), float("-inf"), dtype=torch.float32, device=q.device)
    q_bounds, k_bounds = cu_q.tolist(), cu_k.tolist()
    for i in range(len(q_bounds) - 1):
        q0, q1 = q_bounds[i], q_bounds[i + 1]
        k0, k1 = k_bounds[i], k_bounds[i + 1]
        if q1 == q0 or k1 == k0:
            continue
        scores = torch.einsum("thd,shd->hts", q[q0:q1].float(), k[k0:k1].float()) * scale
        if causal:
            # Bottom-right aligned: query t of n sees keys up to t + (m - n).
            offset = (k1 - k0) - (q1 - q0)
            visible = torch.ones((q1 - q0, k1 - k0), dtype=torch.bool, device=q.device).tril(offset)
            scores = scores.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(scores - row_lse.unsqueeze(-1)).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hts,shd->thd", weights, v[k0:k1].float()).to(q.dtype)
        lse[:, q0:q1] = row_lse
    return out, lse


class CpuKernels:
    """Plain PyTorch: fp32 accumulation, one request at a time."""

    name = "cpu"

    # One gather for both devices: it is indexing, exact wherever it runs.
    gather = staticmethod(paged_gather)

    def kv_b_proj(self, weight: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return (latent.float() @ weight.float().T).to(latent.dtype)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        max_q: int | None = None,
        max_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return reference_attention(q, k, v, cu_q, cu_k, causal, scale)


# FlashAttention-2 (PyTorch's own varlen operator) takes these; anything else
# goes to the reference attention on the same device.
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


class CudaKernels:
    """The GPU: tensor-indexing gather, cuBLAS projection in the cache's dtype,
    and FlashAttention-2 varlen (``aten::_flash_attention_forward``) with LSE.

    FlashAttention wants one head size for q, k and v: all three are zero-padded
    to ``round_up(max(qk, v), 8)`` (zeros add exact zeros to every dot product)
    and the output is cut back to ``v``'s width. Every input is made contiguous
    first, so two callers that hand over the same values in different strides get
    the same bits. A sequence with no keys gets output 0 and LSE -inf, as the
    protocol says (FlashAttention itself reports +inf there).
    """

    name = "cuda"

    # One gather for both devices: it is indexing, exact wherever it runs.
    gather = staticmethod(paged_gather)

    def kv_b_proj(self, weight: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return latent.contiguous() @ weight.T

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        max_q: int | None = None,
        max_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        width = -(-max(q.shape[-1], v.shape[-1]) // 8) * 8
        if q.dtype not in FLASH_DTYPES or width > FLASH_MAX_HEAD_DIM:
            return reference_attention(q, k, v, cu_q, cu_k, causal, scale)
        tokens, heads, v_dim = q.shape[0], q.shape[1], v.shape[-1]
        if tokens == 0 or k.shape[0] == 0:
            out = torch.zeros((tokens, heads, v_dim), dtype=q.dtype, device=q.device)
            return out, torch.full((heads, tokens), float("-inf"), dtype=torch.float32, device=q.device)
        if max_q is None or max_k is None:
            max_q, max_k = int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max())
        padded = [torch.nn.functional.pad(t.contiguous(), (0, width - t.shape[-1])) for t in (q, k, v)]
        cu_q32, cu_k32 = cu_q.to(torch.int32).contiguous(), cu_k.to(torch.int32).contiguous()
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            *padded, cu_q32, cu_k32, max_q, max_k, 0.0, causal, False, scale=scale
        )
        out, lse = out[..., :v_dim], unpadded_lse(lse, cu_q32, tokens)
        # Sequences without keys: the protocol's (0, -inf), not FlashAttention's +inf.
        key_lens = cu_k32[1:] - cu_k32[:-1]
        seq_of_token = torch.repeat_interleave(
            torch.arange(key_lens.shape[0], device=q.device), cu_q32[1:] - cu_q32[:-1], output_size=tokens
        )
        no_keys = key_lens[seq_of_token] == 0
        out = out.masked_fill(no_keys[:, None, None], 0.0)
        lse = lse.masked_fill(no_keys[None, :], float("-inf"))
        return out.contiguous(), lse.contiguous()


def unpadded_lse(lse: torch.Tensor, cu_q: torch.Tensor, tokens: int) -> torch.Tensor:
    """FlashAttention's LSE as ``[heads, tokens]`` fp32.

    Its varlen forward reports ``[heads, tokens]`` in recent builds and
    ``[batch, heads, max_q]`` (padded per sequence) in older ones.
    """
    if lse.dim() == 2:
        return lse.float()
    batch = lse.shape[0]
    lens = cu_q[1:] - cu_q[:-1]
    seq = torch.repeat_interleave(torch.arange(batch, device=lse.device), lens, output_size=tokens)
    position = torch.arange(tokens, device=lse.device) - cu_q.long()[seq]
    return lse[seq, :, position].transpose(0, 1).float()


def kernels_for(device: str) -> SharedKernels:
    """The shared kernels for ``"cpu"`` or ``"cuda"``."""
    if device == "cuda":
        return CudaKernels()
    if device == "cpu":
        return CpuKernels()
    raise ValueError(f"unknown device {device!r} (cpu or cuda)")
