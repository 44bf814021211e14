"""The shared masked-attention kernel of the sparse path (SPEC 1d).

Varlen attention with LSE in which query row ``t`` of sequence ``i`` sees only
the keys its top-k selection names. Upstream runs FlashAttention 4 with a mask
function, on Blackwell only; the harness supplies this reference with the same
meaning to both sides, as it does for dense attention.

A selection comes in either of the two forms upstream hands its kernel, and the
same selection gives the same bits in both (the kernel turns each into the same
``[q_len, k_len]`` boolean of visible keys before any arithmetic):

- :class:`RangeIndices`: per sequence ``[q_len, topk]`` integer indices local to
  the sequence's key range, ``-1`` padding (``_remap_topk_to_ranges``'s output:
  anything outside the range is -1). Any other index outside ``[0, k_len)``,
  or a row count other than the sequence's queries, is bad input
  (``ValueError``): upstream's mask builder would set bits past the row.
- :class:`PackedMask`: the bit-packed int32 mask ``[batch, padded_q, words]``,
  key ``j`` of row ``t`` is bit ``j % 32`` of word ``j // 32``; with
  ``key_starts`` (upstream's ``offset_dense_mask_mod``) key ``j`` of sequence
  ``i`` is read at position ``mask[i, 0, -1] + j`` (the reserved word of row 0
  holds the sequence's key start). A key past the mask's words is bad input.

Causal masking is bottom-right aligned, on top of the selection. A row that
sees no key is *keyless*; :func:`masked_reference_attention` reports which, and
the kernel sets apply their ``keyless_rows`` behaviour to exactly those rows.
Query rows are taken in blocks of :data:`QUERY_BLOCK` per sequence (bounded
memory at DeepSeek shapes); the blocks depend only on the lengths, so results
are deterministic and the same for either form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QUERY_BLOCK = 256
KEY_BITS = 32


@dataclass(frozen=True)
class RangeIndices:
    """Per sequence, ``[q_len, topk]`` indices local to its key range (-1 pads)."""

    per_sequence: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class PackedMask:
    """A bit-packed ``[batch, padded_q, words]`` int32 mask; with ``key_starts``
    the last word of row 0 of each sequence holds its key start."""

    mask: torch.Tensor
    key_starts: bool = False


Selection = RangeIndices | PackedMask


def check_selection(selection: Selection, sequences: int) -> None:
    """Raise ``ValueError`` unless ``selection`` has one entry per sequence."""
    if isinstance(selection, RangeIndices):
        count = len(selection.per_sequence)
    elif isinstance(selection, PackedMask):
        if selection.mask.dtype != torch.int32 or selection.mask.dim() != 3:
            raise ValueError(f"a packed mask is int32 [batch, rows, words], got {selection.mask.dtype} "
                             f"{list(selection.mask.shape)}")  # fmt: skip
        count = selection.mask.shape[0]
    else:
        raise ValueError(f"a selection is RangeIndices or PackedMask, got {type(selection).__name__}")
    if count != sequences:
        raise ValueError(f"the selection covers {count} sequences, the batch has {sequences}")


def selected_keys(selection: Selection, sequence: int, rows: slice, k_len: int, device: torch.device) -> torch.Tensor:
    """``[len(rows), k_len]`` bool: which keys query rows ``rows`` of ``sequence`` select."""
    if isinstance(selection, RangeIndices):
        indices = selection.per_sequence[sequence][rows].to(device=device, dtype=torch.long)
        if indices.shape[0] != rows.stop - rows.start:
            raise ValueError(f"sequence {sequence}'s indices have {indices.shape[0]} rows for queries {rows}")
        outside = (indices < -1) | (indices >= k_len)
        if bool(outside.any()):
            bad = int(indices[outside][0])
            raise ValueError(f"sequence {sequence} selects key {bad}, outside its {k_len} keys (and not -1)")
        # -1 goes to a spare column, dropped after.
        column = torch.where(indices >= 0, indices, k_len)
        chosen = torch.zeros((indices.shape[0], k_len + 1), dtype=torch.bool, device=device)
        chosen.scatter_(1, column, True)
        return chosen[:, :k_len]
    mask = selection.mask
    words = mask[sequence, rows].to(device=device, dtype=torch.long)
    if words.shape[0] != rows.stop - rows.start:
        raise ValueError(f"the mask has {mask.shape[1]} rows, query rows {rows} of sequence {sequence} past it")
    start = int(mask[sequence, 0, -1]) if selection.key_starts else 0
    position = start + torch.arange(k_len, device=device)
    if k_len and (start < 0 or int(position[-1]) // KEY_BITS >= mask.shape[2] - int(selection.key_starts)):
        raise ValueError(
            f"sequence {sequence}'s keys [{start}, {start + k_len}) lie past its mask's "
            f"{(mask.shape[2] - int(selection.key_starts)) * KEY_BITS} keys"
        )
    return ((words[:, position // KEY_BITS] >> (position % KEY_BITS)) & 1).bool()


def masked_reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    causal: bool,
    scale: float,
    selection: Selection,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output ``[tokens, heads, v_dim]`` in ``q.dtype``, LSE ``[heads, tokens]``
    fp32 and the keyless rows ``[tokens]`` bool; keyless rows hold (0, -inf)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    tokens, heads, _ = q.shape
    q_bounds, k_bounds = cu_q.tolist(), cu_k.tolist()
    check_selection(selection, len(q_bounds) - 1)
    out = torch.zeros((tokens, heads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.full((heads, tokens), float("-inf"), dtype=torch.float32, device=q.device)
    keyless = torch.ones(tokens, dtype=torch.bool, device=q.device)
    for i in range(len(q_bounds) - 1):
        q0, q1, k0, k1 = q_bounds[i], q_bounds[i + 1], k_bounds[i], k_bounds[i + 1]
        q_len, k_len = q1 - q0, k1 - k0
        if isinstance(selection, RangeIndices) and selection.per_sequence[i].shape[0] != q_len:
            raise ValueError(
                f"sequence {i}'s indices have {selection.per_sequence[i].shape[0]} rows for its {q_len} queries"
            )
        keys, values = k[k0:k1].float(), v[k0:k1].float()
        for first in range(0, q_len, QUERY_BLOCK):
            rows = slice(first, min(first + QUERY_BLOCK, q_len))
            visible = selected_keys(selection, i, rows, k_len, q.device)
            if causal:
                # Bottom-right aligned: query t of n sees keys up to t + (m - n).
                row = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
                visible &= torch.arange(k_len, device=q.device)[None, :] <= row + (k_len - q_len)
            if not k_len:
                continue
            scores = torch.einsum("thd,shd->hts", q[q0 + rows.start : q0 + rows.stop].float(), keys) * scale
            scores = scores.masked_fill(~visible[None], float("-inf"))
            row_lse = torch.logsumexp(scores, dim=-1)
            weights = torch.exp(scores - row_lse.unsqueeze(-1)).nan_to_num(0.0)
            out[q0 + rows.start : q0 + rows.stop] = torch.einsum("hts,shd->thd", weights, values).to(q.dtype)
            lse[:, q0 + rows.start : q0 + rows.stop] = row_lse
            keyless[q0 + rows.start : q0 + rows.stop] = ~visible.any(dim=1)
    return out, lse, keyless


def pack_selection(per_sequence: list[torch.Tensor], rows: int, words: int) -> torch.Tensor:
    """The harness's own packing of per-sequence indices into a ``[batch, rows,
    words]`` int32 mask (for tests of the two forms; no side uses it)."""
    mask = torch.zeros((len(per_sequence), rows, words), dtype=torch.int64)
    for i, indices in enumerate(per_sequence):
        for t, row in enumerate(indices.tolist()):
            for key in set(row):
                if key >= 0:
                    mask[i, t, key // KEY_BITS] |= 1 << (key % KEY_BITS)
    return torch.where(mask >= 1 << 31, mask - (1 << 32), mask).to(torch.int32)
