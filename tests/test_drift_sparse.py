"""The drift watch at the sparse levels, without a second release installed.

As in tests/test_drift.py, the "release" is the pinned oracle made to differ:
a sparse layout whose route flips, a mask padded as 0.33.0 pads its words, a
remap that moves one index, a refusal only one side makes; the per-level
symbol attribution and the report are checked on fake traces.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness.cases.suites import Suite, load_suite
from harness.kernels import kernels_for
from harness.model import Case, Layout, WorkspaceConfig
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig, TopkMaskCase
from harness.night.drift import (
    BOTH_REFUSE,
    CHANGED,
    LAYOUT_ONLY,
    MISSING,
    NEW,
    PINNED_ERROR,
    RELEASE_ERROR,
    UNCHANGED,
    SourceSnapshot,
    SymbolDrift,
    compare_oracles,
    error_class,
    item_drift,
    level_symbol_drift,
    read_trace,
    release_record,
    transcribed_levels,
)
from harness.night.drift_items import mask_drift
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, NOT_RUN, PARITY, CaseResult, Kind
from oracle.pin import MLA, SPARSE, TRANSCRIBED, load_pin
from reports.drift_report import examples, render_markdown

SPARSE_LEVELS = ("sparse-layout", "sparse-mask", "sparse-prefill")


class Wrapped:
    """The pinned oracle's dense answers, as every side owes them."""

    name = "wrapped oracle"

    def __init__(self, oracle: Port) -> None:
        self.oracle = oracle

    def plan_layout(self, case: Case) -> Layout:
        return self.oracle.plan_layout(case)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return self.oracle.workspace_size(config)


class RouteFlippingRelease(Wrapped):
    """The pinned oracle's sparse path, except that every masked-MHA batch goes
    the sparse MQA way (threshold said no), and DCP sparse workspaces are refused."""

    name = "fake sparse release"
    levels = ("sparse-layout",)

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        layout: SparseLayout = self.oracle.plan_sparse(case)  # type: ignore[attr-defined]
        if layout.route != "masked-mha":
            return layout
        return replace(layout, masked_threshold=False, use_masked_mha=False, route="mqa")

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        if config.dcp_world_size > 1:
            raise ValueError(f"no DCP here (world {config.dcp_world_size})")
        return int(self.oracle.sparse_workspace_size(config))  # type: ignore[attr-defined]


def _sparse_suite() -> Suite:
    smoke = load_suite("smoke")
    return Suite(
        "small-sparse",
        (),
        (),
        sparse_cases=smoke.sparse_cases[:25],
        sparse_workspace_configs=smoke.sparse_workspace_configs[:40],
    )


def test_sparse_layouts_name_every_changed_decision_and_both_routes(oracle: Port) -> None:
    suite = _sparse_suite()
    level = compare_oracles(oracle, RouteFlippingRelease(oracle), suite, ("sparse-layout",), kernels_for("cpu"))[
        "sparse-layout"
    ]
    plans = [oracle.plan_sparse(c) for c in suite.sparse_cases]  # type: ignore[attr-defined]
    masked = [p for p in plans if p.route == "masked-mha"]
    dcp = sum(1 for w in suite.sparse_workspace_configs if w.dcp_world_size > 1)
    assert masked and dcp and len(masked) < len(plans)  # the suite exercises every branch
    counts = level.counts()
    assert counts[DIVERGENT] == len(masked) and counts[RELEASE_ERROR] == dcp
    assert counts[PARITY] == len(plans) - len(masked) + len(suite.sparse_workspace_configs) - dcp
    # Every field that differs, not only the first (a forced masked route may
    # have had neither the threshold nor the whole condition).
    flipped = {name: sum(1 for p in masked if getattr(p, name)) for name in ("masked_threshold", "use_masked_mha")}
    assert level.changed() == {"route": len(masked)} | {k: n for k, n in flipped.items() if n}
    assert level.routes()["masked-mha -> mqa"] == len(masked)
    assert sum(level.routes().values()) == len(plans)
    divergent = [i for i in level.items if i.status == DIVERGENT]
    assert all(i.routes == ("masked-mha", "mqa") and "route 'masked-mha' -> 'mqa'" in i.detail for i in divergent)
    if flipped["masked_threshold"]:
        assert any("masked_threshold True -> False" in i.detail for i in divergent)
    record = level.to_json()
    assert record["routes"]["masked-mha -> mqa"] == len(masked)
    assert record["error_classes"] == {RELEASE_ERROR: {"ValueError: no DCP here (world N)": dcp}}


class SparseRefusingOracle(Wrapped):
    """A pinned side that refuses the sparse batches of an odd number of requests."""

    name = "refusing sparse oracle"

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        if len(case.query_lens) % 2:
            raise ValueError(f"{len(case.query_lens)} requests")
        return self.oracle.plan_sparse(case)  # type: ignore[attr-defined, no-any-return]

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        return int(self.oracle.sparse_workspace_size(config))  # type: ignore[attr-defined]


def test_a_sparse_refusal_is_asked_of_the_release_too(oracle: Port) -> None:
    suite = replace(_sparse_suite(), sparse_workspace_configs=())
    odd = sum(1 for c in suite.sparse_cases if len(c.query_lens) % 2)
    assert 0 < odd < len(suite.sparse_cases)
    refusing = SparseRefusingOracle(oracle)
    both = compare_oracles(refusing, refusing, suite, ("sparse-layout",), kernels_for("cpu"))["sparse-layout"]
    assert both.counts()[BOTH_REFUSE] == odd and both.verdict() == "parity"
    only = compare_oracles(refusing, oracle, suite, ("sparse-layout",), kernels_for("cpu"))["sparse-layout"]
    assert only.counts()[PINNED_ERROR] == odd and only.verdict() == f"{odd} pinned-error"


def test_a_refusal_served_by_a_process_is_the_same_class() -> None:
    from oracle.legacy import LegacyRefusal
    from oracle.sparse_prefill import RouteNotCompared

    reason = "its sparse prefill cannot run: it routes the batch masked-mha-overflow"
    pinned = error_class(f"RouteNotCompared: {reason}")
    assert pinned == error_class(f"OracleRefusal: vllm==0.33.0: {reason}") == reason
    # The class names folded away are exactly the refusals a side marks as such.
    assert RouteNotCompared.refusal is True and LegacyRefusal.refusal is True
    assert error_class("OracleProcessError: vllm==0.33.0: ValueError: 3 rows") == "ValueError: N rows"


class FakeMaskSide:
    """Answers one mask and one remap as given."""

    def __init__(self, mask: torch.Tensor, remap: list[torch.Tensor]) -> None:
        self.mask, self.remap = mask, remap

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        return self.mask.clone()

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t.clone() for t in self.remap]


def _mask_case(form: str) -> TopkMaskCase:
    key_starts = (5,) if form == "global" else ()
    return TopkMaskCase("fake-mask", (2,), (40,), 4, form, "mixed", 1, (0,), (40,), key_starts)


def _sides(pinned_mask: torch.Tensor, release_mask: torch.Tensor, moved: bool = False) -> tuple[Any, Any]:
    remap = [torch.tensor([[0, 3, -1, 7], [1, 2, 3, -1]], dtype=torch.int32)]
    release_remap = [remap[0].clone()]
    if moved:
        release_remap[0][1, 2] = -1
    return FakeMaskSide(pinned_mask, remap), FakeMaskSide(release_mask, release_remap)


def test_mask_and_remap_are_compared_apart_as_bits() -> None:
    words = torch.arange(1, 1 + 128 * 2, dtype=torch.int32).reshape(1, 128, 2)
    flipped = words.clone()
    flipped[0, 1, 0] ^= 1 << 31
    pinned, release = _sides(words, flipped, moved=True)
    changed, detail = mask_drift(pinned, release, _mask_case("single"))
    assert changed == ["mask", "remap"]
    assert "mask: 1/256 int32 words differ; first at mask[request 0, query row 1, word 0]" in detail
    assert "remap: 1/8 indices differ; first at remapped[request 0, query row 1, slot 2]" in detail
    pinned, release = _sides(words, words, moved=True)
    assert mask_drift(pinned, release, _mask_case("single"))[0] == ["remap"]


def test_a_mask_padded_to_more_words_is_compared_where_both_hold_keys() -> None:
    # 0.33.0 rounds a mask's words up to a multiple of 4; the global form's
    # key-starts word stays the last one.
    keys = torch.arange(1, 1 + 128 * 2, dtype=torch.int32).reshape(1, 128, 2)
    starts = torch.full((1, 128, 1), 5, dtype=torch.int32)
    pinned = torch.cat([keys, starts], dim=2)
    padded = torch.cat([keys, torch.zeros(1, 128, 1, dtype=torch.int32), starts], dim=2)
    changed, detail = mask_drift(*_sides(pinned, padded), _mask_case("global"))
    assert changed == ["mask_shape"]
    assert detail == (
        "mask shape (1, 128, 3) -> (1, 128, 4): key words 0/256 differ, key-starts word 0/128 differ, "
        "the release's 1 padding words per row 0 nonzero"
    )
    padded[0, 3, 2] = 9  # a padding word set, and a key bit moved
    padded[0, 0, 1] ^= 4
    changed, detail = mask_drift(*_sides(pinned, padded), _mask_case("global"))
    assert changed == ["mask_shape", "mask"]
    assert "key words 1/256 differ" in detail and "1 nonzero" in detail


def test_a_padded_mask_through_the_runner(oracle: Port) -> None:
    """One real (global) mask item: the runner calls it divergent on its shape,
    the drift names the shape alone, its bits being the pinned release's."""
    from oracle.trace import mask_cases

    case = next(c for c in mask_cases() if c.form == "global")

    class PaddingRelease(Wrapped):
        name, levels = "padding release", ("sparse-mask",)

        def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
            mask = oracle.build_topk_mask(case, topk)  # type: ignore[attr-defined]
            pad = torch.zeros(*mask.shape[:2], 1, dtype=mask.dtype)
            return torch.cat([mask[:, :, :-1], pad, mask[:, :, -1:]], dim=2)

        def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
            return oracle.remap_topk(case, topk)  # type: ignore[attr-defined, no-any-return]

    suite = Suite("one-mask", (), (), mask_cases=(case,))
    level = compare_oracles(oracle, PaddingRelease(oracle), suite, ("sparse-mask",), kernels_for("cpu"))["sparse-mask"]
    (item,) = level.items
    assert item.status == DIVERGENT and item.changed == ["mask_shape"]
    assert "key words 0/" in item.detail and "key-starts word 0/" in item.detail


def test_a_batch_both_route_to_mqa_is_compared_at_sparse_layout_only() -> None:
    result = CaseResult(
        "b", "sparse-route", Kind.SPARSE_PREFILL, NOT_RUN, error="the oracle routes it mqa: compared at"
    )

    def release(route: str) -> Any:
        return SimpleNamespace(plan_sparse=lambda case: SimpleNamespace(route=route))

    kernels = kernels_for("cpu")
    same = item_drift(result, release("mqa"), release("mqa"), None, kernels, "cpu")
    assert same.status == LAYOUT_ONLY and same.routes == ("mqa", "mqa")
    moved = item_drift(result, release("mqa"), release("masked-mha"), None, kernels, "cpu")
    assert moved.status == DIVERGENT and moved.changed == ["route"] and moved.routes == ("mqa", "masked-mha")


# -- where, per level ------------------------------------------------------------------------


def _drift(symbol: str, status: str) -> SymbolDrift:
    return SymbolDrift(symbol, status, None, None)


def test_each_sparse_level_names_its_symbols_from_both_traces() -> None:
    mask, topk_shape, gone, added, kept = (f"{SPARSE}:{n}" for n in ("_build", "_shape", "_gone", "_added", "_kept"))
    pinned_trace = {mask: ["sparse-mask", "sparse-prefill"], topk_shape: ["sparse-layout"], gone: ["sparse-prefill"]}
    release_trace = {mask: ["sparse-mask"], added: ["sparse-layout", "sparse-prefill"], kept: ["workspace"]}
    forward, build = TRANSCRIBED
    status = {mask: CHANGED, topk_shape: UNCHANGED, gone: MISSING, added: NEW, kept: UNCHANGED, forward: CHANGED}
    from harness.night.drift import level_symbols

    pinned, release = level_symbols(pinned_trace), level_symbols(release_trace)
    assert release["layout"] == [kept]  # the dense workspace size is the layout level's
    layout = level_symbol_drift("sparse-layout", status, pinned, release)
    assert layout["symbols_executed"] == 2 and layout["symbols_executed_release"] == 1
    assert layout["symbols_drifted"] == [] and layout["symbols_new"] == [added]
    # Transcribed code: no trace enters it; its status is reported, "not read" without one.
    assert layout["symbols_transcribed"][forward] == CHANGED and layout["symbols_transcribed"][build] == "not read"
    prefill = level_symbol_drift("sparse-prefill", status, pinned, release)
    assert prefill["symbols_drifted"] == [mask, gone] and prefill["symbols_new"] == [added]
    masks = level_symbol_drift("sparse-mask", status, pinned, None)
    assert masks["symbols_drifted"] == [mask] and "symbols_transcribed" not in masks
    assert "symbols_executed_release" not in masks
    assert set(transcribed_levels()) >= set(TRANSCRIBED)
    assert f"{MLA}:MLAAttention._use_sparse_mha" in transcribed_levels()


def test_the_report_renders_the_sparse_levels(oracle: Port, tmp_path: Path) -> None:
    suite = _sparse_suite()
    levels = compare_oracles(oracle, RouteFlippingRelease(oracle), suite, ("sparse-layout",), kernels_for("cpu"))
    snapshot = SourceSnapshot(
        {"vllm_version": "9.0.0", "vllm_commit": "g0", "torch_version": "9.9"}, {}, {}, {}, {}, {}
    )
    symbol = f"{SPARSE}:_shape"
    drifts = [_drift(symbol, CHANGED), _drift(TRANSCRIBED[0], CHANGED)]
    record = release_record(
        snapshot, snapshot, drifts, levels, {}, {symbol: ["sparse-layout"]}, {symbol: ["sparse-layout"]}
    )
    text = render_markdown(
        {
            "date": "2000-01-02",
            "pin": {
                "release": "vllm==0.28.0",
                "upstream_commit": "c",
                "upstream_pr": "p",
                "vllm_version": "0.28.0",
                "vllm_commit": "g",
                "torch_version": "9.9",
            },
            "suite": suite.name,
            "levels": ["sparse-layout"],
            "releases": [record],
        }
    )
    assert "| sparse-layout (+ sparse workspace size) |" in text
    assert "changed or missing in the release: `sparse_mla_attention:_shape`." in text
    assert "transcribed, not called" in text and "`mla_attention:MLAAttention.forward_impl` changed" in text
    assert "routes changed (pinned -> release): masked-mha -> mqa (" in text
    assert "[masked_threshold, use_masked_mha, route]" in text  # each listed item names its changed fields
    assert "DeepSeek-V3.2's heads (qk 192, v 128)" in text


def test_examples_show_every_kind_of_change_first() -> None:
    items = [{"status": DIVERGENT, "changed": ["a"], "id": i} for i in range(30)]
    items.insert(25, {"status": DIVERGENT, "changed": ["b"], "id": "b"})
    items.append({"status": RELEASE_ERROR, "changed": [], "id": "err"})
    shown = examples(items, limit=5)
    assert [i["id"] for i in shown] == [0, 1, 2, "b", "err"]
    assert examples(items[:2]) == items[:2]


# -- the releases' own side ---------------------------------------------------------------


def test_the_newest_release_pin_covers_the_sparse_path() -> None:
    """oracle/pins/vllm-0.33.0.json (python -m oracle.release_pin --write-pin in its
    environment) holds every sparse symbol the pin holds, and the transcribed code."""
    newest = load_pin(Path(__file__).resolve().parents[1] / "oracle" / "pins" / "vllm-0.33.0.json")
    sparse = {s for s in load_pin()["fingerprints"] if s.startswith(f"{SPARSE}:")}
    assert len(sparse) >= 15
    assert sparse <= set(newest["fingerprints"])
    assert {*TRANSCRIBED, f"{MLA}:MLAAttention._use_sparse_mha"} <= set(newest["fingerprints"])


def test_release_pin_refuses_the_pinned_release_and_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from oracle.release_pin import USAGE, main, release_pin

    assert main(["--trace"]) == 2 and main([]) == 2
    assert capsys.readouterr().err.count(USAGE) == 2
    with pytest.raises(ValueError, match="is the pinned release"):
        release_pin()


def test_a_trace_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    from harness.night.drift import DriftError

    with pytest.raises(DriftError, match=r"-m oracle\.release_pin: FileNotFoundError"):
        read_trace(tmp_path / "no-python")
