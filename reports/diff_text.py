"""What ``parity diff`` (and ``parity explore --replay``) prints for one item,
and the record ``parity diff --json`` writes.

Text: a case's chunks side by side, a merge case and a workspace configuration
as field/value tables, the workspace size as oracle against port, and a numeric
level's per-tensor verdict. Every table takes its column widths from its
content, so values of any length stay aligned; a bit-exact tensor is one line
(no empty histogram, no table of worst rows without rows); no line ends in
spaces.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from harness.compare.ulp_text import ulp_of_larger_text, ulp_text
from harness.model import Case, Chunk, Layout, MergeCase, WorkspaceConfig
from harness.model.levels import kind_spec
from harness.model.sparse import SparseWorkspaceConfig
from harness.sides.items import PARITY, CaseResult


def _short(values: Sequence[object], limit: int = 4) -> str:
    if len(values) <= limit:
        return "[" + ",".join(map(str, values)) + "]"
    return "[" + ",".join(map(str, values[:limit])) + f",..+{len(values) - limit}]"


def _widths(rows: Sequence[Sequence[str]]) -> list[int]:
    columns = max((len(r) for r in rows), default=0)
    return [max((len(r[i]) for r in rows if i < len(r)), default=0) for i in range(columns)]


def _render(cells: Sequence[str], widths: Sequence[int], right: frozenset[int], gap: str) -> str:
    padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=False))]
    return gap.join(padded).rstrip()


def table(
    rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset(), gap: str = " | ", indent: str = "  "
) -> list[str]:
    """``rows`` (the first one the heading) as aligned lines; columns in
    ``right`` are right-aligned."""
    widths = _widths(rows)
    return [indent + _render(row, widths, right, gap) for row in rows]


# -- layouts -------------------------------------------------------------------------------


def chunk_cells(chunk: Chunk) -> list[str]:
    """One chunk as the cells of a row of the side-by-side table."""
    return [
        f"#{chunk.index}",
        f"req[{chunk.request_start},{chunk.request_end})",
        f"tok[{chunk.token_start},{chunk.token_end})",
        "cont" if chunk.is_continuation else "",
        f"starts={_short(chunk.starts)}",
        f"lens={_short(chunk.seq_lens)}",
        f"rows={chunk.num_context_tokens}",
    ]


def chunk_line(chunk: Chunk) -> str:
    return " ".join(cell for cell in chunk_cells(chunk) if cell)


def case_lines(case: Case) -> list[str]:
    lines = [
        f"case {case.name} (family {case.family}): {case.num_requests} requests, "
        f"total context {sum(case.context_lens)}, W={case.workspace_size}, block {case.block_size}, "
        f"DCP {case.dcp_world_size}x{case.cp_kv_cache_interleave_size}, align {case.align_to_block}",
        f"context_lens {_short(case.context_lens, 12)}",
        f"query_lens   {_short(case.query_lens, 12)}",
    ]
    if case.numeric is not None:
        spec = case.numeric.to_json()
        lines.append("numeric      " + ", ".join(f"{k} {v}" for k, v in spec.items()))
    return lines


def format_diff(case: Case, result: CaseResult) -> str:
    """The case, its two layouts side by side (the first differing chunk marked
    ``>>``), and the L1 verdict."""
    lines = case_lines(case)
    if result.error:
        lines += ["", f"L1 layout: {result.status.upper()}: {result.error}"]
        return "\n".join(lines)
    oracle, port = result.oracle_layout or Layout(()), result.port_layout or Layout(())
    count = max(oracle.num_chunks, port.num_chunks)
    missing = ["-"]

    def cells(layout: Layout, i: int) -> list[str]:
        return chunk_cells(layout.chunks[i]) if i < layout.num_chunks else missing

    # One set of widths for both sides, so identical chunks look identical.
    widths = _widths([cells(side, i) for side in (oracle, port) for i in range(count)])
    left_aligned: frozenset[int] = frozenset()
    bad_chunk = result.divergence.chunk if result.divergence else None
    rows = [
        (
            ">>" if i == bad_chunk else "",
            _render(cells(oracle, i), widths, left_aligned, " "),
            _render(cells(port, i), widths, left_aligned, " "),
        )
        for i in range(count)
    ]
    rows.insert(0, ("", f"oracle: {oracle.num_chunks} chunks", f"port: {port.num_chunks} chunks"))
    rows.append(
        (
            "",
            f"empty token slices {_short(oracle.empty_token_slices)}",
            f"empty token slices {_short(port.empty_token_slices)}",
        )
    )
    mark_width = max(len(r[0]) for r in rows)
    left_width = max(len(r[1]) for r in rows)
    lines.append("")
    lines += [f"{mark:<{mark_width}} {left:<{left_width}} | {right}".rstrip() for mark, left, right in rows]
    lines.append("")
    if result.divergence is None:
        lines.append("L1 layout: PARITY (every field of every chunk identical)")
    else:
        lines.append(f"L1 layout: DIVERGENT at {result.divergence.message()}")
    return "\n".join(lines)


# -- merge cases and workspace configurations ----------------------------------------------


def fields_table(item: MergeCase | WorkspaceConfig) -> list[str]:
    """An item's fields as a field | value table (name first, absent values as none)."""
    values = item.to_json() if isinstance(item, MergeCase) else dataclasses.asdict(item)
    rows = [["field", "value"]]
    rows += [[key, "none" if value is None else str(value)] for key, value in values.items() if key != "name"]
    return table(rows)


def merge_case_lines(case: MergeCase) -> list[str]:
    return [f"merge case {case.name}", *fields_table(case)]


def format_workspace_diff(config: WorkspaceConfig, result: CaseResult) -> str:
    """The configuration, the workspace size each side computed, and the verdict."""
    lines = [f"workspace configuration {config.name}", *fields_table(config), ""]
    if result.error:
        lines.append(f"L1 workspace size: {result.status.upper()}: {result.error}")
        return "\n".join(lines)
    oracle, port = result.oracle_workspace, result.port_workspace
    rows = [["", "oracle", "port"], ["workspace_size (rows)", str(oracle), str(port)]]
    lines += table(rows, right=frozenset({1, 2}))
    lines.append("")
    if result.status == PARITY:
        lines.append(f"L1 workspace size: PARITY (both {oracle} rows)")
    else:
        lines.append(f"L1 workspace size: DIVERGENT: oracle {oracle} rows != port {port} rows")
    return "\n".join(lines)


# -- numeric levels ------------------------------------------------------------------------


def _row_heading(key: str) -> str:
    return {"max_ulp": "max ULP", "max_ulp_of_larger": "max ULP of larger"}.get(key, key.replace("_", " "))


def _row_cell(key: str, value: Any) -> str:
    if key == "max_ulp" and isinstance(value, int):
        return ulp_text(value)
    if key == "max_ulp_of_larger" and isinstance(value, float):
        return ulp_of_larger_text(value)
    return str(value)


def format_tensor_verdict(label: str, result: CaseResult) -> str:
    """Per-tensor ULP summaries and, for a tensor whose bits differ, its
    histogram and its worst token rows."""
    if result.error:
        return f"{label}: {result.status.upper()}: {result.error}"
    verdict = "BIT-EXACT" if result.ok else "DIVERGENT"
    lines = [f"{label}: {verdict}"]
    for t in result.tensors:
        lines.append(f"  {t.summary()}")
        if t.exact:
            continue
        if t.histogram:
            lines.append("    ULP histogram: " + ", ".join(f"{k}: {v}" for k, v in t.histogram.items()))
        if t.worst_rows:
            keys = list(t.worst_rows[0])
            rows = [[_row_heading(k) for k in keys]]
            rows += [[_row_cell(k, row.get(k)) for k in keys] for row in t.worst_rows]
            lines += table(rows, right=frozenset(range(len(keys))), indent="    ")
    return "\n".join(lines)


# -- DCP: which rank contributed which rows ------------------------------------------------


def _runs(positions: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive positions as ``[start, stop)`` runs, in order."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


def _runs_text(runs: Sequence[tuple[int, int]], limit: int = 6) -> str:
    """Runs as ``a-b`` (or ``a``); a regular pattern of three or more equal runs
    at a fixed stride, as the interleave deals rows, as ``first-last in runs of
    L every S``."""
    lengths = {b - a for a, b in runs}
    strides = {runs[i + 1][0] - runs[i][0] for i in range(len(runs) - 1)}
    if len(runs) >= 3 and len(lengths) == 1 and len(strides) == 1:
        return f"{runs[0][0]}-{runs[-1][1] - 1} in runs of {lengths.pop()} every {strides.pop()}"
    shown = ", ".join(f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in runs[:limit])
    return shown + (f", ... ({len(runs)} runs)" if len(runs) > limit else "")


def first_mismatch_token(result: CaseResult) -> int | None:
    """The token of the first mismatching element of the first tensor whose bits differ."""
    for t in result.tensors:
        if not t.exact and t.first_mismatch and "token" in t.first_mismatch.get("index", {}):
            return int(t.first_mismatch["index"]["token"])
    return None


def _rank_lines(chunk: Chunk, k: int, world: int, interleave: int) -> list[str]:
    """One line per rank: the context rows (global positions) it contributes
    for chunk-local request ``k``, and the padding rows it drops."""
    from harness.model.dcp import global_positions

    assert chunk.local_starts is not None and chunk.padded_local_seq_lens is not None
    assert chunk.local_context_lens_allranks is not None
    local_start, padded = chunk.local_starts[k], chunk.padded_local_seq_lens[k]
    lines = []
    for rank, held in enumerate(chunk.local_context_lens_allranks[k]):
        real = min(max(held - local_start, 0), padded)
        positions = global_positions(local_start + real, world, interleave, rank)[local_start:].tolist()
        lines.append(
            f"    rank {rank}: {real} rows -> context rows {_runs_text(_runs(positions)) or 'none'}"
            f" ({padded - real} padding rows dropped)"
        )
    return lines


def format_rank_picture(case: Case, expected: Layout, port_layout: Layout | None, result: CaseResult) -> str:
    """Under DCP, when a prefill's bits differ: for each chunk of the oracle's
    layout (``expected``) that holds the first mismatching token's request,
    which rank should contribute which context rows (global positions) and how
    many padding rows it should drop, in the order the attention takes them
    (request by request, rank by rank). Where the port's layout places that
    request's rows differently, its picture follows; where it places them the
    same, the difference lies in how the port gathers, all-gathers, reorders or
    folds them, which the layout cannot show. Empty without DCP, without a
    token-indexed mismatch, or when the request has no context."""
    token = first_mismatch_token(result)
    if case.dcp_world_size == 1 or token is None:
        return ""
    qsl = case.query_start_loc
    request = max(i for i in range(case.num_requests) if qsl[i] <= token)
    world, interleave = case.dcp_world_size, case.cp_kv_cache_interleave_size

    def pictures(layout: Layout) -> list[tuple[int, list[str]]]:
        out = []
        for chunk in layout.chunks:
            if chunk.request_start <= request < chunk.request_end and chunk.local_starts is not None:
                k = request - chunk.request_start
                heading = (
                    f"  chunk {chunk.index}: {chunk.seq_lens[k]} of its context rows, local rows "
                    f"[{chunk.local_starts[k]}, {chunk.local_starts[k] + (chunk.padded_local_seq_lens or ())[k]}) "
                    "on every rank"
                )
                out.append((chunk.index, [heading, *_rank_lines(chunk, k, world, interleave)]))
        return out

    expected_pictures = pictures(expected)
    if not expected_pictures:
        return ""
    lines = [
        f"DCP picture (world {world}, interleave {interleave}): request {request}, which holds the first "
        f"mismatching token {token}; the rows each rank should contribute (the oracle's layout):"
    ]
    for _, block in expected_pictures:
        lines += block
    if port_layout is not None:
        port_pictures = pictures(port_layout)
        if port_pictures == expected_pictures:
            lines.append(
                "The port's layout places the same rows: the difference lies in how it gathers, all-gathers, "
                "reorders or folds them."
            )
        else:
            lines.append("The port's layout places them so:")
            for _, block in port_pictures:
                lines += block
    return "\n".join(lines)


# -- the --json record ---------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """JSON without NaN or infinity literals: a non-finite float becomes its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def result_record(result: CaseResult) -> dict[str, Any]:
    """One compared item: its verdict and, side by side, what each side gave
    (chunks for layout, rows for the workspace size, per-tensor statistics for
    merge and prefill)."""
    record: dict[str, Any] = {
        "kind": result.kind,
        "level": result.level,
        "status": result.status,
        "detail": "" if result.ok else result.detail(),
        "error": result.error,
        "divergence": result.divergence.to_json() if result.divergence else None,
    }
    kind, level = kind_spec(result.kind)
    if kind.record is not None:
        record.update(kind.record(result))
    elif level.floats:
        record["tensors"] = [t.to_json() for t in result.tensors]
    return record


def layout_record(result: CaseResult) -> dict[str, Any]:
    """A layout item's chunks side by side, for ``parity diff --json``."""
    if result.error:
        return {}
    oracle, port = result.oracle_layout or Layout(()), result.port_layout or Layout(())
    chunks = []
    for i in range(max(oracle.num_chunks, port.num_chunks)):
        left = oracle.chunks[i].to_json() if i < oracle.num_chunks else None
        right = port.chunks[i].to_json() if i < port.num_chunks else None
        chunks.append({"index": i, "identical": left == right, "oracle": left, "port": right})
    return {
        "oracle_chunks": oracle.num_chunks,
        "port_chunks": port.num_chunks,
        "chunks": chunks,
        "empty_token_slices": {
            "oracle": [list(s) for s in oracle.empty_token_slices],
            "port": [list(s) for s in port.empty_token_slices],
        },
    }


def format_result(item: Any, result: CaseResult) -> str:
    """An item of a level that shows no text of its own: its verdict, its
    divergence or error, and its tensors as every float level's are shown."""
    if result.tensors or result.error:
        return format_tensor_verdict(result.level, result)
    verdict = "PARITY" if result.ok else result.status.upper()
    return f"{result.level} {item.name}: {verdict}" + ("" if result.ok else f": {result.detail()}")


def item_fields(item: Any) -> dict[str, Any]:
    """A compared item as JSON: a case, merge case, sparse batch or mask case by
    its ``to_json``; a workspace configuration by its fields and name."""
    if isinstance(item, WorkspaceConfig):
        return {"name": item.name, **dataclasses.asdict(item)}
    if isinstance(item, SparseWorkspaceConfig):
        return {"name": item.name, **item.to_json()}
    fields: dict[str, Any] = item.to_json()
    return fields


def diff_record(item: Any, results: Sequence[CaseResult], context: dict[str, Any]) -> dict[str, Any]:
    """``parity diff --json``: the item, the run's ``context`` (port, device,
    provenance, the command that reproduces it), each level's verdict, and
    every compared item side by side. JSON-safe (non-finite floats by name)."""
    verdict = PARITY if all(r.ok for r in results) else next(r.status for r in results if not r.ok)
    record: dict[str, Any] = _plain(
        {
            "item": item_fields(item),
            **context,
            "verdict": verdict,
            "levels": {r.kind: r.status for r in results},
            "results": [result_record(r) for r in results],
        }
    )
    return record


def verdict_line(results: Sequence[CaseResult]) -> str:
    """The closing line: the whole diff's verdict and each item's status."""
    failing = [r.status for r in results if not r.ok]
    word = failing[0].upper() if failing else "PARITY"
    return f"verdict: {word} ({', '.join(f'{r.kind} {r.status}' for r in results)})"
