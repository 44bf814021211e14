"""Runs the oracle and a port side by side and collects comparison results.

The runner owns no policy about output: it yields :class:`CaseResult` objects
that the CLI, the gate and the reports consume. A side that raises on one case
marks that case ``oracle-error`` or ``port-error`` and the run goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.compare import Divergence, first_layout_divergence
from harness.model import Case, Layout, MergeCase, WorkspaceConfig
from harness.port import Port

if TYPE_CHECKING:
    from harness.bits import TensorComparison
    from harness.kernels import SharedKernels
    from harness.suites import Suite

PARITY, DIVERGENT, ORACLE_ERROR, PORT_ERROR = "parity", "divergent", "oracle-error", "port-error"
# Parity levels (SPEC section 3); "workspace" items belong to the layout level.
LEVELS = ("layout", "merge", "prefill")


@dataclass
class CaseResult:
    """The outcome of one item: a case's layout, or a workspace configuration."""

    name: str
    family: str
    kind: str  # "layout", "workspace", "merge" or "prefill"
    status: str
    oracle_layout: Layout | None = None
    port_layout: Layout | None = None
    row_budget: int = 0
    divergence: Divergence | None = None
    error: str | None = None
    oracle_workspace: int | None = None
    port_workspace: int | None = None
    tensors: list[TensorComparison] = field(default_factory=list)

    @property
    def level(self) -> str:
        return "layout" if self.kind == "workspace" else self.kind

    @property
    def id(self) -> str:
        return f"{self.name}[{self.kind}]"

    def detail(self) -> str:
        """The one-line reason a failing item failed."""
        if self.error:
            return self.error
        if self.divergence:
            return self.divergence.message()
        bad = [t for t in self.tensors if not t.exact]
        return "; ".join(t.summary() for t in bad[:2]) if bad else ""

    @property
    def ok(self) -> bool:
        return self.status == PARITY

    def to_json(self, with_layouts: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "family": self.family, "kind": self.kind, "status": self.status}
        if self.tensors:
            out["tensors"] = [t.to_json() for t in self.tensors]
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
        elif self.kind == "workspace":
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
    levels: tuple[str, ...] = LEVELS
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.results)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)


def _tensor_verdict(result: CaseResult, oracle_out: dict[str, Any], port_out: dict[str, Any]) -> CaseResult:
    from harness.bits import compare_bits

    axes = {"output": ("token", "head", "dim"), "lse": ("token", "head")}
    for name in oracle_out:
        if name not in port_out:
            result.status, result.error = PORT_ERROR, f"port returned no {name!r}"
            return result
        kind = "lse" if name.endswith("lse") else "output"
        a, b = oracle_out[name], port_out[name]
        if kind == "lse":  # [heads, tokens] compared token-major, so rows are tokens
            a, b = a.transpose(0, 1), b.transpose(0, 1) if b.dim() == 2 else b
        result.tensors.append(compare_bits(name, a, b, axes[kind]))
    shape_errors = [t for t in result.tensors if t.error]
    if shape_errors:
        result.status, result.error = PORT_ERROR, shape_errors[0].summary()
    elif not all(t.exact for t in result.tensors):
        result.status = DIVERGENT
    return result


def compare_merge(oracle: Port, port: Port, case: MergeCase, device: str = "cpu") -> CaseResult:
    """L2: both merges on identical, independently materialised partials."""
    from harness.numeric import materialise_merge

    result = CaseResult(case.name, case.family, "merge", PARITY)
    try:
        out, lse = oracle.merge_states(materialise_merge(case, device))  # type: ignore[attr-defined]
    except Exception as exc:
        result.status, result.error = ORACLE_ERROR, _one_line(exc)
        return result
    try:
        port_out, port_lse = port.merge_states(materialise_merge(case, device))  # type: ignore[attr-defined]
    except Exception as exc:
        result.status, result.error = PORT_ERROR, _one_line(exc)
        return result
    return _tensor_verdict(result, {"output": out, "lse": lse}, {"output": port_out, "lse": port_lse})


def compare_prefill(oracle: Port, port: Port, case: Case, kernels: SharedKernels, device: str = "cpu") -> CaseResult:
    """L3: both context loops and final merges on identical materialised tensors."""
    from harness.numeric import materialise_prefill

    assert case.numeric is not None
    result = CaseResult(case.name, case.family, "prefill", PARITY, row_budget=case.row_budget)

    def inputs() -> Any:
        assert case.numeric is not None
        return materialise_prefill(case.context_lens, case.query_lens, case.block_size, case.numeric, device)

    try:
        oracle_out = oracle.prefill(case, inputs(), kernels)  # type: ignore[attr-defined]
    except Exception as exc:
        result.status, result.error = ORACLE_ERROR, _one_line(exc)
        return result
    try:
        port_out = port.prefill(case, inputs(), kernels)  # type: ignore[attr-defined]
        if not isinstance(port_out, dict):
            raise TypeError(f"prefill returned {type(port_out).__name__}, not a dict of tensors")
    except Exception as exc:
        result.status, result.error = PORT_ERROR, _one_line(exc)
        return result
    return _tensor_verdict(result, oracle_out, port_out)


def run_items(
    oracle: Port, port: Port, suite: Suite, levels: tuple[str, ...], kernels: SharedKernels | None = None
) -> Iterator[CaseResult]:
    """Every item of ``suite`` at ``levels``, in a fixed order: layout cases,
    workspace configs, merge cases, prefill cases."""
    if "layout" in levels:
        for case in suite.cases:
            yield compare_case(oracle, port, case)
        for config in suite.workspace_configs:
            yield compare_workspace(oracle, port, config)
    if "merge" in levels:
        for merge_case in suite.merge_cases:
            yield compare_merge(oracle, port, merge_case)
    if "prefill" in levels:
        if kernels is None:
            from harness.kernels import CpuKernels

            kernels = CpuKernels()
        for case in suite.cases:
            if case.numeric is not None:
                yield compare_prefill(oracle, port, case, kernels)


def count_items(suite: Suite, levels: tuple[str, ...]) -> int:
    total = 0
    if "layout" in levels:
        total += len(suite.cases) + len(suite.workspace_configs)
    if "merge" in levels:
        total += len(suite.merge_cases)
    if "prefill" in levels:
        total += sum(1 for c in suite.cases if c.numeric is not None)
    return total


def run(
    oracle: Port,
    port: Port,
    suite: Suite,
    levels: tuple[str, ...] = LEVELS,
    progress: Callable[[CaseResult], None] | None = None,
) -> RunResult:
    started = time.perf_counter()
    outcome = RunResult(suite=suite.name, port=port.name, levels=levels)
    for result in run_items(oracle, port, suite, levels):
        outcome.results.append(result)
        if progress is not None:
            progress(result)
    outcome.seconds = time.perf_counter() - started
    return outcome
