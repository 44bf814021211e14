"""Two runs of the same items, compared field for field: what a refactor that
changes no behaviour must leave identical.

    python tools/compare_runs.py BEFORE AFTER [BEFORE AFTER ...]

Each pair is two ``parity run --json`` files or two ``--results`` files (JSON
lines). Compared: the item ids in order, every item's status, and every field
of every item (``--json``'s ``cases``, the results file's rows) and of the
summary, values by type and key order too. Left out, and said so: the fields that name the harness's sources
(its commit and source digest: a refactor changes them by definition) and the
run's timing. Prints one line per pair and each difference; exit 1 when any.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# What two runs of different harness sources always differ in.
SOURCE_FIELDS = frozenset({"harness_commit", "harness_sources", "harness_version"})
TIMING_FIELDS = frozenset({"seconds", "elapsed_s", "started", "finished", "wall_s"})
SHOWN = 8


def _read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(everything but the items, the items in order) of a --json or --results file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        head = {k: v for line in lines if "header" in line for k, v in line["header"].items()}
        return head, [line for line in lines if "header" not in line]
    data = json.loads(text)
    return {k: v for k, v in data.items() if k != "cases"}, data["cases"]


def _item_id(row: dict[str, Any]) -> str:
    return str(row.get("id") or f"{row['name']}[{row['kind']}]")


def _differences(before: Any, after: Any, where: str) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        order = [[k for k in keys if k not in SOURCE_FIELDS | TIMING_FIELDS] for keys in (before, after)]
        if order[0] != order[1] and set(order[0]) == set(order[1]):
            found.append(f"{where}: key order {order[0]} -> {order[1]}")
        for key in sorted(set(before) | set(after)):
            if key in SOURCE_FIELDS or key in TIMING_FIELDS:
                continue
            if key not in after or key not in before:
                found.append(f"{where}.{key}: only {'before' if key in before else 'after'}")
            else:
                found += _differences(before[key], after[key], f"{where}.{key}")
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [
            d for i, (a, b) in enumerate(zip(before, after, strict=True)) for d in _differences(a, b, f"{where}[{i}]")
        ]
    return [] if before == after and type(before) is type(after) else [f"{where}: {before!r:.80} -> {after!r:.80}"]


def compare(before_path: Path, after_path: Path) -> list[str]:
    before_head, before_items = _read(before_path)
    after_head, after_items = _read(after_path)
    before_ids, after_ids = [_item_id(r) for r in before_items], [_item_id(r) for r in after_items]
    if before_ids != after_ids:
        return [f"item ids differ: {len(before_ids)} before, {len(after_ids)} after"]
    found = _differences(before_head, after_head, "run")
    for item, a, b in zip(before_ids, before_items, after_items, strict=True):
        found += _differences(a, b, item)
    statuses = sum(1 for a, b in zip(before_items, after_items, strict=True) if a["status"] != b["status"])
    columns = len({key for row in before_items for key in row})
    print(
        f"{before_path.name} vs {after_path.name}: {len(before_ids)} items in the same order, "
        f"{statuses} statuses differ, {columns} columns compared, {len(found)} differences"
    )
    return found


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    found = []
    for before, after in zip(argv[::2], argv[1::2], strict=True):
        found += compare(Path(before), Path(after))
    for line in found[:SHOWN]:
        print(f"  {line}")
    if len(found) > SHOWN:
        print(f"  ... and {len(found) - SHOWN} more")
    print(f"left out of every comparison: {', '.join(sorted(SOURCE_FIELDS | TIMING_FIELDS))}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
