"""The nightly page's kill matrix in a real headless Chromium: a level none of
whose items reaches a mutant's fault shows "n/a" in grey, not a red "survived".

One small night (no layout cases, 4 numeric ones, the prefill level only) runs
the whole mutant catalogue: the sparse path's mutants and the workspace-size
ones cannot show at dense L3 (their code is never called there), some dense
mutants are reached and survive, most are killed. tests/test_report_browser.py
checks the rest of the page (colours, reproduce commands, sizes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from ports.mutants import MUTANTS
from tests.test_report_browser import opened

SMALL = ["--size", "0", "--numeric-size", "4", "--level", "prefill", "--explore-budget-s", "0"]
# Per kill-matrix row: the mutant, and its prefill cell's text, class and background.
MATRIX_JS = """t => [...t.tBodies[0].rows].map(r => {
  const header = [...t.tHead.rows[0].cells].map(c => c.innerText);
  const cell = r.cells[header.indexOf('prefill')];
  const first = r.cells[header.indexOf('first kill')];
  return {mutant: r.cells[0].innerText, text: cell.innerText, cls: cell.className,
          background: getComputedStyle(cell).backgroundColor, first: first.innerText};
})"""


def look_at_matrix(page_path: Path, screenshot: Path) -> dict[str, Any]:
    with opened(page_path) as (page, problems):
        page.locator("#kill-matrix").screenshot(path=str(screenshot))
        return {
            "rows": page.eval_on_selector("#kill-matrix", MATRIX_JS),
            "note": page.inner_text("#kill-matrix + p.note"),
            "fail": page.eval_on_selector("#verdict", "v => getComputedStyle(v).backgroundColor"),
            "problems": problems,
        }


def test_kill_matrix_says_na_where_a_level_cannot_catch_the_mutant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["nightly", *SMALL, "--out", str(tmp_path), "--date", "2026-11-27", "--baseline", "equal_share=none"]
    assert main(argv) == 1  # equal_share diverges at L3 against no baseline
    capsys.readouterr()
    night = tmp_path / "2026-11-27"
    matrix = json.loads((night / "night.json").read_text(encoding="utf-8"))["kill_matrix"]
    assert matrix["levels"] == ["prefill"] and len(matrix["mutants"]) == len(MUTANTS)
    ran = {m["name"]: m["ran"]["prefill"] for m in matrix["mutants"]}
    unsearched = {m["name"] for m in matrix["mutants"] if "prefill" in m.get("not_searched", [])}
    killed = {m["name"]: m["kills"]["prefill"] is not None for m in matrix["mutants"]}

    seen = look_at_matrix(night / "index.html", night / "kill-matrix.png")
    assert seen["problems"] == []
    rows = {row["mutant"]: row for row in seen["rows"]}
    assert set(rows) == set(MUTANTS)
    # The page follows the reach pass: n/a exactly where the mutant ran on no item of the
    # level; "not searched" where a per-condition mutant is not searched (its shows_at).
    assert unsearched and all(MUTANTS[name].shows_at for name in unsearched)
    for name, row in rows.items():
        expected = (
            "killed"
            if killed[name]
            else "not searched"
            if name in unsearched
            else "n/a"
            if ran[name] == 0
            else "survived"
        )
        assert row["text"] == expected, (name, row, ran[name])
        assert row["cls"] == {"killed": "pass", "n/a": "na", "not searched": "na", "survived": "fail"}[expected], row
    # The sparse path's mutants never run at dense L3: n/a or not searched there, never a red survivor.
    sparse = [name for name in MUTANTS if name.startswith("sparse-")]
    assert sparse and all(rows[name]["text"] in ("n/a", "not searched") for name in sparse)
    assert rows["sparse-l3-fold-last-first"]["first"] == "n/a at every level run"
    # Each kind is there, and each has its own colour: n/a grey, survived red (as a FAIL), killed green.
    backgrounds = {kind: {r["background"] for r in rows.values() if r["text"] == kind} for kind in ("n/a", "survived")}
    backgrounds["killed"] = {r["background"] for r in rows.values() if r["text"] == "killed"}
    assert all(len(colours) == 1 for colours in backgrounds.values()), backgrounds
    [na], [survived], [kill] = backgrounds["n/a"], backgrounds["survived"], backgrounds["killed"]
    assert len({na, survived, kill}) == 3 and survived == seen["fail"]
    red, green, blue = (int(v) for v in na.removeprefix("rgb(").removesuffix(")").split(","))
    assert max(red, green, blue) - min(red, green, blue) < 8, na  # a grey
    assert all(r["first"] == "SURVIVED" for r in rows.values() if r["text"] == "survived")
    assert seen["note"].startswith("n/a (grey): no item of that level calls the mutant's fault")
    assert (night / "kill-matrix.png").stat().st_size > 10_000
