"""The kill matrix: which parity level catches each seeded mutant, and where.

For every mutant and level, the suite's items of that level run in order until
the first one that does not reach parity (divergent or port-error): that item
killed the mutant at that level. A mutant no level kills survived, and the
suites need a sharper case.

Each (mutant, level) search is independent of the others: with a worker pool
(:mod:`harness.pool`) they run side by side, one task each, the kill shrunk in
the worker that found it; the matrix is assembled in mutant and level order, so
it is the same whatever the number of workers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.port import Port
from harness.runner import DIVERGENT, PORT_ERROR, CaseResult, plan_items, run_item
from harness.suites import Suite

if TYPE_CHECKING:
    from harness.pool import WorkerPool, WorkerSides


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

    @property
    def killed(self) -> bool:
        return any(k is not None for k in self.kills.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "killed": self.killed,
            "kills": {lv: (k.__dict__ if k else None) for lv, k in self.kills.items()},
        }


def first_kill(
    oracle: Port, mutant: Port, items: list[tuple[str, Any]], kernels: Any
) -> tuple[Kill | None, CaseResult | None]:
    for tried, (kind, item) in enumerate(items, start=1):
        result = run_item(oracle, mutant, kind, item, kernels)
        if result.status in (DIVERGENT, PORT_ERROR):
            return Kill(result.id, result.status, result.detail(), tried), result
    return None, None


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
    oracle: Port, mutant: Port, level: str, kill: Kill, result: CaseResult, case: Any, how: ShrinkKills, kernels: Any
) -> None:
    """Shrink a layout or prefill kill of a case (not of a workspace config or a
    merge case) into ``<directory>/<mutant>-<level>.json``; ``kill.shrunk`` says
    what came of it."""
    if case is None or level not in ("layout", "prefill") or result.kind == "workspace":
        return
    kill.shrunk = how.shrink(oracle, mutant, case, how.directory / f"{mutant.name}-{level}.json", level, kernels)


@dataclass(frozen=True)
class KillSearch:
    """One (mutant, level) search for a worker: the mutant by spec (``mutant:NAME``),
    the level's items in order, and how to shrink its kill (None: not at all)."""

    mutant_spec: str
    level: str
    items: list[tuple[str, Any]]
    shrink: ShrinkKills | None


def search_kill(sides: WorkerSides, search: KillSearch) -> Iterator[tuple[Kill | None, CaseResult | None]]:
    """In a worker: :func:`first_kill`, then the kill shrunk as :func:`shrink_kill` does."""
    mutant = sides.port(search.mutant_spec)
    kill, result = first_kill(sides.oracle, mutant, search.items, sides.kernels)
    if kill is not None and result is not None and search.shrink is not None:
        case = _case_of(search.items, result)
        shrink_kill(sides.oracle, mutant, search.level, kill, result, case, search.shrink, sides.kernels)
    yield kill, result


def _case_of(items: list[tuple[str, Any]], result: CaseResult) -> Any:
    """The case a killing layout or prefill item compared (None for other kinds)."""
    if result.kind not in ("layout", "prefill"):
        return None
    return next((item for kind, item in items if kind == result.kind and item.name == result.name), None)


def kill_matrix(
    oracle: Port,
    mutants: list[Any],
    suite: Suite,
    levels: tuple[str, ...],
    kernels: Any,
    on_kill: Callable[[Any, str, Kill, CaseResult], None] | None = None,
    *,
    shrink: ShrinkKills | None = None,
    pool: WorkerPool | None = None,
) -> list[MutantRow]:
    """Every mutant's first kill at every level. A kill is shrunk as ``shrink``
    says when given (:func:`shrink_kill`), then passed to ``on_kill``.
    With ``pool`` the searches run in its workers, which load each mutant by
    name (``mutant:NAME``: the mutants of :mod:`ports.mutants`)."""
    by_level = {lv: [(k, i) for k, i in plan_items(suite, (lv,))] for lv in levels}
    searches = [(position, mutant, level) for position, mutant in enumerate(mutants) for level in levels]
    if pool is None:
        outcomes = []
        for _, mutant, level in searches:
            kill, result = first_kill(oracle, mutant, by_level[level], kernels)
            if kill is not None and result is not None and shrink is not None:
                case = _case_of(by_level[level], result)
                shrink_kill(oracle, mutant, level, kill, result, case, shrink, kernels)
            outcomes.append((kill, result))
    else:
        from harness.pool import Task

        tasks = [
            Task(
                run=search_kill,
                payload=KillSearch(f"mutant:{mutant.name}", level, by_level[level], shrink),
                what=f"the kill search of mutant {mutant.name} at {level}",
            )
            for _, mutant, level in searches
        ]
        outcomes = list(pool.run(tasks))
    rows = [MutantRow(mutant.name, mutant.description, mutant.source) for mutant in mutants]
    for (position, mutant, level), (kill, result) in zip(searches, outcomes, strict=True):
        if kill is not None and result is not None and on_kill is not None:
            on_kill(mutant, level, kill, result)
        rows[position].kills[level] = kill
    return rows


def estimated_matrix_seconds(suite: Suite, levels: tuple[str, ...], mutants: int) -> float:
    """Single-process seconds of a kill matrix, for the default ``--jobs``: each
    search is counted at a tenth of its level's items (most mutants die early)."""
    from harness.pool import estimated_seconds

    return sum(estimated_seconds(k for k, _ in plan_items(suite, (lv,))) for lv in levels) * mutants / 10


def render_matrix(rows: list[MutantRow], levels: tuple[str, ...], suite: str) -> str:
    killed = sum(r.killed for r in rows)
    lines = [
        f"## Kill matrix: suite `{suite}`, {killed}/{len(rows)} mutants killed",
        "",
        "| mutant | source | " + " | ".join(levels) + " | first kill |",
        "|---|---|" + "---|" * len(levels) + "---|",
    ]
    for r in rows:
        cells = ["killed" if r.kills.get(lv) else "survived" for lv in levels]
        first = next((k for k in r.kills.values() if k), None)
        where = f"`{first.item}`" + (f" (shrunk: `{first.shrunk}`)" if first and first.shrunk else "") if first else "-"
        lines.append(f"| {r.name}: {r.description} | {r.source} | " + " | ".join(cells) + f" | {where} |")
    survivors = [r.name for r in rows if not r.killed]
    lines += ["", f"Survivors: {', '.join(survivors)}" if survivors else "Every mutant was killed."]
    return "\n".join(lines) + "\n"


def write_matrix(rows: list[MutantRow], levels: tuple[str, ...], suite: str, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"suite": suite, "levels": list(levels), "mutants": [r.to_json() for r in rows]}
    (out_dir / "kill-matrix.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    (out_dir / "kill-matrix.md").write_text(render_matrix(rows, levels, suite), encoding="utf-8")
