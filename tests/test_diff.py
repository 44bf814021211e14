"""``parity diff``: every item id any output prints names its item, and the
output is tables aligned to their content, with a ``--json`` record.

The id and formatting tests need no oracle (a layout is compared between two
ports); the end-to-end ones at the bottom run the CLI against the oracle."""

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
from harness.cases.suites import load_suite
from harness.cli import main
from harness.commands.diff import diff_kinds
from harness.compare.bits import compare_bits
from harness.model import Case, MergeCase, WorkspaceConfig
from harness.protocol.port import Port
from harness.search.explore_finds import write_find
from harness.search.explore_strategies import properties
from harness.sides.items import LEVELS, PARITY, CaseResult, Kind, Status, item_id
from harness.sides.loading import load_port
from harness.sides.runner import compare_case, compare_workspace, plan_items
from harness.verdicts.reproduce import resolve_item
from reports.diff_text import format_diff, format_tensor_verdict, format_workspace_diff, merge_case_lines
from tests.conftest import make_case

ROOT = Path(__file__).resolve().parent.parent
WORST_CASE_FILE = ROOT / "cases" / "smoke" / "upstream-worst-case.json"
# Its workspace floor doubles the smoke grid's size at 2048 sequences of 64-row blocks.
WORKSPACE_BUG = "mutant:workspace-floor"
DIVERGENT_CONFIG = WorkspaceConfig(2048, 2048, 64, 4, 64)


def smoke_items() -> list[tuple[str, Any]]:
    return plan_items(load_suite("smoke"), LEVELS)


def assert_names(spec: str, kind: str, item: Any) -> None:
    resolved = resolve_item(spec)
    assert resolved.item == item, spec
    assert diff_kinds(resolved, spec, None) == [kind], spec


# -- ids as they are printed -------------------------------------------------------------


def test_every_results_and_gate_id_names_its_item() -> None:
    """``NAME[KIND]`` (results, summary.md, JUnit) and ``SUITE/NAME[KIND]``,
    for every item of the smoke suite at every level."""
    items = smoke_items()
    assert {kind for kind, _ in items} == {
        "layout",
        "workspace",
        "merge",
        "prefill",
        "sparse-layout",
        "sparse-workspace",
        "sparse-mask",
        "sparse-prefill",
    }
    ci = load_suite("ci")
    in_ci: dict[str, Any] = {c.name: c for c in ci.cases} | {m.name: m for m in ci.merge_cases}
    in_ci |= {s.name: s for s in ci.sparse_cases} | {m.name: m for m in ci.mask_cases}
    ambiguous = 0
    for kind, item in items:
        assert_names(f"smoke/{item_id(kind, item.name)}", kind, item)
        if in_ci.get(item.name, item) != item:
            # ci's generated item of the same name is another item: a bare id is refused, never guessed.
            ambiguous += 1
            with pytest.raises(CaseError, match="names different items in suite smoke and suite ci"):
                resolve_item(item_id(kind, item.name))
            assert_names(f"ci/{item_id(kind, item.name)}", kind, in_ci[item.name])
        else:
            assert_names(item_id(kind, item.name), kind, item)
    assert ambiguous > 0


def test_every_pytest_plugin_id_names_its_item() -> None:
    """The ids the plugin collects (workspace items without their ``workspace/``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--parity-suite", "smoke", "--collect-only", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    ids = [line.strip() for line in proc.stdout.splitlines() if line.startswith("smoke/")]
    items = smoke_items()
    assert len(ids) == len(items), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert any(i.endswith("[workspace]") and "/workspace/" not in i for i in ids)
    for spec, (kind, item) in zip(ids, items, strict=True):
        assert_names(spec, kind, item)


def test_case_file_stems_and_paths() -> None:
    case = next(c for c in load_suite("smoke").cases if c.name == "smoke-upstream-worst-case")
    for spec in (
        "upstream-worst-case",
        "smoke/upstream-worst-case",
        str(WORST_CASE_FILE),
        str(WORST_CASE_FILE.relative_to(ROOT)) if Path.cwd() == ROOT else str(WORST_CASE_FILE),
        f"{WORST_CASE_FILE}[layout]",
        "upstream-worst-case[layout]",
    ):
        assert_names(spec, "layout", case)


def test_find_files_of_every_kind(tmp_path: Path, per_request: Port) -> None:
    """``parity diff FILE`` reads the layout, prefill, workspace and merge finds explore writes."""
    by_name = {p.name: p for p in properties()}
    case = make_case([100, 7], block_size=16, workspace_size=64, name="x")
    numeric = next(c for c in load_suite("smoke").cases if c.numeric is not None)
    merge = load_suite("smoke").merge_cases[0]
    config = WorkspaceConfig(4096, 3, 16, 4, 64)
    for prop, item, kinds in (
        ("layout", case, ["layout"]),
        ("prefill", numeric, ["layout", "prefill"]),
        ("workspace", config, ["workspace"]),
        ("merge", merge, ["merge"]),
    ):
        result = CaseResult(
            getattr(item, "name", "w"), "f", Kind(by_name[prop].kind), Status.DIVERGENT, error="planted"
        )
        find = write_find(item, result, by_name[prop], tmp_path, "per_request", False, False, False)
        resolved = resolve_item(find.file)
        assert diff_kinds(resolved, find.file, None) == kinds
        expected = item if isinstance(item, WorkspaceConfig) else dataclasses.replace(item, name=find.item["name"])
        assert resolved.item == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["x[bogus]"], "unknown item kind [bogus]"),
        (["smoke-numeric-single-chunk[merge]"], "has no merge item"),
        (["smoke-upstream-worst-case[prefill]"], "has no prefill item"),
        (["ci/skew-0031[layout]", "--suite", "smoke"], "names suite ci but --suite is smoke"),
        (["len0-seqs1-blk16-dcp1x1[workspace]"], "must be >= 1"),
        (["lenX[workspace]"], "is not a workspace item name"),
        (["no/such/file.json"], "no/such/file.json: no such file"),
        (["smoke/merge-random-0000", "--level", "layout"], "--level layout selects no items of a merge case"),
        (["smoke-numeric-single-chunk[prefill]", "--port", "tests.fault_ports:NoNumericPort"], "does not implement"),
        (["smoke-tails-15", "--size", "-1"], "--size: must be >= 0"),
        (["smoke-tails-15", "--json", "/no/such/folder/out.json"], "folder /no/such/folder does not exist"),
        (["no-such-item"], "no-such-item: no such case file"),
    ],
)
def test_bad_ids_are_one_usage_line(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["diff", *argv])
    except SystemExit as exc:  # argparse's own refusals (a bad --size)
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err


def test_a_file_of_several_cases_says_how_to_name_one(tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    cases = [make_case([5], name=n).to_json() for n in ("a", "b")]
    path.write_text(json.dumps({"cases": cases}))
    with pytest.raises(CaseError, match="holds 2 cases"):
        resolve_item(str(path))
    assert resolve_item("b", case_paths=[str(path)]).item.name == "b"


# -- the text ------------------------------------------------------------------------------


def separator_columns(lines: list[str]) -> set[int]:
    return {line.index(" | ") for line in lines if " | " in line}


def test_layout_columns_align_however_long_the_values(per_request: Port, equal_share: Port) -> None:
    # Contexts in the millions and a dozen chunks: cells far wider than a fixed column.
    case = make_case(
        [3_000_000, 1_234_567, 16, 0, 2_500_001], block_size=16, workspace_size=1 << 20, name="wide-values"
    )
    result = compare_case(per_request, equal_share, case)
    assert result.status == "divergent"
    text = format_diff(case, result)
    table = [line for line in text.splitlines() if " | " in line]
    assert len(table) == 2 + max(result.oracle_layout.num_chunks, result.port_layout.num_chunks)  # type: ignore[union-attr]
    assert len(separator_columns(table)) == 1, text
    assert max(len(line.split(" | ")[0]) for line in table) > 64
    # Both sides share the cell widths: a field starts at one offset on every line.
    rows = [line for line in table if "req[" in line]
    for side in (0, 1):
        assert len({line.split(" | ")[side].index("req[") for line in rows if "req[" in line.split(" | ")[side]}) == 1
        assert len({line.split(" | ")[side].index("rows=") for line in rows if "rows=" in line.split(" | ")[side]}) == 1
    assert not any(line != line.rstrip() for line in text.splitlines())
    assert f">> #{result.divergence.chunk} " in text  # type: ignore[union-attr]


def test_a_merge_case_prints_as_a_field_value_table() -> None:
    case = MergeCase("m", 4, 3, 128, "bf16", "random", 5, None, lse_view="transposed")
    lines = merge_case_lines(case)
    assert not any(c in "\n".join(lines) for c in "{}'")
    table = lines[1:]
    assert len(separator_columns(table)) == 1
    pairs = [[part.strip() for part in line.split(" | ")] for line in table]
    assert all(len(pair) == 2 for pair in pairs)
    cells = {field: value for field, value in pairs}
    expected = {k: "none" if v is None else str(v) for k, v in case.to_json().items() if k != "name"}
    assert cells.pop("field") == "value" and cells == expected


def test_the_workspace_item_prints_oracle_against_port(per_request: Port) -> None:
    config = DIVERGENT_CONFIG
    result = compare_workspace(per_request, load_port(WORKSPACE_BUG), config)
    assert result.status == "divergent"
    text = format_workspace_diff(config, result)
    heading = next(line for line in text.splitlines() if "oracle" in line and "port" in line and "|" in line)
    row = next(line for line in text.splitlines() if line.strip().startswith("workspace_size"))
    assert [c.strip() for c in heading.split("|")] == ["", "oracle", "port"]
    assert [c.strip() for c in row.split("|")][1:] == [str(result.oracle_workspace), str(result.port_workspace)]
    assert len({heading.rindex("|"), row.rindex("|")}) == 1
    fields = {line.split("|")[0].strip(): line.split("|")[1].strip() for line in text.splitlines()[2:7]}
    assert fields == {k: str(v) for k, v in dataclasses.asdict(config).items()}
    assert "DIVERGENT" in text


def test_a_bit_exact_tensor_is_one_line_and_a_differing_one_a_table() -> None:
    a = torch.linspace(-3, 3, 24, dtype=torch.bfloat16).reshape(4, 2, 3)
    b = a.clone()
    b[2, 1, 0] = torch.nextafter(a[2, 1, 0].float(), torch.tensor(10.0)).to(torch.bfloat16) * 4
    axes = ("token", "head", "dim")
    exact = CaseResult("c", "f", Kind.PREFILL, PARITY, tensors=[compare_bits("output", a, a.clone(), axes)])
    text = format_tensor_verdict("L3 prefill", exact)
    assert text.splitlines() == ["L3 prefill: BIT-EXACT", f"  {exact.tensors[0].summary()}"]
    differing = CaseResult("c", "f", Kind.PREFILL, Status.DIVERGENT, tensors=[compare_bits("output", a, b, axes)])
    lines = format_tensor_verdict("L3 prefill", differing).splitlines()
    table = [line for line in lines if " | " in line]
    assert table[0].split() == ["token", "|", "mismatches", "|", "max", "ULP", "|", "max", "ULP", "of", "larger"]
    assert len(table) == 1 + len(differing.tensors[0].worst_rows) and len(separator_columns(table)) == 1
    assert all("{" not in line and line == line.rstrip() for line in lines)


# -- end to end, against the oracle ---------------------------------------------------------


def test_diff_json_records_the_chunks_side_by_side(
    oracle: Port, equal_share: Port, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "diff.json"
    assert main(["diff", "smoke/upstream-worst-case[layout]", "--port", "equal_share", "--json", str(out)]) == 1
    stdout = capsys.readouterr().out
    expected = compare_case(oracle, equal_share, resolve_item(str(WORST_CASE_FILE)).item)  # type: ignore[arg-type]
    record = json.loads(out.read_text())
    assert record["verdict"] == expected.status and record["levels"] == {"layout": expected.status}
    assert record["port_spec"] == "equal_share" and record["exit_code"] == 1
    assert record["item"] == resolve_item(str(WORST_CASE_FILE)).item.to_json()  # type: ignore[union-attr]
    (layout,) = record["results"]
    assert layout["divergence"] == expected.divergence.to_json()  # type: ignore[union-attr]
    assert expected.oracle_layout and expected.port_layout
    count = max(expected.oracle_layout.num_chunks, expected.port_layout.num_chunks)
    assert [c["index"] for c in layout["chunks"]] == list(range(count))
    for i, chunk in enumerate(layout["chunks"]):
        sides = (expected.oracle_layout, expected.port_layout)
        want = [s.chunks[i].to_json() if i < s.num_chunks else None for s in sides]
        assert [chunk["oracle"], chunk["port"]] == want and chunk["identical"] == (want[0] == want[1])
    assert f"verdict: DIVERGENT (layout {expected.status})" in stdout


def test_diff_a_workspace_item_by_its_pytest_id(
    oracle: Port, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = DIVERGENT_CONFIG
    spec = f"smoke/{config.name.removeprefix('workspace/')}[workspace]"
    out = tmp_path / "ws.json"
    assert main(["diff", spec, "--port", WORKSPACE_BUG, "--json", str(out)]) == 1
    expected = compare_workspace(oracle, load_port(WORKSPACE_BUG), config)
    (result,) = json.loads(out.read_text())["results"]
    assert result["workspace_size"] == {"oracle": expected.oracle_workspace, "port": expected.port_workspace}
    assert result["status"] == expected.status == "divergent"
    assert "workspace configuration " + config.name in capsys.readouterr().out


def test_diff_json_of_a_merge_item_holds_tensor_statistics(
    oracle: Port, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merge.json"
    merge = load_suite("smoke").merge_cases[0]
    code = main(["diff", f"smoke/{merge.name}[merge]", "--port", "mutant:merge-in-bf16", "--json", str(out)])
    stdout = capsys.readouterr().out
    from harness.sides.runner import compare_merge

    expected = compare_merge(oracle, load_port("mutant:merge-in-bf16"), merge)
    assert code == (0 if expected.ok else 1)
    (result,) = json.loads(out.read_text())["results"]
    assert result["status"] == expected.status
    assert [t["name"] for t in result["tensors"]] == [t.name for t in expected.tensors]
    assert [t["max_ulp"] for t in result["tensors"]] == [t.max_ulp for t in expected.tensors]
    assert [t["mismatches"] for t in result["tensors"]] == [t.mismatches for t in expected.tensors]
    assert f"merge case {merge.name}" in stdout and "{" not in stdout.split("L2 merge")[0]


def test_diff_of_a_case_without_numeric_section_compares_layout_only(
    capsys: pytest.CaptureFixture[str], oracle: Port
) -> None:
    case: Case = resolve_item("smoke-tails-15").item  # type: ignore[assignment]
    assert case.numeric is None
    assert main(["diff", "smoke-tails-15", "--port", "per_request"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("verdict: PARITY (layout parity)")
