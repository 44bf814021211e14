"""What the legacy oracle (vllm==0.27.1, :mod:`oracle.legacy`) executes of
0.27.1: every symbol its side enters at every level, the sparse ones included,
traced on the trace cases of :mod:`oracle.trace` plus one case per refusal
(:func:`refusal_cases`), and the pin of that set and of the upstream code the
sparse oracle transcribes (``oracle/pins/vllm-0.27.1.json``, written by
``python -m oracle.release_pin --write-pin`` inside the 0.27.1 environment).

The sparse levels run :func:`oracle.trace.run_sparse_levels` on 0.27.1's side,
the same cases; 0.27.1 plans every one, and refuses one at L3: the per-range
batch, whose global mask 0.27.1 checks against a fixed 64 MiB and then views in
the batch's smaller mask workspace unchecked (``masked-mha-overflow``,
:class:`~oracle.sparse_prefill.RouteNotCompared`), is traced up to that refusal,
so 0.27.1's per-range masked loop is not (it is unreachable at CPU scale,
docs/sparse.md).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from harness.model import Case
from oracle.legacy import LegacyOracleSide, LegacyRefusal


def refusal_cases() -> tuple[Case, ...]:
    """Cases that reach each of 0.27.1's refusals: a share below one block, a
    DCP share not a multiple of the world, a DCP plan whose local windows
    overflow the all-gather slot, and a DCP workspace not a multiple of the world."""

    def case(context: tuple[int, ...], **fields: Any) -> Case:
        values: dict[str, Any] = {"name": "legacy-refusal", "block_size": 16, "workspace_size": 64, **fields}
        return Case(context_lens=context, query_lens=tuple(1 for _ in context), **values)

    return (
        case((100, 37, 5, 9, 11)),
        case((100, 37), dcp_world_size=4, align_to_block=False, workspace_size=68),
        case((100, 37), dcp_world_size=2, cp_kv_cache_interleave_size=64, workspace_size=64),
        case((100, 37), dcp_world_size=3),
    )


def trace_legacy() -> dict[str, list[str]]:
    """Every 0.27.1 symbol this side enters at every level (the trace cases of
    :mod:`oracle.trace` plus :func:`refusal_cases`), with the levels that enter it."""
    from harness.kernels import CpuKernels
    from harness.kernels.numeric import case_prefill_inputs, materialise_merge, materialise_prefill
    from oracle.sparse_prefill import RouteNotCompared
    from oracle.trace import (
        import_sparse_backend,
        layout_cases,
        merge_case,
        prefill_cases,
        run_sparse_levels,
        tracing,
        workspace_configs,
    )

    side = LegacyOracleSide()
    import_sparse_backend()
    with tracing() as trace:
        trace.level = "layout"
        for case in (*layout_cases(), *refusal_cases()):
            with contextlib.suppress(LegacyRefusal):
                side.plan_layout(case)
        trace.level = "workspace"
        for config in workspace_configs():
            side.workspace_size(config)
        trace.level = "merge"
        side.merge_states(materialise_merge(merge_case()))
        trace.level = "prefill"
        kernels = CpuKernels()
        for case in prefill_cases():
            assert case.numeric is not None
            inputs = materialise_prefill(case.context_lens, case.query_lens, case.block_size, case.numeric)
            side.prefill(case, inputs, kernels)
        # Its DCP loop on every rank's cache: two chunks over two ranks.
        dcp = replace(prefill_cases()[-1], context_lens=(40, 23, 0), workspace_size=64, dcp_world_size=2)
        side.prefill(dcp, case_prefill_inputs(dcp), kernels)
        run_sparse_levels(side, trace, refusals=(RouteNotCompared,))
    return {symbol: sorted(levels) for symbol, levels in sorted(trace.entered.items())}


def legacy_pin() -> dict[str, Any]:
    """The pin of 0.27.1 (schema of ``oracle/pin.json``): its version and commit
    id, and a fingerprint of every symbol :func:`trace_legacy` enters and of the
    upstream code its sparse oracle transcribes (:data:`oracle.pin.TRANSCRIBED`),
    and of the upstream values its answers are read from (:data:`oracle.pin.READ_VALUES`)."""
    from oracle.pin import READ_VALUES, TRANSCRIBED, release_pin_document

    return release_pin_document([*trace_legacy(), *TRANSCRIBED, *READ_VALUES])
