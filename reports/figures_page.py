"""Figures written into the documentation by the run that measures them.

A page holds each run's figures between two markers::

    <!-- figures:NAME -->
    ...written by the run...
    <!-- /figures:NAME -->

:func:`write_figures` replaces what lies between them and nothing else, so a
figure on a page is always the last run's, with the command, date and commit
it came from, never a number copied by hand. A page without the markers is
refused (the run names the page and the block), never appended to.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

FIGURES_PAGE = Path(__file__).resolve().parents[1] / "docs" / "figures.md"


class FiguresPageError(Exception):
    """The page lacks the block's markers; the message names both."""


def block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- figures:{re.escape(name)} -->\n)(.*?)(<!-- /figures:{re.escape(name)} -->)", re.S)


def write_figures(name: str, markdown: str, command: str, commit: str | None, page: Path = FIGURES_PAGE) -> None:
    """Put ``markdown`` between ``name``'s markers on ``page``, under a line
    saying which command wrote it, when and on which commit."""
    text = page.read_text(encoding="utf-8")
    pattern = block_pattern(name)
    if pattern.search(text) is None:
        raise FiguresPageError(f"{page}: no <!-- figures:{name} --> ... <!-- /figures:{name} --> block to write")
    today = datetime.date.today().isoformat()
    stamp = f"_Written by `{command}` on {today}, commit {commit or 'unknown'}._\n\n"
    body = stamp + markdown.strip("\n") + "\n"
    page.write_text(pattern.sub(lambda m: m.group(1) + body + m.group(3), text, count=1), encoding="utf-8")


def read_figures(name: str, page: Path = FIGURES_PAGE) -> str:
    """What ``name``'s block on ``page`` holds now ('' when it has no block)."""
    found = block_pattern(name).search(page.read_text(encoding="utf-8"))
    return found.group(2) if found else ""
