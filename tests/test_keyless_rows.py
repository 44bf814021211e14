"""Rows without keys (issue 11, hole 7) and stray gathers through unused slots (hole 8).

The shared kernels take a keyless-row behaviour per case (``numeric.keyless_rows``):
-inf (the ideal), +inf (FlashAttention) or a finite LSE with garbage output (the
backends seeds/003 neutralises against). The oracle and per_request never hand
the kernels such rows, so they are bit-exact under every behaviour; the legacy
equal_share loop does, and its neutralisation is what keeps it unaffected. The
``equal-share-no-neutralise`` mutant deletes that step and must be caught at L3
on a case where equal_share itself is bit-exact.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness.cases.fields import CaseError
from harness.cases.files import case_from_json, load_cases
from harness.cases.generate import generate
from harness.cases.prefill_generate import generate_prefill, legacy_grid_has_keyless_rows
from harness.cases.suites import load_suite
from harness.kernels import (
    KEYLESS_FINITE_LSE,
    KEYLESS_FINITE_OUTPUT,
    CpuKernels,
    KeylessRowsKernels,
    kernels_for_case,
    with_keyless_rows,
)
from harness.kernels.numeric import materialise_prefill
from harness.model import KEYLESS_ROWS, PRESETS, Case
from harness.protocol.port import Port
from harness.search.mutants import kill_matrix
from harness.sides.items import DIVERGENT, PARITY
from harness.sides.loading import load_port
from harness.sides.runner import compare_prefill, plan_items
from ports.equal_share import grid_layout
from ports.equal_share.prefill import prefill as legacy_prefill
from ports.mutants import MUTANTS
from tests.conftest import make_case

SMOKE = Path(__file__).resolve().parent.parent / "cases" / "smoke"
MUTANT = "equal-share-no-neutralise"


def smoke_case(name: str) -> Case:
    (case,) = load_cases([SMOKE / f"{name}.json"])
    return case


def under(case: Case, behaviour: str) -> Case:
    assert case.numeric is not None
    return replace(case, name=f"{case.name}-{behaviour}", numeric=replace(case.numeric, keyless_rows=behaviour))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


# -- the kernels -----------------------------------------------------------------------------------


def varlen() -> tuple[torch.Tensor, ...]:
    """Three sequences: 2 queries over 5 keys, 3 queries over none, 1 over 2."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn((6, 2, 8), generator=g).to(torch.bfloat16)
    k = torch.randn((7, 2, 8), generator=g).to(torch.bfloat16)
    v = torch.randn((7, 2, 4), generator=g).to(torch.bfloat16)
    return q, k, v, torch.tensor([0, 2, 5, 6], dtype=torch.int32), torch.tensor([0, 5, 5, 7], dtype=torch.int32)


@pytest.mark.parametrize("behaviour", KEYLESS_ROWS)
def test_cpu_kernels_report_each_behaviour_on_keyless_rows_only(behaviour: str) -> None:
    q, k, v, cu_q, cu_k = varlen()
    base_out, base_lse = CpuKernels().attention(q, k, v, cu_q, cu_k, False, 0.5)
    out, lse = CpuKernels(behaviour).attention(q, k, v, cu_q, cu_k, False, 0.5)
    keyless = torch.tensor([False, False, True, True, True, False])
    expected_out, expected_lse = {
        "neg-inf": (0.0, float("-inf")),
        "pos-inf": (0.0, float("inf")),
        "finite": (KEYLESS_FINITE_OUTPUT, KEYLESS_FINITE_LSE),
    }[behaviour]
    assert (out[keyless] == expected_out).all() and (lse[:, keyless] == expected_lse).all()
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    # Rows with keys: the same bits under every behaviour; the finite report is finite.
    assert torch.equal(bits(out[~keyless]), bits(base_out[~keyless]))
    assert torch.equal(bits(lse[:, ~keyless]), bits(base_lse[:, ~keyless]))
    assert not out.isnan().any()
    if behaviour == "finite":
        assert lse.isfinite().all() and (out[keyless] != 0).all()


def test_a_causal_query_that_sees_no_key_is_keyless_too() -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn((3, 1, 4), generator=g), torch.randn((1, 1, 4), generator=g), torch.randn((1, 1, 2))
    # Bottom-right aligned: of 3 queries over 1 key only the last sees it.
    out, lse = CpuKernels("pos-inf").attention(q, k, v, torch.tensor([0, 3]), torch.tensor([0, 1]), True, 0.5)
    assert lse[0, :2].tolist() == [float("inf")] * 2 and lse[0, 2].isfinite()
    assert (out[:2] == 0).all() and torch.equal(out[2, 0], v[0, 0])


def test_behaviour_selection_reaches_the_kernels() -> None:
    cpu = CpuKernels()
    assert with_keyless_rows(cpu, "neg-inf") is cpu
    finite = with_keyless_rows(cpu, "finite")
    assert isinstance(finite, CpuKernels) and finite.keyless_rows == "finite"
    case = make_case([0, 40], numeric=replace(PRESETS["tiny"], keyless_rows="pos-inf"))
    selected = kernels_for_case(cpu, case)
    assert isinstance(selected, CpuKernels) and selected.keyless_rows == "pos-inf"
    # The case decides, whatever the kernels were made with.
    selected = kernels_for_case(finite, make_case([0, 40], numeric=PRESETS["tiny"]))
    assert isinstance(selected, CpuKernels) and selected.keyless_rows == "neg-inf"
    with pytest.raises(ValueError, match="keyless-row behaviour 'nan'"):
        CpuKernels("nan")

    class Foreign(CpuKernels):
        """A kernel set of another kind, reporting (0, -inf) on keyless rows."""

        name = "foreign"

    wrapped = with_keyless_rows(Foreign(), "finite")
    assert isinstance(wrapped, KeylessRowsKernels)
    q, k, v, cu_q, cu_k = varlen()
    for a, b in zip(
        wrapped.attention(q, k, v, cu_q, cu_k, False, 0.5),
        finite.attention(q, k, v, cu_q, cu_k, False, 0.5),
        strict=True,
    ):
        assert torch.equal(bits(a), bits(b))


# -- the case format and the suites ----------------------------------------------------------------


def test_case_files_take_keyless_rows_and_refuse_unknown_behaviours() -> None:
    data = {"name": "k", "context_lens": [0, 40], "query_lens": [1, 2], "block_size": 16, "workspace_size": 16}
    case = case_from_json({**data, "numeric": {"preset": "tiny", "keyless_rows": "finite"}}, "f.json")
    assert case.numeric is not None and case.numeric.keyless_rows == "finite"
    assert case.to_json()["numeric"]["keyless_rows"] == "finite"
    assert case_from_json(case.to_json(), "again") == case
    default = case_from_json({**data, "numeric": {"preset": "tiny"}}, "f.json")
    assert default.numeric is not None and "keyless_rows" not in default.to_json()["numeric"]
    with pytest.raises(CaseError) as error:
        case_from_json({**data, "numeric": {"preset": "tiny", "keyless_rows": "nan"}}, "f.json")
    assert (
        str(error.value) == "f.json: field 'numeric.keyless_rows': must be one of neg-inf, pos-inf, finite, got \"nan\""
    )


def test_the_keyless_predicate_is_the_legacy_grid() -> None:
    cases = list(generate_prefill(20260825, 100)) + list(generate(5, 400))
    seen = 0
    for case in cases:
        try:
            layout = grid_layout(case)
        except ValueError:
            assert not legacy_grid_has_keyless_rows(case)
            continue
        has = any(rows == 0 for chunk in layout.chunks for rows in chunk.seq_lens)
        assert legacy_grid_has_keyless_rows(case) == has, case.name
        seen += has
    assert seen > 50


def test_ci_runs_keyless_rows_under_every_behaviour_and_keeps_its_cases() -> None:
    suite = load_suite("ci")
    prefill = [c for c in suite.cases if c.numeric is not None]
    base = list(generate_prefill(20260825, 100))
    generated = [c for c in prefill if c.name.startswith("numeric-")]
    assert generated[:100] == base  # names, order and specs as before
    keyless_families = {c.family for c in base if legacy_grid_has_keyless_rows(c)}
    assert len(keyless_families) >= 5
    for family in keyless_families:
        for behaviour in KEYLESS_ROWS:
            runs = [
                c
                for c in prefill
                if c.family == family
                and c.numeric is not None
                and c.numeric.keyless_rows == behaviour
                and legacy_grid_has_keyless_rows(c)
            ]
            assert runs, (family, behaviour)
    variants = [c for c in prefill if c.numeric is not None and c.numeric.keyless_rows != "neg-inf"]
    assert 10 <= len(variants) <= 60  # tens of cases: the interpreter is slow
    assert all(legacy_grid_has_keyless_rows(c) for c in variants)
    # Each variant is its base case under another behaviour, and nothing else.
    by_name = {c.name: c for c in prefill}
    for variant in (v for v in variants if v.name.startswith("numeric-")):
        original = by_name[variant.name.rsplit("-keyless-", 1)[0]]
        assert variant.numeric is not None and original.numeric is not None
        assert (
            replace(variant, name=original.name, numeric=replace(variant.numeric, keyless_rows="neg-inf")) == original
        )
    # The smoke files with keyless rows come first among the prefill items, in ci and smoke.
    first = [item.name for kind, item in plan_items(suite, ("prefill",))[:2]]
    assert first == ["smoke-keyless-finite", "smoke-keyless-pos-inf"]
    smoke_first = [item.name for kind, item in plan_items(load_suite("smoke"), ("prefill",))[:2]]
    assert smoke_first == first


def test_variant_json_round_trips_with_its_behaviour() -> None:
    case = smoke_case("keyless-pos-inf")
    text = json.dumps(case.to_json())
    assert '"keyless_rows": "pos-inf"' in text and case_from_json(json.loads(text), "x") == case


# -- the sides -------------------------------------------------------------------------------------


def test_neutralisation_is_what_keeps_equal_share_exact(oracle: Port, per_request: Port, equal_share: Port) -> None:
    mutant = load_port(f"mutant:{MUTANT}")
    kernels = CpuKernels()
    for name, caught_under in (("keyless-finite", {"finite"}), ("keyless-pos-inf", {"finite", "pos-inf"})):
        case = smoke_case(name)
        assert legacy_grid_has_keyless_rows(case)
        if name == "keyless-finite":
            # Keyless rows of a request with context: inside the legacy final merge's tokens.
            with_context = sum(1 for c in case.context_lens if c > 0)
            assert any(0 in chunk.seq_lens[:with_context] for chunk in grid_layout(case).chunks)
        outputs = []
        for behaviour in KEYLESS_ROWS:
            variant = under(case, behaviour)
            for port in (per_request, equal_share):
                result = compare_prefill(oracle, port, variant, kernels)
                assert result.status == PARITY, (name, behaviour, port.name, result.detail())
            result = compare_prefill(oracle, mutant, variant, kernels)
            expected = DIVERGENT if behaviour in caught_under else PARITY
            assert result.status == expected, (name, behaviour, result.detail())
            if expected == DIVERGENT:
                assert "context_lse" in {t.name for t in result.tensors if not t.exact}
            assert variant.numeric is not None
            inputs = materialise_prefill(case.context_lens, case.query_lens, case.block_size, variant.numeric)
            outputs.append(
                legacy_prefill(grid_layout(case), case.workspace_size, inputs, kernels_for_case(kernels, variant))
            )
        # equal_share's own tensors: the same bits under every behaviour.
        for other in outputs[1:]:
            assert other.keys() == outputs[0].keys()
            assert all(torch.equal(bits(other[key]), bits(outputs[0][key])) for key in other)


def test_the_mutant_is_killed_at_l3_where_equal_share_is_exact(oracle: Port, equal_share: Port) -> None:
    assert MUTANTS[MUTANT].source == "seeds/003"
    (row,) = kill_matrix(oracle, [MUTANTS[MUTANT]()], load_suite("smoke"), ("prefill",), CpuKernels())
    kill = row.kills["prefill"]
    assert kill is not None and kill.item == "smoke-keyless-finite[prefill]" and kill.items_tried == 1
    assert compare_prefill(oracle, equal_share, smoke_case("keyless-finite"), CpuKernels()).status == PARITY


# -- hole 8: unused block-table slots ---------------------------------------------------------------


def test_a_gather_through_an_unused_slot_reads_nan() -> None:
    # Seed 3 puts one of request 1's blocks at index 0, so before this fix (unused
    # slots held 0) a stray read through an unused slot got real numbers.
    contexts = (16, 64, 0)
    inputs = materialise_prefill(contexts, (1, 1, 1), 16, replace(PRESETS["tiny"], seed=3))
    table, cache = inputs.block_table, inputs.kv_cache
    assert 0 in table[1, :4].tolist() and not cache[0].isnan().any()
    used = {0: 1, 1: 4, 2: 0}
    for request, blocks in used.items():
        assert (table[request, blocks:] == inputs.poison_block).all()
    assert cache[inputs.poison_block].isnan().all()
    # Request 0 read on past its 16 rows, through slot 1 (unused), and request 2
    # (no context) read at all: every row NaN.
    dst = torch.zeros((24, cache.shape[-1]), dtype=cache.dtype)
    cu = torch.tensor([0, 16, 24], dtype=torch.int32)
    token_to_seq = torch.tensor([0] * 16 + [1] * 8, dtype=torch.int32)
    CpuKernels().gather(cache, dst, table[[0, 2]], cu, token_to_seq, torch.tensor([16, 0], dtype=torch.int32), 24)
    assert dst.isnan().all()
    # With the old table (unused slots 0) the same stray reads get block 0's real rows.
    old = table.clone()
    old[0, 1:], old[2, :] = 0, 0
    CpuKernels().gather(cache, dst, old[[0, 2]], cu, token_to_seq, torch.tensor([16, 0], dtype=torch.int32), 24)
    assert not dst.isnan().any()
