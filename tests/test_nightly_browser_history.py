"""The nightly page in a real headless Chromium, on a planted history: a port
failing for three nights says since when; the top table's failing counts link
to the port's failing items, each row an anchor with its reproduce command; and
a 0.03% drop of one port is drawn well apart from 100% although another port
sits at 40% (each port's parity history has its own panel and scale)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from reports.nightly import render_html
from tests.test_nightly_page import clean_rows, legacy_rows, night_of, port_night
from tests.test_report_browser import KEY_JS, PIXEL_ROWS_JS, opened

DATES = ("2026-11-26", "2026-11-27", "2026-11-28")
# The nights before tonight (2026-11-28) and tonight's own lines, as the history holds them.
RATES = {"equal_share": (0.4, 0.4, 0.4), "mine": (1.0, 1.0, 0.9997), "per_request": (1.0, 1.0, 1.0)}
VERDICTS = {"equal_share": "fail", "mine": "pass", "per_request": "pass"}

# For the parity history's image: per port colour, the rows (y) its pixels are on.
EXTENT_JS = f"([img, key]) => ({PIXEL_ROWS_JS})(img, key)"
# Every link on the page: its text, where it points, and whether that element exists.
LINKS_JS = """as => as.map(a => ({text: a.innerText, href: a.getAttribute('href'),
  cell: a.closest('td') ? a.closest('td').cellIndex : -1, table: a.closest('table').id,
  target: document.getElementById(a.getAttribute('href').slice(1)) !== null}))"""


def page(tmp_path: Path) -> Path:
    mine = port_night("mine", clean_rows())
    night = night_of(port_night("equal_share", legacy_rows()), mine, port_night("per_request", clean_rows()))
    history = pd.DataFrame(
        [
            {"date": date, "port": port, "pass_rate": rate, "new": 5 if port == "equal_share" else 0,
             "verdict": VERDICTS[port], "items": 10}
            for port, rates in RATES.items()
            for date, rate in zip(DATES, rates, strict=True)
        ]
    )  # fmt: skip
    path = tmp_path / "index.html"
    path.write_text(render_html(night, history))
    return path


def look(path: Path, screenshot: Path) -> dict[str, Any]:
    with opened(path) as (shown, problems):
        shown.screenshot(path=str(screenshot), full_page=True)
        key = {p: c for p, c, _ in shown.eval_on_selector_all("#port-colours td.swatch", KEY_JS)}
        image = shown.query_selector('img.plot[alt="history: parity rate"]')
        seen = {
            "key": key,
            "rows": shown.evaluate(EXTENT_JS, [image, key]),
            "height": shown.evaluate("i => i.naturalHeight", image),
            "links": shown.eval_on_selector_all("a", LINKS_JS),
            "since": shown.eval_on_selector_all(
                "#ports tbody tr",
                "rs => rs.map(r => [r.cells[0].innerText, r.cells[r.cells.length - 1].innerText, "
                "r.cells[r.cells.length - 1].className])",
            ),
            "failing_rows": shown.eval_on_selector_all(
                "#failing-equal_share tbody tr",
                "rs => rs.map(r => [r.id, r.cells[0].querySelector('a').getAttribute('href'), "
                "r.querySelector('td.reproduce').innerText])",
            ),
            "problems": problems,
        }
        # Following the link lands on the failing items, in view.
        shown.click("#ports a")
        seen["landed"] = shown.evaluate(
            "() => { const t = document.getElementById(location.hash.slice(1)); const r = t.getBoundingClientRect();"
            " return [location.hash, r.top >= -1 && r.top < window.innerHeight, r.top, window.scrollY]; }"
        )
    return seen


def test_since_links_and_a_small_drop_on_the_page(tmp_path: Path) -> None:
    seen = look(page(tmp_path), tmp_path / "screenshot.png")
    assert seen["problems"] == []
    since = {port: (text, cls) for port, text, cls in seen["since"]}
    assert since["equal_share"] == ("failing since 2026-11-26 (3 nights)", "fail")
    # The failing count links to the port's failing items, its first failing item to that
    # item's row (which holds its reproduce command); each item's row is an anchor of its own.
    to_failing, to_first = [link for link in seen["links"] if link["table"] == "ports"]
    assert to_failing["href"] == "#failing-equal_share" and to_failing["target"]
    assert to_first["href"] == f"#{seen['failing_rows'][0][0]}" and to_first["target"], to_first
    assert seen["landed"][:2] == ["#failing-equal_share", True], seen["landed"]
    rows = seen["failing_rows"]
    assert rows and all(row_id and href == f"#{row_id}" and command.strip() for row_id, href, command in rows)
    assert all(link["target"] for link in seen["links"])
    # The 0.03% drop spans a good part of its panel: far more than the pixel a shared axis gives it.
    mine = seen["rows"]["mine"]
    assert mine and max(mine) - min(mine) > 40, (min(mine), max(mine), seen["height"])
    per_request = seen["rows"]["per_request"]
    assert per_request and max(per_request) - min(per_request) < 12  # a flat line at 100%
