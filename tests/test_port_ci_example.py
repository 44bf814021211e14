"""examples/port-ci.yml: the workflow a port repository copies.

It builds the pinned environment once and every job that runs the harness
restores it (the same cache key as the job that saves it, a key that hashes
every file deciding the environment); the gate runs on pull requests only and a
nightly job, on the schedule only, runs ``parity nightly`` and publishes its
page; the oracle's answers to the ci suite are computed once, by the
harness's own port, and every gate shard restores them; the port's baseline is
passed only when the file exists; the harness is
checked out at a pinned ref; and the workflow is least-privilege (no default
permissions, actions pinned to commits, no credentials left by checkouts, and the
only job that may write, for the PR comment and the check, runs nothing of the
port: no checkout, no command, only the merge's artifact). The
harness commands are run as the runner would run them, through bash with an
interpreter that records its arguments, and the CLI's parser must take them.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "examples" / "port-ci.yml"
# Where the workflow checks the harness out (every path in it is relative to the workspace).
CHECKOUT = "harness"
ENV_CACHE_PATH = f"{CHECKOUT}/.tox"
HARNESS_RUN = re.compile(r"-m harness (\w+)")
# Running tox (which would build the environment), not a path inside .tox.
TOX = re.compile(r"(^|\s)(python -m )?tox\s")
CACHE_SAVE = ("actions/cache@", "actions/cache/save@")
CACHE_RESTORE = ("actions/cache@", "actions/cache/restore@")
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
EVENTS = ("pull_request", "schedule")


def workflow() -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def triggers() -> dict[str, Any]:
    # YAML 1.1 reads the key `on` as the boolean true.
    loaded = workflow()
    found = loaded["on"] if "on" in loaded else loaded[True]
    assert isinstance(found, dict), found
    return found


def jobs() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = workflow()["jobs"]
    return found


def uses(step: dict[str, Any], actions: tuple[str, ...]) -> bool:
    return str(step.get("uses", "")).startswith(actions)


def needs(job: dict[str, Any]) -> list[str]:
    value = job.get("needs", [])
    return [value] if isinstance(value, str) else list(value)


def harness_steps(job: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, s) for i, s in enumerate(job["steps"]) if HARNESS_RUN.search(str(s.get("run", "")))]


def env_cache_steps(job: dict[str, Any], actions: tuple[str, ...]) -> list[tuple[int, dict[str, Any]]]:
    """The job's cache steps over the pinned environment (the nightly also caches its history)."""
    return [
        (i, s)
        for i, s in enumerate(job["steps"])
        if uses(s, actions) and s.get("with", {}).get("path") == ENV_CACHE_PATH
    ]


def saving_job() -> tuple[str, dict[str, Any]]:
    saving = [(name, job) for name, job in jobs().items() if env_cache_steps(job, CACHE_SAVE)]
    assert len(saving) == 1, f"one job builds and saves the environment, not {[n for n, _ in saving]}"
    return saving[0]


def cache_step(job: dict[str, Any], actions: tuple[str, ...]) -> tuple[int, dict[str, Any]]:
    steps = env_cache_steps(job, actions)
    assert len(steps) == 1, steps
    return steps[0]


def runs_on(job: dict[str, Any], event: str) -> bool:
    """Whether the job runs for ``event``, by the event test in its ``if``
    (a job without one runs for every trigger)."""
    condition = str(job.get("if", ""))
    named = re.findall(r"github\.event_name == '(\w+)'", condition)
    return not named or event in named


def test_one_job_builds_the_environment_only_on_a_cache_miss() -> None:
    name, job = saving_job()
    index, cache = cache_step(job, CACHE_SAVE)
    builds = [(i, s) for i, s in enumerate(job["steps"]) if TOX.search(str(s.get("run", "")))]
    assert len(builds) == 1, f"job {name} builds the environment once"
    build_index, build = builds[0]
    assert build_index > index and build.get("if") == f"steps.{cache['id']}.outputs.cache-hit != 'true'"
    # No other job builds it: they restore what this one saved.
    others = [n for n, j in jobs().items() if n != name and any(TOX.search(str(s.get("run", ""))) for s in j["steps"])]
    assert others == []
    # It serves both triggers: the gate's jobs and the nightly need it.
    assert all(runs_on(job, event) for event in EVENTS)


def test_every_job_running_the_harness_restores_the_saved_environment() -> None:
    saver, saving = saving_job()
    _, saved = cache_step(saving, CACHE_SAVE)
    runners = {name: job for name, job in jobs().items() if harness_steps(job)}
    assert set(runners) >= {"gate", "merge", "nightly"}, sorted(runners)
    for name, job in runners.items():
        if name == saver:
            continue
        assert saver in needs(job), f"job {name} must wait for {saver}, which builds the environment"
        index, restore = cache_step(job, CACHE_RESTORE)
        assert restore["with"]["key"] == saved["with"]["key"], name
        assert restore["with"].get("fail-on-cache-miss") is True, f"job {name} must never build it silently"
        for step_index, step in harness_steps(job):
            assert step_index > index, f"job {name} runs the harness before restoring its environment"
            # The harness runs from the restored environment, not from whatever Python is on PATH.
            assert step["working-directory"] == CHECKOUT
            assert f"{step['working-directory']}/.tox" == ENV_CACHE_PATH
            for line in harness_lines(step["run"]):
                assert line.split()[0] == ".tox/oracle/bin/python", line


ORACLE_ANSWERS = f"{CHECKOUT}/.oracle-answers"


def oracle_answer_steps(job: dict[str, Any], actions: tuple[str, ...]) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if uses(s, actions) and s.get("with", {}).get("path") == ORACLE_ANSWERS]


def test_the_gate_shards_read_the_oracle_answers_the_environment_job_computed_with_the_harnesss_port() -> None:
    saver, saving = saving_job()
    (saved,) = oracle_answer_steps(saving, CACHE_SAVE)
    # Computed on a miss, by the harness's own port into the cached folder: the port under test never runs there.
    (compute,) = [s for _, s in harness_steps(saving)]
    on_pull_requests = "github.event_name == 'pull_request'"
    assert saved.get("if") == on_pull_requests  # the nightly's suite is another: it would not use them
    assert compute.get("if") == f"{on_pull_requests} && steps.{saved['id']}.outputs.cache-hit != 'true'"
    assert "--port per_request" in compute["run"] and "PYTHONPATH" not in compute.get("env", {})
    folder = "${{ github.workspace }}/" + ORACLE_ANSWERS
    assert compute["env"]["PARITY_ORACLE_CACHE"] == folder
    # What decides an answer is hashed into the key: the harness's code, cases and requirements.
    for hashed in ("harness/harness/**", "harness/oracle/**", "harness/cases/**", "harness/requirements/*.txt"):
        assert hashed in saved["with"]["key"], hashed
    gate = jobs()["gate"]
    (restored,) = oracle_answer_steps(gate, ("actions/cache/restore@",))
    assert restored["with"]["key"] == saved["with"]["key"] and saver in needs(gate)
    (_, gate_step), *_ = harness_steps(gate)
    assert gate_step["env"]["PARITY_ORACLE_CACHE"] == folder


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


def test_the_gate_runs_on_pull_requests_and_the_nightly_on_the_schedule() -> None:
    assert set(triggers()) == set(EVENTS), sorted(triggers())
    assert triggers()["schedule"], "the nightly needs a cron"
    for event in EVENTS:
        commands = {
            subcommand(line)
            for job in jobs().values()
            if runs_on(job, event)
            for _, step in harness_steps(job)
            if runs_on(step, event)
            for line in harness_lines(step["run"])
        }
        # On pull requests the environment job also computes the oracle's answers (parity run).
        expected = {"run", "gate", "merge"} if event == "pull_request" else {"nightly"}
        assert commands == expected, f"on {event} the workflow runs parity {sorted(commands)}"


def test_the_nightly_job_publishes_its_report() -> None:
    job = jobs()["nightly"]
    [(index, step)] = harness_steps(job)
    argv = recorded_argv(step, job, baseline=False)[0]
    out = argv[argv.index("--out") + 1]
    published = [
        s for s in job["steps"][index + 1 :] if uses(s, ("actions/upload-artifact@", "actions/upload-pages-artifact@"))
    ]
    assert published, "the nightly uploads its page"
    # Published even when the night finds a divergence (the page says which).
    assert all(s.get("if") == "always()" for s in published)
    assert {s["with"]["path"] for s in published} == {f"{CHECKOUT}/{out}"}


def test_every_harness_checkout_is_pinned() -> None:
    env = workflow()["env"]
    ref = env.get("HARNESS_REF")
    assert isinstance(ref, str) and ref, "HARNESS_REF names the harness commit or tag to gate against"
    # The placeholder is explained where it is set: the comment above it says what to put there.
    lines = WORKFLOW.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("HARNESS_REF:"))
    above = list(itertools.takewhile(lambda line: line.strip().startswith(("#", "HARNESS_")), reversed(lines[:at])))
    explained = " ".join(line for line in above if line.strip().startswith("#"))
    assert "commit" in explained and "tag" in explained, "HARNESS_REF comes with its explanation"
    for name, job in jobs().items():
        harness_checkouts = 0
        for step in job["steps"]:
            if not uses(step, ("actions/checkout@",)):
                continue
            if step["with"]["path"] == CHECKOUT:
                harness_checkouts += 1
                assert step["with"].get("repository") == "${{ env.HARNESS_REPOSITORY }}", name
                assert step["with"].get("ref") == "${{ env.HARNESS_REF }}", f"job {name}: the harness is unpinned"
        # Every job building or restoring the environment checks the harness out (once);
        # the verdict job checks nothing out.
        uses_environment = bool(env_cache_steps(job, CACHE_SAVE + CACHE_RESTORE))
        assert harness_checkouts == int(uses_environment), (
            f"job {name} checks the harness out {harness_checkouts} times"
        )


def test_the_workflow_is_least_privilege() -> None:
    assert workflow()["permissions"] == {}, "no permission by default: each job asks for what it uses"
    writers = {"verdict": {"pull-requests", "checks"}}
    for name, job in jobs().items():
        permissions = job.get("permissions")
        assert isinstance(permissions, dict), f"job {name} states its permissions"
        written = {scope for scope, level in permissions.items() if level == "write"}
        assert written == writers.get(name, set()), f"job {name} writes {sorted(written)}"
        assert set(permissions.values()) <= {"read", "write"}, name
        for step in job["steps"]:
            if "uses" in step:
                assert SHA_PIN.match(step["uses"]), f"job {name}: {step['uses']} is not pinned to a commit"
            if uses(step, ("actions/checkout@",)):
                assert step["with"].get("persist-credentials") is False, f"job {name}: a checkout keeps its token"
            # Values reach scripts through the environment, never pasted into them.
            assert not EXPRESSION.search(str(step.get("run", ""))), f"job {name}: an expression inside run"
    # Each pin names its release, so an update is reviewable.
    for line in WORKFLOW.read_text().splitlines():
        if re.match(r"\s*(- )?uses:", line):
            assert re.search(r"@[0-9a-f]{40} # v\d", line), line


# What the job that may write is allowed to run: the artifact download and the two publishers.
PUBLISHERS = ("marocchino/sticky-pull-request-comment@", "mikepenz/action-junit-report@")


def test_the_job_that_writes_runs_nothing_of_the_port() -> None:
    """The PR comment and the check come from a job that checks nothing out, runs
    no command and restores no cache (the cache is writable by the port's code in
    the gate): it only downloads the merge's artifact and publishes it."""
    writers = {name: job for name, job in jobs().items() if "write" in job["permissions"].values()}
    assert set(writers) == {"verdict"}, sorted(writers)
    job = writers["verdict"]
    for step in job["steps"]:
        assert "run" not in step, f"the verdict job runs {step['run']!r}"
        assert uses(step, ("actions/download-artifact@", *PUBLISHERS)), step.get("uses")
    # The merged verdict: the one artifact the merge job uploads, by its name.
    assert needs(job) == ["merge"]
    merge = jobs()["merge"]
    uploads = [s for s in merge["steps"] if uses(s, ("actions/upload-artifact@",))]
    assert len(uploads) == 1 and uploads[0].get("if") == "always()", "the merge hands on even a failing verdict"
    assert uploads[0]["with"]["path"] == f"{CHECKOUT}/out/merged"
    downloads = [s for s in job["steps"] if uses(s, ("actions/download-artifact@",))]
    assert len(downloads) == 1 and downloads[0]["with"]["name"] == uploads[0]["with"]["name"]
    folder = downloads[0]["with"]["path"]
    [merge_step] = [step for _, step in harness_steps(merge)]
    assert "--out out/merged" in merge_step["run"]
    published = {s["uses"].split("@")[0]: s["with"] for s in job["steps"] if uses(s, PUBLISHERS)}
    assert published["marocchino/sticky-pull-request-comment"]["path"] == f"{folder}/summary.md"
    assert published["mikepenz/action-junit-report"]["report_paths"] == f"{folder}/junit.xml"
    # Posted for a failing verdict too, never for a fork (its token is read-only).
    condition = " ".join(str(job["if"]).split())
    assert "always()" in condition and "needs.merge.result == 'failure'" in condition, condition
    assert "github.event.pull_request.head.repo.full_name == github.repository" in condition, condition
    # Every job that runs a command or checks anything out may only read.
    for name, other in jobs().items():
        if any("run" in s or uses(s, ("actions/checkout@",)) for s in other["steps"]):
            assert other["permissions"] == {"contents": "read"}, f"job {name}: {other['permissions']}"


# -- the harness commands, run as the runner runs them ----------------------------------


def subcommand(line: str) -> str:
    found = HARNESS_RUN.search(line)
    assert found, line
    return found.group(1)


def harness_lines(script: str) -> list[str]:
    """The script's logical lines (continuations joined) that run the harness."""
    joined = script.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if HARNESS_RUN.search(line)]


def expand(value: str, env: dict[str, str]) -> str:
    """The workflow's expressions in ``value``, for the first shard in a workspace."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "matrix.shard":
            return "1"
        if name == "github.workspace":
            return env["GITHUB_WORKSPACE"]
        if name.startswith("env."):
            return env[name.removeprefix("env.")]
        raise AssertionError(f"unexpected expression {match.group(0)} in an environment value")

    return EXPRESSION.sub(one, value)


def recorded_argv(
    step: dict[str, Any], job: dict[str, Any], *, baseline: bool, tmp: Path | None = None
) -> list[list[str]]:
    """Run ``step``'s script with bash as the runner does (``shell: bash``), in a
    workspace whose port has a baseline file or not, with an interpreter at
    ``.tox/oracle/bin/python`` that records its arguments; each call's argv after
    ``-m harness``."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp) as where:
        workspace = Path(where)
        (workspace / "port").mkdir()
        interpreter = workspace / CHECKOUT / ".tox" / "oracle" / "bin" / "python"
        interpreter.parent.mkdir(parents=True)
        calls = workspace / "calls"
        record = shlex.quote(str(calls))
        interpreter.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" >> {record}\necho >> {record}\n')
        interpreter.chmod(0o755)
        env = {"PATH": os.environ["PATH"], "GITHUB_WORKSPACE": str(workspace)}
        for scope in (workflow(), job, step):
            for key, value in scope.get("env", {}).items():
                env[key] = expand(str(value), env)
        if baseline:
            (workspace / "port" / env["PORT_BASELINE"]).write_text('{"entries": []}\n')
        assert workflow()["defaults"]["run"]["shell"] == "bash"
        # GitHub's `shell: bash`: bash --noprofile --norc -eo pipefail {0}
        script = workspace / "step.sh"
        script.write_text(step["run"])
        cwd = workspace / step["working-directory"]
        subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=cwd, env=env, check=True)
        records = calls.read_text().split("\n")[:-1]
        argvs = [record.split("\0")[:-1] for record in records]
        for argv in argvs:
            assert argv[:2] == ["-m", "harness"], argv
        return [argv[2:] for argv in argvs]


@pytest.mark.parametrize("baseline", [False, True], ids=["without-baseline", "with-baseline"])
@pytest.mark.parametrize("job_name", ["environment", "gate", "merge", "nightly"])
def test_the_harness_commands_parse(job_name: str, baseline: bool, tmp_path: Path) -> None:
    from harness.cli import build_parser

    shards = jobs()["gate"]["strategy"]["matrix"]["shard"]
    job = jobs()[job_name]
    steps = harness_steps(job)
    assert steps, job_name
    for _, step in steps:
        argvs = recorded_argv(step, job, baseline=baseline, tmp=tmp_path)
        assert len(argvs) == len(harness_lines(step["run"])), "each harness line runs once"
        for argv in argvs:
            try:
                args = build_parser().parse_args(argv)
            except SystemExit as exc:
                pytest.fail(f"job {job_name}: `{shlex.join(argv)}` is refused by the CLI (exit {exc.code})")
            if "--shard" in argv:
                assert argv[argv.index("--shard") + 1] == f"1/{len(shards)}", "--shard N must be the matrix's size"
            if job_name == "environment":
                continue  # the oracle's answers, by the harness's own port: no baseline
            port_file = str(tmp_path)  # the workspace is a folder under tmp_path
            given = args.baseline if job_name != "nightly" else (args.baseline or [None])[0]
            if not baseline:
                # A port without a baseline file is gated without one (a missing file is exit 2).
                assert not given, f"job {job_name} passes --baseline without the file"
                continue
            assert given, f"job {job_name} leaves out the port's baseline"
            expected_file = f"/port/{workflow()['env']['PORT_BASELINE']}"
            if job_name == "nightly":
                port, _, file = given.partition("=")
                assert port == workflow()["env"]["PORT"] == args.ports
                given = file
            assert given.startswith(port_file) and given.endswith(expected_file), given


def test_the_workflows_port_is_the_recipes() -> None:
    """The example workflow's PORT placeholder is the port the recipe gates (docs/gate-your-own-port.md)."""
    recipe = (ROOT / "docs" / "gate-your-own-port.md").read_text(encoding="utf-8")
    ports = set(re.findall(r"--port ([\w.]+:\w+)", recipe))
    assert ports == {workflow()["env"]["PORT"]}, ports
