"""The kill matrix's reach pass: a mutant runs only where the fault-free base
calls its fault, and that changes no kill (ports/mutants/reach.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.cases.suites import load_suite
from harness.cli import main
from harness.kernels import CpuKernels
from harness.protocol.port import Port
from harness.search.mutants import Reach, kill_matrix, reaching_items, render_matrix
from harness.sides.items import DIVERGENT, PARITY, PORT_ERROR
from ports.mutants import MUTANTS, Mutant, fault_probe
from ports.per_request import planner as planner_module
from tests.conftest import make_case

# One mutant of each kind of fault site: an overridden method (workspace_size,
# rewrite_chunk, plan_layout and prefill), a swapped module function (planner,
# merge, prefill, DCP), a swapped class method, and swapped classes (sites unknown).
SAMPLE = (
    "workspace-floor",
    "token-to-seq-uint8",
    "legacy-grid",
    "unaligned-split",
    "merge-in-bf16",
    "device-token-to-seq-uint8",
    "continuation-merges-previous-chunk",
    "dcp-reorder-keeps-padding",
    "dcp-padded-by-shift",
    "round-down-by-mask",
)


def test_sites_name_where_each_fault_lives() -> None:
    probe = fault_probe()
    assert probe.sites(MUTANTS["workspace-floor"]()) == frozenset({"method:workspace_size"})
    assert probe.sites(MUTANTS["unaligned-split"]()) == frozenset({"attr:ports.per_request.planner:_largest_split"})
    assert probe.sites(MUTANTS["dcp-padded-by-shift"]()) == frozenset(
        {"attr:ports.per_request.planner:Geometry.padded"}
    )
    assert probe.sites(MUTANTS["legacy-grid"]()) == frozenset({"method:plan_layout", "method:prefill"})
    # A swapped class is read, not only called: no recorder can see every use.
    assert probe.sites(MUTANTS["round-down-by-mask"]()) is None
    # The fault-free base has no fault site: nothing to guide by, so it would run everywhere.
    assert probe.sites(Mutant()) is None


def test_sites_unknown_for_state_the_base_may_read() -> None:
    class WithConstant(Mutant):
        name = "with-constant"
        levels = ("layout",)

    class WithState(Mutant):
        name = "with-state"

        def __init__(self) -> None:
            self.rows = 3

    class WithSpecialMethod(Mutant):
        name = "with-special-method"

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(name)

    class WithNewMethod(Mutant):
        name = "with-new-method"

        def close(self) -> None:
            pass

    class Mixin:
        def enforces_timeout(self) -> bool:
            return False

    class WithMixin(Mutant, Mixin):
        name = "with-mixin"

    probe = fault_probe()
    with pytest.MonkeyPatch.context() as patch:
        # A method overriding what the base holds as a property: nothing to record.
        patch.setattr(Mutant, "rows_per_chunk", property(lambda self: 3), raising=False)

        class OverProperty(Mutant):
            name = "over-property"

            def rows_per_chunk(self) -> int:
                return 4

        assert probe.sites(OverProperty()) is None
        with pytest.raises(ValueError, match="not a method"), probe.recording({"method:rows_per_chunk"}):
            pass
    assert probe.sites(WithConstant()) is None
    assert probe.sites(WithState()) is None
    assert probe.sites(WithSpecialMethod()) is None
    assert probe.sites(WithNewMethod()) is None
    assert probe.sites(WithMixin()) is None
    assert probe.sites(object()) is None


def test_recording_sees_calls_and_restores_everything() -> None:
    probe = fault_probe()
    split = "attr:ports.per_request.planner:_largest_split"
    original = planner_module._largest_split
    sites = {split, "method:rewrite_chunk", "method:workspace_size", "attr:ports.per_request.planner:Geometry.padded"}
    case = make_case([700, 900, 40], [3, 5, 2], workspace_size=512)
    with probe.recording(sites) as reached:
        layout = probe.reference.plan_layout(case)
        assert planner_module._largest_split is not original
    assert len(layout.chunks) > 1
    assert split in reached and "method:rewrite_chunk" in reached
    assert "method:workspace_size" not in reached
    assert planner_module._largest_split is original and vars(probe.reference) == {}
    assert "padded" in vars(planner_module.Geometry) and vars(planner_module.Geometry)["padded"].__name__ == "padded"


def test_recording_restores_after_an_error() -> None:
    probe = fault_probe()
    original = planner_module._largest_split
    with pytest.raises(RuntimeError), probe.recording({"attr:ports.per_request.planner:_largest_split"}):
        raise RuntimeError("the reference failed")
    assert planner_module._largest_split is original


def test_an_item_the_base_fails_on_runs_every_mutant() -> None:
    items = [(1, "layout", "a"), (2, "layout", "b"), (3, "layout", "c"), (4, "layout", "d")]
    reach = [
        Reach(PARITY, frozenset()),
        Reach(PARITY, frozenset({"method:rewrite_chunk"})),
        Reach(DIVERGENT, frozenset()),
        Reach(PORT_ERROR, frozenset()),
    ]
    assert reaching_items(items, reach, frozenset({"method:rewrite_chunk"})) == items[1:]
    assert reaching_items(items, reach, frozenset({"method:prefill"})) == items[2:]
    assert reaching_items(items, reach, None) == items


def _kills(rows: list[Any]) -> dict[str, dict[str, Any]]:
    # The detail is left out: merge-lse-token-stride-one reads memory it never wrote.
    return {
        row.name: {lv: (k.item, k.status, k.items_tried) if k else None for lv, k in row.kills.items()} for row in rows
    }


def test_the_reach_pass_changes_no_kill(cached_oracle: Port) -> None:
    """Run exhaustively and with the reach pass, the smoke suite's matrix for one
    mutant of each kind of fault site is the same: the same item kills each at
    each level after the same number of items, the same survive; and the reach
    pass did skip items (so the comparison is not of two exhaustive runs)."""
    suite, levels = load_suite("smoke"), ("layout", "merge", "prefill")
    mutants = [MUTANTS[name]() for name in SAMPLE]
    guided = kill_matrix(cached_oracle, mutants, suite, levels, CpuKernels(), probe=fault_probe)
    exhaustive = kill_matrix(cached_oracle, mutants, suite, levels, CpuKernels())
    assert _kills(guided) == _kills(exhaustive)
    assert [row.decided for row in guided] == [row.decided for row in exhaustive]
    assert all(row.ran == row.decided for row in exhaustive)
    assert all(row.ran[lv] <= row.decided[lv] for row in guided for lv in levels)
    skipped = {row.name for row in guided if row.ran != row.decided}
    assert {"workspace-floor", "merge-in-bf16", "legacy-grid", "dcp-reorder-keeps-padding"} <= skipped
    assert "round-down-by-mask" not in skipped  # sites unknown: every item
    assert "item comparisons the matrix decided" in render_matrix(guided, levels, suite.name)
    assert "item comparisons the matrix decided" not in render_matrix(exhaustive, levels, suite.name)


def test_mutants_command_exhaustive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["mutants", "--suite", "smoke", "--only", "workspace-floor", "--level", "layout", "--no-shrink"]
    assert main([*args, "--out", str(tmp_path / "guided")]) == 0
    assert "item comparisons the matrix decided" in capsys.readouterr().out
    assert main([*args, "--exhaustive", "--out", str(tmp_path / "exhaustive")]) == 0
    out = capsys.readouterr().out
    assert "1/1 mutants killed" in out and "item comparisons the matrix decided" not in out
