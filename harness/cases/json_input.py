"""Reading the JSON a user hands the harness (case and item files, baselines,
results files, the metadata of output folders): every reader goes through
here, so every one refuses a bad file the same way, in one line naming the
file and, for a syntax error, its line and column
(``FILE: malformed JSON at line L column C: REASON``); never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.cases.fields import CaseError


def syntax_reason(exc: json.JSONDecodeError, first_line: int = 1) -> str:
    """Where and why ``exc`` stopped the parse; ``first_line`` is the file's line
    the parsed text starts on (a line of a JSON-lines file)."""
    return f"malformed JSON at line {first_line + exc.lineno - 1} column {exc.colno}: {exc.msg}"


def parse_json(text: str, source: str, first_line: int = 1, what: str = "") -> Any:
    """``text`` parsed; a syntax error is a :class:`CaseError` naming ``source``,
    the line and the column (``what``, when given, is added: what the file
    should have been)."""
    suffix = f" ({what})" if what else ""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaseError(source, None, syntax_reason(exc, first_line) + suffix) from None
    except RecursionError:
        raise CaseError(source, None, f"JSON nested too deeply to read{suffix}") from None


def read_text(path: Path, source: str | None = None) -> str:
    """The UTF-8 text of ``path``; a file that cannot be read is a one-line :class:`CaseError`."""
    source = str(path) if source is None else source
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CaseError(source, None, f"cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise CaseError(source, None, "is not UTF-8 text") from None


def read_json(path: Path, source: str | None = None, what: str = "") -> Any:
    """The JSON document in ``path`` (see :func:`parse_json`); ``source`` names
    it in errors (default: the path as given)."""
    source = str(path) if source is None else source
    return parse_json(read_text(path, source), source, what=what)
