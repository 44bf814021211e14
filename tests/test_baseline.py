"""Baseline entries are precise expectations (issue 11, hole 5): a status, caps,
a field or an error text; an item beyond its entry is new; an entry naming what
the suite or the harness does not have is bad input, never stale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.cases.fields import CaseError
from harness.cases.suites import load_suite
from harness.verdicts.baseline import (
    EXPECTED,
    NEW,
    SuiteTargets,
    check_baseline_targets,
    divergent_field,
    judge_item,
    load_baseline,
    measure_entries,
    port_names,
)
from harness.verdicts.judge import apply_baseline

PORTS = port_names("equal_share", "equal_share")
PREFILL: dict[str, Any] = {
    "family": "skew",
    "level": "prefill",
    "status": "divergent",
    "max_ulp": 8,
    "max_mismatch_fraction": 0.01,
}


def write(tmp_path: Path, entries: list[dict[str, Any]], port: str | None = "equal_share") -> Path:
    path = tmp_path / "baseline.json"
    data: dict[str, Any] = {"entries": [{"reason": "measured", **e} for e in entries]}
    if port is not None:
        data["port"] = port
    path.write_text(json.dumps(data))
    return path


def entries_of(tmp_path: Path, *entries: dict[str, Any]) -> list[Any]:
    return load_baseline(write(tmp_path, list(entries)))


def row(status: str = "divergent", level: str = "prefill", **kw: Any) -> dict[str, Any]:
    base = {"name": "skew-0001", "family": "skew", "level": level, "status": status, "detail": "",
            "max_ulp": 0, "mismatches": 0, "elements": 1000}  # fmt: skip
    return {**base, **kw}


# -- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"family": "skew", "level": "layout"}, "entries[0].status"),
        ({"family": "skew", "level": "layout", "status": "oracle-error"}, "entries[0].status"),
        (
            {"family": "skew", "level": "prefill", "status": "divergent", "max_ulp": 3},
            "entries[0].max_mismatch_fraction",
        ),
        ({**PREFILL, "max_ulp": True}, "entries[0].max_ulp"),
        ({**PREFILL, "max_ulp": -1}, "entries[0].max_ulp"),
        ({**PREFILL, "max_ulp": 2.5}, "entries[0].max_ulp"),
        ({**PREFILL, "max_mismatch_fraction": 0}, "entries[0].max_mismatch_fraction"),
        ({**PREFILL, "max_mismatch_fraction": 1.5}, "entries[0].max_mismatch_fraction"),
        ({**PREFILL, "max_mismatch_fraction": "1%"}, "entries[0].max_mismatch_fraction"),
        ({"family": "skew", "level": "layout", "status": "divergent", "max_ulp": 1}, "entries[0].max_ulp"),
        ({"family": "skew", "level": "prefill", "status": "port-error", "max_ulp": 1}, "entries[0].max_ulp"),
        ({**PREFILL, "field": "starts"}, "entries[0].field"),
        ({"family": "skew", "level": "layout", "status": "port-error", "field": "starts"}, "entries[0].field"),
        ({"family": "skew", "level": "layout", "status": "divergent", "error": "ValueError"}, "entries[0].error"),
        ({"family": "skew", "level": "layout", "status": "divergent", "field": ""}, "entries[0].field"),
        ({"case": "", "level": "layout", "status": "divergent"}, "entries[0].case"),
        ({"family": "skew", "level": "layout", "status": "divergent", "why": 1}, "entries[0].why"),
    ],
)
def test_bad_entry_names_the_field(tmp_path: Path, entry: dict[str, Any], field: str) -> None:
    with pytest.raises(CaseError) as info:
        load_baseline(write(tmp_path, [entry]))
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_unknown_file_field_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"port": "equal_share", "entries": [], "ports": []}))
    with pytest.raises(CaseError) as info:
        load_baseline(path)
    assert info.value.field == "ports"


def test_entry_round_trips(tmp_path: Path) -> None:
    entries: list[dict[str, Any]] = [
        {"port": "equal_share", "family": "skew", "level": "layout", "status": "divergent", "field": "starts"},
        {
            "port": "equal_share",
            "case": "c",
            "level": "layout",
            "status": "port-error",
            "error": "ValueError",
            "items": 1,
        },
        {"port": "equal_share", **PREFILL},
    ]
    loaded = load_baseline(write(tmp_path, entries, port=None))
    assert [e.to_json() for e in loaded] == [{**e, "reason": "measured"} for e in entries]


# -- checking against the suite and the port ----------------------------------------------


@pytest.fixture(scope="module")
def smoke_targets() -> SuiteTargets:
    return SuiteTargets.of_suite(load_suite("smoke"))


@pytest.mark.parametrize(
    ("entry", "field", "says"),
    [
        ({"family": "skw", "level": "layout", "status": "divergent"}, "entries[0].family", "no layout item of family"),
        ({"case": "skew-9999", "level": "layout", "status": "divergent"}, "entries[0].case", "no layout item named"),
        ({"port": "equal_shar", "family": "skew", "level": "layout", "status": "divergent"}, "entries[0].port",
         "names port 'equal_shar'"),
    ],
)  # fmt: skip
def test_entry_naming_what_cannot_exist_is_bad_input(
    tmp_path: Path, smoke_targets: SuiteTargets, entry: dict[str, Any], field: str, says: str
) -> None:
    entries = entries_of(tmp_path, entry)
    with pytest.raises(CaseError) as info:
        check_baseline_targets(entries, smoke_targets, PORTS)
    assert info.value.field == field and says in str(info.value)
    assert str(info.value).startswith(str(tmp_path / "baseline.json"))


def test_known_ports_and_spellings_are_accepted(tmp_path: Path, smoke_targets: SuiteTargets) -> None:
    entries = entries_of(
        tmp_path,
        {"port": "per_request", "family": "skew", "level": "layout", "status": "divergent"},
        {"port": "mutant:legacy-grid", "family": "skew", "level": "layout", "status": "divergent"},
        {"port": "cpp-per-request", "family": "skew", "level": "layout", "status": "divergent"},
        {"port": "tests.ports:CPP", "family": "skew", "level": "layout", "status": "divergent"},
    )
    # The port under test is named cpp-per-request and was loaded as tests.ports:CPP.
    check_baseline_targets(entries, smoke_targets, port_names("cpp-per-request", "tests.ports:CPP"))
    with pytest.raises(CaseError, match="neither the port under test"):
        check_baseline_targets(entries, smoke_targets, PORTS)


def test_families_are_checked_per_level(tmp_path: Path, smoke_targets: SuiteTargets) -> None:
    merge_family = sorted(smoke_targets.families["merge"])[0]
    check_baseline_targets(entries_of(tmp_path, {**PREFILL, "level": "merge", "family": merge_family}),
                           smoke_targets, PORTS)  # fmt: skip
    with pytest.raises(CaseError, match=f"no prefill item of family '{merge_family}'"):
        check_baseline_targets(entries_of(tmp_path, {**PREFILL, "family": merge_family}), smoke_targets, PORTS)


def test_a_baseline_for_another_port_is_refused(tmp_path: Path, smoke_targets: SuiteTargets) -> None:
    """``--port per_request --baseline equal_share.json``: no entry could ever apply."""
    skew = {"family": "skew", "level": "layout", "status": "divergent"}
    entries = entries_of(tmp_path, skew)
    under_test = port_names("per_request", "per_request")
    with pytest.raises(CaseError) as info:
        check_baseline_targets(entries, smoke_targets, under_test)
    message = str(info.value)
    assert info.value.field == "port" and "\n" not in message
    assert message.startswith(f"{tmp_path / 'baseline.json'}: field 'port': the baseline is for port equal_share, ")
    assert "not the port under test (per_request, ports.per_request:PORT)" in message
    # A file that names the port under test too is a shared baseline: accepted.
    shared = entries_of(tmp_path, skew, {"port": "per_request", **skew})
    check_baseline_targets(shared, smoke_targets, under_test)
    # An empty baseline says "nothing is expected", whatever port it was written for.
    check_baseline_targets(entries_of(tmp_path), smoke_targets, under_test)


def test_the_port_is_refused_before_any_of_its_targets(tmp_path: Path, smoke_targets: SuiteTargets) -> None:
    # The family is not in smoke, but the mistake to report is the port.
    entries = entries_of(tmp_path, {"family": "not-a-family", "level": "layout", "status": "divergent"})
    with pytest.raises(CaseError) as info:
        check_baseline_targets(entries, smoke_targets, port_names("per_request", "per_request"))
    assert info.value.field == "port"


@pytest.mark.parametrize("spec", ["mutant:legacy-grid", "tests.value_ports:FloatFieldPort"])
def test_entries_match_the_port_by_its_name_and_by_its_port_spelling(
    tmp_path: Path, smoke_targets: SuiteTargets, spec: str
) -> None:
    from harness.sides.loading import load_port

    name = load_port(spec).name
    assert name != spec  # the two spellings differ, so both must be accepted
    under_test = port_names(name, spec)
    item = row(max_ulp=1, mismatches=1)
    for spelling in (name, spec):
        entries = load_baseline(write(tmp_path, [PREFILL], port=spelling))
        check_baseline_targets(entries, smoke_targets, under_test)
        assert judge_item(entries, under_test, item).label == EXPECTED, spelling
        assert judge_item(entries, port_names("equal_share", "equal_share"), item).label == NEW, spelling


def test_the_gate_refuses_another_port_baseline_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    baseline = root / "cases" / "baselines" / "equal_share.json"
    argv = ["gate", "--suite", "smoke", "--port", "per_request", "--baseline", str(baseline), "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, "-m", "harness", *argv], cwd=root, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        f"parity: error: {baseline}: field 'port': the baseline is for port equal_share, not the port under test "
        "(per_request, ports.per_request:PORT): none of its entries would apply "
        "(name the port under test, by its name or its --port spelling)"
    ]
    assert not (tmp_path / "summary.md").exists()  # refused before anything ran


# -- judging items -------------------------------------------------------------------------


def test_within_caps_is_expected_beyond_is_new(tmp_path: Path) -> None:
    entries = entries_of(tmp_path, PREFILL)
    assert judge_item(entries, PORTS, row(max_ulp=8, mismatches=10)).label == EXPECTED
    beyond = judge_item(entries, PORTS, row(max_ulp=30298, mismatches=10))
    assert beyond.label == NEW and beyond.note.startswith("beyond baseline: 30298 ULP > cap 8")
    wide = judge_item(entries, PORTS, row(max_ulp=2, mismatches=11))
    assert wide.label == NEW and "mismatch fraction 0.011 (11/1000) > cap 0.01" in wide.note


def test_missing_element_count_is_never_trusted(tmp_path: Path) -> None:
    entries = entries_of(tmp_path, PREFILL)
    verdict = judge_item(entries, PORTS, {**row(max_ulp=1, mismatches=1), "elements": None})
    assert verdict.label == NEW and "no element counts" in verdict.note


def test_status_must_match(tmp_path: Path) -> None:
    entries = entries_of(tmp_path, PREFILL)
    verdict = judge_item(entries, PORTS, row("port-error", detail="ValueError: boom"))
    assert verdict.label == NEW
    assert verdict.note.startswith("beyond baseline: status port-error, the baseline expects divergent")


def test_two_statuses_need_two_entries(tmp_path: Path) -> None:
    entries = entries_of(tmp_path, PREFILL, {"family": "skew", "level": "prefill", "status": "port-error",
                                             "error": "ValueError: mcc", "items": 1})  # fmt: skip
    assert judge_item(entries, PORTS, row("port-error", detail="ValueError: mcc is 0")).label == EXPECTED
    other = judge_item(entries, PORTS, row("port-error", detail="IndexError: out of range"))
    assert other.label == NEW and "the error does not contain 'ValueError: mcc'" in other.note
    assert judge_item(entries, PORTS, row(max_ulp=1, mismatches=1)).label == EXPECTED


def test_an_oracle_error_or_not_run_is_never_expected(tmp_path: Path) -> None:
    entries = entries_of(tmp_path, {"family": "skew", "level": "prefill", "status": "port-error", "items": 1})
    oracle = judge_item(entries, PORTS, row("oracle-error", detail="RuntimeError"))
    assert oracle.label == NEW and "never expected" in oracle.note
    assert judge_item(entries, PORTS, row("not-run")).label == ""


def test_layout_field(tmp_path: Path) -> None:
    entries = entries_of(tmp_path, {"family": "skew", "level": "layout", "status": "divergent", "field": "starts"})
    at_starts = row(level="layout", detail="chunk 2, field starts: oracle [0] != port [16]")
    assert judge_item(entries, PORTS, at_starts).label == EXPECTED
    at_count = judge_item(entries, PORTS, row(level="layout", detail="field num_chunks: oracle 1 != port 30"))
    assert at_count.label == NEW and "first divergent field num_chunks, the baseline expects starts" in at_count.note
    assert divergent_field("field workspace_size: oracle 2048 != port 4096") == "workspace_size"


def test_case_entry_wins_and_ports_match_by_any_name(tmp_path: Path) -> None:
    case_entry = {k: v for k, v in PREFILL.items() if k != "family"} | {"case": "skew-0001", "max_ulp": 100}
    entries = entries_of(tmp_path, PREFILL, case_entry)  # the family entry comes first in the file
    big = row(max_ulp=50, mismatches=1)
    assert judge_item(entries, PORTS, big).label == EXPECTED
    assert judge_item(entries, PORTS, {**big, "name": "skew-0002"}).label == NEW
    spelled = load_baseline(write(tmp_path, [PREFILL], port="ports.equal_share:PORT"))
    assert judge_item(spelled, port_names("equal_share", "ports.equal_share:PORT"), row(max_ulp=1)).label == EXPECTED
    # A built-in port answers to both of its spellings, whichever --port used.
    assert judge_item(spelled, port_names("equal_share", "equal_share"), row(max_ulp=1)).label == EXPECTED
    assert judge_item(spelled, port_names("my-port", "mypkg.ports:PORT"), row(max_ulp=1)).label == NEW


def test_stale_means_no_item_matches_any_more(tmp_path: Path) -> None:
    entries = entries_of(
        tmp_path,
        PREFILL,
        {"family": "skew", "level": "prefill", "status": "port-error", "items": 1},
        {"family": "skew", "level": "layout", "status": "divergent", "field": "starts"},
        {"port": "per_request", "family": "skew", "level": "layout", "status": "divergent"},
    )
    table = pd.DataFrame([
        {**row(max_ulp=99, mismatches=1), "index": 0},  # beyond its entry: new, the entry still lives
        {**row(level="layout", detail="field num_chunks: oracle 1 != port 2"), "index": 1},
    ])  # fmt: skip
    verdict = apply_baseline(table, PORTS, entries, ("layout", "prefill"))
    assert list(verdict.table["baseline"]) == [NEW, NEW]
    # port-error and the field entry match nothing; the other port's entry is not this gate's.
    assert [e.status for e in verdict.stale] == ["port-error", "divergent"]
    assert verdict.stale[1].field == "starts"
    assert verdict.verdict == "fail"


def test_only_not_run_items_make_the_verdict_incomplete(tmp_path: Path) -> None:
    table = pd.DataFrame([{**row("parity"), "index": 0}, {**row("not-run"), "index": 1}])
    verdict = apply_baseline(table, PORTS, [], ("prefill",))
    assert not verdict.passed and verdict.verdict == "incomplete"


def test_measured_entries_expect_exactly_what_was_measured(tmp_path: Path) -> None:
    table = pd.DataFrame([
        {**row(max_ulp=7, mismatches=3), "index": 0},
        {**row(max_ulp=2, mismatches=9), "index": 1, "name": "skew-0002"},
        {**row("port-error", detail="ValueError: x"), "index": 2, "name": "skew-0003"},
        {**row(level="layout", detail="field num_chunks: oracle 1 != port 2"), "index": 3},
        {**row(level="layout", detail="chunk 0, field starts: oracle 1 != port 2"), "index": 4},
        {**row("parity"), "index": 5, "name": "skew-0004"},
    ])  # fmt: skip
    measured = measure_entries(table, "equal_share")
    for e in measured:
        # A port-error entry keeps its count (a baseline field); the others drop it.
        assert (e["items"] if e["status"] == "port-error" else e.pop("items")) >= 1 and e["reason"] == ""
        e["reason"] = "measured"
    assert [(e["level"], e["status"], e.get("field")) for e in measured] == [
        ("layout", "divergent", "num_chunks"),
        ("layout", "divergent", "starts"),
        ("prefill", "divergent", None),
        ("prefill", "port-error", None),
    ]
    assert measured[2]["max_ulp"] == 7 and measured[2]["max_mismatch_fraction"] == 9 / 1000
    verdict = apply_baseline(table, PORTS, entries_of(tmp_path, *measured), ("layout", "prefill"))
    assert verdict.passed and len(verdict.expected) == 5
    measured[2]["max_ulp"] = 6  # one ULP tighter: the 7-ULP item is new
    verdict = apply_baseline(table, PORTS, entries_of(tmp_path, *measured), ("layout", "prefill"))
    assert list(verdict.new["name"]) == ["skew-0001"] and not verdict.stale
    assert verdict.new["reason"].iloc[0].startswith("beyond baseline: 7 ULP > cap 6")


def test_a_case_entry_is_not_loosened_by_its_family(tmp_path: Path) -> None:
    """A tighter case entry judges its case alone: a looser family cap cannot
    turn an item beyond the case's cap back into an expected one."""
    family = PREFILL | {"max_ulp": 1000}
    case_entry = {k: v for k, v in PREFILL.items() if k != "family"} | {"case": "skew-0001", "max_ulp": 10}
    entries = entries_of(tmp_path, family, case_entry)
    verdict = judge_item(entries, PORTS, row(max_ulp=50, mismatches=1))
    assert verdict.label == NEW and "50 ULP > cap 10" in verdict.note
    assert judge_item(entries, PORTS, {**row(max_ulp=50, mismatches=1), "name": "skew-0002"}).label == EXPECTED
