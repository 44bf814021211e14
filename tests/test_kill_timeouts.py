"""Issue 31: a mutant call past its time limit is not a kill.

Nothing was compared on an item whose port call timed out, so the kill matrix
lists the item, goes on searching, and a level on which the mutant only timed
out reads "timed out" (harness/search/mutants.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from harness.cases.suites import load_suite
from harness.cli import main
from harness.kernels import CpuKernels
from harness.protocol.port import Port
from harness.search.mutants import kill_matrix, render_matrix
from harness.sides.items import DIVERGENT
from harness.sides.runner import plan_items
from harness.sides.runner import run_item as real_run_item
from ports import mutants as mutants_package
from ports.mutants import MUTANTS, Mutant

# They pass --jobs or read the machine's cores: every core, not one xdist worker's (conftest).
pytestmark = pytest.mark.all_cores

# The limit of a planted mutant's calls here; it sleeps far past it.
LIMIT_S = 0.2
# The limit where every call of the planted mutant hangs (none has to finish in time).
HANG_LIMIT_S = 0.05
HANG_S = 30.0


class HangingMerge(Mutant):
    """per_request, except that its merge never answers in time: no wrong value, no error."""

    name = "hanging-merge"
    description = "the merge hangs"
    source = "test"

    def merge_states(self, inputs: Any) -> Any:
        time.sleep(HANG_S)
        return super().merge_states(inputs)


class HangsOnceThenBf16(Mutant):
    """Hangs on its first merge, then merges in bf16 (merge-in-bf16): the kill is a divergence."""

    name = "hangs-once-then-bf16"
    description = "the first merge hangs, the rest are in bf16"
    source = "test"

    def merge_states(self, inputs: Any) -> Any:
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 1:
            time.sleep(HANG_S)
        return MUTANTS["merge-in-bf16"]().merge_states(inputs)


def _quick_limit_for_planted(monkeypatch: pytest.MonkeyPatch, limit_s: float = LIMIT_S) -> None:
    """``parity mutants`` has no --timeout: the planted mutants' calls get ``limit_s``
    (the base's and the oracle's keep theirs)."""

    def run_item(oracle: Port, port: Port, kind: str, item: Any, kernels: Any, *rest: Any) -> Any:
        args = list(rest)
        if getattr(port, "source", "") == "test":
            args = [args[0] if args else "cpu", limit_s, *args[2:]]
        return real_run_item(oracle, port, kind, item, kernels, *args)

    monkeypatch.setattr("harness.search.mutants.run_item", run_item)


def test_a_mutant_that_only_hangs_is_not_killed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Before issue 31 the first timeout was the mutant's kill ("1/1 mutants
    killed", exit 0). Now every merge item times out, none is a kill, the cell
    says "timed out", and the command fails as for a survivor."""
    monkeypatch.setitem(mutants_package.MUTANTS, HangingMerge.name, HangingMerge)
    _quick_limit_for_planted(monkeypatch, HANG_LIMIT_S)
    code = main(["mutants", "--suite", "smoke", "--only", HangingMerge.name, "--level", "merge", "--no-shrink",
                 "--jobs", "1", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1 and "0/1 mutants killed, 1 timed out without a kill" in out, out
    assert "| timed out | - |" in out and "Timed out, not killed" in out and "Survivors" not in out
    (row,) = json.loads((tmp_path / "kill-matrix.json").read_text())["mutants"]
    merge_items = [f"{item.name}[{kind}]" for kind, item in plan_items(load_suite("smoke"), ("merge",))]
    assert not row["killed"] and row["kills"] == {"merge": None}
    assert row["timed_out"]["merge"] == merge_items  # each timed out, and the search went on to the last


def test_a_kill_after_a_timeout_is_the_divergence(oracle: Port) -> None:
    """A timeout on the first item is listed and passed over; the kill is the
    first divergence after it (kill_matrix's own ``timeout_s``)."""
    suite = load_suite("smoke")
    (row,) = kill_matrix(oracle, [HangsOnceThenBf16()], suite, ("merge",), CpuKernels(), timeout_s=LIMIT_S)
    kill = row.kills["merge"]
    first = next(iter(plan_items(suite, ("merge",))))
    assert row.timed_out["merge"] == [f"{first[1].name}[merge]"]
    assert kill is not None and kill.status == DIVERGENT and kill.items_tried >= 2 and row.killed
    matrix = render_matrix([row], ("merge",), suite.name)
    assert "1/1 mutants killed" in matrix and "Calls past the time limit" in matrix and "| killed |" in matrix
