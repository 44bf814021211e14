"""The sparse (top-k) MLA path of upstream b38e111d3e, written from SPEC section 1d.

What the sparse backend decides before attention runs: the workspace it plans
chunks into, the route of a batch's prefill tokens, the shapes of the top-k
masks, and the two mask operations themselves (the bit-packed mask builder and
the per-range remap). Nothing here imports vLLM.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, NamedTuple

from harness.model import Layout, alignment_unit
from harness.model.sparse import PINNED_MASK_WORKSPACE_WORDS, Shape, SparseCase, SparseLayout, SparseWorkspaceConfig
from ports.per_request.metadata import build_layout

if TYPE_CHECKING:
    import torch

    from harness.model.sparse import TopkMaskCase

DENSE_WORKSPACE_CAP = 65536
KEY_BITS = 32  # keys per mask word; key k is bit (k % 32), least significant first
# Key flags pack_topk holds at once (rows times keys): its memory bound, and few
# enough blocks that a mask on the GPU is packed in a handful of launches.
FLAGS_PER_BLOCK = 1 << 24

# When masked MHA pays off (SPEC 1d), as data: the sequence-length ceilings,
# ascending (a batch whose longest sequence passes the last never takes masked
# MHA), and one row per backend, tensor-parallel size and ceiling that allows
# it, holding the least longest-query that takes it. A ceiling a (backend, TP)
# pair has no row for never takes masked MHA for that pair.
SEQ_LEN_BUCKETS: tuple[int, ...] = (2048, 4096, 8192, 16384, 32768)


class MaskedMhaRow(NamedTuple):
    backend: str
    tensor_parallel_size: int
    longest_seq_len: int  # a ceiling of SEQ_LEN_BUCKETS
    least_query_len: int


MASKED_MHA_MIN_QUERY: tuple[MaskedMhaRow, ...] = (
    MaskedMhaRow("FLASHMLA_SPARSE", 1, 2048, 1536),
    MaskedMhaRow("FLASHMLA_SPARSE", 1, 4096, 4096),
    MaskedMhaRow("FLASHMLA_SPARSE", 2, 2048, 512),
    MaskedMhaRow("FLASHMLA_SPARSE", 2, 4096, 1024),
    MaskedMhaRow("FLASHMLA_SPARSE", 2, 8192, 4096),
    MaskedMhaRow("FLASHMLA_SPARSE", 4, 2048, 512),
    MaskedMhaRow("FLASHMLA_SPARSE", 4, 4096, 1024),
    MaskedMhaRow("FLASHMLA_SPARSE", 4, 8192, 1536),
    MaskedMhaRow("FLASHMLA_SPARSE", 4, 16384, 8192),
    MaskedMhaRow("FLASHMLA_SPARSE", 8, 2048, 512),
    MaskedMhaRow("FLASHMLA_SPARSE", 8, 4096, 512),
    MaskedMhaRow("FLASHMLA_SPARSE", 8, 8192, 1024),
    MaskedMhaRow("FLASHMLA_SPARSE", 8, 16384, 2048),
    MaskedMhaRow("FLASHMLA_SPARSE", 8, 32768, 16384),
    MaskedMhaRow("FLASHINFER_MLA_SPARSE", 8, 2048, 512),
    MaskedMhaRow("FLASHINFER_MLA_SPARSE", 8, 4096, 1024),
    MaskedMhaRow("FLASHINFER_MLA_SPARSE", 8, 8192, 1024),
    MaskedMhaRow("FLASHINFER_MLA_SPARSE", 8, 16384, 2048),
    MaskedMhaRow("FLASHINFER_MLA_SPARSE", 8, 32768, 32768),
)


def least_query_for(backend: str, tensor_parallel_size: int, ceiling: int) -> int | None:
    """The least longest-query of the row for this pair and ceiling; None: no row."""
    return next(
        (
            row.least_query_len
            for row in MASKED_MHA_MIN_QUERY
            if (row.backend, row.tensor_parallel_size, row.longest_seq_len) == (backend, tensor_parallel_size, ceiling)
        ),
        None,
    )


def sparse_workspace_size(config: SparseWorkspaceConfig) -> int:
    """``min(max(8*len, 4*seqs*block), 65536, seqs*topk)``, at least one block,
    and under DCP rounded up to ``lcm(block, D*I)`` (the dense path's alignment).
    No ``max_num_seqs * block_size`` floor (seeds/004)."""
    wanted = min(
        max(8 * config.max_model_len, 4 * config.max_num_seqs * config.block_size),
        DENSE_WORKSPACE_CAP,
        config.max_num_seqs * config.index_topk,
    )
    wanted = max(wanted, config.block_size)
    if config.dcp_world_size > 1:
        unit = alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
        wanted = max(-(-wanted // unit) * unit, unit)
    return wanted


def topk_mask_shape(batch: int, max_query_len: int, max_key_len: int, key_starts_word: bool = False) -> Shape:
    """``(batch, query rows padded to the tile, words)``: the tile is 128 rows up
    to 128 queries and 256 past it; a word holds 32 keys; the global mask keeps
    one extra word per row for the key start."""
    tile = 128 if max_query_len <= 128 else 256
    rows = -(-max_query_len // tile) * tile
    words = -(-max_key_len // KEY_BITS) + (1 if key_starts_word else 0)
    return batch, rows, words


def masked_threshold(backend: str, tensor_parallel_size: int, query_len: int, seq_len: int) -> bool:
    """Whether the batch is long enough for masked MHA on this backend and TP size.

    Invariants: the ceiling that governs a batch is the lowest of
    :data:`SEQ_LEN_BUCKETS` at or above its longest sequence ``seq_len`` (found
    by a lower-bound search over the sorted ceilings, so a sequence exactly at a
    ceiling is under it), the same for every backend and TP size. The answer is
    yes exactly when :data:`MASKED_MHA_MIN_QUERY` has a row for (``backend``,
    ``tensor_parallel_size``, that ceiling) and the longest query ``query_len``
    is at least the row's ``least_query_len``. Hence no: for a pair without
    rows, for a batch past the last ceiling, and for a governing ceiling the
    pair has no row for (a higher ceiling's row never stands in for it).
    """
    governing = bisect.bisect_left(SEQ_LEN_BUCKETS, seq_len)
    if governing == len(SEQ_LEN_BUCKETS):
        return False
    least = least_query_for(backend, tensor_parallel_size, SEQ_LEN_BUCKETS[governing])
    return least is not None and query_len >= least


def mask_workspace(case: SparseCase) -> int:
    """Words of the mask workspace: none without the masked kernel, else the
    case's, or the 128 MiB upstream allocates when the case leaves it open."""
    if not case.masked_kernel:
        return 0
    return PINNED_MASK_WORKSPACE_WORDS if case.mask_workspace_words is None else case.mask_workspace_words


def within_topk(max_seq_len: int, index_topk: int) -> bool:
    """Whether every key of the longest sequence can be selected: the batch is
    short enough for dense MHA (``<=``: a sequence of exactly ``index_topk`` keys
    selects them all)."""
    return max_seq_len <= index_topk


def bit_weights() -> torch.Tensor:
    """Each key's bit within its word, key ``32*w + b`` at bit ``b`` (least
    significant first), as int64 weights."""
    import torch

    return torch.bitwise_left_shift(torch.ones(KEY_BITS, dtype=torch.int64), torch.arange(KEY_BITS))


def _words(shape: Shape) -> int:
    return math.prod(shape)


def plan_sparse(case: SparseCase) -> SparseLayout:
    """The whole sparse plan of ``case`` (see :class:`SparseLayout` for each field)."""
    workspace = sparse_workspace_size(case.workspace_config)
    layout = build_layout(case.planned_case(workspace)) if any(case.context_lens) else Layout(chunks=())
    return route_sparse(case, workspace, layout)


# -- the route, one decision a function (SPEC 1d) ------------------------------------------


def dense_mha_flag(case: SparseCase) -> bool:
    """The builder's flag: every key of the longest sequence can be selected, and MQA is not forced."""
    return within_topk(case.max_seq_len, case.index_topk) and not case.force_mqa


def masks_fit(case: SparseCase, layout: Layout, mask_words: int) -> bool:
    """Whether the suffix mask and every chunk's mask fit the mask workspace: the
    largest is the whole batch's rows over the longest of the suffix's keys and
    the longest chunk's. No masked kernel: no workspace, no fit."""
    if not case.masked_kernel:
        return False
    longest_chunk = max((chunk.max_seq_len for chunk in layout.chunks), default=0)
    keys = max(case.max_query_len, longest_chunk)
    return _words(topk_mask_shape(len(case.query_lens), case.max_query_len, keys)) <= mask_words


def masked_mha_flag(case: SparseCase, threshold: bool, fits: bool) -> bool:
    """Masked MHA is wanted: the kernel exists, no DCP, the threshold says so and the masks fit."""
    return case.masked_kernel and case.dcp_world_size <= 1 and threshold and fits


def takes_mha(case: SparseCase, use_dense: bool, use_masked: bool) -> bool:
    """The prefill tokens go an MHA way at all (else sparse MQA)."""
    return (use_dense or use_masked) and not case.force_mqa


def prefers_dense(case: SparseCase) -> bool:
    """Within MHA, the dense kind: forced, or every key selectable and masked not forced."""
    return case.force_dense_mha or (within_topk(case.max_seq_len, case.index_topk) and not case.force_masked_mha)


def context_loop_refused(case: SparseCase) -> bool:
    """The context loop, which has no DCP form, is asked to run under DCP."""
    return any(case.context_lens) and case.dcp_world_size > 1


def global_mask_shape(case: SparseCase) -> Shape | None:
    """The global mask over whole sequences, with its reserved word: only a batch with context has one."""
    if not any(case.context_lens):
        return None
    return topk_mask_shape(len(case.query_lens), case.max_query_len, case.max_seq_len, key_starts_word=True)


def reads_global_mask(global_shape: Shape | None, global_fits: bool | None) -> bool:
    """The suffix and the chunks read the global mask: the batch has one, and it fits."""
    return global_shape is not None and bool(global_fits)


def global_mask_fits(shape: Shape, mask_words: int) -> bool:
    """The global mask fits the workspace: it may fill it exactly."""
    return _words(shape) <= mask_words


def suffix_mask_overflows(suffix_shape: Shape, mask_words: int) -> bool:
    """The suffix's mask (the global one where the batch reads it) does not fit the workspace."""
    return _words(suffix_shape) > mask_words


def chunk_masks_overflow(chunk_shapes: tuple[Shape, ...], mask_words: int) -> bool:
    """Some chunk's mask does not fit the workspace."""
    return any(_words(shape) > mask_words for shape in chunk_shapes)


def masked_outcome(case: SparseCase, suffix_shape: Shape, chunk_shapes: tuple[Shape, ...], mask_words: int) -> str:
    """How the masked kind of MHA ends, by the first check that fails in the
    order a masked run meets them: the kernel, the suffix's mask, the context
    loop (it has no DCP form), then each chunk's mask."""
    if not case.masked_kernel:
        return "masked-mha-unavailable"
    if suffix_mask_overflows(suffix_shape, mask_words):
        return "masked-mha-overflow"
    if context_loop_refused(case):
        return "masked-mha-unavailable"
    if chunk_masks_overflow(chunk_shapes, mask_words):
        return "masked-mha-overflow"
    return "masked-mha"


def route_sparse(case: SparseCase, workspace: int, layout: Layout) -> SparseLayout:
    """The route and mask shapes of ``case`` once its chunks are planned."""
    batch = len(case.query_lens)
    max_query, max_seq = case.max_query_len, case.max_seq_len
    mask_words = mask_workspace(case)
    use_dense = dense_mha_flag(case)
    threshold = masked_threshold(case.backend, case.tensor_parallel_size, max_query, max_seq)
    fits = masks_fit(case, layout, mask_words)
    use_masked = masked_mha_flag(case, threshold, fits)
    global_shape = global_mask_shape(case)
    global_fits = None if global_shape is None else global_mask_fits(global_shape, mask_words)
    if global_shape is not None and reads_global_mask(global_shape, global_fits):
        suffix_shape = global_shape
        chunk_shapes = tuple(
            (chunk.request_end - chunk.request_start, global_shape[1], global_shape[2]) for chunk in layout.chunks
        )
    else:
        suffix_shape = topk_mask_shape(batch, max_query, max_query)
        chunk_shapes = tuple(
            topk_mask_shape(chunk.request_end - chunk.request_start, chunk.max_query_len, chunk.max_seq_len)
            for chunk in layout.chunks
        )
    route = "mqa"
    if takes_mha(case, use_dense, use_masked):
        if prefers_dense(case):
            route = "dense-mha"
        else:
            route = masked_outcome(case, suffix_shape, chunk_shapes, mask_words)
    return SparseLayout(
        workspace_size=workspace,
        layout=layout,
        prefill_max_query_len=max_query,
        prefill_max_seq_len=max_seq,
        use_dense_mha=use_dense,
        masked_threshold=threshold,
        masks_fit=fits,
        use_masked_mha=use_masked,
        route=route,
        global_mask_shape=global_shape,
        global_mask_fits=global_fits,
        suffix_mask_shape=suffix_shape,
        chunk_mask_shapes=chunk_shapes,
    )


# -- the mask operations (L2) ------------------------------------------------------------


def pack_topk(topk_per_request: list[torch.Tensor], out: torch.Tensor) -> None:
    """Set bit ``t % 32`` of word ``t // 32`` of ``out[r, q]`` for every index
    ``t >= 0`` of query row ``q`` of request ``r``; every word of the key range
    ``[0, out.shape[2])`` of every row is written (rows past a request's queries
    stay zero)."""
    import torch

    out.zero_()
    keys = out.shape[2] * KEY_BITS
    # Packed where the mask lives (a mask on the GPU is built there), every
    # request's rows at once: one check, a few launches.
    device = out.device
    weights = bit_weights().to(device)
    if not topk_per_request:
        return
    every = torch.cat([topk.to(device) for topk in topk_per_request])
    if every.numel() and int(every.max()) >= keys:
        request = next(r for r, t in enumerate(topk_per_request) if t.numel() and int(t.max()) >= keys)
        largest = int(topk_per_request[request].max())
        raise ValueError(f"request {request} selects key {largest}, past the mask's {keys} keys")
    lengths = torch.tensor([topk.shape[0] for topk in topk_per_request]).to(device)
    request_of = torch.repeat_interleave(
        torch.arange(len(topk_per_request), device=device), lengths, output_size=every.shape[0]
    )
    row_of = torch.arange(every.shape[0], device=device) - (torch.cumsum(lengths, 0) - lengths)[request_of]
    # A block of rows at a time: one flag per key of each row is held at once.
    rows_per_block = max(1, FLAGS_PER_BLOCK // (keys + 1))
    for first in range(0, every.shape[0], rows_per_block):
        block = every[first : first + rows_per_block]
        rows = block.shape[0]
        # One flag per key (duplicates set the same flag); -1 goes to a spare
        # column past the last key, which is dropped.
        column = torch.where(block >= 0, block.long(), keys)
        selected = torch.zeros((rows, keys + 1), dtype=torch.bool, device=device)
        selected.scatter_(1, column, True)
        flags = selected[:, :keys].reshape(rows, out.shape[2], KEY_BITS).long()
        words = (flags * weights).sum(dim=2)
        # The top bit of a word is the int32 sign bit.
        span = slice(first, first + rows)
        out[request_of[span], row_of[span]] = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def build_topk_mask(case: TopkMaskCase, topk_per_request: list[torch.Tensor]) -> torch.Tensor:
    """The mask of ``case`` in its form: one or several requests over keys
    ``[0, max(seq_lens))``, or the global mask with row 0's reserved word
    holding each request's key start."""
    import torch

    query_lens = [t.shape[0] for t in topk_per_request]
    max_keys = max(case.seq_lens)
    reserve = case.form == "global"
    shape = topk_mask_shape(len(query_lens), max(query_lens), max_keys, key_starts_word=reserve)
    mask = torch.zeros(shape, dtype=torch.int32)
    key_words = -(-max_keys // KEY_BITS)
    pack_topk(topk_per_request, mask[:, :, :key_words])
    if reserve and case.key_starts:
        mask[:, 0, -1] = torch.tensor(case.key_starts, dtype=torch.int32)
    return mask


def remap_topk(
    topk_per_request: list[torch.Tensor], starts: list[int] | tuple[int, ...], lengths: list[int] | tuple[int, ...]
) -> list[torch.Tensor]:
    """Per request, each index ``t`` as ``t - start`` when it falls in
    ``[start, start + length)``, else -1."""
    import torch

    out = []
    for topk, start, length in zip(topk_per_request, starts, lengths, strict=True):
        inside = (topk >= start) & (topk < start + length)
        out.append(torch.where(inside, topk - start, torch.full_like(topk, -1)))
    return out
