"""How a printed command starts, so that it runs pasted into a fresh shell: the
environment's interpreter by path, the port's folder on ``PYTHONPATH`` (on a CI
runner by :data:`PORT_DIR_VARIABLE`), a ``cmd:`` port's program folder on
``PATH``, the plug-ins, and the shell quoting that keeps the variable live.
:mod:`harness.verdicts.reproduce` builds its ``parity diff`` lines from these.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.model.levels import PLUGINS_VARIABLE

# The PATH a fresh shell has (what every printed line must run with).
FRESH_SHELL_PATH = ("/usr/bin", "/bin")

# In lines printed on a CI runner, the port's checkout (whatever folder the runner
# had it in) is this variable: a reader sets it to their own checkout of the port.
PORT_DIR_VARIABLE = "PORT_DIR"
PORT_DIR_WORD = f"${PORT_DIR_VARIABLE}"
PORT_DIR_NOTE = (
    f"The reproduce lines name the port's checkout ${PORT_DIR_VARIABLE}: run them from a checkout of the harness "
    f"(its tox environments built) after `export {PORT_DIR_VARIABLE}=/path/to/your/checkout/of/the/port`."
)


def in_ci() -> bool:
    """Whether this run is on a CI runner (``CI`` set, as GitHub Actions, GitLab and most CIs set it)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def uses_port_dir(command: str) -> bool:
    """Whether a printed command names the port's checkout by :data:`PORT_DIR_VARIABLE`."""
    return PORT_DIR_WORD in command


def harness_root() -> Path:
    """The checkout this harness runs from (where printed commands are pasted)."""
    return Path(__file__).resolve().parents[2]


def program_words(port_spec: str | None = None) -> list[str]:
    """How a printed command starts, so that it runs when pasted into a fresh
    shell (no environment activated, ``PATH=/usr/bin:/bin``) at the harness
    root: this process's interpreter by path (relative to the root when it lies
    inside it), ``-m harness``, and before them ``env`` with what the run's
    imports depended on: ``PYTHONPATH`` holding the folder a Python port spec
    was imported from and the run's own ``PYTHONPATH``, the run's plug-in
    levels and case fields (``PARITY_PLUGINS``), and ``-C DIR`` when the
    run's working directory (against which relative case files and ``cmd:``
    ports are resolved) is not the root. Never the ``parity`` console script:
    it is found only inside an activated environment."""
    root = harness_root()
    cwd = Path.cwd().resolve()
    # Not resolved: a virtual environment's python is a link that must stay one to find its packages.
    interpreter = Path(os.path.abspath(sys.executable))
    shown = interpreter.relative_to(root) if cwd == root and interpreter.is_relative_to(root) else interpreter
    env_words: list[str] = []
    search_path: list[str] = []
    if cwd != root:
        env_words += ["-C", str(cwd)]
        # The harness the run used, not whichever checkout an editable install points at.
        search_path.append(str(root))
    port_root = port_import_root(port_spec)
    if port_root is not None:
        search_path.append(port_root)
    plugins = os.environ.get(PLUGINS_VARIABLE, "")
    if not built_in_port(port_spec) or plugins:
        # What the port's (a cmd: program's too) or the plug-ins' imports may have needed;
        # a built-in port (or a mutant of one) needs none of the caller's paths, and its lines carry none.
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            if entry:
                search_path.append(str(Path(entry).resolve()))
    search_path = [p for i, p in enumerate(search_path) if p not in search_path[:i]]
    if port_root is not None and in_ci():
        # The port's checkout is the runner's: named by the variable the PR comment defines.
        search_path = [PORT_DIR_WORD if entry == port_root else entry for entry in search_path]
    if search_path:
        env_words.append("PYTHONPATH=" + os.pathsep.join(search_path))
    if plugins:
        # The plug-in levels the run had (harness.model.levels), so their items resolve.
        env_words.append(f"{PLUGINS_VARIABLE}={plugins}")
    program_dir = cmd_program_dir(port_spec)
    if program_dir is not None:
        env_words.append(f"PATH={program_dir}{os.pathsep}{os.pathsep.join(FRESH_SHELL_PATH)}")
    launcher = ["env", *env_words] if env_words else []
    return [*launcher, str(shown), "-m", "harness"]


def cmd_program_dir(port_spec: str | None) -> str | None:
    """The folder a ``cmd:`` port's program was found in on this run's PATH, when
    a fresh shell's PATH (:data:`FRESH_SHELL_PATH`) would not find it there (a
    virtual environment's ``python``, ``~/.cargo/bin/...``); None otherwise."""
    if not port_spec or not port_spec.startswith("cmd:"):
        return None
    try:
        words = shlex.split(port_spec.removeprefix("cmd:"))
    except ValueError:
        return None
    program = next((w for w in words if "=" not in w or w.startswith(("/", "."))), None)
    if program is None or "/" in program:
        return None
    found = shutil.which(program)
    if found is None or shutil.which(program, path=os.pathsep.join(FRESH_SHELL_PATH)) == found:
        return None
    return str(Path(found).parent)


def built_in_port(port_spec: str | None) -> bool:
    """Whether ``port_spec`` names a port of the harness itself (``per_request``, ``mutant:NAME`` ...)."""
    from harness.sides.loading import BUILTIN_PORTS

    return port_spec is None or port_spec in BUILTIN_PORTS or port_spec.startswith("mutant:")


def port_import_root(port_spec: str | None) -> str | None:
    """The folder on ``sys.path`` that a ``package.module:attr`` port spec's
    top-level package is found in, when a fresh interpreter at the harness root
    would not find it by itself (not the root, not the environment); None for
    built-in, ``mutant:`` and ``cmd:`` ports."""
    from harness.sides.loading import BUILTIN_PORTS

    if not port_spec or port_spec.startswith(("cmd:", "mutant:")) or port_spec in BUILTIN_PORTS:
        return None
    top = port_spec.partition(":")[0].split(".")[0]
    if not top:
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        location = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin and spec.has_location:
        location = Path(spec.origin)
    else:
        return None
    base = location.resolve().parent
    prefix = Path(sys.prefix).resolve()
    if base == harness_root() or base.is_relative_to(prefix):
        return None
    return str(base)


def shell_join(argv: Sequence[str]) -> str:
    """``argv`` as a shell line (:func:`shlex.join`), except that a word naming the
    port's checkout by :data:`PORT_DIR_VARIABLE` is double-quoted so the shell
    expands that variable (and nothing else in the word)."""

    def quoted(word: str) -> str:
        if PORT_DIR_WORD not in word:
            return shlex.quote(word)
        # Inside double quotes only $, `, " and \ are special: each escaped but the variable.
        parts = ["".join(f"\\{c}" if c in '$`"\\' else c for c in part) for part in word.split(PORT_DIR_WORD)]
        return '"' + PORT_DIR_WORD.join(parts) + '"'

    return " ".join(quoted(word) for word in argv)
