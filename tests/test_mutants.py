"""Mutant ports, the kill matrix and shrinking."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.kernels import CpuKernels
from harness.mutants import kill_matrix
from harness.port import Port
from harness.runner import PARITY, compare_case
from harness.shrink import checker, shrink
from harness.suites import load_suite
from ports.mutants import MUTANTS


def test_catalogue() -> None:
    assert len(MUTANTS) >= 13
    assert {"legacy-grid", "finite-lse-empty-rows", "workspace-floor", "equal-share-no-neutralise"} <= set(MUTANTS)
    for mutant in MUTANTS.values():
        assert mutant.description and mutant.source


def test_mutants_leave_the_real_port_untouched(oracle: Port, per_request: Port) -> None:
    """A mutant swaps functions only during its own calls."""
    suite = load_suite("smoke")
    for mutant in MUTANTS.values():
        for case in suite.cases[:5]:
            try:
                mutant().plan_layout(case)
            except ValueError:
                pass  # the legacy grid cannot plan some batches; the swap must still be undone
    assert all(compare_case(oracle, per_request, case).status == PARITY for case in suite.cases)


def test_smoke_kills_every_mutant(oracle: Port) -> None:
    """The README's claim: the smoke suite kills every mutant in the catalogue."""
    rows = kill_matrix(oracle, [m() for m in MUTANTS.values()], load_suite("smoke"), ("layout", "merge", "prefill"),
                       CpuKernels())  # fmt: skip
    assert [r.name for r in rows if not r.killed] == []
    by_name = {r.name: r for r in rows}
    assert by_name["finite-lse-empty-rows"].kills["prefill"] is not None  # only numbers can see it
    assert by_name["merge-in-bf16"].kills["merge"] is not None
    assert by_name["legacy-grid"].kills["layout"] is not None
    # Killed at L3 on a case where equal_share itself is bit-exact (tests/test_keyless_rows.py).
    no_neutralise = by_name["equal-share-no-neutralise"].kills["prefill"]
    assert no_neutralise is not None and no_neutralise.item == "smoke-keyless-finite[prefill]"


def test_mutants_command_writes_matrix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["mutants", "--suite", "smoke", "--only", "query-start-not-rebased,workspace-floor",
                 "--level", "layout", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "2/2 mutants killed" in out
    matrix = (tmp_path / "kill-matrix.md").read_text()
    assert "shrunk:" in matrix and (tmp_path / "kill-matrix.json").exists()
    assert (tmp_path / "shrunk" / "query-start-not-rebased-layout.json").exists()


def test_shrink_keeps_level_and_field(oracle: Port, equal_share: Port) -> None:
    case = next(c for c in load_suite("smoke").cases if c.name == "smoke-upstream-worst-case")
    check = checker(oracle, equal_share, "layout")
    before = check(case)
    outcome = shrink(case, check)
    assert outcome.result.divergence is not None and before.divergence is not None
    assert outcome.result.divergence.field == before.divergence.field
    assert outcome.case.num_requests <= 2 and sum(outcome.case.context_lens) < 100
    assert outcome.case.workspace_size <= 64


def test_shrink_command_writes_a_case_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "small.json"
    code = main(["shrink", "smoke-numeric-continuation-zero", "--port", "mutant:finite-lse-empty-rows",
                 "--level", "prefill", "--budget", "80", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 1 and out.exists() and "still divergent" in printed
    assert main(["diff", str(out), "--port", "mutant:finite-lse-empty-rows", "--level", "prefill"]) == 1
    assert "L3 prefill: DIVERGENT" in capsys.readouterr().out
