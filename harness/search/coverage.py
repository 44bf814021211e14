"""Measured coverage: what a suite makes upstream do, per input feature, against
the targets in ``cases/coverage.json``.

:func:`measure` reads the loaded suite (:func:`harness.cases.suites.load_suite`):

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

Every feature has one kind (:data:`TARGET_KINDS` gives the target it takes):
``max`` and ``min`` (an int, ``None`` for a min over nothing), ``count``,
``set`` (a sorted list) and ``histogram`` (label -> count, every label present).

An input the oracle refused (a layout case it cannot plan, a configuration it
cannot size) or a merge case that cannot be materialised covers nothing: it
counts in its refusal feature (:data:`REFUSAL_FEATURES`) and in no other, and a
refusal fails the verdict (each refusal feature is held to ``at_most: 0``, by
its row or by the built-in rule when it has none).

:func:`load_targets` holds a suite's rows to every feature of :data:`FEATURES`:
each has a target or an explicit ``"report_only": true`` (shown, never judged),
so a partial targets file cannot pass as a complete one. :func:`judge` marks
each targeted feature met or MISSED; nothing is met by default.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cases.fields import CaseError
from harness.cases.suites import CASES_DIR, Suite
from harness.model import KEYLESS_ROWS, NUMERIC_DTYPES, Case, Chunk, MergeCase, WorkspaceConfig
from harness.protocol.port import Port
from harness.search.sparse_coverage import measure_sparse, sparse_features

TARGETS_FILE = CASES_DIR / "coverage.json"
REPO_ROOT = CASES_DIR.parent

# The integer widths a port may store a planner value in: a value at or past
# 2^k does not fit k unsigned bits.
WIDTHS = (8, 16, 31)

# The dense workspace size is capped at this many rows (SPEC 1b).
DENSE_CAP = 65536

Value = int | None | list[int] | list[str] | dict[str, int]

# Each feature kind takes these target keys in a row of the targets file.
TARGET_KINDS: dict[str, tuple[str, ...]] = {
    "max": ("at_least",),
    "min": ("at_most",),
    "count": ("count_at_least", "at_most"),
    "set": ("includes", "distinct_at_least"),
    "histogram": ("buckets_nonzero",),
}

INTERLEAVE_LABELS = ("1", "between", "equal", "above")
# Where exp(-gap) of the weaker side stops showing: bf16 keeps about 2^-8 (a gap
# of 5.5), fp16 2^-11 (7.6), fp32 2^-24 (16.6); fp32 exp() goes denormal past 87
# and to zero past 103.3.
GAP_BANDS = ("0", "(0,1]", "(1,6]", "(6,8]", "(8,17]", "(17,30]", "(30,87]", "(87,104]", ">104")
_GAP_EDGES = (1.0, 6.0, 8.0, 17.0, 30.0, 87.0, 104.0)
LSE_KINDS = ("finite", "+inf", "-inf")
LSE_PAIRS = tuple(f"{p}/{s}" for p in LSE_KINDS for s in LSE_KINDS)
MERGE_TENSORS = ("prefix_output", "suffix_output", "prefix_lse", "suffix_lse")
SPECIALS = ("-0.0", "denormal", "nan", "+inf", "-inf")
SPECIAL_VALUES = tuple(f"{t}:{s}" for t in MERGE_TENSORS for s in SPECIALS)
LSE_VIEWS = ("contiguous", "column-slice", "transposed", "other")
VALUE_VIEWS = ("contiguous", "head-dim-slice", "other")
WITH_CONTEXT_KINDS = ("none", "0", "between", "all")

# A row that shows a feature without judging it.
REPORT_ONLY = "report_only"


@dataclass(frozen=True)
class Feature:
    """One measured feature. ``element`` says what a set holds: ``int``,
    ``label`` (one of ``labels``) or ``text``; histograms always have ``labels``.
    ``widths``: a max reported against :data:`WIDTHS`."""

    id: str
    kind: str
    description: str
    element: str = "label"
    labels: tuple[str, ...] = ()
    widths: bool = False


def _f(id: str, kind: str, description: str, **extra: Any) -> Feature:
    return Feature(id, kind, description, **extra)


FEATURES: tuple[Feature, ...] = (
    _f("layout.cases", "count", "layout cases measured (the oracle planned them)"),
    _f("layout.oracle_refused", "count", "layout cases the oracle could not plan"),
    _f("layout.requests_per_batch", "max", "most requests in one batch", widths=True),
    _f("layout.requests_per_chunk", "max", "most requests in one oracle chunk", widths=True),
    _f("layout.chunks_over_255_requests", "count", "oracle chunks holding more than 255 requests"),
    _f("layout.chunks_1000_requests", "count", "oracle chunks holding 1000 requests or more"),
    _f("layout.pieces_per_request", "max", "most chunks one request is split over"),
    _f("layout.requests_in_3_pieces", "count", "requests split over 3 chunks or more"),
    _f("layout.max_start", "max", "largest chunk start (row offset into a request's context)", widths=True),
    _f("layout.max_context", "max", "largest context length", widths=True),
    _f("layout.max_cu_seq_len", "max", "largest cumulative offset in a chunk (cu_seq_lens, local too)", widths=True),
    _f("layout.max_query_offset", "max", "largest query token offset in a batch with context", widths=True),
    _f("layout.block_sizes", "set", "block sizes", element="int"),
    _f("layout.non_pow2_block_cases", "count", "cases whose block size is not a power of two"),
    _f("layout.dcp_worlds", "set", "DCP world sizes above 1", element="int"),
    _f("layout.dcp_pairs", "set", "DCP world x interleave pairs", element="text"),
    _f("layout.dcp_interleave_vs_block", "histogram", "DCP cases by interleave vs block", labels=INTERLEAVE_LABELS),
    _f("layout.alignment", "set", "chunk alignment to the block on/off", labels=("off", "on")),
    _f("layout.workspace_min", "min", "smallest workspace size"),
    _f("layout.workspace_max", "max", "largest workspace size", widths=True),
    _f("layout.non_pow2_workspace_cases", "count", "cases whose workspace size is not a power of two"),
    _f("layout.lcm_ne_max_cases", "count", "DCP cases where lcm(block, I*D) != max(block, I*D)"),
    _f("layout.padded_floor_ne_ceil_cases", "count", "DCP cases with a span boundary where floor != ceil in padded(n)"),
    _f("grid.configs", "count", "workspace-size configurations measured (the oracle sized them)"),
    _f("grid.oracle_refused", "count", "configurations the oracle could not size"),
    _f("grid.block_sizes", "set", "grid block sizes", element="int"),
    _f("grid.dcp_worlds", "set", "grid DCP world sizes", element="int"),
    _f("grid.interleaves", "set", "grid interleaves", element="int"),
    _f("grid.interleave_vs_block", "histogram", "DCP configurations by interleave vs block", labels=INTERLEAVE_LABELS),
    _f("grid.max_intermediate", "max", "largest of 8*max_model_len, 4*max_num_seqs*block_size", widths=True),
    _f("grid.lcm_ne_max_configs", "count", "DCP configurations where lcm(block, I*D) != max(block, I*D)"),
    _f("grid.round_cap_differ_configs", "count", "configurations where round-then-cap != cap-then-round"),
    _f("grid.workspace_min", "min", "smallest workspace size the oracle gives"),
    _f("grid.workspace_max", "max", "largest workspace size the oracle gives", widths=True),
    _f("grid.non_pow2_workspaces", "count", "oracle workspace sizes that are not a power of two"),
    _f("merge.cases", "count", "merge cases measured (their inputs were materialised)"),
    _f("merge.not_materialised", "count", "merge cases whose inputs could not be materialised"),
    _f("merge.lse_gap", "histogram", "merged finite LSE pairs by |lp - ls|", labels=GAP_BANDS),
    _f("merge.lse_pairs", "histogram", "merged (prefix, suffix) LSE pairs by kind", labels=LSE_PAIRS),
    _f("merge.special_values", "set", "-0.0, denormal, NaN, +inf, -inf per input tensor", labels=SPECIAL_VALUES),
    _f("merge.lse_views", "set", "LSE views, from their strides", labels=LSE_VIEWS),
    _f("merge.value_views", "set", "partials' views, from their strides", labels=VALUE_VIEWS),
    _f("merge.dtype_head", "set", "dtype x head size", element="text"),
    _f("merge.tokens_with_context", "histogram", "prefill_tokens_with_context", labels=WITH_CONTEXT_KINDS),
    _f("prefill.cases", "count", "L3 cases measured"),
    _f("prefill.requests_per_batch", "max", "most requests in one L3 case", widths=True),
    _f("prefill.pieces_per_request", "max", "most chunks one L3 request is split over"),
    _f("prefill.requests_in_3_pieces", "count", "L3 requests split over 3 chunks or more"),
    _f("prefill.max_query_tokens", "max", "most query tokens in one L3 case", widths=True),
    _f("prefill.dtypes", "set", "L3 dtypes", labels=NUMERIC_DTYPES),
    _f("prefill.keyless_rows", "set", "keyless-row behaviours on L3 cases with keyless rows", labels=KEYLESS_ROWS),
    _f("prefill.block_sizes", "set", "L3 block sizes", element="int"),
    _f("prefill.non_pow2_block_cases", "count", "L3 cases whose block size is not a power of two"),
    _f("prefill.dcp_cases", "count", "DCP L3 cases (per-rank caches, the all-gather and the reorder)"),
    _f("prefill.dcp_worlds", "set", "DCP world sizes at L3", element="int"),
    _f("prefill.dcp_interleaves", "set", "DCP interleaves at L3", element="int"),
    _f("prefill.dcp_dtypes", "set", "dtypes of DCP L3 cases", labels=NUMERIC_DTYPES),
    _f("prefill.dcp_continuations", "count", "DCP L3 chunks that continue a request (local starts past 0)"),
    _f("prefill.dcp_padded_segments", "count", "DCP L3 (chunk, request, rank) segments with padding to drop"),
    # The sparse path (harness/search/sparse_coverage.py).
    *sparse_features(_f),
)
FEATURE_BY_ID = {f.id: f for f in FEATURES}

# The inputs that cover nothing: any count above zero fails the verdict.
REFUSAL_FEATURES = (
    "layout.oracle_refused",
    "grid.oracle_refused",
    "merge.not_materialised",
    "sparse.oracle_refused",
    "sparse_grid.oracle_refused",
)
REFUSAL_RULE = "built-in: a refused input covers nothing, so any refusal fails coverage"


@dataclass(frozen=True)
class CoverageReport:
    """Measured value of every feature of :data:`FEATURES`, for one suite."""

    suite: str
    values: dict[str, Value]


# -- measuring ---------------------------------------------------------------------------------


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


def beyond(value: int) -> list[str]:
    """The widths of :data:`WIDTHS` that ``value`` does not fit (as unsigned)."""
    return [f"2^{bits}" for bits in WIDTHS if value >= 1 << bits]


class _Tally:
    """Every feature at its empty value, updated in place."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        for feature in FEATURES:
            empty: Any = {"max": 0, "min": None, "count": 0, "set": set()}.get(feature.kind)
            self.values[feature.id] = dict.fromkeys(feature.labels, 0) if feature.kind == "histogram" else empty

    def most(self, feature: str, value: int) -> None:
        self.values[feature] = max(self.values[feature], value)

    def least(self, feature: str, value: int) -> None:
        current = self.values[feature]
        self.values[feature] = value if current is None else min(current, value)

    def count(self, feature: str, n: int = 1) -> None:
        self.values[feature] += n

    def add(self, feature: str, item: int | str) -> None:
        self.values[feature].add(item)

    def bucket(self, feature: str, label: str, n: int = 1) -> None:
        self.values[feature][label] += n

    def finish(self) -> dict[str, Value]:
        return {k: sorted(v) if isinstance(v, set) else v for k, v in self.values.items()}


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
    the oracle offers it (the same plans the metadata builder makes), the whole
    layout otherwise."""
    plan = getattr(oracle, "upstream_plan", None)
    if case.dcp_world_size == 1 and callable(plan):
        return [_Chunk(p.request_start, p.request_end, tuple(p.starts), tuple(p.seq_lens), None) for p in plan(case)]
    return [
        _Chunk(
            c.request_start,
            c.request_end,
            c.starts,
            c.seq_lens,
            c.padded_local_cu_seq_lens[-1] if c.padded_local_cu_seq_lens else None,
            c if case.dcp_world_size > 1 else None,
        )
        for c in oracle.plan_layout(case).chunks
    ]


def _pieces(chunks: list[_Chunk]) -> Counter[int]:
    pieces: Counter[int] = Counter()
    for chunk in chunks:
        pieces.update(range(chunk.request_start, chunk.request_end))
    return pieces


def _measure_case(tally: _Tally, case: Case, chunks: list[_Chunk]) -> None:
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
    if case.numeric is not None:
        _measure_prefill(tally, case, pieces, chunks)


def _measure_prefill(tally: _Tally, case: Case, pieces: Counter[int], chunks: list[_Chunk]) -> None:
    from harness.cases.generate import legacy_grid_has_keyless_rows

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


def _measure_dcp_prefill(tally: _Tally, case: Case, chunks: list[Chunk]) -> None:
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


def _measure_config(tally: _Tally, oracle: Port, config: WorkspaceConfig) -> None:
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


def _measure_merge(tally: _Tally, case: MergeCase) -> None:
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
    for label, upper in zip(GAP_BANDS[1:], (*_GAP_EDGES, math.inf), strict=True):
        inside = (gaps > lower) & (gaps <= upper) if upper != math.inf else gaps > lower
        tally.bucket("merge.lse_gap", label, int(inside.sum()))
        lower = upper


def measure(suite: Suite, oracle: Port) -> CoverageReport:
    """What ``suite`` exercises, per feature of :data:`FEATURES` (deterministic:
    the same suite and oracle give the same report). A refused input counts in
    its feature of :data:`REFUSAL_FEATURES` and in no other."""
    tally = _Tally()
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
    for merge_case in suite.merge_cases:
        _measure_merge(tally, merge_case)
    measure_sparse(tally, suite, oracle)
    return CoverageReport(suite.name, tally.finish())


# -- targets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One row of the targets file: ``kind`` is a key of :data:`TARGET_KINDS`'s
    values, ``value`` an int or a list of ints or labels; or ``kind``
    :data:`REPORT_ONLY` (``value`` True): the feature is shown, never judged."""

    feature: str
    description: str
    kind: str
    value: int | list[int] | list[str]

    @property
    def report_only(self) -> bool:
        return self.kind == REPORT_ONLY

    def missing(self, measured: Value) -> list[Any] | None:
        """What ``measured`` lacks to meet this target (empty: met); None for the
        scalar targets, which are met or not."""
        if not isinstance(self.value, list):
            return None
        if self.kind == "includes":
            have: set[Any] = set(measured) if isinstance(measured, list) else set()
            return [v for v in self.value if v not in have]
        counts = measured if isinstance(measured, dict) else {}
        return [v for v in self.value if counts.get(str(v), 0) == 0]

    def met_by(self, measured: Value) -> bool:
        """Whether ``measured`` meets this target (a report-only row meets nothing)."""
        if self.report_only:
            return False
        missing = self.missing(measured)
        if missing is not None:
            return not missing
        assert isinstance(self.value, int)
        if self.kind == "at_most":
            return isinstance(measured, int) and measured <= self.value
        if self.kind == "distinct_at_least":
            return isinstance(measured, list) and len(measured) >= self.value
        return isinstance(measured, int) and measured >= self.value

    def describe(self) -> str:
        if self.report_only:
            return "-"
        symbol = {"at_least": ">=", "at_most": "<=", "count_at_least": ">=", "distinct_at_least": ">= distinct"}
        if isinstance(self.value, int):
            return f"{symbol[self.kind]} {self.value}"
        items = ", ".join(map(str, self.value))
        return f"includes {items}" if self.kind == "includes" else f"nonzero {items}"

    def to_json(self) -> dict[str, Any]:
        return {self.kind: self.value}


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _target_value(source: str, where: str, feature: Feature, kind: str, value: Any) -> int | list[int] | list[str]:
    if kind in ("at_least", "at_most", "count_at_least", "distinct_at_least"):
        least = 0 if kind == "at_most" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise CaseError(source, where, f"must be an integer >= {least}, got {json.dumps(value)}")
        return value
    if not isinstance(value, list) or not value:
        raise CaseError(source, where, f"must be a non-empty list, got {json.dumps(value)}")
    if len(set(map(json.dumps, value))) != len(value):
        raise CaseError(source, where, "lists an item twice")
    if feature.element == "int":
        bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise CaseError(source, where, f"items must be integers >= 1, got {json.dumps(bad[0])}")
        return [int(v) for v in value]
    bad = [v for v in value if not isinstance(v, str) or not v]
    if bad:
        raise CaseError(source, where, f"items must be non-empty strings, got {json.dumps(bad[0])}")
    if feature.labels:
        unknown = [v for v in value if v not in feature.labels]
        if unknown:
            raise CaseError(source, where, f"unknown label {unknown[0]!r} (known: {', '.join(feature.labels)})")
    return [str(v) for v in value]


def _row(source: str, where: str, row: Any, seen: set[str]) -> Target:
    if not isinstance(row, dict):
        raise CaseError(
            source, where, 'a row must be an object with feature, description and one target (or "report_only": true)'
        )
    feature_id = row.get("feature")
    if not isinstance(feature_id, str) or feature_id not in FEATURE_BY_ID:
        raise CaseError(
            source,
            f"{where}.feature",
            f"unknown feature {json.dumps(feature_id)} (see FEATURES in harness/search/coverage.py)",
        )
    if feature_id in seen:
        raise CaseError(source, f"{where}.feature", f"{feature_id} has a row already")
    seen.add(feature_id)
    feature = FEATURE_BY_ID[feature_id]
    description = row.get("description")
    if not isinstance(description, str) or not description.strip():
        raise CaseError(source, f"{where}.description", f"{feature_id}: must be a non-empty string")
    refusal = feature_id in REFUSAL_FEATURES
    allowed = ("at_most",) if refusal else (*TARGET_KINDS[feature.kind], REPORT_ONLY)
    kinds = [k for k in row if k not in ("feature", "description")]
    unknown = [k for k in kinds if k not in allowed]
    if unknown or len(kinds) != 1:
        field_name = f"{where}.{unknown[0]}" if unknown else where
        raise CaseError(
            source, field_name, f"{feature_id} ({feature.kind}) takes exactly one target of: {', '.join(allowed)}"
        )
    kind = kinds[0]
    if kind == REPORT_ONLY:
        if row[kind] is not True:
            raise CaseError(source, f"{where}.{kind}", f"must be true, got {json.dumps(row[kind])}")
        return Target(feature_id, description.strip(), kind, True)
    value = _target_value(source, f"{where}.{kind}", feature, kind, row[kind])
    if refusal and value != 0:
        # A refused input covers nothing: one is already too many.
        raise CaseError(source, f"{where}.{kind}", f"{feature_id} counts refused inputs: its target is at_most 0")
    return Target(feature_id, description.strip(), kind, value)


def load_targets(path: Path = TARGETS_FILE, suites: Collection[str] | None = None) -> dict[str, tuple[Target, ...]]:
    """The targets file: ``{suite: [row, ...]}``, or ``{suite: {"same_as": other}}``
    for a suite held to another's rows. A row is ``{"feature": id, "description":
    text, <target>: value}`` with one target of :data:`TARGET_KINDS` for the
    feature's kind, or ``"report_only": true`` (the description says why it is
    not a target); a refusal feature (:data:`REFUSAL_FEATURES`) takes
    ``"at_most": 0`` alone. Every suite with rows has one for every feature of
    :data:`FEATURES`. ``suites``: the known suite names, checked when given.
    Anything wrong is a :class:`CaseError` naming the file, the row and field
    (or the suite and the feature without a row)."""
    source = display_path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(source, None, f"cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CaseError(source, None, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CaseError(source, None, "must be an object mapping suite names to rows")
    targets: dict[str, tuple[Target, ...]] = {}
    aliases: dict[str, str] = {}
    for suite, rows in data.items():
        if suites is not None and suite not in suites:
            raise CaseError(source, suite, f"no suite named {suite!r} (known: {', '.join(sorted(suites))})")
        if isinstance(rows, dict) and set(rows) == {"same_as"} and isinstance(rows["same_as"], str):
            aliases[suite] = rows["same_as"]
            continue
        if not isinstance(rows, list) or not rows:
            raise CaseError(source, suite, 'must be a non-empty list of rows, or {"same_as": "<suite>"}')
        seen: set[str] = set()
        targets[suite] = tuple(_row(source, f"{suite}[{i}]", row, seen) for i, row in enumerate(rows))
        without_row = [f.id for f in FEATURES if f.id not in seen]
        if without_row:
            raise CaseError(
                source,
                None,
                f'suite {suite!r}: feature {without_row[0]!r} has no row (give a target or "{REPORT_ONLY}": true)',
            )
    for suite, other in aliases.items():
        if other not in targets:
            raise CaseError(source, f"{suite}.same_as", f"{other!r} is not a suite with rows in this file")
        targets[suite] = targets[other]
    return targets


# -- verdicts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    feature: str
    description: str
    measured: Value
    target: Target | None = None
    met: bool | None = None  # None: no row, or a report-only row
    missing: list[Any] | None = None
    builtin: bool = False  # judged by the refusal rule, not by a row of the file


@dataclass(frozen=True)
class JudgedCoverage:
    """A suite's coverage against its targets; :meth:`to_json` is deterministic."""

    suite: str
    targets_file: str
    verdicts: tuple[Verdict, ...] = field(default=())

    @property
    def targets(self) -> int:
        return sum(v.met is not None for v in self.verdicts)

    @property
    def rows(self) -> int:
        """The verdicts that come from rows of the targets file (report-only ones too)."""
        return sum(v.target is not None and not v.builtin for v in self.verdicts)

    @property
    def missed(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.met is False]

    def to_json(self) -> dict[str, Any]:
        features = []
        for v in sorted(self.verdicts, key=lambda v: v.feature):
            row: dict[str, Any] = {
                "feature": v.feature,
                "description": v.description,
                "measured": v.measured,
                "target": v.target.to_json() if v.target else None,
                "verdict": verdict_word(v),
            }
            if v.builtin:
                row["builtin"] = True
            feature = FEATURE_BY_ID.get(v.feature)
            if feature is not None and feature.widths and isinstance(v.measured, int):
                row["beyond"] = beyond(v.measured)
            if v.missing:
                row["missing"] = v.missing
            features.append(row)
        return {
            "suite": self.suite,
            "targets_file": self.targets_file,
            "targets": self.targets,
            "met": self.targets - len(self.missed),
            "missed": len(self.missed),
            "features": features,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JudgedCoverage:
        verdicts = []
        for row in data["features"]:
            target = None
            if row["target"]:
                ((kind, value),) = row["target"].items()
                target = Target(row["feature"], row["description"], kind, value)
            met = {"met": True, "MISSED": False}.get(row["verdict"])
            verdicts.append(
                Verdict(
                    row["feature"],
                    row["description"],
                    row["measured"],
                    target,
                    met,
                    row.get("missing"),
                    bool(row.get("builtin", False)),
                )
            )
        order = {f.id: i for i, f in enumerate(FEATURES)}
        verdicts.sort(key=lambda v: order.get(v.feature, len(order)))
        return cls(data["suite"], data["targets_file"], tuple(verdicts))


def verdict_word(verdict: Verdict) -> str | None:
    if verdict.met is None:
        return "report only" if verdict.target is not None and verdict.target.report_only else None
    return "met" if verdict.met else "MISSED"


def judge(
    report: CoverageReport, targets: Sequence[Target], targets_file: str = "cases/coverage.json"
) -> JudgedCoverage:
    """Each feature of ``report`` with its target row, if any, met or MISSED; a
    report-only row is shown, not judged. A refusal feature without an
    ``at_most: 0`` row is judged by the built-in rule (:data:`REFUSAL_RULE`),
    so a refusal is MISSED whatever rows are given."""
    by_feature = {t.feature: t for t in targets}
    verdicts = []
    for feature in FEATURES:
        measured = report.values[feature.id]
        target = by_feature.get(feature.id)
        builtin = feature.id in REFUSAL_FEATURES and (target is None or (target.kind, target.value) != ("at_most", 0))
        if builtin:
            target = Target(feature.id, REFUSAL_RULE, "at_most", 0)
        if target is None:
            verdicts.append(Verdict(feature.id, feature.description, measured))
            continue
        if target.report_only:
            verdicts.append(Verdict(feature.id, target.description, measured, target))
            continue
        missing = target.missing(measured)
        verdicts.append(
            Verdict(feature.id, target.description, measured, target, target.met_by(measured), missing or None, builtin)
        )
    return JudgedCoverage(report.suite, targets_file, tuple(verdicts))


def nightly_coverage(suite: Suite, oracle: Port, path: Path = TARGETS_FILE) -> JudgedCoverage:
    """The coverage of the night's suite, judged against its rows when the
    targets file has some (none: every feature shown, only refusals judged)."""
    targets = load_targets(path)
    return judge(measure(suite, oracle), targets.get(suite.name, ()), display_path(path))


def write_json(judged: JudgedCoverage, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(judged.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
