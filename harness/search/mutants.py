"""The kill matrix: which parity level catches each seeded mutant, and where.

For every mutant and level, the suite's items of that level run in order until
the first one that does not reach parity (divergent or port-error): that item
killed the mutant at that level. A mutant no level kills survived, and the
suites need a sharper case.

Each (mutant, level) search is independent of the others: with a worker pool
(:mod:`harness.sides.pool`) they run side by side, one task each, the kill shrunk in
the worker that found it; the matrix is assembled in mutant and level order, so
it is the same whatever the number of workers.

With a :class:`FaultProbe` (the catalogue's, :mod:`ports.mutants.reach`), a
reach pass first runs the fault-free base of the mutants once on every item,
recording which fault sites it calls; a mutant then runs only on the items
that reach one of its sites or on which the base is not at parity. On any
other item it would run the base's code on the base's inputs, so it would be
at parity too: skipping it changes no kill, no ``items_tried`` and no
survivor, only the work (``parity mutants --exhaustive`` runs every item).
A mutant whose sites the probe cannot prove (it cannot tell them from the
mutant's class, or the mutant keeps state, or its ``swaps()`` differ from one
call to the next: a warm path) runs on every item, and the matrix says why.

A port call past its time limit (:func:`harness.sides.time_limits.is_timeout`) is not
a kill: nothing was compared. The search goes on past it, and a level on which
the mutant only timed out reads "timed out", not "killed".
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.cases.suites import Suite
from harness.model.levels import kind_spec
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port
from harness.sides.items import DIVERGENT, NOT_RUN, PARITY, PORT_ERROR, CaseResult
from harness.sides.runner import plan_items, run_item
from harness.sides.time_limits import is_timeout

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.model import Case
    from harness.sides.pool import Executor
    from harness.sides.pool_worker import WorkerSides


@dataclass
class Kill:
    item: str
    status: str
    detail: str
    items_tried: int
    shrunk: str | None = None


@dataclass
class MutantRow:
    name: str
    description: str
    source: str
    kills: dict[str, Kill | None] = field(default_factory=dict)
    # Per level: the items the mutant itself ran, and the items decided (up to
    # and with its kill, or the whole level): the difference never reached its fault.
    ran: dict[str, int] = field(default_factory=dict)
    decided: dict[str, int] = field(default_factory=dict)
    # Per level: the items on which the mutant's call ran past its time limit (no kill).
    timed_out: dict[str, list[str]] = field(default_factory=dict)
    # Whether a reach pass chose its items, and if it could not, why it ran on every item.
    guided: bool = False
    unproven: str | None = None
    # The levels it was not searched at: a mutant that names the levels its fault
    # shows at (``Mutant.shows_at``: a planning decision's) is searched there only.
    not_searched: list[str] = field(default_factory=list)

    @property
    def killed(self) -> bool:
        return any(k is not None for k in self.kills.values())

    @property
    def searched_nowhere(self) -> bool:
        """Every level run was one its fault is not searched at (``Mutant.shows_at``): no verdict, not a survivor."""
        return bool(self.kills) and set(self.kills) <= set(self.not_searched)

    @property
    def only_timed_out(self) -> bool:
        """Not killed, but some call ran past its time limit: not a survivor the suites missed either."""
        return not self.killed and any(self.timed_out.values())

    def cell(self, level: str) -> str:
        """``killed``, ``timed out`` (no kill at ``level``, a call past its limit),
        ``not searched`` (a level its fault is not declared to show at) or ``survived``."""
        if self.kills.get(level):
            return "killed"
        if level in self.not_searched:
            return "not searched"
        return "timed out" if self.timed_out.get(level) else "survived"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "killed": self.killed,
            "kills": {lv: (k.__dict__ if k else None) for lv, k in self.kills.items()},
            "ran": dict(self.ran),
            "decided": dict(self.decided),
            "timed_out": {lv: list(ids) for lv, ids in self.timed_out.items()},
            "reach": {"guided": self.guided, "unproven": self.unproven},
            "not_searched": list(self.not_searched),
        }


# A level's items as a search walks them: (position in the level, from 1; kind; item).
LevelItems = Sequence[tuple[int, str, Any]]


# A search's outcome: the kill and the result that made it (None, None: no kill),
# and the ids of the items on which the mutant's call ran past its time limit.
Outcome = tuple[Kill | None, CaseResult | None, list[str]]


def first_kill(
    oracle: Port,
    mutant: Port,
    items: LevelItems,
    kernels: SharedKernels | None,
    device: str = "cpu",
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> Outcome:
    """The first of ``items`` on which ``mutant`` is not at parity; its
    ``items_tried`` is that item's position in the level. An item on which the
    mutant's call timed out is no kill (nothing was compared): it is listed and
    the search goes on. ``device`` and ``timeout_s`` are those the reach pass
    ran the base with."""
    timed_out: list[str] = []
    for tried, kind, item in items:
        result = run_item(oracle, mutant, kind, item, kernels, device, timeout_s)
        if result.status == PORT_ERROR and is_timeout(result.error):
            timed_out.append(result.id)
        elif result.status in (DIVERGENT, PORT_ERROR):
            return Kill(result.id, result.status, result.detail(), tried), result, timed_out
    return None, None, timed_out


# Shrinks a kill and writes the shrunk case: (oracle, mutant, case, file,
# level, kernels) -> what the matrix shows of it; never raises.
Shrinker = Callable[[Port, Port, Any, Path, str, Any], str]


@dataclass(frozen=True)
class ShrinkKills:
    """Where kills are shrunk to and how: ``shrink`` is a module-level function
    (a worker gets it by name), the command layer's guarded shrink."""

    directory: Path
    shrink: Shrinker


def shrink_kill(
    oracle: Port,
    mutant: Port,
    level: str,
    kill: Kill,
    result: CaseResult,
    case: Case | None,
    how: ShrinkKills,
    kernels: SharedKernels | None,
) -> None:
    """Shrink a layout or prefill kill of a case (not of a workspace config or a
    merge case) into ``<directory>/<mutant>-<level>.json``; ``kill.shrunk`` says
    what came of it."""
    if case is None or not kind_spec(result.kind)[0].shrinks:
        return
    kill.shrunk = how.shrink(oracle, mutant, case, how.directory / f"{mutant.name}-{level}.json", level, kernels)


@dataclass(frozen=True)
class KillSearch:
    """One (mutant, level) search for a worker: the mutant by spec (``mutant:NAME``),
    the level's items in order, and how to shrink its kill (None: not at all)."""

    mutant_spec: str
    level: str
    items: LevelItems
    shrink: ShrinkKills | None


def search_kill(sides: WorkerSides, search: KillSearch) -> Iterator[Outcome]:
    """In a worker: :func:`first_kill`, then the kill shrunk as :func:`shrink_kill` does."""
    mutant = sides.port(search.mutant_spec)
    kill, result, timed_out = first_kill(
        sides.oracle, mutant, search.items, sides.kernels, sides.device, sides.timeout_s
    )
    if kill is not None and result is not None and search.shrink is not None:
        case = _case_of(search.items, result)
        shrink_kill(sides.oracle, mutant, search.level, kill, result, case, search.shrink, sides.kernels)
    yield kill, result, timed_out


def _case_of(items: LevelItems, result: CaseResult) -> Case | None:
    """The case a killing layout or prefill item compared (None for other kinds)."""
    if not kind_spec(result.kind)[0].shrinks:
        return None
    return next((item for _, kind, item in items if kind == result.kind and item.name == result.name), None)


# -- the reach pass --------------------------------------------------------------------


class FaultProbe(Protocol):
    """What a mutant catalogue offers so that a mutant runs only where its fault
    can show (:mod:`ports.mutants.reach`): its fault-free base, where each
    mutant's fault lives, and which of those places the base calls."""

    @property
    def reference(self) -> Port:
        """The mutants' fault-free base."""
        ...

    def sites(self, mutant: Any) -> frozenset[str] | None:
        """The mutant's fault sites; None: unproven (it runs on every item)."""
        ...

    def examine(self, mutant: Any) -> tuple[frozenset[str] | None, str | None]:
        """(the mutant's fault sites, None), or (None, why they cannot be proven)."""
        ...

    def recording(self, sites: Iterable[str]) -> AbstractContextManager[set[str]]:
        """While open, the set yielded collects each of ``sites`` the base calls."""
        ...


# A module-level function that builds the probe (a worker gets it by name).
ProbeFactory = Callable[[], FaultProbe]


@functools.cache
def _probe(factory: ProbeFactory) -> FaultProbe:
    return factory()


@dataclass(frozen=True)
class Reach:
    """The base's verdict on one item and the fault sites it called there."""

    status: str
    reached: frozenset[str]


def reach_items(
    probe: FaultProbe,
    sites: frozenset[str],
    items: LevelItems,
    oracle: Port,
    kernels: SharedKernels | None,
    device: str = "cpu",
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> Iterator[Reach]:
    for _, kind, item in items:
        with probe.recording(sites) as reached:
            result = run_item(oracle, probe.reference, kind, item, kernels, device, timeout_s)
        yield Reach(result.status, frozenset(reached))


@dataclass(frozen=True)
class ReachChunk:
    """Consecutive items of one level for a worker's reach pass."""

    probe: ProbeFactory
    sites: frozenset[str]
    items: tuple[tuple[int, str, Any], ...]


def run_reach_chunk(sides: WorkerSides, chunk: ReachChunk) -> Iterator[Reach]:
    yield from reach_items(
        _probe(chunk.probe), chunk.sites, chunk.items, sides.oracle, sides.kernels, sides.device, sides.timeout_s
    )


def recover_reach_chunk(chunk: ReachChunk, finished: int, exitcode: int | None) -> tuple[list[Reach], Any]:
    """The item a dead worker was on is not known to be at parity (every mutant
    runs it); the items after it run again elsewhere."""
    if finished >= len(chunk.items):
        return [], None
    rest = chunk.items[finished + 1 :]
    return [Reach(NOT_RUN, frozenset())], (ReachChunk(chunk.probe, chunk.sites, rest) if rest else None)


def reach_pass(
    oracle: Port,
    probe: ProbeFactory,
    sites: frozenset[str],
    items: LevelItems,
    kernels: SharedKernels | None,
    pool: Executor | None,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> list[Reach]:
    """:class:`Reach` of every item, in order (in a pool, under the workers' own time limit)."""
    if pool is None:
        return list(reach_items(_probe(probe), sites, items, oracle, kernels, timeout_s=timeout_s))
    from harness.sides.job_sizing import cost_chunks
    from harness.sides.pool import Task

    tasks = [
        Task(
            run=run_reach_chunk,
            payload=ReachChunk(probe, sites, tuple(chunk)),
            recover=recover_reach_chunk,
            what=f"the reach pass over items {chunk[0][0]}..{chunk[-1][0]}",
        )
        for chunk in cost_chunks(items, pool.jobs)
    ]
    return list(pool.run(tasks))


def reaching_items(items: LevelItems, reach: Sequence[Reach], sites: frozenset[str] | None) -> list[Any]:
    """The items a mutant with fault ``sites`` must run: those reaching one of
    them, and those the base is not at parity on (all of them when ``sites`` is None)."""
    if sites is None:
        return list(items)
    return [item for item, seen in zip(items, reach, strict=True) if seen.status != PARITY or seen.reached & sites]


def kill_matrix(
    oracle: Port,
    mutants: list[Any],
    suite: Suite,
    levels: tuple[str, ...],
    kernels: SharedKernels | None,
    on_kill: Callable[[Any, str, Kill, CaseResult], None] | None = None,
    *,
    shrink: ShrinkKills | None = None,
    pool: Executor | None = None,
    probe: ProbeFactory | None = None,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> list[MutantRow]:
    """Every mutant's first kill at every level. A kill is shrunk as ``shrink``
    says when given (:func:`shrink_kill`), then passed to ``on_kill``.
    With ``pool`` the searches run in its workers, which load each mutant by
    name (``mutant:NAME``: the mutants of :mod:`ports.mutants`). With ``probe``
    a mutant runs only on the items that can reach its fault (the module's
    docstring); without, on every item. Each port call may take ``timeout_s``
    seconds (in a pool, the workers' own limit)."""
    by_level = {
        lv: [(tried, kind, item) for tried, (kind, item) in enumerate(plan_items(suite, (lv,)), start=1)]
        for lv in levels
    }
    searched = {(position, level): by_level[level] for position in range(len(mutants)) for level in levels}
    proofs = [_probe(probe).examine(mutant) for mutant in mutants] if probe is not None else []
    if probe is not None:
        sites_of = [sites for sites, _ in proofs]
        known = [sites for sites in sites_of if sites is not None]
        if known:
            every_site = frozenset().union(*known)
            for level in levels:
                reach = reach_pass(oracle, probe, every_site, by_level[level], kernels, pool, timeout_s)
                for position, sites in enumerate(sites_of):
                    searched[position, level] = reaching_items(by_level[level], reach, sites)
    skipped = {
        (position, level)
        for position, mutant in enumerate(mutants)
        for level in levels
        if getattr(mutant, "shows_at", ()) and level not in mutant.shows_at
    }
    for key in skipped:
        searched[key] = []
    searches = [(position, mutant, level) for position, mutant in enumerate(mutants) for level in levels]
    if pool is None:
        outcomes: list[Outcome] = []
        for position, mutant, level in searches:
            items = searched[position, level]
            kill, result, timed_out = first_kill(oracle, mutant, items, kernels, timeout_s=timeout_s)
            if kill is not None and result is not None and shrink is not None:
                case = _case_of(items, result)
                shrink_kill(oracle, mutant, level, kill, result, case, shrink, kernels)
            outcomes.append((kill, result, timed_out))
    else:
        from harness.sides.pool import Task

        tasks = [
            Task(
                run=search_kill,
                payload=KillSearch(f"mutant:{mutant.name}", level, searched[position, level], shrink),
                what=f"the kill search of mutant {mutant.name} at {level}",
            )
            for position, mutant, level in searches
        ]
        outcomes = list(pool.run(tasks))
    rows = [MutantRow(mutant.name, mutant.description, mutant.source) for mutant in mutants]
    if probe is not None:
        for row, (_, why) in zip(rows, proofs, strict=True):
            row.guided, row.unproven = True, why
    for (position, mutant, level), (kill, result, timed_out) in zip(searches, outcomes, strict=True):
        if kill is not None and result is not None and on_kill is not None:
            on_kill(mutant, level, kill, result)
        rows[position].kills[level] = kill
        rows[position].timed_out[level] = list(timed_out)
        if (position, level) in skipped:
            rows[position].not_searched.append(level)
        decided = 0 if (position, level) in skipped else kill.items_tried if kill is not None else len(by_level[level])
        rows[position].decided[level] = decided
        rows[position].ran[level] = sum(1 for tried, _, _ in searched[position, level] if tried <= decided)
    return rows


def estimated_matrix_seconds(suite: Suite, levels: tuple[str, ...], mutants: int) -> float:
    """Single-process seconds of a kill matrix, for the default ``--jobs``: each
    search is counted at a tenth of its level's items (most mutants die early)."""
    from harness.sides.job_sizing import estimated_seconds

    return sum(estimated_seconds(k for k, _ in plan_items(suite, (lv,))) for lv in levels) * mutants / 10


def render_matrix(rows: list[MutantRow], levels: tuple[str, ...], suite: str) -> str:
    killed = sum(r.killed for r in rows)
    hung = [r for r in rows if r.only_timed_out]
    lines = [
        f"## Kill matrix: suite `{suite}`, {killed}/{len(rows)} mutants killed"
        + (f", {len(hung)} timed out without a kill" if hung else ""),
        "",
        "| mutant | source | " + " | ".join(levels) + " | first kill |",
        "|---|---|" + "---|" * len(levels) + "---|",
    ]
    for r in rows:
        cells = [r.cell(lv) for lv in levels]
        first = next((k for k in r.kills.values() if k), None)
        where = f"`{first.item}`" + (f" (shrunk: `{first.shrunk}`)" if first and first.shrunk else "") if first else "-"
        lines.append(f"| {r.name}: {r.description} | {r.source} | " + " | ".join(cells) + f" | {where} |")
    survivors = [r.name for r in rows if not r.killed and not r.only_timed_out and not r.searched_nowhere]
    if survivors:
        lines += ["", f"Survivors: {', '.join(survivors)}"]
    if hung:
        names = ", ".join(r.name for r in hung)
        lines += ["", f"Timed out, not killed (a call past its time limit is no kill): {names}"]
    if not survivors and not hung:
        nowhere = sum(r.searched_nowhere for r in rows)
        lines += [
            "",
            f"Every mutant searched was killed ({nowhere} not searched at these levels)."
            if nowhere
            else "Every mutant was killed.",
        ]
    timeouts = [
        f"`{r.name}` at {lv}: "
        + ", ".join(f"`{item}`" for item in ids[:3])
        + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        for r in rows
        for lv, ids in r.timed_out.items()
        if ids
    ]
    if timeouts:
        lines += ["", "Calls past the time limit (no kill; the search went on): " + "; ".join(timeouts) + "."]
    not_searched = [r.name for r in rows if r.not_searched]
    if not_searched:
        lines += [
            "",
            f"Not searched at every level: {len(not_searched)} per-condition mutants, each searched only at the "
            "level where its planning decision is compared exactly (ports/mutants/conditions.py).",
        ]
    unproven = [f"`{r.name}` ({r.unproven})" for r in rows if r.guided and r.unproven]
    if unproven:
        lines += ["", "Reach unproven, run on every item: " + "; ".join(unproven) + "."]
    ran, decided = sum(sum(r.ran.values()) for r in rows), sum(sum(r.decided.values()) for r in rows)
    if ran < decided:
        lines += [
            "",
            f"The mutants ran {ran:,} of the {decided:,} item comparisons the matrix decided; on the rest the "
            "fault-free base was at parity without calling the mutant's fault sites, so the mutant's answer was "
            "the base's (ports/mutants/reach.py; `parity mutants --exhaustive` runs them all).",
        ]
    return "\n".join(lines) + "\n"


def write_matrix(rows: list[MutantRow], levels: tuple[str, ...], suite: str, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"suite": suite, "levels": list(levels), "mutants": [r.to_json() for r in rows]}
    (out_dir / "kill-matrix.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    (out_dir / "kill-matrix.md").write_text(render_matrix(rows, levels, suite), encoding="utf-8")
