"""The sparse path's L3 (issue 29): the shared masked-attention kernel, the
masked prefill loop of the oracle (the pinned release's own forward_mha, in
this process; 0.27.1's from its own environment) against per_request,
equal_share and the C++ port, the sparse L3 mutants, and the items the L3
level does not run."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.cases.fields import CaseError
from harness.cases.files import load_item_file
from harness.cases.sparse_prefill_generate import PREFILL_FAMILIES, generate_sparse_prefill
from harness.cases.suites import load_suite
from harness.compare.bits import identical_bits
from harness.kernels import CpuKernels, KeylessRowsKernels, kernels_for
from harness.kernels.masked_attention import PackedMask, RangeIndices, pack_selection
from harness.kernels.sparse_prefill import case_topk, token_selection
from harness.model import KEYLESS_ROWS, PRESETS
from harness.model.sparse import SparseCase
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, NOT_RUN, ORACLE_ERROR, PARITY
from harness.sides.runner import run_item
from ports.equal_share import PORT as EQUAL_SHARE
from ports.mutants import MUTANTS
from ports.mutants.sparse import SPARSE_L3_MUTANTS
from ports.per_request import PORT as PER_REQUEST

# They pass --jobs or read the machine's cores: every core, not one xdist worker's (conftest).
pytestmark = pytest.mark.all_cores

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def oracle(cached_oracle: Any) -> Any:
    """The pinned oracle behind the session's oracle cache: the L3 items these
    tests share (ci's first sparse L3 batches) are asked of it once."""
    return cached_oracle


def _run(oracle: Any, port: Any, item: SparseCase) -> Any:
    return run_item(oracle, port, "sparse-prefill", item, kernels_for("cpu"))


# -- the kernel --------------------------------------------------------------------------------


def _attention_inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((7, 2, 12), generator=g).to(torch.bfloat16)
    k = torch.randn((45, 2, 12), generator=g).to(torch.bfloat16)
    v = torch.randn((45, 2, 8), generator=g).to(torch.bfloat16)
    return q, k, v, torch.tensor([0, 3, 7]), torch.tensor([0, 40, 45])


@pytest.mark.parametrize("behaviour", KEYLESS_ROWS)
@pytest.mark.parametrize("causal", [False, True])
def test_both_selection_forms_give_the_same_bits(behaviour: str, causal: bool) -> None:
    q, k, v, cu_q, cu_k = _attention_inputs()
    # Request 0 (3 rows over 40 keys, its range starting at key 33 of its
    # sequence): row 2 selects nothing in range, so it is keyless.
    indices = [torch.tensor([[0, 39, -1], [5, 5, 17], [-1, -1, -1]]), torch.tensor([[4, 0, 2]] * 4)]
    starts = (33, 0)
    kernels = CpuKernels(behaviour)
    ranges = kernels.masked_attention(q, k, v, cu_q, cu_k, causal, 0.3, RangeIndices(tuple(indices)))
    positioned = [torch.where(t >= 0, t + s, t) for t, s in zip(indices, starts, strict=True)]
    mask = pack_selection(positioned, 128, 4)
    mask[:, 0, -1] = torch.tensor(starts, dtype=torch.int32)
    packed = kernels.masked_attention(q, k, v, cu_q, cu_k, causal, 0.3, PackedMask(mask, key_starts=True))
    plain = pack_selection(indices, 128, 3)
    unshifted = kernels.masked_attention(q, k, v, cu_q, cu_k, causal, 0.3, PackedMask(plain))
    for a, b in ((ranges, packed), (ranges, unshifted)):
        assert identical_bits(a[0], b[0]) and identical_bits(a[1], b[1])
    lse = ranges[1]
    expected = {"neg-inf": float("-inf"), "pos-inf": float("inf"), "finite": 0.0}[behaviour]
    assert (lse[:, 2] == expected).all()
    assert torch.isfinite(lse[:, :2]).all() and torch.isfinite(lse[:, 3:]).all()
    # The keyless-row wrapper around another kernel set reports the same rows.
    wrapped = KeylessRowsKernels(CpuKernels(), behaviour)
    again = wrapped.masked_attention(q, k, v, cu_q, cu_k, causal, 0.3, RangeIndices(tuple(indices)))
    assert identical_bits(again[1], lse)


def test_indices_outside_their_range_are_refused_not_ignored() -> None:
    q, k, v, cu_q, cu_k = _attention_inputs()
    kernels = CpuKernels()
    for bad in (40, -2):
        indices = (torch.tensor([[0, bad, -1]] * 3), torch.tensor([[0]] * 4))
        with pytest.raises(ValueError, match=f"selects key {bad}"):
            kernels.masked_attention(q, k, v, cu_q, cu_k, False, 0.3, RangeIndices(indices))
    with pytest.raises(ValueError, match="rows for its 3 queries"):
        kernels.masked_attention(
            q, k, v, cu_q, cu_k, False, 0.3, RangeIndices((torch.zeros((4, 1)), torch.zeros((4, 1))))
        )


def test_a_selection_changes_the_result_and_a_short_mask_is_refused() -> None:
    q, k, v, cu_q, cu_k = _attention_inputs(1)
    kernels = CpuKernels()
    one = [torch.tensor([[0, 1, 2]] * 3), torch.tensor([[0, 1, 2]] * 4)]
    other = [torch.tensor([[0, 1, 3]] * 3), torch.tensor([[0, 1, 2]] * 4)]
    a = kernels.masked_attention(q, k, v, cu_q, cu_k, False, 0.3, RangeIndices(tuple(one)))
    b = kernels.masked_attention(q, k, v, cu_q, cu_k, False, 0.3, RangeIndices(tuple(other)))
    assert not identical_bits(a[0][:3], b[0][:3]) and identical_bits(a[0][3:], b[0][3:])
    with pytest.raises(ValueError, match="past its mask"):
        kernels.masked_attention(q, k, v, cu_q, cu_k, False, 0.3, PackedMask(pack_selection(one, 128, 1)))


# -- inputs and the generated cases ------------------------------------------------------------


def test_selections_are_causal_seeded_per_token_and_shaped() -> None:
    cases = generate_sparse_prefill(5, 24)
    assert {c.family for c in cases} == set(PREFILL_FAMILIES)
    for case in cases[:8]:
        topk = case_topk(case)
        assert topk.shape == (sum(case.query_lens), case.index_topk) and topk.dtype == torch.int32
        row = 0
        for request, (context, query) in enumerate(zip(case.context_lens, case.query_lens, strict=True)):
            for token in range(query):
                chosen = topk[row][topk[row] >= 0]
                limit = context + query - 1 if case.selection in ("future", "mixed") else context + token
                assert max(chosen.tolist(), default=-1) <= limit
                assert topk[row].tolist() == token_selection(case, request, token)
                row += 1
    # A shrunk batch keeps the selections of the tokens it keeps.
    case = next(c for c in cases if len(c.query_lens) > 1)
    first = dataclasses.replace(case, context_lens=case.context_lens[:1], query_lens=case.query_lens[:1])
    assert torch.equal(case_topk(first), case_topk(case)[: case.query_lens[0]])


def test_ci_sparse_l3_covers_both_routes_both_forms_and_every_dtype(oracle: Any) -> None:
    cases = [c for c in load_suite("ci").sparse_cases if c.numeric is not None]
    plans = {c.name: oracle.plan_sparse(c) for c in cases}
    assert {p.route for p in plans.values()} == {"dense-mha", "masked-mha"}
    masked = [c for c in cases if plans[c.name].route == "masked-mha"]
    assert {plans[c.name].global_mask_fits for c in masked} == {True, False, None}
    assert {c.numeric.dtype for c in cases if c.numeric} == {"bf16", "fp16", "fp32"}
    assert {c.numeric.keyless_rows for c in cases if c.numeric} == set(KEYLESS_ROWS)
    pieces = [ch for c in masked for ch in plans[c.name].layout.chunks if ch.is_continuation]
    assert pieces, "no masked batch has a continuation piece"


# -- the loop against the oracle ---------------------------------------------------------------


def test_smoke_sparse_l3_is_bit_exact(oracle: Any) -> None:
    cases = [c for c in load_suite("smoke").sparse_cases if c.numeric is not None]
    assert cases
    results = [_run(oracle, PER_REQUEST, c) for c in cases]
    assert {r.status for r in results} == {PARITY}, [r.detail() for r in results]
    assert all(r.tensors and all(t.exact for t in r.tensors) for r in results)


def test_a_batch_routed_to_mqa_is_not_run_and_one_upstream_cannot_run_is_refused(oracle: Any) -> None:
    case = generate_sparse_prefill(5, 1)[0]
    mqa = dataclasses.replace(case, force_mqa=True, name="forced-mqa")
    result = _run(oracle, PER_REQUEST, mqa)
    assert result.status == NOT_RUN and "routes it mqa" in (result.error or "")
    # Masked MHA forced without the masked kernel: upstream asserts; never a PASS.
    unavailable = dataclasses.replace(case, masked_kernel=False, name="no-kernel")
    refused = _run(oracle, PER_REQUEST, unavailable)
    assert refused.status == ORACLE_ERROR and "masked-mha-unavailable" in (refused.error or "")


def test_equal_share_diverges_from_the_pin_where_its_loop_differs(oracle: Any) -> None:
    cases = [c for c in load_suite("ci").sparse_cases if c.numeric is not None and c.family == "sparse-masked-global"]
    statuses = {_run(oracle, EQUAL_SHARE, c).status for c in cases[:3]}
    assert DIVERGENT in statuses


@pytest.mark.parametrize("name", [m.name for m in SPARSE_L3_MUTANTS])
def test_each_l3_mutant_is_caught_at_l3_and_exact_below(oracle: Any, name: str) -> None:
    mutant = MUTANTS[name]()
    cases = [c for c in load_suite("ci").sparse_cases if c.numeric is not None][:8]
    if name == "sparse-l3-drops-last-slot":
        # Seen only where a row is full to its last slot: the sparse-l3-rows family's first batch.
        cases = [c for c in load_suite("ci").sparse_cases if c.family == "sparse-l3-rows"][:1]
    killed = [c for c in cases if _run(oracle, mutant, c).status != PARITY]
    assert killed, f"{name} survives the first 8 ci sparse L3 items"
    # Exact at L1 on the item that kills it (the fault is in the loop alone).
    layout = run_item(oracle, mutant, "sparse-layout", killed[0], kernels_for("cpu"))
    assert layout.status == PARITY


def test_the_cpp_port_passes_sparse_l3() -> None:
    subprocess.run(["make", "-s", "cpp-port"], cwd=REPO, check=True, timeout=300)
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--suite", "smoke", "--port", "cmd:build/cpp-port",
         "--level", "sparse-prefill", "--jobs", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "verdict PASS" in done.stdout and "sparse-prefill parity    12" in done.stdout


def test_equal_share_sparse_l3_matches_0_27_1(legacy_oracle: Port) -> None:
    legacy = legacy_oracle
    cases = [c for c in generate_sparse_prefill(11, 8) if c.family != "sparse-masked-ranges"]
    results = [_run(legacy, EQUAL_SHARE, c) for c in cases]
    assert {r.status for r in results} == {PARITY}, [r.detail() for r in results]
    # 0.27.1's chunk masks span the whole batch: where 0.28.0's per-range
    # masks fit, its overflow, and 0.27.1 refuses the item in its own words.
    ranges = next(c for c in generate_sparse_prefill(11, 8) if c.family == "sparse-masked-ranges")
    refused = _run(legacy, EQUAL_SHARE, ranges)
    assert refused.status == ORACLE_ERROR
    assert (refused.error or "").startswith("OracleRefusal: vllm==0.27.1: its sparse prefill cannot run")


# -- bad input ---------------------------------------------------------------------------------


def test_a_sparse_l3_file_is_checked(tmp_path: Path) -> None:
    case = generate_sparse_prefill(5, 1)[0]
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"kind": "sparse", **case.to_json()}))
    kind, loaded = load_item_file(good)
    assert kind == "sparse-layout" and loaded == case
    for field, value, reason in (
        ("selection", "sideways", "selection"),
        ("dcp_world_size", 2, "without DCP"),
        ("numeric", {"preset": "nope"}, "unknown preset"),
    ):
        bad = tmp_path / f"bad-{field}.json"
        bad.write_text(json.dumps({"kind": "sparse", **case.to_json(), field: value}))
        with pytest.raises(CaseError, match=reason):
            load_item_file(bad)
    assert PRESETS  # the presets the generator draws from exist
