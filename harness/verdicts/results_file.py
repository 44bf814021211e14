"""Results written as they are computed: one JSON line per item.

The first line is a header naming the run (:data:`HEADER_KEYS`: a digest of
the item list, suite, levels, size, shard, port spec and name, device, pin,
drift flag, harness version, commit and source digest); every other line is one row of the results
table (:mod:`harness.verdicts.summary`), flushed as soon as the item finishes, so a run
killed even by SIGKILL leaves a readable file, and ``--resume`` finishes it by
skipping the items it holds. Rows carry no timings: the same run gives the same
bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import IO, Any

from harness.cases.fields import CaseError
from harness.cases.json_input import parse_json, read_text


def read_rows(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The header and the complete rows; a torn last line (a kill mid-write) is dropped."""
    header: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = []
    text = read_text(path)
    lines = text.split("\n")
    complete = lines if text.endswith("\n") else lines[:-1]
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        record = parse_json(line, str(path), first_line=number, what="not a results file")
        if not isinstance(record, dict):
            raise CaseError(str(path), f"line {number}", "is not a JSON object: not a results file")
        if "header" in record:
            header = record["header"]
        else:
            rows.append(record)
    return header, rows


def items_digest(item_ids: list[str]) -> str:
    """SHA-256 of the ordered item ids a run compares: two runs with the same
    digest compare the same items, whatever the case files were called."""
    return hashlib.sha256("\n".join(item_ids).encode("utf-8")).hexdigest()


# Who computed a run's items and with what: every shard of one gate run, and
# a resumed results file, must agree on all of it (a mismatch is named in this order).
RUN_IDENTITY = (
    "suite",
    "port",
    "port_spec",
    "levels",
    "size",
    "device",
    "pin",
    "oracle_drift_overridden",
    "harness_version",
    "harness_commit",
    "harness_sources",
    "items",
    "items_digest",
)
# A results file holds one shard's items: the item list first, then the rest.
HEADER_KEYS = tuple(dict.fromkeys(("items_digest", "items", *RUN_IDENTITY, "shard")))


class ResultsWriter:
    """Appends rows to a results file, or starts one; checks a resumed run's header.

    Resumed rows are keyed by item id, never by position: every row must name an
    item of this run, once; and the header must match this run's on every key of
    :data:`HEADER_KEYS` (the item-list digest, the harness's version and commit,
    the pin, the drift flag, the device and the port spec among them). Anything
    else is refused with one line naming the first key that differs.
    """

    def __init__(self, path: Path, header: dict[str, Any], resume: bool, item_ids: list[str]) -> None:
        self.path = path
        self.done: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.exists():
            found, self.done = read_rows(path)
            self._check_header(found or {}, header)
            self._check_rows(item_ids)
            # Rewrite without a torn tail so appends start on a fresh line.
            self._out: IO[str] = path.open("w", encoding="utf-8")
            self._line({"header": header})
            for row in self.done:
                self._line(row)
        else:
            self._out = path.open("w", encoding="utf-8")
            self._line({"header": header})

    def _check_header(self, found: dict[str, Any], header: dict[str, Any]) -> None:
        for key in (*HEADER_KEYS, *sorted(set(header) | set(found))):
            if found.get(key) != header.get(key):
                raise CaseError(
                    str(self.path),
                    f"header.{key}",
                    f"is {found.get(key)!r} but this run has {header.get(key)!r}: "
                    "written by another run, refusing to resume it",
                )

    def _check_rows(self, item_ids: list[str]) -> None:
        known, seen = set(item_ids), set()
        for number, row in enumerate(self.done, start=2):
            item = row.get("id")
            if item not in known:
                raise CaseError(str(self.path), f"line {number}", f"row {item!r} is not an item of this run")
            if item in seen:
                raise CaseError(str(self.path), f"line {number}", f"row {item!r} appears twice")
            seen.add(item)

    @property
    def done_ids(self) -> frozenset[str]:
        return frozenset(str(row["id"]) for row in self.done)

    def _line(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record, sort_keys=True) + "\n")
        self._out.flush()

    def write(self, row: dict[str, Any]) -> None:
        self._line(row)

    def close(self) -> None:
        self._out.close()
