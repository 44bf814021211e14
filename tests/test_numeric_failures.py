"""Every float level's divergence is said the same way everywhere: ``parity
diff`` prints its tensors (elements differing, the largest ULP distance, the
ULP histogram, the first differing index with both values and the inputs
there), and ``parity run``, the gate's summary.md and JUnit say the same
pieces of it (reports/failure_text.py). One mutant per float level of the
registry, each diverging on smoke items of that level alone; a level added
without one here fails the first test."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli import main
from harness.model.levels import FLOAT_LEVELS

# Per float level: a port that diverges there (and not at its layout) and a smoke item it diverges on.
DIVERGING = {
    "merge": ("mutant:merge-in-bf16", "merge-random-0000"),
    "prefill": ("mutant:continuation-merges-previous-chunk", "smoke-numeric-continuation-fp32"),
    "sparse-prefill": ("mutant:sparse-l3-fold-last-first", "sparse-masked-ranges-0007-0001"),
}
# What each report says of a divergent float item.
FIRST = re.compile(r"\d+/\d+ elements differ.*first at \(token \d+, head \d+.*\): oracle \S+ port \S+; inputs there: ")


def test_every_float_level_has_a_diverging_port_here() -> None:
    assert set(DIVERGING) == set(FLOAT_LEVELS)


@pytest.mark.parametrize("level", sorted(DIVERGING))
def test_diff_prints_the_tensors(level: str, capsys: pytest.CaptureFixture[str]) -> None:
    port, item = DIVERGING[level]
    assert main(["diff", item, "--suite", "smoke", "--port", port, "--level", level]) == 1
    out = capsys.readouterr().out
    assert "DIVERGENT" in out and "identical" not in out
    assert FIRST.search(out), out
    assert re.search(r"ULP histogram: \S+: \d+", out), out


@pytest.mark.parametrize("level", sorted(DIVERGING))
def test_run_summary_md_and_junit_say_the_same(level: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port, _ = DIVERGING[level]
    assert main(["run", "--suite", "smoke", "--port", port, "--level", level, "--show", "1"]) == 1
    printed = capsys.readouterr().out
    assert FIRST.search(printed) and "\n    ULP histogram: " in printed, printed
    out = tmp_path / "gate"
    assert main(["gate", "--suite", "smoke", "--port", port, "--level", level, "--out", str(out)]) == 1
    capsys.readouterr()
    summary = (out / "summary.md").read_text()
    assert FIRST.search(summary) and "\n  ULP histogram: " in summary, summary
    failures = [f for f in ET.parse(out / "junit.xml").getroot().iter("failure") if f.get("type") == "divergent"]
    assert failures and all(FIRST.search(f.get("message") or "") for f in failures)
    assert all("\nULP histogram: " in (f.text or "") for f in failures)


def test_a_failing_l3_item_names_its_diverging_layout_first(capsys: pytest.CaptureFixture[str]) -> None:
    """equal_share plans smoke's continuation case otherwise than upstream: the
    prefill's diff (asked for alone) says its layout diverges too, as the gate does."""
    item = "smoke-numeric-continuation-fp32"
    assert main(["diff", item, "--suite", "smoke", "--port", "equal_share", "--level", "prefill"]) == 1
    out = capsys.readouterr().out
    assert f"its layout diverges too ({item}[layout]): the likely cause, fix it first" in out
