"""The nightly page's history: a port failing night after night says since
when (from the history), each port's parity rate is drawn on a scale of its
own, and the reports it read are named the same on every machine."""

from __future__ import annotations

import pandas as pd

from reports.nightly import render_html
from reports.nightly_plots import history_figures
from tests.test_nightly_page import legacy_rows, night_of, parse_tables, port_night


def test_a_port_failing_night_after_night_says_since_when() -> None:
    """Failing tonight and on the nights before: since the first of that run of
    failing nights, and how many; a passing night ends the run."""
    failing_port = port_night("equal_share", legacy_rows())  # no baseline: every divergence is new
    history = pd.DataFrame(
        [
            {"date": "2026-11-24", "port": "equal_share", "verdict": "fail", "new": 5, "pass_rate": 0.4},
            {"date": "2026-11-25", "port": "equal_share", "verdict": "pass", "new": 0, "pass_rate": 1.0},
            {"date": "2026-11-26", "port": "equal_share", "verdict": "fail", "new": 5, "pass_rate": 0.4},
            {"date": "2026-11-27", "port": "equal_share", "verdict": "fail", "new": 5, "pass_rate": 0.4},
        ]
    )
    tables = parse_tables(render_html(night_of(failing_port), history))
    header = [text for _, text in tables["ports"]["head"][0]]
    [row] = [dict(zip(header, row, strict=True)) for row in tables["ports"]["body"]]
    assert row["since previous night"] == ("fail", "failing since 2026-11-26 (3 nights)")


def test_a_small_drop_of_one_port_is_drawn_apart_from_100_percent_beside_a_worse_port() -> None:
    """Each port's parity rate has its own panel, zoomed to its own values: a
    0.03% drop of one port is drawn far from 100%, though another port sits at
    40% (on one shared axis it would be a pixel or less)."""
    import matplotlib.pyplot as plt

    rates = {"equal_share": (0.4, 0.4, 0.4), "mine": (1.0, 1.0, 0.9997), "per_request": (1.0, 1.0, 1.0)}
    history = pd.DataFrame(
        [
            {"date": date, "port": port, "pass_rate": rate, "new": 0}
            for port, values in rates.items()
            for date, rate in zip(("2026-11-26", "2026-11-27", "2026-11-28"), values, strict=True)
        ]
    )
    [(alt, parity), (_, new)] = history_figures(history)
    assert alt == "history: parity rate" and len(parity.axes) == 3
    parity.canvas.draw()
    panels = {ax.get_title().split()[3]: ax for ax in parity.axes}
    mine = panels["mine"]
    [line] = mine.get_lines()
    points = mine.transData.transform(line.get_xydata())
    # The drop is drawn more than a third of the panel's height below the nights at 100%.
    assert points[0][1] - points[2][1] > mine.bbox.height / 3
    plt.close(parity)
    plt.close(new)


def test_a_report_inside_the_checkout_is_named_relative_to_it() -> None:
    """The page names the drift and GPU reports it read the same on every machine."""
    from harness.verdicts.launch import harness_root
    from reports.nightly import shown_path

    assert shown_path(harness_root() / "reports" / "drift" / "2026-12-04.json") == "reports/drift/2026-12-04.json"
    assert shown_path("/elsewhere/drift.json") == "/elsewhere/drift.json"


def test_two_items_never_share_an_anchor() -> None:
    from reports.nightly_html import anchor

    assert anchor("failing", "equal_share") == "failing-equal_share"
    assert anchor("item", "a-b", "c") != anchor("item", "a", "b-c")
    assert anchor("item", "p", "ci/x[layout]") != anchor("item", "p", "ci_x_layout_")
