"""The coverage targets file (``cases/coverage.json``): its rows
(:class:`Target`), what each target asks of a measured value
(:meth:`Target.met_by`), and loading and checking the file (:func:`load_targets`).

Invariants:

* No partial file passes as a complete one. :func:`load_targets` holds a
  suite's rows to every feature of :data:`harness.search.coverage.FEATURES`:
  each has a target or an explicit ``"report_only": true`` (shown, never
  judged). Nothing is met by default.
* One target per row, of a kind the feature takes (:data:`TARGET_KINDS`); a
  refusal feature (:data:`harness.search.coverage.REFUSAL_FEATURES`) takes
  ``"at_most": 0`` alone.
* Errors name their place. Anything wrong with the file is a
  :class:`~harness.cases.fields.CaseError` naming the file, the row and field
  (or the suite and the feature without a row).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cases.fields import CaseError
from harness.cases.json_input import read_json
from harness.cases.suites import CASES_DIR
from harness.search.coverage import FEATURE_BY_ID, FEATURES, REFUSAL_FEATURES, Value, needs_row
from harness.search.coverage_feature import Feature

TARGETS_FILE = CASES_DIR / "coverage.json"
REPO_ROOT = CASES_DIR.parent

# Each feature kind takes these target keys in a row of the targets file.
TARGET_KINDS: dict[str, tuple[str, ...]] = {
    "max": ("at_least",),
    "min": ("at_most",),
    "count": ("count_at_least", "at_most"),
    "set": ("includes", "distinct_at_least"),
    "histogram": ("buckets_nonzero",),
}

# A row that shows a feature without judging it.
REPORT_ONLY = "report_only"


@dataclass(frozen=True)
class Target:
    """One row of the targets file: ``kind`` is a key of :data:`TARGET_KINDS`'s
    values, ``value`` an int or a list of ints or labels; or ``kind``
    :data:`REPORT_ONLY` (``value`` True): the feature is shown, never judged."""

    feature: str
    description: str
    kind: str
    value: int | list[int] | list[str]

    @property
    def report_only(self) -> bool:
        return self.kind == REPORT_ONLY

    def missing(self, measured: Value) -> list[Any] | None:
        """What ``measured`` lacks to meet this target (empty: met); None for the
        scalar targets, which are met or not."""
        if not isinstance(self.value, list):
            return None
        if self.kind == "includes":
            have: set[Any] = set(measured) if isinstance(measured, list) else set()
            return [v for v in self.value if v not in have]
        counts = measured if isinstance(measured, dict) else {}
        return [v for v in self.value if counts.get(str(v), 0) == 0]

    def met_by(self, measured: Value) -> bool:
        """Whether ``measured`` meets this target (a report-only row meets nothing)."""
        if self.report_only:
            return False
        missing = self.missing(measured)
        if missing is not None:
            return not missing
        assert isinstance(self.value, int)
        if self.kind == "at_most":
            return isinstance(measured, int) and measured <= self.value
        if self.kind == "distinct_at_least":
            return isinstance(measured, list) and len(measured) >= self.value
        return isinstance(measured, int) and measured >= self.value

    def describe(self) -> str:
        if self.report_only:
            return "-"
        symbol = {"at_least": ">=", "at_most": "<=", "count_at_least": ">=", "distinct_at_least": ">= distinct"}
        if isinstance(self.value, int):
            return f"{symbol[self.kind]} {self.value}"
        items = ", ".join(map(str, self.value))
        return f"includes {items}" if self.kind == "includes" else f"nonzero {items}"

    def to_json(self) -> dict[str, Any]:
        return {self.kind: self.value}


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _target_value(source: str, where: str, feature: Feature, kind: str, value: Any) -> int | list[int] | list[str]:
    if kind in ("at_least", "at_most", "count_at_least", "distinct_at_least"):
        least = 0 if kind == "at_most" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise CaseError(source, where, f"must be an integer >= {least}, got {json.dumps(value)}")
        return value
    if not isinstance(value, list) or not value:
        raise CaseError(source, where, f"must be a non-empty list, got {json.dumps(value)}")
    if len(set(map(json.dumps, value))) != len(value):
        raise CaseError(source, where, "lists an item twice")
    if feature.element == "int":
        bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise CaseError(source, where, f"items must be integers >= 1, got {json.dumps(bad[0])}")
        return [int(v) for v in value]
    bad = [v for v in value if not isinstance(v, str) or not v]
    if bad:
        raise CaseError(source, where, f"items must be non-empty strings, got {json.dumps(bad[0])}")
    if feature.labels:
        unknown = [v for v in value if v not in feature.labels]
        if unknown:
            raise CaseError(source, where, f"unknown label {unknown[0]!r} (known: {', '.join(feature.labels)})")
    return [str(v) for v in value]


def _row(source: str, where: str, row: Any, seen: set[str]) -> Target:
    if not isinstance(row, dict):
        raise CaseError(
            source, where, 'a row must be an object with feature, description and one target (or "report_only": true)'
        )
    feature_id = row.get("feature")
    if not isinstance(feature_id, str) or feature_id not in FEATURE_BY_ID:
        raise CaseError(
            source,
            f"{where}.feature",
            f"unknown feature {json.dumps(feature_id)} (see FEATURES in harness/search/coverage.py)",
        )
    if feature_id in seen:
        raise CaseError(source, f"{where}.feature", f"{feature_id} has a row already")
    seen.add(feature_id)
    feature = FEATURE_BY_ID[feature_id]
    description = row.get("description")
    if not isinstance(description, str) or not description.strip():
        raise CaseError(source, f"{where}.description", f"{feature_id}: must be a non-empty string")
    refusal = feature_id in REFUSAL_FEATURES
    allowed = ("at_most",) if refusal else (*TARGET_KINDS[feature.kind], REPORT_ONLY)
    kinds = [k for k in row if k not in ("feature", "description")]
    unknown = [k for k in kinds if k not in allowed]
    if unknown or len(kinds) != 1:
        field_name = f"{where}.{unknown[0]}" if unknown else where
        raise CaseError(
            source, field_name, f"{feature_id} ({feature.kind}) takes exactly one target of: {', '.join(allowed)}"
        )
    kind = kinds[0]
    if kind == REPORT_ONLY:
        if row[kind] is not True:
            raise CaseError(source, f"{where}.{kind}", f"must be true, got {json.dumps(row[kind])}")
        return Target(feature_id, description.strip(), kind, True)
    value = _target_value(source, f"{where}.{kind}", feature, kind, row[kind])
    if refusal and value != 0:
        # A refused input covers nothing: one is already too many.
        raise CaseError(source, f"{where}.{kind}", f"{feature_id} counts refused inputs: its target is at_most 0")
    return Target(feature_id, description.strip(), kind, value)


def load_targets(path: Path = TARGETS_FILE, suites: Collection[str] | None = None) -> dict[str, tuple[Target, ...]]:
    """The targets file: ``{suite: [row, ...]}``, or ``{suite: {"same_as": other}}``
    for a suite held to another's rows. A row is ``{"feature": id, "description":
    text, <target>: value}`` with one target of :data:`TARGET_KINDS` for the
    feature's kind, or ``"report_only": true`` (the description says why it is
    not a target); a refusal feature (:data:`REFUSAL_FEATURES`) takes
    ``"at_most": 0`` alone. Every suite with rows has one for every feature of
    :data:`FEATURES` whose level holds its features to rows (:func:`needs_row`).
    ``suites``: the known suite names, checked when given.
    Anything wrong is a :class:`CaseError` naming the file, the row and field
    (or the suite and the feature without a row)."""
    source = display_path(path)
    data = read_json(path, source)
    if not isinstance(data, dict):
        raise CaseError(source, None, "must be an object mapping suite names to rows")
    targets: dict[str, tuple[Target, ...]] = {}
    aliases: dict[str, str] = {}
    for suite, rows in data.items():
        if suites is not None and suite not in suites:
            raise CaseError(source, suite, f"no suite named {suite!r} (known: {', '.join(sorted(suites))})")
        if isinstance(rows, dict) and set(rows) == {"same_as"} and isinstance(rows["same_as"], str):
            aliases[suite] = rows["same_as"]
            continue
        if not isinstance(rows, list) or not rows:
            raise CaseError(source, suite, 'must be a non-empty list of rows, or {"same_as": "<suite>"}')
        seen: set[str] = set()
        targets[suite] = tuple(_row(source, f"{suite}[{i}]", row, seen) for i, row in enumerate(rows))
        without_row = [f.id for f in FEATURES if f.id not in seen and needs_row(f.id)]
        if without_row:
            raise CaseError(
                source,
                None,
                f'suite {suite!r}: feature {without_row[0]!r} has no row (give a target or "{REPORT_ONLY}": true)',
            )
    for suite, other in aliases.items():
        if other not in targets:
            raise CaseError(source, f"{suite}.same_as", f"{other!r} is not a suite with rows in this file")
        targets[suite] = targets[other]
    return targets
