"""docs/commands.md is true to the parser: its reference section is written
from it (tools/docs_tables.py; tests/test_toy_field.py fails when stale), so
every option and choice is there, and every option its prose names is one some
command (or the pytest plugin) has."""

from __future__ import annotations

import re
from pathlib import Path

from harness.cli import build_parser
from harness.pytest_plugin import OPTIONS_NEEDING_A_SUITE, SUITE_OPTION

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "commands.md"


def _options() -> set[str]:
    import argparse

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = {o for a in parser._actions for o in a.option_strings}
    for command in sub.choices.values():
        found |= {o for a in command._actions for o in a.option_strings}
    return found


def test_every_option_and_choice_is_in_the_reference() -> None:
    import argparse

    text = PAGE.read_text(encoding="utf-8")
    reference = text[text.index("<!-- commands -->") :]
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        assert f"### `parity {name}`" in reference
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # every command's -h
            for option in action.option_strings:
                assert f"`{option}`" in reference, option
            for choice in action.choices or ():
                assert f"`{choice}`" in reference, (name, choice)


def test_the_prose_names_no_option_that_does_not_exist() -> None:
    text = PAGE.read_text(encoding="utf-8")
    prose = text[: text.index("<!-- commands -->")]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", prose))
    # The pytest plugin's options, and pytest's and pip's own that the page shows beside them.
    known = _options() | set(OPTIONS_NEEDING_A_SUITE) | {SUITE_OPTION, "--junitxml"}
    assert sorted(named - known) == []


def test_the_ci_item_count_the_recipe_gives_is_the_suites() -> None:
    """docs/gate-your-own-port.md states how many items the ci gate compares: the suite's count, every level."""
    from harness.cases.suites import load_suite
    from harness.model.levels import LEVELS
    from harness.sides.runner import count_items

    count = count_items(load_suite("ci"), tuple(LEVELS))
    assert f"the CI gate runs ({count:,} items" in (ROOT / "docs" / "gate-your-own-port.md").read_text()


def test_the_nightly_item_counts_by_size_are_the_suites() -> None:
    """docs/nightly.md's table of a night's items per --size: the counts `parity list cases` prints."""
    from harness.cases.suites import load_suite
    from harness.model.levels import LEVELS
    from harness.sides.runner import count_items

    text = (ROOT / "docs" / "nightly.md").read_text(encoding="utf-8")
    sizes_row = re.search(r"^\| `--size` \|(.*)\|$", text, re.MULTILINE)
    items_row = re.search(r"^\| items \|(.*)\|$", text, re.MULTILINE)
    assert sizes_row and items_row
    sizes = [int(cell.strip().replace(",", "")) for cell in sizes_row[1].split("|")]
    stated = [int(cell.strip().replace(",", "")) for cell in items_row[1].split("|")]
    assert stated == [count_items(load_suite("nightly", size=size), tuple(LEVELS)) for size in sizes]
