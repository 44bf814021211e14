"""``parity gate`` and ``parity merge``: outputs, baseline verdicts, shards."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

from harness.baseline import load_baseline
from harness.cases import CaseError
from harness.cli import main

BASELINE = Path(__file__).resolve().parent.parent / "cases" / "baselines" / "equal_share.json"


def gate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["gate", *argv])
    return code, capsys.readouterr().out


def test_per_request_passes_and_writes_outputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out = gate(capsys, "--suite", "smoke", "--port", "per_request", "--out", str(tmp_path))
    assert code == 0
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("## Parity gate: PASS") and summary in out
    assert len(summary.encode()) < 4000  # fits a PR comment
    table = pd.read_parquet(tmp_path / "results.parquet")
    assert (table["status"] == "parity").all() and table["index"].is_unique
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    cases = junit.findall(".//testcase")
    assert len(cases) == len(table) == int(junit.get("tests", "0"))
    assert junit.get("failures") == "0" and junit.get("errors") == "0"


def test_equal_share_passes_with_its_baseline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out = gate(
        capsys, "--suite", "ci", "--level", "layout", "--port", "equal_share",
        "--baseline", str(BASELINE), "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, out
    table = pd.read_parquet(tmp_path / "results.parquet")
    assert (table["baseline"] == "expected").sum() > 1000 and (table["baseline"] != "new").all()
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    assert int(junit.get("skipped", "0")) == (table["baseline"] == "expected").sum()


def test_unlisted_divergence_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = json.loads(BASELINE.read_text())
    data["entries"] = [e for e in data["entries"] if not (e["family"] == "skew" and e["level"] == "layout")]
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(data))
    code, _ = gate(
        capsys, "--suite", "ci", "--level", "layout", "--port", "equal_share",
        "--baseline", str(baseline), "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 1
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Parity gate: FAIL" in summary and "### New divergences" in summary
    assert "`skew-" in summary and "reproduce: `parity diff skew-" in summary and "--port equal_share" in summary
    junit = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert int(junit.get("failures", "0")) > 0


def test_stale_entry_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    entry = {"family": "skew", "level": "layout", "reason": "was broken once"}
    baseline.write_text(json.dumps({"port": "per_request", "entries": [entry]}))
    code, _ = gate(capsys, "--suite", "smoke", "--level", "layout", "--baseline", str(baseline), "--out", str(tmp_path))
    assert code == 1
    summary = (tmp_path / "summary.md").read_text()
    assert "1 stale baseline entries" in summary and "per_request family skew [layout]: was broken once" in summary
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    stale = [c for c in junit.findall(".//testcase") if c.get("classname", "").endswith(".baseline")]
    assert len(stale) == 1 and stale[0].find("failure") is not None


def test_two_shards_merged_equal_one_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    common = ["--suite", "smoke", "--port", "equal_share", "--baseline", str(BASELINE)]
    whole_code, _ = gate(capsys, *common, "--out", str(tmp_path / "whole"))
    for k in (1, 2):
        gate(capsys, *common, "--shard", f"{k}/2", "--out", str(tmp_path / f"shard{k}"))
    shard_tables = [pd.read_parquet(tmp_path / f"shard{k}" / "results.parquet") for k in (1, 2)]
    assert all(len(t) > 0 for t in shard_tables)
    assert not set(shard_tables[0]["index"]) & set(shard_tables[1]["index"])
    merged_code = main(["merge", str(tmp_path / "shard1"), str(tmp_path / "shard2"), "--baseline", str(BASELINE),
                        "--out", str(tmp_path / "merged")])  # fmt: skip
    capsys.readouterr()
    assert merged_code == whole_code
    whole = (tmp_path / "whole" / "summary.md").read_text()
    merged = (tmp_path / "merged" / "summary.md").read_text()
    assert merged == whole
    keep = ["index", "id", "status", "detail", "baseline", "max_ulp", "histogram"]
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "whole" / "results.parquet")[keep],
        pd.read_parquet(tmp_path / "merged" / "results.parquet")[keep],
    )


def test_merge_refuses_incomplete_or_mixed_shards(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    gate(capsys, "--suite", "smoke", "--level", "merge", "--shard", "1/2", "--out", str(tmp_path / "a"))
    assert main(["merge", str(tmp_path / "a"), "--out", str(tmp_path / "m")]) == 2
    assert "need all of ['1/2', '2/2']" in capsys.readouterr().err
    gate(capsys, "--suite", "smoke", "--level", "layout", "--shard", "2/2", "--out", str(tmp_path / "b"))
    assert main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 2
    assert "field 'levels'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("entries", "field"),
    [
        ([{"family": "skew", "level": "layout"}], "entries[0].reason"),
        ([{"family": "skew", "case": "x", "level": "layout", "reason": "r"}], "entries[0]"),
        ([{"family": "skew", "level": "L9", "reason": "r"}], "entries[0].level"),
        ([{"family": "skew", "level": "layout", "reason": "r", "why": 1}], "entries[0].why"),
    ],
)
def test_bad_baseline_names_the_field(tmp_path: Path, entries: list[dict[str, str]], field: str) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"port": "p", "entries": entries}))
    with pytest.raises(CaseError) as info:
        load_baseline(path)
    assert info.value.field == field


def test_shard_argument_is_validated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--suite", "smoke", "--shard", "3/2"]) == 2
    assert "--shard: shard '3/2': K must be in 1..N" in capsys.readouterr().err
