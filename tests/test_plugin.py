"""The pytest plugin: one item per (case, level), readable ids, JUnit, -k, xdist."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from harness.cases.suites import load_suite
from harness.sides.runner import plan_items
from harness.verdicts.baseline import SuiteTargets
from oracle.pin_record import RECORDS
from tests.collection_spy import SPY

ROOT = Path(__file__).resolve().parent.parent
EQUAL_SHARE_BASELINE = ROOT / "cases" / "baselines" / "equal_share.json"


def run_pytest(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """pytest as a port's repository runs it: the harness's own tests/conftest.py
    (this session's recipe, one core per worker) is not loaded (``--noconftest``)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--noconftest", *args],
        cwd=cwd, capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip


# The collection spy: a plugin that records that collection began (tests/collection_spy.py).
SPY_PLUGIN = ("-p", "tests.collection_spy")


def test_junit_has_one_item_per_case_and_level(tmp_path: Path) -> None:
    junit = tmp_path / "out.xml"
    proc = run_pytest("--parity-suite", "smoke", "--parity-port", "per_request", "--parity-level", "layout",
                      "-n", "2", "--junitxml", str(junit))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    cases = ET.parse(junit).getroot().findall(".//testcase")
    expected = plan_items(load_suite("smoke"), ("layout",))
    assert len(cases) == len(expected)
    names = {c.get("name") for c in cases}
    assert "smoke.smoke-upstream-worst-case[layout]" in names  # junitxml writes the "/" of an id as "."
    assert all(c.find("failure") is None for c in cases)
    assert not any("test_" in (c.get("name") or "") for c in cases)  # unit tests stay out


def test_failure_message_is_the_first_divergence_and_k_selects() -> None:
    proc = run_pytest("--parity-suite", "smoke", "--parity-port", "equal_share", "-k", "upstream and layout", "-rf")
    assert proc.returncode == 1
    assert "1 failed" in proc.stdout and "deselected" in proc.stdout
    assert "FAILED smoke/smoke-upstream-worst-case[layout] - divergent" in proc.stdout
    assert "chunk 0, field num_context_tokens: oracle 60496 != port 2544" in proc.stdout


def write_baseline(tmp_path: Path, *entries: dict[str, Any], port: str = "equal_share") -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"port": port, "entries": [{"reason": "measured", **e} for e in entries]}))
    return path


def smoke_baseline(tmp_path: Path) -> Path:
    """The checked-in ci baseline's entries that name what the smoke suite has."""
    targets = SuiteTargets.of_suite(load_suite("smoke"))
    data = json.loads((ROOT / "cases" / "baselines" / "equal_share.json").read_text())
    data["entries"] = [e for e in data["entries"] if e.get("family") in targets.families[e["level"]]]
    path = tmp_path / "smoke-baseline.json"
    path.write_text(json.dumps(data))
    return path


def test_baseline_marks_expected_divergences_xfail(tmp_path: Path) -> None:
    proc = run_pytest("--parity-suite", "smoke", "--parity-port", "equal_share", "--parity-level", "layout",
                      "--parity-baseline", str(smoke_baseline(tmp_path)), "-k", "skew")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "xfailed" in proc.stdout and "failed" not in proc.stdout.replace("xfailed", "")


def test_entries_match_the_loaded_port_name_whatever_the_spelling(tmp_path: Path) -> None:
    entry = {"family": "skew", "level": "layout", "status": "divergent"}
    baseline = write_baseline(tmp_path, entry)  # names the port "equal_share"
    proc = run_pytest("--parity-suite", "smoke", "--parity-port", "ports.equal_share:PORT", "--parity-level",
                      "layout", "--parity-baseline", str(baseline), "-k", "upstream", "-rx")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "1 xfailed" in proc.stdout and "baseline: measured" in proc.stdout


def test_an_item_beyond_its_entry_fails_and_says_why(tmp_path: Path) -> None:
    baseline = write_baseline(
        tmp_path,
        {"family": "skew", "level": "layout", "status": "divergent", "field": "request_start"},
        {"family": "single-chunk", "level": "prefill", "status": "divergent", "max_ulp": 1,
         "max_mismatch_fraction": 1.0},
    )  # fmt: skip
    selected = "upstream-worst-case and layout or smoke-numeric-single-chunk and prefill"
    proc = run_pytest("--parity-suite", "smoke", "--parity-port", "equal_share", "--parity-baseline", str(baseline),
                      "-k", selected, "-rf")  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "2 failed" in proc.stdout
    assert (
        "baseline: beyond baseline: first divergent field num_context_tokens, the baseline expects request_start"
        in (proc.stdout)
    )
    assert re.search(r"baseline: beyond baseline: \d+ ULP > cap 1 \(equal_share family single-chunk", proc.stdout)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--parity-level", "prefill", "--parity-shard", "40/40"), "shard 40/40 selects no items"),
        (("--parity-shard", "2/1"), "--parity-shard: shard '2/1': K must be in 1..N"),
    ],
)
def test_selecting_no_items_is_a_usage_error(argv: tuple[str, ...], says: str) -> None:
    proc = run_pytest("--parity-suite", "smoke", *argv)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--parity-port", "nosuch", "-n", "2"),
         "ERROR: --parity-port: unknown port 'nosuch': use one of equal_share, per_request"),
        (("--parity-suite", "nosuite"), "ERROR: --parity-suite: "),
        (
            ("--parity-level", "bogus"),
            "ERROR: --parity-level: 'bogus' is not one of layout, merge, prefill, sparse-layout, sparse-mask, "
            "sparse-prefill, all",
        ),
        (("--parity-size", "-1"), "ERROR: --parity-size: must be >= 0, got '-1'"),
        (("--parity-timeout", "0"), "ERROR: --parity-timeout: must be a finite number of seconds > 0, got '0'"),
        (("--parity-device", "tpu"), "ERROR: --parity-device: 'tpu' is not one of cpu, cuda"),
        (("--parity-baseline", str(EQUAL_SHARE_BASELINE)),  # a baseline for another port
         f"ERROR: --parity-baseline: {EQUAL_SHARE_BASELINE}: field 'port': the baseline is for port equal_share,"),
    ],
)  # fmt: skip
def test_a_bad_option_stops_the_session_before_collection_in_one_line(
    tmp_path: Path, argv: tuple[str, ...], says: str
) -> None:
    spy = tmp_path / "collected"
    options = ("--parity-suite", "smoke", *argv) if "--parity-suite" not in argv else argv
    proc = run_pytest(*SPY_PLUGIN, *options, env={**os.environ, SPY: str(spy)})
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(says), proc.stderr[-2000:]
    assert proc.stdout == ""  # no session header, no item, no summary
    assert not spy.exists(), spy.read_text()  # nothing was collected, in the controller or a worker


def test_the_collection_spy_sees_collection(tmp_path: Path) -> None:
    """The control for the test above: with good options the spy records collection."""
    spy = tmp_path / "collected"
    proc = run_pytest(*SPY_PLUGIN, "--parity-suite", "smoke", "--parity-level", "layout",
                      "--collect-only", env={**os.environ, SPY: str(spy)})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert spy.read_text().strip()


def test_a_baseline_naming_an_unknown_family_is_a_usage_error(tmp_path: Path) -> None:
    baseline = write_baseline(tmp_path, {"family": "skw", "level": "layout", "status": "divergent"}, port="per_request")
    proc = run_pytest("--parity-suite", "smoke", "--parity-baseline", str(baseline), "-n", "2")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr
    assert f"{baseline}: field 'entries[0].family': suite smoke has no layout item of family 'skw'" in proc.stderr


class LayoutOnlyPort:
    """per_request's planner, declaring only the layout level (like a ``cmd:`` port)."""

    name = "layout-only"
    levels = ("layout",)

    def __init__(self) -> None:
        from harness.sides.loading import load_port

        self.inner = load_port("per_request")

    def plan_layout(self, case: Any) -> Any:
        return self.inner.plan_layout(case)

    def workspace_size(self, config: Any) -> int:
        return self.inner.workspace_size(config)


def test_an_item_at_a_level_the_port_lacks_fails_as_not_run() -> None:
    common = ("--parity-suite", "smoke", "--parity-port", "tests.test_plugin:LayoutOnlyPort", "-rf")
    proc = run_pytest(*common, "-k", "smoke-numeric-single-chunk")
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "1 failed, 1 passed" in proc.stdout
    assert "not-run: smoke-numeric-single-chunk[prefill]: port layout-only does not implement level prefill" in (
        proc.stdout
    )
    narrowed = run_pytest(*common, "-k", "smoke-numeric-single-chunk", "--parity-level", "layout")
    assert narrowed.returncode == 0 and "1 passed" in narrowed.stdout, narrowed.stdout[-2000:]


def trivial_repo(tmp_path: Path) -> Path:
    """A repository whose only test passes: what a run that compares nothing would report."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_trivial.py").write_text("def test_trivial() -> None:\n    pass\n")
    return repo


def run_in_trivial_repo(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """pytest in :func:`trivial_repo` with the collection spy loaded; the spy's file."""
    spy = tmp_path / "collected"
    env = {**os.environ, SPY: str(spy), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return run_pytest(*SPY_PLUGIN, *argv, env=env, cwd=trivial_repo(tmp_path)), spy


def test_without_parity_options_the_plugin_stays_off(tmp_path: Path) -> None:
    """The control for the test below: the trivial repository's own test runs and passes."""
    proc, spy = run_in_trivial_repo(tmp_path)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert spy.read_text().strip()


NEEDS_SUITE = "needs --parity-suite: without a suite the plugin compares nothing"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--parity-suite", "", "--parity-port", "nosuch", "--parity-timeout", "0"),
         "ERROR: --parity-suite: empty value (an unset variable?): name a suite"),
        (("--parity-suite=",), "ERROR: --parity-suite: empty value"),
        (("--parity-suite", "  "), "ERROR: --parity-suite: empty value"),
        (("--parity-port", "nosuch", "--parity-timeout", "0"), f"ERROR: --parity-port {NEEDS_SUITE}"),
        (("--parity-port", "per_request"), f"ERROR: --parity-port {NEEDS_SUITE}"),  # the default, spelled out
        (("--parity-level", "all"), f"ERROR: --parity-level {NEEDS_SUITE}"),
        (("--parity-size", "0"), f"ERROR: --parity-size {NEEDS_SUITE}"),
        (("--parity-timeout", "0"), f"ERROR: --parity-timeout {NEEDS_SUITE}"),
        (("--parity-shard", "1/2"), f"ERROR: --parity-shard {NEEDS_SUITE}"),
        (("--parity-baseline", str(EQUAL_SHARE_BASELINE)), f"ERROR: --parity-baseline {NEEDS_SUITE}"),
        (("--parity-allow-oracle-drift",), f"ERROR: --parity-allow-oracle-drift {NEEDS_SUITE}"),
        (("--parity-device=cpu",), f"ERROR: --parity-device {NEEDS_SUITE}"),
    ],
)  # fmt: skip
def test_parity_options_without_a_suite_are_a_usage_error(tmp_path: Path, argv: tuple[str, ...], says: str) -> None:
    """Never the repository's own tests passing in place of a comparison."""
    proc, spy = run_in_trivial_repo(tmp_path, *argv)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(says), proc.stderr[-2000:]
    assert proc.stdout == ""
    assert not spy.exists(), spy.read_text()


def test_the_help_states_the_accepted_size_and_every_option_needs_a_suite() -> None:
    from harness.commands.options import non_negative_int
    from harness.pytest_plugin import OPTIONS_NEEDING_A_SUITE, SUITE_OPTION

    assert non_negative_int("0") == 0  # the value --parity-size accepts, as the CLI's --size does
    proc = run_pytest("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    help_text = " ".join(proc.stdout.split())
    size_help = help_text.partition("--parity-size=N ")[2]
    assert size_help.startswith("the suite's scale, >= 0"), size_help[:200]
    # An option added later is refused without a suite too, or this fails.
    assert set(re.findall(r"--parity-[a-z-]+", help_text)) == {SUITE_OPTION, *OPTIONS_NEEDING_A_SUITE}


@pytest.mark.parametrize(("counted", "code"), [(3, 0), (2, 1)])
def test_an_error_entry_expects_no_more_items_than_it_counts(tmp_path: Path, counted: int, code: int) -> None:
    """The smoke suite's three many-requests batches equal_share refuses: an entry
    counting three xfails them; one counting two fails the session, saying so."""
    entry = {"family": "many-requests", "level": "layout", "status": "port-error", "items": counted,
             "error": "is below one block"}  # fmt: skip
    proc = run_pytest("--parity-suite", "smoke", "--parity-port", "equal_share", "--parity-level", "layout",
                      "--parity-baseline", str(write_baseline(tmp_path, entry)), "-k", "smoke-many")  # fmt: skip
    assert proc.returncode == code, proc.stdout[-2000:]
    assert "3 xfailed" in proc.stdout, proc.stdout[-2000:]
    beyond = "parity: beyond baseline: 3 items where entries[0] counts 2 (equal_share family many-requests"
    assert (beyond in proc.stdout) == (code == 1), proc.stdout[-2000:]


def test_the_session_says_what_l3_compared() -> None:
    proc = run_pytest("--parity-suite", "smoke", "--parity-level", "prefill", "-k", "single-chunk")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "parity: prefill compared the port's whole context loop" in proc.stdout


def test_an_external_port_that_plans_again_for_its_prefill_fails_the_session() -> None:
    fake = ROOT / "tests" / "fake_external_port.py"
    port = f"cmd:{sys.executable} {fake} --prefill --fault replan-for-prefill --on smoke-numeric-single-chunk"
    proc = run_pytest("--parity-suite", "smoke", "--parity-port", port, "-k", "smoke-numeric-single-chunk",
                      "-p", "no:xdist")  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "smoke/smoke-numeric-single-chunk[prefill]: its prefill request ran on another layout" in proc.stdout


def test_the_plugin_answers_from_the_oracle_cache_unless_told_not_to(tmp_path: Path) -> None:
    """As the CLI: the oracle cache on by default, ``--parity-no-oracle-cache``
    neither reads nor writes it; the items' outcomes are the same."""
    outcomes = []
    # The session's record of the pin check, where one is kept already: the check
    # (which imports vLLM) is not what this test is about.
    session_records = Path(os.environ["PARITY_ORACLE_CACHE"]) / RECORDS
    if session_records.is_dir():
        shutil.copytree(session_records, tmp_path / "on" / RECORDS)
    for flags, cache in (([], tmp_path / "on"), (["--parity-no-oracle-cache"], tmp_path / "off")):
        env = {**os.environ, "PARITY_ORACLE_CACHE": str(cache)}
        junit = tmp_path / f"{cache.name}.xml"
        proc = run_pytest("--parity-suite", "smoke", "--parity-level", "layout", "-k", "giant",
                          "--junitxml", str(junit), *flags, env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:]
        outcomes.append(sorted(c.get("name") or "" for c in ET.parse(junit).getroot().iter("testcase")))
        files = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
        # The first run's answers, not the records it started with; the second run writes nothing at all.
        entries = [p for p in files if RECORDS not in p.parts] if not flags else files
        assert bool(entries) == (not flags), entries
    assert outcomes[0] == outcomes[1] and len(outcomes[0]) >= 3
