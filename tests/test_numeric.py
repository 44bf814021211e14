"""L2 and L3: inputs, shared kernels, bitwise comparison, and the ports' verdicts."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
import torch

from harness.cases.suites import load_suite
from harness.compare.bits import compare_bits, ordered
from harness.kernels import CpuKernels, SharedKernels
from harness.kernels.numeric import PrefillInputs, materialise_merge, materialise_prefill, new_token_partial
from harness.model import MERGE_LSE_VIEWS, MERGE_VALUE_VIEWS, PRESETS, Case, MergeCase
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, PARITY
from harness.sides.runner import compare_merge, compare_prefill
from ports.per_request import PerRequestPort
from ports.per_request.metadata import build_layout
from ports.per_request.prefill import context_partial, final_merge
from tests.conftest import make_case

KERNELS = CpuKernels()


def numeric_case(contexts: list[int], queries: list[int], **kwargs: Any) -> Case:
    spec = kwargs.pop("numeric", PRESETS["tiny"])
    return make_case(contexts, queries, numeric=spec, **kwargs)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return compare_bits("t", a, b, tuple(f"d{i}" for i in range(a.dim()))).mismatches == 0


# -- inputs --------------------------------------------------------------------------------------


def test_same_case_same_bits_and_seed_matters() -> None:
    spec = PRESETS["tiny"]
    a = materialise_prefill((40, 0, 70), (2, 3, 1), 16, spec)
    b = materialise_prefill((40, 0, 70), (2, 3, 1), 16, spec)
    for name in ("kv_cache", "q", "new_kv_c", "new_k_pe", "kv_b_weight"):
        assert torch.equal(getattr(a, name).view(torch.int16), getattr(b, name).view(torch.int16)), name
    assert torch.equal(a.block_table, b.block_table)
    c = materialise_prefill((40, 0, 70), (2, 3, 1), 16, PRESETS["tiny"].__class__(**{**spec.to_json(), "seed": 1}))
    assert not torch.equal(a.q.view(torch.int16), c.q.view(torch.int16))


def test_blocks_are_scattered_and_unowned_rows_are_nan() -> None:
    inputs = materialise_prefill((100, 0, 37), (1, 1, 1), 16, PRESETS["tiny"])
    owned = inputs.block_table[0, :7].tolist()
    assert owned != sorted(owned) or any(b - a != 1 for a, b in itertools.pairwise(owned))
    read = torch.zeros(inputs.kv_cache.shape[:2], dtype=torch.bool)
    for request, context in enumerate((100, 0, 37)):
        for position in range(context):
            read[inputs.block_table[request, position // 16], position % 16] = True
    assert not inputs.kv_cache[read].isnan().any()
    assert inputs.kv_cache[~read].isnan().all()


def test_merge_patterns_have_their_edges() -> None:
    mixed = materialise_merge(MergeCase("m", 64, 4, 96, "fp16", "mixed", 5))
    lses = torch.cat([mixed.prefix_lse.flatten(), mixed.suffix_lse.flatten()])
    assert (lses == float("-inf")).any() and (lses == float("inf")).any() and lses.isfinite().any()
    both = materialise_merge(MergeCase("m", 4, 2, 128, "bf16", "neg-inf-both", 5))
    assert (both.prefix_lse == float("-inf")).all() and (both.suffix_lse == float("-inf")).all()
    for pattern, low, high in (("visible-gap", 0, 18.7), ("large-gap", 16, 88), ("underflow-gap", 86, 1e6)):
        gap = materialise_merge(MergeCase("m", 8, 2, 128, "fp32", pattern, 5))
        gaps = (gap.prefix_lse - gap.suffix_lse).abs()
        assert ((gaps >= low) & (gaps <= high)).all(), (pattern, gaps)
    tiny = materialise_merge(MergeCase("m", 8, 2, 128, "fp32", "tiny-lse", 5))
    smallest = torch.minimum(tiny.prefix_lse.abs(), tiny.suffix_lse.abs())
    assert (smallest <= torch.finfo(torch.float32).tiny).all()


# -- shared kernels ------------------------------------------------------------------------------


def test_gather_follows_the_block_table() -> None:
    inputs = materialise_prefill((100, 37), (1, 1), 16, PRESETS["tiny"])
    dst = torch.zeros((60, inputs.kv_cache.shape[-1]), dtype=inputs.kv_cache.dtype)
    # Request 0 from row 32 (a continuation), 28 rows; request 1 whole, 32 rows.
    cu = torch.tensor([0, 28, 60], dtype=torch.int32)
    starts = torch.tensor([32, 0], dtype=torch.int32)
    token_to_seq = torch.tensor([0] * 28 + [1] * 32, dtype=torch.int32)
    KERNELS.gather(inputs.kv_cache, dst, inputs.block_table, cu, token_to_seq, starts, 60)
    for row in range(60):
        request, position = (0, 32 + row) if row < 28 else (1, row - 28)
        expected = inputs.kv_cache[inputs.block_table[request, position // 16], position % 16]
        assert torch.equal(dst[row], expected)


def test_attention_causal_is_bottom_right_aligned_and_empty_is_neg_inf() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((2, 1, 4), (5, 1, 4), (5, 1, 3)))
    out, lse = KERNELS.attention(q, k, v, torch.tensor([0, 2]), torch.tensor([0, 5]), True, 0.5)
    # The first of 2 queries over 5 keys sees keys 0..3; the last sees all 5.
    scores = (q[0, 0] @ k[:4, 0].T) * 0.5
    assert torch.allclose(lse[0, 0], torch.logsumexp(scores, 0))
    assert torch.allclose(out[0, 0], torch.softmax(scores, 0) @ v[:4, 0], atol=1e-6)
    out, lse = KERNELS.attention(q, k[:0], v[:0], torch.tensor([0, 2]), torch.tensor([0, 0]), False, 0.5)
    assert (lse == float("-inf")).all() and (out == 0).all()


# -- bitwise comparison --------------------------------------------------------------------------


def test_ordered_bits_count_ulps() -> None:
    x = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float32)
    up = torch.nextafter(x, torch.tensor(float("inf")))
    assert (ordered(up) - ordered(x)).tolist() == [1, 1, 1]
    assert int(ordered(torch.tensor([-0.0])) - ordered(torch.tensor([0.0]))) == 0


def test_compare_bits_reports_count_ulp_histogram_and_first_index() -> None:
    a = torch.zeros((4, 2, 3), dtype=torch.bfloat16) + 1
    b = a.clone()
    b[2, 1, 0] = 1 + 2**-7  # one bf16 ULP above 1
    b[3, 0, 2] = 1 + 3 * 2**-7  # three
    result = compare_bits("out", a, b, ("token", "head", "dim"))
    assert result.mismatches == 2 and not result.exact
    assert result.first_mismatch is not None
    assert result.first_mismatch["index"] == {"token": 2, "head": 1, "dim": 0}
    assert result.max_ulp == 3 and result.histogram == {"1": 1, "3-4": 1}
    assert [row["token"] for row in result.worst_rows] == [3, 2]
    assert "2/24 elements differ, max 3 ULP; first at (token 2, head 1, dim 0)" in result.summary()


def test_neg_inf_equal_nan_always_flagged_signed_zero_differs() -> None:
    a = torch.tensor([float("-inf"), 1.0, float("nan"), 0.0])
    same = compare_bits("lse", a, a.clone(), ("token",))
    assert same.mismatches == 0 and same.nan_oracle == 1 and same.nan_port == 1 and not same.exact
    zero = compare_bits("lse", torch.tensor([0.0]), torch.tensor([-0.0]), ("token",))
    assert zero.mismatches == 1 and zero.max_ulp == 0
    finite = compare_bits("lse", torch.tensor([float("-inf")]), torch.tensor([0.0]), ("token",))
    assert finite.mismatches == 1 and finite.max_ulp >= 1 << 62


def test_wrong_shape_or_dtype_is_an_error() -> None:
    a = torch.zeros((2, 3))
    assert (
        compare_bits("o", a, torch.zeros((3, 2)), ("t", "h")).error == "port gave float32[3, 2], oracle float32[2, 3]"
    )
    assert compare_bits("o", a, a.half(), ("t", "h")).error is not None


# -- the ports against the oracle ----------------------------------------------------------------


# per_request bit-exact on every ci merge and prefill case is the README's gate's
# business (tests/test_readme_commands.py runs it on ci, every level); here, that
# ci's numeric items hold what those verdicts need to mean something.


def test_ci_merge_cases_span_every_dtype_width_and_view() -> None:
    cases = load_suite("ci").merge_cases
    assert len(cases) >= 200
    assert {c.dtype for c in cases} == {"bf16", "fp16", "fp32"}
    assert {c.head_size for c in cases} >= {128, 512, 576, 96}
    assert any(c.prefill_tokens_with_context is not None for c in cases)
    assert {c.lse_view for c in cases} == set(MERGE_LSE_VIEWS)
    assert {c.value_view for c in cases} == set(MERGE_VALUE_VIEWS)


def test_ci_prefill_cases_hold_every_layout_shape_the_loop_meets() -> None:
    cases = [c for c in load_suite("ci").cases if c.numeric is not None]
    assert len(cases) >= 24
    layouts = [build_layout(c) for c in cases]
    assert any(layout.empty_token_slices for layout in layouts)
    assert any(any(ch.is_continuation for ch in layout.chunks) for layout in layouts)
    assert any(layout.num_chunks >= 4 for layout in layouts)
    assert any(layout.num_chunks == 1 and not layout.empty_token_slices for layout in layouts)


def test_per_request_bit_exact_on_smoke_prefill_and_merge(cached_oracle: Port, per_request: Port) -> None:
    suite = load_suite("smoke")
    prefill = [compare_prefill(cached_oracle, per_request, c, KERNELS) for c in suite.cases if c.numeric is not None]
    merge = [compare_merge(cached_oracle, per_request, c) for c in suite.merge_cases]
    assert prefill and merge
    bad = [(r.name, r.detail()) for r in prefill + merge if not r.ok]
    assert not bad, bad[:3]
    assert all({t.name for t in r.tensors} >= {"output", "lse"} for r in prefill)


class FiniteEmptyLsePort(PerRequestPort):
    """seeds/003: the empty-context rows keep a finite LSE (0) instead of -inf."""

    name = "finite-empty-lse"

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        layout = build_layout(case)
        context_out, context_lse = context_partial(layout, case.workspace_size, inputs, kernels)
        for start, stop in layout.empty_token_slices:
            context_lse[:, start:stop] = 0.0
        return final_merge((context_out, context_lse), new_token_partial(inputs, kernels), inputs.spec.v_head_dim)


def test_finite_lse_on_empty_rows_is_caught(oracle: Port, per_request: Port) -> None:
    case = numeric_case([0, 300, 0, 45], [3, 4, 2, 3], workspace_size=128)
    assert compare_prefill(oracle, per_request, case, KERNELS).status == PARITY
    result = compare_prefill(oracle, FiniteEmptyLsePort(), case, KERNELS)
    assert result.status == DIVERGENT
    lse = next(t for t in result.tensors if t.name == "context_lse")
    assert lse.first_mismatch is not None and lse.first_mismatch["index"]["token"] == 0
    assert lse.first_mismatch["oracle"] == float("-inf") and lse.first_mismatch["port"] == 0.0
    output = next(t for t in result.tensors if t.name == "output")
    assert output.mismatches > 0  # the leak reaches the layer output


def test_equal_share_differs_at_l3_with_a_sane_ulp_report(oracle: Port, equal_share: Port) -> None:
    # Zero-context requests last, as the legacy engine orders them: its final
    # merge covers only the tokens before the first of them, so placed earlier
    # they would cost the later requests their context (thousands of ULP).
    case = numeric_case([300, 45, 0, 0], [4, 3, 3, 2], workspace_size=128)
    result = compare_prefill(oracle, equal_share, case, KERNELS)
    assert result.status == DIVERGENT
    output = next(t for t in result.tensors if t.name == "output")
    assert output.nan_oracle == output.nan_port == 0
    # Sane in units of the larger value: the raw distance of a value that crosses
    # zero counts every denormal between (harness/compare/bits.py), thousands of ULP.
    assert 0 < output.mismatches < 384 and 0 < output.max_ulp_of_larger < 1000
    buckets = Counter(output.histogram)
    assert buckets["1"] + buckets["2"] + buckets["3-4"] >= 0.8 * output.mismatches
    # Only the 300-row request (tokens 0..3) is cut differently: the 45-row one
    # is one piece on both sides, and zero-context tokens (7..11) take the suffix alone.
    assert output.first_mismatch is not None and output.first_mismatch["index"]["token"] < 4
    assert all(row["token"] < 4 for row in output.worst_rows)


def test_context_partial_single_chunk_fast_path_returns_chunk_partial() -> None:
    case = numeric_case([40, 33, 7], [3, 2, 5], workspace_size=128)
    assert case.numeric is not None
    inputs = materialise_prefill(case.context_lens, case.query_lens, 16, case.numeric)
    layout = build_layout(case)
    assert layout.num_chunks == 1 and not layout.empty_token_slices
    out, lse = context_partial(layout, 128, inputs, KERNELS)
    assert out.shape == (10, 2, 16) and lse.shape == (2, 10)
    assert pytest.approx(0) != float(out.float().abs().sum())
