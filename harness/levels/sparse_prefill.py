"""The sparse-prefill level (SPEC 1d): both sides' masked prefill of a sparse
batch on identical materialised tensors and top-k indices, output and LSE
bit for bit. A batch the oracle routes to sparse MQA is compared at
sparse-layout only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from harness.levels.shown import ShowContext, divergent_tensors
from harness.model.levels import Kind, KindSpec, Level, LevelSpec, register_level
from harness.model.sparse import SparseCase
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, NOT_RUN, CaseResult, device_kernels
from harness.sides.runner import ItemCall
from harness.sides.sparse_runner import compare_sparse_prefill

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.sparse_prefill import SparsePrefillInputs
    from harness.night.drift_items import ItemDrift


def _run(call: ItemCall) -> CaseResult:
    kernels = device_kernels(call.kernels, Kind.SPARSE_PREFILL)
    return compare_sparse_prefill(call.oracle, call.port, call.item, kernels, call.device, call.timeout_s)


def _show(item: SparseCase, result: CaseResult, context: ShowContext) -> str:
    from reports.diff_text import format_tensor_verdict
    from reports.sparse_text import sparse_batch_lines

    # The batch is printed with its routes when its sparse layout is compared too.
    lines = [] if Kind.SPARSE_LAYOUT in context.kinds else sparse_batch_lines(item, result)
    return "\n".join([*lines, format_tensor_verdict("L3 sparse-prefill", result)])


def _inputs(item: SparseCase, device: str) -> SparsePrefillInputs:
    from harness.kernels.sparse_prefill import materialise_sparse_prefill

    return materialise_sparse_prefill(item, device)


def _release_asked(release: SparsePrefiller, item: SparseCase, kernels: SharedKernels, device: str) -> object:
    from harness.kernels import with_keyless_rows

    assert item.numeric is not None
    return release.sparse_prefill(item, _inputs(item, device), with_keyless_rows(kernels, item.numeric.keyless_rows))


def _drift(drift: ItemDrift, result: CaseResult, pinned: Port, release: Port, item: SparseCase) -> None:
    """A batch the pinned oracle routes to sparse MQA is compared at
    sparse-layout only when the release routes it there too."""
    from harness.night.drift_items import layout_only

    if result.status == DIVERGENT:
        divergent_tensors(drift, result, pinned, release, item)
    elif result.status == NOT_RUN and "routes it mqa" in (result.error or ""):
        layout_only(drift, release, item)


class SparsePrefiller(Protocol):
    """A side at this level (a served release's, say)."""

    def sparse_prefill(
        self, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
    ) -> dict[str, torch.Tensor]: ...


def _serve(side: SparsePrefiller, request: dict[str, Any]) -> dict[str, Any]:
    from harness.cases.sparse_inputs import sparse_case_from_json
    from harness.kernels.sparse_prefill import SparsePrefillInputs
    from harness.protocol.served import prefill_inputs, request_kernels, request_tensors, write_outputs

    tensors = request_tensors(request)
    case = sparse_case_from_json(request["case"], "request")
    inputs = SparsePrefillInputs(prefill_inputs(request, tensors), tensors["topk"])
    return write_outputs(request, side.sparse_prefill(case, inputs, request_kernels(request)))


SPARSE_PREFILL = register_level(
    LevelSpec(
        name=Level.SPARSE_PREFILL,
        title="the masked prefill of a sparse batch on materialised tensors (output and LSE), bit for bit",
        kinds=(
            KindSpec(
                name=Kind.SPARSE_PREFILL,
                plan=lambda suite: [case for case in suite.sparse_cases if case.numeric is not None],
                run=_run,
                holds=lambda item: isinstance(item, SparseCase) and item.numeric is not None,
                cost_s=1.3,
                inputs=_inputs,
                release_asked=_release_asked,
                drift=_drift,
                show=_show,
                noun=lambda item: "a sparse batch",
                caused_by=Kind.SPARSE_LAYOUT,
                count_key="sparse_prefill_cases",
                plural="sparse L3 cases",
            ),
        ),
        port_methods=("sparse_prefill",),
        served={"oracle_sparse_prefill": _serve},
        host=False,
        floats=True,
        sparse=True,
        heading="sparse-prefill",
        compares=(
            "the port's whole sparse loop: its route, layout and selections, attention on the shared masked kernel, "
            "fold and merge"
        ),
        compares_over_protocol=(
            "the port's route, layout and selections and its fold only: each attention ran on the harness's "
            "shared masked kernel, on the port's plan (a cmd: port is sent the partials)"
        ),
        transcribed=True,
    )
)
