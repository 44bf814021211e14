"""The fingerprint set is what the oracle executes: an oracle run traced at every
level, the sparse path's included, enters no vLLM function the pin lacks, and
the pin holds nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.model.sparse import MASK_FORMS, ROUTES
from harness.protocol.port import Port
from oracle.environment import import_vllm_module
from oracle.pin import ALSO_PINNED, MLA, SPARSE, TRANSCRIBED, load_pin
from oracle.trace import (
    LEVELS,
    layout_cases,
    mask_cases,
    prefill_cases,
    sparse_layout_cases,
    sparse_prefill_cases,
    sparse_workspace_configs,
    traced_symbols,
    tracing,
    unpinned,
)

# SPEC section 2's oracle symbols: the contract names them, so the pin must too.
CONTRACT_SYMBOLS = (
    f"{MLA}:plan_mla_context_chunks",
    f"{MLA}:build_mla_chunked_context_metadata",
    f"{MLA}:init_mla_context_partial",
    f"{MLA}:accumulate_mla_context_chunk",
    f"{MLA}:MLACommonBaseImpl._compute_prefill_context",
    f"{MLA}:MLACommonBaseImpl._context_parallel_compute_prefill_context",
    f"{MLA}:align_mla_chunked_context_workspace_size",
    f"{MLA}:MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size",
    "vllm.v1.attention.ops.merge_attn_states:merge_attn_states",
    "vllm.v1.attention.ops.triton_merge_attn_states:merge_attn_states",
    "vllm.v1.attention.ops.triton_merge_attn_states:merge_attn_states_kernel",
    # SPEC section 1d's, the sparse path.
    f"{SPARSE}:SparseMLACommonMetadataBuilder.determine_chunked_prefill_workspace_size",
    f"{MLA}:_use_masked_mha",
    f"{SPARSE}:SparseMLACommonImpl.masked_mha_workspace_fits",
    f"{SPARSE}:SparseMLACommonImpl.forward_mha",
    f"{MLA}:MLAAttention.forward_impl",
    f"{SPARSE}:_topk_mask_shape",
    f"{SPARSE}:_build_topk_mask",
    f"{SPARSE}:SparseMLACommonImpl._remap_topk_to_ranges",
    f"{SPARSE}:SparseMLACommonImpl._compute_context_mha",
)


@pytest.fixture(scope="module")
def traced() -> dict[str, list[str]]:
    """One traced oracle run at every level, in a fresh interpreter."""
    return traced_symbols()


def pinned() -> set[str]:
    return set(load_pin()["fingerprints"])


def test_every_vllm_function_the_oracle_enters_is_fingerprinted(traced: dict[str, list[str]]) -> None:
    missing = unpinned(traced, pinned())
    assert not missing, "entered by the oracle but not fingerprinted: " + "; ".join(missing)


def test_every_level_is_traced_and_reaches_upstreams_own_steps(traced: dict[str, list[str]]) -> None:
    assert {level for levels in traced.values() for level in levels} == set(LEVELS)
    for symbol, level in (
        (f"{MLA}:build_mla_chunked_context_metadata", "layout"),
        ("vllm.v1.attention.backends.utils:get_dcp_local_seq_lens", "layout"),
        (f"{MLA}:MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size", "workspace"),
        ("vllm.v1.attention.ops.triton_merge_attn_states:merge_attn_states_kernel", "merge"),
        # forward_mha itself, and what the old re-implementation of its tail skipped.
        (f"{MLA}:MLACommonBaseImpl.forward_mha", "prefill"),
        (f"{MLA}:MLACommonBaseImpl._concat_k_nope_k_pe", "prefill"),
        (f"{MLA}:_get_kv_b_proj_input_dtype", "prefill"),
        (f"{MLA}:MLACommonPrefillMetadata.ContextChunk", "prefill"),
        (f"{MLA}:accumulate_mla_context_chunk", "prefill"),
        ("vllm.v1.attention.ops.triton_merge_attn_states:merge_attn_states_kernel", "prefill"),
        # The sparse path: its workspace (DCP alignment too), route and fit check,
        (f"{SPARSE}:SparseMLACommonMetadataBuilder.determine_chunked_prefill_workspace_size", "sparse-layout"),
        (f"{MLA}:align_mla_chunked_context_workspace_size", "sparse-layout"),
        (f"{MLA}:_use_masked_mha", "sparse-layout"),
        (f"{SPARSE}:_masked_mha_workspace_fits", "sparse-layout"),
        # the mask builder in every form, its kernels and the remap,
        (f"{SPARSE}:_scatter_topk_single_req_kernel", "sparse-mask"),
        (f"{SPARSE}:_scatter_topk_kernel", "sparse-mask"),
        (f"{SPARSE}:SparseMLACommonImpl._try_build_global_mask", "sparse-mask"),
        (f"{SPARSE}:SparseMLACommonImpl._remap_topk_to_ranges", "sparse-mask"),
        # and the masked prefill: per-range masks in the loop, the fold, the merge.
        (f"{SPARSE}:SparseMLACommonImpl.forward_mha", "sparse-prefill"),
        (f"{SPARSE}:SparseMLACommonImpl._compute_context_mha", "sparse-prefill"),
        (f"{SPARSE}:SparseMLACommonImpl._remap_topk_to_ranges", "sparse-prefill"),
        (f"{SPARSE}:SparseMLACommonImpl._project_kv", "sparse-prefill"),
        (f"{SPARSE}:_build_topk_mask", "sparse-prefill"),
        (f"{MLA}:accumulate_mla_context_chunk", "sparse-prefill"),
        ("vllm.v1.attention.ops.triton_merge_attn_states:merge_attn_states_kernel", "sparse-prefill"),
    ):
        assert level in traced.get(symbol, []), f"{symbol} not entered at {level}"


def test_the_pin_holds_the_traced_set_and_the_listed_extras_only(traced: dict[str, list[str]]) -> None:
    stale = pinned() - set(traced) - set(ALSO_PINNED)
    assert not stale, f"pinned but never entered (nor listed in ALSO_PINNED): {sorted(stale)}"
    assert not set(ALSO_PINNED) & set(traced), "an ALSO_PINNED symbol is traced: drop it from the list"


def test_contract_symbols_are_pinned() -> None:
    assert set(CONTRACT_SYMBOLS) <= pinned()


def test_what_the_sparse_oracle_transcribes_is_pinned_and_never_entered(traced: dict[str, list[str]]) -> None:
    """The route's conditions are upstream's text, transcribed in oracle/sparse.py:
    pinned although no level calls them (a change is drift all the same)."""
    assert set(TRANSCRIBED) <= set(ALSO_PINNED)
    assert not set(TRANSCRIBED) & set(traced)
    transcription = (Path(__file__).resolve().parent.parent / "oracle" / "sparse.py").read_text(encoding="utf-8")
    for symbol in TRANSCRIBED:
        assert symbol.partition(":")[2] in transcription, f"oracle/sparse.py no longer names {symbol}"


def test_a_pin_short_of_what_runs_is_named() -> None:
    # The fingerprint set before the set was derived: what the check now names.
    entered = {
        f"{MLA}:plan_mla_context_chunks": ["layout"],
        f"{MLA}:MLACommonBaseImpl._concat_k_nope_k_pe": ["prefill"],
        f"{MLA}:MLACommonPrefillMetadata.ContextChunk": ["layout", "prefill"],
    }
    assert unpinned(entered, {f"{MLA}:plan_mla_context_chunks"}) == [
        f"{MLA}:MLACommonBaseImpl._concat_k_nope_k_pe (prefill)",
        f"{MLA}:MLACommonPrefillMetadata.ContextChunk (layout, prefill)",
    ]


def test_nested_and_generated_code_stand_for_their_owner() -> None:
    mla = import_vllm_module(MLA)
    with tracing() as trace:
        # A dataclass-generated __init__, a nested function (aligned_split_len)
        # and a helper of another module; the lambda is not vLLM's.
        plans = mla.plan_mla_context_chunks([40, 7], 32, 32, 16, lambda rows: rows)
    assert len(plans) == 2 and plans[1].is_continuation
    assert set(trace.entered) == {
        f"{MLA}:plan_mla_context_chunks",
        f"{MLA}:_ContextChunkPlan",
        "vllm.utils.math_utils:round_down",
    }


def test_the_traced_cases_reach_every_path(oracle: Port) -> None:
    layouts = [oracle.plan_layout(case) for case in layout_cases()]
    assert any(chunk.is_continuation for layout in layouts for chunk in layout.chunks)
    assert any(not layout.chunks for layout in layouts)
    assert any(case.dcp_world_size > 1 for case in layout_cases())
    assert any(not case.align_to_block for case in layout_cases())
    shapes = []
    for case in prefill_cases():
        layout = oracle.plan_layout(case)
        continued = any(chunk.is_continuation for chunk in layout.chunks)
        shapes.append((len(layout.chunks), bool(layout.empty_token_slices), continued))
    # No context; one chunk alone (the early return); one chunk and an empty
    # slice; several chunks with a continuation.
    assert shapes == [(0, False, False), (1, False, False), (1, True, False), (2, True, True)]


def test_the_traced_sparse_cases_reach_every_path(oracle: Port) -> None:
    plans = [oracle.plan_sparse(case) for case in sparse_layout_cases()]  # type: ignore[attr-defined]
    assert {plan.route for plan in plans} == set(ROUTES)
    # The global mask fits, and it does not (per-range masks); a batch without context has none.
    assert {plan.global_mask_fits for plan in plans} == {True, False, None}
    assert {config.dcp_world_size > 1 for config in sparse_workspace_configs()} == {False, True}
    assert [case.form for case in mask_cases()] == list(MASK_FORMS)
    shapes = []
    for case in sparse_prefill_cases():
        plan = oracle.plan_sparse(case)  # type: ignore[attr-defined]
        continued = any(chunk.is_continuation for chunk in plan.layout.chunks)
        shapes.append((plan.route, plan.global_mask_fits, continued))
    # The masked loop with a continuation on the global mask and on per-range
    # masks; the masked suffix alone; the dense route.
    assert shapes == [
        ("masked-mha", True, True),
        ("masked-mha", False, True),
        ("masked-mha", None, False),
        ("dense-mha", True, True),
    ]
