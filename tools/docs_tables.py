"""Writes the docs' tables that are declared in the code: each case type's
fields (harness.model.case_fields), between ``<!-- fields:TYPE -->`` and
``<!-- /fields:TYPE -->``, and the registered levels (harness.model.levels),
between ``<!-- levels -->`` and ``<!-- /levels -->``.

    python tools/docs_tables.py           # rewrite the tables
    python tools/docs_tables.py --check   # exit 1 when a table is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.cases.fields import field_table  # noqa: E402
from harness.model import Case, MergeCase, NumericSpec, WorkspaceConfig  # noqa: E402
from harness.model.levels import levels_table  # noqa: E402
from harness.model.sparse import SparseCase, SparseWorkspaceConfig, TopkMaskCase  # noqa: E402

# Each tabled case type, and the page its table is in.
TABLES = {
    "Case": (Case, ROOT / "docs" / "cases.md"),
    "NumericSpec": (NumericSpec, ROOT / "docs" / "cases.md"),
    "MergeCase": (MergeCase, ROOT / "docs" / "cases.md"),
    "WorkspaceConfig": (WorkspaceConfig, ROOT / "docs" / "cases.md"),
    "SparseCase": (SparseCase, ROOT / "docs" / "sparse.md"),
    "SparseWorkspaceConfig": (SparseWorkspaceConfig, ROOT / "docs" / "sparse.md"),
    "TopkMaskCase": (TopkMaskCase, ROOT / "docs" / "sparse.md"),
}


LEVELS_PAGE = ROOT / "docs" / "architecture.md"


def level_rows() -> list[str]:
    """The registered levels, in suite order: the docs' levels table."""
    rows = ["| level | kinds of item | port methods | what it compares |", "|---|---|---|---|"]
    for name, kinds, methods, title in levels_table():
        rows.append(f"| `{name}` | {kinds} | {', '.join(f'`{m}`' for m in methods.split(', '))} | {title} |")
    return rows


def rewritten(text: str, name: str, rows: list[str]) -> str:
    """``text`` with the block named ``name`` (``fields:TYPE`` or ``levels``) holding ``rows``."""
    pattern = re.compile(rf"(<!-- {name} -->\n).*?(<!-- /{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- {name} --> block to write the table into")
    return pattern.sub(lambda m: m.group(1) + "\n".join(rows) + "\n" + m.group(2), text)


def tables() -> list[tuple[Path, str, list[str]]]:
    """Every generated table: its page, its block's name and its rows."""
    found = [(page, f"fields:{name}", field_table(case_type)) for name, (case_type, page) in TABLES.items()]
    return [*found, (LEVELS_PAGE, "levels", level_rows())]


def main(argv: list[str]) -> int:
    stale = []
    for page, name, rows in tables():
        text = page.read_text(encoding="utf-8")
        new = rewritten(text, name, rows)
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if "--check" not in argv:
                page.write_text(new, encoding="utf-8")
    if stale and "--check" in argv:
        print(f"out of date: {', '.join(stale)} (run python tools/docs_tables.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
