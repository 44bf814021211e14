"""The sparse (top-k) MLA path as vllm 0.27.1 had it, before upstream b38e111d3e.

What changed in b38e111d3e (SPEC 1d), and what this module keeps of before:

- the workspace: ``min(max(8*len, 4*seqs*block), 65536, seqs*topk)`` floored at
  ``max_num_seqs * block_size`` (the floor seeds/004 keeps out of 0.28.0), and
  no DCP alignment;
- no check that the suffix and chunk masks fit the mask workspace
  (``masks_fit`` is None), so the route takes masked MHA on the threshold alone;
- the global mask fits when its bytes fit a fixed 64 MiB, whatever the
  workspace holds;
- every chunk's attention runs over the whole batch's queries, so its
  per-range mask has a row block per request of the batch and the batch's
  longest query; with the global mask it reads the whole mask.

The threshold table, the mask shape rule, the mask builder and the remap did
not change; they are per_request's.
"""

from __future__ import annotations

import math

from harness.model import Layout
from harness.model.sparse import LEGACY_MASK_WORKSPACE_WORDS, SparseCase, SparseLayout, SparseWorkspaceConfig
from ports.equal_share import grid_layout
from ports.per_request.sparse import masked_threshold, topk_mask_shape

LEGACY_GLOBAL_MASK_BYTES = 64 * 1024 * 1024
WORD_BYTES = 4


def legacy_sparse_workspace_size(config: SparseWorkspaceConfig) -> int:
    size = min(
        max(8 * config.max_model_len, 4 * config.max_num_seqs * config.block_size),
        65536,
        config.max_num_seqs * config.index_topk,
    )
    return max(size, config.max_num_seqs * config.block_size)


def legacy_mask_workspace(case: SparseCase) -> int:
    """Words of 0.27.1's mask workspace: the case's, or the 64 MiB it allocates."""
    if not case.masked_kernel:
        return 0
    return LEGACY_MASK_WORKSPACE_WORDS if case.mask_workspace_words is None else case.mask_workspace_words


def legacy_plan_sparse(case: SparseCase) -> SparseLayout:
    workspace = legacy_sparse_workspace_size(case.workspace_config)
    layout = grid_layout(case.planned_case(workspace)) if any(case.context_lens) else Layout(chunks=())
    batch = len(case.query_lens)
    max_query, max_seq = case.max_query_len, case.max_seq_len
    use_dense = max_seq <= case.index_topk and not case.force_mqa
    threshold = masked_threshold(case.backend, case.tensor_parallel_size, max_query, max_seq)
    use_masked = case.masked_kernel and case.dcp_world_size <= 1 and threshold
    route = "mqa"
    if (use_dense or use_masked) and not case.force_mqa:
        dense = case.force_dense_mha or (max_seq <= case.index_topk and not case.force_masked_mha)
        route = "dense-mha" if dense else ("masked-mha" if case.masked_kernel else "masked-mha-unavailable")
    global_shape = topk_mask_shape(batch, max_query, max_seq, key_starts_word=True) if layout.chunks else None
    global_fits = None
    if global_shape is not None:
        words = global_shape[0] * global_shape[1] * global_shape[2]
        global_fits = words * WORD_BYTES <= LEGACY_GLOBAL_MASK_BYTES
    if global_shape is not None and global_fits:
        suffix_shape = global_shape
        chunk_shapes = tuple(global_shape for _ in layout.chunks)
    else:
        suffix_shape = topk_mask_shape(batch, max_query, max_query)
        chunk_shapes = tuple(topk_mask_shape(batch, max_query, chunk.max_seq_len) for chunk in layout.chunks)
    # 0.27.1 views the mask workspace as each mask it builds (the global one, or
    # the suffix's and every chunk's) without checking that it holds them.
    mask_words = legacy_mask_workspace(case)
    # A masked run meets its checks in this order: the suffix's mask (or the
    # global one), the context loop's refusal under DCP, each chunk's mask.
    chunks_built = () if global_fits else chunk_shapes
    if route == "masked-mha":
        if math.prod(suffix_shape) > mask_words:
            route = "masked-mha-overflow"
        elif any(case.context_lens) and case.dcp_world_size > 1:
            route = "masked-mha-unavailable"
        elif any(math.prod(shape) > mask_words for shape in chunks_built):
            route = "masked-mha-overflow"
    return SparseLayout(
        workspace_size=workspace,
        layout=layout,
        prefill_max_query_len=max_query,
        prefill_max_seq_len=max_seq,
        use_dense_mha=use_dense,
        masked_threshold=threshold,
        masks_fit=None,
        use_masked_mha=use_masked,
        route=route,
        global_mask_shape=global_shape,
        global_mask_fits=global_fits,
        suffix_mask_shape=suffix_shape,
        chunk_mask_shapes=chunk_shapes,
    )
