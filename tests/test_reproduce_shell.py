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
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRESH_SHELL = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
# The one smoke case each of the import-path and cmd: ports gets wrong.
TARGET = "smoke-dcp3-padded"
THEIR_PORT = f'''
"""A user's port in its own folder: per_request, except on {TARGET} (planned as
the dcp-padded-by-shift mutant plans it)."""
from ports.mutants import MUTANTS
from ports.per_request import PerRequestPort


class TheirPort(PerRequestPort):
    name = "their-port"

    def plan_layout(self, case):
        if case.name == "{TARGET}":
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


@pytest.fixture(scope="module")
def ports(their_folder: Path) -> dict[str, tuple[str, str | None]]:
    """Each spelling: its --port value and the PYTHONPATH its run was started with."""
    fake = f"{shlex.quote(sys.executable)} tests/fake_external_port.py --fault error --on {TARGET}"
    return {
        "in-tree": ("mutant:dcp-padded-by-shift", None),
        "import-path": ("their_port:TheirPort", str(their_folder)),
        "cmd": (f"cmd:{fake}", None),
    }


@pytest.fixture(scope="module")
def printed(ports: dict[str, tuple[str, str | None]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Per (spelling, output): the reproduce lines that output printed."""
    found: dict[str, list[str]] = {}
    for spelling, (port, pythonpath) in ports.items():
        out = tmp_path_factory.mktemp(f"gate-{spelling}")
        selection = ["--suite", "smoke", "--level", "layout"]
        gate = _as_a_user(
            ["-m", "harness", "gate", *selection, "--port", port, "--out", str(out), "--shrink-time", "0"], pythonpath
        )
        assert gate.returncode == 1, gate.stderr[-2000:]
        found[f"{spelling} gate terminal"] = printed_lines(gate.stdout)
        found[f"{spelling} summary.md"] = printed_lines((out / "summary.md").read_text())
        junit = ET.parse(out / "junit.xml").getroot()
        found[f"{spelling} junit.xml"] = [
            line for element in junit.iter() if element.text for line in printed_lines(element.text)
        ]
        run = _as_a_user(["-m", "harness", "run", *selection, "--port", port], pythonpath)
        assert run.returncode == 1, run.stderr[-2000:]
        found[f"{spelling} run"] = printed_lines(run.stdout)
        plugin = _as_a_user(
            ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--parity-suite", "smoke", "--parity-level", "layout",
             "--parity-port", port],
            pythonpath,
        )  # fmt: skip
        assert plugin.returncode == 1, plugin.stdout[-2000:]
        found[f"{spelling} pytest plugin"] = printed_lines(plugin.stdout)
        night = tmp_path_factory.mktemp(f"night-{spelling}")
        small_night = ["--size", "0", "--level", "layout", "--skip-mutants", "--explore-budget-s", "0"]
        nightly = _as_a_user(
            ["-m", "harness", "nightly", "--ports", port, *small_night, "--out", str(night)], pythonpath
        )
        assert nightly.returncode == 1, nightly.stderr[-2000:]
        (page,) = night.glob("*/index.html")
        found[f"{spelling} nightly page"] = [html.unescape(m["line"]) for m in PAGE_COMMAND.finditer(page.read_text())]
    return found


def test_every_output_prints_a_reproduce_line_per_failing_item(printed: dict[str, list[str]]) -> None:
    for where, lines in printed.items():
        # summary.md (and the terminal, which prints it) shows one line per distinct message.
        grouped = where.endswith(("summary.md", "gate terminal"))
        expected = {1, 2, 3} if where.startswith("in-tree") and grouped else {3 if where.startswith("in-tree") else 1}
        if where == "in-tree nightly page":
            # The nightly suite holds more DCP world-3 cases; the page shows the first ten.
            expected = {10}
        assert len(set(lines)) in expected, (where, lines)


def test_an_import_path_port_from_another_folder_carries_its_pythonpath(
    printed: dict[str, list[str]], their_folder: Path
) -> None:
    for where, lines in printed.items():
        for line in lines:
            assert ("PYTHONPATH=" in line) == where.startswith("import-path"), (where, line)
            assert not line.startswith("parity "), line
            if where.startswith("import-path"):
                assert f"PYTHONPATH={their_folder}" in line, line


def test_every_line_reproduces_its_divergence_pasted_into_a_fresh_shell(printed: dict[str, list[str]]) -> None:
    pasted: dict[str, subprocess.CompletedProcess[str]] = {}
    for where, lines in printed.items():
        for line in lines:
            if line not in pasted:
                pasted[line] = subprocess.run(
                    ["/bin/sh", "-c", line], cwd=ROOT, env=FRESH_SHELL, capture_output=True, text=True, timeout=600
                )
            done = pasted[line]
            assert done.returncode == 1, (where, line, done.stderr[-1500:])
            assert re.search(r"verdict: (DIVERGENT|PORT-ERROR)", done.stdout), (where, line, done.stdout[-1500:])
