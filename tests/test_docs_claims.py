"""The documentation's countable claims (docs/cases.md's suites, docs/search.md's
kill counts), checked against what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from harness.cases.suites import load_suite
from ports.mutants import MUTANTS

ROOT = Path(__file__).resolve().parent.parent
CASES_PAGE = (ROOT / "docs" / "cases.md").read_text(encoding="utf-8")
SEARCH_PAGE = (ROOT / "docs" / "search.md").read_text(encoding="utf-8")


def suite_row(name: str) -> str:
    row = next(line for line in CASES_PAGE.splitlines() if line.startswith(f"| `{name}` |"))
    return row


def test_workspace_grid_sizes_match_the_suites() -> None:
    for name in ("smoke", "ci"):
        claimed = re.search(r"a ([\d,]+)-config workspace grid", suite_row(name))
        assert claimed is not None, name
        assert int(claimed.group(1).replace(",", "")) == len(load_suite(name).workspace_configs), name


def test_merge_and_smoke_counts_match() -> None:
    smoke = load_suite("smoke")
    claimed = re.search(r"(\d+) merge cases", suite_row("smoke"))
    assert claimed is not None and int(claimed.group(1)) == len(smoke.merge_cases)
    files = len(list((ROOT / "cases" / "smoke").glob("*.json")))
    assert f"| `smoke` | {files} hand-picked case files" in CASES_PAGE


def test_make_gate_runs_the_gate() -> None:
    """`make gate` is the quick start's gate: it must run `parity gate`, not `parity run`."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ngate:", 1)[1].split("\n\n", 1)[0]
    assert "-m harness gate " in recipe and "-m harness run " not in recipe


def test_mutant_kill_claims_count_the_whole_catalogue() -> None:
    from tests.test_mutants import SMOKE_MUTANTS, SMOKE_SURVIVORS

    for suite, catalogue, survivors in (("ci", len(MUTANTS), 0), ("smoke", len(SMOKE_MUTANTS), len(SMOKE_SURVIVORS))):
        claimed = re.search(rf"\*\*{suite} suite kills (\d+) of (\d+)\*\*", SEARCH_PAGE)
        assert claimed is not None, suite
        assert int(claimed.group(2)) == catalogue, suite
        assert int(claimed.group(1)) == catalogue - survivors, suite
