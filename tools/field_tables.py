"""Writes the docs' case-field tables from the fields' declarations
(harness.model.case_fields): each table sits between ``<!-- fields:TYPE -->`` and
``<!-- /fields:TYPE -->`` in a docs page.

    python tools/field_tables.py           # rewrite the tables
    python tools/field_tables.py --check   # exit 1 when a table is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.cases.fields import field_table  # noqa: E402
from harness.model import Case, MergeCase, WorkspaceConfig  # noqa: E402

# Each tabled case type, and the page its table is in.
TABLES = {
    "Case": (Case, ROOT / "docs" / "cases.md"),
    "MergeCase": (MergeCase, ROOT / "docs" / "cases.md"),
    "WorkspaceConfig": (WorkspaceConfig, ROOT / "docs" / "cases.md"),
}


def rewritten(text: str, name: str, rows: list[str]) -> str:
    pattern = re.compile(rf"(<!-- fields:{name} -->\n).*?(<!-- /fields:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- fields:{name} --> block to write the table into")
    return pattern.sub(lambda m: m.group(1) + "\n".join(rows) + "\n" + m.group(2), text)


def main(argv: list[str]) -> int:
    stale = []
    for name, (case_type, page) in TABLES.items():
        text = page.read_text(encoding="utf-8")
        new = rewritten(text, name, field_table(case_type))
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if "--check" not in argv:
                page.write_text(new, encoding="utf-8")
    if stale and "--check" in argv:
        print(f"out of date: {', '.join(stale)} (run python tools/field_tables.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
