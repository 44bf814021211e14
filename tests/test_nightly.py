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

import pandas as pd
import pytest

from harness.cli import main
from harness.night.folder import nightly_lock
from harness.night.history import read_history
from ports.mutants import MUTANTS

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
    assert "Verdict (every port, against its baseline): **FAIL**" in report and "FOUND" in report
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


def new_divergences(night_dir: Path) -> int:
    """Items of any port the night judged new (not in its port's baseline)."""
    tables = [pd.read_parquet(path) for path in sorted(night_dir.glob("results-*.parquet"))]
    assert tables
    return sum(int((t["baseline"] == "new").sum()) for t in tables)


def test_report_and_history(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "no-gpu").mkdir()
    # The first night leaves the kill matrix and the numeric levels out (the
    # second has them): they add nothing to the history, and the page checks
    # below are the second night's.
    first = nightly(
        capsys, tmp_path, "2026-11-27", "--gpu-reports", str(tmp_path / "no-gpu"), "--skip-mutants", "--level", "layout"
    )
    # The exit code is the baselines' verdict: non-zero exactly when some port has a new divergence.
    assert first == (1 if new_divergences(tmp_path / "2026-11-27") else 0)
    # A corrupt history line (a write cut short) is reported and skipped, never fatal.
    with (tmp_path / "history.jsonl").open("a", encoding="utf-8") as history_file:
        history_file.write('{"date": "2026-11-2\n')
    gpu_reports = str(ROOT / "reports" / "gpu")
    second = main(["nightly", *QUICK, "--out", str(tmp_path), "--date", "2026-11-28", "--gpu-reports", gpu_reports])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    history_path = tmp_path / "history.jsonl"
    assert len(warnings) == 1 and warnings[0].startswith(f"parity: warning: {history_path}:3: skipped a history line")
    assert second == (1 if new_divergences(tmp_path / "2026-11-28") else 0)
    assert '<h2 id="gpu">' not in (tmp_path / "2026-11-27" / "index.html").read_text()
    page = (tmp_path / "2026-11-28" / "index.html").read_text()
    # The latest committed GPU report becomes a section: its tables, not a link, under its own date.
    dated = [p for p in (ROOT / "reports" / "gpu").glob("*.json") if re.fullmatch(r"\d{4}-\d{2}-\d{2}\.json", p.name)]
    gpu_date = json.loads(max(dated).read_text())["date"]
    assert (
        f'<h2 id="gpu">GPU: report of {gpu_date}, not tonight&#x27;s</h2>' in page and "gpu-upstream-worst-case" in page
    )
    assert 'id="gpu-stale"' in page
    assert f"## GPU: report of {gpu_date}, NOT tonight's" in (tmp_path / "2026-11-28" / "report.md").read_text()
    assert 'id="incomplete"' not in page and "against its baseline): INCOMPLETE" not in page
    assert '<td class="pass">PASS</td>' in page  # per_request, at parity
    assert 'id="ports"' in page and 'id="verdicts"' in page and 'id="chunks"' in page and "Port equal_share" in page
    assert "cases/baselines/equal_share-nightly.json" in page  # equal_share: its shipped nightly baseline
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
    assert (per_request["pass_rate"] == 1.0).all() and (per_request["verdict"] == "pass").all()
    equal_share = history[history["port"] == "equal_share"]
    assert (equal_share["pass_rate"] < 1.0).all() and (equal_share["expected"] > 0).all()


def test_shards_merge_into_one_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for k in (1, 2):
        nightly(capsys, tmp_path / f"s{k}", "2026-11-28", "--shard", f"{k}/2", "--level", "layout")
    nightly(capsys, tmp_path / "whole", "2026-11-28", "--level", "layout", "--skip-mutants")
    shards = [str(tmp_path / f"s{k}" / "2026-11-28") for k in (1, 2)]
    code = main(["nightly", "--from-shards", *shards, "--out", str(tmp_path / "merged"), "--date", "2026-11-28"])
    assert code == (1 if new_divergences(tmp_path / "merged" / "2026-11-28") else 0)
    capsys.readouterr()
    whole = (tmp_path / "whole" / "2026-11-28" / "report.md").read_text()
    merged = (tmp_path / "merged" / "2026-11-28" / "report.md").read_text()
    # Provenance names the shard folders; everything above it must match.
    assert merged.split("## Provenance")[0] == whole.split("## Provenance")[0]
    # A shard of another commit of a port (its code by content) is not the same night.
    meta_path = tmp_path / "s2" / "2026-11-28" / "night.json"
    meta = json.loads(meta_path.read_text())
    assert set(meta["port_digests"]) == {"per_request", "equal_share"} and meta["harness_sources"]
    meta_path.write_text(json.dumps({**meta, "port_digests": {**meta["port_digests"], "per_request": "other"}}))
    again = ["nightly", "--from-shards", *shards, "--out", str(tmp_path / "again"), "--date", "2026-11-28"]
    assert main(again) == 2
    assert "port_digests" in capsys.readouterr().err


def test_interrupted_run_leaves_incomplete_report(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        # --size 100: the suite's coverage, measured before night.json, stays short
        # (10 s cold, against 22 s at --size 500); the night's numeric items keep
        # its first port running well past the kill.
        [sys.executable, "-m", "harness", "nightly", "--size", "100", "--numeric-size", "200", "--out", str(tmp_path),
             "--date", "2026-11-28"],
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
    assert 'id="incomplete"' in page and "INCOMPLETE: the run stopped during port per_request, after" in page
    assert not (tmp_path / "history.jsonl").exists()  # an incomplete night is not history


def test_bad_date_is_refused_before_anything(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    for date in ("../escape", "2026-02-30", "tonight"):
        assert main(["nightly", "--size", "20", "--out", str(out), "--date", date]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"parity: error: --date: {date!r} is not a date") and err.count("\n") == 1
    assert not out.exists() and not (tmp_path / "escape").exists()


def test_a_second_night_into_one_out_refuses(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hold = "import sys, time; from pathlib import Path; from harness.night.folder import nightly_lock\n"
    hold += "with nightly_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(120)\n"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        argv = ["nightly", "--size", "20", "--ports", "per_request", "--level", "layout", "--skip-mutants"]
        assert main([*argv, "--explore-budget-s", "0", "--out", str(tmp_path), "--date", "2026-11-28"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"parity: error: {tmp_path / '.nightly.lock'}: another parity nightly (pid {holder.pid}")
        assert err.count("\n") == 1 and not (tmp_path / "2026-11-28").exists()
    finally:
        holder.kill()
        holder.wait()
    with nightly_lock(tmp_path):
        pass  # released with its holder


def test_bad_baseline_option_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["nightly", "--size", "20", "--level", "layout", "--skip-mutants", "--explore-budget-s", "0"]
    argv += ["--out", str(tmp_path), "--date", "2026-11-28"]
    for option, reason in (("equal_share", "is not PORT=FILE"), ("nosuch=x.json", "is not one of the night's ports")):
        assert main([*argv, "--baseline", option]) == 2
        err = capsys.readouterr().err
        assert err.startswith("parity: error: --baseline: ") and reason in err and err.count("\n") == 1
    assert not (tmp_path / "2026-11-28").exists()


def test_an_out_that_cannot_be_written_is_one_line_before_any_work(tmp_path: Path) -> None:
    """``--out /proc/x``: one line naming the path and why, exit 2, before the night
    starts (it used to end, after the work, in two chained tracebacks and exit 1)."""
    argv = [sys.executable, "-m", "harness", "nightly", "--size", "20", "--ports", "per_request", "--level", "layout"]
    argv += ["--skip-mutants", "--explore-budget-s", "0", "--date", "2026-11-28"]
    for out, why in (("/proc/x", "No such file or directory"), (str(tmp_path / "file" / "x"), "Not a directory")):
        (tmp_path / "file").write_text("a file, not a folder\n", encoding="utf-8")
        done = subprocess.run([*argv, "--out", out], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr.splitlines() == [f"parity: error: --out {out}: cannot write there ({why})"], done.stderr
        assert "Traceback" not in done.stdout and "items" not in done.stdout
