"""Measuring coverage: :func:`measure` reads the loaded suite
(:func:`harness.cases.suites.load_suite`) and tallies every feature of
:data:`harness.search.coverage.FEATURES`, each registered level's by its
coverage hook (:class:`harness.model.levels.CoverageHook`); the built-in
levels' measurements are here (:func:`measure_layout`, :func:`measure_merges`,
:func:`measure_prefills`) and in :mod:`harness.search.sparse_coverage`:

- **layout**: every case's chunks as the *oracle* plans them (coverage is about
  what upstream was made to do): requests per batch and per chunk, pieces per
  request, the largest start, context, cumulative offset and query offset (each
  reported against the integer widths 2^8, 2^16, 2^31), block sizes, DCP world
  x interleave pairs, alignment, workspace sizes, and how many cases hold a
  point where two plausible formulas disagree (lcm vs max of the alignment,
  floor vs ceil in ``padded(n)``). Without DCP the chunks come from upstream's
  own planner (``plan_mla_context_chunks``, called by ``OracleSide.upstream_plan``
  with the arguments the metadata builder gives it), which costs a fraction of
  building the whole metadata; DCP cases go through the full builder.
- **grid**: the workspace-size configurations: their axes, the largest
  intermediate of the size formula, the configurations where lcm and max, or
  round-then-cap and cap-then-round, disagree, and the oracle's sizes.
- **merge**: the materialised L2 tensors (:func:`harness.kernels.numeric.materialise_merge`),
  so what is measured is what the tensors hold: the histogram of LSE gaps over
  finite pairs, the (prefix, suffix) pattern of every pair in
  {finite, +inf, -inf}^2, -0.0 / denormal / NaN / inf in values and LSEs, the LSE
  and value views (from strides), dtype x head size, and
  ``prefill_tokens_with_context``. Only what the merge reads counts: gaps, pairs
  and the prefix's special values cover the merged tokens (before
  ``prefill_tokens_with_context``), the suffix's every token.
- **prefill**: the L3 cases: their sizes, pieces, dtypes, keyless-row
  behaviours and block sizes.
- **sparse**: the sparse items, by :func:`harness.search.sparse_coverage.measure_sparse`.

Invariants:

* The oracle's view. Every value measured is what the oracle planned, sized or
  materialised, never what a port did.
* Refusals cover nothing. An input the oracle refused (a layout case it cannot
  plan, a configuration it cannot size) or a merge case that cannot be
  materialised counts in its feature of
  :data:`~harness.search.coverage.REFUSAL_FEATURES` and in no other.
* Deterministic. The same suite and oracle give the same report.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from harness.cases.suites import Suite
from harness.model import Case, Chunk, MergeCase, WorkspaceConfig
from harness.protocol.port import Port
from harness.search.coverage import GAP_BANDS, GAP_EDGES, LSE_KINDS, CoverageReport, Tally, coverage_hooks

# The dense workspace size is capped at this many rows (SPEC 1b).
DENSE_CAP = 65536


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def interleave_label(interleave: int, block_size: int) -> str:
    if interleave == 1:
        return "1"
    if interleave < block_size:
        return "between"
    return "equal" if interleave == block_size else "above"


@dataclass(frozen=True)
class _Chunk:
    request_start: int
    request_end: int
    starts: tuple[int, ...]
    seq_lens: tuple[int, ...]
    local_rows: int | None  # the last padded local cumulative offset, under DCP
    full: Chunk | None = None  # the whole chunk, under DCP


def oracle_chunks(oracle: Port, case: Case) -> list[_Chunk]:
    """The oracle's chunks of ``case``: upstream's planner alone without DCP when
    the oracle is asked live and offers it (the same plans the metadata builder
    makes), the whole layout otherwise. An oracle that keeps its answers
    (:class:`~harness.sides.oracle_cache.CachedOracle`) is asked for layouts: the
    L1 comparison asks the same ones, so the night's coverage costs it nothing
    (and a run answered from the cache never imports vLLM)."""
    plan = None if getattr(oracle, "keeps_answers", False) else getattr(oracle, "upstream_plan", None)
    if case.dcp_world_size == 1 and callable(plan):
        return [_Chunk(p.request_start, p.request_end, tuple(p.starts), tuple(p.seq_lens), None) for p in plan(case)]
    return [
        _Chunk(
            c.request_start,
            c.request_end,
            c.starts,
            c.seq_lens,
            c.padded_local_cu_seq_lens[-1] if c.padded_local_cu_seq_lens and case.dcp_world_size > 1 else None,
            c if case.dcp_world_size > 1 else None,
        )
        for c in oracle.plan_layout(case).chunks
    ]


def _pieces(chunks: list[_Chunk]) -> Counter[int]:
    pieces: Counter[int] = Counter()
    for chunk in chunks:
        pieces.update(range(chunk.request_start, chunk.request_end))
    return pieces


def _measure_case(tally: Tally, case: Case, chunks: list[_Chunk]) -> None:
    tally.most("layout.requests_per_batch", case.num_requests)
    tally.most("layout.max_context", max(case.context_lens))
    if any(case.context_lens):
        tally.most("layout.max_query_offset", sum(case.query_lens))
    for chunk in chunks:
        size = chunk.request_end - chunk.request_start
        tally.most("layout.requests_per_chunk", size)
        tally.count("layout.chunks_over_255_requests", size > 255)
        tally.count("layout.chunks_1000_requests", size >= 1000)
        tally.most("layout.max_start", max(chunk.starts))
        tally.most("layout.max_cu_seq_len", max(sum(chunk.seq_lens), chunk.local_rows or 0))
    pieces = _pieces(chunks)
    tally.most("layout.pieces_per_request", max(pieces.values(), default=0))
    tally.count("layout.requests_in_3_pieces", sum(n >= 3 for n in pieces.values()))
    block, world, interleave = case.block_size, case.dcp_world_size, case.cp_kv_cache_interleave_size
    tally.add("layout.block_sizes", block)
    tally.count("layout.non_pow2_block_cases", not _pow2(block))
    tally.add("layout.alignment", "on" if case.align_to_block else "off")
    tally.least("layout.workspace_min", case.workspace_size)
    tally.most("layout.workspace_max", case.workspace_size)
    tally.count("layout.non_pow2_workspace_cases", not _pow2(case.workspace_size))
    if world > 1:
        tally.add("layout.dcp_worlds", world)
        tally.add("layout.dcp_pairs", f"{world}x{interleave}")
        tally.bucket("layout.dcp_interleave_vs_block", interleave_label(interleave, block))
        effective = block if case.align_to_block else 1
        tally.count(
            "layout.lcm_ne_max_cases", math.lcm(effective, interleave * world) != max(effective, interleave * world)
        )
        # padded(n) = ceil(n / (I*D)) * I; a floor there differs wherever I*D does
        # not divide a boundary the planner costs (a span's start or end).
        span = interleave * world
        tally.count(
            "layout.padded_floor_ne_ceil_cases",
            any(
                n % span
                for c in chunks
                for s, length in zip(c.starts, c.seq_lens, strict=True)
                for n in (s, s + length)
            ),
        )


def _measure_prefill(tally: Tally, case: Case, pieces: Counter[int], chunks: list[_Chunk]) -> None:
    from harness.cases.prefill_generate import legacy_grid_has_keyless_rows

    assert case.numeric is not None
    tally.count("prefill.cases")
    tally.most("prefill.requests_per_batch", case.num_requests)
    tally.most("prefill.pieces_per_request", max(pieces.values(), default=0))
    tally.count("prefill.requests_in_3_pieces", sum(n >= 3 for n in pieces.values()))
    tally.most("prefill.max_query_tokens", sum(case.query_lens))
    tally.add("prefill.dtypes", case.numeric.dtype)
    # A behaviour on keyless rows is exercised only where the legacy grid has some.
    if legacy_grid_has_keyless_rows(case):
        tally.add("prefill.keyless_rows", case.numeric.keyless_rows)
    tally.add("prefill.block_sizes", case.block_size)
    tally.count("prefill.non_pow2_block_cases", not _pow2(case.block_size))
    if case.dcp_world_size > 1:
        _measure_dcp_prefill(tally, case, [c.full for c in chunks if c.full is not None])


def _measure_dcp_prefill(tally: Tally, case: Case, chunks: list[Chunk]) -> None:
    assert case.numeric is not None
    tally.count("prefill.dcp_cases")
    tally.add("prefill.dcp_worlds", case.dcp_world_size)
    tally.add("prefill.dcp_interleaves", case.cp_kv_cache_interleave_size)
    tally.add("prefill.dcp_dtypes", case.numeric.dtype)
    for chunk in chunks:
        if chunk.local_starts is None or chunk.padded_local_seq_lens is None:
            continue
        assert chunk.local_context_lens_allranks is not None
        tally.count("prefill.dcp_continuations", chunk.is_continuation)
        tally.count(
            "prefill.dcp_padded_segments",
            sum(
                min(max(held - start, 0), padded) < padded
                for start, padded, ranks in zip(
                    chunk.local_starts, chunk.padded_local_seq_lens, chunk.local_context_lens_allranks, strict=True
                )
                for held in ranks
            ),
        )


def _measure_config(tally: Tally, oracle: Port, config: WorkspaceConfig) -> None:
    """A configuration the oracle cannot size counts in ``grid.oracle_refused`` alone."""
    try:
        size = int(oracle.workspace_size(config))
    except Exception:
        tally.count("grid.oracle_refused")
        return
    block, world, interleave = config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size
    tally.count("grid.configs")
    tally.add("grid.block_sizes", block)
    tally.add("grid.dcp_worlds", world)
    tally.add("grid.interleaves", interleave)
    dense = max(8 * config.max_model_len, 4 * config.max_num_seqs * block)
    tally.most("grid.max_intermediate", dense)
    unit = block
    if world > 1:
        tally.bucket("grid.interleave_vs_block", interleave_label(interleave, block))
        tally.count("grid.lcm_ne_max_configs", math.lcm(block, interleave * world) != max(block, interleave * world))
        unit = math.lcm(block, interleave * world)
    cap_then_round = max(_round_up(min(dense, DENSE_CAP), unit), unit)
    round_then_cap = max(min(_round_up(dense, unit), DENSE_CAP), unit)
    tally.count("grid.round_cap_differ_configs", cap_then_round != round_then_cap)
    tally.least("grid.workspace_min", size)
    tally.most("grid.workspace_max", size)
    tally.count("grid.non_pow2_workspaces", not _pow2(size))


def lse_view(lse: Any) -> str:
    """The kind of an LSE view ``[num_heads, num_tokens]`` from its strides."""
    if lse.is_contiguous():
        return "contiguous"
    tokens = lse.shape[1]
    head_stride, token_stride = lse.stride()
    if token_stride != 1 and tokens > 1:
        return "transposed"
    if head_stride > tokens:
        return "column-slice"
    return "other"


def value_view(values: Any) -> str:
    """The kind of a partial's view ``[num_tokens, num_heads, head_size]`` from its
    strides: rows wider than the head size are a slice of a wider head dimension."""
    if values.is_contiguous():
        return "contiguous"
    heads, size = values.shape[1], values.shape[2]
    token_stride, head_stride, dim_stride = values.stride()
    row_stride = head_stride if heads > 1 else token_stride
    return "head-dim-slice" if dim_stride == 1 and row_stride > size else "other"


def _special_values(tensor: Any) -> list[str]:
    import torch

    tiny = torch.finfo(tensor.dtype).tiny
    found = {
        "-0.0": (tensor == 0) & torch.signbit(tensor),
        "denormal": (tensor != 0) & torch.isfinite(tensor) & (tensor.abs() < tiny),
        "nan": torch.isnan(tensor),
        "+inf": torch.isposinf(tensor),
        "-inf": torch.isneginf(tensor),
    }
    return [label for label, mask in found.items() if bool(mask.any())]


def _lse_kind(lse: Any) -> Any:
    import torch

    # 0 finite, 1 +inf, 2 -inf, 3 NaN (left out of the pairs)
    kind = torch.zeros(lse.shape, dtype=torch.int64)
    kind[torch.isposinf(lse)] = 1
    kind[torch.isneginf(lse)] = 2
    kind[torch.isnan(lse)] = 3
    return kind


def _measure_merge(tally: Tally, case: MergeCase) -> None:
    """A case whose inputs cannot be materialised counts in ``merge.not_materialised`` alone."""
    from harness.kernels.numeric import materialise_merge

    try:
        inputs = materialise_merge(case)
    except Exception:
        tally.count("merge.not_materialised")
        return
    tally.count("merge.cases")
    tally.add("merge.dtype_head", f"{case.dtype}x{case.head_size}")
    with_context = inputs.prefill_tokens_with_context
    tokens = int(inputs.prefix_output.shape[0])
    if with_context is None:
        tally.bucket("merge.tokens_with_context", "none")
    else:
        label = "0" if with_context == 0 else ("all" if with_context >= tokens else "between")
        tally.bucket("merge.tokens_with_context", label)
    for lse in (inputs.prefix_lse, inputs.suffix_lse):
        tally.add("merge.lse_views", lse_view(lse))
    for values in (inputs.prefix_output, inputs.suffix_output):
        tally.add("merge.value_views", value_view(values))
    merged = tokens if with_context is None else min(with_context, tokens)
    # The prefix is read only for the merged tokens; the suffix for every token.
    read = {
        "prefix_output": inputs.prefix_output[:merged],
        "suffix_output": inputs.suffix_output,
        "prefix_lse": inputs.prefix_lse[:, :merged],
        "suffix_lse": inputs.suffix_lse,
    }
    for name, tensor in read.items():
        for special in _special_values(tensor):
            tally.add("merge.special_values", f"{name}:{special}")
    prefix, suffix = inputs.prefix_lse[:, :merged], inputs.suffix_lse[:, :merged]
    prefix_kind, suffix_kind = _lse_kind(prefix), _lse_kind(suffix)
    for p, p_label in enumerate(LSE_KINDS):
        for s, s_label in enumerate(LSE_KINDS):
            tally.bucket(
                "merge.lse_pairs", f"{p_label}/{s_label}", int(((prefix_kind == p) & (suffix_kind == s)).sum())
            )
    finite = (prefix_kind == 0) & (suffix_kind == 0)
    gaps = (prefix.double() - suffix.double()).abs()[finite]
    tally.bucket("merge.lse_gap", GAP_BANDS[0], int((gaps == 0).sum()))
    lower = 0.0
    for label, upper in zip(GAP_BANDS[1:], (*GAP_EDGES, math.inf), strict=True):
        inside = (gaps > lower) & (gaps <= upper) if upper != math.inf else gaps > lower
        tally.bucket("merge.lse_gap", label, int(inside.sum()))
        lower = upper


def measure(suite: Suite, oracle: Port) -> CoverageReport:
    """What ``suite`` exercises, per feature of :data:`FEATURES`: each
    registered level's measurement (its :class:`~harness.model.levels.CoverageHook`),
    in suite order (deterministic: the same suite and oracle give the same
    report). A refused input counts in its feature of :data:`REFUSAL_FEATURES`
    and in no other."""
    tally = Tally()
    for hook in coverage_hooks():
        hook.measure(tally, suite, oracle)
    return CoverageReport(suite.name, tally.finish())


def measure_layout(tally: Tally, suite: Suite, oracle: Port) -> None:
    """The layout level's features: every case's chunks as the oracle plans
    them, and every workspace configuration as it sizes it."""
    for case in suite.cases:
        try:
            chunks = oracle_chunks(oracle, case)
        except Exception:
            # What the case asks for is not what upstream was made to do.
            tally.count("layout.oracle_refused")
            continue
        tally.count("layout.cases")
        _measure_case(tally, case, chunks)
    for config in suite.workspace_configs:
        _measure_config(tally, oracle, config)


def measure_merges(tally: Tally, suite: Suite, oracle: Port) -> None:
    """The merge level's features: what each merge case's materialised tensors hold."""
    for merge_case in suite.merge_cases:
        _measure_merge(tally, merge_case)


def measure_prefills(tally: Tally, suite: Suite, oracle: Port) -> None:
    """The prefill level's features: each case with a numeric section over the
    oracle's chunks (a case the oracle cannot plan counts at the layout level
    alone)."""
    for case in suite.cases:
        if case.numeric is None:
            continue
        try:
            chunks = oracle_chunks(oracle, case)
        except Exception:
            continue
        _measure_prefill(tally, case, _pieces(chunks), chunks)
