"""MC/DC (harness/search/mcdc.py): the pair search on hand-made observations,
the declared tables against the oracle, and the ci suite's sparse items
meeting every sparse condition, which they stop meeting without the
sparse-decisions family."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from harness.cases.sparse_decisions import FAMILY
from harness.cases.suites import load_suite
from harness.model.sparse import MASKED_MHA_THRESHOLDS, SEQ_LEN_EDGES, SPARSE_BACKENDS, threshold_says_yes
from harness.protocol.port import Port
from harness.search.decisions_dense import DENSE_DECISIONS
from harness.search.decisions_sparse import SPARSE_DECISIONS
from harness.search.mcdc import Condition, Decision, Observation, judge_decision
from harness.search.mcdc_measure import measure_mcdc, observe_suite

AND = Decision(
    "t.and",
    "sparse",
    "a and b",
    "-",
    (Condition("a", "a"), Condition("b", "b", edge=1)),
    lambda v: v["a"] and v["b"],
)


def _obs(item: str, a: bool | None, b: bool | None, outcome: bool, distance: int | None = 0) -> Observation:
    return Observation(item, {"a": a, "b": b}, outcome, {"b": distance})


def _status(result: Any) -> dict[str, str]:
    return {c.condition.name: c.status for c in result.conditions}


def test_unique_cause_pairs_and_a_short_circuited_operand() -> None:
    # b is not evaluated where a is False (None): it matches either value of b.
    result = judge_decision(AND, [_obs("tt", True, True, True), _obs("fn", False, None, False)])
    assert _status(result) == {"a": "unique-cause", "b": "unmet"}
    assert result.conditions[0].pair is not None and result.conditions[0].pair.items == ("tt", "fn")


def test_an_edge_condition_needs_its_pair_on_the_edge() -> None:
    far = [_obs("tt", True, True, True, distance=0), _obs("tf", True, False, False, distance=5)]
    assert _status(judge_decision(AND, far))["b"] == "unmet"
    near = [_obs("tt", True, True, True, distance=0), _obs("tf", True, False, False, distance=1)]
    assert _status(judge_decision(AND, near))["b"] == "unique-cause"


def test_masking_pairs_where_the_other_condition_changes_too() -> None:
    either = Decision(
        "t.or-and",
        "dense",
        "(a or c) and b",
        "-",
        (Condition("a", "a"), Condition("b", "b"), Condition("c", "c")),
        lambda v: (v["a"] or v["c"]) and v["b"],
    )
    # a differs, and so does c; a is determinant in both (c False in one, and
    # in the other flipping a to False with c True keeps... not determinant).
    observations = [
        Observation("x", {"a": True, "b": True, "c": False}, True),
        Observation("y", {"a": False, "b": True, "c": True}, True),
        Observation("z", {"a": False, "b": True, "c": False}, False),
    ]
    status = _status(judge_decision(either, observations))
    assert status["a"] == "unique-cause"  # x / z
    assert status["c"] == "unique-cause"  # y / z
    masked = [
        Observation("x", {"a": True, "b": True, "c": False}, True),
        Observation("w", {"a": False, "b": False, "c": True}, False),
    ]
    # a differs, b and c differ too; in w flipping a alone keeps it False (b False): no pair.
    assert _status(judge_decision(either, masked))["a"] == "unmet"


def test_a_disagreement_with_the_oracle_fails_the_decision() -> None:
    result = judge_decision(AND, [_obs("tt", True, True, False), _obs("ff", False, None, False)])
    assert not result.met and "tt: the table says True, the oracle False" in result.disagreements[0]


def test_infeasible_conditions_carry_their_reason() -> None:
    for decision in (*SPARSE_DECISIONS, *DENSE_DECISIONS):
        names = {c.name for c in decision.conditions}
        assert set(decision.infeasible) <= names, decision.id
        assert all(reason.strip() for reason in decision.infeasible.values()), decision.id


@pytest.fixture(scope="module")
def mla(oracle: Port) -> Any:
    return oracle._sparse().mla  # type: ignore[attr-defined]


def test_the_declared_threshold_table_is_upstreams(mla: Any) -> None:
    minimums = {m for row in MASKED_MHA_THRESHOLDS.values() for m in row if m is not None}
    seqs = sorted({e + d for e in SEQ_LEN_EDGES for d in (-1, 0, 1)} | {1, 1 << 20})
    queries = sorted({m + d for m in minimums for d in (-1, 0, 1)} | {1, 1 << 20})
    for backend, tp, seq, query in itertools.product(SPARSE_BACKENDS, (1, 2, 3, 4, 8, 16), seqs, queries):
        row = MASKED_MHA_THRESHOLDS.get((backend, tp))
        ours = row is not None and threshold_says_yes(row, seq, query)
        theirs = bool(mla._use_masked_mha(backend_name=backend, tensor_parallel_size=tp, query_len=query, seq_len=seq))
        assert ours is theirs, (backend, tp, seq, query)


def test_ci_meets_every_sparse_condition_and_not_without_the_aimed_family(cached_oracle: Port) -> None:
    ci = load_suite("ci")
    assert ci.mcdc
    sparse_only = replace(ci, cases=(), workspace_configs=(), merge_cases=(), mask_cases=())
    observed = observe_suite(sparse_only, cached_oracle)
    met = [judge_decision(d, observed.get(d.id, [])) for d in SPARSE_DECISIONS]
    assert all(d.met for d in met), [(c.decision, c.condition.name) for d in met for c in d.conditions if not c.met]
    # The same observations less the family's items (their ids start with its name).
    without = [
        judge_decision(d, [o for o in observed.get(d.id, []) if not o.item.startswith(FAMILY)])
        for d in SPARSE_DECISIONS
    ]
    unmet = {(c.decision, c.condition.name) for d in without for c in d.conditions if not c.met}
    # The random families leave table entries and mask positions without a pair.
    assert ("sparse.overflow", "inner_chunk") in unmet
    assert ("sparse.threshold[FLASHMLA_SPARSE/tp4]", "query>=8192@3") in unmet


def test_smoke_layouts_meet_every_dense_condition(oracle: Port) -> None:
    smoke = load_suite("smoke")
    report = measure_mcdc(replace(smoke, sparse_cases=(), sparse_workspace_configs=()), oracle, DENSE_DECISIONS)
    assert report.met, [(c.decision, c.condition.name) for c in report.unmet]
