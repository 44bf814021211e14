"""Exact comparison of the sparse path's results (levels sparse-layout and sparse-mask).

A sparse layout is compared field by field in :class:`SparseLayout`'s order:
the workspace size, the chunks (by :func:`harness.compare.dense.first_layout_divergence`,
so a chunk field is named as at L1), then the route's fields. The first
difference is a :class:`~harness.compare.dense.Divergence` with both values.

A mask is compared word for word as int32 bit patterns; the first differing
word is named by (request, query row, word), both words are shown as 32-bit
strings (bit 0, key ``32*word``, on the right), and the top-k indices of that
row that set a differing bit are listed. The remap is compared element by
element and names (request, query row, slot) with the index it came from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.compare.dense import Divergence, first_layout_divergence
from harness.model.sparse import ROUTES, SparseLayout
from harness.protocol.port import PortValueError, check_int, check_layout

if TYPE_CHECKING:
    import torch


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _check_shape(value: Any, where: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if type(value) is not tuple or len(value) != 3:
        raise PortValueError(f"{where}: {_type_name(value)} {value!r:.40}, not a (batch, rows, words) tuple of int")
    for i, item in enumerate(value):
        check_int(item, f"{where}[{i}]")


def _check_bool(value: Any, where: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if type(value) is not bool:
        raise PortValueError(f"{where}: {_type_name(value)} {value!s:.40}, not bool")


def check_sparse_layout(value: Any, where: str = "plan_sparse", built: frozenset[str] = frozenset()) -> SparseLayout:
    """``value`` as a side's ``plan_sparse`` returned it, checked field by field
    with no coercion (the rule of :mod:`harness.protocol.port`; ``built`` as
    :func:`~harness.protocol.port.check_layout`'s)."""
    if type(value) is not SparseLayout:
        raise PortValueError(f"{where} returned {_type_name(value)}, not a SparseLayout")
    check_int(value.workspace_size, f"{where}: workspace_size")
    check_layout(value.layout, built)
    check_int(value.prefill_max_query_len, f"{where}: prefill_max_query_len")
    check_int(value.prefill_max_seq_len, f"{where}: prefill_max_seq_len")
    for name in ("use_dense_mha", "masked_threshold", "use_masked_mha"):
        _check_bool(getattr(value, name), f"{where}: {name}")
    _check_bool(value.masks_fit, f"{where}: masks_fit", optional=True)
    _check_bool(value.global_mask_fits, f"{where}: global_mask_fits", optional=True)
    if type(value.route) is not str or value.route not in ROUTES:
        raise PortValueError(f"{where}: route {value.route!r:.40} is not one of {', '.join(ROUTES)}")
    _check_shape(value.global_mask_shape, f"{where}: global_mask_shape", optional=True)
    _check_shape(value.suffix_mask_shape, f"{where}: suffix_mask_shape")
    if type(value.chunk_mask_shapes) is not tuple:
        raise PortValueError(f"{where}: chunk_mask_shapes: {_type_name(value.chunk_mask_shapes)}, not a tuple")
    for i, shape in enumerate(value.chunk_mask_shapes):
        _check_shape(shape, f"{where}: chunk_mask_shapes[{i}]")
    return value


def first_sparse_divergence(oracle: SparseLayout, port: SparseLayout) -> Divergence | None:
    """The first field (in :class:`SparseLayout` order) on which the sides differ."""
    if oracle.workspace_size != port.workspace_size:
        return Divergence("workspace_size", oracle.workspace_size, port.workspace_size)
    found = first_layout_divergence(oracle.layout, port.layout)
    if found is not None:
        return found
    for name in SparseLayout.ROUTE_FIELDS:
        a, b = getattr(oracle, name), getattr(port, name)
        if a != b or type(a) is not type(b):
            if name == "chunk_mask_shapes":
                for i, (x, y) in enumerate(zip(a, b, strict=False)):
                    if x != y:
                        return Divergence("mask_shape", x, y, chunk=i)
            return Divergence(name, a, b)
    return None


def route_reasons(layout: SparseLayout) -> str:
    """The values that decided ``layout``'s route, as one line."""
    return (
        f"route {layout.route}: prefill_max_seq_len {layout.prefill_max_seq_len}, "
        f"prefill_max_query_len {layout.prefill_max_query_len}, use_dense_mha {layout.use_dense_mha}, "
        f"masked_threshold {layout.masked_threshold}, masks_fit {layout.masks_fit}, "
        f"use_masked_mha {layout.use_masked_mha}, global mask {layout.global_mask_shape} "
        f"fits {layout.global_mask_fits}"
    )


def bits(word: int) -> str:
    """``word`` as 32 bits, bit 31 first (key ``32*w + 31`` on the left)."""
    return format(word & 0xFFFFFFFF, "032b")


def setting_indices(topk_row: list[int], word: int, differing: int) -> list[int]:
    """The indices of one query row that set a bit of ``differing`` in ``word``."""
    return sorted({t for t in topk_row if t >= 0 and t >> 5 == word and (differing >> (t & 31)) & 1})


def first_mask_divergence(
    oracle: torch.Tensor, port: torch.Tensor, topk: list[torch.Tensor], reserved_word: bool
) -> Divergence | None:
    """The first differing mask word, named with its location, both words as
    bit strings and the indices that set the differing bits."""
    import torch

    if tuple(port.shape) != tuple(oracle.shape):
        return Divergence("mask shape", tuple(oracle.shape), tuple(port.shape))
    if port.dtype != torch.int32:
        raise PortValueError(f"mask: dtype {port.dtype}, not torch.int32")
    differ = (oracle != port).nonzero()
    if differ.numel() == 0:
        return None
    request, row, word = (int(v) for v in differ[0])
    a, b = int(oracle[request, row, word]), int(port[request, row, word])
    count = differ.shape[0]
    words = oracle.shape[2]
    if reserved_word and word == words - 1:
        where = f"mask[request {request}, query row {row}, word {word}] (the key-starts word)"
    else:
        row_indices = topk[request][row].tolist() if request < len(topk) and row < topk[request].shape[0] else []
        setters = setting_indices(row_indices, word, a ^ b)
        shown = f"{setters[:8]}{' ...' if len(setters) > 8 else ''}"
        where = f"mask[request {request}, query row {row}, word {word}] (keys {32 * word}..{32 * word + 31}; "
        where += f"indices setting the differing bits: {shown}; {count} words differ)"
    return Divergence(where, bits(a), bits(b))


def first_remap_divergence(
    oracle: list[torch.Tensor], port: list[torch.Tensor], topk: list[torch.Tensor], starts: tuple[int, ...]
) -> Divergence | None:
    if len(port) != len(oracle):
        return Divergence("remapped requests", len(oracle), len(port))
    for request, (a, b) in enumerate(zip(oracle, port, strict=True)):
        if tuple(b.shape) != tuple(a.shape):
            return Divergence(f"remapped[{request}] shape", tuple(a.shape), tuple(b.shape))
        if b.dtype != a.dtype:
            raise PortValueError(f"remapped[{request}]: dtype {b.dtype}, not {a.dtype}")
        differ = (a != b).nonzero()
        if differ.numel():
            row, slot = (int(v) for v in differ[0])
            index = int(topk[request][row, slot]) if request < len(topk) else None
            where = (
                f"remapped[request {request}, query row {row}, slot {slot}] "
                f"(index {index}, range start {starts[request]})"
            )
            return Divergence(where, int(a[row, slot]), int(b[row, slot]))
    return None
