"""L2, the merge level (SPEC section 3): both sides' merge of two attention
states, on identical materialised partials, bit for bit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.levels.shown import ShowContext, divergent_tensors
from harness.model import MergeCase
from harness.model.levels import Kind, KindSpec, Level, LevelSpec, register_level
from harness.sides.items import CaseResult
from harness.sides.runner import compare_merge

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs


def _show(item: MergeCase, result: CaseResult, context: ShowContext) -> str:
    from reports.diff_text import format_tensor_verdict, merge_case_lines

    return "\n".join([*merge_case_lines(item), format_tensor_verdict("L2 merge", result)])


def _strategy() -> Any:
    from harness.search.explore_strategies import merge_cases

    return merge_cases()


def _inputs(item: MergeCase, device: str) -> MergeInputs:
    from harness.kernels.numeric import materialise_merge

    return materialise_merge(item, device)


def _release_asked(release: Any, item: MergeCase, kernels: SharedKernels, device: str) -> object:
    return release.merge_states(_inputs(item, device))


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
                strategy=_strategy,
                explore_share=2.0,
            ),
        ),
        port_methods=("merge_states",),
        host=False,
        floats=True,
        heading="L2 merge",
    )
)
