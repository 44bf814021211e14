"""The nightly page's HTML pieces: its style sheet, a DataFrame as a table,
the cell colours (by verdict, by kill-matrix cell, by a failing item's
judgement), the legend, and the colour key of the ports.

Invariants a reader must keep: the page is one self-contained file, so the style
sheet is inline and nothing here links to the network; every text that goes into
the page is escaped (``html.escape``); a table has one header row and no index
column, numbers aligned right; a CSS class is a colour the legend explains
(``VERDICT_CLASS``, ``KILL_CLASS``). The page tests and the browser checks
(tests/test_nightly_page.py, tests/test_report_browser.py) read these ids,
classes and markup: a change here is a change to what they check.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import pandas as pd

from harness.night.data import EXPECTED_ONLY, FAIL, INCOMPLETE, PASS, PortNight
from reports.nightly_tables import (
    FAILING_SINCE,
    NOT_REACHED,
    NOT_SEARCHED,
    NOWHERE,
    VERDICT_TEXT,
    family_level_table,
)

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


# The CSS class of a verdict cell; the classes' colours are the page's legend.
VERDICT_CLASS: dict[str, str] = {PASS: "pass", EXPECTED_ONLY: "expected", FAIL: "fail", INCOMPLETE: "incomplete"}
# The CSS class of a kill-matrix cell (reports/nightly_tables.py's ``kill_cell``).
KILL_CLASS = {
    "killed": "pass",
    "survived": "fail",
    "SURVIVED": "fail",
    NOT_REACHED: "na",
    NOWHERE: "na",
    NOT_SEARCHED: "na",
}
KILL_CLASS["timed out"] = "incomplete"  # a call past its time limit: nothing was compared


CellClass = Callable[[int, str, Any], str | None]


_NUMERIC_TEXT = re.compile(r"^-?[0-9][0-9,]*(\.[0-9]+)?%?$")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numeric_cell(value: Any) -> bool:
    """Numbers, and text that is one (``1.84``, ``29.5%``), align right."""
    return _is_number(value) or (isinstance(value, str) and bool(_NUMERIC_TEXT.match(value)))


def anchor(*parts: str) -> str:
    """An id a link can point at, made of ``parts``: letters, digits and ``_`` as
    they are, any other character as ``.XX`` (its code), parts joined by ``-``,
    so two different lists of parts never make one id."""
    return "-".join(
        "".join(c if c.isascii() and (c.isalnum() or c == "_") else f".{ord(c):02x}" for c in part) for part in parts
    )


def html_table(
    frame: pd.DataFrame,
    table_id: str | None = None,
    css: str | None = None,
    cell_class: CellClass | None = None,
    cell_link: CellClass | None = None,
    row_id: Callable[[int], str | None] | None = None,
) -> str:
    """``frame`` as an HTML table: one header row of its columns, no index;
    numbers right-aligned (class ``num``), text left; ``cell_class(row, column,
    value)`` adds a class (its colour) to a cell, ``cell_link`` the address it
    links to, and ``row_id(row)`` an id a link can point at."""
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
            text = html.escape(str(shown))
            href = cell_link(i, str(column), value) if cell_link else None
            cells.append(
                f'<td{attribute}><a href="{html.escape(href)}">{text}</a></td>'
                if href
                else f"<td{attribute}>{text}</td>"
            )
        anchor_id = row_id(i) if row_id else None
        body.append(f'<tr id="{html.escape(anchor_id)}">' if anchor_id else "<tr>")
        body[-1] += f"{''.join(cells)}</tr>"
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
        if str(value).startswith(FAILING_SINCE):
            return "fail"
        return {"NEW FAILURE": "new", "fixed": "pass"}.get(str(value))
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


def colour_key(colours: dict[str, str]) -> str:
    """The colour of each port in every plot, as a table (``data-colour`` on each swatch)."""
    rows = "".join(
        f'<tr><td>{html.escape(port)}</td><td class="swatch" data-colour="{colour}" '
        f'style="background: {colour}; color: #fff">{colour}</td></tr>'
        for port, colour in colours.items()
    )
    head = "<thead><tr><th>port</th><th>its colour in every plot</th></tr></thead>"
    return f'<table id="port-colours">{head}<tbody>{rows}</tbody></table>'


LEGEND = (
    '<p class="legend"><span class="pass">PASS: every item at parity</span>'
    '<span class="expected">EXPECTED: every divergence is one the port\'s baseline expects (a pass)</span>'
    '<span class="fail">FAIL: a divergence not in the baseline</span>'
    '<span class="new">new: items the baseline does not expect</span>'
    '<span class="incomplete">INCOMPLETE: items not run</span></p>'
)
