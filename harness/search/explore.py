"""``parity explore``: a property-based search for inputs on which a port and the oracle differ.

The fixed suites draw cases from named families; a bug that lives where no family
goes passes them all. Explore draws inputs from the case model's own validity rules
instead (:mod:`harness.cases.files`: any block size, any workspace of at least one
alignment unit, DCP world sizes with the interleaves the engine accepts, alignment
on and off, zero contexts anywhere, lengths around the integer-width boundaries,
batches of one to thousands of requests), runs each through the runner's
:func:`~harness.sides.runner.run_item` (a port fault is a ``port-error``, never a crash),
and lets hypothesis shrink what fails.

Properties, one per kind of item (``--level``): ``layout`` checks layout cases and,
as a second property, workspace configurations; ``merge`` checks merge (L2) inputs;
``prefill`` checks small numeric (L3) cases without DCP. A property fails on a
``divergent`` or ``port-error`` item; an input the oracle refuses is not upstream
input and is discarded (counted as refused).

Invariants:

* Budget. ``budget_s`` bounds the search (wall seconds from each property's first
  example, so hypothesis's start-up is not search time; the properties share it);
  the example under way when it runs out finishes, and shrinking a find may take
  up to as long again (at least :data:`MIN_SHRINK_S`); a database replay runs to
  its end.
  Hypothesis has no time budget of its own: the search ends by raising
  :class:`_BudgetSpent` from the property, which no hypothesis handler treats as
  a failure; the example database ignores writes from then on, so the call that
  ends the search is never saved as a find.
* Reproducibility. Each property's generation is seeded from ``seed`` and the
  property's name; the examples tried are a prefix of one fixed sequence, whose
  length the budget decides.
* Replay. Hypothesis's example database lives under ``out_dir`` (one
  :class:`~hypothesis.database.DirectoryBasedExampleDatabase` per property). A
  run first replays what the database holds (its finds that still fail are
  reported as replayed), then searches with the rest of the budget.
* Rounds. A hypothesis run ends at its first failure, shrunk; while budget is
  left, the next round, seeded afresh, looks past the failure signatures found
  so far, so one common failure does not hide the others.
* One failure at a time. Hypothesis stops generating at a run's first failure
  and shrinks it (it may slip to a smaller failure of another signature: status
  and where it shows, :func:`harness.search.shrink.signature`); the next round looks
  past the signatures reported so far, so the others are found in turn.
* Never a false clean. A property that compared no example (all refused, budget
  gone before the first one, hypothesis gave up) makes the run ``incomplete``.
* Workers. Properties are independent (each its own seed, database and budget
  share): with a worker pool (:mod:`harness.sides.pool`, ``--jobs``) they run side by
  side, each with the share of the budget it has in one process, so the search
  is the same one, finished sooner; the results are listed in property order.
* Minimal finds. Hypothesis shrinks the choices an input was drawn from; a layout
  find is then finished by the harness's own shrinker (:func:`polish`).

Every find is written under ``out_dir/finds/`` as an item file
(:func:`harness.cases.files.load_item_file`) that ``parity diff FILE`` reads: a layout
or prefill find as a case file, a workspace or merge find in its own form (its
printed command is ``parity explore --replay``, which compares it as diff does).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import operator
import shlex
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import Unsatisfiable

from harness.cases.fields import LIMITS, CaseError
from harness.cases.files import case_from_json, load_item_file
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
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port, port_levels
from harness.search.shrink import signature
from harness.sides.items import NOT_RUN, ORACLE_ERROR, PARITY, CaseResult, printable, reraise_interrupt, selected_levels
from harness.sides.runner import run_item
from harness.verdicts.reproduce import program_words

if TYPE_CHECKING:
    from hypothesis.strategies import DrawFn, SearchStrategy

    from harness.kernels import SharedKernels
    from harness.sides.pool import WorkerPool, WorkerSides

EXIT_CLEAN, EXIT_FOUND, EXIT_USAGE = 0, 1, 2
FOUND, CLEAN, INCOMPLETE = "found", "clean", "incomplete"

# Shrinking a find may run this long past the search budget at least.
MIN_SHRINK_S = 20.0
# A single port call may take this long at most during a search (and never longer
# than the CLI's --timeout): one hung call must not eat a whole night's budget.
MAX_CALL_S = 60.0

# -- the input space ------------------------------------------------------------------
#
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


def _case_from(geometry: Geometry, runs: Iterable[tuple[int, int, int]], family: str, numeric: Any = None) -> Case:
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
    )
    # The strategies keep to the validity rules; this is their proof on every example
    # (a CaseError here is a harness fault: the run ends as an error, never a find).
    return case_from_json(case.to_json(), "explore")


@st.composite
def layout_cases(draw: DrawFn) -> Case:
    geometry = draw_geometry(draw)
    return _case_from(geometry, draw_runs(draw, geometry), "explore-layout")


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
    return _case_from(geometry, runs, "explore-prefill", numeric)


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
_MERGE_NAMING = ("name", "family")


def merge_fields_at_default() -> list[str]:
    return [f.name for f in dataclasses.fields(MergeCase) if f.name not in (*MERGE_FIELDS, *_MERGE_NAMING)]


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

    @property
    def kind(self) -> str:
        return self.name


PROPERTIES: tuple[Property, ...] = (
    Property("layout", "layout", layout_cases, 3.0),
    Property("workspace", "layout", workspace_configs, 1.0),
    Property("merge", "merge", merge_cases, 2.0),
    Property("prefill", "prefill", prefill_cases, 2.0),
)


def properties_for(levels: tuple[str, ...]) -> list[Property]:
    return [p for p in PROPERTIES if p.level in levels]


# -- results ----------------------------------------------------------------------------


@dataclass
class Find:
    """A failing input hypothesis shrank, written as a file the CLI replays."""

    property: str
    status: str
    detail: str
    item: dict[str, Any]
    size: str
    file: str = ""
    command: str = ""
    replayed: bool = False
    # Hypothesis could not make the minimal input fail again (a port that is not
    # a pure function of its input, or a timeout): the input is still written.
    flaky: bool = False
    # Shrinking ran out of time: the smallest input seen so far.
    shrink_cut_short: bool = False
    # Steps harness.search.shrink took after hypothesis (:func:`polish`).
    polish_steps: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PropertyRun:
    """One property's search: how many examples, how it ended, what it found."""

    name: str
    budget_s: float
    examples: int = 0
    examples_before_find: int | None = None
    # From the first example to the first failing one.
    seconds_to_find: float | None = None
    refused: int = 0
    refusals: list[str] = field(default_factory=list)
    # Hypothesis runs of the search (one more per round that found something new).
    rounds: int = 0
    seconds: float = 0.0
    # "budget", "exhausted" (hypothesis ran out of distinct inputs), "gave-up"
    # (every input refused), "error" (hypothesis itself failed), "not-run".
    ended_by: str = ""
    error: str | None = None
    finds: list[Find] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """It compared at least one example and hypothesis itself did not fail."""
        return self.examples > 0 and self.ended_by not in ("error", "gave-up", "not-run")

    def to_json(self) -> dict[str, Any]:
        """The run's figures; its finds are listed once, in :meth:`ExploreResult.to_json`."""
        out = dataclasses.asdict(self)
        out["finds"] = len(self.finds)
        out["complete"] = self.complete
        return out


@dataclass
class ExploreResult:
    port: str
    port_spec: str
    level: str
    seed: int
    budget_s: float
    out_dir: str
    runs: list[PropertyRun] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def finds(self) -> list[Find]:
        return [f for run in self.runs for f in run.finds]

    @property
    def examples(self) -> int:
        return sum(run.examples for run in self.runs)

    @property
    def verdict(self) -> str:
        """``found`` with any find; ``clean`` only when every property compared
        examples and none failed; otherwise ``incomplete``."""
        if self.finds:
            return FOUND
        return CLEAN if self.runs and all(run.complete for run in self.runs) else INCOMPLETE

    @property
    def exit_code(self) -> int:
        return EXIT_CLEAN if self.verdict == CLEAN else EXIT_FOUND

    def to_json(self) -> dict[str, Any]:
        import hypothesis

        return {
            "port": self.port,
            "port_spec": self.port_spec,
            "level": self.level,
            "seed": self.seed,
            "budget_s": self.budget_s,
            "seconds": round(self.seconds, 3),
            "verdict": self.verdict,
            "examples": self.examples,
            "out_dir": self.out_dir,
            "database": str(Path(self.out_dir) / DATABASE_DIR),
            "hypothesis": hypothesis.__version__,
            "notes": self.notes,
            "properties": [run.to_json() for run in self.runs],
            "finds": [f.to_json() for f in self.finds],
        }

    def headline(self) -> str:
        tried = f"{self.examples} examples compared in {self.seconds:.1f}s"
        if self.verdict == FOUND:
            return f"FOUND: {len(self.finds)} failing input(s) for port {self.port} ({tried})"
        if self.verdict == CLEAN:
            return f"CLEAN: no failing input for port {self.port} ({tried}; a search, not a proof)"
        short = [f"{r.name} ({r.ended_by}, {r.examples} compared)" for r in self.runs if not r.complete]
        return f"INCOMPLETE: {', '.join(short) or 'no property ran'} for port {self.port} ({tried})"

    def to_markdown(self, heading: str = "#") -> str:
        """``summary.md``; ``heading`` ("###", say) sets the level of its title
        (its finds are one level below), for embedding in another report."""
        lines = [
            f"{heading} parity explore: port {self.port}, level {self.level}, seed {self.seed}",
            "",
            f"**{self.headline()}**",
            "",
            f"Budget {self.budget_s:g}s for the search; database `{Path(self.out_dir) / DATABASE_DIR}`.",
            "",
            "| property | examples compared | refused by the oracle | seconds | ended by | finds |",
            "|---|---:|---:|---:|---|---:|",
        ]
        for run in self.runs:
            lines.append(
                f"| {run.name} | {run.examples} | {run.refused} | {run.seconds:.1f} | {run.ended_by}"
                f"{' (' + run.error + ')' if run.error else ''} | {len(run.finds)} |"
            )
        for note in self.notes:
            lines += ["", f"Note: {note}"]
        if self.finds:
            lines += ["", f"{heading}# Finds", ""]
            for i, find in enumerate(self.finds, 1):
                flags = [
                    flag
                    for flag, on in (
                        ("replayed from the database", find.replayed),
                        ("flaky", find.flaky),
                        ("shrinking cut short", find.shrink_cut_short),
                    )
                    if on
                ]
                lines.append(
                    f"{i}. **{find.property}, {find.status}**: {find.detail}"
                    + (f" ({', '.join(flags)})" if flags else "")
                )
                lines.append(f"   - input: {find.size}")
                lines.append(f"   - file: `{find.file}`")
                lines.append(f"   - reproduce: `{find.command}`")
        return "\n".join(lines) + "\n"


# -- the search -------------------------------------------------------------------------

DATABASE_DIR = "hypothesis-db"
FINDS_DIR = "finds"
MAX_REFUSALS_KEPT = 5


class _BudgetSpent(BaseException):
    """Raised from a property when its time is up. A BaseException, so that no
    hypothesis handler takes it for a test failure; it ends the run where it is."""


class _PropertyFailed(Exception):
    """A failing example: the item and its comparison. Subclassed once per failure
    signature (:func:`_failure_class`), so that hypothesis's report and database
    tell the kinds of failure apart."""

    def __init__(self, item: Any, result: CaseResult) -> None:
        super().__init__(f"{result.status}: {result.detail()}")
        self.item = item
        self.result = result


_FAILURE_CLASSES: dict[tuple[str, str], type[_PropertyFailed]] = {}


def _failure_class(key: tuple[str, str]) -> type[_PropertyFailed]:
    if key not in _FAILURE_CLASSES:
        _FAILURE_CLASSES[key] = type(f"PropertyFailed_{len(_FAILURE_CLASSES)}", (_PropertyFailed,), {})
    return _FAILURE_CLASSES[key]


class _GuardedDatabase(ExampleDatabase):
    """A directory database that stops taking writes once the search is over:
    hypothesis saves the input of any call that raises, and the call that ends a
    search on time (:class:`_BudgetSpent`) is no find."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.inner = DirectoryBasedExampleDatabase(path)
        self.sealed = False

    def save(self, key: bytes, value: bytes) -> None:
        if not self.sealed:
            self.inner.save(key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.inner.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        if not self.sealed:
            self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if not self.sealed:
            self.inner.move(src, dest, value)


def property_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:explore:{name}".encode()).digest()[:8], "big")


def item_size(item: Any) -> tuple[int, ...]:
    """Smaller is simpler: requests, then rows, then everything else."""
    if isinstance(item, Case):
        return (
            item.num_requests,
            sum(item.context_lens),
            sum(item.query_lens),
            item.workspace_size,
            item.block_size,
            item.dcp_world_size,
        )
    if isinstance(item, MergeCase):
        return (item.num_tokens, item.num_heads, item.head_size)
    if isinstance(item, WorkspaceConfig):
        return (item.max_model_len, item.max_num_seqs, item.block_size, item.dcp_world_size)
    return ()


def run_length_text(values: tuple[int, ...], limit: int = 6) -> str:
    """``[9, 0x3, 18x512]``: runs of equal values, the first ``limit`` of them."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    parts = [f"{v}x{n}" if n > 1 else str(v) for v, n in runs[:limit]]
    return "[" + ", ".join(parts) + (f", ... {len(runs) - limit} more runs" if len(runs) > limit else "") + "]"


def describe_item(item: Any) -> str:
    """One short line, however large the item."""
    if isinstance(item, Case):
        text = (
            f"{item.num_requests} request(s), {sum(item.context_lens)} context rows: "
            f"context_lens={run_length_text(item.context_lens)} query_lens={run_length_text(item.query_lens)} "
            f"W={item.workspace_size} block={item.block_size}"
            + (f" dcp={item.dcp_world_size}x{item.cp_kv_cache_interleave_size}" if item.dcp_world_size > 1 else "")
            + ("" if item.align_to_block else " align=off")
        )
        return text + (f" numeric={json.dumps(item.numeric.to_json())}" if item.numeric else "")
    if isinstance(item, WorkspaceConfig):
        return item.name
    if isinstance(item, MergeCase):
        return json.dumps({k: v for k, v in item.to_json().items() if k not in _MERGE_NAMING})
    return str(item)


@dataclass
class _Search:
    """What one property's test function shares with the code that drives it."""

    oracle: Port
    port: Port
    prop: Property
    kernels: SharedKernels
    device: str
    database: _GuardedDatabase
    seed: int
    budget_s: float
    # The limit on one port call (the harness's --timeout, no more than the search allows).
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S
    # Set at the property's first example, so hypothesis's own start-up is not
    # search time: the search ends at the first example past search_deadline; a
    # shrink in progress then, at the first past hard_deadline.
    search_deadline: float | None = None
    hard_deadline: float | None = None
    # A replay of the database runs to its end, whatever the budget.
    replaying: bool = False
    run: PropertyRun = field(default_factory=lambda: PropertyRun("", 0.0))
    # The smallest failing item per signature in this hypothesis run, for a
    # shrink that runs out of time.
    smallest: dict[tuple[str, str], tuple[Any, CaseResult]] = field(default_factory=dict)
    # Signatures an earlier run of this search reported: a later run looks past
    # them for failures of other kinds.
    known: set[tuple[str, str]] = field(default_factory=set)

    def time_left(self) -> bool:
        return self.search_deadline is None or time.monotonic() < self.search_deadline

    def check(self, item: Any) -> None:
        now = time.monotonic()
        if self.search_deadline is None or self.hard_deadline is None:
            self.search_deadline = now + self.budget_s
            self.hard_deadline = self.search_deadline + max(self.budget_s, MIN_SHRINK_S)
        # Once this run has a failure, hypothesis gets until the hard deadline to shrink it.
        searching = not self.smallest and not self.replaying
        if (searching and now >= self.search_deadline) or now >= self.hard_deadline:
            self.database.sealed = True
            raise _BudgetSpent
        result = run_item(self.oracle, self.port, self.prop.kind, item, self.kernels, self.device, self.timeout_s)
        if result.status == ORACLE_ERROR:
            # Not an input upstream takes: neither a find nor an example.
            self.run.refused += 1
            message = printable(result.error or "")[:200]
            if len(self.run.refusals) < MAX_REFUSALS_KEPT and message not in self.run.refusals:
                self.run.refusals.append(message)
            reject()
        self.run.examples += 1
        if result.status == PARITY:
            return
        if result.status == NOT_RUN:  # checked before the search: the port lacks the level
            raise RuntimeError(result.error or "not-run")
        key = signature(result)
        if key in self.known:
            return
        if self.run.examples_before_find is None:
            self.run.examples_before_find = self.run.examples
            self.run.seconds_to_find = round(now - (self.search_deadline - self.budget_s), 3)
        known = self.smallest.get(key)
        if known is None or item_size(item) < item_size(known[0]):
            self.smallest[key] = (item, result)
        raise _failure_class(key)(item, result)


def _hypothesis_settings(database: ExampleDatabase, phases: tuple[Phase, ...]) -> settings:
    """A search stops generating at its first failure; a replay of the database
    (no generation) reports every entry that still fails."""
    return settings(
        database=database,
        phases=phases,
        # The budget ends the search, never the count.
        max_examples=10**9,
        deadline=None,
        derandomize=False,
        report_multiple_bugs=Phase.generate not in phases,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )


def _failures_in(error: BaseException) -> list[_PropertyFailed]:
    if isinstance(error, _PropertyFailed):
        return [error]
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _failures_in(e)]
    return []


def _run_hypothesis(
    search: _Search, phases: tuple[Phase, ...], round_number: int
) -> tuple[list[_PropertyFailed], bool]:
    """One hypothesis run; its failures (minimal ones, as hypothesis reports them)
    and whether they are flaky. ``search.run.ended_by`` says why it stopped."""
    from hypothesis.errors import FlakyFailure

    # @seed alone turns the database off; settings applied over it turn it back on.
    @_hypothesis_settings(search.database, phases)
    @hypothesis_seed(property_seed(search.seed, f"{search.prop.name}:{round_number}"))
    @given(search.prop.strategy())
    def prop(item: Any) -> None:
        search.check(item)

    try:
        prop()
    except _BudgetSpent:
        search.run.ended_by = "budget"
        return [], False
    except Unsatisfiable:
        search.run.ended_by = "gave-up"
        search.run.error = "hypothesis found no input the oracle accepts"
        return [], False
    except BaseException as exc:
        reraise_interrupt(exc)
        failures = _failures_in(exc)
        if failures:
            return failures, isinstance(exc, FlakyFailure)
        search.run.ended_by = "error"
        search.run.error = printable(f"{type(exc).__name__}: {exc}")[:300]
        return [], False
    search.run.ended_by = "exhausted"
    return [], False


def _explore_property(
    oracle: Port,
    port: Port,
    prop: Property,
    budget_s: float,
    seed: int,
    out_dir: Path,
    port_spec: str,
    kernels: SharedKernels,
    device: str,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> PropertyRun:
    """Replay the property's database, then search in rounds until ``budget_s``
    is spent: each round is one hypothesis run that ends on the budget or with
    shrunk finds; the next round, seeded afresh, looks past the kinds of failure
    found so far."""
    started = time.monotonic()
    run = PropertyRun(prop.name, round(budget_s, 3))
    database = _GuardedDatabase(out_dir / DATABASE_DIR / prop.name)
    search = _Search(oracle, port, prop, kernels, device, database, seed, budget_s, timeout_s, run=run)

    def record(failures: list[_PropertyFailed], flaky: bool, replayed: bool) -> bool:
        cut_short = not failures and bool(search.smallest)
        if cut_short:
            # Shrinking ran out of time: the smallest failing input seen of each kind.
            failures = [_failure_class(key)(item, result) for key, (item, result) in search.smallest.items()]
        for failure in failures:
            key = signature(failure.result)
            if key not in search.known:
                search.known.add(key)
                item, result, steps = polish(oracle, port, failure.item, failure.result, timeout_s)
                find = write_find(item, result, prop, out_dir, port_spec, replayed, flaky, cut_short)
                find.polish_steps = steps
                run.finds.append(find)
        search.smallest.clear()
        return bool(failures)

    # The database first: its finds that still fail are reported before any new search.
    if any(path.is_file() for path in database.inner.path.rglob("*")):
        search.replaying = True
        record(*_run_hypothesis(search, (Phase.reuse, Phase.shrink), 0), replayed=True)
        search.replaying = False
    found = True
    while found and search.time_left():
        run.rounds += 1
        database.sealed = False
        # Ends on the budget, exhausted inputs or an error (ended_by says which), or with finds.
        found = record(*_run_hypothesis(search, (Phase.generate, Phase.shrink), run.rounds), replayed=False)
    if found:
        run.ended_by = "budget"  # the deadline passed while a round was shrinking, or before any round
    run.seconds = round(time.monotonic() - started, 3)
    return run


POLISH_EVALUATIONS = 200


def polish(
    oracle: Port, port: Port, item: Any, result: CaseResult, timeout_s: float = DEFAULT_PORT_TIMEOUT_S
) -> tuple[Any, CaseResult, int]:
    """Finish a layout find with the harness's own shrinker; the steps it took.

    Hypothesis shrinks the choices an input was drawn from. Some reductions are
    out of its reach here: one request of a run of identical ones (the run's
    count is one choice, and a count drawn near a width boundary stays near it),
    or a length drawn relative to a boundary. :func:`harness.search.shrink.shrink`
    (drop requests, shorten contexts, queries and the workspace) takes those
    steps, keeping the failure's signature, on the already small case.
    """
    from harness.search.shrink import shrink
    from harness.sides.runner import compare_case

    if not isinstance(item, Case) or item.numeric is not None:
        return item, result, 0
    try:
        outcome = shrink(item, lambda case: compare_case(oracle, port, case, timeout_s), budget=POLISH_EVALUATIONS)
    except ValueError:  # it no longer fails (a flaky port): keep hypothesis's input
        return item, result, 0
    if signature(outcome.result) != signature(result):
        return item, result, 0
    return outcome.case, outcome.result, outcome.steps


def find_name(prop: str, item_json: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(item_json, sort_keys=True).encode()).hexdigest()[:10]
    return f"explore-{prop}-{digest}"


def write_find(
    item: Any,
    result: CaseResult,
    prop: Property,
    out_dir: Path,
    port_spec: str,
    replayed: bool,
    flaky: bool,
    cut_short: bool,
) -> Find:
    """Write ``item`` under ``out_dir/finds`` as a file the CLI replays."""
    finds = out_dir / FINDS_DIR
    finds.mkdir(parents=True, exist_ok=True)
    body = item.to_json() if hasattr(item, "to_json") else dataclasses.asdict(item)
    name = find_name(prop.name, {k: v for k, v in body.items() if k != "name"})
    path = finds / f"{name}.json"
    if isinstance(item, Case):
        item = dataclasses.replace(item, name=name)
        data = item.to_json()
        level = "prefill" if prop.name == "prefill" else "layout"
        command = [*program_words(port_spec), "diff", str(path), "--port", port_spec, "--level", level]
    else:
        data = {**body, "name": name}
        if isinstance(item, WorkspaceConfig):
            data = {"kind": "workspace", **dataclasses.asdict(item)}
        command = [*program_words(port_spec), "explore", "--replay", str(path), "--port", port_spec]
    data["description"] = printable(f"found by parity explore ({prop.name}) for {port_spec}: {result.detail()}")
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return Find(
        property=prop.name,
        status=result.status,
        detail=printable(result.detail()),
        item=data,
        size=describe_item(item),
        file=str(path),
        command=shlex.join(command),
        replayed=replayed,
        flaky=flaky,
        shrink_cut_short=cut_short,
    )


def explore(
    oracle: Port,
    port: Port,
    port_spec: str,
    level: str,
    budget_s: float,
    seed: int,
    out_dir: Path,
    kernels: SharedKernels,
    device: str = "cpu",
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
    pool: WorkerPool | None = None,
) -> ExploreResult:
    """Search each property of ``level`` (layout, merge, prefill or all) for
    ``budget_s`` seconds in all; write the finds, ``explore.json`` and
    ``summary.md`` under ``out_dir``. A level the port does not implement is a
    ``not-run`` property (the result is then at best incomplete). One port call
    may take ``timeout_s`` seconds, and no more than the search's budget allows.
    With ``pool`` the properties run in its workers (which load the port from
    ``port_spec``), side by side, each with the same share of the budget."""

    started = time.monotonic()
    result = ExploreResult(port.name, port_spec, level, seed, budget_s, str(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    props = properties_for(selected_levels(level))
    implemented = port_levels(port)
    at_default = merge_fields_at_default()
    if at_default and any(p.name == "merge" for p in props):
        result.notes.append(f"merge fields left at their defaults (no strategy yet): {', '.join(at_default)}")
    call_limit_s = min(timeout_s, max(MAX_CALL_S, budget_s))
    # Fixed shares of the budget: a long shrink in one property never starves the next.
    shares = sum(p.share for p in props if p.level in implemented)
    searches = [
        PropertySearch(port_spec, prop.name, budget_s * prop.share / shares, seed, out_dir, call_limit_s)
        for prop in props
        if prop.level in implemented
    ]
    if pool is None:
        runs = [
            _explore_property(
                oracle, port, _property(s.name), s.share_s, seed, out_dir, port_spec, kernels, device, call_limit_s
            )
            for s in searches
        ]
    else:
        from harness.sides.pool import Task

        tasks = [Task(run=search_property, payload=s, what=f"the {s.name} search") for s in searches]
        runs = list(pool.run(tasks))
    searched = iter(runs)
    for prop in props:
        if prop.level not in implemented:
            result.runs.append(PropertyRun(prop.name, 0.0, ended_by="not-run"))
        else:
            result.runs.append(next(searched))
    result.seconds = time.monotonic() - started
    (out_dir / "explore.json").write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    (out_dir / "summary.md").write_text(result.to_markdown(), encoding="utf-8")
    return result


@dataclass(frozen=True)
class PropertySearch:
    """One property's search, as a worker takes it: the port by spec, the
    property by name, its share of the budget, the seed, the output folder."""

    port_spec: str
    name: str
    share_s: float
    seed: int
    out_dir: Path
    call_limit_s: float


def _property(name: str) -> Property:
    return next(p for p in PROPERTIES if p.name == name)


def search_property(sides: WorkerSides, search: PropertySearch) -> Iterator[PropertyRun]:
    """In a worker: one property's search (:func:`_explore_property`) on its own sides."""
    yield _explore_property(
        sides.oracle,
        sides.port(search.port_spec),
        _property(search.name),
        search.share_s,
        search.seed,
        search.out_dir,
        search.port_spec,
        sides.kernels,
        sides.device,
        search.call_limit_s,
    )


# -- replaying a find --------------------------------------------------------------------


def load_find(path: Path) -> tuple[str, Any]:
    """A find file: ``(kind, item)``, kind layout (a case file of one case),
    workspace or merge (:func:`harness.cases.files.load_item_file`)."""
    kind, loaded = load_item_file(path)
    if isinstance(loaded, list):
        if len(loaded) != 1:
            raise CaseError(str(path), None, f"holds {len(loaded)} cases; a find holds one")
        return kind, loaded[0]
    return kind, loaded


def replay_kinds(kind: str, item: Any) -> list[str]:
    """The runner kinds a find's item is compared at: a case with a numeric section at L3 too."""
    return [kind] + (["prefill"] if kind == "layout" and item.numeric is not None else [])
