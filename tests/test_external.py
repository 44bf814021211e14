"""The external-port protocol: the C++ reference port, and faulty fake ports."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "cases" / "smoke"
FAKE = f"{sys.executable} {ROOT / 'tests' / 'fake_external_port.py'}"
THREE = [str(SMOKE / f"{name}.json") for name in ("giant-first", "giant-middle", "giant-last")]


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (state Z) has already ended."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def rows_of(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, dict[str, str]]]:
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--results", str(results), *argv])
    capsys.readouterr()
    rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    return code, {row["name"]: row for row in rows}


def test_cpp_port_is_at_parity_at_every_level_on_ci(cpp_port: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 14's done-when: the C++ reference port runs the ci suite at every
    level (layout, workspace, merge over the protocol, prefill over the
    protocol, and since issue 28 the sparse levels) and every item is exact."""
    code = main(["run", "--suite", "ci", "--port", f"cmd:{cpp_port}"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "port cpp-per-request  verdict PASS" in out and "divergent 0" in out
    # Workspace items count at the layout level, sparse workspace items at sparse-layout.
    for level in ("layout", "merge", "prefill", "sparse-layout", "sparse-mask", "sparse-prefill"):
        counts = re.search(rf"^  {level} +parity +(\d+) +divergent +(\d+) +errors +(\d+)", out, re.MULTILINE)
        assert counts and int(counts[1]) > 0 and counts[2] == counts[3] == "0", (level, out[-3000:])
    # The port's README shows this run's items line, as the run prints it (its time aside).
    items = re.search(r"^items \d+ \([^)]*\)", out, re.MULTILINE)
    assert items and f"# {items[0]}" in (ROOT / "ports" / "cpp" / "README.md").read_text(), items


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("crash", "port exited (code 3) before answering; stderr: ...fake port: committing crash"),
        ("hang", "port did not answer within 2 s"),
        ("garbage", "port printed something that is not JSON: b'Segmentation fault (core dumped)'"),
        ("malformed", "port sent a malformed layout: chunk lacks field 'seq_lens'"),
        ("error", "port error: cannot do layout smoke-giant-middle"),
    ],
)
def test_faulty_port_is_a_port_error_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, expected: str
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    port = f"cmd:{FAKE} --fault {fault} --on smoke-giant-middle --pid-dir {pids}"
    code, rows = rows_of(tmp_path, capsys, "--cases", *THREE, "--port", port, "--timeout", "2")
    assert code == 1
    assert rows["smoke-giant-middle"]["status"] == "port-error"
    assert expected in rows["smoke-giant-middle"]["detail"]
    assert rows["smoke-giant-first"]["status"] == rows["smoke-giant-last"]["status"] == "parity"
    # Every port process, and the grandchild each one started, is gone.
    started = [int(pid) for f in pids.iterdir() for pid in f.read_text().split()]
    assert len(started) >= 2
    deadline = time.monotonic() + 5  # SIGKILL is asynchronous; init reaps orphans shortly after
    while any(alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in started if alive(pid)]


def test_wrong_shape_over_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = f"cmd:{FAKE} --merge --fault wrong-shape --fault-op merge"
    code, rows = rows_of(tmp_path, capsys, "--suite", "smoke", "--level", "merge", "--port", port)
    assert code == 1
    assert rows and all(r["status"] == "port-error" and "port gave" in r["detail"] for r in rows.values())
    code, rows = rows_of(tmp_path, capsys, "--suite", "smoke", "--level", "merge", "--port", f"cmd:{FAKE} --merge")
    assert code == 0 and all(r["status"] == "parity" for r in rows.values())


def test_a_port_that_cannot_start_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--suite", "smoke", "--port", "cmd:/no/such/binary"]) == 2
    assert "cannot start '/no/such/binary'" in capsys.readouterr().err


def test_levels_the_port_does_not_declare_are_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A layout-only port over a suite with numeric items is INCOMPLETE (exit 1),
    its merge and prefill items listed as not-run; ``--level layout`` narrows the
    request to what it implements and passes."""
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--suite", "smoke", "--port", f"cmd:{FAKE}", "--results", str(results)])
    out = capsys.readouterr().out
    assert code == 1, out[-2000:]
    assert "verdict INCOMPLETE" in out
    assert "its items at merge, prefill, sparse-layout, sparse-mask, sparse-prefill are not-run" in out
    rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    by_level = {(r["level"], r["status"]) for r in rows}
    assert ("merge", "not-run") in by_level and ("prefill", "not-run") in by_level
    assert {r["status"] for r in rows if r["level"] == "layout"} == {"parity"}
    assert main(["run", "--suite", "smoke", "--level", "layout", "--port", f"cmd:{FAKE}"]) == 0
    assert "verdict PASS" in capsys.readouterr().out


def test_a_layout_only_gate_is_incomplete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "gate"
    code = main(["gate", "--suite", "smoke", "--port", f"cmd:{FAKE}", "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert code == 1, out[-2000:]
    assert "Parity gate: PASS" not in (out_dir / "summary.md").read_text()
    assert "INCOMPLETE" in (out_dir / "summary.md").read_text()
    code = main(["gate", "--suite", "smoke", "--level", "layout", "--port", f"cmd:{FAKE}", "--out", str(out_dir)])
    assert code == 0
    assert "Parity gate: PASS" in (out_dir / "summary.md").read_text()


# -- L3 over the protocol: the `prefill` op (issue 14) ----------------------------------------

NUMERIC = [str(SMOKE / f"numeric-{name}.json") for name in ("continuation-fp16", "single-chunk", "continuation-zero")]
FAULTY_CASE = "smoke-numeric-continuation-fp16"


def test_prefill_over_the_protocol_is_judged_as_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fake port folds the partials it is sent with per_request's own loop:
    every smoke prefill item is then at parity, as per_request's in-process
    prefill is; a fold that writes a continuation instead of merging it is not."""
    code, rows = rows_of(tmp_path, capsys, "--suite", "smoke", "--level", "prefill", "--port", f"cmd:{FAKE} --prefill")
    from harness.cases.suites import load_suite

    assert code == 0 and set(rows) == {c.name for c in load_suite("smoke").cases if c.numeric is not None}
    assert {r["status"] for r in rows.values()} == {"parity"} and {r["level"] for r in rows.values()} == {"prefill"}
    port = f"cmd:{FAKE} --prefill --fault write-continuations --fault-op prefill --on {FAULTY_CASE}"
    code, rows = rows_of(tmp_path, capsys, "--cases", *NUMERIC, "--level", "prefill", "--port", port)
    assert code == 1
    assert rows[FAULTY_CASE]["status"] == "divergent" and "context_output" in rows[FAULTY_CASE]["detail"]
    assert [r["status"] for name, r in rows.items() if name != FAULTY_CASE] == ["parity", "parity"]


# The run's --timeout for the faulty prefill ports: the hanging one is cut at it,
# and each healthy prefill stays inside it, the port's first (where it imports
# torch, after a restart too) included, on a busy machine.
PREFILL_TIMEOUT_S = 10


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("crash", "port exited (code 3) before answering; stderr: ...fake port: committing crash on prefill"),
        ("hang", f"port did not answer within {PREFILL_TIMEOUT_S} s"),
        ("garbage", "port printed something that is not JSON: b'Segmentation fault (core dumped)'"),
        ("error", f"port error: cannot do prefill {FAULTY_CASE}"),
        ("wrong-shape", "output: port gave float16[5, 2, 15], oracle float16[5, 2, 16]"),
        ("wrong-dtype", "output: port gave float64[5, 2, 16], oracle float16[5, 2, 16]"),
        ("nan", "port returned NaN in 'output' (1 elements, oracle 0)"),
        ("missing", "port's prefill outputs lack output (it wrote context_lse, context_output, lse)"),
        ("no-file", "port answered 'prefill' but wrote no outputs.safetensors"),
    ],
)
def test_prefill_faults_are_port_errors_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, expected: str
) -> None:
    port = f"cmd:{FAKE} --prefill --fault {fault} --fault-op prefill --on {FAULTY_CASE}"
    timeout = ["--timeout", str(PREFILL_TIMEOUT_S)]
    code, rows = rows_of(tmp_path, capsys, "--cases", *NUMERIC, "--level", "prefill", "--port", port, *timeout)
    assert code == 1
    assert rows[FAULTY_CASE]["status"] == "port-error"
    assert expected in rows[FAULTY_CASE]["detail"]
    assert [r["status"] for name, r in rows.items() if name != FAULTY_CASE] == ["parity", "parity"]


@pytest.mark.parametrize(
    ("fault", "fault_op", "expected"),
    [
        ("fifo", "prefill", "port's outputs.safetensors is not a regular file"),
        ("close-stdout", "prefill", "port closed its output before answering (it is still running)"),
        ("huge-run", "layout", "chunk field 'token_to_seq' runs to 1000000000000 rows, more than the 3058 the case"),
        # Three chunks of 1,000 rows fit the case's budget of 2 * (2 * 700 + 1 + 128); the fourth does not.
        ("many-runs", "layout", "chunk field 'token_to_seq' runs to 1000 rows, more than the 58 the case allows it"),
        ("deep-json", "prefill", "port printed something that is not JSON: b'[[[["),
        ("unrunnable", "layout", "port's layout cannot be run: layout chunk 0: cu_seq_lens is not the running sum"),
    ],
)
def test_a_port_cannot_block_or_exhaust_the_harness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, fault_op: str, expected: str
) -> None:
    """A named pipe where the outputs should be (opening it would block), a
    port that closes its output but lives on, a reply of a few bytes describing
    10^12 rows, a layout whose indices the kernels cannot follow: each is that
    item's port-error, promptly, and the run goes on."""
    port = f"cmd:{FAKE} --prefill --fault {fault} --fault-op {fault_op} --on {FAULTY_CASE}"
    started = time.monotonic()
    code, rows = rows_of(tmp_path, capsys, "--cases", *NUMERIC, "--level", "prefill", "--port", port, "--timeout", "20")
    assert code == 1 and time.monotonic() - started < 60
    assert rows[FAULTY_CASE]["status"] == "port-error"
    assert expected in rows[FAULTY_CASE]["detail"]
    assert [r["status"] for name, r in rows.items() if name != FAULTY_CASE] == ["parity", "parity"]


def test_a_port_that_stops_reading_times_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After its answer for the first case the port never reads again; the
    second case's request (far larger than a pipe holds) cannot be written,
    and the harness gives up on it at the deadline instead of blocking."""
    from tests.conftest import make_case

    wide = make_case([16] * 30_000, [1] * 30_000, name="wide-batch", workspace_size=64)
    wide_file = tmp_path / "wide-batch.json"
    wide_file.write_text(json.dumps(wide.to_json()))
    assert wide_file.stat().st_size > 1 << 17
    port = f"cmd:{FAKE} --fault deaf --on smoke-giant-first"
    cases = ["--cases", THREE[0], str(wide_file), "--level", "layout", "--timeout", "3"]
    code, rows = rows_of(tmp_path, capsys, *cases, "--port", port)
    assert code == 1
    assert rows["smoke-giant-first"]["status"] == "parity"
    assert rows["wide-batch"]["status"] == "port-error"
    assert "port did not read its request within 3 s" in rows["wide-batch"]["detail"]


def test_a_layout_the_workspace_cannot_hold_is_the_ports_error() -> None:
    from harness.cases.files import load_case_file
    from harness.kernels import kernels_for
    from harness.kernels.context_chunks import planned_chunk_partials
    from harness.kernels.numeric import materialise_prefill
    from ports.per_request import PORT

    (case,) = load_case_file(Path(NUMERIC[0]))
    assert case.numeric is not None
    inputs = materialise_prefill(case.context_lens, case.query_lens, case.block_size, case.numeric)
    layout = PORT.plan_layout(case)
    rows = max(c.num_context_tokens for c in layout.chunks)
    narrow = dataclasses.replace(case, workspace_size=rows - 1)
    with pytest.raises(ValueError, match=f"layout chunk .* holds {rows} context rows, the workspace {rows - 1}"):
        planned_chunk_partials(layout, narrow, inputs, kernels_for("cpu"))
    assert len(planned_chunk_partials(layout, case, inputs, kernels_for("cpu"))) == layout.num_chunks
