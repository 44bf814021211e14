"""examples/port-ci.yml builds the pinned environment once and every job that
runs the harness restores it: the same cache key as the job that saves it, a
key that hashes every file deciding the environment, and commands the CLI takes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "examples" / "port-ci.yml"
# Where the workflow checks the harness out (every path in it is relative to the workspace).
CHECKOUT = "harness"
HARNESS_RUN = re.compile(r"-m harness (\w+)")
# Running tox (which would build the environment), not a path inside .tox.
TOX = re.compile(r"(^|\s)(python -m )?tox\s")
CACHE_SAVE = ("actions/cache@", "actions/cache/save@")
CACHE_RESTORE = ("actions/cache@", "actions/cache/restore@")


def jobs() -> dict[str, dict[str, Any]]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    found: dict[str, dict[str, Any]] = workflow["jobs"]
    return found


def uses(step: dict[str, Any], actions: tuple[str, ...]) -> bool:
    return str(step.get("uses", "")).startswith(actions)


def needs(job: dict[str, Any]) -> list[str]:
    value = job.get("needs", [])
    return [value] if isinstance(value, str) else list(value)


def harness_steps(job: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, s) for i, s in enumerate(job["steps"]) if HARNESS_RUN.search(str(s.get("run", "")))]


def saving_job() -> tuple[str, dict[str, Any]]:
    saving = [(name, job) for name, job in jobs().items() if any(uses(s, CACHE_SAVE) for s in job["steps"])]
    assert len(saving) == 1, f"one job builds and saves the environment, not {[n for n, _ in saving]}"
    return saving[0]


def cache_step(job: dict[str, Any], actions: tuple[str, ...]) -> tuple[int, dict[str, Any]]:
    steps = [(i, s) for i, s in enumerate(job["steps"]) if uses(s, actions)]
    assert len(steps) == 1, steps
    return steps[0]


def test_one_job_builds_the_environment_only_on_a_cache_miss() -> None:
    name, job = saving_job()
    index, cache = cache_step(job, CACHE_SAVE)
    builds = [(i, s) for i, s in enumerate(job["steps"]) if TOX.search(str(s.get("run", "")))]
    assert len(builds) == 1, f"job {name} builds the environment once"
    build_index, build = builds[0]
    assert build_index > index and build.get("if") == f"steps.{cache['id']}.outputs.cache-hit != 'true'"
    assert cache["with"]["path"] == f"{CHECKOUT}/.tox"
    # No other job builds it: they restore what this one saved.
    others = [n for n, j in jobs().items() if n != name and any(TOX.search(str(s.get("run", ""))) for s in j["steps"])]
    assert others == []


def test_every_job_running_the_harness_restores_the_saved_environment() -> None:
    saver, saving = saving_job()
    _, saved = cache_step(saving, CACHE_SAVE)
    runners = {name: job for name, job in jobs().items() if harness_steps(job)}
    assert set(runners) >= {"gate", "verdict"}, sorted(runners)
    for name, job in runners.items():
        if name == saver:
            continue
        assert saver in needs(job), f"job {name} must wait for {saver}, which builds the environment"
        index, restore = cache_step(job, CACHE_RESTORE)
        assert restore["with"]["key"] == saved["with"]["key"], name
        assert restore["with"]["path"] == saved["with"]["path"], name
        assert restore["with"].get("fail-on-cache-miss") is True, f"job {name} must never build it silently"
        for step_index, step in harness_steps(job):
            assert step_index > index, f"job {name} runs the harness before restoring its environment"
            # The harness runs from the restored environment, not from whatever Python is on PATH.
            assert step["working-directory"] == CHECKOUT
            assert step["run"].split()[0] == ".tox/oracle/bin/python"
            assert f"{step['working-directory']}/.tox" == restore["with"]["path"]


def test_the_key_hashes_every_file_that_decides_the_environment() -> None:
    _, saving = saving_job()
    _, saved = cache_step(saving, CACHE_SAVE)
    key = saved["with"]["key"]
    assert "${{ runner.os }}" in key and "steps.python.outputs.python-version" in key
    hashed = re.fullmatch(r".*\$\{\{ hashFiles\((.*)\) \}\}.*", key)
    assert hashed, key
    patterns = [p.strip().strip("'") for p in hashed.group(1).split(",")]
    covered: set[Path] = set()
    for pattern in patterns:
        assert pattern.startswith(f"{CHECKOUT}/"), pattern
        matched = set(ROOT.glob(pattern.removeprefix(f"{CHECKOUT}/")))
        assert matched, f"{pattern} matches no file of the harness"
        covered |= matched
    deciding = {*ROOT.glob("requirements/*.txt"), ROOT / "tox.ini", ROOT / "pyproject.toml"}
    # tox.ini's install_command: the script that drops the wheels breaking vllm on CPU.
    deciding |= {ROOT / m for m in re.findall(r"\{toxinidir\}/(\S+\.py)", (ROOT / "tox.ini").read_text())}
    assert len(deciding) >= 5 and deciding <= covered, sorted(str(p) for p in deciding - covered)
    # The Python every job sets up is the one the key names (a venv points at its interpreter).
    for name, job in jobs().items():
        pythons = [s for s in job["steps"] if uses(s, ("actions/setup-python@",))]
        if harness_steps(job) or name == "environment":
            assert len(pythons) == 1 and pythons[0]["id"] == "python", name
            assert pythons[0]["with"]["python-version"] == "${{ env.PYTHON_VERSION }}", name


@pytest.mark.parametrize("job_name", ["gate", "verdict"])
def test_the_harness_commands_parse(job_name: str) -> None:
    from harness.cli import build_parser

    shards = jobs()["gate"]["strategy"]["matrix"]["shard"]
    for _, step in harness_steps(jobs()[job_name]):
        command = step["run"].replace("${{ matrix.shard }}", "1").replace("${{ github.workspace }}", "/workspace")
        assert "${{" not in command, command
        argv = shlex.split(command)[3:]  # after ".tox/oracle/bin/python -m harness"
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"job {job_name}: `{command}` is refused by the CLI (exit {exc.code})")
        if "--shard" in argv:
            assert argv[argv.index("--shard") + 1] == f"1/{len(shards)}", "--shard N must be the matrix's size"
