"""The nightly page's parts, on synthetic nights (no oracle, seconds): verdicts
against baselines and their colours, tables without stray index rows, plots
that mean something, the GPU section's date. tests/test_report_browser.py looks
at a real night's page in Chromium."""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.night.baselines import PortBaseline, judge_port
from harness.night.data import EXIT_DIVERGENT, EXIT_INTERRUPTED, EXIT_PASS, Night, PortNight, night_exit_code
from harness.sides.items import DIVERGENT, PARITY, PORT_ERROR
from harness.verdicts.baseline import BaselineEntry, port_names
from harness.verdicts.summary import COLUMNS, summarise_table
from reports.nightly import render_html, render_markdown
from reports.nightly_plots import (
    chunk_figure,
    chunk_ratios,
    history_figures,
    ulp_histogram_figure,
    unplannable_counts,
)

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ("layout", "prefill")


def item(index: int, family: str, level: str = "layout", status: str = PARITY, **values: Any) -> dict[str, Any]:
    """One results-table row (every column of harness.verdicts.summary.COLUMNS)."""
    row: dict[str, Any] = {
        "index": index, "id": f"case-{index:04d}[{level}]", "name": f"case-{index:04d}", "family": family,
        "kind": level, "level": level, "status": status,
        "detail": "" if status == PARITY else "field num_chunks: 3 != 2",
        "oracle_chunks": 1, "port_chunks": 1, "oracle_rows": 8, "port_rows": 8, "oracle_capacity": 16,
        "port_capacity": 16, "max_ulp": 0, "max_ulp_of_larger": 0.0, "mismatches": 0, "elements": 64, "nan": 0,
        "histogram": "{}", "port_layout_digest": "",
    }  # fmt: skip
    row.update(values)
    return {column: row[column] for column in COLUMNS}


def port_night(port: str, rows: list[dict[str, Any]], baseline: PortBaseline | None = None) -> PortNight:
    table = judge_port(pd.DataFrame(rows, columns=list(COLUMNS)), port, baseline, LEVELS)
    source = baseline.source if baseline else None
    return PortNight(port, table, summarise_table(table, "synthetic", port, LEVELS), 1.0, source)


def family_baseline(port: str, *families: str) -> PortBaseline:
    entries = tuple(
        BaselineEntry(port, "layout", f"the grid diverges on {family}", DIVERGENT, family=family, source="b.json")
        for family in families
    )
    return PortBaseline("b.json", entries, port_names(port))


def legacy_rows() -> list[dict[str, Any]]:
    """A legacy-like port: skew and uniform diverge at layout, one prefill parity item."""
    return [
        item(0, "skew", status=DIVERGENT, port_chunks=9, oracle_chunks=3),
        item(1, "skew", status=DIVERGENT, port_chunks=30, oracle_chunks=30),
        item(2, "uniform", status=DIVERGENT),
        item(3, "uniform"),
        item(4, "skew", level="prefill"),
    ]


def clean_rows() -> list[dict[str, Any]]:
    return [item(0, "skew"), item(1, "skew"), item(2, "uniform"), item(3, "uniform"), item(4, "skew", level="prefill")]


def night_of(*ports: PortNight, complete: bool = True, date: str = "2026-11-28") -> Night:
    night = Night(date, "synthetic", sum(len(p.table) for p in ports), complete=complete)
    night.ports = list(ports)
    return night


# -- verdicts against baselines ------------------------------------------------------------


def test_expected_divergences_pass_and_a_new_one_fails() -> None:
    clean = port_night("per_request", clean_rows())
    covered = port_night("equal_share", legacy_rows(), family_baseline("equal_share", "skew", "uniform"))
    assert (covered.tally.expected, covered.tally.new, covered.verdict) == (3, 0, "expected")
    assert night_exit_code(night_of(clean, covered)) == EXIT_PASS
    # One family left out of the baseline: its divergence is new, and the night fails.
    partial = port_night("equal_share", legacy_rows(), family_baseline("equal_share", "skew"))
    assert (partial.tally.expected, partial.tally.new, partial.verdict) == (2, 1, "fail")
    assert night_exit_code(night_of(clean, partial)) == EXIT_DIVERGENT
    # Without a baseline every divergence is new.
    bare = port_night("equal_share", legacy_rows())
    assert (bare.tally.new, bare.verdict) == (3, "fail")
    assert night_exit_code(night_of(clean, bare)) == EXIT_DIVERGENT
    # A port error the baseline expects as a divergence is still new.
    erring = legacy_rows()
    erring[0] = item(0, "skew", status=PORT_ERROR, port_chunks=-1)
    assert port_night("equal_share", erring, family_baseline("equal_share", "skew", "uniform")).tally.new == 1
    # Gating only per_request ignores equal_share's new divergence; unfinished is 130.
    assert night_exit_code(night_of(clean, bare), ["per_request"]) == EXIT_PASS
    assert night_exit_code(night_of(clean, covered, complete=False)) == EXIT_INTERRUPTED


class Tables(HTMLParser):
    """Every table of a page: its header rows, and per body row its cells' (class, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []
        self.section = ""
        self.cell: list[str] | None = None
        self.cell_class = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table":
            self.tables.append({"id": found.get("id"), "head": [], "body": [], "body_th": 0})
        elif tag in ("thead", "tbody"):
            self.section = tag
        elif tag == "tr" and self.tables:
            self.tables[-1]["head" if self.section == "thead" else "body"].append([])
        elif tag in ("td", "th"):
            if tag == "th" and self.section == "tbody":
                self.tables[-1]["body_th"] += 1
            self.cell, self.cell_class = [], found.get("class") or ""

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            rows = self.tables[-1]["head" if self.section == "thead" else "body"]
            rows[-1].append((self.cell_class, "".join(self.cell)))
            self.cell = None


def parse_tables(page: str) -> dict[str, dict[str, Any]]:
    parser = Tables()
    parser.feed(page)
    assert parser.tables
    return {t["id"] or f"table-{i}": t for i, t in enumerate(parser.tables)}


def test_page_colours_each_verdict_and_has_no_index_rows() -> None:
    clean = port_night("per_request", clean_rows())
    partial = port_night("equal_share", legacy_rows(), family_baseline("equal_share", "skew"))
    page = render_html(night_of(clean, partial), pd.DataFrame())
    tables = parse_tables(page)
    for table in tables.values():
        # One header row (no pandas index-name row), no <th> in the body (no index column).
        assert len(table["head"]) == 1 and table["body_th"] == 0, table["id"]
        assert all(len(row) == len(table["head"][0]) for row in table["body"]), table["id"]
    header = [text for _, text in tables["ports"]["head"][0]]
    rows = {row[0][1]: dict(zip(header, row, strict=True)) for row in tables["ports"]["body"]}
    assert rows["per_request"]["verdict"] == ("pass", "PASS")
    assert rows["equal_share"]["verdict"] == ("fail", "FAIL")
    assert rows["equal_share"]["new"] == ("num new", "1") and rows["equal_share"]["expected"] == ("num expected", "2")
    assert rows["per_request"]["new"] == ("num", "0")
    # Text is left-aligned, numbers right-aligned (class num).
    assert "th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left;" in page
    assert "td.num { text-align: right;" in page
    levels = {(r[0][1], r[1][1]): r[-1] for r in tables["verdicts"]["body"]}
    assert levels[("equal_share", "layout")] == ("fail", "FAIL") and levels[("per_request", "layout")] == (
        "pass",
        "PASS",
    )
    assert "Verdict (every port, against its baseline): FAIL" in page
    # A baseline that expects every divergence: EXPECTED, coloured as such, and the night passes.
    covered = port_night("equal_share", legacy_rows(), family_baseline("equal_share", "skew", "uniform"))
    tables = parse_tables(render_html(night_of(clean, covered), pd.DataFrame()))
    [_, equal_share] = tables["ports"]["body"]
    assert equal_share[header.index("verdict")] == ("expected", "EXPECTED")
    families = [t for t in tables.values() if t["head"][0][0][1] == "family" and len(t["head"][0]) == 3]
    skew = [row for row in families[1]["body"] if row[0][1] == "skew"]
    assert skew[0][1] == ("expected", "0/2")
    markdown = render_markdown(night_of(clean, covered))
    assert (
        "| equal_share | b.json" in markdown
        and "EXPECTED" in markdown
        and "against its baseline): **PASS**" in markdown
    )


def test_since_previous_night_names_new_failures() -> None:
    clean = port_night("per_request", clean_rows())
    partial = port_night("equal_share", legacy_rows(), family_baseline("equal_share", "skew"))
    history = pd.DataFrame(
        [
            {"date": "2026-11-27", "port": "per_request", "verdict": "pass", "new": 0, "pass_rate": 1.0},
            {"date": "2026-11-27", "port": "equal_share", "verdict": "expected", "new": 0, "pass_rate": 0.4},
            {"date": "2026-11-28", "port": "equal_share", "verdict": "fail", "new": 5, "pass_rate": 0.4},
        ]
    )
    tables = parse_tables(render_html(night_of(clean, partial), history))
    header = [text for _, text in tables["ports"]["head"][0]]
    rows = {row[0][1]: dict(zip(header, row, strict=True)) for row in tables["ports"]["body"]}
    # Tonight's own line (a rerun of the date) is not the previous night.
    assert rows["equal_share"]["since previous night"] == ("new", "NEW FAILURE")
    assert rows["equal_share"]["previous night"][1] == "EXPECTED, 0 new (2026-11-27)"
    assert rows["per_request"]["since previous night"][1] == "unchanged"


# -- plots ---------------------------------------------------------------------------------


def test_chunk_plot_is_per_case_relative_and_counts_unplannable() -> None:
    rows = [
        # many-chunks: 30 and 60 chunks, twice the oracle's per case; one case unplannable.
        item(0, "many-chunks", oracle_chunks=30, port_chunks=60),
        item(1, "many-chunks", oracle_chunks=10, port_chunks=20),
        item(2, "many-chunks", status=PORT_ERROR, port_chunks=-1),
        # single: one chunk each, as the oracle.
        item(3, "single", oracle_chunks=1, port_chunks=1),
        item(4, "single", oracle_chunks=1, port_chunks=1),
        # zero-context: no chunks either side, left out of the ratio.
        item(5, "zero-context", oracle_chunks=0, port_chunks=0),
    ]
    night = night_of(port_night("legacy", rows))
    ratios = chunk_ratios(night)
    assert ratios.loc["many-chunks", "legacy"] == pytest.approx(2.0) and ratios.loc["single", "legacy"] == 1.0
    assert "zero-context" not in ratios.index
    from matplotlib.patches import Rectangle

    unplannable = unplannable_counts(night)
    assert unplannable.loc["many-chunks"].tolist() == [0, 1] and int(unplannable.to_numpy().sum()) == 1
    figure = chunk_figure(night)
    assert figure is not None
    left, right = figure.axes[:2]
    assert left.get_yscale() == "log" and right.get_title() == "unplannable batches: 1"
    heights = sorted(round(bar.get_height(), 6) for bar in left.patches if isinstance(bar, Rectangle))
    assert heights == [1.0, 2.0]  # per case: the 60-chunk case does not dwarf the single-chunk family
    page = render_html(night, pd.DataFrame())
    chunks = parse_tables(page)["chunks"]
    header = [text for _, text in chunks["head"][0]]
    legacy = {
        row[0][1]: dict(zip(header, (t for _, t in row), strict=True))
        for row in chunks["body"]
        if row[1][1] == "legacy"
    }
    assert legacy["many-chunks"]["unplannable"] == "1" and legacy["many-chunks"]["chunks per case / oracle"] == "2.00"
    assert 'id="plots-pending"' not in page and "data:image/png;base64," in page
    # A page rewritten while a step is still pending (or after an interruption) has the tables and no plot.
    night.pending = ["port per_request"]
    pending = render_html(night, pd.DataFrame())
    assert 'id="plots-pending"' in pending and "data:image/png;base64," not in pending
    assert parse_tables(pending)["chunks"] == chunks


def history_frame(dates: list[str]) -> pd.DataFrame:
    rows = []
    for i, date in enumerate(dates):
        for port, rate in (("per_request", 1.0), ("equal_share", 0.5 + i / 100)):
            rows.append({"date": date, "port": port, "pass_rate": rate, "new": 0 if port == "per_request" else i})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "dates",
    [["2026-11-28"], ["2026-11-01", "2026-11-05", "2026-11-28"], [f"2026-10-{d:02d}" for d in range(1, 31)]],
)
def test_history_axis_spans_the_nights_as_dates(dates: list[str]) -> None:
    import matplotlib.dates
    import matplotlib.pyplot as plt

    mdates: Any = matplotlib.dates  # untyped
    figures = history_figures(history_frame(dates))
    assert [alt for alt, _ in figures] == ["history: parity rate", "history: new divergences"]
    first, last = pd.Timestamp(dates[0]), pd.Timestamp(dates[-1])
    for _, fig in figures:
        ax = fig.axes[0]
        low, high = (pd.Timestamp(mdates.num2date(x)).tz_localize(None) for x in ax.get_xlim())
        assert low == first - pd.Timedelta(hours=12) and high == last + pd.Timedelta(hours=12)
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert labels and all(pd.Timestamp(label).strftime("%Y-%m-%d") == label for label in labels)
        assert all(first - pd.Timedelta(days=1) <= pd.Timestamp(label) <= last for label in labels)
        if len(dates) <= 14:
            assert labels == dates
        plt.close(fig)


def test_labels_are_inside_every_figure() -> None:
    import matplotlib.pyplot as plt

    long_families = [f"a-long-family-name-{i}" for i in range(8)]
    rows = [item(i, family, oracle_chunks=1 + i, port_chunks=2 + i) for i, family in enumerate(long_families)]
    numeric = item(99, "skew", level="prefill", status=DIVERGENT, max_ulp=9, histogram=json.dumps({"1": 5, "5-8": 2}))
    port = port_night("equal_share", [*rows, numeric])
    figures = [chunk_figure(night_of(port)), ulp_histogram_figure(port)]
    assert None not in figures
    figures += [fig for _, fig in history_figures(history_frame(["2026-11-01", "2026-11-28"]))]
    for fig in figures:
        assert fig is not None
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's canvas has it
        bounds = fig.bbox
        for ax in fig.axes:
            texts = [ax.xaxis.label, ax.yaxis.label, ax.title]
            for axis in (ax.xaxis, ax.yaxis):
                low, high = sorted(axis.get_view_interval())
                ticks = zip(axis.get_majorticklocs(), axis.get_majorticklabels(), strict=True)
                texts += [label for at, label in ticks if low <= at <= high]  # ticks outside the view are not drawn
            for text in texts:
                if not text.get_text() or not text.get_visible():
                    continue
                box = text.get_window_extent(renderer)
                inside = box.x0 >= bounds.x0 - 1 and box.x1 <= bounds.x1 + 1 and box.y0 >= bounds.y0 - 1
                assert inside and box.y1 <= bounds.y1 + 1, f"{text.get_text()!r} is cut: {box} outside {bounds}"
        plt.close(fig)


# -- the GPU section -------------------------------------------------------------------------


def test_an_older_gpu_report_says_it_is_not_tonights() -> None:
    path = ROOT / "reports" / "gpu" / "2026-11-29.json"
    report = json.loads(path.read_text(encoding="utf-8"))
    night = night_of(port_night("per_request", clean_rows()), date="2026-12-05")
    night.gpu = (path, report)
    page = render_html(night, pd.DataFrame())
    assert f'<h2 id="gpu">GPU: report of {report["date"]}, not tonight&#x27;s</h2>' in page
    assert f'id="gpu-stale">Not measured tonight: this GPU report is from {report["date"]}, 6 days before' in page
    markdown = render_markdown(night)
    assert f"## GPU: report of {report['date']}, NOT tonight's" in markdown and "**Not measured tonight" in markdown
    # Measured on the night's own date: tonight's, no warning.
    night.date = report["date"]
    page = render_html(night, pd.DataFrame())
    assert "gpu-stale" not in page and f"GPU: tonight&#x27;s report ({report['date']})" in page
    # The GPU tables are rendered like every other: no index column.
    gpu_tables = parse_tables(page.split('id="gpu"')[1])
    assert all(t["body_th"] == 0 and len(t["head"]) == 1 for t in gpu_tables.values())


def test_explore_finds_fail_the_night_only_for_a_port_expected_at_parity() -> None:
    clean = port_night("per_request", clean_rows())
    covered = port_night("equal_share", legacy_rows(), family_baseline("equal_share", "skew", "uniform"))
    night = night_of(clean, covered)
    night.explore_budget_s = 5.0
    empty: dict[str, Any] = {"finds": [], "properties": [], "markdown": ""}
    clean_search = {"port": "per_request", "port_spec": "per_request", "verdict": "clean", **empty}
    legacy_find = {"port": "equal_share", "port_spec": "equal_share", "verdict": "found", **empty}
    night.explore = [clean_search, legacy_find]
    # equal_share diverges by design (its baseline says so): its finds are listed, not judged.
    assert night_exit_code(night) == EXIT_PASS
    assert "not judged: the port has expected divergences" in render_html(night, pd.DataFrame())
    # A find for a port expected at parity everywhere fails the night.
    night.explore[0] = {**clean_search, "verdict": "found"}
    assert night_exit_code(night) == EXIT_DIVERGENT


def test_incomplete_is_never_fixed_and_has_its_own_colour() -> None:
    not_run = [*clean_rows()[:4], item(4, "skew", level="prefill", status="not-run")]
    incomplete = port_night("per_request", not_run)
    assert incomplete.verdict == "incomplete"
    history = pd.DataFrame(
        [{"date": "2026-11-27", "port": "per_request", "verdict": "fail", "new": 2, "pass_rate": 0.5}]
    )
    tables = parse_tables(render_html(night_of(incomplete), history))
    header = [text for _, text in tables["ports"]["head"][0]]
    row = dict(zip(header, tables["ports"]["body"][0], strict=True))
    assert row["since previous night"][1] == "now incomplete"
    page = render_html(night_of(incomplete), history)
    colours = {name: page.split(f".{name} {{ background: ")[1].split(";")[0] for name in ("expected", "incomplete")}
    assert colours["expected"] != colours["incomplete"]


def test_upstream_since_the_pin_comes_from_the_latest_drift_report(tmp_path: Path) -> None:
    """The night carries the newest drift report's summary in both forms, and none without one."""
    import pandas as pd

    from reports.drift_report import latest_drift_report
    from reports.nightly import render_html, render_markdown

    record = {
        "date": "2026-11-30",
        "pin": {"release": "vllm==0.28.0"},
        "releases": [
            {
                "release": "vllm==9.0.0",
                "symbols": {
                    "counts": {"changed": 2, "missing": 1, "unchanged": 5},
                    "drift": [
                        {"symbol": "m:ContextChunk", "fields_added": ["all_rows_active"], "parameters_added": []}
                    ],
                },
                "parity": {"levels": {"merge": {"verdict": "3 divergent"}}},
            }
        ],
    }
    for date in ("2026-11-01", "2026-11-30"):
        (tmp_path / f"{date}.json").write_text(json.dumps({**record, "date": date}), encoding="utf-8")
    latest = latest_drift_report(tmp_path)
    assert latest is not None and latest[0].name == "2026-11-30.json"
    night = night_of(port_night("per_request", clean_rows()))
    assert "Upstream since the pin" not in render_markdown(night, pd.DataFrame())
    night.drift = latest
    markdown = render_markdown(night, pd.DataFrame())
    page = render_html(night, pd.DataFrame())
    for text in (markdown, page):
        assert "Upstream since the pin" in text and "vllm==9.0.0" in text and "all_rows_active" in text
        assert "3 divergent" in text and "2 of 8 symbols changed, 1 missing" in text


# -- issue 30: one colour per port, a zoomed parity axis, reduced nights, n/a, reproduce, sizes ---


def test_every_plot_draws_a_port_in_its_one_colour() -> None:
    """Tonight's ports in one order, the history's in another: every plot still
    gives each port the colour of the sorted port list (tab10 in order)."""
    import matplotlib.pyplot as plt

    from reports.nightly_plots import drawn_port_colours, port_colours

    numeric = item(9, "skew", level="prefill", status=DIVERGENT, max_ulp=9, histogram=json.dumps({"1": 5}))
    zeta = port_night("zeta", [*legacy_rows(), numeric])
    alpha = port_night("alpha", clean_rows())
    night = night_of(zeta, alpha)  # zeta first: matplotlib's colour cycle would make it blue
    history = pd.DataFrame(
        [
            {"date": d, "port": p, "pass_rate": 1.0, "new": 0}
            for d in ("2026-11-26", "2026-11-27")
            for p in ("alpha", "zeta")
        ]
    )
    colours = port_colours(["zeta", "alpha"], history["port"])
    assert colours == {"alpha": "#1f77b4", "zeta": "#ff7f0e"}
    figures = [chunk_figure(night, colours), ulp_histogram_figure(zeta, colours)]
    figures += [fig for _, fig in history_figures(history, colours)]
    drawn = [drawn_port_colours(fig) for fig in figures if fig is not None]
    assert len(drawn) == len(figures)
    assert drawn[0] == drawn[2] == drawn[3] == {"alpha": ["#1f77b4"], "zeta": ["#ff7f0e"]}
    assert drawn[1] == {"zeta": ["#ff7f0e"]}
    for fig in figures:
        plt.close(fig)
    # The page: a colour key and, on every plot, what it drew, both the same mapping.
    page = render_html(night, history)
    assert '<td class="swatch" data-colour="#1f77b4" style="background: #1f77b4; color: #fff">' in page
    drawn_on_page = [html.unescape(a.split('"')[0]) for a in page.split('data-port-colours="')[1:]]
    assert [json.loads(a) for a in drawn_on_page] == [drawn[0], drawn[1], drawn[2], drawn[3]]


def test_the_parity_axis_shows_a_drop_from_100_to_98_percent() -> None:
    import matplotlib.pyplot as plt

    history = pd.DataFrame(
        [
            {"date": "2026-11-26", "port": "per_request", "pass_rate": 1.0, "new": 0},
            {"date": "2026-11-27", "port": "per_request", "pass_rate": 0.98, "new": 3},
        ]
    )
    [(_, parity), (_, new)] = history_figures(history)
    ax = parity.axes[0]
    low, high = ax.get_ylim()
    assert 0.9 < low < 0.98 and 1.0 <= high < 1.02
    # The two nights are far apart on the page: more than half the axis's height.
    [line] = ax.get_lines()
    points = ax.transData.transform(line.get_xydata())
    assert abs(points[0][1] - points[1][1]) > 0.5 * ax.bbox.height
    assert "zoomed to 97.5%-100.0%" in ax.get_title()
    parity.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and float(labels[-1].rstrip("%")) == 100 and all(float(t.rstrip("%")) <= 100 for t in labels)
    plt.close(parity)
    plt.close(new)


def test_reduced_nights_are_kept_apart_from_full_nights() -> None:
    import matplotlib.pyplot as plt

    rows = [
        {"date": "2026-11-25", "port": "per_request", "pass_rate": 1.0, "new": 0, "reduced": False},
        {"date": "2026-11-26", "port": "per_request", "pass_rate": 0.99, "new": 1, "reduced": None},  # older line
        {"date": "2026-11-27", "port": "per_request", "pass_rate": 0.5, "new": 9, "reduced": True},
        {"date": "2026-11-28", "port": "per_request", "pass_rate": 1.0, "new": 0, "reduced": False},
    ]
    for _, fig in history_figures(pd.DataFrame(rows)):
        full, reduced = fig.axes[0].get_lines()
        assert [pd.Timestamp(x).strftime("%d") for x in full.get_xdata()] == ["25", "26", "28"]
        assert [pd.Timestamp(x).strftime("%d") for x in reduced.get_xdata()] == ["27"]
        assert full.get_linestyle() == "-" and reduced.get_linestyle() == ":" and reduced.get_marker() == "D"
        assert reduced.get_label() == "per_request (reduced nights)" and full.get_color() == reduced.get_color()
        plt.close(fig)
    # The previous night's cell says when that night was a reduced one.
    tonight = night_of(port_night("per_request", clean_rows()), date="2026-11-29")
    for reduced, shown in (
        (False, "parity 100.0% (2026-11-28)"),
        (True, "parity 100.0% (2026-11-28, a reduced night)"),
    ):
        rows[-1]["reduced"] = reduced
        page = render_html(tonight, pd.DataFrame(rows))
        assert 'id="history-reduced"' in page
        tables = parse_tables(page)
        header = [text for _, text in tables["ports"]["head"][0]]
        assert dict(zip(header, tables["ports"]["body"][0], strict=True))["previous night"][1] == shown


def test_sizes_and_reduced_in_the_header() -> None:
    from harness.night.sizes import night_sizes, reduced_reasons
    from harness.sides.items import LEVELS as ALL

    full = night_sizes("nightly", None, None, ALL, True, 60.0)
    assert reduced_reasons(full) == [] and reduced_reasons({}) == []
    assert reduced_reasons(night_sizes("nightly", 50000, 840, ALL, True, 120.0)) == []
    small = night_sizes("nightly", 20, 8, ("layout",), False, 0.0)
    assert reduced_reasons(small) == [
        "--size 20 (default 50,000)",
        "--numeric-size 8 (defaults: prefill 200, merge 840, top-k mask 150, sparse L3 60)",
        "levels layout only",
        "no mutant kill matrix",
        "no explore search",
    ]
    # More prefill cases than the default but fewer merge cases: still reduced.
    assert reduced_reasons(night_sizes("nightly", None, 500, ALL, True, 30.0))[0].startswith("--numeric-size 500")
    assert reduced_reasons(night_sizes("nightly", None, None, ALL, True, 30.0)) == [
        "explore 30 s per port (default 60 s)"
    ]
    night = night_of(port_night("per_request", clean_rows()))
    night.sizes = small
    page = render_html(night, pd.DataFrame())
    assert "<h1>Nightly parity report: 2026-11-28 (reduced)</h1>" in page
    assert '<p id="sizes">Sizes: --size 20 (default 50,000); --numeric-size 8 (defaults: prefill 200,' in page
    assert "levels layout; mutant kill matrix not run; explore 0 s per port (default 60 s).</p>" in page
    assert 'id="reduced">REDUCED night, smaller than the nightly defaults: --size 20 (default 50,000);' in page
    markdown = render_markdown(night)
    assert markdown.startswith("# Nightly parity report: 2026-11-28 (reduced)\n\nSizes: --size 20")
    night.sizes = full
    page = render_html(night, pd.DataFrame())
    assert "(reduced)" not in page and 'id="reduced"' not in page
    assert "Sizes: --size 50,000 (default); --numeric-size default (prefill 200, merge 840" in page


def test_kill_matrix_cells_are_na_where_no_item_reaches_the_fault() -> None:
    from reports.nightly_tables import kill_matrix_table

    kill = {"item": "case-0001[merge]", "status": DIVERGENT, "detail": "", "items_tried": 1, "shrunk": None}
    matrix = {
        "suite": "synthetic",
        "levels": ["layout", "merge"],
        "mutants": [
            # A merge bug: killed at merge, never called by a layout item.
            {"name": "m-merge", "description": "d", "source": "s", "killed": True,
             "kills": {"layout": None, "merge": kill}, "ran": {"layout": 0, "merge": 1}},
            # Reached at layout and not killed: a hole in the suite, red.
            {"name": "m-hole", "description": "d", "source": "s", "killed": False,
             "kills": {"layout": None, "merge": None}, "ran": {"layout": 40, "merge": 0}},
            {"name": "m-nowhere", "description": "d", "source": "s", "killed": False,
             "kills": {"layout": None, "merge": None}, "ran": {"layout": 0, "merge": 0}},
            # Only calls past the time limit at layout: nothing was compared there, not a survivor.
            {"name": "m-slow", "description": "d", "source": "s", "killed": False,
             "kills": {"layout": None, "merge": None}, "ran": {"layout": 2, "merge": 0},
             "timed_out": {"layout": ["case-0002[layout]"]}},
            # A matrix written before "ran" was recorded: no n/a can be told.
            {"name": "m-old", "description": "d", "source": "s", "killed": False,
             "kills": {"layout": None, "merge": None}},
        ],
    }  # fmt: skip
    table = kill_matrix_table(matrix).set_index("mutant")
    assert table.loc["m-merge", ["layout", "merge", "first kill"]].tolist() == ["n/a", "killed", "case-0001[merge]"]
    assert table.loc["m-hole", ["layout", "merge", "first kill"]].tolist() == ["survived", "n/a", "SURVIVED"]
    assert table.loc["m-nowhere", "first kill"] == "n/a at every level run"
    assert table.loc["m-slow", ["layout", "merge", "first kill"]].tolist() == ["timed out", "n/a", "timed out"]
    assert table.loc["m-old", ["layout", "merge"]].tolist() == ["survived", "survived"]
    night = night_of(port_night("per_request", clean_rows()))
    night.kill_matrix = matrix
    rows = {row[0][1]: row for row in parse_tables(render_html(night, pd.DataFrame()))["kill-matrix"]["body"]}
    assert rows["m-merge"][3] == ("na", "n/a") and rows["m-hole"][3] == ("fail", "survived")
    assert rows["m-merge"][4] == ("pass", "killed")
    assert ".na { background: #e4e4e4;" in render_html(night, pd.DataFrame())


def test_every_failing_item_has_its_reproduce_command() -> None:
    from harness.verdicts.launch import program_words

    night = night_of(port_night("equal_share", legacy_rows()))
    night.suite = "nightly"
    night.sizes = {"size": 20}
    night.port_specs = {"equal_share": "ports.equal_share:PORT"}
    night.provenance = {"oracle": {"release": "vllm==0.27.1", "oracle_drift_overridden": True}}
    failing = parse_tables(render_html(night, pd.DataFrame()))["failing-equal_share"]
    assert [text for _, text in failing["head"][0]] == ["id", "status", "baseline", "why", "reproduce"]
    assert len(failing["body"]) == 3  # the three divergent items of legacy_rows
    program = " ".join(program_words("ports.equal_share:PORT"))
    for row in failing["body"]:
        assert row[0][1].startswith("nightly:size=20/")  # the id carries the night's suite and size
        name = row[0][1].removeprefix("nightly:size=20/").removesuffix("[layout]")
        assert row[-1] == (
            "reproduce",
            f"{program} diff {name} --suite nightly --size 20 --port ports.equal_share:PORT --level layout "
            "--oracle vllm==0.27.1 --allow-oracle-drift",
        )
    assert f"- `nightly:size=20/case-0000[layout]` divergent (new): `{program} diff case-0000" in render_markdown(night)
