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

from harness.compare.ulp_text import sorted_histogram
from harness.model import Layout
from harness.model.levels import FLOAT_LEVELS, KINDS, TextEnum, count_key, kind_spec, kinds_where
from harness.sides.items import DIVERGENT, NOT_RUN, ORACLE_ERROR, PARITY, PORT_ERROR, CaseResult

STATUSES = (PARITY, DIVERGENT, ORACLE_ERROR, PORT_ERROR, NOT_RUN)


class Verdict(TextEnum):
    """A run's verdict (:func:`verdict_of`)."""

    PASS = "pass"
    FAIL = "fail"
    INCOMPLETE = "incomplete"


PASS, FAIL, INCOMPLETE = Verdict
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
    "port_layout_digest",
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
        # The layout the port planned (at L1) or ran its prefill request on (an external port, at L3).
        "port_layout_digest": r.port_layout.digest() if r.port_layout is not None else "",
    }


def planned_over() -> dict[str, str]:
    """Each kind whose items run over a layout the port planned, and that
    layout's kind (:attr:`harness.model.levels.KindSpec.caused_by`)."""
    return {k: c for k in KINDS if (c := kind_spec(k)[0].caused_by) is not None}


def layout_causes(table: pd.DataFrame) -> dict[str, str]:
    """For each failing L3 item whose case's layout diverges too (same name, its
    layout kind divergent), by item id: the note said before its own detail. The
    L3 loop runs over the port's layout, so its tensors differ because its
    chunks do: the layout is the cause to fix first."""
    # Each kind whose divergence has a likely cause, and the kind of that cause.
    cause_of = planned_over()
    divergent_layouts = set(
        table.loc[(table["status"] == DIVERGENT) & table["kind"].isin(set(cause_of.values())), "id"]
    )
    causes = {}
    failing = table[table["kind"].isin(set(cause_of)) & (table["status"] != PARITY)]
    for row in failing.itertuples(index=False):
        layout_id = f"{row.name}[{cause_of[row.kind]}]"
        if layout_id in divergent_layouts:
            causes[row.id] = cause_note(layout_id)
    return causes


def cause_note(layout_id: str) -> str:
    """What every report says before a failing L3 item's detail when its layout diverges too."""
    return f"its layout diverges too ({layout_id}): the likely cause, fix it first"


def _count_key(kind: str) -> str:
    return count_key(kind_spec(kind)[0])


def check_prefill_layouts(table: pd.DataFrame) -> pd.DataFrame:
    """An L3 item whose port ran its prefill request on another layout than the
    one it returned for the same case at L1 in this run is the port's error,
    whatever its tensors say: a port plans one way per case. Only items whose
    port reported the layout it ran (an external port) and whose case's L1 item
    ran are checked; the rest are returned unchanged."""
    table = with_later_columns(table)
    differs = pd.Series(False, index=table.index)
    # Each kind run over a layout (KindSpec.caused_by) against that layout's own item.
    for kind, cause in planned_over().items():
        planned = table[(table["kind"] == cause) & (table["port_layout_digest"] != "")]
        at_l1 = dict(zip(planned["name"], planned["port_layout_digest"], strict=True))
        ran = (table["kind"] == kind) & (table["port_layout_digest"] != "")
        ran &= table["status"].isin((PARITY, DIVERGENT)) & table["name"].isin(at_l1)
        differs |= ran & (table["port_layout_digest"] != table["name"].map(at_l1))
    if differs.any():
        table = table.copy()
        table.loc[differs, "status"] = PORT_ERROR
        table.loc[differs, "detail"] = REPLANNED
    return table


REPLANNED = (
    "its prefill request ran on another layout than the one the port returned for this case at L1 "
    "(a port plans one way per case)"
)


def apply_table_verdicts(table: pd.DataFrame, results: list[CaseResult]) -> None:
    """Give ``results`` the port-errors :func:`check_prefill_layouts` found in
    ``table``, so every output (the JSON report's items too) says the same."""
    replanned = set(table.loc[(table["status"] == PORT_ERROR) & (table["detail"] == REPLANNED), "id"])
    for result in results:
        if result.id in replanned:
            result.status, result.error, result.tensors = PORT_ERROR, REPLANNED, []


def message_groups(rows: pd.DataFrame) -> list[pd.DataFrame]:
    """``rows`` grouped by what they say (status, level and detail, with every
    number stood in for), in order of each group's first row: one port-error
    repeated on a thousand items is one group, and the next bug is the next line."""
    if rows.empty:
        return []
    shape = rows["status"] + "|" + rows["level"] + "|" + rows["detail"].str.replace(_NUMBER, "#", regex=True)
    return [group for _, group in rows.groupby(shape, sort=False)]


_NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def results_table(results: list[CaseResult]) -> pd.DataFrame:
    return pd.DataFrame([result_row(r) for r in results], columns=list(COLUMNS))


# Columns a results table written before they existed lacks, and what stands in
# for them: NaN, "not measured", which the summaries print as such.
_LATER_COLUMNS: dict[str, Any] = {"max_ulp_of_larger": float("nan"), "port_layout_digest": ""}


def with_later_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every column added since the first results format,
    unmeasured where an older run lacks it, so its table still summarises."""
    missing = {c: v for c, v in _LATER_COLUMNS.items() if c not in frame.columns}
    return frame.assign(**missing) if missing else frame


def _counts(frame: pd.DataFrame) -> dict[str, int]:
    counts = frame["status"].value_counts()
    return {s: int(counts.get(s, 0)) for s in STATUSES}


def _side(frame: pd.DataFrame, side: str) -> dict[str, Any]:
    planning = kinds_where(lambda kind, level: kind.plan_figures)
    planned = frame[frame["kind"].isin(planning) & (frame[f"{side}_chunks"] >= 0)]
    chunks, rows, capacity = (int(planned[c].sum()) for c in (f"{side}_chunks", f"{side}_rows", f"{side}_capacity"))
    return {
        "chunks": chunks,
        "rows_used": rows,
        "rows_available": capacity,
        "utilisation": rows / capacity if capacity else None,
    }


def _numeric(frame: pd.DataFrame) -> dict[str, Any]:
    """A level's figures. ``compared`` counts the items whose tensors were
    compared (parity or divergent), ``not_run`` those never run. ``max_ulp`` is
    the raw distance over the compared items (``ulp_text.NAN_ULP`` or
    ``ulp_text.INF_ULP`` when a non-finite value differs); ``max_ulp_of_larger`` the
    largest error in ULPs of the larger value (None where no row measured it);
    ``histogram`` is in numeric bucket order."""
    histogram: Counter[str] = Counter()
    for text in frame["histogram"]:
        histogram.update(json.loads(text))
    of_larger = frame["max_ulp_of_larger"].dropna()
    # Only items whose tensors were compared have a distance: an error or a not-run item has none.
    measured = frame[frame["status"].isin((PARITY, DIVERGENT))]
    return {
        "items": len(frame),
        "compared": len(measured),
        "not_run": int((frame["status"] == NOT_RUN).sum()),
        "bit_exact": int((frame["status"] == PARITY).sum()),
        "max_ulp": int(measured["max_ulp"].max()) if len(measured) else 0,
        "max_ulp_of_larger": float(of_larger.max()) if len(of_larger) else None,
        "histogram": sorted_histogram(dict(histogram)),
        "nan": int((frame["nan"] > 0).sum()),
    }


def _compared(frame: pd.DataFrame, kind: str) -> bool:
    return bool(((frame["kind"] == kind) & frame["status"].isin((PARITY, DIVERGENT))).any())


def _l3_compared(frame: pd.DataFrame, l3_compares: dict[str, str]) -> dict[str, Any]:
    """``{"l3_compares": {level: what}}`` for the L3 levels whose tensors were compared."""
    compared = {level: what for level, what in l3_compares.items() if _compared(frame, level)}
    return {"l3_compares": compared} if compared else {}


def table_verdict(frame: pd.DataFrame) -> str:
    """``pass`` only when there are items and every one is at parity; ``fail``
    when one diverges or errs; otherwise (some item ``not-run``) ``incomplete``.
    A table with no rows is never a pass: the CLI refuses such runs as usage."""
    statuses = set(frame["status"])
    if not statuses - {PARITY, NOT_RUN} and NOT_RUN in statuses:
        return INCOMPLETE
    return PASS if statuses == {PARITY} else FAIL


def summarise_table(
    frame: pd.DataFrame,
    suite: str,
    port: str,
    levels: tuple[str, ...],
    l3_compares: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Everything the summaries print, from the table alone (order-independent);
    ``l3_compares`` says what the port's prefill items compared
    (:func:`harness.protocol.port.l3_compares`), recorded where the table has any."""
    frame = with_later_columns(frame).sort_values("index")
    by_family = {
        f"{level}/{family}": _counts(group) for (level, family), group in frame.groupby(["level", "family"], sort=True)
    }
    return {
        "suite": suite,
        "port": port,
        "verdict": table_verdict(frame),
        "items": len(frame),
        # Each kind's count, under the key its level names (KindSpec.count_key).
        **{_count_key(kind): int((frame["kind"] == kind).sum()) for kind in KINDS},
        "counts": _counts(frame),
        "levels": {lv: _counts(frame[frame["level"] == lv]) for lv in levels},
        "families": by_family,
        "numeric": {lv: _numeric(frame[frame["level"] == lv]) for lv in FLOAT_LEVELS if lv in levels},
        "sides": {side: _side(frame, side) for side in ("oracle", "port")},
        # Said only where a prefill item's tensors were compared (nothing compared claims nothing).
        **_l3_compared(frame, l3_compares or {}),
    }
