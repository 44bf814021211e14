"""The nightly HTML report in a real headless Chromium (Debian's package).

Two nights: the first judges equal_share against no baseline (every divergence
new: FAIL), the second against a baseline measured from the first (every
divergence expected: the night passes). Each page must render its verdict
against the baselines, cells coloured by verdict, tables without index rows and
with text left-aligned, and its plots, with no console errors; the screenshots
are kept next to the reports for a human to look at.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.baseline import measure_entries
from harness.cli import main
from harness.runner import NOT_RUN, PARITY

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NIGHT = ["--size", "20", "--numeric-size", "8", "--skip-mutants", "--explore-budget-s", "0"]
# Per table: header rows, <th> cells in the body, and per body row its cells' text, class and colours.
TABLES_JS = """ts => ts.map(t => ({
  id: t.id,
  head: t.tHead ? t.tHead.rows.length : 0,
  bodyTh: t.tBodies[0] ? t.tBodies[0].querySelectorAll('th').length : 0,
  columns: t.tHead ? [...t.tHead.rows[0].cells].map(c => c.innerText) : [],
  rows: t.tBodies[0] ? [...t.tBodies[0].rows].map(r => [...r.cells].map(c => ({
    text: c.innerText, cls: c.className,
    align: getComputedStyle(c).textAlign, background: getComputedStyle(c).backgroundColor})) ) : [],
}))"""


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is not installed: `make test` installs it (tools/ensure_chromium.sh)"
    return path


def failing(table: pd.DataFrame) -> pd.DataFrame:
    return table[~table["status"].isin([PARITY, NOT_RUN])]


def look(report: Path, screenshot: Path) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        page.goto(report.as_uri())
        page.screenshot(path=str(screenshot), full_page=True)
        seen = {
            "verdict": page.inner_text("#verdict"),
            "tables": page.eval_on_selector_all("table", TABLES_JS),
            "images": page.eval_on_selector_all("img.plot", "is => is.map(i => [i.alt, i.complete, i.naturalWidth])"),
            "problems": problems,
        }
        browser.close()
    return seen


def port_rows(seen: dict[str, Any]) -> dict[str, dict[str, dict[str, str]]]:
    [ports] = [t for t in seen["tables"] if t["id"] == "ports"]
    return {row[0]["text"]: dict(zip(ports["columns"], row, strict=True)) for row in ports["rows"]}


def check_page(seen: dict[str, Any], screenshot: Path) -> None:
    """What every night's page must be: clean, tables without index rows, text left, plots drawn."""
    assert seen["problems"] == []
    assert len(seen["tables"]) >= 5
    for table in seen["tables"]:
        assert table["head"] == 1 and table["bodyTh"] == 0 and table["rows"], table["id"]
        for row in table["rows"]:
            for cell in row:
                assert cell["align"] == ("right" if "num" in cell["cls"].split() else "left"), (table["id"], cell)
    alts = [alt for alt, _, _ in seen["images"]]
    assert {
        "chunks per family",
        "equal_share ULP histogram",
        "history: parity rate",
        "history: new divergences",
    } <= set(alts)
    assert all(complete and width > 100 for _, complete, width in seen["images"]), seen["images"]
    assert screenshot.stat().st_size > 50_000


def test_nightly_report_renders_in_chromium(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = ["--out", str(tmp_path)]
    # Night 1: equal_share against no baseline: its divergences are new and fail the night.
    assert main(["nightly", *NIGHT, *out, "--date", "2026-11-27", "--baseline", "equal_share=none"]) == 1
    first_table = pd.read_parquet(tmp_path / "2026-11-27" / "results-equal_share.parquet")
    diverging = failing(first_table)
    assert len(diverging) > 0 and (diverging["baseline"] == "new").all()
    # Night 2: against a baseline measured from night 1, every divergence is expected.
    entries = measure_entries(first_table, "equal_share")
    for entry in entries:
        entry["reason"] = f"measured on 2026-11-27 ({entry.pop('items')} items)"
    baseline = tmp_path / "measured.json"
    baseline.write_text(json.dumps({"port": "equal_share", "entries": entries}), encoding="utf-8")
    assert main(["nightly", *NIGHT, *out, "--date", "2026-11-28", "--baseline", f"equal_share={baseline}"]) == 0
    capsys.readouterr()
    second_table = pd.read_parquet(tmp_path / "2026-11-28" / "results-equal_share.parquet")
    assert (failing(second_table)["baseline"] == "expected").all()

    first = look(tmp_path / "2026-11-27" / "index.html", tmp_path / "2026-11-27" / "screenshot.png")
    second = look(tmp_path / "2026-11-28" / "index.html", tmp_path / "2026-11-28" / "screenshot.png")
    check_page(first, tmp_path / "2026-11-27" / "screenshot.png")
    check_page(second, tmp_path / "2026-11-28" / "screenshot.png")

    assert first["verdict"] == "Verdict (every port, against its baseline): FAIL"
    assert second["verdict"] == "Verdict (every port, against its baseline): PASS"
    one, two = port_rows(first), port_rows(second)
    assert one["equal_share"]["verdict"]["text"] == "FAIL" and one["equal_share"]["verdict"]["cls"] == "fail"
    assert one["equal_share"]["new"]["text"] == str(len(diverging)) and "new" in one["equal_share"]["new"]["cls"]
    assert one["equal_share"]["baseline"]["text"] == "none"
    assert two["equal_share"]["verdict"]["text"] == "EXPECTED" and two["equal_share"]["verdict"]["cls"] == "expected"
    assert two["equal_share"]["expected"]["text"] == str(len(failing(second_table)))
    assert two["equal_share"]["new"]["text"] == "0" and two["equal_share"]["baseline"]["text"] == str(baseline)
    assert two["equal_share"]["since previous night"]["text"] == "fixed"
    for rows in (one, two):
        assert rows["per_request"]["verdict"]["text"] == "PASS" and rows["per_request"]["verdict"]["cls"] == "pass"
    # Four colours, one per kind of cell, none of them the page's white.
    colours = {
        "pass": two["per_request"]["verdict"]["background"],
        "expected": two["equal_share"]["verdict"]["background"],
        "fail": one["equal_share"]["verdict"]["background"],
        "new": one["equal_share"]["new"]["background"],
    }
    assert len(set(colours.values())) == 4 and not {"rgba(0, 0, 0, 0)", "rgb(255, 255, 255)"} & set(colours.values())
