"""The coverage table as ``parity coverage`` prints it and the nightly report
and docs/search.md show it, from :class:`harness.search.coverage_verdicts.JudgedCoverage`."""

from __future__ import annotations

from collections.abc import Iterable

from harness.search.coverage import FEATURE_BY_ID, Value, beyond
from harness.search.coverage_verdicts import JudgedCoverage, Verdict, verdict_word


def format_measured(feature_id: str, value: Value) -> str:
    feature = FEATURE_BY_ID.get(feature_id)
    if value is None:
        return "-"
    if isinstance(value, dict):
        labels: Iterable[str] = feature.labels if feature else sorted(value)
        return " ".join(f"{label}:{value.get(label, 0)}" for label in labels)
    if isinstance(value, list):
        return "{" + ", ".join(map(str, value)) + "}"
    crossed = beyond(value) if feature and feature.widths else []
    return f"{value} (>= {', '.join(crossed)})" if crossed else str(value)


def verdict_text(verdict: Verdict) -> str:
    if verdict.met is None:
        return verdict_word(verdict) or "-"
    if verdict.met:
        return "met"
    return f"MISSED (lacks {', '.join(map(str, verdict.missing))})" if verdict.missing else "MISSED"


def table_rows(judged: JudgedCoverage) -> list[dict[str, str]]:
    """One row per feature: feature, what it is, measured, target, verdict."""
    return [
        {
            "feature": v.feature,
            "what": v.description,
            "measured": format_measured(v.feature, v.measured),
            "target": v.target.describe() if v.target else "-",
            "verdict": verdict_text(v),
        }
        for v in judged.verdicts
    ]


def headline(judged: JudgedCoverage) -> str:
    if not judged.rows:
        refused = f", {len(judged.missed)} MISSED (refused inputs)" if judged.missed else ""
        return f"Coverage of suite {judged.suite}: no targets in {judged.targets_file}{refused}"
    met = judged.targets - len(judged.missed)
    missed = f", {len(judged.missed)} MISSED" if judged.missed else ""
    return f"Coverage of suite {judged.suite}: {met}/{judged.targets} targets met{missed} ({judged.targets_file})"


def render_text(
    judged: JudgedCoverage, measured_width: int = 60, target_width: int = 44, verdict_width: int = 44
) -> str:
    """The command's table: feature, measured, target, verdict. Long cells wrap
    within their column (nothing is cut: ``--json`` has the same values)."""
    import textwrap

    columns = ("feature", "measured", "target", "verdict")
    rows = table_rows(judged)
    caps = {"measured": measured_width, "target": target_width, "verdict": verdict_width}
    widths = {c: min(caps.get(c, 1 << 16), max(len(c), *(len(r[c]) for r in rows))) for c in columns}

    def lines_of(cells: dict[str, str]) -> list[str]:
        wrapped = {c: textwrap.wrap(cells[c], widths[c], break_on_hyphens=False) or [""] for c in columns}
        height = max(len(w) for w in wrapped.values())
        return [
            "  ".join((wrapped[c][i] if i < len(wrapped[c]) else "").ljust(widths[c]) for c in columns).rstrip()
            for i in range(height)
        ]

    out = [headline(judged), "", *lines_of({c: c for c in columns})]
    for row in rows:
        out += lines_of(row)
    return "\n".join(out) + "\n"


def render_markdown(judged: JudgedCoverage) -> str:
    """A Markdown table (for the nightly report and docs/search.md)."""
    lines = ["| feature | what | measured | target | verdict |", "|---|---|---|---|---|"]
    for r in table_rows(judged):
        cells = [r["feature"], r["what"], r["measured"], r["target"], r["verdict"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
