"""Mutant ports, the kill matrix and shrinking."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from harness.cases.suites import load_suite
from harness.cli import main
from harness.compare.bits import compare_bits
from harness.kernels import CpuKernels
from harness.kernels.numeric import MergeInputs
from harness.model import PRESETS, Case, WorkspaceConfig
from harness.protocol.port import Port
from harness.search.mutants import MutantRow, kill_matrix, render_matrix
from harness.search.shrink import checker, shrink
from harness.sides.items import DIVERGENT, LEVELS, PARITY, PORT_ERROR
from harness.sides.runner import compare_case, compare_prefill, compare_workspace, selected_item_ids
from ports.mutants import MUTANTS, fault_probe
from ports.mutants.conditions import CONDITION_MUTANTS
from tests.conftest import make_case

# The level at which each mutant's bug shows: the ci suite must kill it there.
KILL_LEVEL: dict[str, str] = {
    "legacy-grid": "layout",
    "finite-lse-empty-rows": "prefill",
    # Its grid diverges at L1 like equal_share's; the kill that counts is L3 (its docstring).
    "equal-share-no-neutralise": "prefill",
    "workspace-floor": "layout",
    "continuation-whole-chunk": "layout",
    "continuation-wrong-request": "layout",
    "unaligned-split": "layout",
    "split-takes-remainder": "layout",
    "zero-context-joins-run": "layout",
    "dcp-padding-no-interleave": "layout",
    "merge-lse-swapped": "merge",
    "merge-in-bf16": "merge",
    "query-start-not-rebased": "layout",
    # Issue 12.
    "token-to-seq-uint8": "layout",
    "dcp-token-to-seq-int8": "layout",
    "dcp-local-starts-int16": "layout",
    "request-index-int16": "layout",
    "device-token-to-seq-uint8": "prefill",
    "workspace-int32": "layout",
    "align-max-not-lcm": "layout",
    "round-down-by-mask": "layout",
    "dcp-padded-by-shift": "layout",
    "dcp-rank-lens-by-mask": "layout",
    "workspace-round-then-cap": "layout",
    "merge-skip-zero-weight-side": "merge",
    "merge-drop-below-fp32-eps": "merge",
    "merge-lse-token-stride-one": "merge",
    "merge-tokens-with-context-falsy": "merge",
    "continuation-merges-previous-chunk": "prefill",
    # Issue 16: the DCP step of a chunk.
    "dcp-reorder-context-order": "prefill",
    "dcp-reorder-keeps-padding": "prefill",
    "dcp-segment-uncapped": "prefill",
    # Issue 28: the sparse path (their small items: tests/test_sparse.py).
    "sparse-workspace-floor": "sparse-layout",
    "sparse-route-lt-topk": "sparse-layout",
    "sparse-mask-no-reserved-word": "sparse-layout",
    "sparse-remap-keeps-end": "sparse-mask",
    "sparse-remap-request-start": "sparse-mask",
    "sparse-mask-msb-first": "sparse-mask",
    # Issue 29: the masked prefill loop (their items: tests/test_sparse_prefill.py).
    "sparse-l3-whole-query": "sparse-prefill",
    "sparse-l3-suffix-by-query-start": "sparse-prefill",
    "sparse-l3-global-mask-no-key-starts": "sparse-prefill",
    "sparse-l3-keyless-zero-weight": "sparse-prefill",
    "sparse-l3-fold-last-first": "sparse-prefill",
    "sparse-l3-chunk-first-start": "sparse-prefill",
    # Issue 44: a selection bug seen only where a token's top-k row is full (ci's sparse-l3-rows).
    "sparse-l3-drops-last-slot": "sparse-prefill",
}
# The sparse mutants' aimed-at classes have their items in tests/test_sparse.py.
SPARSE_AIMED = {name for name, level in KILL_LEVEL.items() if level.startswith("sparse-")}
# One mutant per condition of the declared decisions: the items that kill them are
# their conditions' MC/DC pairs, and ci's kill matrix for them runs in
# tests/test_mcdc_mutants.py (the smoke suite holds no such pairs).
CONDITION_NAMES = {m.name for m in CONDITION_MUTANTS}
KILL_LEVEL.update(
    {m.name: "layout" if m.conditions[0][0].startswith("dense.") else "sparse-layout" for m in CONDITION_MUTANTS}
)
SMOKE_MUTANTS = [name for name in MUTANTS if name not in CONDITION_NAMES]

# -- issue 12: one small item of the input class each new mutant is aimed at --------------------
# per_request is exact on every one of them and the mutant is not, so each mutant
# is killable by the class its ``aimed_at`` names, whether or not a suite holds it.

LAYOUT_KILLS: dict[str, Case] = {
    "token-to-seq-uint8": make_case([1] * 300, [1] * 300, block_size=1, workspace_size=512),
    "dcp-token-to-seq-int8": make_case([1] * 200, [1] * 200, dcp_world_size=2, workspace_size=4096),
    "dcp-local-starts-int16": make_case([100000], [1], dcp_world_size=2, workspace_size=65536),
    "request-index-int16": make_case([0] * 32999 + [5], [1] * 33000, workspace_size=512),
    "align-max-not-lcm": make_case([1000], [1], dcp_world_size=3, workspace_size=500),
    "round-down-by-mask": make_case([2000], [1], block_size=528, workspace_size=1584),
    "dcp-padded-by-shift": make_case([100, 50], [1, 1], dcp_world_size=3, workspace_size=480),
    "dcp-rank-lens-by-mask": make_case([100, 50], [1, 1], dcp_world_size=3, workspace_size=480),
}

WORKSPACE_KILLS: dict[str, WorkspaceConfig] = {
    "workspace-int32": WorkspaceConfig(max_model_len=1 << 28, max_num_seqs=1, block_size=16),
    "workspace-round-then-cap": WorkspaceConfig(max_model_len=163840, max_num_seqs=1, block_size=528),
    "align-max-not-lcm": WorkspaceConfig(2048, 1, 16, dcp_world_size=3, cp_kv_cache_interleave_size=1),
}

TINY = PRESETS["tiny"]
PREFILL_KILLS: dict[str, Case] = {
    "device-token-to-seq-uint8": make_case(
        [1] * 260, [1] * 260, block_size=1, workspace_size=512, numeric=dataclasses.replace(TINY, seed=1)
    ),
    "continuation-merges-previous-chunk": make_case(
        [100], [3], workspace_size=32, numeric=dataclasses.replace(TINY, seed=2, dtype="fp32")
    ),
    # Issue 16: one chunk, one request, its rows on both ranks.
    "dcp-reorder-context-order": make_case(
        [40], [3], workspace_size=64, dcp_world_size=2, numeric=dataclasses.replace(TINY, seed=3, dtype="fp32")
    ),
    # One chunk: 17 rows over 3 ranks 4 at a time, padded to 8 a rank; rank 2 holds 4.
    "dcp-reorder-keeps-padding": make_case(
        [17], [2], workspace_size=48, dcp_world_size=3, cp_kv_cache_interleave_size=4, numeric=TINY
    ),
    # One request continued over several chunks.
    "dcp-segment-uncapped": make_case([300], [2], workspace_size=64, dcp_world_size=2, numeric=TINY),
}

NEG_INF = float("-inf")


def _zero_weight_sides() -> MergeInputs:
    """A side of weight exactly 0 with a positive output against a -0.0 output: the
    reference's ``x * 0 + -0.0`` is +0.0, the kept side alone -0.0. Token 0: the
    prefix's LSE is -inf; token 1: the suffix's is 110 below (exp underflows to 0).
    (An inf or NaN output on the zero side tells too, but the reference's NaN
    there makes no item parity, so suites cannot hold it.)"""
    prefix = torch.full((2, 1, 128), 0.75)
    suffix = torch.full((2, 1, 128), -0.0)
    prefix[1], suffix[1] = -0.0, 0.75
    return MergeInputs(prefix, torch.tensor([[NEG_INF, 0.0]]), suffix, torch.tensor([[1.0, -110.0]]), None)


def _gap_in_fp32_band() -> MergeInputs:
    """LSEs 16.3 apart, either side the weaker, the larger 0.5."""
    values = torch.randn((2, 1, 128), generator=torch.Generator().manual_seed(1))
    lse = torch.tensor([[0.5, 0.5 - 16.3]])
    return MergeInputs(values, lse, values.flip(0).clone(), lse.flip(1).clone(), None)


def _transposed_lse() -> MergeInputs:
    """LSEs as ``[tokens, heads]`` buffers seen through ``.T`` (token stride = heads)."""
    g = torch.Generator().manual_seed(2)
    prefix_lse, suffix_lse = torch.randn((4, 3), generator=g).T, torch.randn((4, 3), generator=g).T
    return MergeInputs(torch.randn((4, 3, 128), generator=g), prefix_lse, torch.randn((4, 3, 128), generator=g),
                       suffix_lse, None)  # fmt: skip


def _no_token_with_context() -> MergeInputs:
    g = torch.Generator().manual_seed(3)
    return MergeInputs(torch.randn((3, 2, 128), generator=g), torch.randn((2, 3), generator=g),
                       torch.randn((3, 2, 128), generator=g), torch.randn((2, 3), generator=g), 0)  # fmt: skip


MERGE_KILLS: dict[str, Callable[[], MergeInputs]] = {
    "merge-skip-zero-weight-side": _zero_weight_sides,
    "merge-drop-below-fp32-eps": _gap_in_fp32_band,
    "merge-lse-token-stride-one": _transposed_lse,
    "merge-tokens-with-context-falsy": _no_token_with_context,
}


def test_catalogue() -> None:
    assert len(MUTANTS) >= 22
    assert {"legacy-grid", "finite-lse-empty-rows", "workspace-floor", "equal-share-no-neutralise"} <= set(MUTANTS)
    for mutant in MUTANTS.values():
        assert mutant.description and mutant.source
    # Every mutant names the level its bug shows at; every issue-12 mutant names its input class and has an item of it.
    assert set(KILL_LEVEL) == set(MUTANTS) and set(KILL_LEVEL.values()) <= set(LEVELS)
    aimed = {name for name, mutant in MUTANTS.items() if mutant.aimed_at}
    assert len(aimed) >= 10
    assert (
        aimed
        == set(LAYOUT_KILLS)
        | set(WORKSPACE_KILLS)
        | set(PREFILL_KILLS)
        | set(MERGE_KILLS)
        | SPARSE_AIMED
        | CONDITION_NAMES
    )
    assert all(m.conditions for m in CONDITION_MUTANTS)


@pytest.mark.parametrize("name", sorted(LAYOUT_KILLS))
def test_layout_mutant_dies_on_its_class(oracle: Port, per_request: Port, name: str) -> None:
    case = LAYOUT_KILLS[name]
    assert compare_case(oracle, per_request, case).status == PARITY
    assert compare_case(oracle, MUTANTS[name](), case).status == DIVERGENT


@pytest.mark.parametrize("name", sorted(WORKSPACE_KILLS))
def test_workspace_mutant_dies_on_its_class(oracle: Port, per_request: Port, name: str) -> None:
    config = WORKSPACE_KILLS[name]
    assert compare_workspace(oracle, per_request, config).status == PARITY
    assert compare_workspace(oracle, MUTANTS[name](), config).status == DIVERGENT


@pytest.mark.parametrize("name", sorted(PREFILL_KILLS))
def test_prefill_mutant_dies_on_its_class(oracle: Port, per_request: Port, name: str) -> None:
    case = PREFILL_KILLS[name]
    assert compare_prefill(oracle, per_request, case, CpuKernels()).status == PARITY
    assert compare_prefill(oracle, MUTANTS[name](), case, CpuKernels()).status in (DIVERGENT, PORT_ERROR)


def _merge_exact(oracle: Port, port: Port, inputs: Callable[[], MergeInputs]) -> bool:
    expected, got = oracle.merge_states(inputs()), port.merge_states(inputs())  # type: ignore[attr-defined]
    axes = (("token", "head", "dim"), ("head", "token"))
    return all(
        compare_bits(n, a, b, ax).exact for n, a, b, ax in zip(("output", "lse"), expected, got, axes, strict=True)
    )


@pytest.mark.parametrize("name", sorted(MERGE_KILLS))
def test_merge_mutant_dies_on_its_class(oracle: Port, per_request: Port, name: str) -> None:
    assert _merge_exact(oracle, per_request, MERGE_KILLS[name])
    assert not _merge_exact(oracle, MUTANTS[name](), MERGE_KILLS[name])


def test_mutants_leave_the_real_port_untouched(oracle: Port, per_request: Port) -> None:
    """A mutant swaps functions only during its own calls."""
    suite = load_suite("smoke")
    for mutant in MUTANTS.values():
        for case in suite.cases[:5]:
            try:
                mutant().plan_layout(case)
            except (ValueError, AssertionError):
                # The legacy grid cannot plan some batches, and a planning mutant can
                # leave the planner without progress: the swap must still be undone.
                pass
    assert all(compare_case(oracle, per_request, case).status == PARITY for case in suite.cases)


# The smoke suite stays small: these need a batch of more than 32,768 requests or
# the wide workspace grid (formula intermediates past 2^31, block 528), or top-k
# rows full to their last slot at L3 (the sparse-l3-rows family), which ci holds.
SMOKE_SURVIVORS = {"request-index-int16", "workspace-int32", "workspace-round-then-cap", "sparse-l3-drops-last-slot"}


# The kill matrices are split so pytest-xdist spreads them over its workers; the
# oracle's answers are computed once, in the shared oracle cache.
SMOKE_GROUPS = 4


def smoke_kill(oracle: Port, name: str) -> tuple[str, MutantRow] | None:
    """The mutant's first kill on the smoke suite and its level: the level its bug
    shows at (:data:`KILL_LEVEL`) searched first, then the others in order; None
    when no level kills it (every item of every level ran, as a full matrix runs them)."""
    suite = load_suite("smoke")
    for level in (KILL_LEVEL[name], *(lv for lv in LEVELS if lv != KILL_LEVEL[name])):
        [row] = kill_matrix(oracle, [MUTANTS[name]()], suite, (level,), CpuKernels())
        assert row.name == name and not row.timed_out[level], (name, level)
        if row.killed:
            return level, row
    return None


@pytest.mark.parametrize("group", range(SMOKE_GROUPS))
def test_smoke_kills_every_mutant_but_the_wide_ones(cached_oracle: Port, group: int) -> None:
    """The documented claim: the smoke suite kills every mutant in the catalogue but
    the per-condition ones (ci's MC/DC pairs kill those: tests/test_mcdc_mutants.py)
    and :data:`SMOKE_SURVIVORS`, and those do survive it, at every level (so the list
    cannot go stale). Each of :data:`SMOKE_GROUPS` tests holds every SMOKE_GROUPS-th
    mutant; a mutant stops at its first kill (:func:`smoke_kill`)."""
    names = SMOKE_MUTANTS[group::SMOKE_GROUPS]
    kills = {name: smoke_kill(cached_oracle, name) for name in names}
    assert {name for name, kill in kills.items() if kill is None} == SMOKE_SURVIVORS & set(names)
    # Four kills the docs name, each at the level its mutant's bug shows at.
    named = {
        "finite-lse-empty-rows": "prefill",  # only numbers can see it
        "merge-in-bf16": "merge",
        "legacy-grid": "layout",
        "equal-share-no-neutralise": "prefill",
    }
    for name in set(named) & set(names):
        found = kills[name]
        assert found is not None and found[0] == named[name], (name, found)
    if "equal-share-no-neutralise" in kills:
        # Killed at L3 on a case where equal_share itself is bit-exact (tests/test_keyless_rows.py).
        found = kills["equal-share-no-neutralise"]
        assert found is not None
        kill = found[1].kills["prefill"]
        assert kill is not None and kill.item == "smoke-keyless-finite[prefill]"


def test_the_smoke_groups_hold_every_mutant_once() -> None:
    groups = [SMOKE_MUTANTS[g::SMOKE_GROUPS] for g in range(SMOKE_GROUPS)]
    assert sorted(n for g in groups for n in g) == sorted(set(MUTANTS) - CONDITION_NAMES)


def test_every_mutant_has_the_level_that_sees_it() -> None:
    assert len(MUTANTS) >= 22 and set(KILL_LEVEL) == set(MUTANTS)


@pytest.mark.parametrize("level", LEVELS)
def test_ci_kills_every_mutant(cached_oracle: Port, level: str) -> None:
    """The ci suite kills every mutant in the catalogue, not most, at the level its
    bug shows (:data:`KILL_LEVEL`; one test per level, and every mutant has one),
    and the kill matrix names the item that killed each: an item of the ci suite
    at that level. At the layout level the search is guided by the reach pass, as
    ``parity mutants`` searches by default: four of its mutants die only on the
    workspace items or the wide batches, after thousands of layout items the
    guided search skips; a guided kill is one the exhaustive search makes too
    (tests/test_mutant_reach.py holds that the pass changes no kill). At the
    other levels every mutant dies early and the search is exhaustive."""
    suite = load_suite("ci")
    named = [name for name, at in KILL_LEVEL.items() if at == level and name not in CONDITION_NAMES]
    mutants = [MUTANTS[name]() for name in named]
    probe = fault_probe if level == "layout" else None
    rows = kill_matrix(cached_oracle, mutants, suite, (level,), CpuKernels(), probe=probe)
    assert sorted(r.name for r in rows) == sorted(named)
    assert [r.name for r in rows if not r.killed] == []
    items = set(selected_item_ids(suite, LEVELS))
    matrix = render_matrix(rows, (level,), suite.name)
    for row in rows:
        kill = row.kills[level]
        assert kill is not None and kill.status in (DIVERGENT, PORT_ERROR), row.name
        assert kill.item in items and f"`{kill.item}`" in matrix, row.name


def test_mutants_command_writes_matrix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["mutants", "--suite", "smoke", "--only", "query-start-not-rebased,workspace-floor",
                 "--level", "layout", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "2/2 mutants killed" in out
    matrix = (tmp_path / "kill-matrix.md").read_text()
    assert "shrunk:" in matrix and (tmp_path / "kill-matrix.json").exists()
    assert (tmp_path / "shrunk" / "query-start-not-rebased-layout.json").exists()


def test_shrink_keeps_level_and_field(oracle: Port, equal_share: Port) -> None:
    case = next(c for c in load_suite("smoke").cases if c.name == "smoke-upstream-worst-case")
    check = checker(oracle, equal_share, "layout")
    before = check(case)
    outcome = shrink(case, check)
    assert outcome.result.divergence is not None and before.divergence is not None
    assert outcome.result.divergence.field == before.divergence.field
    assert outcome.case.num_requests <= 2 and sum(outcome.case.context_lens) < 100
    assert outcome.case.workspace_size <= 64


def test_shrink_command_writes_a_case_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "small.json"
    code = main(["shrink", "smoke-numeric-continuation-zero", "--port", "mutant:finite-lse-empty-rows",
                 "--level", "prefill", "--budget", "80", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 1 and out.exists() and "still divergent" in printed
    assert main(["diff", str(out), "--port", "mutant:finite-lse-empty-rows", "--level", "prefill"]) == 1
    assert "L3 prefill: DIVERGENT" in capsys.readouterr().out
