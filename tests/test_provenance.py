"""Provenance names the port's own repository, never the harness's in its place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.sides.loading import load_port
from harness.verdicts.provenance import NOT_IN_GIT, REPO_ROOT, collect, port_repository, repository_state

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
        (root / name).parent.mkdir(parents=True, exist_ok=True)
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


# A cmd: port's code as the interpreter would find it: its own files, never the
# interpreter's (whose repository, if any, is someone else's).
CMD_PORT_FILES = {
    "far_port_script.py": "print('port')\n",
    "far_port_script.sh": "echo port\n",
    "far_port_pkg/__init__.py": "raise RuntimeError('imported: provenance must only locate the module')\n",
    "far_port_pkg/port.py": "print('port')\n",
    "far_port_pkg/__main__.py": "print('port')\n",
}


@pytest.fixture
def cmd_port_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A committed repository of ``CMD_PORT_FILES``, the working directory (as it
    is the port process's); the repository and its commit."""
    repo = tmp_path / "cmd-port-repo"
    commit = committed_repo(repo, CMD_PORT_FILES)
    monkeypatch.chdir(repo)
    return repo, commit


@pytest.mark.parametrize(
    ("command", "source"),
    [
        ("python -m far_port_pkg.port", "far_port_pkg/port.py"),
        ("python -mfar_port_pkg.port --x", "far_port_pkg/port.py"),
        ("python3 -uB -m far_port_pkg.port", "far_port_pkg/port.py"),
        ("python -m far_port_pkg", "far_port_pkg/__main__.py"),  # a package runs its __main__
        ("python -X dev far_port_script.py", "far_port_script.py"),
        ("python -Xdev -Wignore far_port_script.py", "far_port_script.py"),
        ("python -W ignore far_port_script.py --mode x", "far_port_script.py"),
        ("python3.12 -O -u -B -E -s -S -b -q -v far_port_script.py", "far_port_script.py"),
        ("python -- far_port_script.py", "far_port_script.py"),
        (f"{sys.executable} -X dev far_port_script.py", "far_port_script.py"),
        ("env X=1 python far_port_script.py", "far_port_script.py"),
        ("/usr/bin/env -u HOME X=1 Y=2 python -m far_port_pkg.port", "far_port_pkg/port.py"),
        ("env -i X=1 env Y=2 python3 -X dev far_port_script.py", "far_port_script.py"),
        ("env -v --debug -iu HOME --unset=PATH X=1 python far_port_script.py", "far_port_script.py"),
        ("env -S 'python -X dev' far_port_script.py", "far_port_script.py"),
        ("bash -o pipefail far_port_script.sh", "far_port_script.sh"),
        ("env X=1 sh far_port_script.sh", "far_port_script.sh"),
    ],
)
def test_a_cmd_port_records_the_repository_of_its_own_code(
    cmd_port_repo: tuple[Path, str], command: str, source: str
) -> None:
    repo, commit = cmd_port_repo
    record = port_repository(f"cmd:{command}")
    assert record["commit"] == commit, record
    assert record["source"] == str((repo / source).resolve())
    assert "far_port_pkg" not in sys.modules  # located, never imported (its __init__ raises)


def test_env_chdir_moves_where_the_script_is_found(cmd_port_repo: tuple[Path, str], tmp_path: Path) -> None:
    repo, commit = cmd_port_repo
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # the fixture's monkeypatch.chdir restores the original folder
    record = port_repository(f"cmd:env -C {repo} python -m far_port_pkg.port")
    assert record["commit"] == commit and record["source"] == str((repo / "far_port_pkg/port.py").resolve())


def test_python_path_is_searched_for_a_module(
    cmd_port_repo: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, commit = cmd_port_repo
    monkeypatch.chdir(tmp_path)
    record = port_repository(f"cmd:env PYTHONPATH={repo} python -m far_port_pkg.port")
    assert record["commit"] == commit, record
    isolated = port_repository(f"cmd:env PYTHONPATH={repo} python -I -m far_port_pkg.port")
    assert isolated["commit"] is None and "far_port_pkg.port" in isolated["reason"], isolated


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("python -c 'print(1)'", "python -c: inline code, no file"),
        ("python -X dev -c pass", "python -c: inline code, no file"),
        ("python -uc pass", "python -c: inline code, no file"),
        ("env X=1 python3 -c pass", "python3 -c: inline code, no file"),
        ("bash -c 'echo hi'", "bash -c: inline code, no file"),
        ("bash -ec 'echo hi'", "bash -c: inline code, no file"),
        ("bash -x +o posix -ec 'echo hi'", "bash -c: inline code, no file"),
        ("node --eval=1", "node --eval: inline code, no file"),
        ("node -e 1", "node -e: inline code, no file"),
        ("python -u", "python: no script or module: it reads its code from stdin"),
        ("python -", "python: no script or module: it reads its code from stdin"),
        ("python -m no_such_far_module", "python -m no_such_far_module: module not found"),
        ("python no_such_script.py", "python: script 'no_such_script.py' is not a file"),
        ("sh no_such_script.sh", "sh: script 'no_such_script.sh' is not a file"),
        ("env X=1", "env runs no command"),
        ("python -m 'far_port_pkg.port.x'", "python -m far_port_pkg.port.x: far_port_pkg.port is not a package"),
        ("python -m far_port_script.x", "python -m far_port_script.x: far_port_script is not a package"),
    ],
)
def test_a_cmd_port_whose_code_is_no_file_says_why(cmd_port_repo: tuple[Path, str], command: str, reason: str) -> None:
    record = port_repository(f"cmd:{command}")
    assert record["commit"] is None and record["path"] is None, record
    assert record["reason"].startswith(f"cannot locate the port's code: {reason}"), record["reason"]
