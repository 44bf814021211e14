"""The sparse-layout level (SPEC 1d): each sparse batch's route and layout,
and each sparse workspace configuration's size, field for field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from harness.levels.layout import workspace_row
from harness.levels.shown import ShowContext
from harness.model.levels import CoverageHook, Kind, KindSpec, Level, LevelSpec, register_level
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, PARITY, CaseResult, compare_sizes
from harness.sides.runner import ItemCall
from harness.sides.sparse_runner import compare_sparse_layout

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.night.drift_items import ItemDrift
    from harness.search.coverage import Tally
    from harness.search.coverage_feature import Feature


def _layout_row(result: CaseResult) -> dict[str, Any]:
    oracle, port = result.oracle_sparse, result.port_sparse
    return {
        "oracle_sparse": oracle.to_json() if oracle else None,
        "port_sparse": "same-as-oracle" if result.status == PARITY else (port.to_json() if port else None),
    }


def _run_workspace(call: ItemCall) -> CaseResult:
    result = CaseResult(call.item.name, call.item.family, Kind.SPARSE_WORKSPACE, PARITY)
    return compare_sizes(result, "sparse_workspace_size", call.item, call.oracle, call.port, call.timeout_s)


def _show(item: SparseCase, result: CaseResult, context: ShowContext) -> str:
    from reports.sparse_text import format_sparse_diff

    return format_sparse_diff(item, result)


def _show_workspace(item: SparseWorkspaceConfig, result: CaseResult, context: ShowContext) -> str:
    from reports.sparse_text import format_sparse_workspace_diff

    return format_sparse_workspace_diff(item, result)


def _layout_drift(drift: ItemDrift, result: CaseResult, pinned: Port, release: Port, item: SparseCase) -> None:
    from harness.night.drift_items import changed_sparse_fields, sparse_detail

    if result.status == DIVERGENT and result.oracle_sparse is not None and result.port_sparse is not None:
        drift.changed = changed_sparse_fields(result.oracle_sparse, result.port_sparse)
        drift.detail = sparse_detail(result.oracle_sparse, result.port_sparse, drift.changed)


def _workspace_drift(
    drift: ItemDrift, result: CaseResult, pinned: Port, release: Port, item: SparseWorkspaceConfig
) -> None:
    if result.status == DIVERGENT:
        drift.changed = ["sparse_workspace_size"]


class SparsePlanner(Protocol):
    """A side at this level (a served release's, say)."""

    def plan_sparse(self, case: SparseCase) -> SparseLayout: ...

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int: ...


def _serve_sparse_layout(side: SparsePlanner, request: dict[str, Any]) -> dict[str, Any]:
    from harness.cases.sparse_inputs import sparse_case_from_json

    return {"sparse_layout": side.plan_sparse(sparse_case_from_json(request["case"], "request")).to_json()}


def _serve_sparse_workspace_size(side: SparsePlanner, request: dict[str, Any]) -> dict[str, Any]:
    from harness.cases.sparse_inputs import sparse_workspace_config_from_json

    config = sparse_workspace_config_from_json(request["config"], "request")
    return {"workspace_size": int(side.sparse_workspace_size(config))}


def _features() -> tuple[Feature, ...]:
    from harness.search.coverage import SPARSE_FEATURES

    return SPARSE_FEATURES


def _measure(tally: Tally, suite: Suite, oracle: Port) -> None:
    # The sparse path is measured as one: its features cross its three levels
    # (a route, its mask and its L3 tensors come from one batch).
    from harness.search.sparse_coverage import measure_sparse

    measure_sparse(tally, suite, oracle)


SPARSE_LAYOUT = register_level(
    LevelSpec(
        name=Level.SPARSE_LAYOUT,
        title="each sparse batch's route and layout and each sparse workspace's size, field for field",
        kinds=(
            KindSpec(
                name=Kind.SPARSE_LAYOUT,
                plan=lambda suite: suite.sparse_cases,
                run=lambda call: compare_sparse_layout(call.oracle, call.port, call.item, call.timeout_s),
                holds=lambda item: isinstance(item, SparseCase),
                cost_s=0.003,
                row=_layout_row,
                release_asked=lambda release, item, kernels, device: release.plan_sparse(item),
                drift=_layout_drift,
                show=_show,
                record=lambda result: {},
                noun=lambda item: "a sparse batch",
                count_key="sparse_cases",
                plural="sparse batches",
            ),
            KindSpec(
                name=Kind.SPARSE_WORKSPACE,
                plan=lambda suite: suite.sparse_workspace_configs,
                run=_run_workspace,
                holds=lambda item: isinstance(item, SparseWorkspaceConfig),
                cost_s=0.003,
                row=workspace_row,
                release_asked=lambda release, item, kernels, device: release.sparse_workspace_size(item),
                drift=_workspace_drift,
                show=_show_workspace,
                record=lambda result: {},
                noun=lambda item: "a sparse workspace configuration",
                count_key="sparse_workspace_configs",
                plural="sparse workspace configs",
            ),
        ),
        port_methods=("plan_sparse", "sparse_workspace_size"),
        served={"sparse_layout": _serve_sparse_layout, "sparse_workspace_size": _serve_sparse_workspace_size},
        coverage=CoverageHook(_features, _measure, refusals=("sparse.oracle_refused", "sparse_grid.oracle_refused")),
        host=True,
        floats=False,
        sparse=True,
        heading="sparse-layout (+ sparse workspace size)",
        transcribed=True,
    )
)
