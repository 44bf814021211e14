"""The ci suite's merge (L2) inputs cover the whole numeric range (issue 12).

Every figure here is computed from the generated ci merge cases' materialised
tensors, over the tokens the merge reads (those before
``prefill_tokens_with_context``), so a change to the generator or to
``materialise_merge`` that loses a band, a combination or a view fails here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import pytest
import torch

from harness.cases.merge import MERGE_HEAD_SIZES
from harness.cases.suites import load_suite
from harness.kernels.numeric import (
    FP32_EXP_DENORMAL_GAP,
    FP32_EXP_ZERO_GAP,
    MergeInputs,
    materialise_merge,
    partly_visible_gap,
)
from harness.model import MERGE_LSE_VIEWS, MERGE_VALUE_VIEWS, NUMERIC_DTYPES, MergeCase
from harness.protocol.port import Port
from harness.sides.items import PARITY
from harness.sides.runner import compare_merge
from ports.per_request import PerRequestPort

Materialised = list[tuple[MergeCase, MergeInputs]]


@pytest.fixture(scope="module")
def ci_inputs() -> Materialised:
    return [(case, materialise_merge(case)) for case in load_suite("ci").merge_cases]


def merged_tokens(case: MergeCase) -> int:
    return case.num_tokens if case.prefill_tokens_with_context is None else case.prefill_tokens_with_context


def merged_lses(case: MergeCase, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The LSEs the merge reads, ``[heads, merged tokens]``."""
    merged = merged_tokens(case)
    return inputs.prefix_lse[:, :merged], inputs.suffix_lse[:, :merged]


def gaps(ci_inputs: Materialised, dtype: str | None = None) -> torch.Tensor:
    """``max - min`` of every merged pair of finite LSEs, in fp32 as the kernel forms it, sorted."""
    found = []
    for case, inputs in ci_inputs:
        if dtype is None or case.dtype == dtype:
            prefix, suffix = merged_lses(case, inputs)
            finite = prefix.isfinite() & suffix.isfinite()
            found.append((torch.maximum(prefix, suffix) - torch.minimum(prefix, suffix))[finite])
    return torch.cat(found).sort().values


def largest_hole(values: torch.Tensor, low: float, high: float) -> float:
    """The widest stretch of ``[low, high]`` holding none of ``values``."""
    inside = values[(values >= low) & (values <= high)].double()
    edges = torch.cat([torch.tensor([low], dtype=torch.float64), inside, torch.tensor([high], dtype=torch.float64)])
    return float(edges.diff().max())


# -- LSE gaps ------------------------------------------------------------------------------------


def test_gaps_run_continuously_from_zero_to_far_past_the_fp32_exp_cutoff(ci_inputs: Materialised) -> None:
    found = gaps(ci_inputs)
    assert int((found == 0).sum()) >= 10  # equal LSEs: both weights exactly 1/2
    assert largest_hole(found, 0.0, FP32_EXP_ZERO_GAP + 2.0) < 3.0
    assert float(found.max()) > 1e4


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_each_dtype_is_dense_where_the_weaker_side_is_partly_visible(ci_inputs: Materialised, dtype: str) -> None:
    band = partly_visible_gap(dtype)
    found = gaps(ci_inputs, dtype)
    assert int((found <= band).sum()) >= 60
    assert largest_hole(found, 0.0, band) < band / 8
    # And just past it, where a cut-off that is off by a little shows.
    assert int(((found > band) & (found < band + 2)).sum()) >= 5


def test_gaps_reach_the_fp32_exp_denormal_band_and_the_zero_weight_past_it(ci_inputs: Materialised) -> None:
    found = gaps(ci_inputs)
    weights = torch.exp(-found)
    denormal = (found > FP32_EXP_DENORMAL_GAP) & (found < FP32_EXP_ZERO_GAP)
    assert int(denormal.sum()) >= 30
    assert bool(((weights[denormal] > 0) & (weights[denormal] < torch.finfo(torch.float32).tiny)).all())
    assert largest_hole(found, FP32_EXP_DENORMAL_GAP, FP32_EXP_ZERO_GAP) < 2.0
    beyond = found > FP32_EXP_ZERO_GAP
    assert int(beyond.sum()) >= 30 and bool((weights[beyond] == 0).all())


# -- infinities, signed zeros, denormals, NaN ----------------------------------------------------


def lse_kind(lse: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 +inf, 2 -inf (NaN is never read: see test_nan_only_where_nothing_depends_on_it)."""
    return torch.where(lse.isposinf(), 1, torch.where(lse.isneginf(), 2, 0))


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_every_pair_of_finite_and_infinite_lses_is_merged(ci_inputs: Materialised, dtype: str) -> None:
    pairs: Counter[tuple[int, int]] = Counter()
    for case, inputs in ci_inputs:
        if case.dtype == dtype:
            prefix, suffix = merged_lses(case, inputs)
            kinds = zip(lse_kind(prefix).flatten().tolist(), lse_kind(suffix).flatten().tolist(), strict=True)
            pairs.update(kinds)
    assert {(p, s) for p in range(3) for s in range(3)} <= set(pairs), sorted(pairs.items())


def negative_zero(t: torch.Tensor) -> torch.Tensor:
    return (t == 0) & torch.signbit(t)


def denormal(t: torch.Tensor) -> torch.Tensor:
    return (t != 0) & t.isfinite() & (t.abs() < torch.finfo(t.dtype).tiny)


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_values_hold_signed_zeros_and_denormals_where_they_change_bits(ci_inputs: Materialised, dtype: str) -> None:
    seen: Counter[str] = Counter()
    for case, inputs in ci_inputs:
        if case.dtype != dtype:
            continue
        merged = merged_tokens(case)
        prefix, suffix = inputs.prefix_output[:merged], inputs.suffix_output[:merged]
        seen["prefix -0.0"] += int(negative_zero(prefix).sum())
        seen["suffix -0.0"] += int(negative_zero(inputs.suffix_output).sum())
        seen["prefix denormal"] += int(denormal(prefix).sum())
        seen["suffix denormal"] += int(denormal(inputs.suffix_output).sum())
        seen["both -0.0"] += int((negative_zero(prefix) & negative_zero(suffix)).sum())
        # -0.0 on the side that takes all the weight, a positive value on the side
        # whose weight is exactly 0: the reference adds +0.0 and stores +0.0.
        p_lse, s_lse = (lse.t().unsqueeze(-1) for lse in merged_lses(case, inputs))
        p_lse, s_lse = (torch.where(lse.isposinf(), float("-inf"), lse) for lse in (p_lse, s_lse))
        p_only = p_lse.isfinite() & ((s_lse == float("-inf")) | (p_lse - s_lse > FP32_EXP_ZERO_GAP))
        s_only = s_lse.isfinite() & ((p_lse == float("-inf")) | (s_lse - p_lse > FP32_EXP_ZERO_GAP))
        seen["-0.0 against a zero weight"] += int((p_only & negative_zero(prefix) & (suffix > 0)).sum())
        seen["-0.0 against a zero weight"] += int((s_only & negative_zero(suffix) & (prefix > 0)).sum())
    assert all(seen[k] > 0 for k in seen) and len(seen) == 6, seen


def test_lses_hold_signed_zeros_and_denormals_against_every_kind(ci_inputs: Materialised) -> None:
    against: set[tuple[str, int]] = set()
    for case, inputs in ci_inputs:
        for mine, other in (merged_lses(case, inputs), merged_lses(case, inputs)[::-1]):
            kinds = lse_kind(other)
            for label, mask in (("-0.0", negative_zero(mine)), ("denormal", denormal(mine))):
                against.update((label, int(k)) for k in set(kinds[mask].tolist()))
    assert against == {(label, k) for label in ("-0.0", "denormal") for k in range(3)}


def test_nan_only_where_nothing_depends_on_it(ci_inputs: Materialised) -> None:
    """NaN stands in the prefix of tokens without context (never read) and in a
    quarter of the values of merged rows with both LSEs infinite (output 0 there);
    nowhere else, so a NaN in an output is always the port's."""
    where: Counter[str] = Counter()
    for case, inputs in ci_inputs:
        merged = merged_tokens(case)
        p_lse, s_lse = inputs.prefix_lse, inputs.suffix_lse
        assert not s_lse.isnan().any() and not p_lse[:, :merged].isnan().any()
        assert bool(p_lse[:, merged:].isnan().all())
        assert bool(inputs.prefix_output[merged:].isnan().all())
        both_empty = (p_lse[:, :merged].isinf() & s_lse[:, :merged].isinf()).t().unsqueeze(-1)
        for name, values in (("prefix", inputs.prefix_output[:merged]), ("suffix", inputs.suffix_output[:merged])):
            nan = values.isnan()
            assert not (nan & ~both_empty).any(), case.name
            where[name] += int(nan.sum())
        assert not inputs.suffix_output[merged:].isnan().any()
        where["unmerged prefix"] += int(inputs.prefix_output[merged:].numel())
    assert all(where[k] > 0 for k in ("prefix", "suffix", "unmerged prefix")), where


# -- views ---------------------------------------------------------------------------------------


def outside_the_view_is_nan(view: torch.Tensor) -> bool:
    """Every element of the view's buffer that the view does not cover is NaN."""
    buffer = view.new_empty(0).set_(view.untyped_storage())
    covered = torch.zeros(buffer.numel(), dtype=torch.bool)
    positions = torch.arange(buffer.numel()).as_strided(view.shape, view.stride(), view.storage_offset())
    covered[positions.flatten()] = True
    return bool(buffer[~covered].isnan().all())


def test_views_have_the_strides_upstream_passes(ci_inputs: Materialised) -> None:
    combinations: Counter[tuple[str, str]] = Counter()
    for case, inputs in ci_inputs:
        combinations[(case.lse_view, case.value_view)] += 1
        tokens, heads, size = case.num_tokens, case.num_heads, case.head_size
        p_lse, s_lse = inputs.prefix_lse, inputs.suffix_lse
        if case.lse_view == "contiguous":
            assert p_lse.is_contiguous() and s_lse.is_contiguous()
        elif case.lse_view == "column-slice":
            # The running partial's columns from an offset; the chunk's from 0, its buffer wider.
            assert heads >= 2
            assert p_lse.stride(1) == 1 and p_lse.stride(0) > tokens and p_lse.storage_offset() >= 1
            assert s_lse.stride(1) == 1 and s_lse.stride(0) > tokens and s_lse.storage_offset() == 0
            assert outside_the_view_is_nan(p_lse) and outside_the_view_is_nan(s_lse)
        else:
            assert case.lse_view == "transposed" and heads >= 2
            assert p_lse.stride() == s_lse.stride() == (1, heads)
        p_out, s_out = inputs.prefix_output, inputs.suffix_output
        if case.value_view == "contiguous":
            assert p_out.is_contiguous() and s_out.is_contiguous()
        else:
            assert case.value_view == "head-dim-slice"
            row = p_out.stride(1)
            assert row > size and p_out.stride() == s_out.stride() == (heads * row, row, 1)
            assert p_out.storage_offset() >= heads * row and s_out.storage_offset() == 0
            assert outside_the_view_is_nan(p_out) and outside_the_view_is_nan(s_out)
    assert set(combinations) == {(a, b) for a in MERGE_LSE_VIEWS for b in MERGE_VALUE_VIEWS}
    assert min(combinations.values()) >= 10, combinations
    transposed = [c for c, _ in ci_inputs if c.lse_view == "transposed" and merged_tokens(c) >= 2]
    assert len(transposed) >= 20  # the token stride is read, not only the head stride


def test_tokens_with_context_zero_all_between_and_none(ci_inputs: Materialised) -> None:
    kinds: Counter[str] = Counter()
    for case, _ in ci_inputs:
        merged = case.prefill_tokens_with_context
        if merged is None:
            kinds["none"] += 1
        else:
            assert 0 <= merged <= case.num_tokens
            kinds["zero" if merged == 0 else "all" if merged == case.num_tokens else "between"] += 1
    assert set(kinds) == {"none", "zero", "all", "between"} and min(kinds.values()) >= 20, kinds


def test_every_dtype_at_every_head_size(ci_inputs: Materialised) -> None:
    found = {(case.dtype, case.head_size) for case, _ in ci_inputs}
    assert found == {(d, h) for d in NUMERIC_DTYPES for h in MERGE_HEAD_SIZES}


def test_views_are_written_only_when_not_the_default() -> None:
    plain = MergeCase("m", 3, 2, 96, "fp16", "mixed", 5, 2)
    assert "lse_view" not in plain.to_json() and "value_view" not in plain.to_json()
    viewed = dataclasses.replace(plain, lse_view="transposed", value_view="head-dim-slice")
    assert viewed.to_json() == {**plain.to_json(), "lse_view": "transposed", "value_view": "head-dim-slice"}
    back = dataclasses.replace(viewed, lse_view=MERGE_LSE_VIEWS[0], value_view=MERGE_VALUE_VIEWS[0])
    assert json.dumps(back.to_json()) == json.dumps(plain.to_json())


# -- the views reach the ports -------------------------------------------------------------------


def small_case(lse_view: str, value_view: str) -> MergeCase:
    return MergeCase(
        f"m-{lse_view}-{value_view}", 4, 2, 96, "fp16", "mixed", 7, 3, lse_view=lse_view, value_view=value_view
    )


class StrideBlindPort(PerRequestPort):
    """Reads every LSE as a contiguous ``[heads, tokens]`` and every partial as a
    contiguous ``[tokens, heads, size]`` from its first element: right only on
    contiguous inputs."""

    name = "stride-blind"

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        def blind(t: torch.Tensor) -> torch.Tensor:
            strides = [math.prod(t.shape[i + 1 :]) for i in range(t.dim())]
            return t.as_strided(t.shape, strides, t.storage_offset())

        seen = MergeInputs(
            blind(inputs.prefix_output),
            blind(inputs.prefix_lse),
            blind(inputs.suffix_output),
            blind(inputs.suffix_lse),
            inputs.prefill_tokens_with_context,
        )
        return super().merge_states(seen)


@pytest.mark.parametrize("lse_view", MERGE_LSE_VIEWS)
@pytest.mark.parametrize("value_view", MERGE_VALUE_VIEWS)
def test_per_request_is_bit_exact_on_every_view(
    oracle: Port, per_request: Port, lse_view: str, value_view: str
) -> None:
    case = small_case(lse_view, value_view)
    result = compare_merge(oracle, per_request, case)
    assert result.status == PARITY, result.detail()
    blind = compare_merge(oracle, StrideBlindPort(), case)
    contiguous = lse_view == "contiguous" and value_view == "contiguous"
    assert (blind.status == PARITY) == contiguous, blind.detail()
