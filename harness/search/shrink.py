"""Shrinking a divergent case to a minimal one that still diverges the same way.

A greedy delta-debugging loop: drop runs of requests (halves first, then
smaller runs, then single requests), then shorten contexts (to 0, halves,
minus one alignment unit, minus one row), queries (toward 1) and the workspace
(halves and single alignment units, never below one unit), keeping any
candidate that is valid input and still diverges at the same level with the
same signature (layout field, tensor, or error type). It stops at a fixpoint,
when its evaluation budget is spent, or at its deadline (a time box: a port that
is slow or hangs on small cases must not hold a gate for hours); a shrink cut
short keeps the smallest case found so far and says why it stopped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from harness.cases.fields import CaseError
from harness.cases.files import case_from_json
from harness.model import Case
from harness.model.case_fields import Declared, FieldKind, declared_fields
from harness.model.levels import SHRINKING_LEVELS, shrinking_kind
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port
from harness.sides.items import PARITY, CaseResult
from harness.sides.runner import run_item


def signature(result: CaseResult) -> tuple[str, str]:
    """What "the same divergence" means: the status and where it shows."""
    if result.divergence is not None:
        return result.status, result.divergence.field
    if result.error:
        return result.status, result.error.split(":", 1)[0]
    bad = next((t.name for t in result.tensors if not t.exact), "")
    return result.status, bad


@dataclass
class ShrinkOutcome:
    """The smallest case found. ``cut_short`` says why shrinking stopped before
    a fixpoint (its time box or evaluation budget ran out); None when no
    candidate of ``case`` diverges the same way any more."""

    case: Case
    result: CaseResult
    evaluations: int
    steps: int
    cut_short: str | None = None


# Called after each evaluation with (evaluations so far, steps kept so far).
Progress = Callable[[int, int], None]


def _valid(case: Case) -> Case | None:
    try:
        return case_from_json(case.to_json(), case.name)
    except CaseError:
        return None


def _per_request(case: Case) -> list[str]:
    """The declared fields that hold a value per request (harness.model.case_fields)."""
    return [d.name for d in declared_fields(Case) if d.rule.kind is FieldKind.INTS and not d.extra]


def _without(case: Case, start: int, stop: int) -> Case:
    """``case`` without requests ``start:stop``: every per-request field cut alike."""
    cut: dict[str, Any] = {
        name: getattr(case, name)[:start] + getattr(case, name)[stop:] for name in _per_request(case)
    }
    return dataclasses.replace(case, **cut)


def _with(case: Case, field: str, index: int, value: int) -> Case:
    values = list(getattr(case, field))
    values[index] = value
    changed: dict[str, Any] = {field: tuple(values)}
    return dataclasses.replace(case, **changed)


def _set(case: Case, declared: Declared, value: Any) -> Case:
    if declared.extra:
        extras = dict(case.extras)
        extras[declared.name] = value
        return dataclasses.replace(case, extras=tuple(extras.items()))
    changed: dict[str, Any] = {declared.name: value}
    return dataclasses.replace(case, **changed)


def smaller_values(value: int, floor: int) -> list[int]:
    """``floor``, then ever smaller steps down from ``value``: value - d for d =
    half the gap, a quarter, ..., 1. Big reductions are tried first."""
    out, gap = [floor], value - floor
    step = gap // 2
    while step >= 1:
        out.append(value - step)
        step //= 2
    out.append(value - 1)
    return sorted({v for v in out if floor <= v < value}, key=lambda v: (v != floor, v))


def _floor(declared: Declared, case: Case) -> int:
    assert declared.rule.floor is not None
    return declared.rule.floor(case)


def candidates(case: Case) -> Iterator[Case]:
    """Smaller cases, in the order tried: whole runs of requests removed (halves
    first), then each declared field that shrinks (its rule's ``floor``)
    stepped down, single values before per-request ones, in declaration order."""
    n = case.num_requests
    size = n // 2
    while size >= 1:
        for start in range(0, n, size):
            if n - (min(n, start + size) - start) >= 1:
                yield _without(case, start, min(n, start + size))
        size //= 2
    shrinking = [d for d in declared_fields(Case) if d.rule.floor is not None]
    for d in shrinking:
        if d.rule.kind is FieldKind.INT:
            value = case.extra(d.name) if d.extra else getattr(case, d.name)
            for smaller in smaller_values(value, _floor(d, case)):
                yield _set(case, d, smaller)
    for d in shrinking:
        if d.rule.kind is FieldKind.INTS and not d.extra:
            for i, value in enumerate(getattr(case, d.name)):
                for smaller in smaller_values(value, _floor(d, case)):
                    yield _with(case, d.name, i, smaller)


def shrink(
    case: Case,
    check: Callable[[Case], CaseResult],
    budget: int = 2000,
    deadline: float | None = None,
    progress: Progress | None = None,
) -> ShrinkOutcome:
    """Shrink ``case`` while ``check`` keeps giving the original signature, for
    at most ``budget`` evaluations and until ``deadline`` (``time.monotonic()``)."""
    first = check(case)
    if first.status == PARITY:
        raise ValueError(f"{case.name} does not diverge: nothing to shrink")
    target = signature(first)
    current, result, evaluations, steps = case, first, 1, 0
    cut_short: str | None = None
    progress_made = True
    while progress_made and cut_short is None:
        progress_made = False
        for candidate in candidates(current):
            if evaluations >= budget:
                cut_short = f"its budget of {budget} evaluations ran out"
                break
            if deadline is not None and time.monotonic() >= deadline:
                cut_short = "its time box ran out"
                break
            valid = _valid(candidate)
            if valid is None:
                continue
            evaluations += 1
            outcome = check(valid)
            kept = outcome.status != PARITY and signature(outcome) == target
            if kept:
                current, result, steps, progress_made = valid, outcome, steps + 1, True
            if progress is not None:
                progress(evaluations, steps)
            if kept:
                break
    shrunk = dataclasses.replace(current, name=f"{case.name}-shrunk", family=case.family)
    return ShrinkOutcome(shrunk, result, evaluations, steps, cut_short)


def checker(
    oracle: Port,
    port: Port,
    level: str,
    kernels: Any = None,
    timeout_s: Callable[[], float] | float = DEFAULT_PORT_TIMEOUT_S,
) -> Callable[[Case], CaseResult]:
    """One evaluation: the candidate compared at ``level``, each port call limited
    to ``timeout_s`` seconds (a callable: asked afresh for each evaluation, so a
    time box can give a call no more than the time it has left)."""

    def limit() -> float:
        return timeout_s() if callable(timeout_s) else timeout_s

    kind = shrinking_kind(level)
    if kind is None:
        raise ValueError(f"level {level} has no items that shrink (levels that do: {', '.join(SHRINKING_LEVELS)})")
    return lambda c: run_item(oracle, port, kind, c, kernels, timeout_s=limit())


def describe_case(case: Case) -> str:
    return (
        f"context_lens={list(case.context_lens)} query_lens={list(case.query_lens)} "
        f"W={case.workspace_size} block={case.block_size}"
        + (f" dcp={case.dcp_world_size}x{case.cp_kv_cache_interleave_size}" if case.dcp_world_size > 1 else "")
        + ("" if case.align_to_block else " align=off")
    )
