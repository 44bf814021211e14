"""The external-port protocol: the C++ reference port, and faulty fake ports."""

from __future__ import annotations

import json
import shutil
import subprocess
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


@pytest.fixture(scope="session")
def cpp_port(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to build the C++ reference port"
    binary = tmp_path_factory.mktemp("cpp") / "cpp-port"
    source = ROOT / "ports" / "cpp" / "per_request_port.cpp"
    subprocess.run([compiler, "-O2", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(source)],
                   check=True)  # fmt: skip
    return binary


def rows_of(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, dict[str, str]]]:
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--results", str(results), *argv])
    capsys.readouterr()
    rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    return code, {row["name"]: row for row in rows}


def test_cpp_port_exact_layout_parity_on_ci(cpp_port: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--suite", "ci", "--level", "layout", "--port", f"cmd:{cpp_port}"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "port cpp-per-request  verdict PASS" in out and "divergent 0" in out


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("crash", "port exited (code 3) before answering; stderr: ...fake port: committing crash"),
        ("hang", "port did not answer within 2 s"),
        ("garbage", "port printed something that is not JSON: b'Segmentation fault (core dumped)'"),
        ("malformed", "port sent a malformed layout: chunk lacks field 'seq_lens'"),
        ("error", "port error: cannot plan this"),
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
    port = f"cmd:{FAKE} --merge --fault wrong-shape"
    code, rows = rows_of(tmp_path, capsys, "--suite", "smoke", "--level", "merge", "--port", port)
    assert code == 1
    assert rows and all(r["status"] == "port-error" and "port gave" in r["detail"] for r in rows.values())
    code, rows = rows_of(tmp_path, capsys, "--suite", "smoke", "--level", "merge", "--port", f"cmd:{FAKE} --merge")
    assert code == 0 and all(r["status"] == "parity" for r in rows.values())


def test_a_port_that_cannot_start_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--suite", "smoke", "--port", "cmd:/no/such/binary"]) == 2
    assert "cannot start '/no/such/binary'" in capsys.readouterr().err


def test_levels_the_port_does_not_declare_are_not_run(
    tmp_path: Path, cpp_port: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A layout-only port over a suite with numeric items is INCOMPLETE (exit 1),
    its merge and prefill items listed as not-run; ``--level layout`` narrows the
    request to what it implements and passes."""
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--suite", "smoke", "--port", f"cmd:{cpp_port}", "--results", str(results)])
    out = capsys.readouterr().out
    assert code == 1, out[-2000:]
    assert "verdict INCOMPLETE" in out
    assert "its items at merge, prefill are not-run" in out
    rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    by_level = {(r["level"], r["status"]) for r in rows}
    assert ("merge", "not-run") in by_level and ("prefill", "not-run") in by_level
    assert {r["status"] for r in rows if r["level"] == "layout"} == {"parity"}
    assert main(["run", "--suite", "smoke", "--level", "layout", "--port", f"cmd:{cpp_port}"]) == 0
    assert "verdict PASS" in capsys.readouterr().out


def test_a_layout_only_gate_is_incomplete(tmp_path: Path, cpp_port: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "gate"
    code = main(["gate", "--suite", "smoke", "--port", f"cmd:{cpp_port}", "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert code == 1, out[-2000:]
    assert "Parity gate: PASS" not in (out_dir / "summary.md").read_text()
    assert "INCOMPLETE" in (out_dir / "summary.md").read_text()
    code = main(["gate", "--suite", "smoke", "--level", "layout", "--port", f"cmd:{cpp_port}", "--out", str(out_dir)])
    assert code == 0
    assert "Parity gate: PASS" in (out_dir / "summary.md").read_text()
