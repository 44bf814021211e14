"""Reproduce lines run at home: a gate on a CI runner names the port's checkout
by ``$PORT_DIR`` (the PR comment says to set it), so its lines, pasted into a
fresh shell beside another checkout of the same port, compare the same item;
a built-in port's lines never carry the caller's paths."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.cli import main
from harness.verdicts.launch import PORT_DIR_NOTE, harness_root, program_words

ROOT = Path(__file__).resolve().parent.parent
# A port package of its own: the harness's unaligned-split mutant under another name.
PORT_SOURCE = 'from ports.mutants import MUTANTS\n\nPORT = MUTANTS["unaligned-split"]()\n'


def test_a_ci_gates_lines_run_beside_another_checkout_of_the_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runner_checkout, home_checkout = tmp_path / "runner" / "port", tmp_path / "home" / "port"
    (runner_checkout / "my_port").mkdir(parents=True)
    (runner_checkout / "my_port" / "__init__.py").write_text(PORT_SOURCE)
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PYTHONPATH", str(runner_checkout))
    monkeypatch.syspath_prepend(str(runner_checkout))
    monkeypatch.chdir(ROOT)
    out = tmp_path / "gate"
    argv = ["gate", "--suite", "smoke", "--level", "layout", "--port", "my_port:PORT", "--out", str(out)]
    assert main([*argv, "--shrink-time", "0"]) == 1
    capsys.readouterr()
    summary = (out / "summary.md").read_text()
    assert PORT_DIR_NOTE in summary
    lines = re.findall(r"reproduce: `([^`]+)`", summary)
    assert lines and all('"PYTHONPATH=$PORT_DIR"' in line and str(runner_checkout) not in line for line in lines)
    # The runner's checkout is gone; the line runs beside the reader's own, in a fresh shell.
    shutil.copytree(runner_checkout, home_checkout)
    shutil.rmtree(runner_checkout)
    item = re.search(r"diff (\S+)", lines[0])
    assert item is not None
    fresh = {"PATH": "/usr/bin:/bin", "PORT_DIR": str(home_checkout)}
    ran = subprocess.run(["bash", "-c", lines[0]], cwd=ROOT, env=fresh, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "verdict: DIVERGENT" in ran.stdout and item[1] in ran.stdout


@pytest.mark.parametrize("port", ["per_request", "equal_share", "mutant:unaligned-split"])
def test_a_built_in_ports_lines_carry_none_of_the_callers_paths(port: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere/of/the/callers")
    monkeypatch.delenv("PARITY_PLUGINS", raising=False)
    monkeypatch.chdir(harness_root())
    words = program_words(port)
    assert not any(word.startswith("PYTHONPATH=") for word in words), words
    assert os.environ["PYTHONPATH"] not in " ".join(words)


def test_a_port_dir_word_expands_only_the_variable() -> None:
    from harness.verdicts.launch import shell_join

    line = shell_join(["env", 'PYTHONPATH=$PORT_DIR:/odd$path"x', "a b"])
    echoed = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {line.removeprefix('env ')}"],
        env={"PATH": "/usr/bin:/bin", "PORT_DIR": "/home/me/port"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert echoed.stdout.splitlines() == ['PYTHONPATH=/home/me/port:/odd$path"x', "a b"]


def test_a_cmd_ports_lines_keep_the_paths_its_program_may_import_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/where/the/program/imports/from")
    monkeypatch.chdir(harness_root())
    words = program_words("cmd:python3 -m my_port.serve")
    assert "PYTHONPATH=/where/the/program/imports/from" in words
