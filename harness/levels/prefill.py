"""L3, the prefill level (SPEC section 3): both context loops and final
merges on identical materialised tensors, output and LSE bit for bit; a DCP
case on one process per rank where the run says how."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from harness.levels.shown import ShowContext, divergent_tensors
from harness.model import Case, Layout
from harness.model.levels import CoverageHook, Kind, KindSpec, Level, LevelSpec, register_level
from harness.protocol.port import Port
from harness.sides.items import CaseResult, device_kernels
from harness.sides.runner import ItemCall, compare_prefill

if TYPE_CHECKING:
    import torch

    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels
    from harness.kernels.numeric import DcpInputs, PrefillInputs
    from harness.search.coverage import Tally
    from harness.search.coverage_feature import Feature


def _run(call: ItemCall) -> CaseResult:
    kernels = device_kernels(call.kernels, Kind.PREFILL)
    return compare_prefill(call.oracle, call.port, call.item, kernels, call.device, call.timeout_s, call.real_ranks)


def _port_layout(port: Port, case: Case) -> Layout | None:
    """The port's layout of ``case``, or None where it cannot give one."""
    try:
        layout: Layout = port.plan_layout(case)
    except Exception:
        return None
    return layout


def _show(item: Case, result: CaseResult, context: ShowContext) -> str:
    from reports.diff_text import case_lines, format_rank_picture, format_tensor_verdict

    # The case is printed with its layout when that is compared too.
    lines = [] if Kind.LAYOUT in context.kinds else case_lines(item)
    lines.append(format_tensor_verdict("L3 prefill", result))
    if item.dcp_world_size > 1 and result.tensors:
        # The oracle's layout: the rows each rank should contribute; the port's beside it.
        expected = context.oracle.plan_layout(item)
        picture = format_rank_picture(item, expected, _port_layout(context.port, item), result)
        if picture:
            lines.append(picture)
    return "\n".join(lines)


def _strategy() -> Any:
    from harness.search.explore_strategies import prefill_cases

    return prefill_cases()


def _inputs(item: Case, device: str) -> PrefillInputs:
    from harness.kernels.numeric import case_prefill_inputs

    return case_prefill_inputs(item, device)


def _release_asked(release: Prefiller, item: Case, kernels: SharedKernels, device: str) -> object:
    from harness.kernels import kernels_for_case
    from harness.kernels.numeric import materialise_prefill

    assert item.numeric is not None
    inputs = materialise_prefill(item.context_lens, item.query_lens, item.block_size, item.numeric, device)
    return release.prefill(item, inputs, kernels_for_case(kernels, item))


def rank_caches(case: Case, inputs: PrefillInputs, rank: int) -> DcpInputs:
    """Every DCP rank's cache of ``case``, rebuilt by the harness's own
    deterministic code (:func:`harness.kernels.numeric.materialise_rank_caches`,
    the case's seed), with every rank held by this process: what a served
    oracle runs a DCP item on.

    Only rank ``rank``'s cache crosses the process boundary (as ``kv_cache``,
    ``block_table``, ``poison_block``); the rebuilt one must be the same bits,
    or the harness and the served process disagree on the inputs and the item
    fails (never as a refusal).
    """
    import torch

    from harness.compare.bits import identical_bits
    from harness.kernels.numeric import DcpInputs, materialise_rank_caches
    from harness.model.dcp import OneProcessRanks

    world, interleave = case.dcp_world_size, case.cp_kv_cache_interleave_size
    if not 0 <= rank < world:
        raise ValueError(f"DCP rank {rank} is outside the case's world of {world}")
    caches = materialise_rank_caches(case.context_lens, case.block_size, inputs.spec, world, interleave)
    own = caches[rank]
    sent = inputs.kv_cache.cpu(), inputs.block_table.cpu(), inputs.poison_block
    if not (
        identical_bits(own.kv_cache, sent[0]) and torch.equal(own.block_table, sent[1]) and own.poison_block == sent[2]
    ):
        raise ValueError(
            f"case {case.name}: DCP rank {rank}'s cache rebuilt here differs from the one the harness sent "
            "(kv_cache, block_table or poison_block)"
        )
    device = inputs.kv_cache.device
    held = tuple(replace(c, kv_cache=c.kv_cache.to(device), block_table=c.block_table.to(device)) for c in caches)
    return DcpInputs(world, interleave, rank, held, OneProcessRanks(world, rank))


class Prefiller(Protocol):
    """A side at this level (a served release's, say)."""

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]: ...


def _serve(side: Prefiller, request: dict[str, Any]) -> dict[str, Any]:
    from harness.cases.files import case_from_json
    from harness.protocol.served import prefill_inputs, request_kernels, request_tensors, write_outputs

    inputs = prefill_inputs(request, request_tensors(request))
    case = case_from_json(request["case"], "request")
    if case.dcp_world_size > 1:
        inputs = replace(inputs, dcp=rank_caches(case, inputs, int(request["scalars"].get("dcp_rank", 0))))
    return write_outputs(request, side.prefill(case, inputs, request_kernels(request)))


def _features() -> tuple[Feature, ...]:
    from harness.search.coverage import PREFILL_FEATURES

    return PREFILL_FEATURES


def _measure(tally: Tally, suite: Suite, oracle: Port) -> None:
    from harness.search.coverage_measuring import measure_prefills

    measure_prefills(tally, suite, oracle)


PREFILL = register_level(
    LevelSpec(
        name=Level.PREFILL,
        title="the context loop and final merge on materialised tensors (output and LSE), bit for bit",
        kinds=(
            KindSpec(
                name=Kind.PREFILL,
                plan=lambda suite: [case for case in suite.cases if case.numeric is not None],
                run=_run,
                holds=lambda item: isinstance(item, Case) and item.numeric is not None,
                cost_s=0.5,
                inputs=_inputs,
                release_asked=_release_asked,
                drift=divergent_tensors,
                show=_show,
                noun=lambda item: "a case with a numeric section",
                caused_by=Kind.LAYOUT,
                shrinks=True,
                shrink_budget=60,
                real_ranks=True,
                count_key="prefill_cases",
                plural="prefill cases",
                strategy=_strategy,
                explore_share=2.0,
            ),
        ),
        port_methods=("prefill",),
        served={"oracle_prefill": _serve},
        coverage=CoverageHook(_features, _measure),
        host=False,
        floats=True,
        heading="L3 prefill",
        compares=(
            "the port's whole context loop: its layout, gather and attention on the shared kernels, fold and merge"
        ),
        compares_over_protocol=(
            "the port's layout and its fold and merge only: each chunk's gather and attention were the harness's, "
            "on the port's layout (a cmd: port is sent the partials)"
        ),
    )
)
