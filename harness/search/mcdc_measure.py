"""MC/DC of a suite: every declared decision, dense and sparse, observed on the
suite's items as the *oracle* decided them (:func:`measure_mcdc`).

- the dense planner's decisions (:mod:`harness.search.decisions_dense`) on every
  layout case, read from the oracle's chunks;
- the sparse path's (:mod:`harness.search.decisions_sparse`) on every sparse
  workspace configuration and every sparse batch, read from the oracle's
  sparse plan.

An item the oracle refuses is observed nowhere (coverage counts it as a
refusal). Pairs name items by their ids (``name[kind]``), which ``parity diff``
takes; a dense pair names the chunk and request too (``@chunk/request``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from harness.cases.suites import Suite
from harness.protocol.port import Port
from harness.search.coverage_measuring import oracle_chunks
from harness.search.decisions_dense import DENSE_DECISIONS, ChunkSpans, observe_layout
from harness.search.decisions_sparse import SPARSE_DECISIONS, observe_case, observe_workspace
from harness.search.mcdc import Decision, McdcReport, Observation, judge_decision
from harness.sides.items import item_id

DECISIONS: tuple[Decision, ...] = (*DENSE_DECISIONS, *SPARSE_DECISIONS)
DECISION_BY_ID = {d.id: d for d in DECISIONS}


def observe_suite(suite: Suite, oracle: Port) -> dict[str, list[Observation]]:
    """Every observation of every declared decision on ``suite``, by decision id."""
    observed: dict[str, list[Observation]] = defaultdict(list)

    def keep(pairs: Iterable[tuple[Decision, Observation]]) -> None:
        for decision, observation in pairs:
            observed[decision.id].append(observation)

    for case in suite.cases:
        try:
            chunks = oracle_chunks(oracle, case)
        except Exception:
            continue
        spans = [ChunkSpans(c.request_start, c.request_end, c.starts, c.seq_lens, c.full) for c in chunks]
        keep(observe_layout(item_id("layout", case.name), case, spans))
    for config in suite.sparse_workspace_configs:
        try:
            size = oracle.sparse_workspace_size(config)  # type: ignore[attr-defined]
        except Exception:
            continue
        keep(observe_workspace(item_id("sparse-workspace", config.name), config, int(size)))
    for sparse_case in suite.sparse_cases:
        try:
            plan = oracle.plan_sparse(sparse_case)  # type: ignore[attr-defined]
        except Exception:
            continue
        keep(observe_case(item_id("sparse-layout", sparse_case.name), sparse_case, plan))
    return observed


def measure_mcdc(suite: Suite, oracle: Port, decisions: Iterable[Decision] = DECISIONS) -> McdcReport:
    """MC/DC of ``decisions`` on ``suite`` (deterministic: the same suite and oracle give the same pairs)."""
    observed = observe_suite(suite, oracle)
    return McdcReport(suite.name, tuple(judge_decision(d, observed.get(d.id, [])) for d in decisions))
