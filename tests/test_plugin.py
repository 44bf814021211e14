"""The pytest plugin: one item per (case, level), readable ids, JUnit, -k, xdist."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.runner import plan_items
from harness.suites import load_suite

ROOT = Path(__file__).resolve().parent.parent


def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_junit_has_one_item_per_case_and_level(tmp_path: Path) -> None:
    junit = tmp_path / "out.xml"
    proc = pytest_run("--parity-suite", "smoke", "--parity-port", "per_request", "--parity-level", "layout",
                      "-n", "2", "--junitxml", str(junit))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    cases = ET.parse(junit).getroot().findall(".//testcase")
    expected = plan_items(load_suite("smoke"), ("layout",))
    assert len(cases) == len(expected)
    names = {c.get("name") for c in cases}
    assert "smoke.smoke-upstream-worst-case[layout]" in names  # junitxml writes the "/" of an id as "."
    assert all(c.find("failure") is None for c in cases)
    assert not any("test_" in (c.get("name") or "") for c in cases)  # unit tests stay out


def test_failure_message_is_the_first_divergence_and_k_selects() -> None:
    proc = pytest_run("--parity-suite", "smoke", "--parity-port", "equal_share", "-k", "upstream and layout", "-rf")
    assert proc.returncode == 1
    assert "1 failed" in proc.stdout and "deselected" in proc.stdout
    assert "FAILED smoke/smoke-upstream-worst-case[layout] - divergent" in proc.stdout
    assert "chunk 0, field num_context_tokens: oracle 60496 != port 2544" in proc.stdout


def test_baseline_marks_expected_divergences_xfail() -> None:
    baseline = ROOT / "cases" / "baselines" / "equal_share.json"
    proc = pytest_run("--parity-suite", "smoke", "--parity-port", "equal_share", "--parity-level", "layout",
                      "--parity-baseline", str(baseline), "-k", "skew")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "xfailed" in proc.stdout
