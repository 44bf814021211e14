"""Determinism and durability: byte-identical results, kill -9 and --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parity(*argv: str, hash_seed: str = "0") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run(
        [sys.executable, "-m", "harness", *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )


def test_byte_identical_results_across_runs_and_hash_seeds(tmp_path: Path) -> None:
    outputs = []
    # Two runs, each under its own hash seed: a difference between runs or between seeds shows.
    for run, seed in enumerate(("0", "31337")):
        rows, document = tmp_path / f"rows{run}.jsonl", tmp_path / f"doc{run}.json"
        proc = parity(
            "run", "--suite", "smoke", "--port", "equal_share", "--results", str(rows), "--json", str(document),
            hash_seed=seed,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr[-2000:]
        outputs.append((rows.read_bytes(), document.read_bytes()))
    assert outputs[0] == outputs[1]
    assert len(outputs[0][0].splitlines()) > 100


def test_sigkill_leaves_readable_rows_and_resume_finishes(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    # An eighth of ci's layout items (about 1,100): the kill comes past 200 rows, well before the end.
    argv = [
        "run",
        "--suite",
        "ci",
        "--level",
        "layout",
        "--shard",
        "1/8",
        "--port",
        "per_request",
        "--results",
        str(rows),
    ]
    proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if rows.exists() and len(rows.read_bytes().splitlines()) > 200:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    # Killed mid-run, not reaped after a run that had already finished.
    assert proc.wait() == -signal.SIGKILL
    lines = rows.read_text().splitlines()
    assert 200 < len(lines)
    header = json.loads(lines[0])["header"]
    assert header["suite"] == "ci" and header["port"] == "per_request"
    complete = [json.loads(line) for line in lines[1:-1]]  # the last line may be torn
    assert all(row["status"] == "parity" for row in complete)

    resumed = parity(*argv, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    fresh_rows = tmp_path / "fresh.jsonl"
    fresh = parity(*argv[:-1], str(fresh_rows))
    assert fresh.returncode == 0
    assert len(lines) - 1 < len(fresh_rows.read_text().splitlines()) - 1  # the kill left rows to resume
    resumed_records = sorted(rows.read_text().splitlines()[1:], key=lambda line: json.loads(line)["index"])
    assert resumed_records == fresh_rows.read_text().splitlines()[1:]
    summary = [line for line in resumed.stdout.splitlines() if line.startswith(("parity ", "  layout"))]
    assert summary == [line for line in fresh.stdout.splitlines() if line.startswith(("parity ", "  layout"))]


def test_resume_refuses_another_runs_file(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    assert parity("run", "--suite", "smoke", "--level", "merge", "--results", str(rows)).returncode == 0
    proc = parity("run", "--suite", "smoke", "--level", "layout", "--results", str(rows), "--resume")
    assert proc.returncode == 2 and "field 'header.items_digest'" in proc.stderr and "refusing to resume" in proc.stderr
