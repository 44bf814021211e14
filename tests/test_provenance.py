"""Provenance names the port's own repository, never the harness's in its place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.port import load_port
from harness.provenance import NOT_IN_GIT, REPO_ROOT, collect, port_repository, repository_state

PORT_MODULE = """
from ports.per_request import PerRequestPort


class ElsewherePort(PerRequestPort):
    name = "elsewhere"


PORT = ElsewherePort()
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}  # fmt: skip
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def committed_repo(root: Path, files: dict[str, str]) -> str:
    """A fresh git repository at ``root`` holding ``files``, committed; its commit."""
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "port")
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def fresh_import(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test's module of the same name lives in its own folder: forget the last one.
    monkeypatch.delitem(sys.modules, "elsewhere_port", raising=False)


def test_a_port_module_in_another_repository_records_that_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_import: None
) -> None:
    repo = tmp_path / "port-repo"
    commit = committed_repo(repo, {"elsewhere_port.py": PORT_MODULE})
    monkeypatch.syspath_prepend(str(repo))
    port = load_port("elsewhere_port:PORT")
    record = port_repository("elsewhere_port:PORT", port)
    assert record["commit"] == commit != repository_state()["commit"]
    assert Path(record["path"]).resolve() == repo.resolve()
    assert record["source"] == str((repo / "elsewhere_port.py").resolve())
    assert record["dirty"] is False
    (repo / "elsewhere_port.py").write_text(PORT_MODULE + "\n# edited\n")
    assert port_repository("elsewhere_port:PORT", port)["dirty"] is True


def test_a_port_outside_any_repository_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_import: None
) -> None:
    folder = tmp_path / "loose"
    folder.mkdir()
    (folder / "elsewhere_port.py").write_text(PORT_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    record = port_repository("elsewhere_port:PORT", load_port("elsewhere_port:PORT"))
    assert record["commit"] is None and record["reason"] == NOT_IN_GIT
    assert record["path"] == str((folder / "elsewhere_port.py").resolve())


@pytest.mark.parametrize("spec", ["per_request", "ports.equal_share:PORT", "mutant:legacy-grid"])
def test_the_harness_own_ports_record_the_harness_repository(spec: str) -> None:
    record = port_repository(spec, load_port(spec))
    harness = repository_state(REPO_ROOT)
    assert record["commit"] == harness["commit"] and record["path"] == harness["path"]
    assert Path(record["source"]).is_relative_to(REPO_ROOT / "ports")


def test_a_cmd_port_records_the_repository_of_its_program(tmp_path: Path) -> None:
    repo = tmp_path / "cmd-repo"
    commit = committed_repo(repo, {"serve.py": "print('hello')\n", "serve": "#!/bin/sh\n"})
    (repo / "serve").chmod(0o755)
    by_interpreter = port_repository(f"cmd:{sys.executable} -u {repo / 'serve.py'} --mode x")
    assert by_interpreter["commit"] == commit and by_interpreter["source"] == str((repo / "serve.py").resolve())
    by_path = port_repository(f"cmd:{repo / 'serve'} --mode x")
    assert by_path["commit"] == commit and by_path["source"] == str((repo / "serve").resolve())


def test_a_cmd_port_whose_program_cannot_be_found_says_why() -> None:
    record = port_repository("cmd:/no/such/program --flag")
    assert record["commit"] is None and record["path"] is None
    assert record["reason"] == "cannot locate the port's code: executable '/no/such/program' not found"


def test_collect_adds_the_port_repository_only_for_a_named_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_import: None
) -> None:
    repo = tmp_path / "port-repo"
    commit = committed_repo(repo, {"elsewhere_port.py": PORT_MODULE})
    monkeypatch.syspath_prepend(str(repo))
    oracle = {"release": "pinned"}
    with_port = collect(oracle, "elsewhere_port:PORT", load_port("elsewhere_port:PORT"))
    assert with_port["port_repository"]["commit"] == commit
    assert with_port["harness_repository"]["commit"] == repository_state()["commit"] != commit
    assert "port_repository" not in collect(oracle)
