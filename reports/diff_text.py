"""The text ``parity diff`` (and ``parity explore --replay``) prints: a case's
chunks side by side, and a numeric level's per-tensor verdict."""

from __future__ import annotations

from harness.model import Case, Chunk, Layout
from harness.runner import CaseResult


def _short(values: tuple[object, ...], limit: int = 4) -> str:
    if len(values) <= limit:
        return "[" + ",".join(map(str, values)) + "]"
    return "[" + ",".join(map(str, values[:limit])) + f",..+{len(values) - limit}]"


def chunk_line(chunk: Chunk) -> str:
    cont = "cont" if chunk.is_continuation else "    "
    return (
        f"#{chunk.index:<3} req[{chunk.request_start},{chunk.request_end}) "
        f"tok[{chunk.token_start},{chunk.token_end}) {cont} "
        f"starts={_short(chunk.starts)} lens={_short(chunk.seq_lens)} rows={chunk.num_context_tokens}"
    )


def format_diff(case: Case, result: CaseResult) -> str:
    width = 64
    lines = [
        f"case {case.name} (family {case.family}): {case.num_requests} requests, "
        f"total context {sum(case.context_lens)}, W={case.workspace_size}, block {case.block_size}, "
        f"DCP {case.dcp_world_size}x{case.cp_kv_cache_interleave_size}, align {case.align_to_block}",
        f"context_lens {_short(case.context_lens, 12)}",
        f"query_lens   {_short(case.query_lens, 12)}",
    ]
    if result.error:
        lines.append(f"{result.status}: {result.error}")
        return "\n".join(lines)
    oracle, port = result.oracle_layout or Layout(()), result.port_layout or Layout(())
    lines.append("")
    lines.append(f"   {'oracle: ' + str(oracle.num_chunks) + ' chunks':<{width}} | port: {port.num_chunks} chunks")
    bad_chunk = result.divergence.chunk if result.divergence else None
    for i in range(max(oracle.num_chunks, port.num_chunks)):
        left = chunk_line(oracle.chunks[i]) if i < oracle.num_chunks else "-"
        right = chunk_line(port.chunks[i]) if i < port.num_chunks else "-"
        mark = ">> " if i == bad_chunk else "   "
        lines.append(f"{mark}{left:<{width}} | {right}")
    oracle_empty = "empty token slices " + _short(oracle.empty_token_slices)
    lines.append(f"   {oracle_empty:<{width}} | empty token slices {_short(port.empty_token_slices)}")
    lines.append("")
    if result.divergence is None:
        lines.append("L1 layout: PARITY (every field of every chunk identical)")
    else:
        lines.append(f"L1 layout: DIVERGENT at {result.divergence.message()}")
    return "\n".join(lines)


def format_tensor_verdict(label: str, result: CaseResult) -> str:
    """Per-tensor ULP summaries and a short table of the worst token rows."""
    if result.error:
        return f"{label}: {result.status.upper()}: {result.error}"
    verdict = "BIT-EXACT" if result.ok else "DIVERGENT"
    lines = [f"{label}: {verdict}"]
    for t in result.tensors:
        lines.append(f"  {t.summary()}")
        if t.histogram:
            lines.append("    ULP histogram: " + ", ".join(f"{k}: {v}" for k, v in t.histogram.items()))
        if t.worst_rows:
            lines.append(f"    {'token':>7}{'mismatches':>12}{'max ULP':>10}")
            for row in t.worst_rows:
                lines.append(f"    {row['token']:>7}{row['mismatches']:>12}{row['max_ulp']:>10}")
    return "\n".join(lines)
