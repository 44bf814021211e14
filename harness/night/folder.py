"""The night's folder, ``<out>/<date>/``: the date that names it, the lock on
``<out>``, the files written into it, and its ``night.json`` read back.

Invariants a reader must keep:

- The date is an ISO date (:func:`validate_night_date`), never a path: it names
  the folder under ``--out``.
- One night at a time writes into an ``--out`` (:func:`nightly_lock`, an
  ``flock`` on ``<out>/.nightly.lock``): nights into one ``--out`` share its
  history and explore database. The lock is re-entrant within a process.
- :func:`write_night` writes each port's results first, then the report (through
  the ``write_report`` callback, reports/nightly.py's, so the harness never
  imports reports/), and ``night.json`` last: a ``night.json`` names only ports
  whose results are already on disk. What :func:`write_meta` writes is what
  :func:`read_meta` and the shard merge (harness/night/shards.py) read back.
- A write that fails (a full disk) is one line (:func:`unwritable`), for the
  command to print; it stops nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pandas as pd

from harness.cases.fields import CaseError
from harness.cases.json_input import read_json
from harness.night.data import Night
from harness.night.sizes import _ISO_DATE
from harness.verdicts.provenance import port_digest, source_digest

NIGHT_META = "night.json"
LOCK_FILE = ".nightly.lock"

# Writes the night's report (reports/nightly.py's ``write_report``): the night, its
# folder, and the history to plot (the nights before, plus tonight once complete).
WriteReport = Callable[[Night, Path, pd.DataFrame], object]


def validate_night_date(text: str) -> str:
    """``text`` if it is an ISO date (YYYY-MM-DD), the name of the night's folder
    under ``--out``; anything else (a path, ``../escape``) is a :class:`CaseError`."""
    if not _ISO_DATE.match(text):
        raise CaseError("--date", None, f"{text!r} is not a date YYYY-MM-DD (it names the folder <out>/<date>)")
    try:
        datetime.date.fromisoformat(text)
    except ValueError as exc:
        raise CaseError("--date", None, f"{text!r} is not a date: {exc}") from None
    return text


_held_locks: dict[Path, tuple[IO[str], int]] = {}


@contextlib.contextmanager
def nightly_lock(out_root: Path) -> Iterator[Path]:
    """Hold ``<out_root>/.nightly.lock`` (``flock``) for the block: a second night
    into the same ``--out`` (whose history and explore database it shares) is
    refused with a :class:`CaseError` instead of racing. Re-entrant within a
    process; the lock goes when the block ends or the process dies."""
    out_root.mkdir(parents=True, exist_ok=True)
    path = (out_root / LOCK_FILE).resolve()
    if path in _held_locks:
        handle, depth = _held_locks[path]
        _held_locks[path] = (handle, depth + 1)
    else:
        handle = path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise CaseError(
                str(out_root / LOCK_FILE), None,
                f"another parity nightly ({holder}) is writing into {out_root}; wait for it or use another --out",
            ) from None  # fmt: skip
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, since {datetime.datetime.now().isoformat(timespec='seconds')}\n")
        handle.flush()
        _held_locks[path] = (handle, 1)
    try:
        yield path
    finally:
        handle, depth = _held_locks[path]
        if depth > 1:
            _held_locks[path] = (handle, depth - 1)
        else:
            del _held_locks[path]
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def write_meta(night: Night, plan_levels: tuple[str, ...], out_dir: Path, digest: str | None = None) -> None:
    meta = {
        # Every port's items of the whole night (all shards), so merging can prove its shards add up to it.
        "items_digest": digest,
        "date": night.date,
        "suite": night.suite,
        "levels": list(plan_levels),
        "expected_items": night.expected_items,
        "complete": night.complete,
        "pending": night.pending,
        "interrupted": night.interrupted,
        "stopped": night.stopped,
        "ports": [p.port for p in night.ports],
        "provenance": night.provenance,
        # The suite's coverage (measured once per night: by an unsharded run or shard 1).
        "coverage": night.coverage.to_json() if night.coverage else None,
        # Explore runs once per night (unsharded, or shard 1); its budget says whether it was asked for.
        "explore_budget_s": night.explore_budget_s,
        "explore": night.explore,
        "baselines": {port: b.to_json() for port, b in sorted(night.baselines.items())},
        "sizes": night.sizes,
        "port_specs": night.port_specs,
        # Each port's code and the harness's by content: shards of two commits are not one night.
        "port_digests": {port: port_digest(spec) for port, spec in sorted(night.port_specs.items())},
        "harness_sources": source_digest(),
        "kill_matrix": night.kill_matrix,
    }
    (out_dir / NIGHT_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_night(
    night: Night,
    out_dir: Path,
    history: pd.DataFrame,
    write_report: WriteReport,
    digest: str | None,
    levels: tuple[str, ...],
) -> None:
    """The night's files: each port's results, the report, and night.json last
    (a night.json names only ports whose results are already on disk)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in night.ports:
        p.table.to_parquet(out_dir / f"results-{p.port}.parquet", index=False)
    write_report(night, out_dir, history)
    write_meta(night, levels, out_dir, digest)


def read_meta(directory: Path) -> dict[str, Any]:
    path = directory / NIGHT_META
    if not path.exists():
        raise CaseError(str(path), None, "missing: not a nightly output folder")
    meta = read_json(path, what="not a night's metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("date"), str):
        raise CaseError(str(path), "date", "not a night's metadata")
    try:
        validate_night_date(meta["date"])
    except CaseError as exc:
        raise CaseError(str(path), "date", exc.reason) from None
    return meta


def unwritable(exc: OSError, path: Path, what: str) -> str:
    """One line naming the path that could not be written and why."""
    return f"{exc.filename or path}: cannot write the {what} ({exc.strerror or exc})"
