"""Judging coverage: each feature of a :class:`~harness.search.coverage.CoverageReport`
against its target row (:func:`judge`), the judged result
(:class:`JudgedCoverage`) and its JSON form, and the night's coverage
(:func:`nightly_coverage`).

Invariants:

* Nothing is met by default. A feature is ``met`` only when its row's target is;
  a feature without a row, or with a report-only row, is shown and never judged.
* Refusals always count. A refusal feature without an ``at_most: 0`` row is
  judged by the built-in rule (:data:`REFUSAL_RULE`), so a refusal is MISSED
  whatever rows are given.
* Stable JSON. :meth:`JudgedCoverage.to_json` is deterministic, and
  :meth:`JudgedCoverage.from_json` reads it back (a sharded night is put
  together from its shards' JSON).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cases.suites import Suite
from harness.protocol.port import Port
from harness.search.coverage import FEATURE_BY_ID, FEATURES, REFUSAL_FEATURES, CoverageReport, Value, beyond
from harness.search.coverage_measuring import measure
from harness.search.coverage_targets import TARGETS_FILE, Target, display_path, load_targets

# The description of a refusal feature judged without an ``at_most: 0`` row of its own.
REFUSAL_RULE = "built-in: a refused input covers nothing, so any refusal fails coverage"


@dataclass(frozen=True)
class Verdict:
    feature: str
    description: str
    measured: Value
    target: Target | None = None
    met: bool | None = None  # None: no row, or a report-only row
    missing: list[Any] | None = None
    builtin: bool = False  # judged by the refusal rule, not by a row of the file


@dataclass(frozen=True)
class JudgedCoverage:
    """A suite's coverage against its targets; :meth:`to_json` is deterministic."""

    suite: str
    targets_file: str
    verdicts: tuple[Verdict, ...] = field(default=())

    @property
    def targets(self) -> int:
        return sum(v.met is not None for v in self.verdicts)

    @property
    def rows(self) -> int:
        """The verdicts that come from rows of the targets file (report-only ones too)."""
        return sum(v.target is not None and not v.builtin for v in self.verdicts)

    @property
    def missed(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.met is False]

    def to_json(self) -> dict[str, Any]:
        features = []
        for v in sorted(self.verdicts, key=lambda v: v.feature):
            row: dict[str, Any] = {
                "feature": v.feature,
                "description": v.description,
                "measured": v.measured,
                "target": v.target.to_json() if v.target else None,
                "verdict": verdict_word(v),
            }
            if v.builtin:
                row["builtin"] = True
            feature = FEATURE_BY_ID.get(v.feature)
            if feature is not None and feature.widths and isinstance(v.measured, int):
                row["beyond"] = beyond(v.measured)
            if v.missing:
                row["missing"] = v.missing
            features.append(row)
        return {
            "suite": self.suite,
            "targets_file": self.targets_file,
            "targets": self.targets,
            "met": self.targets - len(self.missed),
            "missed": len(self.missed),
            "features": features,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JudgedCoverage:
        verdicts = []
        for row in data["features"]:
            target = None
            if row["target"]:
                ((kind, value),) = row["target"].items()
                target = Target(row["feature"], row["description"], kind, value)
            met = {"met": True, "MISSED": False}.get(row["verdict"])
            verdicts.append(
                Verdict(
                    row["feature"],
                    row["description"],
                    row["measured"],
                    target,
                    met,
                    row.get("missing"),
                    bool(row.get("builtin", False)),
                )
            )
        order = {f.id: i for i, f in enumerate(FEATURES)}
        verdicts.sort(key=lambda v: order.get(v.feature, len(order)))
        return cls(data["suite"], data["targets_file"], tuple(verdicts))


def verdict_word(verdict: Verdict) -> str | None:
    if verdict.met is None:
        return "report only" if verdict.target is not None and verdict.target.report_only else None
    return "met" if verdict.met else "MISSED"


def judge(
    report: CoverageReport, targets: Sequence[Target], targets_file: str = "cases/coverage.json"
) -> JudgedCoverage:
    """Each feature of ``report`` with its target row, if any, met or MISSED; a
    report-only row is shown, not judged. A refusal feature without an
    ``at_most: 0`` row is judged by the built-in rule (:data:`REFUSAL_RULE`),
    so a refusal is MISSED whatever rows are given."""
    by_feature = {t.feature: t for t in targets}
    verdicts = []
    for feature in FEATURES:
        measured = report.values[feature.id]
        target = by_feature.get(feature.id)
        builtin = feature.id in REFUSAL_FEATURES and (target is None or (target.kind, target.value) != ("at_most", 0))
        if builtin:
            target = Target(feature.id, REFUSAL_RULE, "at_most", 0)
        if target is None:
            verdicts.append(Verdict(feature.id, feature.description, measured))
            continue
        if target.report_only:
            verdicts.append(Verdict(feature.id, target.description, measured, target))
            continue
        missing = target.missing(measured)
        verdicts.append(
            Verdict(feature.id, target.description, measured, target, target.met_by(measured), missing or None, builtin)
        )
    return JudgedCoverage(report.suite, targets_file, tuple(verdicts))


def nightly_coverage(suite: Suite, oracle: Port, path: Path = TARGETS_FILE) -> JudgedCoverage:
    """The coverage of the night's suite, judged against its rows when the
    targets file has some (none: every feature shown, only refusals judged)."""
    targets = load_targets(path)
    return judge(measure(suite, oracle), targets.get(suite.name, ()), display_path(path))


def write_json(judged: JudgedCoverage, out: Path) -> None:
    write_json_document(judged.to_json(), out)


def write_json_document(document: dict[str, Any], out: Path) -> None:
    """``document`` as stable JSON (keys sorted) at ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
