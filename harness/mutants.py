"""The kill matrix: which parity level catches each seeded mutant, and where.

For every mutant and level, the suite's items of that level run in order until
the first one that does not reach parity (divergent or port-error): that item
killed the mutant at that level. A mutant no level kills survived, and the
suites need a sharper case.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.port import Port
from harness.runner import DIVERGENT, PORT_ERROR, CaseResult, plan_items, run_item
from harness.suites import Suite


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


def kill_matrix(
    oracle: Port,
    mutants: list[Any],
    suite: Suite,
    levels: tuple[str, ...],
    kernels: Any,
    on_kill: Callable[[Any, str, Kill, CaseResult], None] | None = None,
) -> list[MutantRow]:
    by_level = {lv: [(k, i) for k, i in plan_items(suite, (lv,))] for lv in levels}
    rows = []
    for mutant in mutants:
        row = MutantRow(mutant.name, mutant.description, mutant.source)
        for level in levels:
            kill, result = first_kill(oracle, mutant, by_level[level], kernels)
            if kill is not None and result is not None and on_kill is not None:
                on_kill(mutant, level, kill, result)
            row.kills[level] = kill
        rows.append(row)
    return rows


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
