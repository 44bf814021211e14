"""Where a result came from: the oracle pin, library versions, the device, the
harness's repository and the port's own repository (gitpython).

A repository record is ``{"path", "commit", "branch", "dirty"}`` for a file in a
git working tree, or ``{"path", "commit": None, "reason"}`` when there is no
commit to name. The port's record is the repository holding the port's own code
(its module's file, or a ``cmd:`` port's program), never the harness's by default.
"""

from __future__ import annotations

import hashlib
import importlib.util
import platform
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
NOT_IN_GIT = "not in a git repository"
# Programs that run a script named by their first non-option argument: for
# ``cmd:python my_port.py`` the port's code is my_port.py, not the interpreter.
_INTERPRETER = re.compile(r"(python|pypy|bash|sh|zsh|node|ruby|perl|julia|Rscript)[\d.]*(\.exe)?")


def repository_state(path: Path = REPO_ROOT) -> dict[str, Any]:
    """The git repository whose working tree holds ``path`` (a file or folder)."""
    start = path if path.is_dir() else path.parent
    try:
        import git
    except Exception as exc:  # gitpython missing, or no git executable
        return {"path": str(path), "commit": None, "reason": f"gitpython unavailable ({type(exc).__name__}: {exc})"}
    try:
        repo = git.Repo(start, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return {"path": str(path), "commit": None, "reason": NOT_IN_GIT}
    try:
        return {
            "path": str(Path(repo.working_dir)),
            "commit": repo.head.commit.hexsha if repo.head.is_valid() else None,
            "branch": None if repo.head.is_detached else repo.active_branch.name,
            "dirty": repo.is_dirty(untracked_files=True),
        }
    except Exception as exc:
        return {"path": str(Path(repo.working_dir)), "commit": None, "reason": f"{type(exc).__name__}: {exc}"}


class PortSourceUnknown(LookupError):
    """The port's code cannot be located; the message says why (one line)."""


def command_program(command: str) -> Path:
    """The file holding a ``cmd:`` port's code: the script an interpreter runs
    (``python my_port.py``), else the executable, found as the OS would (a path,
    or a name on ``PATH``)."""
    argv = shlex.split(command)
    if not argv:
        raise PortSourceUnknown("the command is empty")
    if _INTERPRETER.fullmatch(Path(argv[0]).name):
        script = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
        if script is not None and "-m" not in argv[1 : argv.index(script)] and Path(script).is_file():
            return Path(script).resolve()
    found = shutil.which(argv[0])
    if found is None:
        raise PortSourceUnknown(f"executable {argv[0]!r} not found")
    return Path(found).resolve()


def _module_file(module_name: str) -> Path:
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        raise PortSourceUnknown(f"module {module_name!r}: {exc}") from None
    if spec is None or not spec.has_location or spec.origin is None:
        raise PortSourceUnknown(f"module {module_name!r} has no source file")
    return Path(spec.origin).resolve()


def port_source(spec: str, port: object | None = None) -> Path:
    """The file holding the code of the port loaded by ``spec`` (a ``--port``
    spelling): a ``cmd:`` port's program (:func:`command_program`), the module an
    import path names, or the module defining the loaded ``port``'s class (a
    ``mutant:`` port, or when the spelling names no module)."""
    from harness.port import BUILTIN_PORTS

    if spec.startswith("cmd:"):
        return command_program(spec.removeprefix("cmd:"))
    target = BUILTIN_PORTS.get(spec, spec)
    if ":" in target and not spec.startswith("mutant:"):
        return _module_file(target.partition(":")[0])
    if port is not None:
        return _module_file(type(port).__module__)
    raise PortSourceUnknown(f"port {spec!r} names no module and no loaded port was given")


def port_repository(spec: str, port: object | None = None) -> dict[str, Any]:
    """The repository record (see the module docstring) of the port's own code,
    plus ``port_spec`` and ``source`` (the file it was located by)."""
    try:
        source = port_source(spec, port)
    except PortSourceUnknown as exc:
        return {"port_spec": spec, "path": None, "commit": None, "reason": f"cannot locate the port's code: {exc}"}
    return {"port_spec": spec, "source": str(source), **repository_state(source)}


# What decides a comparison's result: the harness, the oracle glue, the
# in-tree ports and the case files (reports, tests and docs do not).
SOURCE_FOLDERS = ("harness", "oracle", "ports", "cases")
SOURCE_SUFFIXES = (".py", ".json", ".cpp")


def source_digest(root: Path = REPO_ROOT) -> str:
    """SHA-256 over the relative path and bytes of every source file that decides
    a result. Unlike git's dirty flag it changes with any edit, committed or
    not, and not with output files written into the tree."""
    digest = hashlib.sha256()
    for folder in SOURCE_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.is_file():
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def environment() -> dict[str, Any]:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.machine()})"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "device": device,
        "host": platform.node(),
    }


def collect(
    oracle_provenance: dict[str, Any], port_spec: str | None = None, port: object | None = None
) -> dict[str, Any]:
    """The provenance of a run. ``port_spec`` (the ``--port`` spelling) and the
    loaded ``port`` add ``port_repository`` (:func:`port_repository`); without a
    port spelling there is no such key (a run of several ports records each
    port's with :func:`port_repository`), never the harness's in its place."""
    out: dict[str, Any] = {
        "oracle": oracle_provenance,
        "environment": environment(),
        "harness_repository": repository_state(),
    }
    if port_spec is not None:
        out["port_repository"] = port_repository(port_spec, port)
    return out
