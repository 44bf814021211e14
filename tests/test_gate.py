"""``parity gate`` and ``parity merge``: outputs, baseline verdicts, shards."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.cases.suites import load_suite
from harness.cli import main
from harness.verdicts.baseline import SuiteTargets, measure_entries
from tests.conftest import make_case

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


def test_equal_share_passes_with_its_baseline_and_fails_without_an_entry(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """equal_share passes ci's layout level against its shipped baseline; the
    same rows (resumed from the first run's record, not computed again) judged
    against the baseline less its skew entry fail on the skew items."""
    rows = tmp_path / "rows.jsonl"
    selection = ["--suite", "ci", "--level", "layout", "--port", "equal_share", "--results", str(rows)]
    code, out = gate(capsys, *selection, "--baseline", str(BASELINE), "--out", str(tmp_path / "pass"))
    assert code == 0, out
    table = pd.read_parquet(tmp_path / "pass" / "results.parquet")
    assert (table["baseline"] == "expected").sum() > 1000 and (table["baseline"] != "new").all()
    assert (table[table["baseline"] == "expected"]["reason"] != "").all()
    junit = ET.parse(tmp_path / "pass" / "junit.xml").getroot()
    assert int(junit.get("skipped", "0")) == (table["baseline"] == "expected").sum()

    data = json.loads(BASELINE.read_text())
    data["entries"] = [e for e in data["entries"] if not (e.get("family") == "skew" and e["level"] == "layout")]
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(data))
    code, _ = gate(capsys, *selection, "--resume", "--baseline", str(baseline), "--out", str(tmp_path / "out"),
                   "--shrink-time", "0")  # fmt: skip
    assert code == 1
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Parity gate: FAIL" in summary and "### New divergences" in summary
    assert "`ci/skew-" in summary and "-m harness diff skew-" in summary and "--port equal_share" in summary
    assert "baseline: not in the baseline" in summary
    junit = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert int(junit.get("failures", "0")) > 0
    assert len(pd.read_parquet(tmp_path / "out" / "results.parquet")) == len(table)


def test_stale_entry_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    entry = {"family": "skew", "level": "layout", "status": "divergent", "reason": "was broken once"}
    baseline.write_text(json.dumps({"port": "per_request", "entries": [entry]}))
    code, _ = gate(capsys, "--suite", "smoke", "--level", "layout", "--baseline", str(baseline), "--out", str(tmp_path))
    assert code == 1
    summary = (tmp_path / "summary.md").read_text()
    assert "1 stale baseline entries" in summary
    assert "per_request family skew [layout] divergent: was broken once" in summary
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    stale = [c for c in junit.findall(".//testcase") if c.get("classname", "").endswith(".baseline")]
    assert len(stale) == 1 and stale[0].find("failure") is not None


def smoke_baseline(tmp_path: Path) -> Path:
    """The ci baseline's entries that name what the smoke suite has (the others
    would be bad input for a smoke gate)."""
    targets = SuiteTargets.of_suite(load_suite("smoke"))
    data = json.loads(BASELINE.read_text())
    data["entries"] = [e for e in data["entries"] if e.get("family") in targets.families[e["level"]]]
    path = tmp_path / "smoke-baseline.json"
    path.write_text(json.dumps(data))
    return path


def test_two_shards_merged_equal_one_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    baseline = smoke_baseline(tmp_path)
    common = ["--suite", "smoke", "--port", "equal_share", "--baseline", str(baseline)]
    whole_code, _ = gate(capsys, *common, "--out", str(tmp_path / "whole"))
    for k in (1, 2):
        gate(capsys, *common, "--shard", f"{k}/2", "--out", str(tmp_path / f"shard{k}"))
    shard_tables = [pd.read_parquet(tmp_path / f"shard{k}" / "results.parquet") for k in (1, 2)]
    assert all(len(t) > 0 for t in shard_tables)
    assert not set(shard_tables[0]["index"]) & set(shard_tables[1]["index"])
    merged_code = main(["merge", str(tmp_path / "shard1"), str(tmp_path / "shard2"), "--baseline", str(baseline),
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


def test_merge_refuses_shards_of_two_versions_of_a_port(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same --port spelling at two commits of the port is not one run."""
    folder = tmp_path / "their"
    folder.mkdir()
    module = folder / "their_gate_port.py"
    module.write_text("from ports.per_request import PerRequestPort as Port\n")
    monkeypatch.syspath_prepend(str(folder))
    selection = ["--suite", "smoke", "--level", "layout", "--port", "their_gate_port:Port"]
    gate(capsys, *selection, "--shard", "1/2", "--out", str(tmp_path / "a"))
    module.write_text("from ports.per_request import PerRequestPort as Port  # the next commit\n")
    gate(capsys, *selection, "--shard", "2/2", "--out", str(tmp_path / "b"))
    assert main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 2
    assert "field 'port_digest'" in capsys.readouterr().err


def test_merge_refuses_shards_run_over_another_dcp_backend(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A shard whose DCP ranks ran over gloo is not one run with a one-process shard
    (its gate.json says so; the ranks themselves are tested in test_dcp_ranks)."""
    for shard in ("1/2", "2/2"):
        gate(capsys, "--suite", "smoke", "--level", "merge", "--shard", shard, "--out", str(tmp_path / shard[0]))
    meta_path = tmp_path / "2" / "gate.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "dcp_backend": "gloo"}))
    assert main(["merge", str(tmp_path / "1"), str(tmp_path / "2"), "--out", str(tmp_path / "m")]) == 2
    assert "field 'dcp_backend'" in capsys.readouterr().err


def test_merge_refuses_shards_of_other_case_files_or_time_limits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps({"cases": [make_case([5, n], name=f"c-{n}").to_json() for n in (1, 2)]}))
    gate(capsys, "--cases", str(cases), "--shard", "1/2", "--out", str(tmp_path / "a"))
    cases.write_text(json.dumps({"cases": [make_case([7, n], name=f"c-{n}").to_json() for n in (1, 2)]}))
    gate(capsys, "--cases", str(cases), "--shard", "2/2", "--out", str(tmp_path / "b"))
    assert main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 2
    assert "field 'cases_digest'" in capsys.readouterr().err
    gate(capsys, "--cases", str(cases), "--shard", "1/2", "--timeout", "30", "--out", str(tmp_path / "c"))
    assert main(["merge", str(tmp_path / "c"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 2
    assert "field 'timeout'" in capsys.readouterr().err


# -- entries are precise: status, caps, targets (issue 11, hole 5) -----------------------


@pytest.fixture(scope="module")
def smoke_prefill(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One equal_share gate over the smoke suite's prefill items, no baseline;
    the tests below re-judge its outputs with ``parity merge --baseline``."""
    out = tmp_path_factory.mktemp("smoke-prefill") / "gate"
    assert main(["gate", "--suite", "smoke", "--level", "prefill", "--port", "equal_share", "--out", str(out)]) == 1
    return out


def measured(gate_dir: Path) -> list[dict[str, Any]]:
    entries = measure_entries(pd.read_parquet(gate_dir / "results.parquet"), "equal_share")
    for e in entries:
        if e["status"] != "port-error":  # an error entry counts its items exactly
            e.pop("items")
        e["reason"] = "measured by the test"
    return entries


def rejudge(capsys: pytest.CaptureFixture[str], gate_dir: Path, entries: list[dict[str, Any]], out: Path) -> int:
    baseline = out.parent / f"{out.name}-baseline.json"
    baseline.write_text(json.dumps({"entries": entries}))
    code = main(["merge", str(gate_dir), "--baseline", str(baseline), "--rejudge", "--out", str(out)])
    capsys.readouterr()
    if code in (0, 1):
        assert (
            "**Re-judged (`parity merge --rejudge`)**: the shards ran with no baseline"
            in (out / "summary.md").read_text()
        )
    return code


def test_measured_caps_pass(capsys: pytest.CaptureFixture[str], tmp_path: Path, smoke_prefill: Path) -> None:
    entries = measured(smoke_prefill)
    assert {e["status"] for e in entries} == {"divergent", "port-error"}
    assert rejudge(capsys, smoke_prefill, entries, tmp_path / "m") == 0
    table = pd.read_parquet(tmp_path / "m" / "results.parquet")
    assert set(table[table["status"] != "parity"]["baseline"]) == {"expected"}


def test_an_item_beyond_its_cap_is_new(capsys: pytest.CaptureFixture[str], tmp_path: Path, smoke_prefill: Path) -> None:
    entries = measured(smoke_prefill)
    widest = max((e for e in entries if "max_ulp" in e), key=lambda e: e["max_ulp"])
    cap = widest["max_ulp"]
    widest["max_ulp"] = cap - 1
    assert rejudge(capsys, smoke_prefill, entries, tmp_path / "m") == 1
    summary = (tmp_path / "m" / "summary.md").read_text()
    assert "## Parity gate: FAIL" in summary and f"baseline: beyond baseline: {cap} ULP > cap {cap - 1}" in summary
    assert "0 stale baseline entries" in summary  # the entry still matches: the item outgrew it
    failures = ET.parse(tmp_path / "m" / "junit.xml").getroot().findall(".//failure")
    assert failures and {f.get("message", "").split(":")[0] for f in failures} == {"beyond baseline"}
    widest["max_ulp"] = cap
    widest["max_mismatch_fraction"] /= 2
    assert rejudge(capsys, smoke_prefill, entries, tmp_path / "f") == 1
    assert "> cap" in (tmp_path / "f" / "summary.md").read_text()


def test_a_status_mismatch_is_new(capsys: pytest.CaptureFixture[str], tmp_path: Path, smoke_prefill: Path) -> None:
    entries = measured(smoke_prefill)
    divergent = next(e for e in entries if e["status"] == "divergent")
    del divergent["max_ulp"], divergent["max_mismatch_fraction"]
    divergent["status"] = "port-error"
    divergent["items"] = 1
    assert rejudge(capsys, smoke_prefill, entries, tmp_path / "m") == 1
    summary = (tmp_path / "m" / "summary.md").read_text()
    assert "beyond baseline: status divergent, the baseline expects port-error" in summary
    assert f"equal_share family {divergent['family']} [prefill] port-error: measured by the test" in summary  # stale


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"family": "skw", "level": "layout", "status": "divergent"}, "entries[0].family"),
        ({"case": "no-such-case", "level": "layout", "status": "divergent"}, "entries[0].case"),
        ({"port": "equal-share", "family": "skew", "level": "layout", "status": "divergent"}, "entries[0].port"),
    ],
)
def test_an_entry_naming_what_the_run_cannot_have_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, entry: dict[str, str], field: str
) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"port": "equal_share", "entries": [{**entry, "reason": "r"}]}))
    case = Path(__file__).resolve().parent.parent / "cases" / "smoke" / "upstream-worst-case.json"
    argv = ["--cases", str(case), "--port", "equal_share", "--baseline", str(baseline), "--out", str(tmp_path / "o")]
    assert main(["gate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{baseline}: field '{field}'" in err
    assert not (tmp_path / "o" / "summary.md").exists()  # refused, not judged "stale"


def test_shard_argument_is_validated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--suite", "smoke", "--shard", "3/2"]) == 2
    assert "--shard: shard '3/2': K must be in 1..N" in capsys.readouterr().err
