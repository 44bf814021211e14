"""The per-condition mutants (ports/mutants/conditions.py) against the MC/DC
report: every condition that can matter has a mutant that gets it wrong; ci
kills each at the level its bug shows, and the item the kill matrix names is
one side of an independence pair of the mutant's condition."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import replace

import pytest

from harness.cases.suites import Suite, load_suite
from harness.kernels import CpuKernels
from harness.protocol.port import Port
from harness.search.decisions_dense import ChunkSpans, observe_layout
from harness.search.decisions_sparse import observe_case, observe_workspace
from harness.search.mcdc import Decision, McdcReport, Observation, judge_decision, witness_pair
from harness.search.mcdc_measure import DECISION_BY_ID, DECISIONS, observe_suite
from harness.search.mutants import kill_matrix
from ports.mutants import MUTANTS

AIMED = {name: m for name, m in MUTANTS.items() if m.conditions}


def _level(decision: str) -> str:
    return "layout" if decision.startswith("dense.") else "sparse-layout"


@pytest.fixture(scope="module")
def ci() -> Suite:
    return load_suite("ci")


@pytest.fixture(scope="module")
def kills(ci: Suite, cached_oracle: Port) -> dict[str, str | None]:
    """Each aimed mutant's first kill on ci at the level its condition shows
    (the search in suite order: the sparse-decisions family leads ci's sparse
    items, and the smoke case files its layout items)."""
    found: dict[str, str | None] = {}
    for level in ("layout", "sparse-layout"):
        mutants = [m() for m in AIMED.values() if {_level(d) for d, _ in m.conditions} == {level}]
        for row in kill_matrix(cached_oracle, mutants, ci, (level,), CpuKernels()):
            kill = row.kills[level]
            found[row.name] = kill.item if kill is not None else None
    return found


@pytest.fixture(scope="module")
def observed(ci: Suite, cached_oracle: Port, kills: dict[str, str | None]) -> dict[str, list[Observation]]:
    """Every declared decision observed on ci's sparse items and on its layout
    items among the smoke case files (where every dense pair lies:
    tests/test_mcdc.py) and the ones that killed a mutant."""
    killers = {item.split("[", 1)[0] for item in kills.values() if item is not None}
    layouts = tuple(c for c in ci.cases if c.name.startswith("smoke-") or c.name in killers)
    measured = replace(ci, cases=layouts, workspace_configs=(), merge_cases=(), mask_cases=())
    return observe_suite(measured, cached_oracle)


@pytest.fixture(scope="module")
def report(ci: Suite, observed: dict[str, list[Observation]]) -> McdcReport:
    return McdcReport(ci.name, tuple(judge_decision(d, observed.get(d.id, [])) for d in DECISIONS))


def test_every_condition_that_can_matter_has_a_mutant(report: McdcReport) -> None:
    aimed = {condition for mutant in AIMED.values() for condition in mutant.conditions}
    wanted = {(c.decision, c.condition.name) for c in report.conditions if c.status != "infeasible"}
    assert wanted - aimed == set()
    assert aimed - wanted == set(), "a mutant names a condition the table does not declare"


def test_ci_kills_every_aimed_mutant(kills: dict[str, str | None]) -> None:
    assert set(kills) == set(AIMED)
    assert [name for name, item in kills.items() if item is None] == []


@pytest.mark.parametrize("name", sorted(AIMED))
def test_the_killer_is_a_witness_of_the_condition(
    observed: dict[str, list[Observation]], kills: dict[str, str | None], name: str
) -> None:
    """The kill matrix and MC/DC agree: the item that killed the mutant is one side
    of an independence pair of a condition the mutant gets wrong."""
    killer = kills[name]
    assert killer is not None
    witnesses = []
    for decision_id, condition_name in AIMED[name].conditions:
        decision = DECISION_BY_ID[decision_id]
        condition = next(c for c in decision.conditions if c.name == condition_name)
        witnesses.append(witness_pair(decision, condition, observed.get(decision_id, []), killer))
    assert any(witnesses), f"{name} was killed by {killer}, a witness of none of {AIMED[name].conditions}"


def _decided(decision_ids: set[str], pairs: Iterable[tuple[Decision, Observation]]) -> list[tuple[str, Hashable]]:
    return sorted(((o.item, repr(o.outcome)) for d, o in pairs if d.id in decision_ids), key=repr)


@pytest.mark.parametrize("name", sorted(AIMED))
def test_the_mutant_decides_its_decision_otherwise_on_the_killer(
    ci: Suite, cached_oracle: Port, kills: dict[str, str | None], name: str
) -> None:
    """Its label is its fault: on the killing item, the decision it names comes
    out otherwise from the mutant's answer than from the oracle's."""
    killer = kills[name]
    assert killer is not None
    mutant = AIMED[name]()
    decisions = {decision for decision, _ in mutant.conditions}
    bare, kind = killer.split("@", 1)[0].removesuffix("]").split("[")
    sides: list[list[tuple[str, Hashable]]] = []
    for side in (cached_oracle, mutant):
        try:
            if kind == "layout":
                case = next(c for c in ci.cases if c.name == bare)
                chunks = [
                    ChunkSpans(
                        c.request_start, c.request_end, c.starts, c.seq_lens, c if case.dcp_world_size > 1 else None
                    )
                    for c in side.plan_layout(case).chunks
                ]
                sides.append(_decided(decisions, observe_layout(killer, case, chunks)))
            elif kind == "sparse-workspace":
                config = next(c for c in ci.sparse_workspace_configs if c.name == bare)
                size = side.sparse_workspace_size(config)  # type: ignore[attr-defined]
                sides.append(_decided(decisions, observe_workspace(killer, config, size)))
            else:
                sparse_case = next(c for c in ci.sparse_cases if c.name == bare)
                plan = side.plan_sparse(sparse_case)  # type: ignore[attr-defined]
                sides.append(_decided(decisions, observe_case(killer, sparse_case, plan)))
        except Exception:
            assert side is mutant, "the oracle answers every ci item"
            return  # killed by its error: the decision has no answer to read
    assert sides[0] != sides[1], f"{name}: on {killer} it decides {sorted(decisions)} as the oracle does"
