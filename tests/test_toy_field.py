"""A case field is declared once: tests/toy_field.py declares ``toy_priority``
with no harness file edited, and it is read (one-line errors naming the
field), written, tabled, shrunk, drawn by the strategies and run through
``run``, ``gate`` and ``diff``."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import find, settings

from harness.cases.fields import CaseError, field_table
from harness.cases.files import case_from_json
from harness.cli import main
from harness.model import Case
from harness.model.case_fields import declared_names, register_field, unregister_field
from harness.model.levels import PLUGINS_VARIABLE
from harness.sides.items import DIVERGENT, PARITY, CaseResult

ROOT = Path(__file__).resolve().parent.parent
MODULE = "tests.toy_field"
# Three requests, two chunks of 2048 rows at least: the toy bug drops one.
CASE = {"name": "toy-priority", "context_lens": [3000, 10, 2500], "query_lens": [4, 4, 4], "block_size": 16,
        "workspace_size": 2048}  # fmt: skip


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy field declared here and named for every process the harness starts."""
    from tests import toy_field

    if toy_field.NAME not in declared_names(Case):
        register_field(Case, toy_field.NAME, toy_field.RULE, 0)
    monkeypatch.setenv(PLUGINS_VARIABLE, MODULE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        yield
    finally:
        unregister_field(Case, toy_field.NAME)


def test_without_its_declaration_the_field_is_refused() -> None:
    with pytest.raises(CaseError, match=r"f\.json: field 'toy_priority': is not a case field"):
        case_from_json({**CASE, "toy_priority": 5}, "f.json")


def test_it_is_read_written_and_tabled(toy: None) -> None:
    case = case_from_json({**CASE, "toy_priority": 5}, "f.json")
    assert case.extra("toy_priority") == 5
    assert case.to_json()["toy_priority"] == 5
    assert case_from_json(case.to_json(), "again") == case
    # At its default it is not written: a file from before the field keeps its bytes.
    plain = case_from_json(CASE, "f.json")
    assert plain.extra("toy_priority") == 0 and "toy_priority" not in plain.to_json()
    for bad, why in ((8, "must be <= 7"), (-1, "must be >= 0"), ("high", "must be an integer")):
        with pytest.raises(CaseError, match=rf"f\.json: field 'toy_priority': {why}"):
            case_from_json({**CASE, "toy_priority": bad}, "f.json")
    assert "| `toy_priority` | integer, 0 to 7 | `0` | a toy: the batch's priority |" in field_table(Case)


def test_the_shrinker_steps_it_down(toy: None) -> None:
    from harness.search.shrink import shrink

    def check(case: Case) -> CaseResult:
        wrong = case.extra("toy_priority") >= 3 and sum(case.context_lens) > 2048
        return CaseResult(case.name, case.family, "layout", DIVERGENT if wrong else PARITY)

    start = case_from_json({**CASE, "toy_priority": 7}, "f.json")
    shrunk = shrink(start, check).case
    assert shrunk.extra("toy_priority") == 3 and shrunk.num_requests < start.num_requests


def test_the_strategies_draw_it(toy: None) -> None:
    from harness.search.explore_strategies import layout_cases

    found = find(
        layout_cases(),
        lambda case: case.extra("toy_priority") == 7,
        settings=settings(database=None, derandomize=True, max_examples=5000),
    )
    assert found.to_json()["toy_priority"] == 7


def test_it_runs_through_run_gate_and_diff(toy: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    urgent, calm = tmp_path / "urgent.json", tmp_path / "calm.json"
    urgent.write_text(json.dumps({**CASE, "toy_priority": 5}))
    calm.write_text(json.dumps({**CASE, "name": "toy-calm"}))
    port = ["--port", f"{MODULE}:PORT", "--level", "layout"]
    assert main(["run", "--cases", str(calm), *port]) == 0
    assert main(["run", "--cases", str(urgent), *port, "--results", str(tmp_path / "r.jsonl")]) == 1
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()[1:]]
    assert [(row["id"], row["status"]) for row in rows if row["kind"] == "layout"] == [
        ("toy-priority[layout]", "divergent")
    ]
    capsys.readouterr()
    assert main(["gate", "--cases", str(urgent), *port, "--out", str(tmp_path / "gate")]) == 1
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if "reproduce:" in text)
    assert f"{PLUGINS_VARIABLE}={MODULE}" in line
    assert main(["diff", str(urgent), *port]) == 1
    assert "verdict: DIVERGENT" in capsys.readouterr().out


def test_the_committed_tables_are_the_declarations() -> None:
    """The docs' field tables and levels table, as tools/docs_tables.py writes them."""
    spec = importlib.util.spec_from_file_location("docs_tables_tool", ROOT / "tools" / "docs_tables.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for page, name, rows in tool.tables():
        text = page.read_text(encoding="utf-8")
        assert tool.rewritten(text, name, rows) == text, f"run python tools/docs_tables.py ({page}, {name})"


def test_a_field_name_is_declared_once() -> None:
    from harness.model.case_fields import FieldKind, FieldRule

    with pytest.raises(ValueError, match="already has a field 'block_size'"):
        register_field(Case, "block_size", FieldRule(FieldKind.INT, "again"), 0)
    assert dataclasses.fields(Case)[-1].name == "extras"


def test_a_rules_kind_is_checked_when_it_is_declared() -> None:
    from harness.model.case_fields import FieldKind, FieldRule

    assert FieldRule("int", "as text").kind is FieldKind.INT  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'integer' is not a valid FieldKind"):
        FieldRule("integer", "misspelt")  # type: ignore[arg-type]
