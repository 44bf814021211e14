"""What an L3 item compared, said for each kind of port, and the one plan a
port makes per case: the layout an external port's prefill request ran on must
be the one it returned for the same case at L1 in the same run."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.external import ExternalPort
from harness.port import WHOLE_LOOP_COMPARED

ROOT = Path(__file__).resolve().parent.parent
CASE_FILE = "cases/smoke/numeric-single-chunk.json"
CASE = "smoke-numeric-single-chunk"


def fake(fault: str) -> str:
    program = shlex.join([sys.executable, str(ROOT / "tests" / "fake_external_port.py")])
    return f"cmd:{program} --prefill --fault {fault} --on {CASE}"


def test_an_external_port_that_plans_again_for_its_prefill_is_a_port_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "run.json"
    code = main(["run", "--cases", CASE_FILE, "--port", fake("replan-for-prefill"), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 1, printed
    items = {(item["name"], item["kind"]): item for item in json.loads(out.read_text())["cases"]}
    assert items[CASE, "layout"]["status"] == "parity"
    prefill = items[CASE, "prefill"]
    assert prefill["status"] == "port-error", prefill
    assert "another layout than the one the port returned for this case at L1" in json.dumps(prefill)
    assert f"port-error cases/smoke/numeric-single-chunk.json:{CASE}[prefill]" in printed, printed


def test_each_kind_of_port_says_what_its_l3_compared(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["run", "--cases", CASE_FILE, "--port", fake("none")]) == 0
    external = capsys.readouterr().out
    assert f"prefill compared {ExternalPort.l3_compares}" in external
    assert main(["run", "--cases", CASE_FILE, "--port", "per_request", "--json", str(tmp_path / "r.json")]) == 0
    in_process = capsys.readouterr().out
    assert f"prefill compared {WHOLE_LOOP_COMPARED}" in in_process
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["l3_compares"] == WHOLE_LOOP_COMPARED
    gate_out = tmp_path / "gate"
    assert main(["gate", "--cases", CASE_FILE, "--port", fake("none"), "--out", str(gate_out)]) == 0
    assert f"prefill compared {ExternalPort.l3_compares}." in (gate_out / "summary.md").read_text()
    assert ExternalPort.l3_compares in (gate_out / "junit.xml").read_text()
