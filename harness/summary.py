"""The results table and the summary computed from it.

Every consumer (the printed summary of ``parity run``, the gate's ``summary.md``
and parquet table, the nightly report, shard merging) goes through one pandas
table with a row per item, so a run split over shards and merged gives exactly
the summary of the unsharded run: the summary is a function of the table alone.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pandas as pd

from harness.bits import histogram_text, sorted_histogram, ulp_of_larger_text, ulp_text
from harness.model import Layout
from harness.runner import DIVERGENT, NOT_RUN, ORACLE_ERROR, PARITY, PORT_ERROR, CaseResult

STATUSES = (PARITY, DIVERGENT, ORACLE_ERROR, PORT_ERROR, NOT_RUN)
PASS, FAIL, INCOMPLETE = "pass", "fail", "incomplete"
COLUMNS = (
    "index",
    "id",
    "name",
    "family",
    "kind",
    "level",
    "status",
    "detail",
    "oracle_chunks",
    "port_chunks",
    "oracle_rows",
    "port_rows",
    "oracle_capacity",
    "port_capacity",
    "max_ulp",
    "max_ulp_of_larger",
    "mismatches",
    "elements",
    "nan",
    "histogram",
)


def _layout_figures(layout: Layout | None, row_budget: int) -> tuple[int, int, int]:
    if layout is None:
        return -1, 0, 0
    return layout.num_chunks, layout.rows_used(), layout.num_chunks * row_budget


def result_row(r: CaseResult) -> dict[str, Any]:
    oracle_chunks, oracle_rows, oracle_capacity = _layout_figures(r.oracle_layout, r.row_budget)
    port_chunks, port_rows, port_capacity = _layout_figures(r.port_layout, r.row_budget)
    histogram: Counter[str] = Counter()
    for t in r.tensors:
        histogram.update(t.histogram)
    return {
        "index": r.index,
        "id": r.id,
        "name": r.name,
        "family": r.family,
        "kind": r.kind,
        "level": r.level,
        "status": r.status,
        "detail": "" if r.ok else r.detail(),
        "oracle_chunks": oracle_chunks,
        "port_chunks": port_chunks,
        "oracle_rows": oracle_rows,
        "port_rows": port_rows,
        "oracle_capacity": oracle_capacity,
        "port_capacity": port_capacity,
        "max_ulp": max((t.max_ulp for t in r.tensors), default=0),
        "max_ulp_of_larger": max((t.max_ulp_of_larger for t in r.tensors), default=0.0),
        "mismatches": sum(t.mismatches for t in r.tensors),
        "elements": sum(t.elements for t in r.tensors),
        "nan": sum(t.nan_oracle + t.nan_port for t in r.tensors),
        "histogram": json.dumps(sorted_histogram(dict(histogram))),
    }


def results_table(results: list[CaseResult]) -> pd.DataFrame:
    return pd.DataFrame([result_row(r) for r in results], columns=list(COLUMNS))


# Columns a results table written before they existed lacks, and what stands in
# for them: NaN, "not measured", which the summaries print as such.
_LATER_COLUMNS = {"max_ulp_of_larger": float("nan")}


def with_later_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every column added since the first results format,
    unmeasured where an older run lacks it, so its table still summarises."""
    missing = {c: v for c, v in _LATER_COLUMNS.items() if c not in frame.columns}
    return frame.assign(**missing) if missing else frame


def _counts(frame: pd.DataFrame) -> dict[str, int]:
    counts = frame["status"].value_counts()
    return {s: int(counts.get(s, 0)) for s in STATUSES}


def _side(frame: pd.DataFrame, side: str) -> dict[str, Any]:
    planned = frame[(frame["kind"] == "layout") & (frame[f"{side}_chunks"] >= 0)]
    chunks, rows, capacity = (int(planned[c].sum()) for c in (f"{side}_chunks", f"{side}_rows", f"{side}_capacity"))
    return {
        "chunks": chunks,
        "rows_used": rows,
        "rows_available": capacity,
        "utilisation": rows / capacity if capacity else None,
    }


def _numeric(frame: pd.DataFrame) -> dict[str, Any]:
    """A level's figures. ``max_ulp`` is the raw distance (``bits.NAN_ULP`` or
    ``bits.INF_ULP`` when a non-finite value differs); ``max_ulp_of_larger`` the
    largest error in ULPs of the larger value (None where no row measured it);
    ``histogram`` is in numeric bucket order."""
    histogram: Counter[str] = Counter()
    for text in frame["histogram"]:
        histogram.update(json.loads(text))
    of_larger = frame["max_ulp_of_larger"].dropna()
    return {
        "items": len(frame),
        "bit_exact": int((frame["status"] == PARITY).sum()),
        "max_ulp": int(frame["max_ulp"].max()) if len(frame) else 0,
        "max_ulp_of_larger": float(of_larger.max()) if len(of_larger) else None,
        "histogram": sorted_histogram(dict(histogram)),
        "nan": int((frame["nan"] > 0).sum()),
    }


def numeric_text(numeric: dict[str, Any]) -> str:
    """One level's ULP figures as the summaries print them: ``bit-exact 42/42``
    alone when every item is; otherwise the raw maximum (``NaN``/``inf`` when a
    non-finite value differs), the largest error in ULPs of the larger value
    beside it where it differs (it is never larger), items holding a NaN, and
    the histogram in numeric order."""
    text = f"bit-exact {numeric['bit_exact']}/{numeric['items']}"
    if numeric["bit_exact"] == numeric["items"]:
        return text
    text += f", max {ulp_text(numeric['max_ulp'])} ULP"
    of_larger = numeric.get("max_ulp_of_larger")
    if of_larger and of_larger != numeric["max_ulp"]:
        text += f" (at most {ulp_of_larger_text(of_larger)} ULP of the larger value)"
    if numeric["nan"]:
        text += f", items with NaN {numeric['nan']}"
    histogram = histogram_text(numeric["histogram"])
    return text + (f", ULP histogram {{{histogram}}}" if histogram else "")


def table_verdict(frame: pd.DataFrame) -> str:
    """``pass`` only when there are items and every one is at parity; ``fail``
    when one diverges or errs; otherwise (some item ``not-run``) ``incomplete``.
    A table with no rows is never a pass: the CLI refuses such runs as usage."""
    statuses = set(frame["status"])
    if not statuses - {PARITY, NOT_RUN} and NOT_RUN in statuses:
        return INCOMPLETE
    return PASS if statuses == {PARITY} else FAIL


def summarise_table(frame: pd.DataFrame, suite: str, port: str, levels: tuple[str, ...]) -> dict[str, Any]:
    """Everything the summaries print, from the table alone (order-independent)."""
    frame = with_later_columns(frame).sort_values("index")
    by_family = {
        f"{level}/{family}": _counts(group) for (level, family), group in frame.groupby(["level", "family"], sort=True)
    }
    return {
        "suite": suite,
        "port": port,
        "verdict": table_verdict(frame),
        "items": len(frame),
        "layout_cases": int((frame["kind"] == "layout").sum()),
        "workspace_configs": int((frame["kind"] == "workspace").sum()),
        "merge_cases": int((frame["kind"] == "merge").sum()),
        "prefill_cases": int((frame["kind"] == "prefill").sum()),
        "counts": _counts(frame),
        "levels": {lv: _counts(frame[frame["level"] == lv]) for lv in levels},
        "families": by_family,
        "numeric": {lv: _numeric(frame[frame["level"] == lv]) for lv in ("merge", "prefill") if lv in levels},
        "sides": {side: _side(frame, side) for side in ("oracle", "port")},
    }


def format_summary(summary: dict[str, Any], first_failures: list[tuple[str, str, str]]) -> str:
    """The printed summary; ``first_failures`` are (status, item id, detail)."""
    counts = summary["counts"]
    seconds = f" in {summary['seconds']:.1f}s" if "seconds" in summary else ""
    device = f"  device {summary['device']}" if "device" in summary else ""
    lines = [
        f"suite {summary['suite']}  port {summary['port']}{device}  verdict {summary['verdict'].upper()}",
        f"items {summary['items']} ({summary['layout_cases']} layout cases, "
        f"{summary['workspace_configs']} workspace configs, {summary['merge_cases']} merge cases, "
        f"{summary['prefill_cases']} prefill cases){seconds}",
        f"parity {counts[PARITY]}  divergent {counts[DIVERGENT]}  "
        f"errors {counts[ORACLE_ERROR] + counts[PORT_ERROR]} "
        f"(oracle {counts[ORACLE_ERROR]}, port {counts[PORT_ERROR]})",
    ]
    if counts[NOT_RUN]:
        lines.append(f"not run {counts[NOT_RUN]} (levels the port does not implement; narrow them with --level)")
    # A selected level without items (merge, for layout-only case files) has nothing to say.
    for level, c in summary["levels"].items():
        if not sum(c.values()):
            continue
        errors = c[ORACLE_ERROR] + c[PORT_ERROR]
        not_run = f"  not run {c[NOT_RUN]:>5}" if c[NOT_RUN] else ""
        lines.append(f"  {level:<8} parity {c[PARITY]:>5}  divergent {c[DIVERGENT]:>5}  errors {errors:>4}{not_run}")
    for level, n in summary["numeric"].items():
        if n["items"]:
            lines.append(f"  {level:<8} {numeric_text(n)}")
    lines += ["", f"{'level/family':<30}{'items':>7}{'parity':>8}{'divergent':>11}{'errors':>8}"]
    for family, c in summary["families"].items():
        total = sum(c.values())
        errors = c[ORACLE_ERROR] + c[PORT_ERROR]
        lines.append(f"{family:<30}{total:>7}{c[PARITY]:>8}{c[DIVERGENT]:>11}{errors:>8}")
    if summary["layout_cases"]:
        lines.append("")
        lines.append(f"{'side':<10}{'chunks':>10}{'rows used':>14}{'rows available':>16}{'utilisation':>13}")
        for side, s in summary["sides"].items():
            util = f"{100 * s['utilisation']:.1f}%" if s["utilisation"] is not None else "-"
            lines.append(f"{side:<10}{s['chunks']:>10}{s['rows_used']:>14}{s['rows_available']:>16}{util:>13}")
    if first_failures:
        lines.append("")
        lines.append("first divergences:")
        for status, item, detail in first_failures:
            lines.append(f"  {status:<10} {item}: {detail}")
    return "\n".join(lines)
