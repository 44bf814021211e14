"""Baselines of another oracle than the pin (issue 15): each names the release it
was measured against, and only there may it expect the oracle to refuse, one
named class of refusal per entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.cases.fields import CaseError
from harness.cli import main
from harness.sides.items import DIVERGENT, ORACLE_ERROR
from harness.verdicts.baseline import EXPECTED, NEW, check_baseline_oracle, judge_item, load_baseline, measure_entries
from oracle.pin import load_pin

PINNED = load_pin()["release"]
LEGACY = "vllm==0.27.1"
REFUSAL = "0.27.1 refuses: assert max_context_chunk > 0 fails in its build_mla_chunked_context_metadata"


def write(tmp_path: Path, entries: list[dict[str, Any]], **fields: Any) -> Path:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"port": "equal_share", **fields, "entries": entries}), encoding="utf-8")
    return path


def refusal_entry(**fields: Any) -> dict[str, Any]:
    return {
        "family": "skew", "level": "layout", "status": ORACLE_ERROR, "error": REFUSAL, "items": 1, "reason": "why",
        **fields,
    }  # fmt: skip


REFUSED = f"OracleRefusal: {LEGACY}: {REFUSAL}"


def row(status: str, detail: str, family: str = "skew") -> dict[str, Any]:
    return {"level": "layout", "name": "c", "family": family, "status": status, "detail": detail}


def test_the_file_names_its_oracle_and_defaults_to_the_pin(tmp_path: Path) -> None:
    entry = {"family": "skew", "level": "layout", "status": DIVERGENT, "reason": "r"}
    assert load_baseline(write(tmp_path, [entry]))[0].oracle == PINNED
    assert load_baseline(write(tmp_path, [entry], oracle=LEGACY))[0].oracle == LEGACY
    with pytest.raises(CaseError, match=r"field 'oracle': must be a release as vllm==X.Y.Z"):
        load_baseline(write(tmp_path, [entry], oracle="0.27.1"))


def test_an_oracle_error_is_never_expected_of_the_pin(tmp_path: Path) -> None:
    with pytest.raises(CaseError, match=r"oracle-error is never expected of the pinned oracle"):
        load_baseline(write(tmp_path, [refusal_entry()]))
    with pytest.raises(CaseError, match=r"entries\[0\].error'?: is required on an oracle-error entry"):
        load_baseline(write(tmp_path, [{k: v for k, v in refusal_entry().items() if k != "error"}], oracle=LEGACY))
    with pytest.raises(CaseError, match=r"entries\[0\].items'?: must count the items refused"):
        load_baseline(write(tmp_path, [{k: v for k, v in refusal_entry().items() if k != "items"}], oracle=LEGACY))
    with pytest.raises(CaseError, match=r"entries\[0\].items'?: applies only to port-error and oracle-error entries"):
        entry = {"family": "skew", "level": "layout", "status": DIVERGENT, "items": 3, "reason": "r"}
        load_baseline(write(tmp_path, [entry], oracle=LEGACY))


def test_only_the_named_class_of_refusal_is_expected(tmp_path: Path) -> None:
    entries = load_baseline(write(tmp_path, [refusal_entry()], oracle=LEGACY))
    ports = {"equal_share"}
    assert judge_item(entries, ports, row(ORACLE_ERROR, REFUSED)).label == EXPECTED
    # The oracle failing (its process, a timeout, the harness) is never a refusal,
    # even when its text holds the class's words.
    failed = judge_item(entries, ports, row(ORACLE_ERROR, f"OracleProcessError: {LEGACY}: {REFUSAL}"))
    assert failed.label == NEW and "did not refuse" in failed.note
    other = judge_item(entries, ports, row(ORACLE_ERROR, f"OracleRefusal: {LEGACY}: 0.27.1 refuses: another class"))
    assert other.label == NEW and "not '0.27.1 refuses: assert max_context_chunk" in other.note
    longer = judge_item(entries, ports, row(ORACLE_ERROR, f"{REFUSED} and more"))
    assert longer.label == NEW
    elsewhere = judge_item(entries, ports, row(ORACLE_ERROR, REFUSED, family="uniform"))
    assert elsewhere.label == NEW and elsewhere.note == "an oracle error is never expected"


def test_a_refusal_entry_counts_its_items_exactly(tmp_path: Path) -> None:
    """An oracle that came to refuse more batches (or fewer) than were measured
    fails the gate: each refusal is an item not compared. The refusals beyond
    the count are new (the entry lives on); fewer make the entry miscounted."""
    from harness.verdicts.judge import apply_baseline

    entries = load_baseline(write(tmp_path, [refusal_entry(items=2)], oracle=LEGACY))

    def table(refused: int) -> pd.DataFrame:
        rows = [{**row(ORACLE_ERROR, REFUSED), "name": f"c{i}"} for i in range(refused)]
        rows.append({**row("parity", ""), "name": "ok"})
        return pd.DataFrame([{**r, "max_ulp": None, "mismatches": None, "elements": None} for r in rows])

    assert apply_baseline(table(2), {"equal_share"}, entries, ("layout",)).passed
    fewer = apply_baseline(table(1), {"equal_share"}, entries, ("layout",))
    assert fewer.verdict == "fail" and fewer.new.empty
    assert [e.reason for e in fewer.stale] == ["it counts 2 items refused, this run 1: why"]
    more = apply_baseline(table(3), {"equal_share"}, entries, ("layout",))
    assert more.verdict == "fail" and not more.stale
    assert list(more.new["name"]) == ["c2"]
    label = "equal_share family skew [layout] oracle-error"
    assert list(more.new["reason"]) == [f"beyond baseline: 3 items refused where the entry counts 2 ({label})"]


def test_a_baseline_judges_only_runs_of_its_oracle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    legacy = load_baseline(write(tmp_path, [refusal_entry()], oracle=LEGACY))
    check_baseline_oracle(legacy, LEGACY)
    with pytest.raises(CaseError, match=rf"measured against {LEGACY}, but this run's oracle is {PINNED}"):
        check_baseline_oracle(legacy, PINNED)
    # The shipped baseline of the pin, given to a gate against the legacy release: refused
    # before any oracle is started.
    code = main(["gate", "--suite", "smoke", "--port", "equal_share", "--oracle", LEGACY,
                 "--baseline", "cases/baselines/equal_share.json", "--out", str(tmp_path / "g")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"measured against {PINNED}, but this run's oracle is {LEGACY}" in err
    assert len(err.strip().splitlines()) == 1


def test_measuring_names_each_class_of_refusal() -> None:
    blank = {"max_ulp": None, "mismatches": None, "elements": None}
    table = pd.DataFrame(
        [
            {**row(ORACLE_ERROR, f"OracleRefusal: {LEGACY}: class one"), "name": "a", **blank},
            {**row(ORACLE_ERROR, f"OracleRefusal: {LEGACY}: class one"), "name": "b", **blank},
            {**row(ORACLE_ERROR, f"OracleRefusal: {LEGACY}: class two"), "name": "c", **blank},
            {**row(ORACLE_ERROR, f"OracleProcessError: {LEGACY}: died"), "name": "d", **blank},
        ]
    )
    entries = measure_entries(table, "equal_share", LEGACY)
    assert [(e["status"], e["error"], e["items"]) for e in entries] == [
        # A failure stays whole: no baseline may expect it (it is no refusal).
        (ORACLE_ERROR, f"OracleProcessError: {LEGACY}: died", 1),
        (ORACLE_ERROR, "class one", 2),
        (ORACLE_ERROR, "class two", 1),
    ]
