"""A hung port cannot hold a run, a gate or a night: after its calls time out
on HUNG_AFTER items compared in a row it is declared hung and the rest is not
run, and ``--time-limit`` boxes the whole run; either way everything measured
is written, the unreached items are not-run rows, and the verdict is never
PASS (harness/sides/work_box.py)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.sides.items import NOT_RUN, PARITY, PORT_ERROR, CaseResult, Status
from harness.sides.time_limits import is_timeout
from harness.sides.work_box import HUNG_AFTER, WorkBox

ROOT = Path(__file__).resolve().parent.parent
# A port that never answers a batch of fewer than 3 requests (30 of smoke's 88 layout cases).
HANGING = f"cmd:{sys.executable} {ROOT / 'tests' / 'fake_external_port.py'} --fault hang-few --requests-below 3"


def _result(status: Status, error: str | None = None, name: str = "c") -> CaseResult:
    return CaseResult(name, "f", "layout", status, error=error)


def test_only_timeouts_in_a_row_declare_a_port_hung() -> None:
    timeout = "ExternalPortError: port did not answer within 3 s"
    box = WorkBox()
    said = [box.stop_after(_result(PORT_ERROR, timeout, f"t{i}")) for i in range(HUNG_AFTER - 1)]
    # Not compared: neither counts nor breaks the row; any compared item breaks it.
    said.append(box.stop_after(_result(NOT_RUN, "the port does not implement this level")))
    said.append(box.stop_after(_result(PARITY)))
    said += [box.stop_after(_result(PORT_ERROR, "ValueError: bad", f"e{i}")) for i in range(HUNG_AFTER)]
    assert said == [None] * len(said)
    said = [box.stop_after(_result(PORT_ERROR, timeout, f"t{i}")) for i in range(HUNG_AFTER - 1)]
    said.append(box.stop_after(_result(NOT_RUN, "the port does not implement this level")))
    assert said == [None] * len(said)
    last = box.stop_after(_result(PORT_ERROR, timeout, "last"))
    assert last is not None and last.startswith(f"the port is hung: its calls timed out on {HUNG_AFTER} items in a row")
    assert box.short == "the port is hung"


def test_the_time_limit_stops_after_the_item_that_crosses_it() -> None:
    now = [0.0]
    box = WorkBox(10.0, clock=lambda: now[0])
    assert box.stop_after(_result(PARITY)) is None
    now[0] = 10.0
    said = box.stop_after(_result(PARITY))
    assert said is not None and "time limit (10 s, --time-limit) ran out" in said


def test_a_gate_on_a_hanging_port_stops_within_minutes_and_writes_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "gate"
    started = time.monotonic()
    code = main(
        ["gate", "--suite", "smoke", "--level", "layout", "--port", HANGING, "--timeout", "2", "--out", str(out)]
    )
    elapsed = time.monotonic() - started
    assert code == 1 and elapsed < 120, elapsed
    summary = (out / "summary.md").read_text()
    assert "## Parity gate: FAIL" in summary and "**Stopped early**: the port is hung" in summary
    table = pd.read_parquet(out / "results.parquet")
    timed_out = table[table["detail"].map(is_timeout)]
    # Every timeout is a small batch; the last HUNG_AFTER came in a row, and then nothing more was compared.
    assert len(timed_out) >= HUNG_AFTER and (table["status"] == NOT_RUN).sum() > 0
    last = int(timed_out["index"].max())
    assert (table.loc[table["index"] > last, "status"] == NOT_RUN).all()
    assert set(table.loc[table["index"] > last, "detail"]) == {"not compared: the run stopped early (the port is hung)"}
    assert (out / "junit.xml").is_file()


def test_a_run_under_its_time_limit_writes_what_it_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r.jsonl"
    argv = ["run", "--suite", "smoke", "--level", "layout", "--port", "per_request", "--time-limit", "0.001"]
    assert main([*argv, "--results", str(results)]) == 1
    out = capsys.readouterr().out
    assert "verdict INCOMPLETE" in out and "stopped early: the run's time limit (0.001 s, --time-limit) ran out" in out
    rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    assert rows and all(row["status"] == PARITY for row in rows)


def test_a_night_under_its_time_limit_is_incomplete_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--level", "layout", "--skip-mutants", "--explore-budget-s", "0", "--date", "2026-12-05"]
    code = main(
        ["nightly", "--size", "10", "--ports", "per_request", "--time-limit", "0.001", "--out", str(tmp_path), *argv]
    )
    capsys.readouterr()
    assert code != 0
    page = (tmp_path / "2026-12-05" / "index.html").read_text()
    assert "INCOMPLETE: the run&#x27;s time limit (0.001 s, --time-limit) ran out" in page
    assert not (tmp_path / "history.jsonl").exists() or "2026-12-05" not in (tmp_path / "history.jsonl").read_text()


def test_a_limit_that_runs_out_with_the_last_item_stops_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    case = str(ROOT / "cases" / "smoke" / "upstream-worst-case.json")
    argv = ["run", "--cases", case, "--level", "layout", "--port", "per_request", "--time-limit", "0.001"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "verdict PASS" in out and "stopped early" not in out


@pytest.mark.all_cores
def test_a_hung_ports_table_is_the_same_for_any_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What other workers finished past the stop is left out: the same rows with one worker or two."""
    tables = []
    for jobs in ("1", "2"):
        results = tmp_path / f"r{jobs}.jsonl"
        argv = ["run", "--suite", "smoke", "--level", "layout", "--port", HANGING, "--timeout", "2", "--jobs", jobs]
        assert main([*argv, "--results", str(results)]) == 1
        capsys.readouterr()
        rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
        tables.append([(row["id"], row["status"]) for row in rows])
    assert tables[0] == tables[1] and sum(status == PORT_ERROR for _, status in tables[0]) >= HUNG_AFTER


def test_a_gate_under_its_time_limit_writes_its_summary_and_never_passes(tmp_path: Path) -> None:
    out = tmp_path / "gate"
    argv = ["gate", "--suite", "smoke", "--level", "layout", "--port", "per_request", "--time-limit", "0.001"]
    code = main([*argv, "--out", str(out)])
    assert code != 0
    summary = (out / "summary.md").read_text()
    assert "## Parity gate: PASS" not in summary and "**Stopped early**" in summary, summary[:2000]
    assert "time limit (0.001 s, --time-limit) ran out" in summary
    table = pd.read_parquet(out / "results.parquet")
    # What was measured before the limit is kept; the rest is not run, and nothing was shrunk.
    assert (table["status"] == PARITY).any() and (table["status"] == NOT_RUN).any()
    assert not list(out.glob("shrunk*"))
