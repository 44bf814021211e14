"""Every reproduce line runs when pasted into a fresh shell at the harness root.

A port author copies a line out of the gate's terminal output, summary.md,
junit.xml, ``parity run``, a pytest-plugin failure or the nightly page and
pastes it into a new terminal: no environment activated, no PYTHONPATH set, a
bare PATH. Each line here is run exactly so (``env -i`` with only
PATH=/usr/bin:/bin and HOME, ``sh -c LINE`` at the harness root) and must
reproduce the item's divergence (exit 1), for three spellings of a port: an
in-tree port (``mutant:NAME``), a port imported by path from a folder outside
the repository (which the run found on PYTHONPATH), and a ``cmd:`` port.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The session's oracle cache (tests/conftest.py) rather than the user's: a fresh
# shell's reproduce line reads the same kept answers, and the test writes nothing
# under the home folder.
FRESH_SHELL = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())} | {
    name: value for name, value in os.environ.items() if name == "PARITY_ORACLE_CACHE"
}
# The one smoke case each of the import-path and cmd: ports gets wrong, and the
# one case of the test's small night (a DCP world-3 prefill case) they get wrong.
TARGET = "smoke-dcp3-padded"
NIGHT_TARGET = "numeric-dcp-0003"
THEIR_PORT = f'''
"""A user's port in its own folder: per_request, except on {TARGET} and
{NIGHT_TARGET} (planned as the dcp-padded-by-shift mutant plans them)."""
from ports.mutants import MUTANTS
from ports.per_request import PerRequestPort


class TheirPort(PerRequestPort):
    name = "their-port"

    def plan_layout(self, case):
        if case.name in ("{TARGET}", "{NIGHT_TARGET}"):
            return MUTANTS["dcp-padded-by-shift"]().plan_layout(case)
        return super().plan_layout(case)
'''
COMMAND = re.compile(r"reproduce: `?(?P<line>[^`\n]+)`?")
PAGE_COMMAND = re.compile(r'<td class="reproduce"[^>]*>(?P<line>[^<]+)</td>')


def _interpreter() -> str:
    interpreter = Path(sys.executable)
    return str(interpreter.relative_to(ROOT)) if interpreter.is_relative_to(ROOT) else str(interpreter)


def _as_a_user(argv: list[str], pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    """A command as a user runs it at the harness root: the environment's interpreter by path."""
    env = dict(FRESH_SHELL)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [_interpreter(), *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def printed_lines(text: str) -> list[str]:
    return [m["line"].strip() for m in COMMAND.finditer(text)]


@pytest.fixture(scope="module")
def their_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("their-repo")
    (folder / "their_port.py").write_text(THEIR_PORT)
    return folder


SPELLINGS = ("in-tree", "import-path", "cmd")


def port_of(spelling: str, their_folder: Path) -> tuple[str, str | None]:
    """The spelling's --port value and the PYTHONPATH its run is started with."""
    fake = f"{shlex.quote(sys.executable)} tests/fake_external_port.py --fault error --on {TARGET} --on {NIGHT_TARGET}"
    return {
        "in-tree": ("mutant:dcp-padded-by-shift", None),
        "import-path": ("their_port:TheirPort", str(their_folder)),
        "cmd": (f"cmd:{fake}", None),
    }[spelling]


def printed_by_every_output(
    spelling: str, port: str, pythonpath: str | None, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[str]]:
    """Per output (gate terminal, summary.md, junit.xml, run, plugin, nightly
    page): the reproduce lines it printed for ``port``."""
    found: dict[str, list[str]] = {}
    out = tmp_path_factory.mktemp(f"gate-{spelling}")
    selection = ["--suite", "smoke", "--level", "layout"]
    gate = _as_a_user(
        ["-m", "harness", "gate", *selection, "--port", port, "--out", str(out), "--shrink-time", "0"], pythonpath
    )
    assert gate.returncode == 1, gate.stderr[-2000:]
    found["gate terminal"] = printed_lines(gate.stdout)
    found["summary.md"] = printed_lines((out / "summary.md").read_text())
    junit = ET.parse(out / "junit.xml").getroot()
    found["junit.xml"] = [line for element in junit.iter() if element.text for line in printed_lines(element.text)]
    run = _as_a_user(["-m", "harness", "run", *selection, "--port", port], pythonpath)
    assert run.returncode == 1, run.stderr[-2000:]
    found["run"] = printed_lines(run.stdout)
    plugin = _as_a_user(
        ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--parity-suite", "smoke", "--parity-level", "layout",
         "--parity-port", port],
        pythonpath,
    )  # fmt: skip
    assert plugin.returncode == 1, plugin.stdout[-2000:]
    found["pytest plugin"] = printed_lines(plugin.stdout)
    night = tmp_path_factory.mktemp(f"night-{spelling}")
    # No sweep; the numeric groups (their layouts: the DCP group's world-3 cases diverge) at the suite's counts.
    small_night = ["--size", "0", "--numeric-size", "200", "--level", "layout", "--skip-mutants",
                   "--explore-budget-s", "0"]  # fmt: skip
    nightly = _as_a_user(["-m", "harness", "nightly", "--ports", port, *small_night, "--out", str(night)], pythonpath)
    assert nightly.returncode == 1, nightly.stderr[-2000:]
    (page,) = night.glob("*/index.html")
    found["nightly page"] = [html.unescape(m["line"]) for m in PAGE_COMMAND.finditer(page.read_text())]
    return found


def expected_count(spelling: str, where: str) -> set[int]:
    """How many distinct lines ``where`` prints: the in-tree mutant diverges on
    three smoke cases, the other two spellings on one."""
    if spelling != "in-tree":
        return {1}
    if where == "nightly page":
        # The night's DCP prefill group holds more world-3 cases; the page shows the first ten.
        return {10}
    # summary.md (and the terminal, which prints it) shows one line per distinct message.
    return {1, 2, 3} if where in ("summary.md", "gate terminal") else {3}


# One test per spelling, each its own outputs and pastes: pytest-xdist spreads them.
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_output_prints_a_line_that_reproduces_pasted_into_a_fresh_shell(
    spelling: str, their_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    port, pythonpath = port_of(spelling, their_folder)
    printed = printed_by_every_output(spelling, port, pythonpath, tmp_path_factory)
    for where, lines in printed.items():
        assert len(set(lines)) in expected_count(spelling, where), (where, lines)
        for line in lines:
            # An import-path port from another folder carries its PYTHONPATH; no line needs the console script.
            assert ("PYTHONPATH=" in line) == (spelling == "import-path"), (where, line)
            assert not line.startswith("parity "), line
            if spelling == "import-path":
                assert f"PYTHONPATH={their_folder}" in line, line
    # The page's lines differ in their item alone, so pasting one of them stands for all.
    assert len({re.sub(r" diff \S+ ", " diff ITEM ", line) for line in printed["nightly page"]}) == 1
    pasted: dict[str, subprocess.CompletedProcess[str]] = {}
    for where, lines in printed.items():
        # The nightly page's ten lines differ in the item alone (checked above): its first and last are pasted.
        for line in lines[:1] + lines[1:][-1:] if where == "nightly page" else lines:
            if line not in pasted:
                pasted[line] = subprocess.run(
                    ["/bin/sh", "-c", line], cwd=ROOT, env=FRESH_SHELL, capture_output=True, text=True, timeout=600
                )
            done = pasted[line]
            assert done.returncode == 1, (where, line, done.stderr[-1500:])
            assert re.search(r"verdict: (DIVERGENT|PORT-ERROR)", done.stdout), (where, line, done.stdout[-1500:])
