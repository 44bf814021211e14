"""The nightly HTML report in a real headless Chromium (Debian's package).

Two nights: the first judges equal_share against no baseline (every divergence
new: FAIL), the second against a baseline measured from the first (every
divergence expected: the night passes). Each page must render its verdict
against the baselines, cells coloured by verdict, tables without index rows and
with text left-aligned, and its plots, with no console errors; the screenshots
are kept next to the reports for a human to look at. Each port has one colour in
every plot (the colour key, what each plot drew, and the plots' own pixels
agree), every failing item has its reproduce command (one of them is run), and
the header states the sizes and that these small nights are reduced.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.cli import main
from harness.sides.items import NOT_RUN, PARITY
from harness.verdicts.baseline import measure_entries

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
# The colour key: per port, its colour and the background its swatch is painted in.
KEY_JS = (
    "ts => ts.map(t => [t.parentElement.cells[0].innerText, t.dataset.colour, getComputedStyle(t).backgroundColor])"
)
# Per port (key: port -> colour), the row of every pixel of an image within 2 per channel of its colour.
PIXEL_ROWS_JS = """(img, key) => {
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
  const context = canvas.getContext('2d');
  context.drawImage(img, 0, 0);
  const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
  const rows = {};
  for (const [port, hex] of Object.entries(key)) {
    const want = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
    rows[port] = [];
    for (let i = 0; i < data.length; i += 4) {
      if ([0, 1, 2].every(k => Math.abs(data[i + k] - want[k]) <= 2)) rows[port].push(Math.floor(i / 4 / canvas.width));
    }
  }
  return rows;
}"""
# Per plot: what it says each port was drawn in, and how many of its pixels are each key colour.
PLOTS_JS = f"""([imgs, key]) => imgs.map(img => {{
  const rows = ({PIXEL_ROWS_JS})(img, key);
  const pixels = Object.fromEntries(Object.entries(rows).map(([port, r]) => [port, r.length]));
  return {{alt: img.alt, drawn: JSON.parse(img.dataset.portColours || 'null'), pixels: pixels}};
}})"""


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is not installed: `make test` installs it (tools/ensure_chromium.sh)"
    return path


def failing(table: pd.DataFrame) -> pd.DataFrame:
    return table[~table["status"].isin([PARITY, NOT_RUN])]


@contextlib.contextmanager
def opened(report: Path) -> Iterator[tuple[Any, list[str]]]:
    """``report`` open in headless Chromium, and the console errors, warnings,
    page errors and failed requests it has had (filled in as they come)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        page.goto(report.as_uri())
        try:
            yield page, problems
        finally:
            browser.close()


def look(report: Path, screenshot: Path) -> dict[str, Any]:
    with opened(report) as (page, problems):
        page.screenshot(path=str(screenshot), full_page=True)
        key = page.eval_on_selector_all("#port-colours td.swatch", KEY_JS)
        seen = {
            "verdict": page.inner_text("#verdict"),
            "tables": page.eval_on_selector_all("table", TABLES_JS),
            "images": page.eval_on_selector_all("img.plot", "is => is.map(i => [i.alt, i.complete, i.naturalWidth])"),
            "key": key,
            "plots": page.evaluate(PLOTS_JS, [page.query_selector_all("img.plot"), {p: c for p, c, _ in key}]),
            "sizes": page.inner_text("#sizes"),
            "reduced": page.inner_text("#reduced") if page.query_selector("#reduced") else None,
            "copyable": page.eval_on_selector_all("td.reproduce", "cs => cs.map(c => getComputedStyle(c).userSelect)"),
            "problems": problems,
        }
    return seen


def port_rows(seen: dict[str, Any]) -> dict[str, dict[str, dict[str, str]]]:
    [ports] = [t for t in seen["tables"] if t["id"] == "ports"]
    return {row[0]["text"]: dict(zip(ports["columns"], row, strict=True)) for row in ports["rows"]}


def rgb(hex_colour: str) -> str:
    return "rgb({}, {}, {})".format(*(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)))


# The ports each plot draws: the chunk plot and the history every port, a ULP histogram its port's.
PLOT_PORTS = {
    "chunks per family": {"equal_share", "per_request"},
    "equal_share ULP histogram": {"equal_share"},
    "history: parity rate": {"equal_share", "per_request"},
    "history: new divergences": {"equal_share", "per_request"},
}


def check_colours(seen: dict[str, Any]) -> None:
    """One colour per port in every plot: the key gives each port its own colour
    (its swatch painted in it); each plot drew each of its ports in exactly that
    colour and no other; and the plot's pixels hold that colour, and not the
    colour of a port it does not draw."""
    key = {port: colour for port, colour, _ in seen["key"]}
    assert set(key) == {"equal_share", "per_request"} and len(set(key.values())) == 2, seen["key"]
    assert all(background == rgb(colour) for _, colour, background in seen["key"]), seen["key"]
    plots = {plot["alt"]: plot for plot in seen["plots"]}
    assert set(PLOT_PORTS) <= set(plots), list(plots)
    for alt, ports in PLOT_PORTS.items():
        drawn, pixels = plots[alt]["drawn"], plots[alt]["pixels"]
        assert drawn == {port: [key[port]] for port in ports}, (alt, drawn, key)
        for port in ports:
            assert pixels[port] >= 20, (alt, port, pixels)
        for port in set(key) - ports:
            assert pixels[port] < 5, (alt, port, pixels)


def check_reproduce(seen: dict[str, Any], table: pd.DataFrame, port: str) -> list[tuple[str, list[str]]]:
    """The port's failing items each with the command that compares it again
    (its name, the suite, the night's --size and --numeric-size, the port, its level), copyable with
    one click; per item, its id and its command as an argument list."""
    [shown] = [t for t in seen["tables"] if t["id"] == f"failing-{port}"]
    assert shown["columns"] == ["id", "status", "baseline", "why", "reproduce"]
    assert len(shown["rows"]) == min(10, len(failing(table)))
    levels = dict(zip(table["id"], table["level"], strict=True))
    names = dict(zip(table["id"], table["name"], strict=True))
    commands = []
    for row in shown["rows"]:
        shown_id, command = row[0]["text"], row[-1]["text"]
        # An id carries the night's suite and sizes.
        assert shown_id.startswith("nightly:size=20:numeric-size=8/"), shown_id
        item = shown_id.removeprefix("nightly:size=20:numeric-size=8/")
        argv = shlex.split(command)
        assert row[-1]["cls"] == "reproduce" and argv[argv.index("-m") + 1 :][:2] == ["harness", "diff"], command
        expected = [names[item], "--suite", "nightly", "--size", "20", "--numeric-size", "8", "--port", port]
        expected += ["--level", levels[item]]
        assert argv[argv.index("diff") + 1 :] == expected, command
        commands.append((item, argv))
    assert commands and set(seen["copyable"]) == {"all"}
    return commands


def check_sizes(seen: dict[str, Any]) -> None:
    """The header states the night's sizes, and marks this small night reduced."""
    assert seen["sizes"].startswith("Sizes: --size 20 (default 50,000); --numeric-size 8 (defaults: prefill 200,")
    assert "levels all; mutant kill matrix not run; explore 0 s per port (default 60 s)." in seen["sizes"]
    assert seen["reduced"] is not None and seen["reduced"].startswith("REDUCED night")
    for reason in ("--size 20", "--numeric-size 8", "no mutant kill matrix", "no explore search"):
        assert reason in seen["reduced"], seen["reduced"]


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
    check_colours(seen)
    check_sizes(seen)


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
        # An error entry counts its items exactly (verdicts/baseline.py); on the others the count is the reason's.
        items = entry["items"] if entry["status"] in ("port-error", "oracle-error") else entry.pop("items")
        entry["reason"] = f"measured on 2026-11-27 ({items} items)"
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
    # Every failing item (new or expected) has its reproduce command; the first, pasted, reproduces it.
    [(item, command), *_] = check_reproduce(first, first_table, "equal_share")
    check_reproduce(second, second_table, "equal_share")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    name, status = first_table.set_index("id").loc[item, ["name", "status"]]
    assert f"({name}, from suite nightly)" in done.stdout.splitlines()[0]
    assert f"verdict: {str(status).upper()}" in done.stdout, done.stdout[-2000:]
