"""Near misses: what a misspelt name (an item id, a suite, a level, a port)
most likely meant, for the one-line error that refuses it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the closest of ``known`` to ``word``, or ''
    when none is close (difflib's ratio of at least 0.6)."""
    close = difflib.get_close_matches(word, list(dict.fromkeys(known)), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
