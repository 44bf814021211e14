"""The aimed row families: ci's top-k rows that are full, single, empty and
duplicated at sparse-mask (topk-mask-rows) and sparse-prefill (sparse-l3-rows),
the latter with masked MHA reached by the threshold, not by forcing."""

from __future__ import annotations

import pytest
import torch

from harness.cases.sparse_generate import MASK_ROWS_FAMILY, generate_mask_cases
from harness.cases.sparse_inputs import materialise_topk
from harness.cases.sparse_prefill_generate import ROWS_FAMILY, generate_sparse_prefill
from harness.cases.suites import load_suite
from harness.kernels.sparse_prefill import case_topk
from harness.model.sparse import MASK_FORMS, ROW_PATTERNS, ROW_SELECTIONS
from harness.protocol.port import Port


def _fills(topk: torch.Tensor, index_topk: int) -> set[str]:
    valid = (topk >= 0).sum(dim=-1)
    labels = {"full": index_topk, "single": 1, "empty": 0}
    return {label for label, count in labels.items() if bool((valid == count).any())}


def test_mask_rows_cover_every_pattern_in_every_form() -> None:
    cases = generate_mask_cases(20260825, 100, [MASK_ROWS_FAMILY])
    assert {(c.pattern, c.form) for c in cases} == {(p, f) for p in (*ROW_PATTERNS, "duplicates") for f in MASK_FORMS}
    for case in cases:
        rows = materialise_topk(case)
        fills = set().union(*(_fills(r, case.index_topk) for r in rows))
        if case.pattern in ROW_PATTERNS:
            assert case.pattern in fills, case.name
        for request, row in enumerate(rows):
            assert int(row.max()) < case.seq_lens[request]
            if case.pattern == "full":
                # Distinct indices, every slot filled.
                assert all(len(set(r.tolist())) == case.index_topk for r in row)


def test_l3_rows_are_full_single_empty_and_duplicated() -> None:
    cases = generate_sparse_prefill(20260825, 100, [ROWS_FAMILY])
    assert {c.selection for c in cases} == set(ROW_SELECTIONS)
    fills = {label for c in cases for label in _fills(case_topk(c), c.index_topk)}
    assert fills == {"full", "single", "empty"}


def test_ci_holds_every_row_kind_and_the_threshold_route() -> None:
    ci = load_suite("ci")
    masks = [c for c in ci.mask_cases if c.family == MASK_ROWS_FAMILY]
    assert {c.pattern for c in masks} == {*ROW_PATTERNS, "duplicates"} and {c.form for c in masks} == set(MASK_FORMS)
    rows = [c for c in ci.sparse_cases if c.family == ROWS_FAMILY]
    assert {c.selection for c in rows} == set(ROW_SELECTIONS)
    assert any(not c.force_masked_mha for c in rows)


@pytest.mark.parametrize("index", [0, 4])
def test_full_rows_take_masked_mha_by_the_threshold(oracle: Port, index: int) -> None:
    case = generate_sparse_prefill(20260825, 100, [ROWS_FAMILY])[index]
    assert not (case.force_dense_mha or case.force_masked_mha or case.force_mqa)
    plan = oracle.plan_sparse(case)  # type: ignore[attr-defined]
    assert plan.masked_threshold and not plan.use_dense_mha and plan.route == "masked-mha"
    # One per range, one with the global mask; both in several chunks.
    assert plan.global_mask_fits is (index == 4) and len(plan.layout.chunks) >= 2
