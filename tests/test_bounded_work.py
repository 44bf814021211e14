"""Work the user did not ask for stays bounded: shrinking has a time box (and
the gate's outputs are written before it starts), and ``--jobs`` never starts
more workers than the machine holds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cases.suites import load_suite
from harness.cli import main
from harness.sides import job_sizing

# They pass --jobs or read the machine's cores: every core, not one xdist worker's (conftest).
pytestmark = pytest.mark.all_cores

ROOT = Path(__file__).resolve().parent.parent
TARGET = "smoke-dcp3-padded"
# The box's first evaluation may import vLLM (the oracle's answer for a smaller
# case is not cached; a few seconds, more on a busy machine): the hanging port
# call then overruns the box by at most its own limit (the time left when the
# evaluation began, at least 1 s), which GRACE_S covers.
TIME_BOX_S = 6.0
# Seconds past the time box a shrink may take: one port call cut to the time
# left (at least 1 s), the port's restart after it is killed, writing the files.
GRACE_S = 40.0


def test_a_port_that_hangs_on_small_cases_cannot_hold_the_gate(tmp_path: Path) -> None:
    """The port diverges on the case and hangs on every smaller one (each call
    allowed the 300 s default timeout): the summary is on disk when shrinking
    starts, shrinking ends within its time box, and says it was cut short."""
    (original,) = [c for c in load_suite("smoke").cases if c.name == TARGET]
    port = (
        f"cmd:{sys.executable} tests/fake_external_port.py --fault shift-or-hang --on {TARGET} "
        f"--hang-below {sum(original.context_lens)}"
    )
    out = tmp_path / "gate"
    argv = ["gate", "--suite", "smoke", "--level", "layout", "--port", port, "--out", str(out)]
    gate = subprocess.Popen(
        [sys.executable, "-m", "harness", *argv, "--shrink-time", f"{TIME_BOX_S:g}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert gate.stderr is not None
    summary_at_shrink_start = None
    for line in gate.stderr:
        if line.startswith("shrinking 1 new layout divergence"):
            summary_at_shrink_start = (out / "summary.md").read_text()
            shrink_started = time.monotonic()
            break
    assert summary_at_shrink_start is not None, "the gate never started shrinking"
    assert "FAIL" in summary_at_shrink_start and TARGET in summary_at_shrink_start
    stderr = gate.stderr.read()
    code = gate.wait(timeout=TIME_BOX_S + GRACE_S + 60)
    shrink_s = time.monotonic() - shrink_started
    assert code == 1, stderr[-2000:]
    assert shrink_s <= TIME_BOX_S + GRACE_S, f"shrinking took {shrink_s:.0f} s with a {TIME_BOX_S:g} s time box"
    summary = (out / "summary.md").read_text()
    assert "shrunk: " in summary and "cut short: its time box ran out" in summary, summary[-1500:]
    assert (out / "shrunk" / f"{TARGET}.json").is_file()


HANGING_PORT = f'''
import time

from ports.mutants import MUTANTS
from ports.per_request import PerRequestPort


class HangsWhenSmaller(PerRequestPort):
    name = "hangs-when-smaller"

    def plan_layout(self, case):
        if case.name == "{TARGET}":
            if sum(case.context_lens) < HANG_BELOW:
                time.sleep(3600)
            return MUTANTS["dcp-padded-by-shift"]().plan_layout(case)
        return super().plan_layout(case)
'''


def test_an_in_process_port_that_hangs_on_small_cases_cannot_hold_the_gate(tmp_path: Path) -> None:
    """The same for a Python port: each evaluation's call is limited to the time left."""
    (original,) = [c for c in load_suite("smoke").cases if c.name == TARGET]
    (tmp_path / "hanging_port.py").write_text(f"HANG_BELOW = {sum(original.context_lens)}\n" + HANGING_PORT)
    out = tmp_path / "gate"
    argv = ["gate", "--suite", "smoke", "--level", "layout", "--port", "hanging_port:HangsWhenSmaller"]
    started = time.monotonic()
    gate = subprocess.run(
        [sys.executable, "-m", "harness", *argv, "--out", str(out), "--shrink-time", f"{TIME_BOX_S:g}"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=TIME_BOX_S + GRACE_S + 120,
        check=False,
    )
    assert gate.returncode == 1, gate.stderr[-2000:]
    assert time.monotonic() - started <= TIME_BOX_S + GRACE_S + 60, gate.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    assert "cut short: its time box ran out" in summary, summary[-1500:]


def test_no_shrinking_with_a_zero_time_box(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["gate", "--suite", "smoke", "--level", "layout", "--port", "mutant:dcp-padded-by-shift"]
    assert main([*argv, "--out", str(tmp_path), "--shrink-time", "0"]) == 1
    assert "shrinking" not in capsys.readouterr().err
    assert not (tmp_path / "shrunk").exists()


def test_jobs_is_cut_to_what_the_machine_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(job_sizing, "available_cores", lambda: 4)
    monkeypatch.setattr(job_sizing, "available_memory_bytes", lambda: 3 * job_sizing.WORKER_MEMORY_BYTES + 1)
    assert job_sizing.machine_workers() == 3
    assert job_sizing.resolve_jobs(1000, 0.0, 10_000) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--jobs 1000 cut to 3" in err and "4 cores" in err
    assert job_sizing.resolve_jobs(2, 0.0, 10_000) == 2 and capsys.readouterr().err == ""
    monkeypatch.setattr(job_sizing, "available_memory_bytes", lambda: None)
    assert job_sizing.machine_workers() == 4


def test_jobs_1000_runs_with_the_machines_cores_and_says_so() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--suite", "smoke", "--level", "layout", "--jobs", "1000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    cut = [line for line in run.stderr.splitlines() if "--jobs 1000 cut to" in line]
    assert len(cut) == 1, run.stderr[-2000:]
    workers = int(cut[0].split("cut to ", 1)[1].split(":", 1)[0])
    assert 1 <= workers <= job_sizing.available_cores()


def test_jobs_auto_is_the_machines_workers() -> None:
    from harness.commands.options import jobs_count

    assert jobs_count("auto") == job_sizing.machine_workers()
    assert jobs_count("3") == 3
