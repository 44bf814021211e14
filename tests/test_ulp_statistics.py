"""ULP statistics read naturally (issue 13): histogram buckets in numeric order,
a NaN shown as NaN, nothing printed for levels without items or for bit-exact
ones beyond ``bit-exact n/n``, and beside the raw ULP distance (which counts
every denormal across zero) the error in ULPs of the larger value."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from harness.compare.bits import TensorComparison, compare_bits, ordered, ulp_of
from harness.compare.ulp_text import HISTOGRAM_LABELS, INF_ULP, NAN_ULP, sorted_histogram, ulp_text
from harness.sides.items import DIVERGENT, PARITY, CaseResult, Kind
from harness.verdicts.baseline import NEW, judge_item, load_baseline, port_names
from harness.verdicts.gate import judge
from harness.verdicts.summary import COLUMNS, results_table, summarise_table
from reports.gate_summary import render_gate_summary
from reports.run_summary import format_summary, numeric_text

LEVELS = ("layout", "merge", "prefill")
SENTINELS = (str(INF_ULP), str(NAN_ULP))


def bf16(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bfloat16)


def lower_bound(label: str) -> float:
    """The smallest distance a bucket label holds, read from the label itself."""
    if label == "NaN":
        return math.inf
    if label == "inf":
        return float(2**62)
    if label.startswith(">"):
        return int(label[1:]) + 1
    return int(label.split("-")[0])


def every_finite_bf16() -> list[float]:
    """Every finite non-negative bf16 value, ascending: built from all 2**15 bit patterns."""
    bits = torch.arange(0, 1 << 15, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.bfloat16).to(torch.float64)
    return sorted({v for v in values.tolist() if math.isfinite(v)})


def merge_result(name: str, oracle: torch.Tensor, port: torch.Tensor, index: int) -> CaseResult:
    tensor = compare_bits("merged", oracle, port, ("token",))
    status = PARITY if tensor.exact else DIVERGENT
    return CaseResult(name, "merge-random", Kind.MERGE, status, tensors=[tensor], index=index)


# -- buckets in numeric order ------------------------------------------------------------------


def test_histogram_buckets_are_in_numeric_order_per_tensor_row_and_level() -> None:
    one = torch.ones(6, dtype=torch.float32)
    steps = torch.tensor([3, 2000, 1, 40, 2_000_000, 9], dtype=torch.int32)  # ULPs above 1.0, shuffled
    port = (one.view(torch.int32) + steps).view(torch.float32)
    port[4] = float("nan")  # the 2_000_000 step becomes a NaN difference
    tensor = compare_bits("out", one, port, ("token",))
    assert list(tensor.histogram) == sorted(tensor.histogram, key=lower_bound)
    assert len(tensor.histogram) == 6

    # Rows merge their tensors' histograms; the level merges its rows' in whatever order they come.
    results = [
        merge_result("a", one[:2], port[:2], 0),
        merge_result("b", one[2:], port[2:], 1),
        merge_result("c", bf16(1.0), bf16(1.0 + 2**-7), 2),
    ]
    table = results_table(list(reversed(results)))
    for text in table["histogram"]:
        labels = list(json.loads(text))
        assert labels == sorted(labels, key=lower_bound)
    level = summarise_table(table, "s", "p", LEVELS)["numeric"]["merge"]["histogram"]
    assert list(level) == sorted(level, key=lower_bound) and level["1"] == 2
    printed = re.search(r"ULP histogram \{(.*)\}", format_summary(summarise_table(table, "s", "p", LEVELS), []))
    assert printed is not None
    assert [part.split(":")[0] for part in printed.group(1).split(", ")] == list(level)


def test_histogram_labels_are_the_bucket_order() -> None:
    assert list(HISTOGRAM_LABELS) == sorted(HISTOGRAM_LABELS, key=lower_bound)
    scrambled = dict(sorted({label: 1 for label in HISTOGRAM_LABELS}.items()))  # string order
    assert list(sorted_histogram(scrambled)) == list(HISTOGRAM_LABELS)


# -- NaN shown as NaN ------------------------------------------------------------------------


def test_nan_against_a_number_is_nan_not_a_huge_distance() -> None:
    tensor = compare_bits("lse", torch.tensor([1.0, 2.0]), torch.tensor([float("nan"), 2.0]), ("token",))
    assert tensor.mismatches == 1 and tensor.nan_mismatches == 1 and tensor.histogram == {"NaN": 1}
    assert ulp_text(tensor.max_ulp) == "NaN" and "max: a NaN against a number (no ULP distance)" in tensor.summary()
    assert tensor.to_json()["nan_mismatches"] == 1
    infinite = compare_bits("lse", torch.tensor([float("-inf")]), torch.tensor([0.0]), ("token",))
    assert infinite.histogram == {"inf": 1} and "max: an infinity against a finite value" in infinite.summary()
    # Both are beyond every finite distance: no cap admits them, NaN furthest.
    assert NAN_ULP > INF_ULP > (1 << 32)

    table = results_table([merge_result("nan", torch.tensor([1.0, 2.0]), torch.tensor([float("nan"), 2.0]), 0)])
    printed = format_summary(summarise_table(table, "s", "p", ("merge",)), [])
    assert "max: a NaN against a number (no ULP distance)" in printed and "NaN: 1" in printed
    assert not any(sentinel in printed for sentinel in SENTINELS)


def test_a_nan_difference_is_beyond_every_baseline_cap(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    entry: dict[str, Any] = {"family": "merge-random", "level": "merge", "status": "divergent"}
    entry |= {"max_ulp": 2**40, "max_mismatch_fraction": 1.0, "reason": "a cap far beyond any finite distance"}
    path.write_text(json.dumps({"port": "p", "entries": [entry]}))
    table = results_table([merge_result("nan", torch.tensor([1.0]), torch.tensor([float("nan")]), 0)])
    row = table.iloc[0].to_dict()
    assert judge_item(load_baseline(path), port_names("p", "p"), row).label == NEW


# -- nothing printed for nothing ---------------------------------------------------------------


def layout_only_table() -> pd.DataFrame:
    return results_table([CaseResult("widths-0001", "widths", Kind.LAYOUT, PARITY, index=0)])


def test_levels_without_items_print_no_rows() -> None:
    summary = summarise_table(layout_only_table(), "s", "p", LEVELS)
    printed = format_summary(summary, [])
    assert re.search(r"^\s+layout\s+parity", printed, re.MULTILINE)
    assert not re.search(r"^\s+(merge|prefill)\s", printed, re.MULTILINE)
    outcome = judge(layout_only_table(), {"suite": "s", "port": "p", "levels": list(LEVELS), "pin": "x"}, [], False)
    markdown = render_gate_summary(outcome)
    assert "| layout |" in markdown
    assert "| merge |" not in markdown and "| prefill |" not in markdown
    assert not re.search(r"^(merge|prefill):", markdown, re.MULTILINE)


def test_a_bit_exact_level_prints_no_empty_statistics() -> None:
    same = bf16(1.0, -2.0)
    table = results_table([merge_result("same", same, same.clone(), 0)])
    summary = summarise_table(table, "s", "p", ("merge",))
    assert numeric_text(summary["numeric"]["merge"]) == "bit-exact 1/1"
    printed = format_summary(summary, [])
    assert "{-}" not in printed and "{}" not in printed and "max 0 ULP" not in printed
    # A merge-only run has no layout figures to print either.
    assert "utilisation" not in printed
    outcome = judge(table, {"suite": "s", "port": "p", "levels": ["merge"], "pin": "x"}, [], False)
    assert "merge: bit-exact 1/1\n" in render_gate_summary(outcome)


# -- error in ULPs of the larger value ---------------------------------------------------------


def test_a_sign_change_between_tiny_values_is_huge_raw_but_small_of_the_larger() -> None:
    # The GPU report's case: bf16 values straddling zero, tiny next to the tensor's scale.
    oracle, port = bf16(2.0**-14), bf16(-(2.0**-20))
    tensor = compare_bits("out", oracle, port, ("token",))
    values = every_finite_bf16()
    between = sum(1 for v in values if 0 < v <= 2.0**-14) + sum(1 for v in values if 0 < v < 2.0**-20)
    assert tensor.max_ulp == between + 1 > 20_000  # +1: the step from +0 to the first negative
    spacing = values[values.index(2.0**-14) + 1] - 2.0**-14
    assert tensor.max_ulp_of_larger == (2.0**-14 + 2.0**-20) / spacing < 200
    assert tensor.worst_rows[0]["max_ulp_of_larger"] == tensor.max_ulp_of_larger
    assert tensor.first_mismatch is not None and tensor.first_mismatch["ulp_of_larger"] == tensor.max_ulp_of_larger
    assert "max 28160 ULP" in tensor.summary() and "at most 130 ULP of the larger value" in tensor.summary()

    # Where the two figures agree the line says it once.
    steps = compare_bits("out", bf16(1.0, 2.0), bf16(1.0 + 3 * 2**-7, 2.0), ("token",))
    assert steps.max_ulp_of_larger == steps.max_ulp == 3 and "larger value" not in steps.summary()

    table = results_table([merge_result("straddle", oracle, port, 0)])
    assert float(table["max_ulp_of_larger"][0]) == tensor.max_ulp_of_larger
    assert "max 28160 ULP (at most 130 ULP of the larger value)" in format_summary(
        summarise_table(table, "s", "p", ("merge",)), []
    )


def test_each_pair_is_its_distance_over_the_spacing_above_the_larger() -> None:
    values = every_finite_bf16()
    spacing_above = {v: w - v for v, w in itertools.pairwise(values)}
    rng = random.Random("13:ulp-of-larger:bf16")
    picks = [rng.randrange(1, len(values) - 2) for _ in range(200)]
    oracle = [values[i] for i in picks]
    measured: dict[str, dict[int, float]] = {}
    for how, port in (("step up", [values[i + 1] for i in picks]), ("negated", [-v for v in oracle])):
        tensor = compare_bits("out", bf16(*oracle), bf16(*port), ("token",), worst=len(picks))
        measured[how] = {row["token"]: row["max_ulp_of_larger"] for row in tensor.worst_rows}
        pairs = enumerate(zip(oracle, port, strict=True))
        expected = {t: abs(a - b) / spacing_above[max(abs(a), abs(b))] for t, (a, b) in pairs}
        assert measured[how] == expected
        assert tensor.max_ulp_of_larger == max(expected.values())
        # Every spacing below the larger value is at most its ULP: never above the raw count.
        assert all(row["max_ulp_of_larger"] <= row["max_ulp"] for row in tensor.worst_rows)
    # One step up is one ULP of the larger value, or half of one when it lands on a power of two.
    assert set(measured["step up"].values()) <= {0.5, 1.0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ulp_of_is_the_spacing_above_each_magnitude(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    rng = random.Random(f"13:ulp-of:{dtype}")
    bits = 32 if dtype == torch.float32 else 16
    view = torch.int32 if bits == 32 else torch.int16
    patterns = [rng.randrange(0, (1 << (bits - 1)) - 1) for _ in range(500)] + [0, 1, 2]
    magnitudes = torch.tensor(patterns, dtype=torch.int64).to(view).view(dtype)
    magnitudes = magnitudes[torch.isfinite(magnitudes) & (magnitudes < info.max)]
    above = (magnitudes.view(view).to(torch.int64) + 1).to(view).view(dtype)  # next pattern up
    spacing = above.to(torch.float64) - magnitudes.to(torch.float64)
    assert torch.equal(ulp_of(magnitudes.to(torch.float64), dtype), spacing)
    if dtype != torch.bfloat16:  # numpy knows these two formats: a second, independent opinion
        numpy_dtype = np.float32 if dtype == torch.float32 else np.float16
        theirs = np.spacing(magnitudes.to(torch.float64).numpy().astype(numpy_dtype)).astype(np.float64)
        assert np.array_equal(ulp_of(magnitudes.to(torch.float64), dtype).numpy(), theirs)


def test_parity_is_still_the_bits() -> None:
    # Equal values with different bits (±0): zero error either way, still a mismatch.
    zero = compare_bits("lse", torch.tensor([0.0]), torch.tensor([-0.0]), ("token",))
    assert zero.mismatches == 1 and not zero.exact and zero.max_ulp_of_larger == 0.0
    # Half a larger-value ULP apart (the smaller value sits in a finer binade): still divergent.
    half = compare_bits("out", bf16(1.0), bf16(1.0 - 2**-8), ("token",))
    assert half.mismatches == 1 and not half.exact and half.max_ulp_of_larger == 0.5
    assert int((ordered(bf16(1.0)) - ordered(bf16(1.0 - 2**-8))).abs()) == half.max_ulp == 1


# -- compatibility ---------------------------------------------------------------------------


def test_a_table_written_before_the_new_column_still_summarises() -> None:
    table = results_table([merge_result("straddle", bf16(2.0**-14), bf16(-(2.0**-20)), 0)])
    old = table.drop(columns=["max_ulp_of_larger"])
    summary = summarise_table(old, "s", "p", ("merge",))
    assert summary["numeric"]["merge"]["max_ulp_of_larger"] is None
    json.dumps(summary, allow_nan=False)  # the JSON report stays strict JSON
    assert "larger value" not in format_summary(summary, []) and "max 28160 ULP" in format_summary(summary, [])
    assert "max_ulp_of_larger" in COLUMNS and list(table.columns) == list(COLUMNS)


def test_tensor_json_carries_the_new_figures() -> None:
    tensor = compare_bits("out", bf16(1.0, 3.0), bf16(1.0 + 2**-7, float("nan")), ("token",))
    data: dict[str, Any] = tensor.to_json()
    assert data["max_ulp"] == NAN_ULP and data["nan_mismatches"] == 1 and data["inf_mismatches"] == 0
    assert data["max_ulp_of_larger"] == 1.0 and list(data["histogram"]) == ["1", "NaN"]
    assert TensorComparison("x", "float32", (1,), ("token",)).to_json()["max_ulp_of_larger"] == 0.0
