"""Expected divergences: the baseline a port's gate is held to.

A baseline file lists divergences a port is known to have, each with a reason::

    {
      "port": "equal_share",
      "entries": [
        {"family": "skew", "level": "layout", "reason": "the legacy grid wastes chunks"},
        {"case": "smoke-upstream-worst-case", "level": "prefill", "reason": "..."}
      ]
    }

Each entry names exactly one of ``case`` or ``family``, a ``level`` (layout,
merge, prefill), and a ``reason``; ``port`` may be set per entry, else the
file's. A failing item (divergent or port-error) that an entry covers is
*expected* and does not fail the gate; one no entry covers is *new* and does.
An entry that covers no failing item is *stale* and fails the gate too, so a
baseline cannot rot: a fixed divergence must leave the baseline with its fix.
Oracle errors are never expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.cases import CaseError
from harness.runner import LEVELS, ORACLE_ERROR, PARITY

EXPECTED, NEW, STALE = "expected", "new", "stale"


@dataclass(frozen=True)
class BaselineEntry:
    port: str
    level: str
    reason: str
    case: str | None = None
    family: str | None = None

    @property
    def label(self) -> str:
        target = f"case {self.case}" if self.case else f"family {self.family}"
        return f"{self.port} {target} [{self.level}]"

    def covers(self, port: str, level: str, name: str, family: str) -> bool:
        if self.port != port or self.level != level:
            return False
        return name == self.case if self.case else family == self.family

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"port": self.port, "level": self.level, "reason": self.reason}
        out.update({"case": self.case} if self.case else {"family": self.family})
        return out


def load_baseline(path: Path) -> list[BaselineEntry]:
    source = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(source, None, f"cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise CaseError(source, None, f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise CaseError(source, "entries", "a baseline is an object with a list of entries")
    file_port = data.get("port")
    entries = []
    for i, item in enumerate(data["entries"]):
        where = f"entries[{i}]"
        if not isinstance(item, dict):
            raise CaseError(source, where, "must be an object")
        unknown = sorted(set(item) - {"port", "case", "family", "level", "reason"})
        if unknown:
            raise CaseError(source, f"{where}.{unknown[0]}", "is not a baseline field")
        port = item.get("port", file_port)
        if not isinstance(port, str) or not port:
            raise CaseError(source, f"{where}.port", "is missing (set it on the entry or the file)")
        if ("case" in item) == ("family" in item):
            raise CaseError(source, where, "must name exactly one of case or family")
        if item.get("level") not in LEVELS:
            raise CaseError(source, f"{where}.level", f"must be one of {', '.join(LEVELS)}")
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise CaseError(source, f"{where}.reason", "must say why the divergence is expected")
        entries.append(BaselineEntry(port, item["level"], reason, item.get("case"), item.get("family")))
    return entries


def find_entry(entries: list[BaselineEntry], port: str, level: str, name: str, family: str) -> BaselineEntry | None:
    return next((e for e in entries if e.covers(port, level, name, family)), None)


@dataclass
class BaselineVerdict:
    """The table with a ``baseline`` column (expected / new / blank) and the
    entries that covered nothing (stale)."""

    table: pd.DataFrame
    stale: list[BaselineEntry]
    stale_checked: bool

    @property
    def new(self) -> pd.DataFrame:
        return self.table[self.table["baseline"] == NEW]

    @property
    def expected(self) -> pd.DataFrame:
        return self.table[self.table["baseline"] == EXPECTED]

    @property
    def passed(self) -> bool:
        return self.new.empty and not self.stale


def apply_baseline(
    table: pd.DataFrame,
    port: str,
    entries: list[BaselineEntry],
    levels: tuple[str, ...] = LEVELS,
    check_stale: bool = True,
) -> BaselineVerdict:
    """Classify failing rows; ``check_stale`` is off for a single shard, which
    sees only part of what an entry covers (the merge step checks it)."""
    table = table.copy()
    labels: list[str] = []
    used: set[BaselineEntry] = set()
    for row in table.itertuples(index=False):
        if row.status == PARITY:
            labels.append("")
            continue
        entry = None if row.status == ORACLE_ERROR else find_entry(entries, port, row.level, row.name, row.family)
        if entry is None:
            labels.append(NEW)
        else:
            labels.append(EXPECTED)
            used.add(entry)
    table["baseline"] = labels
    table["reason"] = [
        entry.reason if label == EXPECTED and entry is not None else ""
        for label, entry in zip(
            labels,
            (find_entry(entries, port, row.level, row.name, row.family) for row in table.itertuples(index=False)),
            strict=True,
        )
    ]
    stale = [e for e in entries if e.port == port and e.level in levels and e not in used] if check_stale else []
    return BaselineVerdict(table, stale, check_stale)
