"""``summary.md``: the gate's verdict, small enough for a PR comment.

It holds the verdict (PASS, FAIL, or INCOMPLETE when items the port does not
implement stand in the way), counts per level and per level/family (levels
without items left out), each numeric level's ULP figures as ``parity run``
prints them (:func:`reports.run_summary.numeric_text`), the baseline's effect
(expected, new, stale), and the first new divergences, each with the
``parity diff`` command that reproduces it and why the baseline does not
expect it (``beyond baseline: 30298 ULP > cap 8 (...)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.sides.items import DIVERGENT, ORACLE_ERROR, PARITY, PORT_ERROR
from harness.verdicts.launch import PORT_DIR_NOTE, shell_join, uses_port_dir
from harness.verdicts.reproduce import printed_id, reproduce_from_meta
from harness.verdicts.summary import layout_causes, message_groups
from reports.failure_text import failure_lines
from reports.run_summary import numeric_text

if TYPE_CHECKING:
    from harness.verdicts.gate import GateOutcome

SHOWN = 10


def _cell(text: str, limit: int = 160) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_gate_summary(outcome: GateOutcome) -> str:
    meta, summary, verdict = outcome.meta, outcome.summary, outcome.verdict
    mark = verdict.verdict.upper()
    shard = f", shard {meta['shard']}" if meta.get("shard") else ""
    lines = [
        f"## Parity gate: {mark}",
        "",
        f"Port `{meta['port']}` against the oracle {meta['pin']}, suite `{meta['suite']}`{shard}: "
        f"{summary['items']} items, {len(verdict.new)} new divergences, {len(verdict.expected)} expected "
        f"(baseline), {len(verdict.stale)} stale baseline entries.",
    ]
    if meta.get("interrupted"):
        lines += [
            "",
            f"**Interrupted (Ctrl-C)**: {meta['interrupted']}; the items it did not reach are not run, "
            "so this gate cannot pass. Run it again to finish.",
        ]
    elif meta.get("stopped"):
        lines += [
            "",
            f"**Stopped early**: {meta['stopped']}. The items it did not reach are not run, so this gate cannot "
            "pass; what it compared is below.",
        ]
    elif not verdict.not_run.empty:
        lines += [
            "",
            f"**{len(verdict.not_run)} items not run**: at levels port `{meta['port']}` does not implement, "
            "or sparse L3 batches the oracle routes to sparse MQA (compared at sparse-layout only); nothing was "
            "compared there (narrow the gate with `--level`; each row says why).",
        ]
    if meta.get("rejudged"):
        lines += ["", f"**Re-judged (`parity merge --rejudge`)**: {meta['rejudged']}."]
    if meta.get("oracle_drift_overridden"):
        lines += ["", "**Oracle fingerprints overridden: the oracle may not be the pinned upstream.**"]
    if not verdict.stale_checked:
        lines += ["", "Stale baseline entries are checked when the shards are merged (`parity merge`)."]
    lines += [
        "",
        "| level | items | parity | divergent | port errors | oracle errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    # A selected level without items (a layout-only suite at --level all) gets no empty row.
    for level, c in summary["levels"].items():
        total = sum(c.values())
        if total:
            lines.append(f"| {level} | {total} | {c[PARITY]} | {c[DIVERGENT]} | {c[PORT_ERROR]} | {c[ORACLE_ERROR]} |")
    for level, n in summary["numeric"].items():
        if n["items"]:
            lines += ["", f"{level}: {numeric_text(n)}"]
    for level, what in summary.get("l3_compares", {}).items():
        lines += ["", f"{level} compared {what}."]
    new = verdict.new
    if not new.empty:
        groups = message_groups(new)

        def shown_id(item_id: str) -> str:
            return printed_id(item_id, meta.get("suite"), meta.get("size"), meta.get("cases"), meta.get("numeric_size"))

        causes = layout_causes(verdict.table)
        heading = f"### New divergences ({len(new)}, {len(groups)} distinct messages; first {min(SHOWN, len(groups))})"
        lines += ["", heading, ""]
        if uses_port_dir(shell_join(meta.get("launch") or [])):
            lines += [PORT_DIR_NOTE, ""]
        for group in groups[:SHOWN]:
            row = next(group.itertuples(index=False))
            said = failure_lines(row, causes)
            # Long enough for a float item's first difference, its two values and the inputs there.
            lines.append(f"- `{shown_id(row.id)}` {row.status}: {_cell(said[0], limit=480)}")
            lines += [f"  {_cell(line)}" for line in said[1:]]
            if len(group) > 1:
                more = ", ".join(f"`{shown_id(i)}`" for i in group["id"].iloc[1:4])
                lines.append(f"  and {len(group) - 1} more saying the same: {more}{', ...' if len(group) > 4 else ''}")
            lines.append(f"  baseline: {_cell(row.reason)}")
            lines.append(f"  reproduce: `{reproduce_from_meta(row.name, row.kind, meta)}`")
            if row.id in meta.get("shrunk", {}):
                lines.append(f"  shrunk: {meta['shrunk'][row.id]}")
    if verdict.stale:
        heading = "### Stale or miscounted baseline entries (no failing item matches them, or not as many: re-measure)"
        lines += ["", heading, ""]
        lines += [f"- {e.label}: {e.reason}" for e in verdict.stale]
    families = [(f, c) for f, c in summary["families"].items() if c[PARITY] != sum(c.values())]
    if families:
        lines += ["", "<details><summary>Families with failures</summary>", ""]
        lines += ["| level/family | items | parity | divergent | errors |", "|---|---:|---:|---:|---:|"]
        for family, c in families:
            errors = c[PORT_ERROR] + c[ORACLE_ERROR]
            lines.append(f"| {family} | {sum(c.values())} | {c[PARITY]} | {c[DIVERGENT]} | {errors} |")
        lines += ["", "</details>"]
    expected = verdict.expected
    if not expected.empty:
        # One line per entry that expected something: its label says what it covers.
        by_entry = expected.groupby(["baseline_entry", "reason"]).size().sort_values(ascending=False, kind="stable")
        lines += ["", "<details><summary>Expected divergences (baseline)</summary>", ""]
        lines += [f"- {count} items, {entry}: {_cell(reason)}" for (entry, reason), count in by_entry.items()]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def write_gate_summary(outcome: GateOutcome, path: Path) -> None:
    path.write_text(render_gate_summary(outcome), encoding="utf-8")
