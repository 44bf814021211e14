"""Runs the oracle and a port side by side on the sparse path's items.

The sparse counterpart of :func:`harness.sides.runner.compare_case` and friends, with
the same rules (:func:`harness.sides.items.both_sides`): the oracle's answer is
typed as strictly as the port's, a side that raises makes the item
``oracle-error`` or ``port-error``, and each side gets its own copy of
identical inputs (top-k indices are materialised once per side from the case).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.cases.sparse_inputs import materialise_topk
from harness.compare.sparse import (
    check_sparse_layout,
    first_mask_divergence,
    first_remap_divergence,
    first_sparse_divergence,
)
from harness.model.sparse import MaskForm, Route, SparseCase, TopkMaskCase
from harness.protocol.port import Port, PortValueError, check_tensor
from harness.sides.input_digests import other_inputs
from harness.sides.items import (
    DIVERGENT,
    NOT_RUN,
    ORACLE_ERROR,
    PARITY,
    PORT_ERROR,
    CaseResult,
    Kind,
    both_sides,
    harness_inputs,
    one_line,
    reraise_interrupt,
    tensor_verdict,
    token_inputs,
)

if TYPE_CHECKING:
    from harness.kernels import SharedKernels


def compare_sparse_layout(oracle: Port, port: Port, case: SparseCase, timeout_s: float) -> CaseResult:
    result = CaseResult(case.name, case.family, Kind.SPARSE_LAYOUT, PARITY)
    answers = both_sides(
        result,
        lambda: check_sparse_layout(oracle.plan_sparse(case), "the oracle's plan_sparse"),  # type: ignore[attr-defined]
        lambda: check_sparse_layout(port.plan_sparse(case)),  # type: ignore[attr-defined]
        port,
        timeout_s,
    )
    if answers is not None:
        result.oracle_sparse, result.port_sparse = answers
        result.divergence = first_sparse_divergence(result.oracle_sparse, result.port_sparse)
        if result.divergence is not None:
            result.status = DIVERGENT
    return result


def _mask_and_remap(side: Port, case: TopkMaskCase, who: str, topk: tuple[Any, Any]) -> tuple[Any, list[Any]]:
    """``side``'s mask and remap of ``case``, each on its own fresh indices (``topk``)."""
    mask = check_tensor(side.build_topk_mask(case, topk[0]), f"{who}build_topk_mask")  # type: ignore[attr-defined]
    remapped = side.remap_topk(case, topk[1])  # type: ignore[attr-defined]
    if type(remapped) is not list:
        raise PortValueError(f"{who}remap_topk returned {type(remapped).__name__}, not a list of tensors")
    for i, tensor in enumerate(remapped):
        check_tensor(tensor, f"{who}remap_topk[{i}]")
    return mask, remapped


def compare_sparse_mask(oracle: Port, port: Port, case: TopkMaskCase, timeout_s: float) -> CaseResult:
    result = CaseResult(case.name, case.family, Kind.SPARSE_MASK, PARITY)
    oracle_topk = harness_inputs(result, lambda: (materialise_topk(case), materialise_topk(case)))
    port_topk = harness_inputs(result, lambda: (materialise_topk(case), materialise_topk(case)))
    if oracle_topk is None or port_topk is None or other_inputs(result, case, oracle_topk[0]):
        return result
    answers = both_sides(
        result,
        lambda: _mask_and_remap(oracle, case, "the oracle's ", oracle_topk),
        lambda: _mask_and_remap(port, case, "", port_topk),
        port,
        timeout_s,
    )
    if answers is None:
        return result
    (oracle_mask, oracle_remap), (port_mask, port_remap) = answers
    topk = materialise_topk(case)
    try:
        result.divergence = first_mask_divergence(
            oracle_mask, port_mask, topk, case.form == MaskForm.GLOBAL
        ) or first_remap_divergence(oracle_remap, port_remap, topk, case.range_starts)
    except PortValueError as exc:  # the port's tensors have the wrong dtype
        result.status, result.error = PORT_ERROR, one_line(exc)
        return result
    if result.divergence is not None:
        result.status = DIVERGENT
    return result


def compare_sparse_prefill(
    oracle: Port, port: Port, case: SparseCase, kernels: SharedKernels, device: str, timeout_s: float
) -> CaseResult:
    """Sparse L3: both sides' prefill of ``case`` on identical, independently
    materialised tensors and top-k indices, under the case's keyless-row
    behaviour; judged as the dense L3 is. A batch the oracle routes to sparse
    MQA (decode-style) is not run, and the row says so: it is compared at
    sparse-layout only. One it routes to a masked run the release cannot make
    (``masked-mha-unavailable``, ``masked-mha-overflow``) is the oracle's
    refusal (``oracle-error``): a gate never passes it, a baseline of another
    release may count it."""
    from harness.kernels import with_keyless_rows
    from harness.kernels.sparse_prefill import L3_ROUTES, materialise_sparse_prefill

    assert case.numeric is not None
    result = CaseResult(case.name, case.family, Kind.SPARSE_PREFILL, PARITY)
    try:
        route = oracle.plan_sparse(case).route  # type: ignore[attr-defined]
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = ORACLE_ERROR, one_line(exc)
        return result
    if route == Route.MQA:
        result.status = NOT_RUN
        result.error = f"the oracle routes it mqa: compared at sparse-layout only (L3 covers {', '.join(L3_ROUTES)})"
        return result
    kernels = with_keyless_rows(kernels, case.numeric.keyless_rows)
    oracle_inputs = harness_inputs(result, lambda: materialise_sparse_prefill(case, device))
    port_inputs = harness_inputs(result, lambda: materialise_sparse_prefill(case, device))
    if oracle_inputs is None or port_inputs is None or other_inputs(result, case, oracle_inputs):
        return result

    def ask(side: Port, inputs: Any) -> Any:
        out = side.sparse_prefill(case, inputs, kernels)  # type: ignore[attr-defined]
        if not isinstance(out, dict):
            raise PortValueError(f"sparse_prefill returned {type(out).__name__}, not a dict of tensors")
        return out

    answers = both_sides(result, lambda: ask(oracle, oracle_inputs), lambda: ask(port, port_inputs), port, timeout_s)
    if answers is None:
        return result
    return tensor_verdict(result, *answers, token_inputs(case.context_lens, case.query_lens))
