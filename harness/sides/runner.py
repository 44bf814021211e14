"""Runs the oracle and a port side by side and collects comparison results.

The runner owns no policy about output: it yields :class:`CaseResult` objects
that the CLI, the gate and the reports consume. A side that raises on one case
marks that case ``oracle-error`` or ``port-error`` and the run goes on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.compare.dense import first_layout_divergence
from harness.model import Case, Layout, MergeCase, WorkspaceConfig
from harness.model.levels import kind_spec, registered_levels
from harness.protocol.port import (
    DEFAULT_PORT_TIMEOUT_S,
    Port,
    PortValueError,
    check_layout,
    port_levels,
)
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
    compare_sizes,
    computes_tensors,
    harness_inputs,
    item_id,
    level_of,
    one_line,
    printable,
    reraise_interrupt,
    tensor_verdict,
    token_inputs,
)

if TYPE_CHECKING:
    import torch

    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels
    from harness.sides.dcp_ranks import RealRanks


def compare_case(oracle: Port, port: Port, case: Case, timeout_s: float = DEFAULT_PORT_TIMEOUT_S) -> CaseResult:
    result = CaseResult(case.name, case.family, Kind.LAYOUT, PARITY, row_budget=case.row_budget)

    def oracle_layout() -> Layout:
        # The oracle's values are typed as strictly as the port's: an int where a
        # bool belongs would otherwise compare equal only after coercion.
        layout = oracle.plan_layout(case)
        checked = getattr(oracle, "returns_checked_layouts", False) is True  # the oracle cache's promise
        # Kept before the port is asked: a port-error row still shows the oracle's plan.
        result.oracle_layout = layout if checked else check_layout(layout)
        return result.oracle_layout

    answers = both_sides(result, oracle_layout, lambda: check_layout(port.plan_layout(case)), port, timeout_s)
    if answers is None:
        return result
    result.oracle_layout, result.port_layout = answers
    try:
        result.divergence = first_layout_divergence(result.oracle_layout, result.port_layout)
    except BaseException as exc:
        # Both layouts passed check_layout: a comparison that fails is the
        # harness's fault, never the port's, and the item was not compared.
        reraise_interrupt(exc)
        result.status, result.error = NOT_RUN, f"the harness could not compare the layouts: {one_line(exc)}"
        return result
    if result.divergence is not None:
        result.status = DIVERGENT
    return result


def compare_workspace(
    oracle: Port, port: Port, config: WorkspaceConfig, timeout_s: float = DEFAULT_PORT_TIMEOUT_S
) -> CaseResult:
    result = CaseResult(config.name, "workspace-size", Kind.WORKSPACE, PARITY)
    return compare_sizes(result, "workspace_size", config, oracle, port, timeout_s)


def compare_merge(
    oracle: Port, port: Port, case: MergeCase, device: str = "cpu", timeout_s: float = DEFAULT_PORT_TIMEOUT_S
) -> CaseResult:
    """L2: both merges on identical, independently materialised partials."""
    from harness.kernels.numeric import materialise_merge, merge_inputs_at

    result = CaseResult(case.name, case.family, Kind.MERGE, PARITY)
    oracle_inputs = harness_inputs(result, lambda: materialise_merge(case, device))
    port_inputs = harness_inputs(result, lambda: materialise_merge(case, device))
    if oracle_inputs is None or port_inputs is None or other_inputs(result, case, oracle_inputs):
        return result

    def port_merge() -> tuple[Any, Any]:
        returned = port.merge_states(port_inputs)  # type: ignore[attr-defined]
        if type(returned) is not tuple or len(returned) != 2:
            raise PortValueError(f"merge_states returned {type(returned).__name__}, not a tuple (output, lse)")
        return returned

    def oracle_merge() -> tuple[Any, Any]:
        out, lse = oracle.merge_states(oracle_inputs)  # type: ignore[attr-defined]
        return out, lse

    answers = both_sides(result, oracle_merge, port_merge, port, timeout_s)
    if answers is None:
        return result
    (out, lse), (port_out, port_lse) = answers
    # What the port was given, materialised afresh (for the first difference's or a NaN's
    # message): a port may have written into its inputs.
    return tensor_verdict(
        result,
        {"output": out, "lse": lse},
        {"output": port_out, "lse": port_lse},
        lambda token, head, dim: merge_inputs_at(materialise_merge(case, device), token, head, dim),
    )


def compare_prefill(
    oracle: Port,
    port: Port,
    case: Case,
    kernels: SharedKernels,
    device: str = "cpu",
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
    real_ranks: RealRanks | None = None,
) -> CaseResult:
    """L3: both context loops and final merges on identical materialised tensors.

    A DCP case with ``real_ranks`` runs on one process per rank
    (:mod:`harness.sides.dcp_ranks`: the pinned oracle and the port ``real_ranks``
    names, each rank on its own cache, the device's own shared kernels); its
    rank 0's tensors are judged here as one process's are."""
    from harness.kernels import kernels_for_case
    from harness.kernels.numeric import case_prefill_inputs

    assert case.numeric is not None
    # The case's keyless-row behaviour, one kernel object for both sides.
    kernels = kernels_for_case(kernels, case)
    result = CaseResult(case.name, case.family, Kind.PREFILL, PARITY, row_budget=case.row_budget)
    if real_ranks is not None and case.dcp_world_size > 1:
        from harness.sides.dcp_ranks import HARNESS_FAULT, prefill_on_ranks

        ranked = prefill_on_ranks(case, real_ranks, device, timeout_s)
        fault = next((e for e in (ranked.oracle_error, ranked.port_error) if e and e.startswith(HARNESS_FAULT)), None)
        if fault is not None:
            result.status, result.error = NOT_RUN, printable(fault)
            return result
        if ranked.oracle_error is not None or ranked.oracle is None:
            result.status, result.error = ORACLE_ERROR, printable(ranked.oracle_error or "no oracle tensors")
            return result
        if ranked.port_error is not None or ranked.port is None:
            result.status, result.error = PORT_ERROR, printable(ranked.port_error or "no port tensors")
            return result
        return tensor_verdict(result, ranked.oracle, ranked.port, token_inputs(case.context_lens, case.query_lens))

    oracle_inputs = harness_inputs(result, lambda: case_prefill_inputs(case, device))
    port_inputs = harness_inputs(result, lambda: case_prefill_inputs(case, device))
    if oracle_inputs is None or port_inputs is None or other_inputs(result, case, oracle_inputs):
        return result

    def port_prefill() -> dict[str, torch.Tensor]:
        out = port.prefill(case, port_inputs, kernels)  # type: ignore[attr-defined]
        if not isinstance(out, dict):
            raise TypeError(f"prefill returned {type(out).__name__}, not a dict of tensors")
        return out

    def oracle_prefill() -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = oracle.prefill(case, oracle_inputs, kernels)  # type: ignore[attr-defined]
        return out

    answers = both_sides(result, oracle_prefill, port_prefill, port, timeout_s)
    if answers is None:
        return result
    oracle_out, port_out = answers
    # An external port says which layout its prefill request ran on: the row records it,
    # and it must be the one the port returned at L1 (harness.verdicts.summary.check_prefill_layouts).
    used = getattr(port, "prefill_layout", None)
    if isinstance(used, Layout):
        result.port_layout = used
    return tensor_verdict(result, oracle_out, port_out, token_inputs(case.context_lens, case.query_lens))


@dataclass(frozen=True)
class Shard:
    """Shard ``number`` (1-based) of ``count``: items whose suite index ``i``
    has ``i % count == number - 1``. Deterministic, and interleaved so every
    shard gets a share of every level and family."""

    number: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            number, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise ValueError(f"shard {text!r} is not K/N") from None
        if not 1 <= number <= count:
            raise ValueError(f"shard {text!r}: K must be in 1..N")
        return cls(number, count)

    def owns(self, index: int) -> bool:
        return index % self.count == self.number - 1

    def __str__(self) -> str:
        return f"{self.number}/{self.count}"


def plan_items(suite: Suite, levels: Sequence[str]) -> list[tuple[str, Any]]:
    """The suite's items at ``levels`` in their fixed order: each registered
    level's kinds in registry order (harness.model.levels: layout cases,
    workspace configs, merge cases, prefill cases, then the sparse path's, so
    the dense items keep their indices; a plug-in level's last)."""
    return [
        (kind.name, item)
        for spec in registered_levels()
        if spec.name in levels
        for kind in spec.kinds
        for item in kind.plan(suite)
    ]


def not_run(port: Port, kind: str, item: Any) -> CaseResult:
    """The row of an item at a level ``port`` does not implement."""
    level = level_of(kind)
    family = getattr(item, "family", "workspace-size")
    error = f"port {port.name} does not implement level {level} (it implements {', '.join(port_levels(port))})"
    return CaseResult(item.name, family, kind, NOT_RUN, error=error)


def run_item(
    oracle: Port,
    port: Port,
    kind: str,
    item: Any,
    kernels: SharedKernels | None,
    device: str = "cpu",
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
    real_ranks: RealRanks | None = None,
) -> CaseResult:
    """One item; the numeric levels run on ``device`` (layouts are host work)
    with ``kernels``, or the device's own when None. An item at a level the port
    does not implement is ``not-run``. A DCP prefill item runs on real ranks when
    ``real_ranks`` says how (only those)."""
    spec, level = kind_spec(kind)  # an unknown kind is the harness's error, never another kind's comparison
    if level.name not in port_levels(port):
        return not_run(port, kind, item)
    result: CaseResult = spec.run(ItemCall(oracle, port, item, kernels, device, timeout_s, real_ranks))
    return result


@dataclass(frozen=True)
class ItemCall:
    """One item's call of its kind's runner: the sides, the item, and how to run it."""

    oracle: Port
    port: Port
    item: Any
    kernels: SharedKernels | None
    device: str
    timeout_s: float
    real_ranks: RealRanks | None


def run_items(
    oracle: Port,
    port: Port,
    suite: Suite,
    levels: Sequence[str],
    shard: Shard | None = None,
    kernels: SharedKernels | None = None,
    skip: frozenset[str] = frozenset(),
    device: str = "cpu",
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
    real_ranks: RealRanks | None = None,
) -> Iterator[CaseResult]:
    """Run the items of ``suite`` this shard owns, skipping the item ids in
    ``skip`` (those a resumed results file holds); the numeric levels on
    ``device`` with its shared kernels unless ``kernels``; each port call
    limited to ``timeout_s`` seconds; DCP prefill items on real ranks when
    ``real_ranks`` says how."""
    if kernels is None and computes_tensors(levels):
        from harness.kernels import kernels_for

        kernels = kernels_for(device)
    for index, (kind, item) in enumerate(plan_items(suite, levels)):
        if (shard is not None and not shard.owns(index)) or item_id(kind, item.name) in skip:
            continue
        result = run_item(oracle, port, kind, item, kernels, device, timeout_s, real_ranks)
        result.index = index
        yield result


# Why an item has a not-run row (unfinished_items): the run stopped early, or
# ended without ever yielding it.
INTERRUPTED_WHY = "the run was interrupted"
LOST_WHY = "the run ended without comparing it (a harness fault)"


def unfinished_items(
    suite: Suite,
    levels: Sequence[str],
    shard: Shard | None,
    finished: set[str] | frozenset[str],
    why: str = INTERRUPTED_WHY,
) -> list[CaseResult]:
    """A ``not-run`` row for every selected item whose id is not in ``finished``:
    what a run did not compare (it was interrupted, or a fault lost the item),
    so its table can never pass."""
    rows = []
    for index, (kind, item) in enumerate(plan_items(suite, levels)):
        if (shard is not None and not shard.owns(index)) or item_id(kind, item.name) in finished:
            continue
        family = getattr(item, "family", "workspace-size")
        row = CaseResult(item.name, family, kind, NOT_RUN, error=f"not compared: {why}")
        row.index = index
        rows.append(row)
    return rows


def selected_item_ids(suite: Suite, levels: Sequence[str], shard: Shard | None = None) -> list[str]:
    """The ids of the items a run of ``suite`` at ``levels`` on ``shard`` compares, in order."""
    return [
        item_id(kind, item.name)
        for index, (kind, item) in enumerate(plan_items(suite, levels))
        if shard is None or shard.owns(index)
    ]


def count_items(suite: Suite, levels: Sequence[str], shard: Shard | None = None) -> int:
    total = len(plan_items(suite, levels))
    return total if shard is None else sum(1 for i in range(total) if shard.owns(i))
