"""The nightly parity report: ``<out>/<date>/index.html`` (one self-contained
file: tables inline, plots embedded as PNG data, no network) and ``report.md``.

The page answers first "is anything broken that was not broken the night
before": one row per port with its verdict against its baseline (PASS, EXPECTED:
only divergences the baseline expects, FAIL: a new one), its new and expected
counts, and how that compares with the previous night in the history. Then,
per port and level, the same; family-by-level tables coloured by verdict; chunk
counts and workspace utilisation per family, plotted per case relative to the
oracle with the unplannable batches counted; ULP histograms for ports that are
not bit-exact; the mutant kill matrix; coverage; explore; the latest GPU report
(dated, and marked when it is not tonight's); the history (parity rate and new
divergences over the nights that exist); provenance. A night still running, or
stopped, is written with an INCOMPLETE banner that says which. The header states
the night's sizes, and a night smaller than the defaults is marked REDUCED; each
failing item carries the ``parity diff`` command that reproduces it; the kill
matrix says n/a where no item of a level reaches a mutant's fault; each port has
one colour in every plot (reports/nightly_plots.py, which draws them).

The night's data (Night, PortNight, the history store) is harness/night/nightly.py's;
this module only renders it (:func:`write_report` is the night's writer).
"""

from __future__ import annotations

import datetime
import html
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from harness.night.history import DEFAULT_EXPLORE_BUDGET_S, numeric_defaults
from harness.night.nightly import (
    EXPECTED_ONLY,
    FAIL,
    INCOMPLETE,
    NO_ITEMS,
    PASS,
    Night,
    PortNight,
    Tally,
    explore_verdict,
    gpu_report_date,
    judges_explore,
    night_verdict,
    read_history,
    tally,
)
from harness.sides.items import LEVELS, PARITY
from harness.verdicts.reproduce import printed_id, reproduce_command
from reports.coverage import headline, table_rows
from reports.coverage import render_markdown as coverage_markdown
from reports.drift_report import upstream_since_pin
from reports.gpu import (
    environment_line,
    gpu_section_markdown,
    merge_table,
    parity_table,
    prefill_table,
    section_problem,
)
from reports.nightly_plots import (
    chunk_figure,
    chunk_ratios,
    history_figures,
    layout_items,
    plot_attributes,
    png,
    port_colours,
    reduced_mask,
    ulp_histogram_figure,
    unplannable_counts,
)
from reports.run_summary import numeric_text

# The data model lives in the harness; these names are re-exported for the callers that know them from here.
__all__ = [
    "Night",
    "PortNight",
    "chunk_figure",
    "chunk_ratios",
    "explore_verdict",
    "history_figures",
    "read_history",
    "render_html",
    "render_markdown",
    "ulp_histogram_figure",
    "unplannable_counts",
    "write_report",
]

VERDICT_TEXT = {PASS: "PASS", EXPECTED_ONLY: "EXPECTED", FAIL: "FAIL", INCOMPLETE: "INCOMPLETE", NO_ITEMS: "-"}
# The CSS class of a verdict cell; the classes' colours are the page's legend.
VERDICT_CLASS = {PASS: "pass", EXPECTED_ONLY: "expected", FAIL: "fail", INCOMPLETE: "incomplete"}
HEADLINE = "Verdict (every port, against its baseline)"


# -- tables ------------------------------------------------------------------------------------


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


def since_previous(verdict: str, previous: dict[str, Any] | None) -> str:
    """How the port's verdict compares with the previous night's: ``NEW FAILURE``
    when it fails tonight and did not then; ``still failing``, ``fixed``,
    ``unchanged``; ``first night`` with no previous record."""
    if previous is None:
        return "first night"
    before = previous.get("verdict")
    if not _known(before):
        # A line from before verdicts were recorded: judge by its parity rate.
        before = PASS if previous.get("pass_rate") == 1.0 else "unknown"
    if verdict == FAIL:
        return "still failing" if before == FAIL else "NEW FAILURE"
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
        rows.append({**row, "previous night": before, "since previous night": since_previous(p.verdict, previous)})
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
    rows, verdicts = [], []
    for family, group in table.groupby("family", sort=True):
        row: dict[str, Any] = {"family": family}
        marks: dict[str, str] = {}
        for level in levels:
            cell = group[group["level"] == level]
            if cell.empty:
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


NOT_JUDGED = " (not judged: the port has expected divergences, so its finds do not fail the night)"


def _explore_judged(night: Night, result: dict[str, Any]) -> bool:
    port = next((p for p in night.ports if p.port == result["port"]), None)
    return port is None or judges_explore(port)


def explore_table(result: dict[str, Any]) -> pd.DataFrame:
    """One row per searched property of a ``parity explore`` result (its JSON form)."""
    columns = ["name", "examples", "refused", "seconds", "ended_by", "finds"]
    return pd.DataFrame([{c: run[c] for c in columns} for run in result["properties"]], columns=columns)


# A level none of whose items calls a mutant's fault cannot catch it (harness/search/mutants.py's reach pass).
NOT_REACHED = "n/a"
NOWHERE = "n/a at every level run"
KILL_CLASS = {"killed": "pass", "survived": "fail", "SURVIVED": "fail", NOT_REACHED: "na", NOWHERE: "na"}
KILL_CLASS["timed out"] = "incomplete"  # a call past its time limit: nothing was compared
# A mutant no level killed, by its cells: a survivor first, then one that only timed out.
UNKILLED = (("survived", "SURVIVED"), ("timed out", "timed out"))
KILL_NOTE = (
    "n/a (grey): no item of that level calls the mutant's fault (ports/mutants/reach.py: the fault-free base "
    "on those items never reaches its fault sites), so its bug cannot show there; survived (red): items of "
    "that level reached the fault and none diverged."
)


def kill_cell(mutant: dict[str, Any], level: str) -> str:
    """``killed``; ``timed out`` when a call ran past its limit there (no kill);
    ``n/a`` when the mutant ran on no item of the level (none reaches its fault);
    else ``survived``. A matrix without ``ran`` (older) has no n/a."""
    if mutant["kills"].get(level):
        return "killed"
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
    as the night ran it: the port's ``--ports`` spelling, the suite, its ``--size``,
    the CPU, the default timeout, and the oracle and drift override it ran with."""
    oracle = night.provenance.get("oracle", {})
    return reproduce_command(
        name,
        kind,
        night.suite,
        night.port_specs.get(port, port),
        "cpu",
        size=night.sizes.get("size"),
        allow_oracle_drift=bool(oracle.get("oracle_drift_overridden")),
        oracle=oracle.get("release"),
    )


def failing_items(port: PortNight, limit: int = 10, night: Night | None = None) -> pd.DataFrame:
    """The first failing items, new ones first: id, status, baseline, reason and
    (given the ``night``) the command that reproduces each."""
    table = port.table
    failing = table[~table["status"].isin([PARITY, "not-run"])].copy()
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
        [printed_id(str(i), night.suite, night.sizes.get("size")) for i in failing["id"]]
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
    failing = int((~port.table["status"].isin([PARITY, "not-run"])).sum())
    if failing <= shown:
        return ""
    return (
        f"and {failing - shown} more failing items, not listed here: every row (id, status, detail) is in "
        f"results-{port.port}.parquet beside this page, and `diff ID` as above reproduces any of them"
    )


# -- HTML --------------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1150px; }
h1 { margin-bottom: 0.2em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; }
.verdict { font-size: 1.4em; font-weight: bold; padding: 0.4em 0.8em; display: inline-block; }
.pass { background: #d9f2d9; }
.fail { background: #f7c6c6; }
.expected { background: #fff0c2; }
.new { background: #c62828; color: #fff; font-weight: bold; }
.incomplete { background: #dde3ee; }
.banner { border: 2px solid #e0b000; padding: 0.6em; font-weight: bold; }
.stale { background: #fff0c2; border-left: 6px solid #e08000; padding: 0.5em 0.8em; font-weight: bold; }
.legend span { padding: 1px 6px; margin-right: 0.6em; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0; }
code, pre { background: #f6f6f6; padding: 0 3px; }
.na { background: #e4e4e4; color: #555; }
td.reproduce { font-family: monospace; font-size: 0.85em; user-select: all; word-break: break-all; }
.reduced { background: #fff0c2; }
"""

CellClass = Callable[[int, str, Any], str | None]


_NUMERIC_TEXT = re.compile(r"^-?[0-9][0-9,]*(\.[0-9]+)?%?$")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numeric_cell(value: Any) -> bool:
    """Numbers, and text that is one (``1.84``, ``29.5%``), align right."""
    return _is_number(value) or (isinstance(value, str) and bool(_NUMERIC_TEXT.match(value)))


def html_table(
    frame: pd.DataFrame, table_id: str | None = None, css: str | None = None, cell_class: CellClass | None = None
) -> str:
    """``frame`` as an HTML table: one header row of its columns, no index;
    numbers right-aligned (class ``num``), text left; ``cell_class(row, column,
    value)`` adds a class (its colour) to a cell."""
    attributes = (f' id="{html.escape(table_id)}"' if table_id else "") + (
        f' class="{html.escape(css)}"' if css else ""
    )
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for i, row in enumerate(frame.itertuples(index=False, name=None)):
        cells = []
        for column, value in zip(frame.columns, row, strict=True):
            value = value.item() if hasattr(value, "item") else value
            classes = [
                c
                for c in ("num" if _numeric_cell(value) else None, cell_class and cell_class(i, str(column), value))
                if c
            ]
            shown = "" if value is None or (isinstance(value, float) and pd.isna(value)) else value
            attribute = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attribute}>{html.escape(str(shown))}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table{attributes}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def verdict_cell_class(row: int, column: str, value: Any) -> str | None:
    """The colours of the verdict tables: the verdict by its kind; a non-zero
    new count is ``new``, a non-zero expected count ``expected``."""
    if column == "verdict":
        kind = {text: key for key, text in VERDICT_TEXT.items()}.get(str(value))
        return VERDICT_CLASS.get(kind or "")
    if column == "new" and _is_number(value) and value:
        return "new"
    if column == "expected" and _is_number(value) and value:
        return "expected"
    if column == "since previous night":
        return {"NEW FAILURE": "new", "still failing": "fail", "fixed": "pass"}.get(str(value))
    return None


def family_html(port: PortNight) -> str:
    """The port's family-by-level table, each cell coloured by its verdict."""
    families = family_level_table(port)
    marks: list[dict[str, str]] = families.attrs["verdicts"]
    return html_table(
        families, css="families", cell_class=lambda row, column, _: VERDICT_CLASS.get(marks[row].get(column, ""))
    )


HISTORY_REDUCED = (
    "Reduced nights (smaller than the nightly defaults) are drawn apart from full nights: a dotted line with "
    "diamonds, labelled 'reduced nights', never a point on a full night's solid line."
)


def failing_cell_class(row: int, column: str, value: Any) -> str | None:
    """A failing item's baseline cell by its judgement; its command is copied with one click."""
    return str(value) if column == "baseline" else "reproduce" if column == "reproduce" else None


def _plot(fig: Any, alt: str) -> str:
    """A figure as an embedded PNG, with the colour each port was drawn in (``data-port-colours``)."""
    colours = html.escape(plot_attributes(fig))
    source = f"data:image/png;base64,{png(fig)}"
    return f'<img class="plot" alt="{html.escape(alt)}" data-port-colours="{colours}" src="{source}">'


def colour_key(colours: dict[str, str]) -> str:
    """The colour of each port in every plot, as a table (``data-colour`` on each swatch)."""
    rows = "".join(
        f'<tr><td>{html.escape(port)}</td><td class="swatch" data-colour="{colour}" '
        f'style="background: {colour}; color: #fff">{colour}</td></tr>'
        for port, colour in colours.items()
    )
    head = "<thead><tr><th>port</th><th>its colour in every plot</th></tr></thead>"
    return f'<table id="port-colours">{head}<tbody>{rows}</tbody></table>'


def sizes_line(night: Night) -> str | None:
    """What the night ran: its ``--size``, ``--numeric-size``, levels, mutants and
    explore, each beside the default; None for a night that recorded none."""
    sizes = night.sizes
    if not sizes:
        return None
    defaults = sizes.get("defaults") or {}
    size, numeric = sizes.get("size"), sizes.get("numeric_size")
    default_size = f"{defaults['size']:,}" if defaults.get("size") is not None else "the suite's"
    default_numeric = numeric_defaults(defaults.get("numeric") or {}) or "the suite's"
    levels = sizes.get("levels") or []
    size_text = f"{default_size} (default)" if size is None else f"{size:,} (default {default_size})"
    numeric_text = f"default ({default_numeric})" if numeric is None else f"{numeric:,} (defaults: {default_numeric})"
    return (
        f"Sizes: --size {size_text}; --numeric-size {numeric_text}; "
        f"levels {'all' if tuple(levels) == LEVELS else ', '.join(levels)}; "
        f"mutant kill matrix {'run' if sizes.get('mutants') else 'not run'}; "
        f"explore {float(sizes.get('explore_budget_s', 0)):g} s per port (default {DEFAULT_EXPLORE_BUDGET_S:g} s)."
    )


def reduced_banner(night: Night) -> str | None:
    if not night.reduced:
        return None
    return (
        f"REDUCED night, smaller than the nightly defaults: {'; '.join(night.reduced)}. "
        "Its figures do not compare with a full night's; its history points are drawn apart from full nights'."
    )


def incomplete_banner(night: Night) -> str | None:
    """What a night that is not complete says: still running (and what is still
    to come), or where it stopped; None for a complete night."""
    if night.complete:
        return None
    step = night.pending[0] if night.pending else None
    done = f"{night.items_done} of {night.expected_items} items"
    if night.interrupted:
        where = f" during {step}" if step else ""
        return f"INCOMPLETE: the run stopped{where}, after {done}; the figures below cover only what finished."
    later = f"; still to come: {', '.join(night.pending[1:])}" if len(night.pending) > 1 else ""
    return (
        f"INCOMPLETE: the night is still running ({step or 'starting'}{later}); {done} so far. "
        "This page is rewritten as the night goes on; the figures below cover only what finished."
    )


def _days_apart(night_date: str, report_date: str) -> int | None:
    try:
        return (datetime.date.fromisoformat(night_date) - datetime.date.fromisoformat(report_date)).days
    except ValueError:
        return None


def gpu_staleness(night: Night) -> str | None:
    """Why the night's GPU section is not tonight's (its report is of another
    day), or None when it is tonight's or there is none."""
    if night.gpu is None:
        return None
    date = gpu_report_date(*night.gpu)
    if date == night.date:
        return None
    days = _days_apart(night.date, date)
    when = f"{abs(days)} day{'s' if abs(days) != 1 else ''} {'before' if days > 0 else 'after'}" if days else "not"
    return (
        f"Not measured tonight: this GPU report is from {date}, {when} this night ({night.date}); "
        "its figures are that day's."
    )


def gpu_section_html(night: Night) -> str:
    """The night's GPU section: the latest GPU report's tables under its date."""
    assert night.gpu is not None
    path, report = night.gpu
    date = gpu_report_date(path, report)
    stale = gpu_staleness(night)
    title = f"GPU: report of {date}, not tonight's" if stale else f"GPU: tonight's report ({date})"
    parts = [f'<h2 id="gpu">{html.escape(title)}</h2>']
    if stale:
        parts.append(f'<p class="stale" id="gpu-stale">{html.escape(stale)}</p>')
    parts.append(f"<p>From <code>{html.escape(str(path))}</code>: {html.escape(environment_line(report))}.</p>")
    for heading, section, table in (
        ("Parity on the GPU", "parity", parity_table),
        ("Merge kernel", "merge", merge_table),
        ("Prefill context loop", "prefill", prefill_table),
    ):
        parts.append(f"<h3>{heading}</h3>")
        problem = section_problem(report.get(section))
        parts.append(f"<p>{html.escape(problem)}</p>" if problem else html_table(table(report)))
    return "\n".join(parts)


LEGEND = (
    '<p class="legend"><span class="pass">PASS: every item at parity</span>'
    '<span class="expected">EXPECTED: every divergence is one the port\'s baseline expects (a pass)</span>'
    '<span class="fail">FAIL: a divergence not in the baseline</span>'
    '<span class="new">new: items the baseline does not expect</span>'
    '<span class="incomplete">INCOMPLETE: items not run</span></p>'
)


def _headline(night: Night) -> str:
    return f"{HEADLINE}: {night_verdict(night)}"


def render_html(night: Night, history: pd.DataFrame) -> str:
    verdict = night_verdict(night)
    css_class = {"PASS": "pass", "FAIL": "fail"}.get(verdict, "incomplete")
    oracle = night.provenance.get("oracle", {})
    reduced = " (reduced)" if night.reduced else ""
    # One colour per port in every plot: tonight's ports and the history's, sorted.
    colours = port_colours((p.port for p in night.ports), history["port"] if "port" in history else ())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Nightly parity {html.escape(night.date)}{reduced}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>Nightly parity report: {html.escape(night.date)}{reduced}</h1>",
        f"<p>Suite <code>{html.escape(night.suite)}</code>; pinned oracle "
        f"{html.escape(str(oracle.get('release', '?')))} "
        f"(upstream {html.escape(str(oracle.get('upstream_commit', '?')))}).</p>",
    ]
    sizes = sizes_line(night)
    if sizes:
        parts.append(f'<p id="sizes">{html.escape(sizes)}</p>')
    if night.reduced:
        parts.append(f'<p class="banner reduced" id="reduced">{html.escape(reduced_banner(night) or "")}</p>')
    parts.append(f'<div id="verdict" class="verdict {css_class}">{html.escape(_headline(night))}</div>')
    banner = incomplete_banner(night)
    if banner:
        parts.append(f'<p class="banner incomplete" id="incomplete">{html.escape(banner)}</p>')
    parts += [
        "<h2>Ports tonight, against their baselines</h2>",
        html_table(ports_table(night, history), "ports", cell_class=verdict_cell_class),
        LEGEND,
        f"<p>Each port has one colour in every plot (the oracle's bars are grey):</p>{colour_key(colours)}",
        "<h2>Verdict per port and level</h2>",
        html_table(verdict_table(night), "verdicts", cell_class=verdict_cell_class),
    ]
    chunks = chunk_table(night)
    if not chunks.empty:
        parts += ["<h2>Chunks and workspace utilisation per family</h2>", html_table(chunks, "chunks")]
    figure = chunk_figure(night, colours)
    if figure is not None:
        parts.append(_plot(figure, "chunks per family"))
    for p in night.ports:
        baseline = f" (baseline <code>{html.escape(p.baseline)}</code>)" if p.baseline else " (no baseline)"
        parts.append(f"<h2>Port {html.escape(p.port)}{baseline}</h2>")
        parts.append(family_html(p))
        for level, what in p.summary.get("l3_compares", {}).items():
            parts.append(f'<p class="note">{html.escape(level)} compared {html.escape(what)}.</p>')
        histogram = ulp_histogram_figure(p, colours)
        if histogram is not None:
            parts.append(_plot(histogram, f"{p.port} ULP histogram"))
        failing = failing_items(p, night=night)
        if not failing.empty:
            parts.append("<h3>First failing items (new first), each with the command that reproduces it</h3>")
            parts.append(html_table(failing, f"failing-{p.port}", "failing", failing_cell_class))
            more = not_shown(p, len(failing))
            if more:
                parts.append(f'<p class="note">{html.escape(more)}</p>')
    if night.kill_matrix:
        killed = sum(m["killed"] for m in night.kill_matrix["mutants"])
        parts.append(f"<h2>Mutant kill matrix: {killed}/{len(night.kill_matrix['mutants'])} killed</h2>")
        kills = kill_matrix_table(night.kill_matrix)
        parts.append(html_table(kills, "kill-matrix", cell_class=lambda _, c, value: KILL_CLASS.get(str(value))))
        parts.append(f'<p class="note">{html.escape(KILL_NOTE)}</p>')
    if night.coverage:
        parts.append(f'<h2 id="coverage">{html.escape(headline(night.coverage))}</h2>')
        parts.append(html_table(pd.DataFrame(table_rows(night.coverage)), "coverage-table"))
    if night.explore:
        parts.append('<h2 id="explore">Property-based exploration (parity explore)</h2>')
        for result in night.explore:
            note = "" if _explore_judged(night, result) else NOT_JUDGED
            parts.append(
                f"<h3>{html.escape(result['port_spec'])}: {html.escape(result['verdict'].upper())}"
                f"{html.escape(note)}</h3>"
            )
            parts.append(html_table(explore_table(result), css="explore"))
            for find in result["finds"]:
                parts.append(
                    f"<p>{html.escape(find['property'])}, {html.escape(find['status'])}: "
                    f"{html.escape(find['detail'])}<br><code>{html.escape(find['command'])}</code></p>"
                )
    if night.gpu:
        parts.append(gpu_section_html(night))
    if night.drift:
        path, record = night.drift
        lines = upstream_since_pin(record)
        parts.append('<h2 id="upstream">Upstream since the pin</h2>')
        parts.append(f"<p>From <code>{html.escape(str(path))}</code>. {html.escape(lines[0])}</p>")
        items = "".join(f"<li>{html.escape(line[2:])}</li>" for line in lines if line[:2] == "- ")
        parts.append(f"<ul>{items}</ul>")
    parts.append("<h2>History</h2>")
    images = [_plot(fig, alt) for alt, fig in history_figures(history, colours)]
    if images and reduced_mask(history).any():
        images.insert(0, f'<p id="history-reduced">{html.escape(HISTORY_REDUCED)}</p>')
    parts += images or ["<p>No history yet.</p>"]
    parts += [
        "<h2>Provenance</h2>",
        f"<pre id='provenance'>{html.escape(json.dumps(night.provenance, indent=2, sort_keys=True))}</pre>",
        "</body></html>",
    ]
    return "\n".join(parts)


# -- Markdown ------------------------------------------------------------------------------------


def render_markdown(night: Night, history: pd.DataFrame | None = None) -> str:
    history = history if history is not None else pd.DataFrame()
    lines = [f"# Nightly parity report: {night.date}{' (reduced)' if night.reduced else ''}", ""]
    lines += [f"{text}", ""] if (text := sizes_line(night)) else []
    lines += [f"**{text}**", ""] if (text := reduced_banner(night)) else []
    lines += [f"{HEADLINE}: **{night_verdict(night)}**", ""]
    banner = incomplete_banner(night)
    if banner:
        lines += [banner.replace("INCOMPLETE", "**INCOMPLETE**", 1), ""]
    if night.ports:
        lines += [ports_table(night, history).to_markdown(index=False), ""]
        lines += [verdict_table(night).to_markdown(index=False), ""]
    chunks = chunk_table(night)
    if not chunks.empty:
        lines += ["## Chunks per family", "", chunks.to_markdown(index=False), ""]
    for p in night.ports:
        lines += [f"## {p.port}", "", family_level_table(p).to_markdown(index=False), ""]
        for level, n in p.summary["numeric"].items():
            lines.append(f"- {level}: {numeric_text(n)}")
        lines += [f"- {level} compared {what}" for level, what in p.summary.get("l3_compares", {}).items()]
        failing = failing_items(p, night=night)
        lines += ["", "First failing items (new first):", ""] if not failing.empty else []
        lines += [f"- `{r.id}` {r.status} ({r.baseline}): `{r.reproduce}`" for r in failing.itertuples(index=False)]
        more = not_shown(p, len(failing))
        lines += [f"- {more}"] if more else []
        lines.append("")
    if night.kill_matrix:
        killed = sum(m["killed"] for m in night.kill_matrix["mutants"])
        lines += [f"## Mutant kill matrix: {killed}/{len(night.kill_matrix['mutants'])} killed", ""]
        lines += [kill_matrix_table(night.kill_matrix).to_markdown(index=False), "", KILL_NOTE, ""]
    if night.coverage:
        lines += [f"## {headline(night.coverage)}", "", coverage_markdown(night.coverage)]
    if night.explore:
        lines += ["## Property-based exploration (parity explore)", ""]
        for result in night.explore:
            note = "" if _explore_judged(night, result) else f"_{result['port_spec']}{NOT_JUDGED}_\n"
            lines += [note + result["markdown"]]
    if night.gpu:
        path, report = night.gpu
        date = gpu_report_date(path, report)
        stale = gpu_staleness(night)
        lines += [f"## GPU: report of {date}, NOT tonight's" if stale else f"## GPU: tonight's report ({date})", ""]
        lines += [f"**{stale}**", ""] if stale else []
        lines += [f"From `{path}`.", ""]
        lines += gpu_section_markdown(report, heading="###")
    if night.drift:
        path, record = night.drift
        lines += ["## Upstream since the pin", "", f"From `{path}`.", "", *upstream_since_pin(record), ""]
    oracle = night.provenance.get("oracle", {})
    environment = night.provenance.get("environment", {})
    harness_repo = night.provenance.get("harness_repository", {})
    lines += [
        "## Provenance",
        "",
        f"- oracle: {oracle.get('release')} (upstream {oracle.get('upstream_commit')}), installed vllm "
        f"{oracle.get('installed_vllm')} ({oracle.get('installed_commit_id')}), fingerprints "
        f"{'overridden' if oracle.get('oracle_drift_overridden') else 'all ok'}",
        f"- torch {environment.get('torch')}, triton {environment.get('triton')}, device {environment.get('device')}",
        f"- harness repository {harness_repo.get('commit')} ({'dirty' if harness_repo.get('dirty') else 'clean'})",
    ]
    for port, repo in night.provenance.get("port_repositories", {}).items():
        state = "dirty" if repo.get("dirty") else "clean"
        lines.append(
            f"- port {port}: repository {repo.get('commit')} ({state}), {repo.get('source') or repo.get('reason')}"
        )
    return "\n".join(lines) + "\n"


def write_report(night: Night, out_dir: Path, history: pd.DataFrame) -> Path:
    """The night's writer (harness.night.nightly.WriteReport): ``report.md`` and
    ``index.html`` in ``out_dir``; ``history`` is what the history plots show."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.md").write_text(render_markdown(night, history), encoding="utf-8")
    index = out_dir / "index.html"
    index.write_text(render_html(night, history), encoding="utf-8")
    return index
