"""The shared kernels: the device work both sides run, on identical inputs.

The oracle's context loop and every port's call these same functions for the
paged gather, the up-projection (``kv_b_proj``) and attention, so when two sides'
bits differ the difference lies in their planning or merging, never here.

:class:`SharedKernels` is the interface; :class:`CpuKernels` fills it with plain
PyTorch (fp32 accumulation, one request at a time, so results depend only on
the inputs and the call's shapes). A GPU implementation can fill it later.
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


class CpuKernels:
    name = "cpu"

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
        if num_rows == 0:
            return
        block_size = kv_cache.shape[1]
        seq = token_to_seq[:num_rows].long()
        rows = torch.arange(num_rows, device=kv_cache.device)
        position = starts.long()[seq] + rows - cu_seq_lens.long()[seq]
        block = block_table.long()[seq, position // block_size]
        dst[:num_rows] = kv_cache[block, position % block_size]

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
    ) -> tuple[torch.Tensor, torch.Tensor]:
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


def new_token_attention(
    kernels: SharedKernels,
    q: torch.Tensor,
    new_kv_c: torch.Tensor,
    new_k_pe: torch.Tensor,
    kv_b_weight: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_heads: int,
    qk_nope_head_dim: int,
    v_head_dim: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The suffix partial: causal attention of the new tokens over themselves,
    with their keys and values up-projected from the new latent rows."""
    kv = kernels.kv_b_proj(kv_b_weight, new_kv_c).view(-1, num_heads, qk_nope_head_dim + v_head_dim)
    k_nope, v = torch.split(kv, [qk_nope_head_dim, v_head_dim], dim=-1)
    k = torch.cat([k_nope, new_k_pe.expand(-1, num_heads, -1)], dim=-1)
    return kernels.attention(q, k, v, query_start_loc, query_start_loc, True, scale)
