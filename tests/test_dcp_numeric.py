"""DCP at L3 (issue 16): per-rank caches, upstream's DCP loop on every rank,
per_request's own DCP step bit for bit, the DCP mutants killed at L3 only, an
external port's DCP chunks, and ``parity diff``'s per-rank picture."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.cli import main
from harness.compare.bits import identical_bits
from harness.kernels import CpuKernels
from harness.kernels.context_chunks import planned_chunk_partials
from harness.kernels.numeric import case_prefill_inputs, materialise_rank_caches
from harness.model import PRESETS, Case, Layout
from harness.model.dcp import OneProcessRanks, global_positions, rank_context_len
from harness.protocol.port import Port
from harness.sides.items import PARITY
from harness.sides.runner import compare_case, compare_prefill
from ports.mutants import MUTANTS


def dcp_case(
    contexts: tuple[int, ...], world: int, interleave: int, workspace: int, block: int = 16, dtype: str = "bf16"
) -> Case:
    return Case(
        name=f"dcp-{world}x{interleave}",
        context_lens=contexts,
        query_lens=tuple(1 + i % 3 for i in range(len(contexts))),
        block_size=block,
        workspace_size=workspace,
        dcp_world_size=world,
        cp_kv_cache_interleave_size=interleave,
        numeric=dataclasses.replace(PRESETS["tiny"], dtype=dtype, seed=11),
    )


# A request continued over several chunks beside short and zero-context ones,
# worlds 2, 3 and 8, interleaves 1, 4 and 64 (a block of 64 rows), every dtype.
CASES = [
    dcp_case((300, 17, 0, 90), 3, 4, 96, dtype="fp16"),
    dcp_case((40, 0, 70), 2, 1, 64, dtype="fp32"),
    dcp_case((500, 33), 8, 1, 64, block=8),
    dcp_case((1182, 148, 0), 2, 64, 256, block=64, dtype="fp32"),
]


def test_each_rank_holds_exactly_its_rows() -> None:
    contexts, world, interleave, block = (70, 0, 33), 3, 4, 16
    spec = PRESETS["tiny"]
    caches = materialise_rank_caches(contexts, block, spec, world, interleave)
    # The same context under one rank: every row at its global position.
    (whole,) = materialise_rank_caches(contexts, block, spec, 1, 1)
    for request, context in enumerate(contexts):
        seen = torch.zeros(context, dtype=torch.int64)
        for rank, cache in enumerate(caches):
            held = rank_context_len(context, world, interleave, rank)
            positions = global_positions(held, world, interleave, rank)
            seen[positions] += 1
            local = torch.arange(held)
            rows = cache.kv_cache[cache.block_table[request].long()[local // block], local % block]
            reference = whole.kv_cache[whole.block_table[request].long()[positions // block], positions % block]
            assert identical_bits(rows, reference)
            # Past its own rows, within the padded window a gather may read: NaN.
            padded = -(-context // (world * interleave)) * interleave
            past = torch.arange(held, padded)
            assert cache.kv_cache[cache.block_table[request].long()[past // block], past % block].isnan().all()
        assert bool((seen == 1).all()), "every context row lives on exactly one rank"
    # Each rank shuffles its own blocks.
    assert len({tuple(c.block_table[0].tolist()) for c in caches}) > 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.name}-{c.numeric.dtype if c.numeric else ''}")
def test_per_request_is_bit_exact_on_dcp(oracle: Port, per_request: Port, case: Case) -> None:
    kernels = CpuKernels()
    assert compare_case(oracle, per_request, case).status == PARITY
    result = compare_prefill(oracle, per_request, case, kernels)
    assert result.status == PARITY and result.tensors and all(t.exact for t in result.tensors), result.error


def test_the_oracle_runs_every_rank_and_checks_they_agree(oracle: Port, monkeypatch: pytest.MonkeyPatch) -> None:
    import oracle.numeric as oracle_numeric

    case = CASES[0]
    ran: list[int] = []
    real = oracle_numeric._rank_prefill

    def counting(case: Case, inputs: object, kernels: object, rank: int) -> dict[str, torch.Tensor]:
        ran.append(rank)
        result = real(case, inputs, kernels, rank)  # type: ignore[arg-type]
        if rank == 2 and corrupt:
            result["lse"] = result["lse"].clone()
            result["lse"].view(torch.int32)[0, 0] += 1
        return result

    monkeypatch.setattr(oracle_numeric, "_rank_prefill", counting)
    corrupt = False
    oracle_numeric.prefill(case, case_prefill_inputs(case), CpuKernels())
    assert ran == [0, 1, 2]
    corrupt = True
    with pytest.raises(AssertionError, match="DCP rank 2's lse differs from rank 0's"):
        oracle_numeric.prefill(case, case_prefill_inputs(case), CpuKernels())


def test_one_process_all_gather_is_the_rank_major_concatenation() -> None:
    ranks = OneProcessRanks(3)
    gathered = ranks.all_gather(lambda rank: torch.full((2, 1), float(rank)))
    assert gathered.flatten().tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]


@pytest.mark.parametrize("name", ["dcp-reorder-context-order", "dcp-reorder-keeps-padding", "dcp-segment-uncapped"])
def test_dcp_mutants_are_killed_at_l3_only(oracle: Port, name: str) -> None:
    mutant = MUTANTS[name]()
    assert all(compare_case(oracle, mutant, case).status == PARITY for case in CASES)  # L1 cannot see it
    # L3 can, on a case whose inputs make the bug change a bit (a reordered sum of
    # few keys can round to the same fp16 values on one case and not on the next).
    assert any(compare_prefill(oracle, mutant, case, CpuKernels()).status != PARITY for case in CASES)


def test_external_dcp_chunks_follow_the_ports_fields(per_request: Port) -> None:
    """The harness gathers an external port's DCP chunks from its fields: a
    right layout gives the port's own partials bit for bit, a layout whose local
    window leaves the rank caches is refused before any kernel runs."""
    from ports.per_request.dcp import dcp_chunk_partial, dcp_device_chunks

    case = CASES[0]
    layout = per_request.plan_layout(case)
    inputs = case_prefill_inputs(case)
    kernels = CpuKernels()
    harness_side = planned_chunk_partials(layout, case, inputs, kernels)
    port_side = [dcp_chunk_partial(c, inputs, kernels) for c in dcp_device_chunks(layout, 3, inputs.q.device)]
    for (a_out, a_lse), (b_out, b_lse) in zip(harness_side, port_side, strict=True):
        assert identical_bits(a_out, b_out) and identical_bits(a_lse, b_lse)
    first = layout.chunks[0]
    assert first.local_starts is not None
    stray = dataclasses.replace(first, local_starts=(first.local_starts[0] + 10**6, *first.local_starts[1:]))
    with pytest.raises(ValueError, match="local window lies outside its cache"):
        planned_chunk_partials(Layout((stray, *layout.chunks[1:]), layout.empty_token_slices), case, inputs, kernels)


def test_diff_prints_the_per_rank_picture(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["diff", "cases/smoke/numeric-dcp3-interleave4.json", "--port", "mutant:dcp-reorder-context-order",
         "--level", "prefill"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 1
    assert "DCP picture (world 3, interleave 4): request 1" in out
    assert "The port's layout places the same rows" in out
    # Request 1 (17 rows over 3 ranks, 4 at a time): rank 1 holds 4-7 and 16.
    assert "rank 1: 5 rows -> context rows 4-7, 16 (3 padding rows dropped)" in out
    assert main(["diff", "cases/smoke/numeric-dcp3-interleave4.json", "--port", "per_request"]) == 0
    assert "DCP picture" not in capsys.readouterr().out


def test_the_picture_shows_a_port_layout_that_places_rows_otherwise(per_request: Port, equal_share: Port) -> None:
    """Where the port's layout cuts the request elsewhere (the legacy grid), its
    picture follows the oracle's; each names the rows of every rank."""
    from harness.compare.bits import compare_bits
    from harness.sides.items import DIVERGENT, CaseResult, Kind
    from reports.diff_text import format_rank_picture

    case = dcp_case((40, 70), 2, 1, 64)
    expected, legacy = per_request.plan_layout(case), equal_share.plan_layout(case)
    assert expected != legacy
    oracle_lse, port_lse = torch.zeros(2, 4), torch.zeros(2, 4)
    port_lse[0, 3] = 1.0  # token 3: request 1's
    result = CaseResult(case.name, case.family, Kind.PREFILL, DIVERGENT)
    result.tensors = [compare_bits("lse", oracle_lse, port_lse, ("head", "token"))]
    picture = format_rank_picture(case, expected, legacy, result)
    assert "request 1, which holds the first mismatching token 3" in picture
    assert "The port's layout places them so:" in picture
    # Request 1's 70 rows over 2 ranks one at a time: rank 1 holds the odd ones;
    # the oracle's first chunk takes 16 of them, the grid's 32.
    should, placed = picture.split("The port's layout places them so:")
    assert "rank 1: 8 rows -> context rows 1-15 in runs of 1 every 2 (0 padding rows dropped)" in should
    assert "rank 1: 16 rows -> context rows 1-31 in runs of 1 every 2 (0 padding rows dropped)" in placed
    assert format_rank_picture(case, expected, expected, result).endswith("reorders or folds them.")
