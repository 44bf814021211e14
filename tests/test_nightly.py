"""``parity nightly``: the report, the history store, shards, and interruption."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from ports.mutants import MUTANTS
from reports.nightly import read_history

ROOT = Path(__file__).resolve().parent.parent
# parity explore has a test of its own in the nightly below; left out of the others.
QUICK = ["--size", "60", "--numeric-size", "8", "--explore-budget-s", "0"]


def nightly(capsys: pytest.CaptureFixture[str], out: Path, date: str, *extra: str) -> int:
    code = main(["nightly", *QUICK, "--out", str(out), "--date", date, *extra])
    capsys.readouterr()
    return code


def test_the_night_explores_every_port(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--level", "layout", "--skip-mutants", "--explore-budget-s", "4", "--date", "2026-11-29"]
    code = main(["nightly", "--size", "20", "--ports", "per_request", "--out", str(tmp_path), *argv])
    capsys.readouterr()
    assert code == 0
    meta = json.loads((tmp_path / "2026-11-29" / "night.json").read_text())
    [result] = meta["explore"]
    assert result["port_spec"] == "per_request" and result["verdict"] == "clean"
    assert {p["name"] for p in result["properties"]} == {"layout", "workspace"}
    assert all(p["examples"] > 0 for p in result["properties"])
    # The database is not per date: the next night replays what this one found.
    assert result["database"] == str(tmp_path / "explore" / "per_request" / "hypothesis-db")
    assert "## Property-based exploration" in (tmp_path / "2026-11-29" / "report.md").read_text()
    assert 'id="explore"' in (tmp_path / "2026-11-29" / "index.html").read_text()


def test_a_find_fails_the_night_whole_or_sharded(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    port = "tests.explore_ports:NODE_RANK_TABLE"  # wrong only past 8 DCP ranks: no suite has such a case
    argv = ["nightly", "--size", "20", "--ports", port, "--level", "layout", "--skip-mutants", "--date", "2026-12-02"]
    argv += ["--explore-budget-s", "3"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 1
    report = (tmp_path / "whole" / "2026-12-02" / "report.md").read_text()
    assert "Verdict (every port): **FAIL**" in report and "FOUND" in report
    shards = []
    for k in (1, 2):
        main([*argv, "--shard", f"{k}/2", "--out", str(tmp_path / f"s{k}")])
        shards.append(str(tmp_path / f"s{k}" / "2026-12-02"))
    # Shard 1 searched; the merged night carries its find and fails on it.
    merged = tmp_path / "merged"
    assert (
        main(["nightly", "--from-shards", *shards, "--ports", port, "--out", str(merged), "--date", "2026-12-02"]) == 1
    )
    capsys.readouterr()
    assert "FOUND" in (merged / "2026-12-02" / "report.md").read_text()


def test_report_and_history(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "no-gpu").mkdir()
    assert nightly(capsys, tmp_path, "2026-11-27", "--gpu-reports", str(tmp_path / "no-gpu")) == 0
    assert nightly(capsys, tmp_path, "2026-11-28", "--gpu-reports", str(ROOT / "reports" / "gpu")) == 0
    assert "GPU (latest report" not in (tmp_path / "2026-11-27" / "index.html").read_text()
    page = (tmp_path / "2026-11-28" / "index.html").read_text()
    # The latest committed GPU report becomes a section: its tables, not a link.
    assert '<h2 id="gpu">GPU (latest report)</h2>' in page and "gpu-upstream-worst-case" in page
    assert "## GPU (latest report" in (tmp_path / "2026-11-28" / "report.md").read_text()
    assert "Verdict (per_request): PASS" in page and "INCOMPLETE" not in page
    assert 'id="verdicts"' in page and 'id="chunks"' in page and "Port equal_share" in page
    assert page.count("data:image/png;base64,") >= 4  # chunks, ULP histogram, two history plots
    assert "http://" not in page and "https://" not in page  # self-contained
    assert "b38e111d3e" in page and "&quot;fingerprints&quot;" in page and "&quot;dirty&quot;" in page
    # The night's small suite (--size 60, 8 numeric cases) need not kill every
    # mutant (tests/test_mutants.py holds ci to that); the matrix lists them all.
    matrix = re.search(rf"Mutant kill matrix: (\d+)/{len(MUTANTS)} killed", page)
    assert matrix is not None and 'id="kill-matrix"' in page
    assert all(f"<td>{name}</td>" in page for name in MUTANTS)
    markdown = (tmp_path / "2026-11-28" / "report.md").read_text()
    assert "| per_request | layout" in markdown and "## Provenance" in markdown
    history = read_history(tmp_path / "history.jsonl")
    assert sorted(set(history["date"])) == ["2026-11-27", "2026-11-28"]
    assert set(history["port"]) == {"per_request", "equal_share"}
    per_request = history[history["port"] == "per_request"]
    assert (per_request["pass_rate"] == 1.0).all()
    equal_share = history[history["port"] == "equal_share"]
    assert (equal_share["pass_rate"] < 1.0).all()


def test_shards_merge_into_one_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for k in (1, 2):
        nightly(capsys, tmp_path / f"s{k}", "2026-11-28", "--shard", f"{k}/2", "--level", "layout")
    nightly(capsys, tmp_path / "whole", "2026-11-28", "--level", "layout", "--skip-mutants")
    shards = [str(tmp_path / f"s{k}" / "2026-11-28") for k in (1, 2)]
    assert main(["nightly", "--from-shards", *shards, "--out", str(tmp_path / "merged"), "--date", "2026-11-28"]) == 0
    capsys.readouterr()
    whole = (tmp_path / "whole" / "2026-11-28" / "report.md").read_text()
    merged = (tmp_path / "merged" / "2026-11-28" / "report.md").read_text()
    # Provenance names the shard folders; everything above it must match.
    assert merged.split("## Provenance")[0] == whole.split("## Provenance")[0]


def test_interrupted_run_leaves_incomplete_report(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "nightly", "--size", "5000", "--out", str(tmp_path), "--date", "2026-11-28"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    meta = tmp_path / "2026-11-28" / "night.json"
    deadline = time.monotonic() + 120
    while not meta.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.5)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "INCOMPLETE" in out
    page = (tmp_path / "2026-11-28" / "index.html").read_text()
    assert 'id="incomplete"' in page and "INCOMPLETE: the run stopped after" in page
    assert not (tmp_path / "history.jsonl").exists()  # an incomplete night is not history
