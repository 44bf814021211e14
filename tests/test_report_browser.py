"""The nightly HTML report in a real headless Chromium (Debian's package).

The page must render its verdict, tables and plots with no console errors; the
screenshot is kept next to the report for a human to look at.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.cli import main

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


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is not installed: `make test` installs it (tools/ensure_chromium.sh)"
    return path


def test_nightly_report_renders_in_chromium(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    args = ["--size", "60", "--numeric-size", "8", "--out", str(tmp_path)]
    assert main(["nightly", *args, "--date", "2026-11-27"]) == 0
    assert main(["nightly", *args, "--date", "2026-11-28"]) == 0
    capsys.readouterr()
    report = tmp_path / "2026-11-28" / "index.html"
    screenshot = tmp_path / "2026-11-28" / "screenshot.png"

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        page.goto(report.as_uri())
        page.screenshot(path=str(screenshot), full_page=True)
        verdict = page.inner_text("#verdict")
        tables = page.eval_on_selector_all("table", "ts => ts.map(t => t.rows.length)")
        images = page.eval_on_selector_all("img.plot", "is => is.map(i => [i.alt, i.complete, i.naturalWidth])")
        browser.close()

    assert verdict == "Verdict (per_request): PASS"
    assert len(tables) >= 5 and all(rows > 1 for rows in tables)
    alts = [alt for alt, _, _ in images]
    assert {"chunks per family", "equal_share ULP histogram", "history"} <= set(alts)
    assert alts.count("history") == 2
    assert all(complete and width > 100 for _, complete, width in images), images
    assert problems == []
    assert screenshot.stat().st_size > 50_000
