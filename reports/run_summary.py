"""The summary ``parity run`` prints, and the one-line numeric verdict the gate
summary shares, rendered from :func:`harness.verdicts.summary.summarise_table`'s dict."""

from __future__ import annotations

from typing import Any

from harness.compare.ulp_text import histogram_text, max_distance_text, ulp_of_larger_text
from harness.model.levels import count_key, counted_as, kind_specs
from harness.sides.items import DIVERGENT, NOT_RUN, ORACLE_ERROR, PARITY, PORT_ERROR
from harness.verdicts.launch import PORT_DIR_NOTE, uses_port_dir


def numeric_text(numeric: dict[str, Any]) -> str:
    """One level's ULP figures as the summaries print them: ``bit-exact 42/42``
    alone when every item is; otherwise the raw maximum (``NaN``/``inf`` when a
    non-finite value differs), the largest error in ULPs of the larger value
    beside it where it differs (it is never larger), items holding a NaN, and
    the histogram in numeric order."""
    items, compared = numeric["items"], numeric.get("compared", numeric["items"])
    not_run = numeric.get("not_run", 0)
    if items and not_run == items:
        return f"not run ({items} items: nothing compared)"
    text = f"bit-exact {numeric['bit_exact']}/{items}"
    if not_run:
        text += f", not run {not_run}"
    if numeric["bit_exact"] == items:
        return text
    if not compared:
        return text + ", no tensors compared (every other item an error)"
    text += f", {max_distance_text(numeric['max_ulp'])}"
    of_larger = numeric.get("max_ulp_of_larger")
    if of_larger and of_larger != numeric["max_ulp"]:
        text += f" (at most {ulp_of_larger_text(of_larger)} ULP of the larger value)"
    if numeric["nan"]:
        text += f", items with NaN {numeric['nan']}"
    histogram = histogram_text(numeric["histogram"])
    return text + (f", ULP histogram {{{histogram}}}" if histogram else "")


def format_summary(summary: dict[str, Any], first_failures: list[tuple[str, str, str, str]]) -> str:
    """The printed summary; ``first_failures`` are (status, item id, detail,
    the command that reproduces the item)."""
    counts = summary["counts"]
    seconds = f" in {summary['seconds']:.1f}s" if "seconds" in summary else ""
    device = f"  device {summary['device']}" if "device" in summary else ""
    # Every registered kind's count, in suite order.
    counted = ", ".join(f"{summary.get(count_key(kind), 0)} {counted_as(kind)}" for kind in kind_specs())
    lines = [
        f"suite {summary['suite']}  port {summary['port']}{device}  verdict {summary['verdict'].upper()}",
        f"items {summary['items']} ({counted}){seconds}",
        f"parity {counts[PARITY]}  divergent {counts[DIVERGENT]}  "
        f"errors {counts[ORACLE_ERROR] + counts[PORT_ERROR]} "
        f"(oracle {counts[ORACLE_ERROR]}, port {counts[PORT_ERROR]})",
    ]
    if counts[NOT_RUN]:
        lines.append(
            f"not run {counts[NOT_RUN]} (items at levels the port does not implement, narrowed with --level, "
            "sparse L3 batches the oracle routes where L3 does not compare, "
            "or that an interrupted run did not reach)"
        )
    # A selected level without items (merge, for layout-only case files) has nothing to say.
    for level, c in summary["levels"].items():
        if not sum(c.values()):
            continue
        errors = c[ORACLE_ERROR] + c[PORT_ERROR]
        not_run = f"  not run {c[NOT_RUN]:>5}" if c[NOT_RUN] else ""
        lines.append(f"  {level:<13} parity {c[PARITY]:>5}  divergent {c[DIVERGENT]:>5}  errors {errors:>4}{not_run}")
    for level, n in summary["numeric"].items():
        if n["items"]:
            lines.append(f"  {level:<13} {numeric_text(n)}")
    for level, what in summary.get("l3_compares", {}).items():
        lines.append(f"  {level} compared {what}")
    lines += ["", f"{'level/family':<30}{'items':>7}{'parity':>8}{'divergent':>11}{'errors':>8}"]
    for family, c in summary["families"].items():
        total = sum(c.values())
        errors = c[ORACLE_ERROR] + c[PORT_ERROR]
        lines.append(f"{family:<30}{total:>7}{c[PARITY]:>8}{c[DIVERGENT]:>11}{errors:>8}")
    if any(summary.get(count_key(kind)) for kind in kind_specs() if kind.plan_figures):
        lines.append("")
        lines.append(f"{'side':<10}{'chunks':>10}{'rows used':>14}{'rows available':>16}{'utilisation':>13}")
        for side, s in summary["sides"].items():
            util = f"{100 * s['utilisation']:.1f}%" if s["utilisation"] is not None else "-"
            lines.append(f"{side:<10}{s['chunks']:>10}{s['rows_used']:>14}{s['rows_available']:>16}{util:>13}")
    if first_failures:
        lines.append("")
        lines.append("first divergences:")
        if any(uses_port_dir(command) for *_, command in first_failures):
            lines.append(f"  ({PORT_DIR_NOTE})")
        for status, item, detail, command in first_failures:
            lines.append(f"  {status:<10} {item}: {detail}")
            lines.append(f"    reproduce: {command}")
    return "\n".join(lines)
