"""examples/port-ci.yml passes zizmor, GitHub Actions' security linter.

zizmor (pinned in requirements/dev.txt, so installed next to this interpreter)
audits the workflow offline: no finding of medium or higher severity is allowed.
So that a silent zizmor (not run, not reading the file, its JSON misread) cannot
pass for a clean one, the same run on copies of the workflow weakened one way
each (a checkout keeping its token, an action on a tag, an expression pasted
into a script, permissions left to the default) must find what was weakened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "examples" / "port-ci.yml"
ZIZMOR = Path(sys.executable).parent / "zizmor"
# zizmor's severities, lowest first; a finding from BLOCKING up fails the test.
SEVERITIES = ("unknown", "informational", "low", "medium", "high")
BLOCKING = "medium"


def zizmor(path: Path) -> list[dict[str, Any]]:
    """zizmor's findings for ``path`` (offline, the default persona, no configuration
    file but the workflow's own ignore comments honoured), as its JSON gives them."""
    assert ZIZMOR.is_file(), f"{ZIZMOR} is missing: zizmor is pinned in requirements/dev.txt (tox -e oracle)"
    # Nothing from the caller's environment steers it: no token, no configuration file.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZIZMOR_", "GH_", "GITHUB_"))}
    command = [str(ZIZMOR), "--offline", "--no-config", "--no-exit-codes", "--no-progress"]
    command += ["--color", "never", "--format", "json", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    # With --no-exit-codes a non-zero exit is zizmor failing, never a finding.
    assert done.returncode == 0, f"zizmor failed (exit {done.returncode}):\n{done.stderr}"
    findings = json.loads(done.stdout)
    assert isinstance(findings, list), done.stdout
    for finding in findings:
        assert finding["determinations"]["severity"].lower() in SEVERITIES, finding["determinations"]
        for location in finding["locations"]:
            assert location["symbolic"]["key"]["Local"]["verbatim_path"] == str(path), location
    return findings


def severity(finding: dict[str, Any]) -> str:
    found: str = finding["determinations"]["severity"].lower()
    return found


def blocking(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if SEVERITIES.index(severity(f)) >= SEVERITIES.index(BLOCKING)]


def describe(finding: dict[str, Any]) -> str:
    """One finding as a line: severity, audit, where (1-based line) and what."""
    where = []
    for location in finding["locations"]:
        row = location["concrete"]["location"]["start_point"]["row"] + 1
        where.append(f"line {row}: {location['symbolic']['annotation']}")
    return f"{severity(finding)} {finding['ident']} ({finding['desc']}; {finding['url']}) at {'; '.join(where)}"


def test_the_workflow_has_no_finding_of_medium_or_higher() -> None:
    findings = zizmor(WORKFLOW)
    found = blocking(findings)
    assert not found, f"zizmor --offline {WORKFLOW.relative_to(ROOT)}:\n" + "\n".join(map(describe, found))


# -- zizmor really runs and reads the file: weakened copies are caught ---------------

SHA_COMMENT = "marocchino/sticky-pull-request-comment@773744901bac0e8cbb5a0dc842800d45e9b2b405 # v2.9.4"
GATE_SCRIPT = "          SHARD: ${{ matrix.shard }}\n        run: |\n"
NO_PERMISSIONS = "permissions: {}\n"
GATE_PERMISSIONS = "    permissions:\n      contents: read   # actions/checkout\n    strategy:\n"


def keeps_credentials(text: str) -> str:
    """The first checkout leaves its token on disk."""
    return replace_once(text, "          persist-credentials: false\n", "", first=True)


def action_on_a_tag(text: str) -> str:
    """A third-party action on a movable tag instead of a commit."""
    return replace_once(text, SHA_COMMENT, "marocchino/sticky-pull-request-comment@v2")


def expression_in_a_script(text: str) -> str:
    """The pull request's title pasted into the gate's script (an injection)."""
    injected = '          echo "${{ github.event.pull_request.title }}"\n'
    return replace_once(text, GATE_SCRIPT, GATE_SCRIPT + injected)


def default_permissions(text: str) -> str:
    """No `permissions` for the workflow nor the gate job: the repository's default token."""
    return replace_once(replace_once(text, NO_PERMISSIONS, ""), GATE_PERMISSIONS, "    strategy:\n")


def replace_once(text: str, old: str, new: str, *, first: bool = False) -> str:
    """``old`` (which occurs once, or its first occurrence) replaced by ``new``."""
    # The weakening must apply to the workflow as it is, or it tests nothing.
    count = text.count(old)
    assert count == 1 or (first and count > 1), f"{old!r} occurs {count} times in {WORKFLOW.name}"
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("weaken", "audit"),
    [
        (keeps_credentials, "artipacked"),
        (action_on_a_tag, "unpinned-uses"),
        (expression_in_a_script, "template-injection"),
        (default_permissions, "excessive-permissions"),
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_a_weakened_workflow_is_caught(weaken: Callable[[str], str], audit: str, tmp_path: Path) -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    weakened = tmp_path / WORKFLOW.name
    weakened.write_text(weaken(text), encoding="utf-8")
    found = blocking(zizmor(weakened))
    assert audit in {f["ident"] for f in found}, f"zizmor missed {audit}: found " + (
        "\n".join(map(describe, found)) or "nothing"
    )
    # Each weakening is the only thing wrong: nothing else is reported.
    assert {f["ident"] for f in found} == {audit}, "\n".join(map(describe, found))


def test_no_finding_is_silenced_inline() -> None:
    """zizmor honours ``# zizmor: ignore[...]`` comments even without a config:
    a finding silenced in the workflow would pass the audit unseen."""
    assert "zizmor:" not in WORKFLOW.read_text(encoding="utf-8")
