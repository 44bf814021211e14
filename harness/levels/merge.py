"""L2, the merge level (SPEC section 3): both sides' merge of two attention
states, on identical materialised partials, bit for bit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from harness.levels.shown import ShowContext, divergent_tensors
from harness.model import MergeCase
from harness.model.levels import CoverageHook, Kind, KindSpec, Level, LevelSpec, register_level
from harness.sides.items import CaseResult
from harness.sides.runner import compare_merge

if TYPE_CHECKING:
    import torch

    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs
    from harness.protocol.port import Port
    from harness.search.coverage import Tally
    from harness.search.coverage_feature import Feature


def _show(item: MergeCase, result: CaseResult, context: ShowContext) -> str:
    from reports.diff_text import format_tensor_verdict, merge_case_lines

    return "\n".join([*merge_case_lines(item), format_tensor_verdict("L2 merge", result)])


def _strategy() -> Any:
    from harness.search.explore_strategies import merge_cases

    return merge_cases()


def _note() -> str | None:
    from harness.search.explore_strategies import merge_fields_at_default

    at_default = merge_fields_at_default()
    return f"merge fields left at their defaults (no strategy yet): {', '.join(at_default)}" if at_default else None


def _inputs(item: MergeCase, device: str) -> MergeInputs:
    from harness.kernels.numeric import materialise_merge

    return materialise_merge(item, device)


def _release_asked(release: Merger, item: MergeCase, kernels: SharedKernels, device: str) -> object:
    return release.merge_states(_inputs(item, device))


class Merger(Protocol):
    """A side at this level (a served release's, say)."""

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]: ...


def _serve_merge(side: Merger, request: dict[str, Any]) -> dict[str, Any]:
    from harness.kernels.numeric import MergeInputs
    from harness.protocol.served import request_tensors, write_outputs

    tensors = request_tensors(request)
    output, lse = side.merge_states(
        MergeInputs(
            tensors["prefix_output"],
            tensors["prefix_lse"],
            tensors["suffix_output"],
            tensors["suffix_lse"],
            request["prefill_tokens_with_context"],
        )
    )
    return write_outputs(request, {"output": output, "lse": lse})


def _features() -> tuple[Feature, ...]:
    from harness.search.coverage import MERGE_FEATURES

    return MERGE_FEATURES


def _measure(tally: Tally, suite: Suite, oracle: Port) -> None:
    from harness.search.coverage_measuring import measure_merges

    measure_merges(tally, suite, oracle)


MERGE = register_level(
    LevelSpec(
        name=Level.MERGE,
        title="the merge of two attention states (output and LSE), bit for bit",
        kinds=(
            KindSpec(
                name=Kind.MERGE,
                plan=lambda suite: suite.merge_cases,
                run=lambda call: compare_merge(call.oracle, call.port, call.item, call.device, call.timeout_s),
                holds=lambda item: isinstance(item, MergeCase),
                cost_s=0.07,
                inputs=_inputs,
                release_asked=_release_asked,
                drift=divergent_tensors,
                show=_show,
                noun=lambda item: "a merge case",
                count_key="merge_cases",
                plural="merge cases",
                strategy=_strategy,
                explore_share=2.0,
                explore_note=_note,
            ),
        ),
        port_methods=("merge_states",),
        served={"merge": _serve_merge},
        coverage=CoverageHook(_features, _measure, refusals=("merge.not_materialised",)),
        host=False,
        floats=True,
        heading="L2 merge",
    )
)
