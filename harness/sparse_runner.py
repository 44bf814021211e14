"""Runs the oracle and a port side by side on the sparse path's items.

The sparse counterpart of :func:`harness.runner.compare_case` and friends, with
the same rules: the oracle's answer is typed as strictly as the port's, a side
that raises makes the item ``oracle-error`` or ``port-error``, and each side
gets its own copy of identical inputs (top-k indices are materialised once per
side from the case's seed).
"""

from __future__ import annotations

from typing import Any

from harness.compare import Divergence
from harness.port import Port, PortValueError, check_int, check_tensor
from harness.runner import (
    DIVERGENT,
    ORACLE_ERROR,
    PARITY,
    PORT_ERROR,
    CaseResult,
    _one_line,
    limit_for,
    reraise_interrupt,
    time_limit,
)
from harness.sparse_compare import (
    check_sparse_layout,
    first_mask_divergence,
    first_remap_divergence,
    first_sparse_divergence,
)
from harness.sparse_inputs import materialise_topk
from harness.sparse_model import SparseCase, SparseWorkspaceConfig, TopkMaskCase


def compare_sparse_layout(oracle: Port, port: Port, case: SparseCase, timeout_s: float) -> CaseResult:
    result = CaseResult(case.name, case.family, "sparse-layout", PARITY)
    try:
        result.oracle_sparse = check_sparse_layout(oracle.plan_sparse(case), "the oracle's plan_sparse")  # type: ignore[attr-defined]
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = ORACLE_ERROR, _one_line(exc)
        return result
    try:
        with time_limit(limit_for(port, timeout_s)):
            planned = port.plan_sparse(case)  # type: ignore[attr-defined]
        result.port_sparse = check_sparse_layout(planned)
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = PORT_ERROR, _one_line(exc)
        return result
    result.divergence = first_sparse_divergence(result.oracle_sparse, result.port_sparse)
    if result.divergence is not None:
        result.status = DIVERGENT
    return result


def compare_sparse_workspace(oracle: Port, port: Port, config: SparseWorkspaceConfig, timeout_s: float) -> CaseResult:
    result = CaseResult(config.name, config.family, "sparse-workspace", PARITY)
    try:
        value = oracle.sparse_workspace_size(config)  # type: ignore[attr-defined]
        result.oracle_workspace = check_int(value, "the oracle's sparse_workspace_size returned")
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = ORACLE_ERROR, _one_line(exc)
        return result
    try:
        with time_limit(limit_for(port, timeout_s)):
            value = port.sparse_workspace_size(config)  # type: ignore[attr-defined]
        result.port_workspace = check_int(value, "sparse_workspace_size returned")
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = PORT_ERROR, _one_line(exc)
        return result
    if result.oracle_workspace != result.port_workspace:
        result.status = DIVERGENT
        result.divergence = Divergence("sparse_workspace_size", result.oracle_workspace, result.port_workspace)
    return result


def _mask_and_remap(side: Port, case: TopkMaskCase, who: str) -> tuple[Any, list[Any]]:
    """``side``'s mask and remap of ``case``, each on its own fresh indices."""
    mask = check_tensor(side.build_topk_mask(case, materialise_topk(case)), f"{who}build_topk_mask")  # type: ignore[attr-defined]
    remapped = side.remap_topk(case, materialise_topk(case))  # type: ignore[attr-defined]
    if type(remapped) is not list:
        raise PortValueError(f"{who}remap_topk returned {type(remapped).__name__}, not a list of tensors")
    for i, tensor in enumerate(remapped):
        check_tensor(tensor, f"{who}remap_topk[{i}]")
    return mask, remapped


def compare_sparse_mask(oracle: Port, port: Port, case: TopkMaskCase, timeout_s: float) -> CaseResult:
    result = CaseResult(case.name, case.family, "sparse-mask", PARITY)
    try:
        oracle_mask, oracle_remap = _mask_and_remap(oracle, case, "the oracle's ")
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = ORACLE_ERROR, _one_line(exc)
        return result
    try:
        with time_limit(limit_for(port, timeout_s)):
            port_mask, port_remap = _mask_and_remap(port, case, "")
        topk = materialise_topk(case)
        result.divergence = first_mask_divergence(
            oracle_mask, port_mask, topk, case.form == "global"
        ) or first_remap_divergence(oracle_remap, port_remap, topk, case.range_starts)
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = PORT_ERROR, _one_line(exc)
        return result
    if result.divergence is not None:
        result.status = DIVERGENT
    return result


def run_sparse_item(oracle: Port, port: Port, kind: str, item: Any, timeout_s: float) -> CaseResult:
    if kind == "sparse-layout":
        return compare_sparse_layout(oracle, port, item, timeout_s)
    if kind == "sparse-workspace":
        return compare_sparse_workspace(oracle, port, item, timeout_s)
    return compare_sparse_mask(oracle, port, item, timeout_s)
