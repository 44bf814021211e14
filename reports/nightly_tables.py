"""The nightly page's tables, as DataFrames: the ports tonight against the
night before, the verdict per port and level, each port's families by level,
chunks per family, explore's properties, the mutant kill matrix, and the first
failing items with the command that reproduces each.

Both renderings of the page (reports/nightly.py: HTML and Markdown) show these
same tables, so they say the same thing; colouring them is
reports/nightly_html.py's. Invariants a reader must keep: a table is made from
the night's data alone (harness/night/data.py) and the history's records, and
computes no verdict of its own: each count and verdict is the baseline's
(:func:`harness.night.data.tally`); a failing item's reproduce command is the
night's own (its port spelling, suite, ``--size``, oracle and drift override).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.night.data import EXPECTED_ONLY, FAIL, INCOMPLETE, NO_ITEMS, PASS, Night, PortNight, Tally, tally
from harness.sides.items import NOT_RUN, PARITY
from harness.verdicts.reproduce import printed_id, reproduce_command
from reports.nightly_plots import chunk_ratios, layout_items, unplannable_counts

# A verdict (harness.night.data.Tally.verdict) as the tables show it.
VERDICT_TEXT: dict[str, str] = {
    PASS: "PASS",
    EXPECTED_ONLY: "EXPECTED",
    FAIL: "FAIL",
    INCOMPLETE: "INCOMPLETE",
    NO_ITEMS: "-",
}


def _verdict_row(label: dict[str, Any], counts: Tally) -> dict[str, Any]:
    return {
        **label,
        "items": counts.items,
        "parity": counts.parity,
        "expected": counts.expected,
        "new": counts.new,
        "not run": counts.not_run,
        "verdict": VERDICT_TEXT[counts.verdict],
    }


# How a port failing tonight and the night before is marked: "failing since DATE (N nights)".
FAILING_SINCE = "failing since"


def _previous(history: pd.DataFrame, date: str, port: str) -> dict[str, Any] | None:
    """The port's latest history record before ``date``, or None."""
    if history.empty:
        return None
    rows = history[(history["port"] == port) & (history["date"] < date)]
    if rows.empty:
        return None
    record: dict[str, Any] = rows.sort_values("date", kind="stable").iloc[-1].to_dict()
    return record


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and pd.isna(value))


def _verdict_of(record: dict[str, Any]) -> str:
    """A history record's verdict (a line from before verdicts were recorded: by its parity rate)."""
    verdict = record.get("verdict")
    if _known(verdict):
        return str(verdict)
    return PASS if record.get("pass_rate") == 1.0 else "unknown"


def failing_since(history: pd.DataFrame, date: str, port: str) -> tuple[str, int]:
    """The first night of the port's run of failing nights that ends tonight
    (tonight failing), and how many nights that run holds, tonight's included."""
    since, nights = date, 1
    if history.empty:
        return since, nights
    before = history[(history["port"] == port) & (history["date"] < date)].sort_values("date", kind="stable")
    for record in reversed(before.to_dict("records")):
        if _verdict_of(record) != FAIL:
            break
        since, nights = str(record["date"]), nights + 1
    return since, nights


def since_previous(verdict: str, previous: dict[str, Any] | None, streak: tuple[str, int] | None = None) -> str:
    """How the port's verdict compares with the previous night's: ``NEW FAILURE``
    when it fails tonight and did not then; ``failing since DATE (N nights)``
    when it failed then too (``streak``: :func:`failing_since`), ``fixed``,
    ``unchanged``; ``first night`` with no previous record."""
    if previous is None:
        return "first night"
    before = _verdict_of(previous)
    if verdict == FAIL:
        if before != FAIL:
            return "NEW FAILURE"
        since, nights = streak or (str(previous.get("date")), 2)
        return f"{FAILING_SINCE} {since} ({nights} nights)"
    if verdict == INCOMPLETE:
        # Items not run tonight: nothing can be said fixed, whatever the night before.
        return "unchanged" if before == INCOMPLETE else "now incomplete"
    if before == FAIL:
        return "fixed"
    return "unchanged"


def ports_table(night: Night, history: pd.DataFrame) -> pd.DataFrame:
    """One row per port: its verdict against its baseline and the previous night's."""
    rows = []
    for p in night.ports:
        previous = _previous(history, night.date, p.port)
        if previous is None:
            before = "-"
        elif _known(previous.get("verdict")):
            new = previous.get("new")
            count = f", {int(new)} new" if new is not None and _known(new) else ""
            before = f"{VERDICT_TEXT.get(str(previous['verdict']), previous['verdict'])}{count} ({previous['date']})"
        elif _known(previous.get("pass_rate")):
            before = f"parity {float(previous['pass_rate']):.1%} ({previous['date']})"
        else:
            before = f"recorded ({previous['date']})"
        if previous is not None and previous.get("reduced") is True:
            before = before[:-1] + ", a reduced night)"
        row = _verdict_row({"port": p.port, "baseline": p.baseline or "none"}, p.tally)
        since = since_previous(p.verdict, previous, failing_since(history, night.date, p.port))
        rows.append({**row, "previous night": before, "since previous night": since})
    columns = ["port", "baseline", "items", "parity", "expected", "new", "not run", "verdict"]
    return pd.DataFrame(rows, columns=[*columns, "previous night", "since previous night"])


def verdict_table(night: Night) -> pd.DataFrame:
    """One row per port and level: its items by how the baseline judged them."""
    rows = []
    for p in night.ports:
        for level in p.summary["levels"]:
            counts = tally(p.table[p.table["level"] == level])
            rows.append(_verdict_row({"port": p.port, "level": level}, counts))
    columns = ["port", "level", "items", "parity", "expected", "new", "not run", "verdict"]
    return pd.DataFrame(rows, columns=columns)


def family_level_table(port: PortNight) -> pd.DataFrame:
    """Per family (rows) and level (columns), "parity/items" and, in the hidden
    frame attribute ``verdicts``, each cell's verdict (for its colour)."""
    table = port.table
    levels = [lv for lv in port.summary["levels"] if (table["level"] == lv).any()]
    # One pass over the table: every (family, level) cell's rows at once.
    cells = dict(iter(table.groupby(["family", "level"], sort=False)))
    rows, verdicts = [], []
    for family in sorted(table["family"].unique()):
        row: dict[str, Any] = {"family": family}
        marks: dict[str, str] = {}
        for level in levels:
            cell = cells.get((family, level))
            if cell is None:
                row[level] = ""
                continue
            counts = tally(cell)
            row[level] = f"{counts.parity}/{counts.items}" + (f" ({counts.new} new)" if counts.new else "")
            marks[level] = counts.verdict
        rows.append(row)
        verdicts.append(marks)
    frame = pd.DataFrame(rows, columns=["family", *levels])
    frame.attrs["verdicts"] = verdicts
    return frame


def chunk_table(night: Night) -> pd.DataFrame:
    """Per family and side (the oracle, then each port): chunks, workspace
    utilisation and unplannable cases, and the side's mean chunks per case
    relative to the oracle (:func:`chunk_ratios`). Long, not wide: one row per
    family and side, so the table fits the page however many ports ran."""
    if not night.ports:
        return pd.DataFrame()
    ratios = chunk_ratios(night)
    unplannable = unplannable_counts(night)
    sides = [("oracle", night.ports[0], "oracle"), *((p.port, p, "port") for p in night.ports)]
    rows = []
    for family in unplannable.index:
        for name, port, side in sides:
            layout = layout_items(port.table)
            cases = layout[layout["family"] == family]
            planned = cases[cases[f"{side}_chunks"] >= 0]
            capacity = int(planned[f"{side}_capacity"].sum())
            ratio = 1.0 if side == "oracle" else ratios[name].get(family) if name in ratios else None
            rows.append(
                {
                    "family": family,
                    "side": name,
                    "cases": len(cases),
                    "chunks": int(planned[f"{side}_chunks"].sum()),
                    "utilisation": f"{planned[f'{side}_rows'].sum() / capacity:.1%}" if capacity else "-",
                    "unplannable": int(unplannable.at[family, name]),
                    "chunks per case / oracle": "-" if ratio is None or pd.isna(ratio) else f"{ratio:.2f}",
                }
            )
    return pd.DataFrame(rows)


def explore_table(result: dict[str, Any]) -> pd.DataFrame:
    """One row per searched property of a ``parity explore`` result (its JSON form)."""
    columns = ["name", "examples", "refused", "seconds", "ended_by", "finds"]
    return pd.DataFrame([{c: run[c] for c in columns} for run in result["properties"]], columns=columns)


# A level none of whose items calls a mutant's fault cannot catch it (harness/search/mutants.py's reach pass).
NOT_REACHED = "n/a"
NOWHERE = "n/a at every level run"
NOT_SEARCHED = "not searched"
# A mutant no level killed, by its cells: a survivor first, then one that only timed out.
UNKILLED = (("survived", "SURVIVED"), ("timed out", "timed out"))
KILL_NOTE = (
    "n/a (grey): no item of that level calls the mutant's fault (ports/mutants/reach.py: the fault-free base "
    "on those items never reaches its fault sites), so its bug cannot show there; survived (red): items of "
    "that level reached the fault and none diverged; not searched (grey): a per-condition mutant is searched "
    "only at the level where its planning decision is compared exactly."
)


def kill_cell(mutant: dict[str, Any], level: str) -> str:
    """``killed``; ``timed out`` when a call ran past its limit there (no kill);
    ``n/a`` when the mutant ran on no item of the level (none reaches its fault);
    else ``survived``. A matrix without ``ran`` (older) has no n/a."""
    if mutant["kills"].get(level):
        return "killed"
    if level in mutant.get("not_searched", []):
        return NOT_SEARCHED
    if (mutant.get("timed_out") or {}).get(level):
        return "timed out"
    return NOT_REACHED if mutant.get("ran", {}).get(level) == 0 else "survived"


def kill_matrix_table(matrix: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for m in matrix["mutants"]:
        first = next((k for k in m["kills"].values() if k), None)
        cells = {lv: kill_cell(m, lv) for lv in matrix["levels"]}
        unkilled = next((shown for cell, shown in UNKILLED if cell in cells.values()), NOWHERE)
        rows.append(
            {"mutant": m["name"], "bug": m["description"], "source": m["source"], **cells,
             "first kill": first["item"] if first else unkilled}
        )  # fmt: skip
    return pd.DataFrame(rows)


def reproduce_line(night: Night, port: str, name: str, kind: str) -> str:
    """The ``parity diff`` command that compares one of the night's items again,
    as the night ran it: the port's ``--ports`` spelling, the suite, its ``--size`` and ``--numeric-size``,
    the CPU, the default timeout, and the oracle and drift override it ran with."""
    oracle = night.provenance.get("oracle", {})
    return reproduce_command(
        name,
        kind,
        night.suite,
        night.port_specs.get(port, port),
        "cpu",
        size=night.sizes.get("size"),
        numeric_size=night.sizes.get("numeric_size"),
        allow_oracle_drift=bool(oracle.get("oracle_drift_overridden")),
        oracle=oracle.get("release"),
    )


def failing_items(port: PortNight, limit: int = 10, night: Night | None = None) -> pd.DataFrame:
    """The first failing items, new ones first: id, status, baseline, reason and
    (given the ``night``) the command that reproduces each."""
    table = port.table
    failing = table[~table["status"].isin([PARITY, NOT_RUN])].copy()
    if "baseline" not in failing.columns:
        failing["baseline"], failing["reason"] = "new", failing["detail"]
    failing["order"] = (failing["baseline"] != "new").astype(int)
    failing = failing.sort_values(["order", "index"], kind="stable").head(limit)
    reasons = [
        str(reason) if label == "expected" else f"{reason}: {detail}" if reason else str(detail)
        for label, reason, detail in zip(failing["baseline"], failing["reason"], failing["detail"], strict=True)
    ]
    # An id carries what defines its item: the night's suite and generated size.
    ids = (
        [
            printed_id(str(i), night.suite, night.sizes.get("size"), numeric_size=night.sizes.get("numeric_size"))
            for i in failing["id"]
        ]
        if night is not None
        else list(failing["id"])
    )
    shown = pd.DataFrame(
        {"id": ids, "status": list(failing["status"]), "baseline": list(failing["baseline"]), "why": reasons}
    )
    if night is not None:
        shown["reproduce"] = [
            reproduce_line(night, port.port, str(name), str(kind))
            for name, kind in zip(failing["name"], failing["kind"], strict=True)
        ]
    return shown


def not_shown(port: PortNight, shown: int) -> str:
    """What the page says of the failing items past the first ones it lists."""
    failing = int((~port.table["status"].isin([PARITY, NOT_RUN])).sum())
    if failing <= shown:
        return ""
    return (
        f"and {failing - shown} more failing items, not listed here: every row (id, status, detail) is in "
        f"results-{port.port}.parquet beside this page, and `diff ID` as above reproduces any of them"
    )
