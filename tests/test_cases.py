"""The case file format and its validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.cases.fields import CaseError
from harness.cases.files import case_from_json, load_case_file, load_cases, write_case_file

GOOD: dict[str, Any] = {
    "name": "ok",
    "context_lens": [100, 0, 17],
    "query_lens": [3, 4, 5],
    "block_size": 16,
    "workspace_size": 64,
}


def with_(**changes: Any) -> dict[str, Any]:
    data = dict(GOOD)
    for key, value in changes.items():
        if value is ...:
            data.pop(key)
        else:
            data[key] = value
    return data


def test_good_case_has_defaults() -> None:
    case = case_from_json(GOOD, "f.json")
    assert case.dcp_world_size == 1 and case.cp_kv_cache_interleave_size == 1
    assert case.align_to_block and case.family == "hand-picked"
    assert case.query_start_loc == [0, 3, 7, 12]


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        (with_(name=...), "name", "is missing"),
        (with_(context_lens=...), "context_lens", "is missing"),
        (with_(workspace_size=...), "workspace_size", "is missing"),
        (with_(context_lens=[1, -2, 3]), "context_lens[1]", "must be >= 0, got -2"),
        (with_(context_lens=[1, 2.5, 3]), "context_lens[1]", "must be an integer, got 2.5"),
        (with_(context_lens=[1, "3", 3]), "context_lens[1]", 'must be an integer, got "3"'),
        (with_(context_lens=[1, True, 3]), "context_lens[1]", "must be an integer, got true"),
        (with_(query_lens=[3, 0, 5]), "query_lens[1]", "must be >= 1, got 0"),
        (with_(query_lens=[3, 4]), "query_lens", "has 2 entries but context_lens has 3"),
        (with_(context_lens=[], query_lens=[]), "context_lens", "must hold at least one request"),
        (with_(context_lens=5), "context_lens", "must be a list of integers, got int"),
        (with_(block_size=0), "block_size", "must be >= 1, got 0"),
        (with_(workspace_size=8), "workspace_size", "8 rows is below one alignment unit (16 rows)"),
        (
            with_(dcp_world_size=4, cp_kv_cache_interleave_size=64, workspace_size=128),
            "workspace_size",
            "128 rows is below one alignment unit (256 rows)",
        ),
        (with_(workspace_size=1 << 40), "workspace_size", "refused before allocating"),
        (with_(context_lens=[1 << 30, 0, 0]), "context_lens[0]", "refused before allocating"),
        (with_(align_to_block="yes"), "align_to_block", 'must be true or false, got "yes"'),
        (with_(nmae="typo"), "nmae", "is not a case field"),
        (with_(name="has space"), "name", "without spaces"),
    ],
)
def test_bad_field_is_named_with_reason(data: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(CaseError) as info:
        case_from_json(data, "bad.json")
    message = str(info.value)
    assert info.value.field == field
    assert message.startswith(f"bad.json: field '{field}': ")
    assert reason in message
    assert "\n" not in message


def test_alignment_off_allows_small_workspace() -> None:
    assert case_from_json(with_(workspace_size=8, align_to_block=False), "f").workspace_size == 8


def test_malformed_json_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x", "context_lens": [1, 2,, 3]}')
    with pytest.raises(CaseError, match=r"broken.json: malformed JSON at line 1 column 37: Expecting value"):
        load_case_file(path)


def test_top_level_must_be_object(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(CaseError, match="a case must be a JSON object, got list"):
        load_case_file(path)


def test_multi_case_file_names_the_bad_entry(tmp_path: Path) -> None:
    path = tmp_path / "many.json"
    path.write_text(json.dumps({"cases": [GOOD, with_(name="two", block_size=-1)]}))
    with pytest.raises(CaseError, match=r"many.json#cases\[1\]: field 'block_size': must be >= 1"):
        load_case_file(path)


def test_duplicate_names_across_files(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(GOOD))
    (tmp_path / "b.json").write_text(json.dumps(GOOD))
    with pytest.raises(CaseError, match="'ok' is already defined in"):
        load_cases([tmp_path])


def test_missing_path_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(CaseError, match="no such file or folder"):
        load_cases([tmp_path / "nope.json"])
    with pytest.raises(CaseError, match=r"folder holds no \*.json case files"):
        load_cases([tmp_path])


def test_round_trip(tmp_path: Path) -> None:
    case = case_from_json(with_(dcp_world_size=2, cp_kv_cache_interleave_size=16, family="dcp"), "f")
    write_case_file(case, tmp_path / "c.json", "why this case")
    assert load_case_file(tmp_path / "c.json") == [case]


def test_smoke_catalogue_is_large_and_valid() -> None:
    cases = load_cases([Path(__file__).resolve().parent.parent / "cases" / "smoke"])
    assert len(cases) >= 60
    assert {c.family for c in cases} >= {
        "skew",
        "uniform",
        "zero-context",
        "exact-fit",
        "long-single",
        "unaligned-tails",
        "many-requests",
        "tiny-workspace",
        "dcp",
    }
