"""Every count the docs state that the code or the data determines, checked
against them: each claim is a page, a pattern whose groups hold the stated
numbers (digits, or a word such as "seven"), and what each must equal.

A count a run measures (a figure, a dated report) is not here: those carry
their date or commit where they are stated. docs/cases.md's suite sizes and
docs/search.md's kill counts are tests/test_docs_claims.py's; the ci item
count of the recipe and a night's items per --size, tests/test_commands_doc.py's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from harness.cases.suites import Suite, load_suite, workspace_grid

ROOT = Path(__file__).resolve().parents[1]
WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
NUMBER = r"([\d,]+|" + "|".join(WORDS) + ")"


def stated(text: str) -> int:
    word = text.lower()
    return WORDS.index(word) if word in WORDS else int(text.replace(",", ""))


@cache
def suite(name: str) -> Suite:
    return load_suite(name)


def pin_symbols(path: str) -> int:
    return len(json.loads((ROOT / path).read_text(encoding="utf-8"))["fingerprints"])


def family_count(name: str, family_prefix: str) -> int:
    return sum(1 for c in suite(name).cases if c.name.startswith(family_prefix))


def _sparse_mutants() -> tuple[int, int]:
    from ports.mutants.sparse import SPARSE_L3_MUTANTS, SPARSE_MUTANTS

    return len(SPARSE_MUTANTS), len(SPARSE_L3_MUTANTS)


def _hand_written_dense() -> int:
    from ports.mutants import MUTANTS
    from ports.mutants.conditions import CONDITION_MUTANTS

    return len(MUTANTS) - len(CONDITION_MUTANTS) - _sparse_mutants()[0]


def _judged_ci_targets() -> int:
    from harness.search.coverage_targets import load_targets

    return sum(1 for target in load_targets()["ci"] if not target.report_only)


def _items(name: str) -> int:
    from harness.model.levels import LEVELS
    from harness.sides.runner import count_items

    return count_items(suite(name), tuple(LEVELS))


def _built_in_levels() -> int:
    from harness.model.levels import LEVELS

    return len(LEVELS)


def _gpu_wheels() -> int:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_gpu_bundle", ROOT / "tools" / "build_gpu_bundle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return len(module.WHEELS)


def _bench_batches() -> int:
    data = json.loads((ROOT / "cases" / "gpu" / "bench.json").read_text(encoding="utf-8"))
    return len(data["cases"])


def _sparse_l3_rows_in(name: str) -> int:
    return sum(1 for c in suite(name).sparse_cases if c.family == "sparse-l3-rows")


def _spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((ROOT / "cases" / "suites.json").read_text(encoding="utf-8"))[name]
    return spec


def _first_count(name: str, key: str) -> int:
    """The count of a suite's first group of ``key`` (a group, or a list of them)."""
    groups = _spec(name)[key]
    return int((groups[0] if isinstance(groups, list) else groups)["count"])


def _numeric_cases(name: str) -> int:
    return sum(1 for c in suite(name).cases if c.numeric is not None)


def _keyless(name: str, narrow: bool) -> int:
    """Keyless-row variants of the suite's generated prefill cases: of the tiny
    preset's (``numeric-<family>-...``) or of the narrow coverage group's."""
    return sum(
        1
        for c in suite(name).cases
        if c.name.startswith("numeric-") and "-keyless-" in c.name and c.name.startswith("numeric-narrow-") == narrow
    )


def _baseline_entries(level: str, status: str | None = None) -> list[dict[str, Any]]:
    entries = json.loads((ROOT / "cases" / "baselines" / "equal_share.json").read_text(encoding="utf-8"))["entries"]
    return [e for e in entries if e["level"] == level and (status is None or e["status"] == status)]


def _baseline_level(level: str) -> list[int]:
    """A level's equal_share baseline entries: all, divergent, port-error, and the port-error items counted."""
    errors = _baseline_entries(level, "port-error")
    counted = sum(int(e["items"]) for e in errors)
    return [len(_baseline_entries(level)), len(_baseline_entries(level, "divergent")), len(errors), counted]


def _hung_after() -> int:
    from harness.sides.work_box import HUNG_AFTER

    return HUNG_AFTER


def _condition_mutants() -> int:
    from ports.mutants.conditions import CONDITION_MUTANTS

    return len(CONDITION_MUTANTS)


# (page, pattern with one group per number, what each group must equal)
CLAIMS: list[tuple[str, str, Callable[[], Sequence[int]]]] = [
    ("docs/sparse.md", rf"{NUMBER} sparse L3 mutants \(`ports/mutants/sparse.py`\)", lambda: [_sparse_mutants()[1]]),
    ("docs/sparse.md", rf"{NUMBER} sparse mutants \(", lambda: [_sparse_mutants()[0] - _sparse_mutants()[1]]),
    ("docs/sparse.md", rf"meets {NUMBER}/{NUMBER}\)", lambda: [_judged_ci_targets()] * 2),
    ("docs/search.md", rf"{NUMBER}/{NUMBER} feature targets met", lambda: [_judged_ci_targets()] * 2),
    (
        "docs/search.md",
        rf"holds the {NUMBER} mutant ports below and the {NUMBER} sparse ones",
        lambda: [_hand_written_dense(), _sparse_mutants()[0]],
    ),
    ("docs/search.md", rf"the {NUMBER} sparse mutants included", lambda: [_sparse_mutants()[0]]),
    (
        "docs/search.md",
        rf"Of the {NUMBER} mutants written by hand",
        lambda: [_hand_written_dense() + _sparse_mutants()[0]],
    ),
    (
        "docs/nightly.md",
        rf"vllm-0\.33\.0\.json`, {NUMBER} symbols",
        lambda: [pin_symbols("oracle/pins/vllm-0.33.0.json")],
    ),
    (
        "docs/oracles.md",
        rf"0\.28\.0's pin holds {NUMBER} symbols, 0\.27\.1's {NUMBER}, 0\.33\.0's {NUMBER}",
        lambda: [
            pin_symbols(p) for p in ("oracle/pin.json", "oracle/pins/vllm-0.27.1.json", "oracle/pins/vllm-0.33.0.json")
        ],
    ),
    (
        "docs/oracles.md",
        rf"\(`oracle/pins/vllm-0\.33\.0\.json`, the drift watch's\) holds {NUMBER}",
        lambda: [pin_symbols("oracle/pins/vllm-0.33.0.json")],
    ),
    ("docs/architecture.md", rf"the {NUMBER} modules of\s+`harness/levels/`", lambda: [_built_in_levels()]),
    ("docs/gpu.md", rf"the {NUMBER} wheels", lambda: [_gpu_wheels()]),
    ("docs/gpu.md", rf"on the {NUMBER} batches of `cases/gpu/bench\.json`", lambda: [_bench_batches()]),
    (
        "docs/gpu.md",
        rf"\({NUMBER} merge\s+cases; {NUMBER} prefill cases at DeepSeek dimensions, {NUMBER} with DeepSeek-V2-Lite's"
        rf"\s+16 heads and 576-wide latent, {NUMBER} with DeepSeek-V3's",
        lambda: [
            len(suite("gpu").merge_cases),
            _numeric_cases("gpu"),
            *(int(group["count"]) for group in _spec("gpu")["prefill"]),
        ],
    ),
    (
        "docs/gate-your-own-port.md",
        rf"every level, about {NUMBER} items",
        lambda: [round(_items("smoke"), -1)],
    ),
    (
        "docs/cases.md",
        rf"{NUMBER} sweep layout cases generated from seed (\d+) and {NUMBER} coverage layout cases",
        lambda: [
            _spec("ci")["generate"][0]["count"],
            _spec("ci")["generate"][0]["seed"],
            _spec("ci")["generate"][1]["count"],
        ],
    ),
    ("docs/cases.md", rf"`full`, {NUMBER} powers of two", lambda: [len(workspace_grid("full"))]),
    (
        "docs/cases.md",
        rf"{NUMBER} merge \(L2\) cases and {NUMBER} generated prefill \(L3\) cases, plus {NUMBER} keyless-row variants",
        lambda: [len(suite("ci").merge_cases), _spec("ci")["prefill"][0]["count"], _keyless("ci", narrow=False)],
    ),
    (
        "docs/cases.md",
        rf"{NUMBER} coverage prefill cases \(`crowd`, `three-piece`, `hybrid-block`, `narrow` preset\)"
        rf" and {NUMBER} keyless",
        lambda: [_spec("ci")["prefill"][1]["count"], _keyless("ci", narrow=True)],
    ),
    ("docs/cases.md", rf"and {NUMBER} DCP prefill cases \(family `dcp`", lambda: [family_count("ci", "numeric-dcp-")]),
    ("docs/cases.md", rf"; {NUMBER} prefill cases in all with the smoke files", lambda: [_numeric_cases("ci")]),
    (
        "docs/cases.md",
        rf"the ci workspace grids, {NUMBER} merge and {NUMBER} prefill cases, {NUMBER} keyless-row variants",
        lambda: [
            len(suite("nightly").merge_cases),
            _spec("nightly")["prefill"][0]["count"],
            _keyless("nightly", narrow=False),
        ],
    ),
    (
        "docs/cases.md",
        rf"{NUMBER} coverage prefill cases and their keyless variants",
        lambda: [_spec("nightly")["prefill"][1]["count"]],
    ),
    (
        "docs/sparse.md",
        rf"smoke holds {NUMBER} sparse batches, the small sparse workspace grid"
        rf" \({NUMBER}\s+configurations\) and {NUMBER} mask cases",
        lambda: [
            len([c for c in suite("smoke").sparse_cases if c.numeric is None]),
            len(suite("smoke").sparse_workspace_configs),
            len(suite("smoke").mask_cases),
        ],
    ),
    (
        "docs/sparse.md",
        rf"sparse grids \({NUMBER} configurations",
        lambda: [len(suite("ci").sparse_workspace_configs)],
    ),
    (
        "docs/sparse.md",
        rf"Smoke\s+holds {NUMBER}, ci {NUMBER}, the nightly {NUMBER}; each is a sparse batch",
        lambda: [_first_count(name, "sparse_prefill") for name in ("smoke", "ci", "nightly")],
    ),
    ("docs/sparse.md", rf"ci adds the first {NUMBER} batches of `sparse-l3-rows`", lambda: [_sparse_l3_rows_in("ci")]),
    ("docs/sparse.md", rf"the nightly all {NUMBER} \(the fifth", lambda: [_sparse_l3_rows_in("nightly")]),
    (
        "docs/gate.md",
        rf"the ci suite this way: {NUMBER} family entries: {NUMBER} at layout \({NUMBER} divergent, .*?; {NUMBER}"
        rf" port-error counting {NUMBER} items, .*?{NUMBER} at prefill \({NUMBER} divergent; {NUMBER} port-error"
        rf" counting {NUMBER} items\), {NUMBER} at sparse-layout \({NUMBER} divergent, {NUMBER} port-error counting"
        rf" {NUMBER} items\) and {NUMBER} at sparse-prefill \({NUMBER} divergent, {NUMBER} port-error counting"
        rf" {NUMBER} items\)",
        lambda: [
            sum(len(_baseline_entries(level)) for level in ("layout", "prefill", "sparse-layout", "sparse-prefill")),
            *_baseline_level("layout"),
            *_baseline_level("prefill"),
            *_baseline_level("sparse-layout"),
            *_baseline_level("sparse-prefill"),
        ],
    ),
    ("docs/search.md", rf"{NUMBER} of them are the per-condition mutants", lambda: [_condition_mutants()]),
    ("docs/commands.md", rf"A port whose calls time out on {NUMBER} items", lambda: [_hung_after()]),
    ("docs/bad-input.md", rf"after {NUMBER} items in a row it is declared hung", lambda: [_hung_after()]),
    ("docs/sparse.md", rf"the {NUMBER} batches of `sparse-decisions`", lambda: [_first_count("ci", "sparse")]),
    (
        "docs/search.md",
        rf"`harness/cases/sparse_decisions.py`\), {NUMBER} batches",
        lambda: [_first_count("ci", "sparse")],
    ),
    (
        "docs/levels.md",
        rf"the ci suite holds {NUMBER} generated DCP prefill cases",
        lambda: [family_count("ci", "numeric-dcp-")],
    ),
    (
        "docs/search.md",
        rf"the {NUMBER} drawn sparse L3 batches",
        lambda: [_first_count("ci", "sparse_prefill")],
    ),
]


@pytest.mark.parametrize(("page", "pattern", "expected"), CLAIMS, ids=[f"{p}:{r[:40]}" for p, r, _ in CLAIMS])
def test_a_count_the_docs_state_is_the_codes(page: str, pattern: str, expected: Callable[[], Sequence[int]]) -> None:
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())  # a phrase may wrap
    found = re.search(pattern.replace(r"\s+", " "), text, re.IGNORECASE)
    assert found is not None, f"{page} no longer says {pattern!r}: update the claim with the page"
    assert [stated(group) for group in found.groups()] == list(expected()), f"{page}: {found.group(0)!r}"
