"""The coverage generator families and the ci suite's coverage groups: the ci suite
holds every input class of issue 12's principles (integer widths, arithmetic off
the powers of two, L3 big enough to matter), generation is deterministic, and the
sweep's cases are what they were.

Values are computed from the loaded suite and the per_request planner's layouts
(the port is held to the oracle's layouts field by field in test_layout_parity).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

import pytest

from harness.cases.coverage_families import COVERAGE_FAMILIES, HYBRID_BLOCK_SIZES, WIDTH_EDGES
from harness.cases.files import case_from_json
from harness.cases.generate import generate
from harness.cases.prefill_generate import NUMERIC_COVERAGE_FAMILIES, generate_prefill, legacy_grid_has_keyless_rows
from harness.cases.suites import SUITES_FILE, Suite, load_suite, workspace_grid
from harness.model import KEYLESS_ROWS, NUMERIC_DTYPES, Case, Layout, WorkspaceConfig
from harness.protocol.port import Port
from ports.per_request.metadata import build_layout

INT32_LIMIT = 1 << 31


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


@dataclass(frozen=True)
class Planned:
    case: Case
    layout: Layout

    def pieces(self) -> Counter[int]:
        """How many chunks each request is split over."""
        counts: Counter[int] = Counter()
        for chunk in self.layout.chunks:
            counts.update(range(chunk.request_start, chunk.request_end))
        return counts


@pytest.fixture(scope="module")
def ci() -> Suite:
    return load_suite("ci")


@pytest.fixture(scope="module")
def planned(ci: Suite) -> list[Planned]:
    """Every case of a coverage family (layout or L3) with its layout."""
    families = set(COVERAGE_FAMILIES) | set(NUMERIC_COVERAGE_FAMILIES)
    return [Planned(c, build_layout(c)) for c in ci.cases if c.family in families]


def test_ci_keeps_the_sweep_and_adds_the_coverage_groups(ci: Suite) -> None:
    generated = [c for c in ci.cases if c.numeric is None and not c.name.startswith("smoke-")]
    sweep = list(generate(20260825, 5000))
    assert generated[: len(sweep)] == sweep  # the 5,000 sweep cases, names and order unchanged
    coverage = [c for c in ci.cases if c.family in COVERAGE_FAMILIES and c.numeric is None]
    assert [c.name for c in coverage[:5]] == [f"{family}-0000" for family in COVERAGE_FAMILIES]
    assert Counter(c.family for c in coverage) == dict.fromkeys(COVERAGE_FAMILIES, len(coverage) // 5)
    base = list(generate_prefill(20260825, 100))
    assert [c for c in ci.cases if c.numeric is not None and c.name.startswith("numeric-")][:100] == base


def test_integer_widths_past_2_16(planned: list[Planned]) -> None:
    chunks = [(p, chunk) for p in planned for chunk in p.layout.chunks]
    assert max(max(p.case.context_lens) for p in planned) > 1 << 16
    assert max(max(chunk.starts) for _, chunk in chunks) > 1 << 16
    assert max(chunk.cu_seq_lens[-1] for _, chunk in chunks) > 1 << 16
    assert max(chunk.token_end for _, chunk in chunks) > 1 << 16
    assert max(chunk.query_start_loc[-1] for _, chunk in chunks) > 1 << 16  # chunk-local offsets too
    # Chunks of hundreds and of thousands of requests, routinely; one past 2^16.
    sizes = [chunk.request_end - chunk.request_start for _, chunk in chunks]
    assert sum(s > 255 for s in sizes) >= 20 and sum(s > 1 << 11 for s in sizes) >= 5
    assert max(sizes) > 1 << 16 and max(max(chunk.token_to_seq, default=0) for _, chunk in chunks) >= 1 << 16
    batches = [p.case.num_requests for p in planned]
    assert sum(n >= 4096 for n in batches) >= 10 and max(batches) > 1 << 16


def test_values_at_each_width_boundary(planned: list[Planned]) -> None:
    """Each edge of :data:`WIDTH_EDGES`, one below and one above, is a context,
    a start, a chunk's row count, a chunk's request count or a token offset."""
    values: set[int] = set()
    for p in planned:
        values.update(p.case.context_lens)
        for chunk in p.layout.chunks:
            values.update(chunk.starts)
            values.update((chunk.cu_seq_lens[-1], chunk.request_end - chunk.request_start, chunk.token_start))
    for edge in WIDTH_EDGES:
        assert {edge - 1, edge, edge + 1} <= values, edge


def test_not_only_powers_of_two(ci: Suite) -> None:
    cases = ci.cases
    blocks = {c.block_size for c in cases}
    assert set(HYBRID_BLOCK_SIZES) <= blocks and {1, 16, 64, 128} <= blocks
    assert sum(not _pow2(c.block_size) for c in cases) >= 100
    assert {c.align_to_block for c in cases if not _pow2(c.block_size)} == {True, False}
    dcp = [c for c in cases if c.dcp_world_size > 1]
    assert {2, 3, 4, 6, 8} <= {c.dcp_world_size for c in dcp}
    assert len({(c.dcp_world_size, c.cp_kv_cache_interleave_size) for c in dcp}) >= 15
    interleaves = Counter(
        "1"
        if c.cp_kv_cache_interleave_size == 1
        else "between"
        if c.cp_kv_cache_interleave_size < c.block_size
        else "equal"
        if c.cp_kv_cache_interleave_size == c.block_size
        else "above"
        for c in dcp
    )
    assert all(interleaves[k] for k in ("1", "between", "equal", "above")), interleaves
    assert {c.align_to_block for c in dcp} == {True, False}
    assert any(not _pow2(c.block_size) for c in dcp)

    def lcm_ne_max(c: Case) -> bool:
        block, span = (c.block_size if c.align_to_block else 1), c.dcp_world_size * c.cp_kv_cache_interleave_size
        return math.lcm(block, span) != max(block, span)

    assert sum(lcm_ne_max(c) for c in dcp) >= 20


def test_floor_and_ceil_of_padded_rows_disagree(planned: list[Planned]) -> None:
    """``padded(n) = ceil(n / (I*D)) * I``: DCP chunks whose span ends are off the
    I*D grid, where a floor would cost a different number of rows."""
    off_grid = 0
    for p in (p for p in planned if p.case.dcp_world_size > 1):
        span = p.case.dcp_world_size * p.case.cp_kv_cache_interleave_size
        ends = (s + n for chunk in p.layout.chunks for s, n in zip(chunk.starts, chunk.seq_lens, strict=True))
        off_grid += any(end % span for end in ends)
    assert off_grid >= 20


def test_workspace_grid_past_2_31_and_off_the_powers_of_two(ci: Suite, oracle: Port, per_request: Port) -> None:
    configs = ci.workspace_configs
    assert len(set(configs)) == len(configs) <= 4000
    assert set(workspace_grid("full")) | set(workspace_grid("wide")) == set(configs)
    assert set(HYBRID_BLOCK_SIZES) <= {c.block_size for c in configs}
    assert {1, 2, 3, 4, 6, 8} <= {c.dcp_world_size for c in configs}
    wide_len = [c for c in configs if 8 * c.max_model_len >= INT32_LIMIT]
    wide_seqs = [c for c in configs if 4 * c.max_num_seqs * c.block_size >= INT32_LIMIT]
    assert {8 * c.max_model_len - INT32_LIMIT for c in wide_len} >= {0, 8}  # at 2^31 and past it
    assert any(8 * c.max_model_len == INT32_LIMIT - 8 for c in configs)  # one below
    assert any(c.dcp_world_size > 1 for c in wide_seqs) and any(c.dcp_world_size == 1 for c in wide_seqs)
    # Upstream sizes every one of them, and the port agrees.
    for config in [*wide_len[:40], *wide_seqs[:40]]:
        assert oracle.workspace_size(config) == per_request.workspace_size(config) >= 1, config

    def unit(c: WorkspaceConfig) -> int:
        span = c.dcp_world_size * c.cp_kv_cache_interleave_size
        return math.lcm(c.block_size, span) if c.dcp_world_size > 1 else c.block_size

    def rounded(n: int, step: int) -> int:
        return -(-n // step) * step

    dense = {c: max(8 * c.max_model_len, 4 * c.max_num_seqs * c.block_size) for c in configs}
    differ = [c for c in configs if rounded(min(dense[c], 65536), unit(c)) != min(rounded(dense[c], unit(c)), 65536)]
    assert len(differ) >= 100
    dcp = [c for c in configs if c.dcp_world_size > 1]
    span = {c: c.dcp_world_size * c.cp_kv_cache_interleave_size for c in dcp}
    assert sum(math.lcm(c.block_size, span[c]) != max(c.block_size, span[c]) for c in dcp) >= 100
    assert {"1", "between", "equal"} <= {
        "1" if c.cp_kv_cache_interleave_size == 1 else "equal" if c.cp_kv_cache_interleave_size == c.block_size
        else "between" if c.cp_kv_cache_interleave_size < c.block_size else "above"
        for c in dcp
    }  # fmt: skip


def test_l3_big_enough_to_matter(ci: Suite, planned: list[Planned]) -> None:
    numeric = [p for p in planned if p.case.numeric is not None]
    assert {p.case.family for p in numeric} == set(NUMERIC_COVERAGE_FAMILIES)
    assert max(max(p.pieces().values()) for p in numeric) >= 3
    assert sum(n >= 3 for p in numeric for n in p.pieces().values()) >= 5
    assert max(p.case.num_requests for p in numeric) >= 100
    assert max(sum(p.case.query_lens) for p in numeric) >= 256
    assert all(max(p.case.query_lens) <= 4 for p in numeric)
    assert any(not _pow2(p.case.block_size) for p in numeric)
    assert all(p.case.dcp_world_size == 1 for p in numeric)  # DCP at L3 is the dcp family's (test_dcp_numeric.py)
    for family in NUMERIC_COVERAGE_FAMILIES:
        dtypes = {p.case.numeric.dtype for p in numeric if p.case.family == family and p.case.numeric}
        assert dtypes == set(NUMERIC_DTYPES), family
    # Every new family with keyless rows in its legacy grid runs them under every behaviour.
    for family in NUMERIC_COVERAGE_FAMILIES:
        behaviours = {
            p.case.numeric.keyless_rows
            for p in numeric
            if p.case.family == family and p.case.numeric and legacy_grid_has_keyless_rows(p.case)
        }
        assert behaviours == set(KEYLESS_ROWS), family


def test_every_coverage_case_is_valid_input() -> None:
    for case in generate(11, 60, list(COVERAGE_FAMILIES)):
        assert case_from_json(case.to_json(), case.name) == case
    for case in generate_prefill(11, 12, "narrow", 1, NUMERIC_COVERAGE_FAMILIES):
        assert case_from_json(case.to_json(), case.name) == case


SNIPPET = (
    "import hashlib, json; from harness.cases.generate import generate; "
    "from harness.cases.prefill_generate import generate_prefill, NUMERIC_COVERAGE_FAMILIES; "
    "from harness.cases.coverage_families import COVERAGE_FAMILIES; "
    "cases = list(generate(5, 40, list(COVERAGE_FAMILIES))) "
    "+ list(generate_prefill(5, 9, 'narrow', 1, NUMERIC_COVERAGE_FAMILIES)); "
    "print(hashlib.sha256(json.dumps([c.to_json() for c in cases]).encode()).hexdigest())"
)


def test_generation_is_deterministic() -> None:
    families = list(COVERAGE_FAMILIES)
    assert list(generate(5, 40, families)) == list(generate(5, 40, families))
    assert list(generate(5, 20, families)) == list(generate(5, 40, families))[:20]  # prefix-stable
    assert list(generate(5, 20, families)) != list(generate(6, 20, families))
    numeric = list(generate_prefill(5, 9, "narrow", 1, NUMERIC_COVERAGE_FAMILIES))
    assert numeric == list(generate_prefill(5, 9, "narrow", 1, NUMERIC_COVERAGE_FAMILIES))
    cases = list(generate(5, 40, families)) + numeric
    here = hashlib.sha256(json.dumps([c.to_json() for c in cases]).encode()).hexdigest()
    for hash_seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", SNIPPET], env=env, check=True, capture_output=True, text=True)
        assert out.stdout.strip() == here


def test_size_overrides_scale_every_group() -> None:
    """``--size N`` gives the sweep N cases and each later group its share;
    ``--numeric-size`` sets the numeric groups."""
    quick = load_suite("ci", size=200, numeric_size=10)
    spec = json.loads(SUITES_FILE.read_text(encoding="utf-8"))["ci"]
    sweep_count, coverage_count = (group["count"] for group in spec["generate"])
    layout = [c for c in quick.cases if c.numeric is None and not c.name.startswith("smoke-")]
    assert Counter(c.family in COVERAGE_FAMILIES for c in layout) == {
        False: 200,
        True: coverage_count * 200 // sweep_count,
    }
    numeric_counts = [group["count"] for group in spec["prefill"]]
    generated = [c for c in quick.cases if c.name.startswith("numeric-") and "-keyless-" not in c.name]
    assert len(generated) == 10 + sum(count * 10 // numeric_counts[0] for count in numeric_counts[1:])
    # The checked-in cases scale too (an evenly spaced subset), keeping one while N > 0.
    smoke = [c for c in load_suite("ci").cases if c.name.startswith("smoke-")]
    kept = [c for c in quick.cases if c.name.startswith("smoke-")]
    assert len(kept) == max(len(smoke) * 200 // sweep_count, 1) and set(kept) <= set(smoke)
