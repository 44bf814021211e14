"""The input space of ``parity explore``: hypothesis strategies that draw items
from the case model's own validity rules, and the properties searched over them.

The fixed suites draw cases from named families; a bug that lives where no family
goes passes them all. These strategies draw instead from the rules of
:mod:`harness.cases.files`: any block size, any workspace of at least one
alignment unit, DCP world sizes with the interleaves the engine accepts, alignment
on and off, zero contexts anywhere, lengths around the integer-width boundaries,
batches of one to thousands of requests.

Properties (:func:`properties`: one per registered kind with a strategy, ``KindSpec.strategy``): ``layout``
checks layout cases and, as a second property, workspace configurations;
``merge`` checks merge (L2) inputs; ``prefill`` checks small numeric (L3) cases
without DCP. A property's name is the runner kind its items are compared at.

Invariants:

* Valid by construction. Every layout or prefill case drawn goes through
  :func:`~harness.cases.files.case_from_json` on its way out; a
  :class:`~harness.cases.fields.CaseError` there is a harness fault (the run ends
  as an error), never a find.
* Shrinkable. A draw whose bounds depend on earlier draws is clipped from a fixed
  range (:func:`clip`), and a value near a width boundary is a base plus an
  offset whose base shrinks to 0 first, so hypothesis's shrinker keeps making
  progress.
* The draws are the encoding. Hypothesis replays and shrinks the sequence of
  choices these strategies make: changing what is drawn, or in which order,
  changes every seeded search and what the example databases replay.
* Built once. Strategies are module constants (or cached, :func:`interleaves`):
  building one per draw costs more than the draw.
* Merge fields. A :class:`~harness.model.MergeCase` field without an entry in
  :data:`MERGE_FIELDS` keeps its default, and the run says so
  (:func:`merge_fields_at_default`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hypothesis import reject
from hypothesis import strategies as st

from harness.cases.fields import LIMITS
from harness.cases.files import case_from_json
from harness.model import (
    KEYLESS_ROWS,
    MERGE_LSE_VIEWS,
    MERGE_PATTERNS,
    MERGE_VALUE_VIEWS,
    NUMERIC_DTYPES,
    Case,
    MergeCase,
    NumericSpec,
    WorkspaceConfig,
    alignment_unit,
)
from harness.model.case_fields import Declared, FieldKind, declared_fields
from harness.model.levels import registered_levels

if TYPE_CHECKING:
    from hypothesis.strategies import DrawFn, SearchStrategy

# Boundaries of the integer widths a port may store a value in (signed and
# unsigned 8 and 16 bits): lengths, counts and offsets are drawn near them as well
# as small and anywhere, so hypothesis reaches both sides of each.
WIDTH_BOUNDARIES = (1 << 7, 1 << 8, 1 << 15, 1 << 16)
# Block sizes real deployments use, the non-powers of two of hybrid attention and
# state-space models among them.
REALISTIC_BLOCK_SIZES = (16, 32, 64, 128, 256, 528, 544, 1056)
# Batch shape: up to MAX_RUNS runs of identical requests, of up to about
# RUN_REQUESTS requests each (rarely 2^16: :data:`HUGE_RUN_ODDS`), at most
# MAX_CONTEXT_ROWS context rows in all, and no more rows than
# CHUNKS_WORTH workspaces hold: an example's cost grows with its chunks (about
# 0.3 ms each on the oracle), so one costs tens of milliseconds while contexts
# and starts still pass 2^16 and batches reach thousands of requests.
MAX_RUNS = 8
RUN_REQUESTS = 1024
MAX_CONTEXT_ROWS = 1 << 18
CHUNKS_WORTH = 16
# The oracle holds token offsets in int32.
MAX_QUERY_TOKENS = (1 << 31) - 1


def near(value: int, spread: int = 2) -> SearchStrategy[int]:
    return st.integers(value - spread, value + spread)


def near_widths() -> list[SearchStrategy[int]]:
    return [near(boundary) for boundary in WIDTH_BOUNDARIES]


def clip(value: int, lo: int, hi: int) -> int:
    """``value`` clipped to ``[lo, hi]``.

    The bounds of one draw depend on earlier draws (what is left of the batch, the
    alignment unit); clipping a draw from fixed ranges, rather than drawing from
    ranges that move, keeps each choice's meaning fixed while hypothesis shrinks
    the earlier ones, so the shrinker can keep making progress.
    """
    return min(hi, max(lo, value))


# Strategies are built once: building one per draw costs more than the draw.
BLOCK_SIZES: SearchStrategy[int] = st.one_of(
    st.integers(1, 64), st.sampled_from(REALISTIC_BLOCK_SIZES), st.integers(1, LIMITS["block_size"])
)
DCP_WORLD_SIZES: SearchStrategy[int] = st.one_of(
    st.just(1), st.integers(2, 8), st.integers(2, LIMITS["dcp_world_size"])
)
WORKSPACE_UNITS: SearchStrategy[int] = st.one_of(
    st.just(1), st.integers(1, 8), st.integers(1, 64), st.integers(1, LIMITS["workspace_size"])
)
WORKSPACE_EXTRA_ROWS: SearchStrategy[int] = st.one_of(st.just(0), st.integers(1, LIMITS["workspace_size"]))
# About 2^16 rows, the engine's usual cap, one time in four.
WORKSPACE_NEAR_2_16: SearchStrategy[int | None] = st.one_of(st.none(), st.none(), st.none(), near(1 << 16, 64))


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@functools.cache
def interleaves(block_size: int) -> SearchStrategy[int]:
    """The engine accepts an interleave that divides the block size (vLLM's
    VllmConfig asserts it); 1 first, so shrinking goes there."""
    return st.sampled_from(divisors(block_size))


def draw_workspace(draw: DrawFn, unit: int) -> int:
    """Any workspace of at least one alignment unit: one unit, a few, many, or
    about 2^16 rows, maybe plus a part of a unit."""
    top = LIMITS["workspace_size"]
    rows = draw(WORKSPACE_UNITS) * unit + draw(WORKSPACE_EXTRA_ROWS) % unit
    around = draw(WORKSPACE_NEAR_2_16)
    return min(max(rows if around is None else around, unit), top // unit * unit)


@dataclass(frozen=True)
class Geometry:
    """A case's block size, workspace, DCP world and interleave, and alignment flag."""

    block_size: int
    workspace_size: int
    dcp_world_size: int
    interleave: int
    align_to_block: bool

    @property
    def unit(self) -> int:
        return alignment_unit(self.block_size, self.dcp_world_size, self.interleave, self.align_to_block)


SMALL_BLOCK_SIZES: SearchStrategy[int] = st.integers(1, 32)
SMALL_WORKSPACE_UNITS: SearchStrategy[int] = st.integers(1, 8)
SMALL_WORKSPACE_EXTRA_ROWS: SearchStrategy[int] = st.integers(0, 64)


def draw_geometry(draw: DrawFn, dcp: bool = True, small: bool = False) -> Geometry:
    block = draw(SMALL_BLOCK_SIZES if small else BLOCK_SIZES)
    align = draw(st.booleans())
    world = draw(DCP_WORLD_SIZES) if dcp else 1
    interleave = draw(interleaves(block)) if world > 1 else 1
    unit = alignment_unit(block, world, interleave, align)
    if small:
        workspace = unit * draw(SMALL_WORKSPACE_UNITS) + draw(SMALL_WORKSPACE_EXTRA_ROWS) % unit
    else:
        workspace = draw_workspace(draw, unit)
    return Geometry(block, workspace, world, interleave, align)


# Values near a width boundary are drawn as a base below the boundary plus an
# offset that straddles it, and the base's first choice is 0: shrinking the base
# to 0 keeps the offset, so such a value becomes a small one in one step of the
# shrinker (separate ranges near each boundary would trap it there).


def boundary_bases(below: int) -> tuple[SearchStrategy[int], ...]:
    return tuple(st.just(b - below) for b in WIDTH_BOUNDARIES)


# A run's count: a base plus an offset, and one run in HUGE_RUN_ODDS (where
# shrinking does not go) of about 2^15 or 2^16 requests instead of the base, for
# request indices past 16 bits; such a run costs about a second to compare.
HUGE_RUN_ODDS = 512
RUN_COUNTS: SearchStrategy[tuple[int, int, int, int]] = st.tuples(
    st.one_of(st.just(0), *boundary_bases(8)[:2], st.integers(0, RUN_REQUESTS)),
    # A single request half the time the base is 0: the shape most finds shrink to.
    st.one_of(st.just(1), st.integers(1, 16)),
    st.integers(0, HUGE_RUN_ODDS - 1),
    st.one_of(*boundary_bases(8)[2:]),
)


def run_count(drawn: tuple[int, int, int, int]) -> int:
    base, offset, odds, huge = drawn
    return (huge if odds == HUGE_RUN_ODDS - 1 else base) + offset


RUN_QUERIES: SearchStrategy[int] = st.builds(
    operator.add,
    st.one_of(st.just(0), *boundary_bases(16), st.integers(0, LIMITS["query_len"])),
    st.integers(1, 32),
)


@dataclass(frozen=True)
class AroundWorkspace:
    """``m`` workspaces plus ``units`` alignment units plus ``rows - 32`` rows."""

    m: int
    units: int


@dataclass(frozen=True)
class AroundBoundary:
    """A width boundary plus ``delta`` rows (a few either side)."""

    boundary: int
    delta: int


# A context: (present, base, rows); present 0 (one time in six, and where
# shrinking goes) means no context. The base is 0 (the context is ``rows``); a
# relation to the workspace, listed first after 0 so that shrinking prefers it
# (as hypothesis shrinks the geometry, such a context keeps its relation to the
# workspace, and so the split it causes; with a workspace of about 2^16 it passes
# 2^16 rows); a few rows either side of a width boundary; or anything.
RUN_CONTEXTS: SearchStrategy[tuple[int, int | AroundWorkspace | AroundBoundary, int]] = st.tuples(
    st.integers(0, 5),
    st.one_of(
        st.just(0),
        st.builds(AroundWorkspace, st.integers(0, 3), st.integers(-1, 2)),
        st.builds(AroundBoundary, st.sampled_from(WIDTH_BOUNDARIES), st.integers(-4, 3)),
        st.integers(0, MAX_CONTEXT_ROWS),
    ),
    st.integers(0, 64),
)


RUNS_PER_BATCH: SearchStrategy[int] = st.one_of(st.integers(1, 3), st.integers(1, MAX_RUNS))


def context_rows(drawn: tuple[int, int | AroundWorkspace | AroundBoundary, int], geometry: Geometry) -> int:
    present, base, rows = drawn
    if not present:
        return 0
    if isinstance(base, AroundWorkspace):
        return base.m * geometry.workspace_size + base.units * geometry.unit + rows - 32
    if isinstance(base, AroundBoundary):
        return base.boundary + base.delta
    return base + rows


def draw_runs(draw: DrawFn, geometry: Geometry) -> list[tuple[int, int, int]]:
    """Runs ``(count, context_len, query_len)`` of ``count`` identical requests,
    drawn from :data:`RUN_COUNTS`, :data:`RUN_CONTEXTS` and :data:`RUN_QUERIES`,
    each clipped to what the batch has left (:func:`clip`)."""
    requests_left = LIMITS["requests"]
    rows_left = min(MAX_CONTEXT_ROWS, max(CHUNKS_WORTH * geometry.workspace_size, 1 << 8))
    tokens_left = MAX_QUERY_TOKENS
    runs: list[tuple[int, int, int]] = []
    for _ in range(draw(RUNS_PER_BATCH)):
        if min(requests_left, tokens_left) == 0:
            break
        # Every request schedules at least one token.
        count = clip(run_count(draw(RUN_COUNTS)), 1, min(requests_left, tokens_left))
        context = clip(context_rows(draw(RUN_CONTEXTS), geometry), 0, min(LIMITS["context_len"], rows_left // count))
        query = clip(draw(RUN_QUERIES), 1, min(LIMITS["query_len"], tokens_left // count))
        runs.append((count, context, query))
        requests_left -= count
        rows_left -= count * context
        tokens_left -= count * query
    return runs


def declared_strategy(declared: Declared) -> SearchStrategy[Any]:
    """A field with no designed strategy drawn from its declaration
    (harness.model.case_fields): an integer anywhere in its bounds, small ones often,
    a flag either way, any of its choices."""
    how = declared.rule
    if how.kind is FieldKind.INT:
        low = how.minimum if how.minimum is not None else -(1 << 20)
        top = how.maximum if how.maximum is not None else LIMITS.get(how.limit or "", 1 << 20)
        return st.one_of(st.integers(low, min(top, low + 8)), st.integers(low, top))
    if how.kind is FieldKind.BOOL:
        return st.booleans()
    if how.kind is FieldKind.CHOICE:
        return st.sampled_from(how.choices)
    raise ValueError(f"no strategy for a {how.kind} field ({declared.name}): give it one")


def draw_extras(draw: DrawFn) -> tuple[tuple[str, Any], ...]:
    """Every extra field registered on Case, drawn from its declaration."""
    return tuple((d.name, draw(declared_strategy(d))) for d in declared_fields(Case) if d.extra)


def _case_from(
    geometry: Geometry,
    runs: Iterable[tuple[int, int, int]],
    family: str,
    numeric: Any = None,
    extras: tuple[tuple[str, Any], ...] = (),
) -> Case:
    contexts: list[int] = []
    queries: list[int] = []
    for count, context, query in runs:
        contexts += [context] * count
        queries += [query] * count
    case = Case(
        name="explore",
        family=family,
        context_lens=tuple(contexts),
        query_lens=tuple(queries),
        block_size=geometry.block_size,
        workspace_size=geometry.workspace_size,
        dcp_world_size=geometry.dcp_world_size,
        cp_kv_cache_interleave_size=geometry.interleave,
        align_to_block=geometry.align_to_block,
        numeric=numeric,
        extras=extras,
    )
    # The strategies keep to the validity rules; this is their proof on every example
    # (a CaseError here is a harness fault: the run ends as an error, never a find).
    return case_from_json(case.to_json(), "explore")


@st.composite
def layout_cases(draw: DrawFn) -> Case:
    geometry = draw_geometry(draw)
    return _case_from(geometry, draw_runs(draw, geometry), "explore-layout", extras=draw_extras(draw))


# Engine settings: realistic ones, and values whose products with the heuristic's
# factors (8 x max_model_len, 4 x max_num_seqs x block) cross 2^31.
MAX_MODEL_LENS: SearchStrategy[int] = st.one_of(
    st.integers(1, 4096),
    st.sampled_from((2048, 4096, 8192, 32768, 131072, 163840)),
    *near_widths(),
    near(1 << 28),
    st.integers(1, 1 << 32),
)
MAX_NUM_SEQS: SearchStrategy[int] = st.one_of(
    st.integers(1, 16), *near_widths(), st.integers(1, 1 << 16), st.integers(1, 1 << 20)
)


@st.composite
def workspace_configs(draw: DrawFn) -> WorkspaceConfig:
    block = draw(BLOCK_SIZES)
    world = draw(DCP_WORLD_SIZES)
    interleave = draw(interleaves(block)) if world > 1 else 1
    max_model_len = draw(MAX_MODEL_LENS)
    max_num_seqs = draw(MAX_NUM_SEQS)
    return WorkspaceConfig(max_model_len, max_num_seqs, block, world, interleave)


# Numeric (L3) dimensions no larger than the tiny preset's, so one example runs in
# about a second on the CPU.
TINY_DIMS: dict[str, tuple[int, ...]] = {
    "num_heads": (1, 2),
    "qk_nope_head_dim": (16, 8),
    "qk_rope_head_dim": (8, 4),
    "v_head_dim": (16, 8),
    "kv_lora_rank": (32, 16),
}
PREFILL_CONTEXT_ROWS = 256


@st.composite
def prefill_cases(draw: DrawFn) -> Case:
    geometry = draw_geometry(draw, dcp=False, small=True)
    dims = {name: draw(st.sampled_from(values)) for name, values in TINY_DIMS.items()}
    numeric = NumericSpec(
        **dims,
        dtype=draw(st.sampled_from(NUMERIC_DTYPES)),
        seed=draw(st.integers(0, (1 << 31) - 1)),
        keyless_rows=draw(st.sampled_from(KEYLESS_ROWS)),
    )
    w = geometry.workspace_size
    # Up to 5 requests of up to 3 workspaces each: splits into three pieces and more.
    contexts = st.one_of(st.just(0), st.integers(1, 16), near(w), st.integers(0, 3 * w)).map(
        lambda c: clip(c, 0, 3 * w)
    )
    runs = draw(st.lists(st.tuples(st.just(1), contexts, st.integers(1, 8)), min_size=1, max_size=5))
    if sum(c for _, c, _ in runs) > PREFILL_CONTEXT_ROWS:
        reject()
    return _case_from(geometry, runs, "explore-prefill", numeric, draw_extras(draw))


# MergeCase fields and how to draw each; a field added to MergeCase without an
# entry here keeps its default (the run lists it under "fields at default").
# An entry takes the fields drawn so far (in MergeCase's field order).
MERGE_HEAD_SIZES = (128, 512, 576, 96)
MERGE_FIELDS: dict[str, Callable[[dict[str, Any]], SearchStrategy[Any]]] = {
    "num_tokens": lambda _: st.one_of(st.integers(1, 8), st.integers(1, 24)),
    "num_heads": lambda _: st.integers(1, 3),
    "head_size": lambda _: st.one_of(st.sampled_from(MERGE_HEAD_SIZES), st.integers(1, 576)),
    "dtype": lambda _: st.sampled_from(NUMERIC_DTYPES),
    "pattern": lambda _: st.sampled_from(MERGE_PATTERNS),
    "seed": lambda _: st.integers(0, (1 << 31) - 1),
    # None (every token merged), 0, the token count, and in between.
    "prefill_tokens_with_context": lambda drawn: st.one_of(
        st.none(), st.sampled_from((0, drawn["num_tokens"])), st.integers(0, drawn["num_tokens"])
    ),
    "lse_view": lambda _: st.sampled_from(MERGE_LSE_VIEWS),
    "value_view": lambda _: st.sampled_from(MERGE_VALUE_VIEWS),
}
MERGE_NAMING = ("name", "family")


def merge_fields_at_default() -> list[str]:
    return [f.name for f in dataclasses.fields(MergeCase) if f.name not in (*MERGE_FIELDS, *MERGE_NAMING)]


@st.composite
def merge_cases(draw: DrawFn) -> MergeCase:
    drawn: dict[str, Any] = {}
    for f in dataclasses.fields(MergeCase):
        if f.name in MERGE_FIELDS:
            drawn[f.name] = draw(MERGE_FIELDS[f.name](drawn))
    return MergeCase(name="explore", family="explore-merge", **drawn)


@dataclass(frozen=True)
class Property:
    """One searched property: items of runner kind ``kind`` drawn from ``strategy``
    compare at parity. ``share`` is its part of the level's budget."""

    name: str
    level: str
    strategy: Callable[[], SearchStrategy[Any]]
    share: float
    note: Callable[[], str | None] = lambda: None

    @property
    def kind(self) -> str:
        return self.name


def properties() -> tuple[Property, ...]:
    """One property per registered kind with a strategy (KindSpec.strategy), in suite order."""
    return tuple(
        Property(kind.name, spec.name, kind.strategy, kind.explore_share, kind.explore_note or (lambda: None))
        for spec in registered_levels()
        for kind in spec.kinds
        if kind.strategy is not None
    )


def properties_for(levels: Sequence[str]) -> list[Property]:
    return [p for p in properties() if p.level in levels]
