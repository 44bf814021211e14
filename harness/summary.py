"""Aggregate figures of a run, shared by the printed summary and the JSON report."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from harness.model import Layout
from harness.runner import DIVERGENT, ORACLE_ERROR, PARITY, PORT_ERROR, CaseResult, RunResult

STATUSES = (PARITY, DIVERGENT, ORACLE_ERROR, PORT_ERROR)


def _utilisation(results: list[CaseResult], side: str) -> tuple[int, int, int]:
    """(chunks, rows used, rows available) of one side across layout cases."""
    chunks = used = available = 0
    for r in results:
        layout: Layout | None = getattr(r, f"{side}_layout")
        if layout is None:
            continue
        chunks += layout.num_chunks
        used += layout.rows_used()
        available += layout.num_chunks * r.row_budget
    return chunks, used, available


def _numeric(results: list[CaseResult]) -> dict[str, Any]:
    """Bit-exactness of one numeric level: items exact, worst ULP, merged histogram."""
    histogram: Counter[str] = Counter()
    max_ulp = 0
    nan_items = 0
    for r in results:
        for t in r.tensors:
            histogram.update(t.histogram)
            max_ulp = max(max_ulp, t.max_ulp)
            nan_items += bool(t.nan_oracle or t.nan_port)
    exact = sum(1 for r in results if r.tensors and all(t.exact for t in r.tensors))
    return {
        "items": len(results),
        "bit_exact": exact,
        "max_ulp": max_ulp,
        "histogram": dict(histogram),
        "nan": nan_items,
    }


def summarise(run: RunResult) -> dict[str, Any]:
    layout_results = [r for r in run.results if r.kind == "layout"]
    families: dict[str, Counter[str]] = defaultdict(Counter)
    levels: dict[str, Counter[str]] = defaultdict(Counter)
    for r in run.results:
        families[f"{r.level}/{r.family}"][r.status] += 1
        levels[r.level][r.status] += 1
    sides = {}
    for side in ("oracle", "port"):
        chunks, used, available = _utilisation(layout_results, side)
        sides[side] = {
            "chunks": chunks,
            "rows_used": used,
            "rows_available": available,
            "utilisation": used / available if available else None,
        }
    return {
        "suite": run.suite,
        "port": run.port,
        "verdict": "pass" if run.passed else "fail",
        "items": len(run.results),
        "layout_cases": len(layout_results),
        "workspace_configs": sum(1 for r in run.results if r.kind == "workspace"),
        "merge_cases": sum(1 for r in run.results if r.kind == "merge"),
        "prefill_cases": sum(1 for r in run.results if r.kind == "prefill"),
        "counts": {s: run.count(s) for s in STATUSES},
        "levels": {lv: {s: levels[lv][s] for s in STATUSES} for lv in run.levels},
        "families": {f: {s: c[s] for s in STATUSES} for f, c in sorted(families.items())},
        "numeric": {
            lv: _numeric([r for r in run.results if r.level == lv]) for lv in ("merge", "prefill") if lv in run.levels
        },
        "sides": sides,
        "seconds": round(run.seconds, 3),
    }


def format_summary(summary: dict[str, Any], first_failures: list[CaseResult]) -> str:
    counts = summary["counts"]
    lines = [
        f"suite {summary['suite']}  port {summary['port']}  verdict {summary['verdict'].upper()}",
        f"items {summary['items']} ({summary['layout_cases']} layout cases, "
        f"{summary['workspace_configs']} workspace configs, {summary['merge_cases']} merge cases, "
        f"{summary['prefill_cases']} prefill cases) in {summary['seconds']:.1f}s",
        f"parity {counts[PARITY]}  divergent {counts[DIVERGENT]}  "
        f"errors {counts[ORACLE_ERROR] + counts[PORT_ERROR]} "
        f"(oracle {counts[ORACLE_ERROR]}, port {counts[PORT_ERROR]})",
    ]
    for level, c in summary["levels"].items():
        errors = c[ORACLE_ERROR] + c[PORT_ERROR]
        lines.append(f"  {level:<8} parity {c[PARITY]:>5}  divergent {c[DIVERGENT]:>5}  errors {errors:>4}")
    for level, n in summary["numeric"].items():
        histogram = ", ".join(f"{k}: {v}" for k, v in n["histogram"].items()) or "-"
        lines.append(
            f"  {level:<8} bit-exact {n['bit_exact']}/{n['items']}, max {n['max_ulp']} ULP, "
            f"items with NaN {n['nan']}, ULP histogram {{{histogram}}}"
        )
    lines += ["", f"{'level/family':<30}{'items':>7}{'parity':>8}{'divergent':>11}{'errors':>8}"]
    for family, c in summary["families"].items():
        total = sum(c.values())
        errors = c[ORACLE_ERROR] + c[PORT_ERROR]
        lines.append(f"{family:<30}{total:>7}{c[PARITY]:>8}{c[DIVERGENT]:>11}{errors:>8}")
    lines.append("")
    lines.append(f"{'side':<10}{'chunks':>10}{'rows used':>14}{'rows available':>16}{'utilisation':>13}")
    for side, s in summary["sides"].items():
        util = f"{100 * s['utilisation']:.1f}%" if s["utilisation"] is not None else "-"
        lines.append(f"{side:<10}{s['chunks']:>10}{s['rows_used']:>14}{s['rows_available']:>16}{util:>13}")
    if first_failures:
        lines.append("")
        lines.append("first divergences:")
        for r in first_failures:
            lines.append(f"  {r.status:<10} {r.id}: {r.detail()}")
    return "\n".join(lines)
