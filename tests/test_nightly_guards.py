"""The night's guards: the date, baselines, the history store, the lock, the
INCOMPLETE banner while later steps run, and harness/night/nightly.py's independence
from reports/. Through harness.night.nightly directly (tests/test_nightly.py drives
the command)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import harness.night.nightly as nightly
from harness.cases.fields import CaseError
from harness.cases.suites import Suite, load_suite
from harness.cli import main
from harness.night.baselines import BASELINES_DIR, nightly_baselines, parse_baseline_options
from harness.night.data import Night, night_exit_code
from harness.night.folder import nightly_lock, validate_night_date
from harness.night.history import append_history, read_history
from harness.night.nightly import NightlyPlan, run_nightly
from harness.protocol.port import Port
from harness.verdicts.baseline import load_baseline
from reports.nightly import write_report
from reports.nightly_plots import history_figures
from tests.test_nightly_page import clean_rows, night_of, port_night

ROOT = Path(__file__).resolve().parent.parent


def test_the_date_is_a_date_and_nothing_else() -> None:
    assert validate_night_date("2026-11-28") == "2026-11-28"
    for bad in (
        "../escape",
        "2026-11-28/../../x",
        "2026-13-01",
        "2026-02-30",
        "2026-1-1",
        "",
        "20261128",
        "\uff12\uff10\uff12\uff16-11-28",
    ):
        with pytest.raises(CaseError) as caught:
            validate_night_date(bad)
        message = str(caught.value)
        assert message.startswith("--date: ") and "\n" not in message and repr(bad) in message


def test_baselines_default_per_builtin_port_and_refuse_bad_input(
    tmp_path: Path, per_request: Port, equal_share: Port
) -> None:
    ports, specs = [per_request, equal_share], ["per_request", "equal_share"]
    default = nightly_baselines(ports, specs, {})
    # equal_share has a shipped baseline measured on the nightly suite, per_request none;
    # a suite without its own file falls back to the ci suite's (the gate's).
    assert set(default) == {"equal_share"}
    assert default["equal_share"].source == "cases/baselines/equal_share-nightly.json"
    assert list(default["equal_share"].entries) == load_baseline(BASELINES_DIR / "equal_share-nightly.json")
    smoke = nightly_baselines(ports, specs, {}, suite="smoke")
    assert smoke["equal_share"].source == "cases/baselines/equal_share.json"
    # PORT=none: no baseline; PORT=FILE by either spelling replaces the default.
    assert nightly_baselines(ports, specs, parse_baseline_options(["equal_share=none"])) == {}
    own = tmp_path / "mine.json"
    own.write_text(json.dumps({"port": "equal_share", "entries": []}), encoding="utf-8")
    given = nightly_baselines(ports, specs, parse_baseline_options([f"ports.equal_share:PORT={own}"]))
    assert given["equal_share"].source == str(own) and given["equal_share"].entries == ()
    # Bad input: one line naming the option or the file and why.
    refusals = {
        "equal_share": "is not PORT=FILE",
        "=x.json": "is not PORT=FILE",
        "nosuch=x.json": "'nosuch' is not one of the night's ports",
        f"per_request={BASELINES_DIR / 'equal_share.json'}": "not the port under test",
        f"equal_share={tmp_path / 'missing.json'}": "cannot read",
    }
    for option, reason in refusals.items():
        with pytest.raises(CaseError) as caught:
            nightly_baselines(ports, specs, parse_baseline_options([option]))
        assert reason in str(caught.value) and "\n" not in str(caught.value), option
    with pytest.raises(CaseError, match="given twice"):
        parse_baseline_options(["equal_share=a.json", "equal_share=b.json"])


def test_a_corrupt_history_line_is_reported_and_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.jsonl"
    good = {"date": "2026-11-26", "port": "per_request", "suite": "nightly", "items": 10, "pass_rate": 1.0}
    lines = [
        json.dumps(good),
        '{"date": "2026-11-27", "port": "per_',  # cut off mid-write
        json.dumps({**good, "date": "../escape"}),  # what --date ../escape used to leave
        json.dumps({**good, "date": "2026-11-27", "pass_rate": "high"}),
        "",
        json.dumps([1, 2]),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    history = read_history(path)
    assert history["date"].tolist() == ["2026-11-26"]
    warnings = capsys.readouterr().err.splitlines()
    assert [w.split(": skipped")[0] for w in warnings] == [f"parity: warning: {path}:{n}" for n in (2, 3, 4, 6)]
    assert "'date' is \"../escape\", not a date" in warnings[1] and "'pass_rate'" in warnings[2]
    # Plotting what was read works (it used to raise a pandas traceback).
    assert len(history_figures(history)) == 2
    # Appending tonight keeps the corrupt lines as they were (still reported), and the records in order.
    appended = append_history(path, night_of(port_night("per_request", clean_rows())))
    assert appended["date"].tolist() == ["2026-11-26", "2026-11-28"]
    assert appended["verdict"].tolist()[-1] == "pass" and appended["new"].tolist()[-1] == 0
    kept = path.read_text(encoding="utf-8").splitlines()
    assert kept[:4] == [lines[1], lines[2], lines[3], lines[5]]
    assert [json.loads(line)["date"] for line in kept[4:]] == ["2026-11-26", "2026-11-28"]
    read_history(path)
    assert len(capsys.readouterr().err.splitlines()) == 4


HOLD_LOCK = """
import sys, time
from pathlib import Path
from harness.night.folder import nightly_lock
with nightly_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def tiny_suite() -> Suite:
    """Three of the smoke suite's layout cases: a night of seconds."""
    layout = [c for c in load_suite("smoke").cases if c.numeric is None][:3]
    return Suite("tiny", tuple(layout), ())


def plan_for(out: Path, date: str = "2026-11-28", **kwargs: Any) -> NightlyPlan:
    (out / "no-gpu").mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {"mutants": False, "gpu_reports": out / "no-gpu"}
    fields.update(kwargs)
    return NightlyPlan(date, tiny_suite(), ("layout",), None, out / date, out / "history.jsonl", **fields)


def test_a_second_night_into_the_same_out_refuses(tmp_path: Path, oracle: Port, per_request: Port) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(CaseError) as caught:
            run_nightly(plan_for(tmp_path), oracle, [per_request], {}, write_report=write_report)
        message = str(caught.value)
        assert message.startswith(f"{tmp_path / '.nightly.lock'}: another parity nightly (pid {holder.pid}")
        assert "\n" not in message
        assert not (tmp_path / "2026-11-28").exists()  # refused before writing anything
    finally:
        holder.kill()
        holder.wait()
    # The holder gone, its lock went with it; the lock is re-entrant within a process.
    with nightly_lock(tmp_path), nightly_lock(tmp_path):
        pass
    with nightly_lock(tmp_path):
        pass


def test_the_banner_says_incomplete_while_the_kill_matrix_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, oracle: Port, per_request: Port
) -> None:
    seen: dict[str, Any] = {}
    plan = plan_for(tmp_path, mutants=True)

    def kill_matrix_running(oracle: Port, plan: NightlyPlan) -> dict[str, Any]:
        # What a reader sees while the mutants run: the page and night.json as written so far.
        seen["page"] = (plan.out_dir / "index.html").read_text(encoding="utf-8")
        seen["markdown"] = (plan.out_dir / "report.md").read_text(encoding="utf-8")
        seen["meta"] = json.loads((plan.out_dir / "night.json").read_text(encoding="utf-8"))
        seen["history"] = (plan.history).exists()
        return {"suite": plan.suite.name, "levels": list(plan.levels), "mutants": []}

    monkeypatch.setattr(nightly, "_kill_matrix", kill_matrix_running)
    night = run_nightly(plan, oracle, [per_request], {}, write_report=write_report)
    assert night.complete and night.pending == []
    page = seen["page"]
    assert 'id="incomplete"' in page and "INCOMPLETE: the night is still running (the mutant kill matrix)" in page
    assert "Verdict (every port, against its baseline): INCOMPLETE" in page and "stopped" not in page
    assert "**INCOMPLETE**: the night is still running (the mutant kill matrix)" in seen["markdown"]
    assert seen["meta"]["complete"] is False and seen["meta"]["pending"] == ["the mutant kill matrix"]
    assert seen["history"] is False  # not history until complete
    final = (plan.out_dir / "index.html").read_text(encoding="utf-8")
    assert 'id="incomplete"' not in final and "against its baseline): PASS" in final
    assert read_history(tmp_path / "history.jsonl")["date"].tolist() == ["2026-11-28"]

    # Stopped during the kill matrix: says where, keeps what finished, is not history.
    def kill_matrix_interrupted(oracle: Port, plan: NightlyPlan) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(nightly, "_kill_matrix", kill_matrix_interrupted)
    night = run_nightly(
        plan_for(tmp_path, "2026-11-29", mutants=True), oracle, [per_request], {}, write_report=write_report
    )
    assert not night.complete and night.interrupted and night_exit_code(night) == 130
    page = (tmp_path / "2026-11-29" / "index.html").read_text(encoding="utf-8")
    assert f"INCOMPLETE: the run stopped during the mutant kill matrix, after {len(night.ports[0].table)} of" in page
    assert read_history(tmp_path / "history.jsonl")["date"].tolist() == ["2026-11-28"]


def test_a_night_before_any_port_says_what_is_to_come(tmp_path: Path, oracle: Port, per_request: Port) -> None:
    pages: list[str] = []

    def record(night: Night, out_dir: Path, history: Any) -> None:
        write_report(night, out_dir, history)
        pages.append((out_dir / "report.md").read_text(encoding="utf-8"))

    run_nightly(plan_for(tmp_path, explore_budget_s=0.0), oracle, [per_request, per_request], {}, write_report=record)
    assert "still running (port per_request; still to come: port per_request)" in pages[0]
    assert "still running (port per_request); " in pages[1] and "INCOMPLETE" not in pages[-1]


def test_harness_nightly_does_not_import_reports() -> None:
    tree = ast.parse((ROOT / "harness" / "night" / "nightly.py").read_text(encoding="utf-8"))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and not [m for m in imported if m == "reports" or m.startswith("reports.")]
    code = "import sys, harness.night.nightly; print(sorted(m for m in sys.modules if m.split('.')[0] == 'reports'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_lock_is_released_when_the_holder_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
    holder.kill()  # no clean exit: the kernel drops an flock with its holder
    holder.wait()
    deadline = time.monotonic() + 5
    while True:
        try:
            with nightly_lock(tmp_path):
                break
        except CaseError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_history_line_that_is_not_utf8_is_skipped_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "history.jsonl"
    good = {"date": "2026-11-26", "port": "per_request", "suite": "nightly", "items": 10, "pass_rate": 1.0}
    path.write_bytes(json.dumps(good).encode() + b'\n{"date": "2026-11-27", "port": "\xc3\n')
    assert read_history(path)["date"].tolist() == ["2026-11-26"]
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"parity: warning: {path}:2") and "not UTF-8" in warning


def test_an_interrupted_port_is_incomplete_never_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["nightly", "--size", "20", "--ports", "tests.fault_ports:InterruptingPort", "--level", "layout",
            "--skip-mutants", "--explore-budget-s", "0", "--out", str(tmp_path), "--date", "2026-11-29"]  # fmt: skip
    assert main(argv) == 130
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("interrupting")]
    assert line.split()[1] == "INCOMPLETE", line
    assert main([*argv[:-1], ""]) == 2  # --date "" is not today: it is refused


def test_a_pooled_night_needs_each_ports_spelling(tmp_path: Path, oracle: Port, per_request: Port) -> None:
    """Workers load ports from their spellings: without them a pooled night would
    judge whatever the names load, not the Port objects given."""
    pool: Any = object()  # refused before the pool is used
    with pytest.raises(ValueError, match="needs the spelling of each of its 1 ports"):
        run_nightly(plan_for(tmp_path, pool=pool), oracle, [per_request], {}, write_report=write_report)
    assert not (tmp_path / "2026-11-28").exists()


def test_an_item_the_night_loses_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, oracle: Port, per_request: Port
) -> None:
    """A result stream one item short (a harness fault) leaves that item not-run:
    the port's night is INCOMPLETE, never PASS."""
    import harness.night.nightly
    from harness.sides.item_stream import ItemStream
    from harness.sides.item_stream import stream_items as real

    def one_short(*args: Any, **kwargs: Any) -> ItemStream:
        return ItemStream(iter(list(real(*args, **kwargs))[1:]), None)

    monkeypatch.setattr(harness.night.nightly, "stream_items", one_short)
    night = run_nightly(plan_for(tmp_path), oracle, [per_request], {}, write_report=write_report)
    (port_night,) = night.ports
    assert port_night.summary["verdict"] == "incomplete", port_night.summary
    lost = port_night.table[port_night.table["status"] == "not-run"]
    assert len(lost) == 1 and "without comparing it" in lost["detail"].iloc[0]


def test_progress_names_the_port_it_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], oracle: Port, per_request: Port, equal_share: Port
) -> None:
    from harness.commands.nightly import port_progress
    from harness.engine import ProgressLines

    asked: list[tuple[int, str]] = []

    def progress(total: int, what: str) -> tuple[Any, Any]:
        asked.append((total, what))
        return None, None

    plan = plan_for(tmp_path, baselines={"equal_share": None})
    run_nightly(plan, oracle, [per_request, equal_share], {}, write_report=write_report, progress=progress)
    assert asked == [(3, "items of port per_request"), (3, "items of port equal_share")]
    # In a log (no terminal), each progress line names the port.
    lines, advance = port_progress(3, asked[1][1])
    assert isinstance(lines, ProgressLines)
    later = lines.last + 100.0
    lines.clock = lambda: later  # more than a minute since the last line: one is due
    advance(None)
    assert capsys.readouterr().err.startswith("parity: 1/3 items of port equal_share (33%)")


def test_a_report_that_cannot_be_written_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, oracle: Port, per_request: Port
) -> None:
    """A write that fails mid-night (a full disk) stops nothing: the night runs on,
    the next write tries again, and whatever is still unwritten at the end is one
    line naming the path and why; the command exits 2 after printing its results."""
    calls: list[int] = []

    def flaky(night: Night, out_dir: Path, history: Any) -> None:
        calls.append(len(night.ports))
        if len(calls) == 1:  # the first write, before any port
            raise OSError(28, "No space left on device", str(out_dir / "index.html"))
        write_report(night, out_dir, history)

    night = run_nightly(plan_for(tmp_path), oracle, [per_request], {}, write_report=flaky)
    assert night.complete and night.unwritten == {} and calls == [0, 1, 1]
    assert (tmp_path / "2026-11-28" / "index.html").exists() and read_history(tmp_path / "history.jsonl")[
        "reduced"
    ].all()

    def full(night: Night, out_dir: Path, history: Any) -> None:
        raise OSError(28, "No space left on device", str(out_dir / "index.html"))

    import reports.nightly

    monkeypatch.setattr(reports.nightly, "write_report", full)
    argv = ["nightly", "--size", "0", "--numeric-size", "2", "--level", "merge", "--ports", "per_request"]
    argv += ["--skip-mutants", "--explore-budget-s", "0", "--out", str(tmp_path), "--date", "2026-11-29"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out.startswith("per_request    PASS       2 items") and "wrote" not in out  # the results are printed
    page = tmp_path / "2026-11-29" / "index.html"
    assert err.splitlines() == [f"parity: error: {page}: cannot write the report (No space left on device)"]
    assert read_history(tmp_path / "history.jsonl")["date"].tolist() == ["2026-11-28", "2026-11-29"]
