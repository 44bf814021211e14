"""The coverage features: what is measured of a suite (:data:`FEATURES`), the
kinds of value a feature takes, and the tally that collects them
(:class:`Tally`) into a :class:`CoverageReport`.

Coverage is what a suite makes upstream do, per input feature, against the
targets in ``cases/coverage.json``. The parts, each its own module:

* this module: the feature catalogue, with the sparse path's features from
  :mod:`harness.search.sparse_coverage`;
* :mod:`harness.search.coverage_measuring`: measuring a suite
  (:func:`~harness.search.coverage_measuring.measure`); the sparse items are
  measured by :mod:`harness.search.sparse_coverage`;
* :mod:`harness.search.coverage_targets`: the targets file
  (:func:`~harness.search.coverage_targets.load_targets`);
* :mod:`harness.search.coverage_verdicts`: judging a report against its targets
  (:func:`~harness.search.coverage_verdicts.judge`).

Invariants:

* One kind per feature. Every feature has one kind
  (:data:`harness.search.coverage_targets.TARGET_KINDS` gives the targets it
  takes): ``max`` and ``min`` (an int, ``None`` for a min over nothing),
  ``count``, ``set`` (a sorted list) and ``histogram`` (label -> count, every
  label present). :class:`Tally` starts each at its empty value and
  :meth:`Tally.finish` gives them in that form.
* Every feature is held to. Ids are unique (:data:`FEATURE_BY_ID`), and every
  suite with rows in the targets file has one for every feature here, so a
  feature added here needs a row there.
* Refusals cover nothing. An input the oracle refused (a layout case it cannot
  plan, a configuration it cannot size) or a merge case that cannot be
  materialised counts in its refusal feature (:data:`REFUSAL_FEATURES`) and in no
  other, and a refusal fails the verdict (each refusal feature is held to
  ``at_most: 0``, by its row or by the built-in rule when it has none).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from harness.model import KEYLESS_ROWS, NUMERIC_DTYPES
from harness.model.levels import CoverageHook, LevelRegistryError, Names, registered_levels
from harness.search.coverage_feature import Feature
from harness.search.sparse_coverage import sparse_features

# The integer widths a port may store a planner value in: a value at or past
# 2^k does not fit k unsigned bits.
WIDTHS = (8, 16, 31)

Value = int | None | list[int] | list[str] | dict[str, int]

INTERLEAVE_LABELS = ("1", "between", "equal", "above")
# Where exp(-gap) of the weaker side stops showing: bf16 keeps about 2^-8 (a gap
# of 5.5), fp16 2^-11 (7.6), fp32 2^-24 (16.6); fp32 exp() goes denormal past 87
# and to zero past 103.3.
GAP_BANDS = ("0", "(0,1]", "(1,6]", "(6,8]", "(8,17]", "(17,30]", "(30,87]", "(87,104]", ">104")
GAP_EDGES = (1.0, 6.0, 8.0, 17.0, 30.0, 87.0, 104.0)
LSE_KINDS = ("finite", "+inf", "-inf")
LSE_PAIRS = tuple(f"{p}/{s}" for p in LSE_KINDS for s in LSE_KINDS)
MERGE_TENSORS = ("prefix_output", "suffix_output", "prefix_lse", "suffix_lse")
SPECIALS = ("-0.0", "denormal", "nan", "+inf", "-inf")
SPECIAL_VALUES = tuple(f"{t}:{s}" for t in MERGE_TENSORS for s in SPECIALS)
LSE_VIEWS = ("contiguous", "column-slice", "transposed", "other")
VALUE_VIEWS = ("contiguous", "head-dim-slice", "other")
WITH_CONTEXT_KINDS = ("none", "0", "between", "all")


def _f(id: str, kind: str, description: str, **extra: Any) -> Feature:
    return Feature(id, kind, description, **extra)


# The built-in levels' features, each level's by its coverage hook (harness/levels/).
LAYOUT_FEATURES: tuple[Feature, ...] = (
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
)
GRID_FEATURES: tuple[Feature, ...] = (
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
)
MERGE_FEATURES: tuple[Feature, ...] = (
    _f("merge.cases", "count", "merge cases measured (their inputs were materialised)"),
    _f("merge.not_materialised", "count", "merge cases whose inputs could not be materialised"),
    _f("merge.lse_gap", "histogram", "merged finite LSE pairs by |lp - ls|", labels=GAP_BANDS),
    _f("merge.lse_pairs", "histogram", "merged (prefix, suffix) LSE pairs by kind", labels=LSE_PAIRS),
    _f("merge.special_values", "set", "-0.0, denormal, NaN, +inf, -inf per input tensor", labels=SPECIAL_VALUES),
    _f("merge.lse_views", "set", "LSE views, from their strides", labels=LSE_VIEWS),
    _f("merge.value_views", "set", "partials' views, from their strides", labels=VALUE_VIEWS),
    _f("merge.dtype_head", "set", "dtype x head size", element="text"),
    _f("merge.tokens_with_context", "histogram", "prefill_tokens_with_context", labels=WITH_CONTEXT_KINDS),
)
PREFILL_FEATURES: tuple[Feature, ...] = (
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
)
# The sparse path (harness/search/sparse_coverage.py).
SPARSE_FEATURES: tuple[Feature, ...] = sparse_features(_f)


def coverage_hooks() -> list[CoverageHook]:
    """Every registered level's coverage hook, in suite order."""
    return [spec.coverage for spec in registered_levels() if spec.coverage is not None]


def _catalogue() -> tuple[Feature, ...]:
    """Every registered level's features, in suite order; a feature id two
    levels declare is the registry's error, never a tally shared unseen."""
    features = tuple(feature for hook in coverage_hooks() for feature in hook.features())
    ids = [f.id for f in features]
    repeated = [i for n, i in enumerate(ids) if i in ids[:n]]
    if repeated:
        raise LevelRegistryError(f"coverage feature {repeated[0]!r} is declared by two levels")
    for hook in coverage_hooks():
        # A refusal is held to at_most 0 by its id: one the hook does not measure would hold nothing.
        counts = {f.id for f in hook.features() if f.kind == "count"}
        stray = [r for r in hook.refusals if r not in counts]
        if stray:
            raise LevelRegistryError(f"coverage refusal {stray[0]!r} is none of its level's count features")
    return features


class _Features(Sequence[Feature]):
    """:data:`FEATURES`: the catalogue read from the registry on every use."""

    @overload
    def __getitem__(self, index: int) -> Feature: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Feature]: ...
    def __getitem__(self, index: int | slice) -> Feature | Sequence[Feature]:
        return _catalogue()[index]

    def __len__(self) -> int:
        return len(_catalogue())


class _ById(Mapping[str, Feature]):
    """:data:`FEATURE_BY_ID`: each feature by its id, read as :data:`FEATURES` is."""

    def __getitem__(self, feature_id: str) -> Feature:
        return {f.id: f for f in _catalogue()}[feature_id]

    def __iter__(self) -> Iterator[str]:
        return iter([f.id for f in _catalogue()])

    def __len__(self) -> int:
        return len(_catalogue())


def needs_row(feature_id: str) -> bool:
    """Whether a targets file's suite must have a row for ``feature_id`` (its level's hook is ``held``)."""
    return any(feature_id in {f.id for f in hook.features()} for hook in coverage_hooks() if hook.held)


# What is measured: every registered level's features (CoverageHook), in suite order.
FEATURES: Sequence[Feature] = _Features()
FEATURE_BY_ID: Mapping[str, Feature] = _ById()
# The inputs that cover nothing: any count above zero fails the verdict.
REFUSAL_FEATURES: Sequence[str] = Names(lambda: (feature for hook in coverage_hooks() for feature in hook.refusals))


@dataclass(frozen=True)
class CoverageReport:
    """Measured value of every feature of :data:`FEATURES`, for one suite."""

    suite: str
    values: dict[str, Value]


def beyond(value: int) -> list[str]:
    """The widths of :data:`WIDTHS` that ``value`` does not fit (as unsigned)."""
    return [f"2^{bits}" for bits in WIDTHS if value >= 1 << bits]


class Tally:
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
