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
import os
import platform
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from harness.model.host import cpu_model

REPO_ROOT = Path(__file__).resolve().parents[2]
NOT_IN_GIT = "not in a git repository"
# Programs that run code named by their arguments: for ``cmd:python my_port.py``
# the port's code is my_port.py, never the interpreter (whose repository, if
# any, is someone else's).
_PYTHON = re.compile(r"(python|pypy)[\d.]*t?(\.exe)?")
_SHELL = re.compile(r"(ba|da|k|z)?sh(\.exe)?")
_INTERPRETER = re.compile(r"(node|ruby|perl|julia|Rscript)[\d.]*(\.exe)?")
# Python's options that take a value, as one word (-Xdev) or the next (-X dev);
# -c and -m end the options.
_PYTHON_VALUED = "cmWX"
# Options of the other interpreters whose value is code, not a file.
_INLINE_CODE = {"node": ("-e", "--eval", "-p", "--print"), "ruby": ("-e",), "perl": ("-e", "-E"),
                "julia": ("-e", "--eval", "-E", "--print"), "Rscript": ("-e",)}  # fmt: skip
# Shell options that take a value (set -o NAME, shopt -O NAME).
_SHELL_VALUED = ("-o", "+o", "-O", "+O")
# env's options that take a value, as one word (-uNAME) or the next (-u NAME),
# and the long spellings of those that matter here.
_ENV_VALUED = ("u", "C", "S")
_ENV_LONG = {"--unset": "u", "--chdir": "C", "--split-string": "S", "--ignore-environment": "i"}


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


@dataclass
class _Launch:
    """What decides where a command's code is found: its words, the working
    directory and the ``PYTHONPATH`` it runs with (after any ``env`` prefix)."""

    argv: list[str]
    cwd: Path
    python_path: str | None


def _apply_env_option(flag: str, value: str, launch: _Launch, words: list[str]) -> None:
    if flag == "i":
        launch.python_path = None
    elif flag == "u" and value == "PYTHONPATH":
        launch.python_path = None
    elif flag == "C":
        launch.cwd = launch.cwd / value
    elif flag == "S":
        words[:0] = shlex.split(value)


def _strip_env(launch: _Launch) -> _Launch:
    """``launch`` without leading ``env`` words: env's options (``-i``, ``-u NAME``,
    ``-C DIR``, ``-S STRING``, alone or clustered, short or long) and
    ``NAME=value`` assignments."""
    while launch.argv and Path(launch.argv[0]).name == "env":
        words = launch.argv[1:]
        launch = _Launch(words, launch.cwd, launch.python_path)
        while words and words[0].startswith("-") and words[0] != "-":
            word = words.pop(0)
            if word == "--":
                break
            if word.startswith("--"):
                name, eq, value = word.partition("=")
                flag = _ENV_LONG.get(name, "")
                if flag in _ENV_VALUED and not eq:
                    if not words:
                        raise PortSourceUnknown(f"env {word}: missing its value")
                    value = words.pop(0)
                _apply_env_option(flag, value, launch, words)
                continue
            for position, flag in enumerate(word[1:], start=2):
                if flag in _ENV_VALUED:
                    value = word[position:] or (words.pop(0) if words else "")
                    if not value:
                        raise PortSourceUnknown(f"env -{flag}: missing its value")
                    _apply_env_option(flag, value, launch, words)
                    break
                _apply_env_option(flag, "", launch, words)
        if words and words[0] == "-":  # "env -" is "env -i"
            words.pop(0)
            launch.python_path = None
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0], re.DOTALL):
            name, _, value = words.pop(0).partition("=")
            if name == "PYTHONPATH":
                launch.python_path = value
        if not words:
            raise PortSourceUnknown("env runs no command")
        launch.argv = words
    return launch


def _script(program: str, word: str | None, cwd: Path, no_script: str) -> Path:
    if word is None or word == "-":
        raise PortSourceUnknown(f"{program}: {no_script}")
    script = cwd / word
    if not script.is_file():
        raise PortSourceUnknown(f"{program}: script {word!r} is not a file (in {cwd})")
    return script.resolve()


def _python_code(launch: _Launch) -> Path:
    """The file ``python [options] (-m module | script)`` runs, found as that
    interpreter would: ``-m`` on its ``sys.path`` (the working directory, then
    ``PYTHONPATH``, unless ``-I``, ``-E`` or ``-P`` drop them)."""
    program, words = Path(launch.argv[0]).name, launch.argv[1:]
    ignore_env = no_cwd = False
    while words and words[0].startswith("-") and words[0] != "-":
        word = words.pop(0)
        if word == "--":
            break
        if word.startswith("--"):  # --check-hash-based-pycs MODE is the one long option with a value
            if word == "--check-hash-based-pycs" and words:
                words.pop(0)
            continue
        for position, flag in enumerate(word[1:], start=2):
            if flag not in _PYTHON_VALUED:
                ignore_env |= flag in "IE"
                no_cwd |= flag in "IP"
                continue
            value = word[position:] or (words.pop(0) if words else None)
            if flag == "c":
                raise PortSourceUnknown(f"{program} -c: inline code, no file")
            if flag == "m":
                if value is None:
                    raise PortSourceUnknown(f"{program} -m: no module named")
                return _run_module_file(program, value, launch, ignore_env=ignore_env, no_cwd=no_cwd)
            break  # -X / -W: the rest of the word was the value
    return _script(
        program, words[0] if words else None, launch.cwd, "no script or module: it reads its code from stdin"
    )


def _run_module_file(program: str, module: str, launch: _Launch, *, ignore_env: bool, no_cwd: bool) -> Path:
    """The file ``python -m module`` runs (a package's ``__main__``), located with
    :class:`importlib.machinery.PathFinder`, which, unlike
    :func:`importlib.util.find_spec`, imports no parent package on the way. Only
    the harness's own interpreter's ``sys.path`` stands in for the child's
    beyond the working directory and ``PYTHONPATH``: another interpreter's
    site-packages are not known here."""
    search = [] if no_cwd else [str(launch.cwd.resolve())]
    if launch.python_path and not ignore_env:
        search += [str(launch.cwd / entry) for entry in launch.python_path.split(os.pathsep) if entry]
    interpreter = shutil.which(launch.argv[0])
    if interpreter is not None and Path(interpreter).resolve() == Path(sys.executable).resolve():
        search += [entry for entry in sys.path if entry and Path(entry).resolve() != Path.cwd().resolve()]
    where = f"{program} -m {module}"
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        raise PortSourceUnknown(f"{where}: not a module name")
    locations: list[str] | None = search
    spec = None
    for depth in range(len(parts)):
        if locations is None:
            raise PortSourceUnknown(f"{where}: {'.'.join(parts[:depth])} is not a package")
        spec = PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
        if spec is None:
            raise PortSourceUnknown(f"{where}: module not found on the path it runs with ({len(search)} folders)")
        locations = None if spec.submodule_search_locations is None else list(spec.submodule_search_locations)
    if locations is not None:  # a package: python runs its __main__
        spec = PathFinder.find_spec(f"{module}.__main__", locations)
        if spec is None:
            raise PortSourceUnknown(f"{where}: package has no __main__ module")
    if spec is None or not spec.has_location or spec.origin is None:
        raise PortSourceUnknown(f"{where}: module has no source file")
    return Path(spec.origin).resolve()


def _interpreted_code(
    launch: _Launch, inline: tuple[str, ...], valued: tuple[str, ...], inline_in_cluster: str = ""
) -> Path:
    """The script another interpreter runs: its first argument that is not an
    option (nor an option's value in ``valued``), when that is a file. An
    ``inline`` option (or, clustered, ``inline_in_cluster``: sh's ``-ec``) makes
    the code an argument, no file."""
    program, words = Path(launch.argv[0]).name, launch.argv[1:]
    while words and words[0][:1] in "-+" and words[0] not in ("-", "+"):
        word = words.pop(0)
        if word == "--":
            break
        option = word.partition("=")[0]
        if inline_in_cluster and word[1:2] != "-" and inline_in_cluster in word[1:]:
            option = f"-{inline_in_cluster}"
        if option in inline:
            raise PortSourceUnknown(f"{program} {option}: inline code, no file")
        if word in valued and words:
            words.pop(0)
    return _script(program, words[0] if words else None, launch.cwd, "no script: it reads its code from stdin")


def command_program(command: str) -> Path:
    """The file holding a ``cmd:`` port's code, after any ``env`` prefix: the
    module (``-m``) or script a Python interpreter runs, the script another
    interpreter runs, else the executable, found as the OS would (a path, or a
    name on ``PATH``). Code that is no file (``-c``, stdin) is
    :class:`PortSourceUnknown`, never the interpreter in its place."""
    argv = shlex.split(command)
    if not argv:
        raise PortSourceUnknown("the command is empty")
    launch = _strip_env(_Launch(argv, Path.cwd(), os.environ.get("PYTHONPATH")))
    program = Path(launch.argv[0]).name
    if _PYTHON.fullmatch(program):
        return _python_code(launch)
    if _SHELL.fullmatch(program):
        return _interpreted_code(launch, ("-c",), _SHELL_VALUED, inline_in_cluster="c")
    if _INTERPRETER.fullmatch(program):
        return _interpreted_code(launch, _INLINE_CODE[re.sub(r"[\d.]*(\.exe)?$", "", program)], ())
    found = shutil.which(launch.argv[0])
    if found is None:
        raise PortSourceUnknown(f"executable {launch.argv[0]!r} not found")
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
    from harness.sides.loading import BUILTIN_PORTS

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


def port_digest(spec: str, port: object | None = None) -> str | None:
    """SHA-256 of the port's code as it ran (:func:`port_source`): every source
    file of the package its module belongs to (the top-level package holding
    it; the file alone outside a package), or a ``cmd:`` port's program file;
    with an external port's hello ``version`` when it declares one. Shards of
    one gate must share it: a port spelled the same at two commits is not one
    run. None when the code cannot be located."""
    try:
        source = port_source(spec, port)
    except PortSourceUnknown:
        return None
    root = source.parent
    while (root.parent / "__init__.py").is_file() and (root / "__init__.py").is_file():
        root = root.parent
    # Every file of the package (its C++, CUDA, Cython or built extensions too), caches aside.
    files = (
        sorted(p for p in root.rglob("*") if "__pycache__" not in p.parts and p.suffix != ".pyc")
        if (root / "__init__.py").is_file()
        else [source]
    )
    digest = hashlib.sha256()
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    hello = getattr(port, "hello", None)
    if isinstance(hello, dict) and "version" in hello:
        digest.update(b"version\0" + str(hello["version"]).encode())
    return digest.hexdigest()


def files_digest(paths: list[str] | None) -> str | None:
    """SHA-256 over the JSON files given as ``--cases`` (folders walked), by path and
    bytes; None without any."""
    if not paths:
        return None
    digest = hashlib.sha256()
    for given in paths:
        path = Path(given)
        for file in sorted(path.rglob("*.json")) if path.is_dir() else [path]:
            if file.is_file():
                digest.update(str(file).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


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


def _installed_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Where the run ran: the Python, torch and Triton versions, the device, the
    CPU's model, the capability torch dispatches its CPU kernels to and the
    BLAS's code path. A run that compared no tensor has not loaded torch
    (docs/architecture.md): its versions are the installed ones, its device the
    host's, its capability and BLAS None."""
    torch = sys.modules.get("torch")
    triton = sys.modules.get("triton")
    on_gpu = torch is not None and torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__) if torch is not None else _installed_version("torch"),
        "triton": str(triton.__version__) if triton is not None else _installed_version("triton"),
        "device": torch.cuda.get_device_name(0) if torch is not None and on_gpu else f"cpu ({platform.machine()})",
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if torch is not None else None,
        "blas": _blas_mode() if torch is not None else None,
        "host": platform.node(),
    }


def _blas_mode() -> str:
    from harness.kernels.machine import blas_mode

    return blas_mode()


def merged_environment(environments: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a run merged from shards ran: each field as the shards agree on it,
    or their distinct values in shard order joined by "; " (shards of one run on
    different CPUs judge the same inputs, and the verdict names every machine)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(key for environment in environments for key in environment):
        values = list(dict.fromkeys(str(environment.get(key)) for environment in environments))
        out[key] = environments[0].get(key) if len(values) == 1 else "; ".join(values)
    return out


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
