"""L1, the layout level (SPEC section 3): each case's chunk layout, and each
workspace configuration's size, field for field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.levels.shown import ShowContext
from harness.model import Case, WorkspaceConfig
from harness.model.levels import CoverageHook, Kind, KindSpec, Level, LevelSpec, register_level
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, PARITY, CaseResult
from harness.sides.runner import ItemCall, compare_case, compare_workspace

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.night.drift_items import ItemDrift
    from harness.search.coverage import Tally
    from harness.search.coverage_feature import Feature


def _strategies() -> Any:
    from harness.search import explore_strategies

    return explore_strategies


def _layout_row(result: CaseResult) -> dict[str, Any]:
    return {
        "oracle_chunks": result.oracle_layout.num_chunks if result.oracle_layout else None,
        "port_chunks": result.port_layout.num_chunks if result.port_layout else None,
        "oracle_layout": result.oracle_layout.to_json() if result.oracle_layout else None,
        # Identical at parity by definition; written once to keep reports small.
        "port_layout": "same-as-oracle"
        if result.status == PARITY
        else (result.port_layout.to_json() if result.port_layout else None),
    }


def workspace_row(result: CaseResult) -> dict[str, Any]:
    """A workspace-size row's columns (the sparse path's too)."""
    return {"oracle_workspace": result.oracle_workspace, "port_workspace": result.port_workspace}


def _show_layout(item: Case, result: CaseResult, context: ShowContext) -> str:
    from reports.diff_text import format_diff

    return format_diff(item, result)


def _show_workspace(item: WorkspaceConfig, result: CaseResult, context: ShowContext) -> str:
    from reports.diff_text import format_workspace_diff

    return format_workspace_diff(item, result)


def _layout_record(result: CaseResult) -> dict[str, Any]:
    from reports.diff_text import layout_record

    return layout_record(result)


def _without_chunks(result: CaseResult) -> CaseResult:
    """A parity row's layouts as the figures a row reads of them (no chunks to ship)."""
    from harness.sides.item_stream import without_chunks

    return without_chunks(result)


def _layout_drift(drift: ItemDrift, result: CaseResult, pinned: Port, release: Port, item: Case) -> None:
    from harness.night.drift_items import changed_layout_fields

    if result.status == DIVERGENT and result.oracle_layout is not None and result.port_layout is not None:
        drift.changed = changed_layout_fields(result.oracle_layout, result.port_layout)


def _workspace_drift(drift: ItemDrift, result: CaseResult, pinned: Port, release: Port, item: WorkspaceConfig) -> None:
    if result.status == DIVERGENT:
        drift.changed = ["workspace_size"]


def _run_layout(call: ItemCall) -> CaseResult:
    return compare_case(call.oracle, call.port, call.item, call.timeout_s)


def _run_workspace(call: ItemCall) -> CaseResult:
    return compare_workspace(call.oracle, call.port, call.item, call.timeout_s)


def _serve_layout(side: Port, request: dict[str, Any]) -> dict[str, Any]:
    from harness.cases.files import case_from_json

    return {"layout": side.plan_layout(case_from_json(request["case"], "request")).to_json()}


def _serve_workspace_size(side: Port, request: dict[str, Any]) -> dict[str, Any]:
    from harness.cases.files import workspace_config_from_json

    return {"workspace_size": int(side.workspace_size(workspace_config_from_json(request["config"], "request")))}


def _features() -> tuple[Feature, ...]:
    from harness.search.coverage import GRID_FEATURES, LAYOUT_FEATURES

    return (*LAYOUT_FEATURES, *GRID_FEATURES)


def _measure(tally: Tally, suite: Suite, oracle: Port) -> None:
    from harness.search.coverage_measuring import measure_layout

    measure_layout(tally, suite, oracle)


LAYOUT = register_level(
    LevelSpec(
        name=Level.LAYOUT,
        title="each case's chunk layout and each workspace configuration's size, field for field",
        kinds=(
            KindSpec(
                name=Kind.LAYOUT,
                plan=lambda suite: suite.cases,
                run=_run_layout,
                holds=lambda item: isinstance(item, Case),
                cost_s=0.003,
                row=_layout_row,
                release_asked=lambda release, item, kernels, device: release.plan_layout(item),
                drift=_layout_drift,
                show=_show_layout,
                record=_layout_record,
                shrinks=True,
                count_key="layout_cases",
                plural="layout cases",
                plan_figures=True,
                strategy=lambda: _strategies().layout_cases(),
                explore_share=3.0,
                slim=_without_chunks,
                noun=lambda item: "a case with a numeric section" if item.numeric is not None else "a layout-only case",
            ),
            KindSpec(
                name=Kind.WORKSPACE,
                plan=lambda suite: suite.workspace_configs,
                run=_run_workspace,
                holds=lambda item: isinstance(item, WorkspaceConfig),
                cost_s=0.0001,
                row=workspace_row,
                release_asked=lambda release, item, kernels, device: release.workspace_size(item),
                drift=_workspace_drift,
                show=_show_workspace,
                record=lambda result: {
                    "workspace_size": {"oracle": result.oracle_workspace, "port": result.port_workspace}
                },
                noun=lambda item: "a workspace configuration",
                count_key="workspace_configs",
                plural="workspace configs",
                strategy=lambda: _strategies().workspace_configs(),
            ),
        ),
        port_methods=("plan_layout", "workspace_size"),
        served={"layout": _serve_layout, "workspace_size": _serve_workspace_size},
        coverage=CoverageHook(
            _features,
            _measure,
            refusals=("layout.oracle_refused", "grid.oracle_refused"),
        ),
        host=True,
        floats=False,
        heading="L1 layout (+ workspace size)",
    )
)
