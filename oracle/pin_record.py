"""The fingerprint check, remembered for one installation of vLLM.

Every start of the pinned oracle checks the installed release against its pin
(:func:`oracle.pin.check_fingerprints`), which imports the vLLM modules the pin
names: about five seconds, paid again by every process, even one whose every
answer then comes from the oracle cache. :func:`checked_fingerprints` keeps the
check's result in the oracle cache's folder, under the key of everything that
result depends on, and a later start with the same key reads it back instead of
importing vLLM.

The key (:func:`installation_key`) holds:

- every file of the installed ``vllm`` package, found the way ``import vllm``
  would find it, without importing it (Python files by their bytes, compiled
  extensions by size and time; symlinked folders followed): any edit or
  reinstall of vLLM is another key;
- the pin's bytes (the pin the check reads, ``oracle.pin.PIN_FILE``, looked up
  at each start);
- what else the import depends on: the interpreter, every installed module
  (of vLLM's folder or another folder holding distributions) that a
  ``sys.path`` entry searched before it shadows, with that entry
  (:func:`shadowed_modules`), every installed distribution's name and version,
  the device recipe and every ``VLLM_*`` variable;
- the check's own code (``oracle/pin.py``, ``oracle/environment.py``, this file).

Invariants a reader must keep:

- a record holds what :func:`~oracle.pin.check_fingerprints` and
  :func:`~oracle.pin.installed_version` returned under its key, and only a
  check that passed (every status "ok") is recorded: a refusal is checked
  afresh at every start, so a drifted pin or a transient import failure never
  sticks;
- a record that cannot be read or decoded is a miss (the check runs again),
  never a status;
- with no folder (``--no-oracle-cache``), or with vLLM already imported in the
  process (its live modules are what runs, and the check then costs little),
  the check runs and nothing is recorded.

What the key cannot see: a dependency's file edited in place without a version
change, and a module that only a folder outside the installation provides (the
folder a run starts in, a port's folder on ``PYTHONPATH``: they shadow nothing
vLLM's installation holds, so the same installation keeps its key wherever a
run starts). The answers such a run reads back were computed by the installation
that passed the check; a question the cache cannot answer imports vLLM, and an
import failure is then an oracle error on that item.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import oracle.environment
import oracle.pin
from oracle.environment import OracleUnavailable, module_source_file, selected_device
from oracle.pin import SymbolStatus, check_fingerprints, installed_version

RECORD_FORMAT = 1
# Beside the cache's format-N/<fingerprint> folders, which pruning alone touches.
RECORDS = "fingerprint-checks"
# The check's own code, part of the key.
_CHECKER_MODULES = (oracle.pin, oracle.environment, sys.modules[__name__])
# Longest first: a compiled extension's full suffix before the bare ".so".
_MODULE_SUFFIXES = sorted(importlib.machinery.all_suffixes(), key=len, reverse=True)


@dataclass(frozen=True)
class CheckedPin:
    """What the fingerprint check found: the installed release and every status."""

    version: str
    commit: str | None
    statuses: tuple[SymbolStatus, ...]


def installed_package_root() -> Path | None:
    """The folder ``import vllm`` would load, found without importing it (None: no vLLM)."""
    try:
        return module_source_file("vllm").parent
    except (OracleUnavailable, ImportError, ValueError):
        return None


def _package_files(root: Path) -> Iterator[tuple[str, bytes]]:
    """Every file under ``root`` (symlinked folders followed), in order: a Python
    file by its bytes, any other (a compiled extension, which Python imports
    before the source beside it) by its size and modification time."""
    for folder, subfolders, files in os.walk(root, followlinks=True):
        subfolders.sort()
        for name in sorted(files):
            path = Path(folder, name)
            relative = str(path.relative_to(root))
            if name.endswith(".py"):
                yield relative, path.read_bytes()
            else:
                status = path.stat()
                yield relative, f"{status.st_size} {status.st_mtime_ns}".encode()


def _top_level_modules(folder: str) -> set[str]:
    """The top-level names ``folder`` (a ``sys.path`` entry) offers to ``import``:
    its folders and its module files by name (none when it is not a folder)."""
    names: set[str] = set()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return names
    for entry in entries:
        if entry.is_dir():
            name = entry.name
        else:
            suffix = next((s for s in _MODULE_SUFFIXES if entry.name.endswith(s)), None)
            if suffix is None:
                continue
            name = entry.name[: -len(suffix)]
        if name.isidentifier() and name != "__pycache__":
            names.add(name)
    return names


def _holds_distributions(folder: Path) -> bool:
    """Whether ``folder`` is where packages are installed (it holds their metadata)."""
    try:
        return any(e.name.endswith((".dist-info", ".egg-info")) for e in os.scandir(folder))
    except OSError:
        return False


def shadowed_modules(site: Path) -> list[tuple[str, str]]:
    """What ``import`` could load in place of an installed module, in ``sys.path``
    order up to the last installation folder (``site``, the folder vLLM is in,
    and every entry holding distributions: a venv's, the user's, the system's):
    each name a folder offers that an installation folder searched after it
    offers too, with that folder; an entry that is no folder (a zip, a path
    hook) as it is spelled. A folder that offers no installed name (the one a
    run starts in, a port's folder on ``PYTHONPATH``) adds nothing, and entries
    past the last installation folder shadow nothing installed."""
    folders = [Path(os.path.abspath(entry or os.curdir)).resolve() for entry in sys.path]
    site = site.resolve()
    installations = {f for f in folders if _holds_distributions(f)} | {site}
    offered = {f: _top_level_modules(str(f)) for f in set(folders) | {site}}
    searched = list(zip(sys.path, folders, strict=True))
    if site not in folders:
        searched.append((str(site), site))
    last = max(i for i, (_, folder) in enumerate(searched) if folder in installations)
    # The names installation folders offer after each position, from the back.
    installed_after: list[set[str]] = [set() for _ in searched]
    names: set[str] = set()
    for i in range(len(searched) - 1, -1, -1):
        installed_after[i] = set(names)
        if searched[i][1] in installations:
            names |= offered[searched[i][1]]
    shadowed: list[tuple[str, str]] = []
    for i, (entry, folder) in enumerate(searched[: last + 1]):
        if not folder.is_dir():
            shadowed.append(("", entry))
        else:
            shadowed += [(name, str(folder)) for name in sorted(offered[folder] & installed_after[i])]
    return shadowed


def installation_key(pin_path: Path | None = None) -> str | None:
    """The digest of everything the check's result depends on (module docstring),
    or None when vLLM's package cannot be found without importing it. ``pin_path``
    defaults to the pin the check reads (``oracle.pin.PIN_FILE``, looked up now)."""
    root = installed_package_root()
    if root is None:
        return None
    digest = hashlib.sha256()
    context = {
        "format": RECORD_FORMAT,
        "package": str(root.resolve()),
        "interpreter": sys.executable,
        "python": sys.version,
        # What else the import finds: a module shadowing an installed one, and
        # every installed distribution's version.
        "shadowed": shadowed_modules(root.parent),
        "distributions": sorted((d.metadata["Name"] or "", d.version) for d in importlib.metadata.distributions()),
        "device": selected_device(),
        "vllm_variables": sorted((k, v) for k, v in os.environ.items() if k.startswith("VLLM_")),
        # The check's own code: a changed check is another key.
        "checker": [hashlib.sha256(Path(m.__file__ or "").read_bytes()).hexdigest() for m in _CHECKER_MODULES],
    }
    digest.update(json.dumps(context, sort_keys=True).encode() + b"\0")
    digest.update((pin_path or oracle.pin.PIN_FILE).read_bytes() + b"\0")
    for relative, content in _package_files(root):
        digest.update(relative.encode() + b"\0" + content + b"\0")
    return digest.hexdigest()


def _record_of(data: object) -> CheckedPin | None:
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        return None
    try:
        statuses = tuple(SymbolStatus(**status) for status in data["statuses"])
        version, commit = data["version"], data["commit"]
    except (KeyError, TypeError):
        return None
    if type(version) is not str or not (commit is None or type(commit) is str) or not statuses:
        return None
    return CheckedPin(version, commit, statuses)


def _read(path: Path) -> CheckedPin | None:
    try:
        return _record_of(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def _write(path: Path, checked: CheckedPin) -> None:
    data = {
        "format": RECORD_FORMAT,
        "version": checked.version,
        "commit": checked.commit,
        "statuses": [asdict(status) for status in checked.statuses],
    }
    # Written whole and renamed, so that a concurrent reader sees a record or none.
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(temporary, path)
    with contextlib.suppress(OSError):
        temporary.unlink(missing_ok=True)


def check_now() -> CheckedPin:
    """The check itself: imports vLLM (raises OracleUnavailable when it cannot)."""
    version, commit = installed_version()
    return CheckedPin(version, commit, tuple(check_fingerprints()))


def checked_fingerprints(cache_root: Path | None) -> CheckedPin:
    """The pinned release's fingerprint check: read back from ``cache_root`` when
    a record of the same installation is there, else run and recorded there.
    ``cache_root`` None, or vLLM already imported here, runs the check and
    records nothing."""
    # Once vLLM is imported the check costs little, and only the live modules
    # can say whether something in this process changed them since: check them,
    # and record only what a check that imported vLLM itself found.
    imported = "vllm" in sys.modules
    try:
        key = installation_key() if cache_root is not None and not imported else None
    except OSError:
        # A file of the installation that cannot be read (a dangling link): no
        # key can name it, so the check runs.
        key = None
    if cache_root is None or key is None:
        return check_now()
    path = cache_root / RECORDS / f"{key}.json"
    recorded = _read(path)
    if recorded is not None:
        return recorded
    checked = check_now()
    # Only a check that passed is kept: a refusal (a drifted pin, a module that
    # failed to import once) is checked afresh at every start.
    if all(status.status == "ok" for status in checked.statuses):
        _write(path, checked)
    return checked
