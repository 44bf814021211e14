"""What ``parity diff`` prints for the sparse path's items: the inputs, the
route with the values that decided it on each side, and the first difference
with both values (mask words as bit strings beside the top-k indices that set
them); a sparse L3 batch's tensors as every float level's are
(:func:`reports.diff_text.format_tensor_verdict`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.compare.sparse import route_reasons
from harness.model.sparse import SparseCase, SparseWorkspaceConfig, TopkMaskCase
from harness.sides.items import PARITY

if TYPE_CHECKING:
    from harness.sides.items import CaseResult


def _outcome(result: CaseResult) -> list[str]:
    if result.error:
        return [f"  {result.status}: {result.error}"]
    if result.divergence is not None:
        d = result.divergence
        return [f"  first difference: {d.where}", f"    oracle {d.oracle}", f"    port   {d.port}"]
    return ["  identical"]


def sparse_batch_lines(case: SparseCase, result: CaseResult) -> list[str]:
    """A sparse batch's inputs, and each side's route with the values that decided it."""
    words = "the release's own" if case.mask_workspace_words is None else f"{case.mask_workspace_words} words"
    lines = [
        f"sparse batch {case.name}: {len(case.context_lens)} requests, context {list(case.context_lens)[:8]}"
        f"{' ...' if len(case.context_lens) > 8 else ''}, query {list(case.query_lens)[:8]}"
        f"{' ...' if len(case.query_lens) > 8 else ''}",
        f"  index_topk {case.index_topk}, backend {case.backend}, TP {case.tensor_parallel_size}, "
        f"DCP {case.dcp_world_size}x{case.cp_kv_cache_interleave_size}, masked kernel {case.masked_kernel}, "
        f"mask workspace {words}, forced: dense {case.force_dense_mha}, "
        f"masked {case.force_masked_mha}, mqa {case.force_mqa}",
    ]
    for side, layout in (("oracle", result.oracle_sparse), ("port", result.port_sparse)):
        if layout is not None:
            lines.append(f"  {side:6} workspace {layout.workspace_size}, {layout.layout.num_chunks} chunks")
            lines.append(f"         {route_reasons(layout)}")
            lines.append(
                f"         suffix mask {layout.suffix_mask_shape}, chunk masks {list(layout.chunk_mask_shapes)[:6]}"
            )
    return lines


def format_sparse_diff(case: SparseCase, result: CaseResult) -> str:
    return "\n".join(sparse_batch_lines(case, result) + _outcome(result))


def format_sparse_workspace_diff(config: SparseWorkspaceConfig, result: CaseResult) -> str:
    lines = [
        f"sparse workspace {config.name}: min(max(8*{config.max_model_len}, 4*{config.max_num_seqs}*"
        f"{config.block_size}), 65536, {config.max_num_seqs}*{config.index_topk})",
        f"  oracle {result.oracle_workspace}  port {result.port_workspace}",
    ]
    return "\n".join(lines + (_outcome(result) if result.status != PARITY else []))


def format_mask_diff(case: TopkMaskCase, result: CaseResult) -> str:
    lines = [
        f"top-k mask {case.name}: form {case.form}, {case.num_requests} requests, query {list(case.query_lens)}, "
        f"keys {list(case.seq_lens)}, index_topk {case.index_topk}, pattern {case.pattern}",
        f"  remap ranges: starts {list(case.range_starts)}, lengths {list(case.range_lens)}"
        + (f"; key starts {list(case.key_starts)}" if case.key_starts else ""),
    ]
    return "\n".join(lines + _outcome(result))
