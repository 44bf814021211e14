"""Bad input and port faults: each row of the README's table has its test here.

Bad input: one line naming the file, field and reason, exit 2, no traceback.
Port faults: the item is a per-case port-error and the run goes on.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.cli import main
from tests.cli_in_process import parity_in_process

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "cases" / "smoke"
GOOD = {"name": "x", "context_lens": [40, 0], "query_lens": [2, 3], "block_size": 16, "workspace_size": 64}


# Bad input stops each command before any work: run in this process (tests/cli_in_process.py).
parity = parity_in_process


def one_line_exit_2(proc: subprocess.CompletedProcess[str], expected: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr + proc.stdout
    assert expected in proc.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"name": "x", "context_lens": [1,', "malformed JSON at line 1 column"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "block_size"}), "field 'block_size': is missing"),
        (json.dumps({**GOOD, "context_lens": [40, -1]}), "field 'context_lens[1]': must be >= 0, got -1"),
        (json.dumps({**GOOD, "query_lens": [2, 1.5]}), "field 'query_lens[1]': must be an integer, got 1.5"),
        (json.dumps({**GOOD, "query_lens": [2]}), "field 'query_lens': has 1 entries but context_lens has 2"),
        (json.dumps({**GOOD, "workspace_size": 8}), "field 'workspace_size': 8 rows is below one alignment unit"),
        (json.dumps({**GOOD, "context_lens": [10**9, 0]}), "field 'context_lens[0]': must be <= 16777216"),
        (json.dumps({**GOOD, "workspace_size": 10**12}), "refused before allocating"),
    ],
)
def test_bad_case_file(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "case.json"
    path.write_text(content)
    proc = parity("run", "--cases", str(path))
    one_line_exit_2(proc, f"{path}: ")
    assert expected in proc.stderr


def test_unknown_port() -> None:
    one_line_exit_2(parity("run", "--suite", "smoke", "--port", "no_such_port"), "unknown port 'no_such_port'")


def statuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str, *extra: str
) -> tuple[int, dict[str, dict[str, str]]]:
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--port", port, "--results", str(results), *extra])
    capsys.readouterr()
    rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    return code, {row["id"]: row for row in rows}


def test_port_that_raises_is_a_port_error_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, rows = statuses(tmp_path, capsys, "tests.fault_ports:RaisingPort", "--cases", str(SMOKE), "--level", "layout")
    assert code == 1
    errors = [r for r in rows.values() if r["status"] == "port-error"]
    assert errors and all(r["detail"] == "RuntimeError: planner blew up on two lines" for r in errors)
    assert sum(r["status"] == "parity" for r in rows.values()) > 10


def test_port_returning_a_non_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows = statuses(
        tmp_path, capsys, "tests.fault_ports:NotALayoutPort", "--cases", str(SMOKE / "giant-middle.json")
    )
    assert code == 1
    assert rows["smoke-giant-middle[layout]"]["detail"] == "PortValueError: plan_layout returned dict, not a Layout"


def test_port_that_hangs_times_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows = statuses(
        tmp_path, capsys, "tests.fault_ports:HangingPort", "--cases", str(SMOKE / "giant-middle.json"),
        str(SMOKE / "giant-first.json"), "--timeout", "1",
    )  # fmt: skip
    assert code == 1
    assert rows["smoke-giant-middle[layout]"]["status"] == "port-error"
    assert "exceeded the 1 s time limit" in rows["smoke-giant-middle[layout]"]["detail"]
    assert rows["smoke-giant-first[layout]"]["status"] == "parity"


@pytest.mark.parametrize(
    ("port", "level", "expected"),
    [
        ("NanPort", "merge", "port returned NaN in 'output'"),
        ("WrongShapePort", "merge", "port gave"),
        ("WrongDtypePort", "prefill", "port gave float64"),
        ("MissingTensorPort", "prefill", "port returned no 'lse'"),
    ],
)
def test_numeric_port_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str, level: str, expected: str
) -> None:
    code, rows = statuses(tmp_path, capsys, f"tests.fault_ports:{port}", "--suite", "smoke", "--level", level)
    assert code == 1
    assert rows and all(r["status"] == "port-error" for r in rows.values()), next(iter(rows.values()))
    assert all(expected in r["detail"] for r in rows.values())


def test_a_port_without_numeric_methods_is_not_run_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Levels a Python port does not implement are not-run (INCOMPLETE, exit 1), never skipped."""
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--port", "tests.fault_ports:NoNumericPort", "--suite", "smoke", "--level", "merge",
                 "--results", str(results)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1 and "verdict INCOMPLETE" in out
    rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    assert rows and all(r["status"] == "not-run" for r in rows)
    assert "does not implement level merge" in rows[0]["detail"]
