"""The MC/DC table as ``parity coverage`` prints it, from
:class:`harness.search.mcdc.McdcReport`: one line per condition with its
status and the pair that shows it, or why it has none."""

from __future__ import annotations

from harness.search.mcdc import ConditionResult, McdcReport


def headline(report: McdcReport) -> str:
    shown = sum(c.status in ("unique-cause", "masking") for c in report.conditions)
    infeasible = sum(c.status == "infeasible" for c in report.conditions)
    verdict = "met" if report.met else "NOT MET"
    parts = [f"{shown} shown by a pair", f"{infeasible} infeasible (reason given)", f"{len(report.unmet)} UNMET"]
    disagreeing = sum(len(d.disagreements) for d in report.decisions)
    if disagreeing:
        parts.append(f"{disagreeing} DISAGREEMENTS between the table and the oracle")
    return (
        f"MC/DC of suite {report.suite}: {verdict}: {len(report.decisions)} decisions, "
        f"{len(report.conditions)} conditions: {', '.join(parts)}"
    )


def _condition_line(result: ConditionResult) -> str:
    status = "UNMET" if result.status == "unmet" else result.status
    line = f"    {status:<12} {result.condition.name}: {result.condition.text}"
    if result.pair is not None:
        a, b = result.pair.items
        oa, ob = result.pair.outcomes
        line += f"\n                 pair {a} ({oa!r}) / {b} ({ob!r})"
    elif result.reason:
        line += f"\n                 {result.reason}"
    elif result.status == "unmet":
        line += "\n                 no two items differ in it and in the decision"
    if result.condition.coupled and result.status == "masking":
        line += f"\n                 masking MC/DC: {result.condition.coupled}"
    return line


def render_text(report: McdcReport) -> str:
    """Every decision, then each condition's status and pair."""
    out = [headline(report), ""]
    for decision in report.decisions:
        mark = "" if decision.met else "  <- NOT MET"
        out.append(f"{decision.decision.id} ({decision.decision.upstream}; {decision.observations} observations){mark}")
        out.append(f"  {decision.decision.text}")
        if decision.decision.transcribed:
            out.append(f"  outcome read from the harness's transcription of {decision.decision.transcribed} (pinned)")
        for line in decision.disagreements:
            out.append(f"    DISAGREES {line}")
        out += [_condition_line(c) for c in decision.conditions]
    return "\n".join(out) + "\n"
