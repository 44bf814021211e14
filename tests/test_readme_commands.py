"""Every command the README shows runs as written.

The commands are read from the README itself (its ``sh`` blocks, and inline
code that starts with ``parity`` or ``make``), so a command added there
without a way to run it here fails :func:`test_every_command_is_known`. Each
runs from the repository root in a shell whose PATH is a fresh one's, and
exits as the README says it does. Two are the quick start's: ``make gate``
runs its recipe (the gate on the ci suite, after the step that installs the
console script); ``make test`` is the command running this file (``.ci/run``
execs it), so its recipe is checked, not run again from inside itself.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FRESH_PATH = "/usr/local/bin:/usr/bin:/bin"

# Each README command and the exit code it must end with, as the README says:
# 0 parity, 1 a divergence (the diff shows equal_share's).
EXPECTED_EXIT = {
    "make gate": 0,
    "make test": None,  # the command running this test: its recipe is checked instead
    ".tox/oracle/bin/parity gate --suite smoke --port ports.per_request:PORT --out reports/out/gate-smoke": 0,
    ".tox/oracle/bin/parity diff smoke/smoke-skew-block128 --port equal_share --level layout": 1,
    ".tox/oracle/bin/parity nightly --size 40 --numeric-size 4 --skip-mutants --explore-budget-s 0 "
    "--out reports/out/nightly-small": 0,
    "parity list cases --suite smoke": 0,
}


def readme_commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", README, re.S)
    shown = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    inline = re.findall(r"`((?:parity|make) [^`]+)`", README)
    return sorted({c for c in shown + inline if c})


def fresh_shell(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = FRESH_PATH
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_every_command_is_known() -> None:
    assert set(readme_commands()) == set(EXPECTED_EXIT)


def test_make_test_runs_the_checks_and_the_suite() -> None:
    assert (ROOT / ".ci" / "run").read_text(encoding="utf-8").rstrip().endswith("exec make test")
    recipe = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "tox -e vllm-0.27.1 --notest" in recipe and "tox -e oracle" in recipe
    tox_ini = (ROOT / "tox.ini").read_text(encoding="utf-8")
    commands = tox_ini.split("[testenv:oracle]", 1)[1].split("commands =", 1)[1].split("\n\n", 1)[0]
    for check in ("ruff check .", "ruff format --check .", "mypy ", "lint-imports", "pytest -n 2"):
        assert check in commands, check


def test_make_gate_installs_the_console_script_and_runs_the_ci_gate(tmp_path: Path) -> None:
    recipe = subprocess.run(["make", "-n", "gate"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = recipe.strip().splitlines()
    # The environment (with the harness installed: .tox/oracle/bin/parity) before the gate.
    assert any("-e oracle --notest" in line for line in lines), recipe
    gate = shlex.split(lines[-1].split(" -- ", 1)[1])
    assert gate[:4] == ["python", "-m", "harness", "gate"], recipe
    assert (ROOT / ".tox" / "oracle" / "bin" / "parity").exists()
    out = tmp_path / "gate"
    words = [sys.executable, *gate[1:]]
    words[words.index("--out") + 1] = str(out)
    done = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verdict PASS" in done.stdout or "PASS" in (out / "summary.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "command", [c for c in EXPECTED_EXIT if EXPECTED_EXIT[c] is not None and not c.startswith("make ")]
)
def test_each_command_runs_as_written(command: str) -> None:
    # An inline `parity ...` is the console script, as the README says it is after either command.
    line = command if command.startswith(".tox/") else f".tox/oracle/bin/{command}"
    done = fresh_shell(line, timeout=900)
    assert done.returncode == EXPECTED_EXIT[command], done.stdout[-3000:] + done.stderr[-3000:]
