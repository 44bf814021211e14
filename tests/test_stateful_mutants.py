"""Issue 31: the reach pass proves a mutant's sites before it skips items.

A mutant whose fault lives in its ``swaps()`` body, or whose swaps change from
one call to the next (a warm path: correct on the first call, wrong later), or
that keeps state from one item to the next, cannot be judged by where the
fault-free base goes: it runs on every item, and the kill matrix says so
(ports/mutants/reach.py)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from ports import mutants as mutants_package
from ports.mutants import MUTANTS, Mutant, fault_probe
from ports.per_request import planner as planner_module
from ports.per_request.planner import Geometry

# They pass --jobs or read the machine's cores: every core, not one xdist worker's (conftest).
pytestmark = pytest.mark.all_cores

# State no scan of names can see: swaps() reaches it through sys.modules.
HIDDEN_CALLS: list[int] = []
COUNTER = itertools.count()
REAL_SPLIT = planner_module._largest_split


def unaligned_split() -> list[tuple[Any, str, Any]]:
    """unaligned-split's fault (a split at any row, not on the alignment boundary)."""
    real = planner_module._largest_split

    def split(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
        return real(dataclasses.replace(geometry, alignment=1), start, remaining, free_rows)

    return [(planner_module, "_largest_split", split)]


class WarmPathInPort(Mutant):
    """Clean on its first swaps() call, unaligned-split from the second on; the
    count lives in the port, set only once swaps() runs."""

    name = "warm-path-in-port"
    description = "unaligned-split from its second call on (a count in the port)"
    source = "test"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        self.calls = getattr(self, "calls", 0) + 1
        return [] if self.calls == 1 else unaligned_split()


class WarmPathHidden(Mutant):
    """The same warm path, its count in a module list reached through
    ``sys.modules``: only calling swaps() again shows it."""

    name = "warm-path-hidden"
    description = "unaligned-split from its second call on (a count no name shows)"
    source = "test"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        calls = sys.modules[__name__].HIDDEN_CALLS
        calls.append(1)
        return [] if len(calls) == 1 else unaligned_split()


class SameTargetThenFaulty(Mutant):
    """The real function in place on the first call, the faulty one later."""

    name = "same-target-then-faulty"
    description = "the real split first, unaligned-split later"
    source = "test"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        calls = sys.modules[__name__].HIDDEN_CALLS
        calls.append(1)
        return [(planner_module, "_largest_split", REAL_SPLIT)] if len(calls) == 1 else unaligned_split()


class WarmPastTheProof(Mutant):
    """A warm path that stays clean for more calls than the proof makes (its
    count behind a call the static check does not follow): only the rule that a
    mutant without any fault site is unproven catches it."""

    name = "warm-past-the-proof"
    description = "unaligned-split from its tenth call on (a count behind a call)"
    source = "test"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return [] if next(_hidden_ticks()) < 9 else unaligned_split()


def _hidden_ticks() -> Any:
    return sys.modules[__name__].HIDDEN_TICKS


HIDDEN_TICKS = itertools.count()


@pytest.fixture(autouse=True)
def _fresh_hidden_count() -> None:
    global HIDDEN_TICKS
    HIDDEN_CALLS.clear()
    HIDDEN_TICKS = itertools.count()


def _plant(monkeypatch: pytest.MonkeyPatch, mutant: type[Mutant]) -> None:
    # The mutants command reads ports.mutants.MUTANTS when it runs: a planted
    # mutant is one of the catalogue for this test only.
    monkeypatch.setitem(mutants_package.MUTANTS, mutant.name, mutant)


@pytest.mark.parametrize("mutant", [WarmPathInPort, WarmPathHidden, WarmPastTheProof])
def test_mutants_command_kills_a_warm_path_mutant(
    mutant: type[Mutant], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Before issue 31 the reach pass called swaps() once, saw no swap, gave the
    mutant no site and ran it on no item: "survived". Now its sites are unproven,
    it runs on every item and the smoke suite kills it; the matrix says why."""
    _plant(monkeypatch, mutant)
    code = main(["mutants", "--suite", "smoke", "--only", mutant.name, "--level", "layout", "--no-shrink",
                 "--jobs", "1", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "1/1 mutants killed" in out, out
    assert "Reach unproven, run on every item" in out and f"`{mutant.name}`" in out
    (row,) = json.loads((tmp_path / "kill-matrix.json").read_text())["mutants"]
    assert row["killed"] and row["kills"]["layout"]["status"] == "divergent"
    assert row["reach"]["guided"] and row["reach"]["unproven"]
    assert row["ran"] == row["decided"]  # every item up to the kill


def test_unproven_says_why() -> None:
    probe = fault_probe()
    assert probe.examine(WarmPathInPort()) == (None, "keeps state: WarmPathInPort.swaps writes an attribute (calls)")
    for mutant in (WarmPathHidden(), SameTargetThenFaulty()):
        HIDDEN_CALLS.clear()
        sites, why = probe.examine(mutant)
        assert sites is None and why is not None and "warm path" in why, why


def test_the_proof_leaves_the_searched_port_as_it_was() -> None:
    """swaps() is called on a fresh instance: the port searched still makes its
    first call first (a warm path's clean call is not spent on the proof)."""
    mutant = WarmPathInPort()
    fault_probe().examine(mutant)
    assert vars(mutant) == {} and mutant.swaps() == []


class _Stateful:
    """Mutants each keeping state one way, none of it in the port's attributes."""

    class GlobalCounter(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            return [] if next(COUNTER) == 0 else unaligned_split()

    class WritesGlobal(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            global REAL_SPLIT
            REAL_SPLIT = planner_module._largest_split
            return []

    class WritesModule(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            planner_module.__doc__ = planner_module.__doc__  # the fault in swaps()'s body
            return []

    class SetattrInBody(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            setattr(planner_module, "__doc__", planner_module.__doc__)  # noqa: B010
            return []

    class ClosureOverList(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            seen: list[int] = []

            def split(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
                seen.append(start)  # written on one item, read on a later one
                return REAL_SPLIT(geometry, start, remaining, free_rows)

            return [(planner_module, "_largest_split", split)]

    class Nonlocal(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            count = 0

            def split(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
                nonlocal count
                count += 1
                return REAL_SPLIT(geometry, start, remaining, free_rows)

            return [(planner_module, "_largest_split", split)]

    class MutableDefault(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            def split(geometry: Geometry, start: int, remaining: int, free_rows: int, _memo: Any = {}) -> int:  # noqa: B006
                return REAL_SPLIT(geometry, start, remaining, free_rows)

            return [(planner_module, "_largest_split", split)]

    class MethodWritesClass(Mutant):
        def rewrite_chunk(self, chunk: Any, case: Any) -> Any:
            type(self).last = chunk  # type: ignore[attr-defined]
            return chunk

    class HelperReadsMutableGlobal(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            return _from_the_catalogue()


def _from_the_catalogue() -> list[tuple[Any, str, Any]]:
    return MUTANTS["unaligned-split"]().swaps()  # MUTANTS is a dict: it can change


@pytest.mark.parametrize("name", [n for n in vars(_Stateful) if not n.startswith("_")])
def test_state_of_every_kind_is_unproven(name: str) -> None:
    mutant = getattr(_Stateful, name)()
    sites, why = fault_probe().examine(mutant)
    assert sites is None and why is not None and why.startswith("keeps state: "), (name, why)


def test_stateless_swaps_are_still_proven() -> None:
    """Closures made afresh by each call, over the same values, are the same
    swap; every catalogue mutant keeps the sites it had, so the shortcut stays."""

    class Clean(Mutant):
        def swaps(self) -> list[tuple[Any, str, Any]]:
            return unaligned_split()

    assert fault_probe().sites(Clean()) == frozenset({"attr:ports.per_request.planner:_largest_split"})
    unknown = {name for name, mutant in MUTANTS.items() if fault_probe().sites(mutant()) is None}
    assert unknown == {"align-max-not-lcm", "round-down-by-mask"}  # swapped classes, as before issue 31
