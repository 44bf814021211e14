"""The night's sizes and the history store (``<out>/history.jsonl``).

A night records the sizes it ran with (``--size``, ``--numeric-size``, the
levels, whether the mutant kill matrix and the explore search ran) beside the
suite's defaults. A night smaller than the defaults in any of them is
*reduced* (:func:`reduced_reasons`): its page says so in its header, and its
history lines carry ``reduced`` so the history plots keep them apart from full
nights (a 20-case night's parity rate is not comparable with a 50,000-case one).

The history store holds one line per night and port. A corrupt line is
reported (one warning naming the file and line) and skipped, never fatal.
harness/night/data.py's ``Night`` is what a row is made of.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from harness.night.data import Night
from harness.night.sizes import _ISO_DATE, reduced_reasons
from harness.sides.items import PARITY

HISTORY_COLUMNS = (
    "date", "port", "suite", "items", "pass_rate", "oracle_chunks", "port_chunks", "complete",
    "parity", "expected", "new", "verdict", "baseline", "reduced",
)  # fmt: skip
# History fields that must be numbers (or absent: lines written before they existed).
_HISTORY_NUMBERS = ("items", "pass_rate", "oracle_chunks", "port_chunks", "parity", "expected", "new")


def warn(message: str) -> None:
    print(f"parity: warning: {message}", file=sys.stderr)


# -- the night's sizes -----------------------------------------------------------------------


def history_rows(night: Night) -> list[dict[str, Any]]:
    rows = []
    reduced = bool(reduced_reasons(night.sizes))
    for p in night.ports:
        sides = p.summary["sides"]
        counts = p.tally
        rows.append(
            {
                "date": night.date,
                "port": p.port,
                "suite": night.suite,
                "items": len(p.table),
                "pass_rate": float((p.table["status"] == PARITY).mean()) if len(p.table) else 0.0,
                "oracle_chunks": sides["oracle"]["chunks"],
                "port_chunks": sides["port"]["chunks"],
                "complete": night.complete,
                "parity": counts.parity,
                "expected": counts.expected,
                "new": counts.new,
                "verdict": counts.verdict,
                "baseline": p.baseline,
                "reduced": reduced,
            }
        )
    return rows


def _history_problem(record: Any) -> str | None:
    """Why a decoded history line is not a record; None if it is one."""
    if not isinstance(record, dict):
        return "not a JSON object"
    date = record.get("date")
    if not isinstance(date, str) or not _ISO_DATE.match(date):
        return f"field 'date' is {json.dumps(date)}, not a date YYYY-MM-DD"
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        return f"field 'date' is {json.dumps(date)}, not a date"
    if not isinstance(record.get("port"), str) or not record["port"]:
        return "field 'port' is not a port name"
    for key in _HISTORY_NUMBERS:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"field '{key}' is {json.dumps(value)}, not a number"
        if isinstance(value, float) and not math.isfinite(value):
            return f"field '{key}' is not a finite number"
    if record.get("reduced") is not None and not isinstance(record["reduced"], bool):
        return f"field 'reduced' is {json.dumps(record['reduced'])}, not true or false"
    return None


def _read_history_lines(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str, str]]]:
    """The records, and every other non-blank line as (line number, text, why)."""
    records: list[dict[str, Any]] = []
    corrupt: list[tuple[int, str, str]] = []
    if not path.exists():
        return records, corrupt
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            corrupt.append((number, raw.decode("utf-8", "replace"), f"not UTF-8 text ({exc.reason})"))
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            corrupt.append((number, line, f"not JSON ({exc.msg} at column {exc.colno})"))
            continue
        problem = _history_problem(record)
        if problem:
            corrupt.append((number, line, problem))
        else:
            records.append(record)
    return records, corrupt


def _history_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(records, columns=list(HISTORY_COLUMNS))


def read_history(path: Path, report: Callable[[str], None] | None = warn) -> pd.DataFrame:
    """The history store's records. A corrupt line is reported (one line naming
    the file and its line number) and skipped, never fatal."""
    records, corrupt = _read_history_lines(path)
    for number, _, why in corrupt:
        if report:
            report(f"{path}:{number}: skipped a history line: {why}")
    return _history_frame(records)


def append_history(path: Path, night: Night) -> pd.DataFrame:
    """Add tonight's rows (replacing an earlier run of the same date and port).
    Corrupt lines are kept as they were, first, so that they keep being reported
    until a person repairs them; the records follow in (date, port) order."""
    records, corrupt = _read_history_lines(path)
    tonight = history_rows(night)
    replaced = {(r["date"], r["port"]) for r in tonight}
    records = [r for r in records if (r["date"], r["port"]) not in replaced] + tonight
    records.sort(key=lambda r: (r["date"], r["port"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for _, line, _ in corrupt:
            out.write(line + "\n")
        for record in records:
            out.write(json.dumps(record, sort_keys=True) + "\n")
    return _history_frame(records)
