"""A port-error entry counts its items exactly (issue 31, item 2): a message
prefix alone would absorb any number of new refusals, so a port that came to
refuse more batches with the same message would stay "expected"."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.cases.fields import CaseError
from harness.cases.suites import load_suite
from harness.cli import main
from harness.model import Case, Layout
from harness.sides.items import DIVERGENT, PARITY, PORT_ERROR
from harness.verdicts.baseline import EXPECTED, NEW, load_baseline, measure_entries, port_names
from harness.verdicts.judge import apply_baseline
from ports.equal_share import EqualSharePort, grid_layout

# They pass --jobs or read the machine's cores: every core, not one xdist worker's (conftest).
pytestmark = pytest.mark.all_cores

REFUSAL = "ValueError: equal share of a "
SMOKE_LAYOUT = ["--suite", "smoke", "--level", "layout", "--jobs", "1", "--shrink-time", "0"]
MORE_SPEC = f"{__name__}:MORE"


def _extra_refusals() -> frozenset[str]:
    """Three smoke skew batches equal_share plans (its skew family refuses one already)."""
    planned = []
    for case in load_suite("smoke").cases:
        if case.family == "skew":
            try:
                grid_layout(case)
            except ValueError:
                continue
            planned.append(case.name)
    assert len(planned) > 3
    return frozenset(sorted(planned)[:3])


class MoreRefusals(EqualSharePort):
    """equal_share, refusing three more skew batches with its own message."""

    name = "equal_share_more"
    extra: frozenset[str] | None = None

    def plan_layout(self, case: Case) -> Layout:
        if MoreRefusals.extra is None:
            MoreRefusals.extra = _extra_refusals()
        if case.name in MoreRefusals.extra:
            with_context = sum(1 for c in case.context_lens if c > 0)
            raise ValueError(
                f"equal share of a {case.workspace_size}-row workspace over {with_context} prefills "
                f"is below one block ({case.block_size} rows)"
            )
        return super().plan_layout(case)


MORE = MoreRefusals()


def measured(table: pd.DataFrame, port: str) -> list[dict[str, Any]]:
    """The baseline tools/measure_baseline.py writes, in short: every port error
    of smoke's layout level is an equal-share refusal, counted per family."""
    entries = measure_entries(table, port)
    for e in entries:
        if e["status"] == PORT_ERROR:
            e["error"] = REFUSAL
        else:
            e.pop("items")
        e["reason"] = "measured"
    return entries


def write(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"entries": entries}), encoding="utf-8")
    return path


def skew_refusals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in entries if e["family"] == "skew" and e["status"] == PORT_ERROR)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """equal_share's smoke layout gate, no baseline (its divergences are new)."""
    out = tmp_path_factory.mktemp("plain") / "gate"
    assert main(["gate", *SMOKE_LAYOUT, "--port", "equal_share", "--out", str(out)]) == 1
    return out


def rejudge(capsys: pytest.CaptureFixture[str], gate_dir: Path, baseline: Path, out: Path) -> int:
    code = main(["merge", str(gate_dir), "--baseline", str(baseline), "--rejudge", "--out", str(out)])
    capsys.readouterr()
    return code


# -- the file ------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [None, 0, -1, 1.5, True, "3"])
def test_a_port_error_entry_must_count_its_items(tmp_path: Path, count: Any) -> None:
    entry: dict[str, Any] = {"family": "skew", "level": "layout", "status": PORT_ERROR, "error": REFUSAL}
    if count is not None:
        entry["items"] = count
    path = write(tmp_path / "b.json", [{"port": "equal_share", **entry, "reason": "r"}])
    with pytest.raises(CaseError, match=r"field 'entries\[0\]\.items': must count the items failing so") as raised:
        load_baseline(path)
    assert str(path) in str(raised.value)
    entry["items"] = 2
    assert load_baseline(write(path, [{"port": "equal_share", **entry, "reason": "r"}]))[0].items == 2


def test_a_port_error_entry_without_a_count_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    entry = {"port": "equal_share", "family": "skew", "level": "layout", "status": PORT_ERROR, "reason": "r"}
    baseline = write(tmp_path / "b.json", [entry])
    code = main(["gate", *SMOKE_LAYOUT, "--port", "equal_share", "--baseline", str(baseline), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{baseline}: field 'entries[0].items': must count the items failing so (an integer >= 1), got null" in err
    assert not (tmp_path / "summary.md").exists()


def test_the_shipped_baselines_count_every_error_entry() -> None:
    for path in sorted(Path(__file__).resolve().parent.parent.joinpath("cases", "baselines").glob("*.json")):
        errors = [e for e in load_baseline(path) if e.status != DIVERGENT]
        assert errors and all(e.items is not None and e.items >= 1 for e in errors), path


# -- the gate ------------------------------------------------------------------------------


def test_more_refusals_with_the_same_message_are_new(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, plain: Path
) -> None:
    entries = measured(pd.read_parquet(plain / "results.parquet"), MORE.name)
    counted = skew_refusals(entries)["items"]
    baseline = write(tmp_path / "baseline.json", entries)
    code = main(["gate", *SMOKE_LAYOUT, "--port", MORE_SPEC, "--baseline", str(baseline), "--out", str(tmp_path / "o")])
    capsys.readouterr()
    assert code == 1
    table = pd.read_parquet(tmp_path / "o" / "results.parquet")
    refused = table[(table["family"] == "skew") & (table["status"] == PORT_ERROR)]
    assert len(refused) == counted + 3 and refused["detail"].str.startswith(REFUSAL).all()
    label = f"{MORE.name} family skew [layout] port-error"
    why = f"beyond baseline: {counted + 3} port errors where the entry counts {counted} ({label})"
    assert list(refused["baseline"]) == [EXPECTED] * counted + [NEW] * 3
    assert list(refused[refused["baseline"] == NEW]["reason"]) == [why] * 3
    assert set(table[table["baseline"] == NEW]["id"]) == set(refused[refused["baseline"] == NEW]["id"])
    summary = (tmp_path / "o" / "summary.md").read_text(encoding="utf-8")
    assert summary.startswith("## Parity gate: FAIL") and "3 new divergences" in summary
    assert f"baseline: {why}" in summary and "0 stale baseline entries" in summary  # the entry is not stale
    failures = ET.parse(tmp_path / "o" / "junit.xml").getroot().findall(".//failure")
    assert len(failures) == 3 and all(f.get("message", "").startswith(why) for f in failures)
    # Counted as measured on that port, the same run passes: it is the count that failed it.
    remeasured = write(tmp_path / "more.json", measured(table, MORE.name))
    assert rejudge(capsys, tmp_path / "o", remeasured, tmp_path / "r") == 0


def test_fewer_refusals_make_the_entry_miscounted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, plain: Path
) -> None:
    entries = measured(pd.read_parquet(plain / "results.parquet"), "equal_share")
    assert rejudge(capsys, plain, write(tmp_path / "exact.json", entries), tmp_path / "exact") == 0
    skew = skew_refusals(entries)
    counted = skew["items"]
    skew["items"] = counted + 2
    assert rejudge(capsys, plain, write(tmp_path / "more.json", entries), tmp_path / "o") == 1
    summary = (tmp_path / "o" / "summary.md").read_text(encoding="utf-8")
    assert "0 new divergences" in summary and "1 stale baseline entries" in summary
    miscounted = f"it counts {counted + 2} port errors, this run {counted}: measured"
    assert f"- equal_share family skew [layout] port-error: {miscounted}" in summary
    stale = [
        c for c in ET.parse(tmp_path / "o" / "junit.xml").getroot().findall(".//testcase")
        if c.get("classname", "").endswith(".baseline")
    ]  # fmt: skip
    assert len(stale) == 1 and stale[0].find("failure") is not None


# -- the rule, on a table ------------------------------------------------------------------


def row(name: str, status: str, detail: str = f"{REFUSAL}16-row workspace ...") -> dict[str, Any]:
    return {"name": name, "family": "skew", "level": "layout", "status": status, "detail": detail,
            "max_ulp": None, "mismatches": None, "elements": None}  # fmt: skip


def test_counts_are_a_whole_run_check(tmp_path: Path) -> None:
    """Items beyond the count are new in table order, in any table (a shard's
    too: more in a part are more in the whole); only a whole run (``check_stale``)
    says an entry matched fewer; parity rows and other statuses do not count."""
    entry = {"port": "equal_share", "family": "skew", "level": "layout", "status": PORT_ERROR,
             "error": REFUSAL, "items": 2, "reason": "r"}  # fmt: skip
    entries = load_baseline(write(tmp_path / "b.json", [entry]))
    ports = port_names("equal_share")
    rows = [row("a", PORT_ERROR), row("p", PARITY, ""), row("b", PORT_ERROR), row("c", PORT_ERROR)]
    whole = apply_baseline(pd.DataFrame(rows), ports, entries, ("layout",))
    assert list(whole.table["baseline"]) == [EXPECTED, "", EXPECTED, NEW] and not whole.stale
    assert whole.verdict == "fail"
    shard = apply_baseline(pd.DataFrame(rows), ports, entries, ("layout",), check_stale=False)
    assert list(shard.table["baseline"]) == [EXPECTED, "", EXPECTED, NEW] and not shard.passed
    part = apply_baseline(pd.DataFrame(rows[:2]), ports, entries, ("layout",), check_stale=False)
    assert part.passed and not part.stale
    exact = apply_baseline(pd.DataFrame(rows[:3]), ports, entries, ("layout",))
    assert exact.passed
    fewer = apply_baseline(pd.DataFrame(rows[:2]), ports, entries, ("layout",))
    assert [e.reason for e in fewer.stale] == ["it counts 2 port errors, this run 1: r"] and fewer.verdict == "fail"
