"""Runs the oracle and a port side by side and collects comparison results.

The runner owns no policy about output: it yields :class:`CaseResult` objects
that the CLI, the gate and the reports consume. A side that raises on one case
marks that case ``oracle-error`` or ``port-error`` and the run goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.compare import Divergence, first_layout_divergence
from harness.model import Case, Layout, WorkspaceConfig
from harness.port import Port

PARITY, DIVERGENT, ORACLE_ERROR, PORT_ERROR = "parity", "divergent", "oracle-error", "port-error"


@dataclass
class CaseResult:
    """The outcome of one item: a case's layout, or a workspace configuration."""

    name: str
    family: str
    kind: str  # "layout" or "workspace"
    status: str
    oracle_layout: Layout | None = None
    port_layout: Layout | None = None
    row_budget: int = 0
    divergence: Divergence | None = None
    error: str | None = None
    oracle_workspace: int | None = None
    port_workspace: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == PARITY

    def to_json(self, with_layouts: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "family": self.family, "kind": self.kind, "status": self.status}
        if self.kind == "layout":
            out["oracle_chunks"] = self.oracle_layout.num_chunks if self.oracle_layout else None
            out["port_chunks"] = self.port_layout.num_chunks if self.port_layout else None
            if with_layouts:
                out["oracle_layout"] = self.oracle_layout.to_json() if self.oracle_layout else None
                if self.status == PARITY:
                    # Identical by definition; written once to keep reports small.
                    out["port_layout"] = "same-as-oracle"
                else:
                    out["port_layout"] = self.port_layout.to_json() if self.port_layout else None
        else:
            out["oracle_workspace"] = self.oracle_workspace
            out["port_workspace"] = self.port_workspace
        out["divergence"] = self.divergence.to_json() if self.divergence else None
        out["error"] = self.error
        return out


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def compare_case(oracle: Port, port: Port, case: Case) -> CaseResult:
    result = CaseResult(case.name, case.family, "layout", PARITY, row_budget=case.row_budget)
    try:
        result.oracle_layout = oracle.plan_layout(case)
    except Exception as exc:
        result.status, result.error = ORACLE_ERROR, _one_line(exc)
        return result
    try:
        layout = port.plan_layout(case)
        if not isinstance(layout, Layout):
            raise TypeError(f"plan_layout returned {type(layout).__name__}, not a Layout")
        result.port_layout = layout
    except Exception as exc:
        result.status, result.error = PORT_ERROR, _one_line(exc)
        return result
    result.divergence = first_layout_divergence(result.oracle_layout, result.port_layout)
    if result.divergence is not None:
        result.status = DIVERGENT
    return result


def compare_workspace(oracle: Port, port: Port, config: WorkspaceConfig) -> CaseResult:
    result = CaseResult(config.name, "workspace-size", "workspace", PARITY)
    try:
        result.oracle_workspace = oracle.workspace_size(config)
    except Exception as exc:
        result.status, result.error = ORACLE_ERROR, _one_line(exc)
        return result
    try:
        result.port_workspace = int(port.workspace_size(config))
    except Exception as exc:
        result.status, result.error = PORT_ERROR, _one_line(exc)
        return result
    if result.oracle_workspace != result.port_workspace:
        result.status = DIVERGENT
        result.divergence = Divergence("workspace_size", result.oracle_workspace, result.port_workspace)
    return result


@dataclass
class RunResult:
    """Everything one run produced, in item order."""

    suite: str
    port: str
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.results)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)


def run_items(
    oracle: Port,
    port: Port,
    cases: Iterable[Case],
    configs: Iterable[WorkspaceConfig],
) -> Iterator[CaseResult]:
    for case in cases:
        yield compare_case(oracle, port, case)
    for config in configs:
        yield compare_workspace(oracle, port, config)


def run(
    oracle: Port,
    port: Port,
    suite: str,
    cases: list[Case],
    configs: list[WorkspaceConfig],
    progress: Callable[[CaseResult], None] | None = None,
) -> RunResult:
    started = time.perf_counter()
    outcome = RunResult(suite=suite, port=port.name)
    for result in run_items(oracle, port, cases, configs):
        outcome.results.append(result)
        if progress is not None:
            progress(result)
    outcome.seconds = time.perf_counter() - started
    return outcome
