"""The sparse-mask level (SPEC 1d): each top-k mask case's mask and remapped
indices, bit for bit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from harness.levels.shown import ShowContext
from harness.model.levels import Kind, KindSpec, Level, LevelSpec, register_level
from harness.model.sparse import TopkMaskCase
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, CaseResult
from harness.sides.sparse_runner import compare_sparse_mask

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels
    from harness.night.drift_items import ItemDrift


def _show(item: TopkMaskCase, result: CaseResult, context: ShowContext) -> str:
    from reports.sparse_text import format_mask_diff

    return format_mask_diff(item, result)


def _inputs(item: TopkMaskCase, device: str) -> list[torch.Tensor]:
    from harness.cases.sparse_inputs import materialise_topk

    return materialise_topk(item)


def _release_asked(release: MaskBuilder, item: TopkMaskCase, kernels: SharedKernels, device: str) -> object:
    return release.build_topk_mask(item, _inputs(item, device)), release.remap_topk(item, _inputs(item, device))


def _drift(drift: ItemDrift, result: CaseResult, pinned: Port, release: Port, item: TopkMaskCase) -> None:
    """Asked again, the mask split into the words that differ; a side failing
    now keeps the runner's verdict."""
    from harness.night.drift_items import mask_drift

    if result.status != DIVERGENT:
        return
    try:
        changed, detail = mask_drift(pinned, release, item)
    except Exception as exc:
        changed, detail = [], f"not split: {' '.join(f'{type(exc).__name__}: {exc}'.split())}"
    if changed:
        drift.changed, drift.detail = changed, detail
    else:
        drift.changed = ["mask"]
        drift.detail += f" ({detail or 'asked again, the two agree'})"


class MaskBuilder(Protocol):
    """A side at this level (a served release's, say)."""

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor: ...

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]: ...


def _served_topk(request: dict[str, Any]) -> tuple[TopkMaskCase, list[torch.Tensor]]:
    """A top-k op's case and indices (request ``r``'s as int32 ``topk.{r}``)."""
    from harness.cases.sparse_inputs import topk_mask_case_from_json
    from harness.protocol.served import request_tensors

    case = topk_mask_case_from_json(request["case"], "request")
    stored = request_tensors(request)
    return case, [stored[f"topk.{r}"].clone() for r in range(case.num_requests)]


def _serve_mask(side: MaskBuilder, request: dict[str, Any]) -> dict[str, Any]:
    from harness.protocol.served import write_outputs

    return write_outputs(request, {"mask": side.build_topk_mask(*_served_topk(request))})


def _serve_remap(side: MaskBuilder, request: dict[str, Any]) -> dict[str, Any]:
    from harness.protocol.served import write_outputs

    remapped = side.remap_topk(*_served_topk(request))
    return write_outputs(request, {f"remapped.{r}": t for r, t in enumerate(remapped)})


SPARSE_MASK = register_level(
    LevelSpec(
        name=Level.SPARSE_MASK,
        title="each top-k case's attention mask and remapped indices, bit for bit",
        kinds=(
            KindSpec(
                name=Kind.SPARSE_MASK,
                plan=lambda suite: suite.mask_cases,
                run=lambda call: compare_sparse_mask(call.oracle, call.port, call.item, call.timeout_s),
                holds=lambda item: isinstance(item, TopkMaskCase),
                # Measured: ci's 49 mask cases 9.5 s in one process (mean 0.19 s; both sides
                # build their masks in Triton's interpreter), 2 cores, 2026-12-05.
                cost_s=0.2,
                inputs=_inputs,
                release_asked=_release_asked,
                drift=_drift,
                show=_show,
                noun=lambda item: "a top-k mask case",
                count_key="mask_cases",
                plural="top-k mask cases",
            ),
        ),
        port_methods=("build_topk_mask", "remap_topk"),
        served={"topk_mask": _serve_mask, "topk_remap": _serve_remap},
        host=False,
        floats=False,
        sparse=True,
        heading="sparse-mask (top-k masks and remaps)",
    )
)
