"""L1: the ports against the pinned oracle, chunk field by chunk field."""

from __future__ import annotations

from collections import Counter

import pytest

from harness.cases.suites import load_suite
from harness.cases.sweep_families import WORST_CASE_CONTEXT, WORST_CASE_QUERY
from harness.compare.dense import first_layout_divergence
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, PARITY
from harness.sides.runner import compare_case
from tests.conftest import make_case


# On smoke, in this process; on ci, the README's gate (tests/test_readme_commands.py)
# holds per_request to parity at every level, layout included.
@pytest.mark.parametrize("suite", ["smoke"])
def test_per_request_exact_parity(cached_oracle: Port, per_request: Port, suite: str) -> None:
    cases = load_suite(suite).cases
    outcomes = [compare_case(cached_oracle, per_request, case) for case in cases]
    bad = [(r.name, r.status, r.divergence.message() if r.divergence else r.error) for r in outcomes if not r.ok]
    assert not bad, bad[:5]
    # The comparison saw real chunks, continuations and DCP fields, not empty layouts.
    chunks = [c for r in outcomes if r.oracle_layout for c in r.oracle_layout.chunks]
    assert sum(c.is_continuation for c in chunks) > 10
    assert sum(c.local_starts is not None for c in chunks) > 10


def test_upstream_worst_case_30_chunks_against_1(oracle: Port, equal_share: Port, per_request: Port) -> None:
    case = make_case(list(WORST_CASE_CONTEXT), list(WORST_CASE_QUERY), workspace_size=65536)
    result = compare_case(oracle, equal_share, case)
    assert result.status == DIVERGENT
    assert result.oracle_layout is not None and result.port_layout is not None
    assert result.oracle_layout.num_chunks == 1
    assert result.port_layout.num_chunks == 30
    assert compare_case(oracle, per_request, case).status == PARITY


def test_equal_share_diverges_on_skew_family(oracle: Port, equal_share: Port) -> None:
    skew = [c for c in load_suite("ci").cases if c.family == "skew"]
    statuses = Counter(compare_case(oracle, equal_share, case).status for case in skew)
    assert statuses[PARITY] == 0, statuses
    assert statuses[DIVERGENT] > len(skew) // 2


@pytest.mark.parametrize("context", [1, 15, 16, 17, 1000, 2048])
def test_equal_share_agrees_on_single_request_that_fits(oracle: Port, equal_share: Port, context: int) -> None:
    case = make_case([context], [9], workspace_size=2048)
    oracle_layout, port_layout = oracle.plan_layout(case), equal_share.plan_layout(case)
    assert oracle_layout.num_chunks == 1
    assert first_layout_divergence(oracle_layout, port_layout) is None


def test_no_context_batch_has_no_metadata(oracle: Port, per_request: Port) -> None:
    case = make_case([0, 0], [3, 4])
    assert oracle.plan_layout(case).chunks == ()
    assert oracle.plan_layout(case) == per_request.plan_layout(case)
