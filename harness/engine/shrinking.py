"""Shrinking a kill to its smallest case within a time box, written where the
outputs point; a failure there is reported, never raised over a verdict."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.model import Case
from harness.model.levels import kind_spec, shrinking_kind
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port
from harness.sides.items import reraise_interrupt

if TYPE_CHECKING:
    from harness.search.shrink import Progress


def guarded_shrink(
    oracle: Port,
    port: Port,
    case: Case,
    out: Path,
    level: str = "layout",
    kernels: Any = None,
    deadline: float | None = None,
    progress: Progress | None = None,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> str:
    """Shrinking for the gate and the kill matrix: a failure there is reported in
    the shrunk column, never raised, so the outputs and the exit code stand."""
    try:
        return shrink_to_file(oracle, port, case, level, kernels, out, deadline, progress, timeout_s)
    except BaseException as exc:
        reraise_interrupt(exc)
        return f"not shrunk ({type(exc).__name__}: {' '.join(str(exc).split())})"


def shrink_to_file(
    oracle: Port,
    port: Port,
    case: Case,
    level: str,
    kernels: Any,
    out: Path,
    deadline: float | None = None,
    progress: Progress | None = None,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> str:
    """Shrink a kill and write it; the kill matrix and gate summary show the result.
    Each port call is limited to ``timeout_s``, and before a ``deadline`` to no
    more than the time left (at least 1 s): an in-process port by the harness's
    own limit, a port that enforces its own timeout (an external process) by
    its per-request limit. One hanging call cannot outlast the time box."""
    from harness.cases.files import write_case_file
    from harness.search.shrink import checker, describe_case, shrink

    def limit() -> float:
        return timeout_s if deadline is None else max(1.0, min(timeout_s, deadline - time.monotonic()))

    budget = kind_spec(shrinking_kind(level) or level)[0].shrink_budget
    check = checker(oracle, port, level, kernels, limit)
    if deadline is not None and getattr(port, "enforces_timeout", False):
        check = _within(limit, port, check)
    outcome = shrink(case, check, budget=budget, deadline=deadline, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    note = f"; cut short: {outcome.cut_short}, the smallest found so far" if outcome.cut_short else ""
    write_case_file(outcome.case, out, f"shrunk from {case.name} for {port.name}: {outcome.result.detail()}{note}")
    cut = f" [cut short: {outcome.cut_short}; the smallest found so far]" if outcome.cut_short else ""
    return f"{describe_case(outcome.case)} ({out}){cut}"


def _within(limit: Callable[[], float], port: Any, check: Callable[[Case], Any]) -> Callable[[Case], Any]:
    """``check`` with an external port's own per-request timeout cut to ``limit()``."""

    def bounded(case: Case) -> Any:
        given = port.timeout_s
        port.timeout_s = min(given, limit())
        try:
            return check(case)
        finally:
            port.timeout_s = given

    return bounded
