"""The ``parity`` command: exit codes, output, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import oracle.pin
from harness.cli import main

SMOKE = Path(__file__).resolve().parent.parent / "cases" / "smoke"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_parity_exits_0_and_writes_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "run", "--suite", "smoke", "--port", "per_request", "--json", str(out_file))
    assert code == 0
    assert "verdict PASS" in out and "divergent 0" in out
    document = json.loads(out_file.read_text())
    assert document["summary"]["counts"]["parity"] == document["summary"]["items"]
    assert document["provenance"]["upstream_commit"] == "b38e111d3e"
    case = next(c for c in document["cases"] if c["name"] == "smoke-long-10x")
    assert case["oracle_chunks"] == case["port_chunks"] == 10
    assert case["oracle_layout"]["chunks"][1]["is_continuation"] is True


def test_run_divergent_exits_1_with_first_divergence(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "run", "--suite", "smoke", "--port", "equal_share", "--json", str(out_file))
    assert code == 1
    assert "verdict FAIL" in out and "first divergences:" in out
    cases = {c["name"]: c for c in json.loads(out_file.read_text())["cases"]}
    worst = cases["smoke-upstream-worst-case"]
    assert (worst["oracle_chunks"], worst["port_chunks"]) == (1, 30)
    assert worst["divergence"]["chunk"] == 0 and worst["divergence"]["field"] == "num_context_tokens"
    assert len(worst["port_layout"]["chunks"]) == 30


def test_diff_worst_case(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "diff", "smoke-upstream-worst-case", "--port", "equal_share")
    assert code == 1
    assert "oracle: 1 chunks" in out and "port: 30 chunks" in out
    assert ">> #0" in out and "L1 layout: DIVERGENT at chunk 0, field num_context_tokens" in out
    code, out, _ = run_cli(capsys, "diff", str(SMOKE / "upstream-worst-case.json"), "--port", "per_request")
    assert code == 0 and "L1 layout: PARITY" in out


def test_user_port_by_import_path(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "run", "--cases", str(SMOKE / "giant-middle.json"), "--port", "ports.per_request:PerRequestPort"
    )
    assert code == 0 and "parity 1" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--port", "nope"], "parity: error: unknown port 'nope'"),
        (["run", "--port", "no.such.module:PORT"], "cannot import module 'no.such.module'"),
        (["run", "--port", "harness.model:NOPE"], "has no attribute 'NOPE'"),
        (["run", "--suite", "weekly"], "no suite named 'weekly'"),
        (["diff", "no-such-case", "--suite", "smoke"], "no-such-case: no such case file"),
        # This machine's torch is the CPU build: --device cuda refuses before any work.
        (["run", "--suite", "smoke", "--device", "cuda"], "--device cuda: torch"),
        (["diff", "smoke-upstream-worst-case", "--device", "cuda"], "sees no CUDA device"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert expected in err
    assert err.count("\n") == 1


def test_bad_case_file_one_line_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"name": "x", "context_lens": [1, -5], "query_lens": [1, 1], "block_size": 16, "workspace_size": 64})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--cases", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr == f"parity: error: {bad}: field 'context_lens[1]': must be >= 0, got -5\n"
    assert "Traceback" not in proc.stdout + proc.stderr


def test_fingerprint_mismatch_refuses_then_override_is_marked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin = json.loads(oracle.pin.PIN_FILE.read_text())
    symbol = f"{oracle.pin.MLA}:plan_mla_context_chunks"
    pin["fingerprints"][symbol] = "0000000000000000"
    drifted = tmp_path / "pin.json"
    drifted.write_text(json.dumps(pin))
    monkeypatch.setattr(oracle.pin, "PIN_FILE", drifted)

    case = str(SMOKE / "giant-middle.json")
    code, _, err = run_cli(capsys, "run", "--cases", case)
    assert code == 2
    assert err.startswith("parity: error: oracle fingerprint mismatch: " + symbol)
    assert err.count("\n") == 1

    out_file = tmp_path / "r.json"
    code, out, err = run_cli(capsys, "run", "--cases", case, "--allow-oracle-drift", "--json", str(out_file))
    assert code == 0
    assert "WARNING: oracle fingerprints overridden" in out and "WARNING" in err
    assert json.loads(out_file.read_text())["provenance"]["oracle_drift_overridden"] is True

    code, out, _ = run_cli(capsys, "oracle")
    assert code == 1 and "mismatch" in out and "DRIFTED" in out


def test_oracle_command_reports_pin(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "oracle")
    assert code == 0
    assert "b38e111d3e" in out and "vllm 0.28.0" in out and "oracle: OK" in out
    assert out.count("ok ") == len(oracle.pin.SYMBOLS)
