"""Writes the docs' tables that are declared in the code: each case type's
fields (harness.model.case_fields), between ``<!-- fields:TYPE -->`` and
``<!-- /fields:TYPE -->``, the registered levels (harness.model.levels),
between ``<!-- levels -->`` and ``<!-- /levels -->``, and every command's
options as its parser declares them (harness.cli), between ``<!-- commands -->``
and ``<!-- /commands -->`` in docs/commands.md.

    python tools/docs_tables.py           # rewrite the tables
    python tools/docs_tables.py --check   # exit 1 when a table is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402

from harness.cases.fields import field_table  # noqa: E402
from harness.cli import build_parser  # noqa: E402
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
COMMANDS_PAGE = ROOT / "docs" / "commands.md"


def level_rows() -> list[str]:
    """The registered levels, in suite order: the docs' levels table."""
    rows = ["| level | kinds of item | port methods | what it compares |", "|---|---|---|---|"]
    for name, kinds, methods, title in levels_table():
        rows.append(f"| `{name}` | {kinds} | {', '.join(f'`{m}`' for m in methods.split(', '))} | {title} |")
    return rows


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _takes(action: argparse.Action) -> str:
    if action.choices is not None:
        return ", ".join(f"`{c}`" for c in action.choices)
    if action.nargs == 0:
        return "(a flag)"
    word = _cell(str(action.metavar or action.dest.upper()))
    return f"`{word} ...`" if action.nargs in ("+", "*") else f"`{word}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, [], ()):
        return ""
    return f"`{action.default}`"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Each ``parity`` subcommand's parser, in the order ``parity --help`` lists them."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def command_rows() -> list[str]:
    """Every subcommand and its options, as the parser declares them: docs/commands.md's reference."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
    rows: list[str] = []
    for name, command in sub.choices.items():
        rows += [f"### `parity {name}`", "", _cell(helps.get(name, "")), ""]
        rows += ["| option | takes | default | what |", "|---|---|---|---|"]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            option = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
            what = _cell((action.help or "") % {"default": action.default} if action.help else "")
            rows.append(f"| {option} | {_takes(action)} | {_default(action)} | {what} |")
        rows.append("")
    return rows[:-1]


def rewritten(text: str, name: str, rows: list[str]) -> str:
    """``text`` with the block named ``name`` (``fields:TYPE`` or ``levels``) holding ``rows``."""
    pattern = re.compile(rf"(<!-- {name} -->\n).*?(<!-- /{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- {name} --> block to write the table into")
    return pattern.sub(lambda m: m.group(1) + "\n".join(rows) + "\n" + m.group(2), text)


def tables() -> list[tuple[Path, str, list[str]]]:
    """Every generated table: its page, its block's name and its rows."""
    found = [(page, f"fields:{name}", field_table(case_type)) for name, (case_type, page) in TABLES.items()]
    return [*found, (LEVELS_PAGE, "levels", level_rows()), (COMMANDS_PAGE, "commands", command_rows())]


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
