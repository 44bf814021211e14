"""``parity coverage``: what a suite exercises, its targets, verdicts and exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness.cases.suites import Suite, load_suite, suite_names
from harness.cli import main
from harness.kernels.numeric import materialise_merge
from harness.model import PRESETS, Case, MergeCase, WorkspaceConfig
from harness.model.sparse import SparseCase, SparseWorkspaceConfig
from harness.night.data import Night
from harness.protocol.port import Port
from harness.search.coverage import FEATURES, REFUSAL_FEATURES, CoverageReport
from harness.search.coverage_measuring import lse_view, measure, oracle_chunks, value_view
from harness.search.coverage_targets import TARGETS_FILE, Target, load_targets
from harness.search.coverage_verdicts import JudgedCoverage, judge
from harness.sides.oracle_cache import CachedOracle
from reports.coverage import render_markdown, render_text
from reports.nightly import render_html
from reports.nightly import render_markdown as night_markdown

LONG = Case("long", (70000, 5, 0, 300), (3, 2, 4, 1), block_size=16, workspace_size=1024)
# lcm(16, 3*4) = 48 is not max(16, 12) = 16: an lcm/max disagreement.
DCP = Case("dcp", (500, 17), (1, 1), 16, 192, dcp_world_size=3, cp_kv_cache_interleave_size=4)
ODD_BLOCK = Case("odd", (2000, 1), (1, 1), 528, 1056, align_to_block=False)
NUMERIC = Case("numeric", (100, 0, 40), (2, 1, 3), 16, 32, numeric=PRESETS["tiny"])
# 528 does not divide 65536 and the dense size is past the cap, so rounding up to
# the alignment before or after capping gives different sizes; 16 divides 65536.
ODD_CONFIG = WorkspaceConfig(163840, 256, 528, 3, 16)
PLAIN_CONFIG = WorkspaceConfig(2048, 1, 16)
MERGES = (
    MergeCase("m-none", 6, 3, 128, "bf16", "mixed", 11),
    MergeCase("m-all", 5, 2, 96, "fp32", "mixed", 12, prefill_tokens_with_context=5),
)
SPARSE = SparseCase("sparse", (3000, 0), (600, 5), 16, 163840, 256, 2048, tensor_parallel_size=8)
SPARSE_CONFIG = SparseWorkspaceConfig(163840, 4, 64, 2048)
SYNTHETIC = Suite(
    "synthetic",
    (LONG, DCP, ODD_BLOCK, NUMERIC),
    (ODD_CONFIG, PLAIN_CONFIG),
    MERGES,
    sparse_cases=(SPARSE,),
    sparse_workspace_configs=(SPARSE_CONFIG,),
)


@pytest.fixture(scope="module")
def synthetic(oracle: Port) -> CoverageReport:
    return measure(SYNTHETIC, oracle)


def test_layout_features_follow_the_oracle_plans(oracle: Port, synthetic: CoverageReport) -> None:
    values = synthetic.values
    layouts = {case.name: oracle.plan_layout(case) for case in SYNTHETIC.cases}
    chunks = [c for layout in layouts.values() for c in layout.chunks]
    assert values["layout.cases"] == len(SYNTHETIC.cases) and values["layout.oracle_refused"] == 0
    assert values["layout.max_start"] == max(s for c in chunks for s in c.starts)
    assert values["layout.max_cu_seq_len"] == max(c.cu_seq_lens[-1] for c in chunks)
    assert values["layout.requests_per_chunk"] == max(c.request_end - c.request_start for c in chunks)
    assert values["layout.max_context"] == max(max(c.context_lens) for c in SYNTHETIC.cases)
    assert values["layout.requests_per_batch"] == max(c.num_requests for c in SYNTHETIC.cases)
    pieces = [
        sum(c.request_start <= r < c.request_end for c in layout.chunks)
        for name, layout in layouts.items()
        for r in range(next(case for case in SYNTHETIC.cases if case.name == name).num_requests)
    ]
    assert values["layout.pieces_per_request"] == max(pieces)
    assert values["layout.requests_in_3_pieces"] == sum(p >= 3 for p in pieces)
    assert values["layout.block_sizes"] == sorted({c.block_size for c in SYNTHETIC.cases})
    assert values["layout.non_pow2_block_cases"] == 1  # ODD_BLOCK
    assert values["layout.alignment"] == ["off", "on"]
    assert values["layout.dcp_worlds"] == [3] and values["layout.dcp_pairs"] == ["3x4"]
    assert values["layout.lcm_ne_max_cases"] == 1
    assert values["layout.dcp_interleave_vs_block"] == {"1": 0, "between": 1, "equal": 0, "above": 0}
    assert values["layout.max_query_offset"] == max(sum(c.query_lens) for c in SYNTHETIC.cases)


def test_upstream_planner_shortcut_matches_the_full_layout(oracle: Port) -> None:
    """Without DCP, coverage reads upstream's planner alone; it must agree with
    the chunks of the whole metadata the oracle builds."""
    full_layout_only = SimpleNamespace(name="oracle", plan_layout=oracle.plan_layout)
    smoke = load_suite("smoke")
    compared = 0
    for case in [*smoke.cases, *SYNTHETIC.cases]:
        shortcut = oracle_chunks(oracle, case)
        full = oracle_chunks(full_layout_only, case)
        assert shortcut == full, case.name
        compared += case.dcp_world_size == 1
    assert compared > 50


def test_an_oracle_behind_the_cache_measures_the_same_from_its_layouts(
    oracle: Port, synthetic: CoverageReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the oracle cache coverage asks layouts (kept, and the L1 comparison
    asks the same ones), never the planner alone, which no cache keeps: the same report."""

    def planner_alone(case: Case) -> None:
        raise AssertionError(f"coverage asked the planner alone for {case.name} through the cache")

    monkeypatch.setattr(oracle, "upstream_plan", planner_alone)
    cached = CachedOracle(oracle, "coverage-test", None)
    assert measure(SYNTHETIC, cached).values == synthetic.values


def test_grid_features(oracle: Port, synthetic: CoverageReport) -> None:
    values = synthetic.values
    configs = SYNTHETIC.workspace_configs
    assert values["grid.max_intermediate"] == max(
        max(8 * c.max_model_len, 4 * c.max_num_seqs * c.block_size) for c in configs
    )
    assert values["grid.round_cap_differ_configs"] == 1  # ODD_CONFIG alone
    block, span = ODD_CONFIG.block_size, ODD_CONFIG.dcp_world_size * ODD_CONFIG.cp_kv_cache_interleave_size
    assert values["grid.lcm_ne_max_configs"] == int(math.lcm(block, span) != max(block, span))
    sizes = [oracle.workspace_size(c) for c in configs]
    assert values["grid.workspace_max"] == max(sizes) and values["grid.workspace_min"] == min(sizes)
    assert values["grid.non_pow2_workspaces"] == sum(s & (s - 1) != 0 for s in sizes)
    assert values["grid.dcp_worlds"] == [1, 3] and values["grid.block_sizes"] == [16, 528]


def test_merge_features_count_what_the_tensors_hold(synthetic: CoverageReport) -> None:
    values = synthetic.values
    finite_pairs = all_pairs = 0
    for case in MERGES:
        inputs = materialise_merge(case)
        merged = case.num_tokens if case.prefill_tokens_with_context is None else case.prefill_tokens_with_context
        prefix, suffix = inputs.prefix_lse[:, :merged], inputs.suffix_lse[:, :merged]
        finite_pairs += int((prefix.isfinite() & suffix.isfinite()).sum())
        all_pairs += int((~prefix.isnan() & ~suffix.isnan()).sum())
    gaps: dict[str, int] = values["merge.lse_gap"]  # type: ignore[assignment]
    pairs: dict[str, int] = values["merge.lse_pairs"]  # type: ignore[assignment]
    assert sum(gaps.values()) == finite_pairs > 0
    assert sum(pairs.values()) == all_pairs
    assert values["merge.tokens_with_context"] == {"none": 1, "0": 0, "between": 0, "all": 1}
    assert values["merge.dtype_head"] == ["bf16x128", "fp32x96"]
    assert values["merge.cases"] == 2


def test_prefill_features(oracle: Port, synthetic: CoverageReport) -> None:
    values = synthetic.values
    layout = oracle.plan_layout(NUMERIC)
    first_request_pieces = sum(c.request_start == 0 for c in layout.chunks)
    assert first_request_pieces >= 3  # 100 rows through a 32-row workspace
    assert values["prefill.cases"] == 1
    assert values["prefill.pieces_per_request"] == first_request_pieces
    assert values["prefill.requests_per_batch"] == NUMERIC.num_requests
    assert values["prefill.max_query_tokens"] == sum(NUMERIC.query_lens)
    assert values["prefill.dtypes"] == [PRESETS["tiny"].dtype]
    assert values["prefill.block_sizes"] == [16]


def test_views_from_strides() -> None:
    assert lse_view(torch.zeros(2, 5)) == "contiguous"
    assert lse_view(torch.zeros(2, 8)[:, 1:6]) == "column-slice"
    assert lse_view(torch.zeros(5, 2).t()) == "transposed"
    assert value_view(torch.zeros(4, 2, 192)[:, :, :128]) == "head-dim-slice"
    assert value_view(torch.zeros(4, 1, 192)[:, :, :128]) == "head-dim-slice"
    assert value_view(torch.zeros(4, 2, 128)[1:]) == "contiguous"


def _target(feature: str, kind: str, value: Any) -> Target:
    return Target(feature, "why", kind, value)


def test_judge_marks_met_and_missed(synthetic: CoverageReport) -> None:
    values = synthetic.values
    max_context = values["layout.max_context"]
    assert isinstance(max_context, int)
    targets = [
        _target("layout.max_context", "at_least", max_context),
        _target("layout.requests_per_batch", "at_least", max(c.num_requests for c in SYNTHETIC.cases) + 1),
        _target("layout.block_sizes", "includes", [16, 528, 1056]),
        _target("merge.tokens_with_context", "buckets_nonzero", ["none", "0", "all"]),
        _target("layout.workspace_min", "at_most", min(c.workspace_size for c in SYNTHETIC.cases)),
    ]
    judged = judge(synthetic, targets)
    verdicts = {v.feature: v for v in judged.verdicts}
    assert verdicts["layout.max_context"].met is True
    assert verdicts["layout.requests_per_batch"].met is False
    assert verdicts["layout.block_sizes"].met is False and verdicts["layout.block_sizes"].missing == [1056]
    assert verdicts["merge.tokens_with_context"].missing == ["0"]
    assert verdicts["layout.workspace_min"].met is True
    assert verdicts["grid.configs"].met is None  # no target: shown, not judged
    assert judged.targets == len(targets) + len(REFUSAL_FEATURES) and len(judged.missed) == 3
    assert len(judged.verdicts) == len(FEATURES)
    # A min over nothing meets no at_most target.
    empty = measure(Suite("empty", (), ()), SimpleNamespace(name="none"))
    assert judge(empty, [_target("layout.workspace_min", "at_most", 10**9)]).missed


def test_json_form_round_trips_for_the_nightly(synthetic: CoverageReport) -> None:
    judged = judge(synthetic, [_target("layout.block_sizes", "includes", [16, 1056])])
    data = judged.to_json()
    assert JudgedCoverage.from_json(json.loads(json.dumps(data))) == judged
    night = Night("2026-11-28", "synthetic", 0, complete=True, coverage=judged)
    markdown = night_markdown(night)
    # One row, missed, and the built-in refusal rules, met.
    assert judged.targets == 1 + len(REFUSAL_FEATURES)
    assert f"## Coverage of suite synthetic: {judged.targets - 1}/{judged.targets} targets met, 1 MISSED" in markdown
    assert render_markdown(judged) in markdown and "MISSED (lacks 1056)" in markdown
    page = render_html(night, pd_empty_history())
    assert 'id="coverage"' in page and 'id="coverage-table"' in page and "layout.block_sizes" in page


def pd_empty_history() -> Any:
    import pandas as pd

    return pd.DataFrame()


class RefusingOracle:
    """An oracle that plans no layout and sizes no workspace."""

    name = "refusing-oracle"

    def plan_layout(self, case: Case) -> Any:
        raise RuntimeError("refused")

    def workspace_size(self, config: WorkspaceConfig) -> int:
        raise RuntimeError("refused")

    def plan_sparse(self, case: SparseCase) -> Any:
        raise RuntimeError("refused")

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        raise RuntimeError("refused")


def _unmaterialisable(case: MergeCase) -> Any:
    raise RuntimeError("cannot build")


def test_refused_inputs_cover_nothing_but_their_refusal_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.kernels.numeric.materialise_merge", _unmaterialisable)
    refused = measure(SYNTHETIC, RefusingOracle()).values
    nothing = measure(Suite("empty", (), ()), RefusingOracle()).values
    counts = {
        "layout.oracle_refused": len(SYNTHETIC.cases),
        "grid.oracle_refused": len(SYNTHETIC.workspace_configs),
        "merge.not_materialised": len(SYNTHETIC.merge_cases),
        "sparse.oracle_refused": len(SYNTHETIC.sparse_cases),
        "sparse_grid.oracle_refused": len(SYNTHETIC.sparse_workspace_configs),
    }
    assert set(counts) == set(REFUSAL_FEATURES) and all(counts.values())
    assert {k: refused[k] for k in counts} == counts
    moved = {k: v for k, v in refused.items() if k not in counts and v != nothing[k]}
    assert moved == {}, "refused inputs still count towards these features"


def test_a_refusal_fails_the_verdict_with_or_without_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.kernels.numeric.materialise_merge", _unmaterialisable)
    refused = measure(SYNTHETIC, RefusingOracle())
    for rows in ([], [_target(f, "at_most", 0) for f in REFUSAL_FEATURES]):
        judged = judge(refused, rows)
        assert sorted(v.feature for v in judged.missed) == sorted(REFUSAL_FEATURES)
        assert JudgedCoverage.from_json(json.loads(json.dumps(judged.to_json()))) == judged
    # A row cannot excuse a refusal: a report-only row is overridden by the rule.
    excused = judge(refused, [_target("layout.oracle_refused", "report_only", True)])
    assert "layout.oracle_refused" in {v.feature for v in excused.missed}
    # at_most works on count features, in both directions.
    assert _target("grid.configs", "at_most", 2).met_by(2) and not _target("grid.configs", "at_most", 1).met_by(2)


def test_no_refusal_no_built_in_miss(synthetic: CoverageReport) -> None:
    judged = judge(synthetic, [])
    assert judged.missed == [] and judged.rows == 0
    assert all(synthetic.values[f] == 0 for f in REFUSAL_FEATURES)


def test_checked_in_targets_are_valid_and_complete() -> None:
    targets = load_targets(TARGETS_FILE, suite_names())
    assert targets["ci"], "the ci suite has coverage targets"
    assert sorted(t.feature for t in targets["ci"]) == sorted(f.id for f in FEATURES)
    by_feature = {t.feature: t for t in targets["ci"]}
    assert all((by_feature[f].kind, by_feature[f].value) == ("at_most", 0) for f in REFUSAL_FEATURES)
    assert by_feature["merge.value_views"].value == ["contiguous", "head-dim-slice"]
    report_only = [t for t in targets["ci"] if t.report_only]
    assert report_only and all(t.description for t in report_only)


# -- the command -------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def complete(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` plus a row for every other feature: refusals at most 0, the rest report-only."""
    given = {row["feature"] for row in rows}
    for feature in FEATURES:
        if feature.id in given:
            continue
        rule: dict[str, Any] = {"at_most": 0} if feature.id in REFUSAL_FEATURES else {"report_only": True}
        rows = [*rows, {"feature": feature.id, "description": "shown", **rule}]
    return rows


def smoke_targets(tmp_path: Path, extra_rows: int = 0) -> Path:
    """A complete file: rows the smoke suite meets, computed from its cases
    (plus ``extra_rows`` past them, which it misses), the refusals held to 0
    and every other feature report-only."""
    smoke = load_suite("smoke")
    max_context = max(max(c.context_lens) for c in smoke.cases)
    rows: list[dict[str, Any]] = [
        {"feature": "layout.max_context", "description": "contexts", "at_least": max_context + extra_rows},
        {
            "feature": "layout.block_sizes",
            "description": "blocks",
            "includes": sorted({c.block_size for c in smoke.cases}),
        },
        {"feature": "merge.cases", "description": "merges", "count_at_least": len(smoke.merge_cases) + extra_rows},
    ]
    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"smoke": complete(rows)}), encoding="utf-8")
    return path


JUDGED_ROWS = 3 + len(REFUSAL_FEATURES)  # smoke_targets' targets


def test_command_met_and_missed_exit_codes_and_deterministic_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    met = smoke_targets(tmp_path)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    code, out, _ = run_cli(capsys, "coverage", "--suite", "smoke", "--targets", str(met), "--json", str(first))
    assert code == 0, out
    assert f"{JUDGED_ROWS}/{JUDGED_ROWS} targets met" in out and "MISSED" not in out
    report_only = len(FEATURES) - JUDGED_ROWS
    assert out.count("report only") == report_only
    run_cli(capsys, "coverage", "--suite", "smoke", "--targets", str(met), "--json", str(second))
    assert first.read_bytes() == second.read_bytes()
    document = json.loads(first.read_text())
    assert [f["feature"] for f in document["features"]] == sorted(f.id for f in FEATURES)
    assert document["met"] == JUDGED_ROWS and document["missed"] == 0
    verdicts = [f["verdict"] for f in document["features"]]
    assert verdicts.count("report only") == report_only and None not in verdicts

    missed = smoke_targets(tmp_path, extra_rows=1)
    code, out, _ = run_cli(capsys, "coverage", "--suite", "smoke", "--targets", str(missed))
    assert code == 1
    assert f"{JUDGED_ROWS - 2}/{JUDGED_ROWS} targets met, 2 MISSED" in out


def test_mcdc_decides_the_exit_code_only_where_the_suite_holds_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Smoke's feature targets met, its MC/DC unmet (it holds no sparse-decisions
    pairs): shown and not held, exit 0; the same suite holding MC/DC, exit 1."""
    import dataclasses

    import harness.commands.coverage as coverage_command
    from harness.cases.suites import load_suite

    met = smoke_targets(tmp_path)
    out_json = tmp_path / "c.json"
    code, out, _ = run_cli(capsys, "coverage", "--suite", "smoke", "--targets", str(met), "--json", str(out_json))
    assert code == 0, out
    assert "MC/DC of suite smoke: NOT MET" in out and "UNMET" in out
    assert '(MC/DC shown, not held: suite smoke sets no "mcdc" in cases/suites.json)' in out
    mcdc = json.loads(out_json.read_text())["mcdc"]
    assert mcdc["held"] is False and mcdc["unmet"] > 0
    held = dataclasses.replace(load_suite("smoke"), mcdc=True)
    monkeypatch.setattr(coverage_command, "load_suite", lambda *args, **kwargs: held)
    code, out, _ = run_cli(capsys, "coverage", "--suite", "smoke", "--targets", str(met))
    assert code == 1, out
    assert f"{JUDGED_ROWS}/{JUDGED_ROWS} targets met" in out and "MC/DC of suite smoke: NOT MET" in out


def test_partial_targets_file_is_refused_naming_the_feature(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rows = complete([])
    dropped = rows.pop(len(rows) // 2)["feature"]
    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"smoke": rows}), encoding="utf-8")
    code, out, err = run_cli(capsys, "coverage", "--suite", "smoke", "--targets", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"parity: error: {path}: suite 'smoke': feature '{dropped}' has no row "
        '(give a target or "report_only": true)\n'
    )


def test_command_fails_when_the_oracle_refuses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "harness.commands.coverage.open_oracle", lambda allow_drift, oracle=None: (RefusingOracle(), {})
    )
    # Only report-only rows beside the refusals: nothing is left to miss but them.
    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"smoke": complete([])}), encoding="utf-8")
    code, out, _ = run_cli(capsys, "coverage", "--suite", "smoke", "--targets", str(path))
    assert code == 1, out
    missed = [line.split()[0] for line in out.splitlines() if "MISSED" in line and not line.startswith("Coverage")]
    assert sorted(missed) == [
        "grid.oracle_refused",
        "layout.oracle_refused",
        "sparse.oracle_refused",
        "sparse_grid.oracle_refused",
    ]


def test_report_only_rows_are_shown_never_met(synthetic: CoverageReport) -> None:
    judged = judge(synthetic, [_target("layout.cases", "report_only", True)])
    (verdict,) = [v for v in judged.verdicts if v.feature == "layout.cases"]
    assert verdict.met is None and judged.targets == len(REFUSAL_FEATURES)
    line = next(line for line in render_text(judged).splitlines() if line.startswith("layout.cases"))
    assert line.endswith("report only") and " met" not in line
    assert "report only" in render_markdown(judged)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "malformed JSON at line 1 column 2"),
        ('{"smoke": [{"feature": "layout.nope", "description": "x", "at_least": 1}]}', "field 'smoke[0].feature'"),
        (
            '{"smoke": [{"feature": "layout.max_start", "description": "x", "includes": [1]}]}',
            "field 'smoke[0].includes': layout.max_start (max) takes exactly one target of: at_least",
        ),
        (
            '{"smoke": [{"feature": "layout.max_start", "description": "x", "at_least": "big"}]}',
            "field 'smoke[0].at_least': must be an integer >= 1",
        ),
        (
            '{"smoke": [{"feature": "merge.lse_views", "description": "x", "includes": ["diagonal"]}]}',
            "unknown label 'diagonal'",
        ),
        ('{"smoke": [{"feature": "layout.max_start", "at_least": 3}]}', "field 'smoke[0].description'"),
        ('{"weekly": [{"feature": "layout.max_start", "description": "x", "at_least": 3}]}', "no suite named 'weekly'"),
        ('{"smoke": {"same_as": "ci"}}', "field 'smoke.same_as'"),
        ('{"smoke": []}', "field 'smoke': must be a non-empty list"),
        (
            '{"smoke": [{"feature": "layout.oracle_refused", "description": "x", "at_most": 3}]}',
            "field 'smoke[0].at_most': layout.oracle_refused counts refused inputs: its target is at_most 0",
        ),
        (
            '{"smoke": [{"feature": "grid.oracle_refused", "description": "x", "report_only": true}]}',
            "field 'smoke[0].report_only': grid.oracle_refused (count) takes exactly one target of: at_most",
        ),
        (
            '{"smoke": [{"feature": "layout.max_start", "description": "x", "report_only": 1}]}',
            "field 'smoke[0].report_only': must be true",
        ),
    ],
)
def test_malformed_targets_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "targets.json"
    path.write_text(content, encoding="utf-8")
    code, out, err = run_cli(capsys, "coverage", "--suite", "smoke", "--targets", str(path))
    assert code == 2
    assert err.startswith(f"parity: error: {path}") and expected in err
    assert err.count("\n") == 1 and out == ""


def test_suite_without_targets_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "coverage", "--suite", "smoke")
    assert code == 2
    assert err == "parity: error: no coverage targets for suite smoke in cases/coverage.json\n"
    code, _, err = run_cli(capsys, "coverage", "--suite", "weekly")
    assert code == 2 and "no suite named 'weekly'" in err
