"""Results written as they are computed: one JSON line per item.

The first line is a header naming the run (suite, port, levels, size, shard,
and the device when it is not cpu); every other line is one row of the results
table (:mod:`harness.summary`), flushed as soon as the item finishes, so a run
killed even by SIGKILL leaves a readable file, and ``--resume`` finishes it by
skipping the items it holds. Rows carry no timings: the same run gives the same
bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from harness.cases import CaseError


def read_rows(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The header and the complete rows; a torn last line (a kill mid-write) is dropped."""
    header: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    complete = lines if text.endswith("\n") else lines[:-1]
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise CaseError(str(path), f"line {number}", "is not JSON: not a results file") from None
        if "header" in record:
            header = record["header"]
        else:
            rows.append(record)
    return header, rows


class ResultsWriter:
    """Appends rows to a results file, or starts one; checks a resumed run's header."""

    def __init__(self, path: Path, header: dict[str, Any], resume: bool) -> None:
        self.path = path
        self.done: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.exists():
            found, self.done = read_rows(path)
            if found != header:
                raise CaseError(str(path), "header", f"was written by another run ({found}), not {header}")
            # Rewrite without a torn tail so appends start on a fresh line.
            self._out: IO[str] = path.open("w", encoding="utf-8")
            self._line({"header": header})
            for row in self.done:
                self._line(row)
        else:
            self._out = path.open("w", encoding="utf-8")
            self._line({"header": header})

    @property
    def done_indices(self) -> frozenset[int]:
        return frozenset(int(row["index"]) for row in self.done)

    def _line(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record, sort_keys=True) + "\n")
        self._out.flush()

    def write(self, row: dict[str, Any]) -> None:
        self._line(row)

    def close(self) -> None:
        self._out.close()
