"""The README, docs/ and the ports' READMEs name only what exists: every file
path, module, module attribute and relative link they mention resolves in this
tree, so a page cannot drift from the code it describes when the code moves;
and no link leaves the repository (a clone read offline, or elsewhere, has no
dead link, and what the code follows is written here, in docs/contract.md)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("ports/*/README.md"))]
TOP = ("harness", "oracle", "ports", "reports", "benchmarks", "tools", "cases", "tests", "examples", "docs")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[\w./-]*\w)")
DOTTED = re.compile(r"(?<![\w./-])((?:harness|oracle|ports|reports|benchmarks)(?:\.\w+)+)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# Paths a page names as what a run writes (git-ignored outputs), or as a pattern.
GENERATED = re.compile(r"reports/(out|nightly|\d{4}|history|<)|<|\*|\.gpu/|build/|vllm-X|/x\.json")


def mentions(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return sorted(
        {(str(page.relative_to(ROOT)), m.group(1)) for page in PAGES for m in pattern.finditer(page.read_text())}
    )


@pytest.mark.parametrize(("page", "path"), mentions(PATH))
def test_every_path_named_exists(page: str, path: str) -> None:
    if GENERATED.search(path):
        pytest.skip("a generated output or a pattern")
    assert (ROOT / path.rstrip(".")).exists(), f"{page} names {path}, which does not exist"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize(("page", "dotted"), mentions(DOTTED))
def test_every_module_named_resolves(page: str, dotted: str) -> None:
    assert _resolves(dotted), f"{page} names {dotted}, which no module or attribute of this tree is"


# Any address out of the repository, as a link, a bare URL, an autolink or a reference definition.
ADDRESS = re.compile(r"((?:https?|ftp|mailto):[^\s)>\]`'\"]+)")


@pytest.mark.parametrize("page", [str(page.relative_to(ROOT)) for page in PAGES])
def test_no_page_points_out_of_the_repository(page: str) -> None:
    found = ADDRESS.findall((ROOT / page).read_text(encoding="utf-8"))
    assert not found, f"{page} points out of the repository: {found}"


@pytest.mark.parametrize(("page", "target"), mentions(LINK))
def test_every_relative_link_resolves(page: str, target: str) -> None:
    assert "://" not in target and not target.startswith("mailto:"), f"{page} links out of the repository: {target}"
    assert (ROOT / page).parent.joinpath(target).exists(), f"{page} links to {target}, which does not exist"
