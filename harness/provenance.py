"""Where a result came from: the oracle pin, library versions, the device, and
the port repository's commit and dirty state (gitpython)."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def repository_state(path: Path = REPO_ROOT) -> dict[str, Any]:
    try:
        import git

        repo = git.Repo(path, search_parent_directories=True)
        return {
            "path": str(Path(repo.working_dir)),
            "commit": repo.head.commit.hexsha if repo.head.is_valid() else None,
            "branch": None if repo.head.is_detached else repo.active_branch.name,
            "dirty": repo.is_dirty(untracked_files=True),
        }
    except Exception as exc:
        return {"path": str(path), "commit": None, "error": f"{type(exc).__name__}: {exc}"}


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


def collect(oracle_provenance: dict[str, Any], port_module_path: Path | None = None) -> dict[str, Any]:
    return {
        "oracle": oracle_provenance,
        "environment": environment(),
        "harness_repository": repository_state(),
        "port_repository": repository_state(port_module_path) if port_module_path else repository_state(),
    }
