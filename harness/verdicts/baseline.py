"""Expected divergences: the baseline a port's gate is held to.

A baseline entry is a precise expectation, never a family-wide amnesty. A file
lists what a port is known to get wrong, each entry with the status it expects,
the size it may reach, and why::

    {
      "port": "equal_share",
      "oracle": "vllm==0.28.0",
      "entries": [
        {"family": "skew", "level": "layout", "status": "divergent",
         "field": "num_context_tokens", "reason": "the legacy grid cuts other chunks"},
        {"family": "skew", "level": "prefill", "status": "divergent",
         "max_ulp": 12, "max_mismatch_fraction": 0.0031, "reason": "..."},
        {"case": "smoke-upstream-worst-case", "level": "layout", "status": "port-error",
         "error": "ValueError: ...", "items": 1, "reason": "..."}
      ]
    }

Fields of an entry:

- exactly one of ``case`` (an item name) or ``family``;
- ``level``: layout, merge or prefill (workspace items are layout, family
  ``workspace-size``);
- ``status``: ``divergent`` or ``port-error``, or ``oracle-error`` in a
  baseline of another release than the pin (an item the port did not run is
  never expected, and neither is the pinned oracle failing);
- ``reason``: why, as measured (a non-empty string);
- ``port``: per entry, else the file's;
- for ``divergent`` at merge or prefill, both caps are required: ``max_ulp``
  (an int >= 0, the item's largest ULP distance over its tensors) and
  ``max_mismatch_fraction`` (in (0, 1]: the item's mismatched elements over its
  compared elements, both summed over its tensors, i.e. the results table's
  ``mismatches / elements``);
- for ``divergent`` at layout, optionally ``field``: the first divergent field
  the item must report (``num_chunks``, ``request_start``, ``workspace_size``);
- for ``port-error`` and ``oracle-error``, ``items`` is required: the number
  of items of the entry's family or case that fail so, exactly (a port or an
  oracle that came to fail more batches, or fewer, fails the gate: an error is
  an item not compared; :mod:`harness.verdicts.judge`);
- for ``port-error``, optionally ``error``: a substring the error text must hold;
  for ``oracle-error``, ``error`` is required: the class of refusal exactly as
  the release states it (``vllm==0.27.1`` refuses whole classes of batches the
  new planner plans; each class is named, never "any oracle error": only a
  refusal matches, never the oracle's process failing).

The file's ``oracle`` (default: the pinned release) is the release the
baseline was measured against: a gate refuses a baseline of another oracle
than the one it runs (:func:`check_baseline_oracle`), since what one release
gets wrong says nothing about another.

No other field is allowed, and a field that does not apply to the entry's
status and level (a cap on a layout entry, ``field`` on a port error) is bad
input: a baseline says exactly what it expects or it is refused.

Judgement of one failing item (:func:`judge_item`, shared by the gate, ``parity
merge`` and the pytest plugin, so they can never disagree):

- an entry *covers* the item when its port is one of the names of the port
  under test (its ``name``, or the ``--port`` spelling), and its level and case
  or family are the item's; where a case entry covers the item, only case
  entries judge it (the family's cannot loosen its case's caps), else the
  family entries do, in file order;
- a covering entry *matches* when its status is the item's and its ``field`` or
  ``error`` (if given) hold;
- the item is *expected* when a matching entry's caps hold too. Otherwise it is
  *new*, and the verdict says why (``beyond baseline: 30298 ULP > cap 8 (...)``,
  ``status port-error, the baseline expects divergent``, ``not in the
  baseline``).

An entry that matches no failing item (caps aside: an item beyond its caps is
reported as new, not the entry as gone) is *stale* and fails the gate too, so a
baseline cannot rot: a fixed divergence leaves the baseline with its fix. An
error entry's items beyond its count are new; fewer make it miscounted.

:func:`load_baseline` is a pure parser of the file. :func:`check_baseline_targets`
checks its entries against the suite and the port before anything runs: an
entry naming a case or family the suite does not have at that level, or a port
that is neither the one under test nor a known spelling, is bad input (exit 2),
never "stale".
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.cases.fields import CaseError
from harness.cases.json_input import read_json
from harness.compare.ulp_text import ulp_text
from harness.model.levels import FLOAT_LEVELS, HOST_LEVELS, TextEnum
from harness.sides.items import DIVERGENT, LEVELS, NOT_RUN, ORACLE_ERROR, PARITY, PORT_ERROR, level_of

if TYPE_CHECKING:
    from harness.cases.suites import Suite


class Label(TextEnum):
    """What the baseline makes of a failing item (expected, new) or of an entry
    no item matched (stale)."""

    EXPECTED = "expected"
    NEW = "new"
    STALE = "stale"


EXPECTED, NEW, STALE = Label
# The statuses an entry may expect; anything else an item can be is never expected.
# An oracle error only in a baseline of a release other than the pin.
ENTRY_STATUSES = (DIVERGENT, PORT_ERROR, ORACLE_ERROR)
NUMERIC_LEVELS = FLOAT_LEVELS
# The levels whose divergences name a first divergent field (a baseline entry may too).
FIELD_LEVELS = HOST_LEVELS
_FIELDS = {
    "port", "case", "family", "level", "status", "reason", "max_ulp", "max_mismatch_fraction", "field", "error",
    "items",
}  # fmt: skip


def pinned_release() -> str:
    """The pinned oracle's ``vllm==X`` (a baseline's default ``oracle``)."""
    from oracle.pin import load_pin

    return str(load_pin()["release"])


# ``Divergence.message()`` (harness/compare/dense.py) starts "chunk N, field F: ..." or
# "field F: ...": the first divergent field of a layout or workspace item.
_FIELD_RE = re.compile(r"^(?:chunk \d+, )?field (\w+):")


@dataclass(frozen=True)
class BaselineEntry:
    """One expectation. Invariants (enforced by :func:`load_baseline`): exactly
    one of ``case``/``family``; ``status`` in :data:`ENTRY_STATUSES`; caps set
    exactly for divergent merge/prefill entries; ``field`` only on divergent
    layout entries; ``error`` only on port-error and oracle-error entries, and
    required on the latter, which only a baseline of another release than the
    pin holds; ``items`` exactly on those two. ``oracle`` is the file's."""

    port: str
    level: str
    reason: str
    status: str = DIVERGENT
    case: str | None = None
    family: str | None = None
    max_ulp: int | None = None
    max_mismatch_fraction: float | None = None
    field: str | None = None
    error: str | None = None
    items: int | None = None
    oracle: str = ""
    # Where the entry came from, for error messages only (not part of its identity).
    source: str = dataclasses.field(default="", compare=False)
    position: int = dataclasses.field(default=-1, compare=False)

    @property
    def label(self) -> str:
        target = f"case {self.case}" if self.case else f"family {self.family}"
        at = f" at {self.field}" if self.field else ""
        return f"{self.port} {target} [{self.level}] {self.status}{at}"

    @property
    def where(self) -> str:
        return f"entries[{self.position}]"

    def covers(self, ports: Collection[str], level: str, name: str, family: str) -> bool:
        """The entry is about this item (port, level and case or family), whatever its status."""
        if self.port not in ports or self.level != level:
            return False
        return name == self.case if self.case else family == self.family

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"port": self.port}
        out.update({"case": self.case} if self.case else {"family": self.family})
        out.update({"level": self.level, "status": self.status})
        for key in ("max_ulp", "max_mismatch_fraction", "field", "error", "items"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["reason"] = self.reason
        return out


# -- parsing -------------------------------------------------------------------------------


def _nonempty_str(source: str, where: str, value: Any, why: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CaseError(source, where, why)
    return value


def _parse_entry(source: str, i: int, item: Any, file_port: Any, oracle: str) -> BaselineEntry:
    where = f"entries[{i}]"
    if not isinstance(item, dict):
        raise CaseError(source, where, "must be an object")
    unknown = sorted(set(item) - _FIELDS)
    if unknown:
        raise CaseError(source, f"{where}.{unknown[0]}", "is not a baseline field")
    port = item.get("port", file_port)
    if not isinstance(port, str) or not port:
        raise CaseError(source, f"{where}.port", "is missing (set it on the entry or the file)")
    if ("case" in item) == ("family" in item):
        raise CaseError(source, where, "must name exactly one of case or family")
    target = "case" if "case" in item else "family"
    _nonempty_str(source, f"{where}.{target}", item[target], "must be a non-empty string")
    level = item.get("level")
    if not isinstance(level, str) or level not in LEVELS:
        raise CaseError(source, f"{where}.level", f"must be one of {', '.join(LEVELS)}")
    status = item.get("status")
    if status not in ENTRY_STATUSES:
        raise CaseError(
            source, f"{where}.status", f"must be one of {', '.join(ENTRY_STATUSES)} (the status the entry expects)"
        )
    reason = _nonempty_str(source, f"{where}.reason", item.get("reason"), "must say why the divergence is expected")
    numeric_divergent = status == DIVERGENT and level in NUMERIC_LEVELS
    max_ulp = item.get("max_ulp")
    fraction = item.get("max_mismatch_fraction")
    if numeric_divergent:
        for key in ("max_ulp", "max_mismatch_fraction"):
            if key not in item:
                raise CaseError(source, f"{where}.{key}", f"is required on a divergent {level} entry (a cap)")
        if isinstance(max_ulp, bool) or not isinstance(max_ulp, int) or max_ulp < 0:
            raise CaseError(source, f"{where}.max_ulp", f"must be an integer >= 0, got {json.dumps(max_ulp)}")
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not math.isfinite(fraction)
            or not 0 < fraction <= 1
        ):
            raise CaseError(
                source, f"{where}.max_mismatch_fraction", f"must be a number in (0, 1], got {json.dumps(fraction)}"
            )
        fraction = float(fraction)
    else:
        for key in ("max_ulp", "max_mismatch_fraction"):
            if key in item:
                raise CaseError(
                    source, f"{where}.{key}", "is a cap: only divergent merge and prefill entries have caps"
                )
    if "field" in item and not (status == DIVERGENT and level in FIELD_LEVELS):
        raise CaseError(source, f"{where}.field", "applies only to divergent layout and sparse-layout entries")
    if "error" in item and status not in (PORT_ERROR, ORACLE_ERROR):
        raise CaseError(source, f"{where}.error", "applies only to port-error and oracle-error entries")
    if status == ORACLE_ERROR:
        if oracle == pinned_release():
            raise CaseError(source, f"{where}.status", f"oracle-error is never expected of the pinned oracle {oracle}")
        if "error" not in item:
            raise CaseError(source, f"{where}.error", "is required on an oracle-error entry (the class of refusal)")
    count, counted = item.get("items"), status in (PORT_ERROR, ORACLE_ERROR)
    if counted and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        what, got = "refused" if status == ORACLE_ERROR else "failing", json.dumps(count)
        raise CaseError(source, f"{where}.items", f"must count the items {what} so (an integer >= 1), got {got}")
    if not counted and "items" in item:
        raise CaseError(source, f"{where}.items", "applies only to port-error and oracle-error entries")
    first_field = (
        _nonempty_str(source, f"{where}.field", item["field"], "must be a field name") if "field" in item else None
    )
    error = (
        _nonempty_str(source, f"{where}.error", item["error"], "must be a non-empty string")
        if "error" in item
        else None
    )
    return BaselineEntry(
        port, level, reason, status, item.get("case"), item.get("family"),
        max_ulp, fraction, first_field, error, item.get("items"), oracle, source, i,
    )  # fmt: skip


def load_baseline(path: Path) -> list[BaselineEntry]:
    """Parse a baseline file (types and fields only; :func:`check_baseline_targets`
    checks it against a suite). Bad input raises :class:`CaseError` naming the
    file, the field and the reason."""
    source = str(path)
    data = read_json(path, source)
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise CaseError(source, "entries", "a baseline is an object with a list of entries")
    unknown = sorted(set(data) - {"port", "oracle", "entries"})
    if unknown:
        raise CaseError(source, unknown[0], "is not a baseline file field (port, oracle, entries)")
    file_port = data.get("port")
    if file_port is not None and (not isinstance(file_port, str) or not file_port):
        raise CaseError(source, "port", "must be a port name")
    oracle = data.get("oracle", pinned_release())
    if not isinstance(oracle, str) or not re.fullmatch(r"vllm==\d+\.\d+\.\d+", oracle):
        raise CaseError(source, "oracle", f"must be a release as vllm==X.Y.Z, got {json.dumps(oracle)}")
    return [_parse_entry(source, i, item, file_port, oracle) for i, item in enumerate(data["entries"])]


def check_baseline_oracle(entries: Iterable[BaselineEntry], oracle: str) -> None:
    """A baseline judges only runs against the release it was measured with
    (``oracle``: the run's ``vllm==X``). Raises :class:`CaseError` (exit 2) otherwise."""
    for entry in entries:
        if entry.oracle != oracle:
            raise CaseError(
                entry.source,
                "oracle",
                f"the baseline was measured against {entry.oracle}, but this run's oracle is {oracle}",
            )


# -- checking against the suite and the port ----------------------------------------------


@dataclass(frozen=True)
class SuiteTargets:
    """What a baseline entry may name: per level, the suite's families and item names."""

    suite: str
    families: Mapping[str, frozenset[str]]
    names: Mapping[str, frozenset[str]]

    @classmethod
    def of_suite(cls, suite: Suite) -> SuiteTargets:
        """Every item of the whole suite at every level, whatever a run selects
        (a shard or ``--level`` narrows the run, not what the baseline may name)."""
        from harness.sides.runner import plan_items

        families: dict[str, set[str]] = {lv: set() for lv in LEVELS}
        names: dict[str, set[str]] = {lv: set() for lv in LEVELS}
        for kind, item in plan_items(suite, LEVELS):
            level = level_of(kind)
            families[level].add(getattr(item, "family", "workspace-size"))
            names[level].add(item.name)
        return cls(suite.name, _freeze(families), _freeze(names))

    @classmethod
    def of_table(cls, suite: str, table: pd.DataFrame, levels: Iterable[str]) -> SuiteTargets:
        """From a complete results table (a merged run) at the ``levels`` it ran;
        other levels name nothing, so only entries at the run's levels are checked."""
        families: dict[str, set[str]] = {lv: set() for lv in LEVELS}
        names: dict[str, set[str]] = {lv: set() for lv in LEVELS}
        for level, group in table.groupby("level"):
            families[str(level)].update(group["family"])
            names[str(level)].update(group["name"])
        kept = tuple(levels)
        return cls(
            suite,
            {lv: frozenset(v) for lv, v in families.items() if lv in kept},
            {lv: frozenset(v) for lv, v in names.items() if lv in kept},
        )


def _freeze(groups: dict[str, set[str]]) -> dict[str, frozenset[str]]:
    return {k: frozenset(v) for k, v in groups.items()}


def known_port_spellings() -> frozenset[str]:
    """Every port name the harness itself can resolve: built-in short names and
    import paths, and the seeded mutants (by name and as ``mutant:NAME``)."""
    from harness.sides.loading import BUILTIN_PORTS
    from ports.mutants import MUTANTS

    return frozenset({*BUILTIN_PORTS, *BUILTIN_PORTS.values(), *MUTANTS, *(f"mutant:{m}" for m in MUTANTS)})


def port_names(name: str, spelling: str | None = None) -> frozenset[str]:
    """The names an entry may give the port under test: its ``name``, the
    spelling it was loaded by (``--port`` / ``--parity-port``), and for a
    built-in port both of its spellings (``equal_share``, ``ports.equal_share:PORT``)."""
    from harness.sides.loading import BUILTIN_PORTS

    names = {n for n in (name, spelling) if n}
    for short, path in BUILTIN_PORTS.items():
        if names & {short, path}:
            names |= {short, path}
    return frozenset(names)


def _listing(values: Iterable[str], limit: int = 12) -> str:
    ordered = sorted(values)
    shown = ", ".join(ordered[:limit])
    return shown + (f", ... ({len(ordered)} in all)" if len(ordered) > limit else "") if ordered else "none"


def check_baseline_targets(entries: Iterable[BaselineEntry], targets: SuiteTargets, ports: Collection[str]) -> None:
    """Refuse (:class:`CaseError`, exit 2) an entry that can never cover an item:
    a port that is neither the one under test (``ports``, see :func:`port_names`)
    nor a known spelling, or a case or family the suite has no item of at the
    entry's level. Levels absent from ``targets`` are not checked.

    Also refused: a non-empty baseline none of whose entries names the port
    under test (:func:`check_baseline_port`)."""
    entries = list(entries)
    known = known_port_spellings()
    for e in entries:
        if e.port not in ports and e.port not in known:
            raise CaseError(
                e.source, f"{e.where}.port",
                f"names port {e.port!r}, which is neither the port under test ({_listing(ports)}) "
                "nor a known port (a typo would make the entry cover nothing)",
            )  # fmt: skip
    # Before the targets: a whole file for another port is one mistake, not one per entry.
    check_baseline_port(entries, ports)
    for e in entries:
        if e.level not in targets.families:
            continue
        if e.family is not None and e.family not in targets.families[e.level]:
            raise CaseError(
                e.source, f"{e.where}.family",
                f"suite {targets.suite} has no {e.level} item of family {e.family!r} "
                f"(its {e.level} families: {_listing(targets.families[e.level])})",
            )  # fmt: skip
        if e.case is not None and e.case not in targets.names[e.level]:
            raise CaseError(
                e.source, f"{e.where}.case", f"suite {targets.suite} has no {e.level} item named {e.case!r}"
            )


def check_baseline_port(entries: Collection[BaselineEntry], ports: Collection[str]) -> None:
    """Refuse (:class:`CaseError`, field ``port``) a baseline with entries of
    which none names the port under test (``ports``, see :func:`port_names`):
    on this port it expects nothing and none of its entries can go stale, so the
    run would be judged as if no baseline were given while the command line says
    one was (``--port per_request --baseline equal_share.json``). A file that
    also holds other ports' entries is fine: a shared baseline's entries for
    other ports are ignored by design. An empty file expects nothing, explicitly."""
    if not entries or any(e.port in ports for e in entries):
        return
    named = sorted({e.port for e in entries})
    sources = sorted({e.source for e in entries})
    raise CaseError(
        ", ".join(sources), "port",
        f"the baseline is for port {_listing(named)}, not the port under test ({_listing(ports)}): "
        "none of its entries would apply (name the port under test, by its name or its --port spelling)",
    )  # fmt: skip


# -- judging items -------------------------------------------------------------------------


def divergent_field(detail: str) -> str | None:
    """The first divergent field of a layout or workspace item, from its detail text."""
    found = _FIELD_RE.match(detail)
    return found.group(1) if found else None


@dataclass(frozen=True)
class ItemVerdict:
    """``label`` is EXPECTED, NEW, or "" (parity or not-run: not the baseline's
    to judge); ``entry`` the entry that expected it; ``note`` the entry's reason
    for an expected item, or why a new one is new."""

    label: str
    entry: BaselineEntry | None
    note: str
    # Entries this item keeps alive (covering, same status, same field/error).
    matched: tuple[BaselineEntry, ...] = ()


def _int(value: Any) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def _mismatch(entry: BaselineEntry, row: Mapping[str, Any]) -> str | None:
    """Why ``entry`` (covering the item) does not match it, caps aside; None if it does."""
    if entry.status != row["status"]:
        return f"status {row['status']}, the baseline expects {entry.status}"
    detail = str(row.get("detail") or "")
    if entry.field is not None:
        found = divergent_field(detail)
        if found != entry.field:
            return f"first divergent field {found}, the baseline expects {entry.field}"
    if entry.status == ORACLE_ERROR:
        refused = refusal_class(detail, entry.oracle)
        if refused is None:
            return "the oracle failed; it did not refuse the batch"
        if refused != entry.error:
            return f"the oracle refuses it as {refused!r}, not {entry.error!r}"
        return None
    if entry.error is not None and entry.error not in detail:
        return f"the error does not contain {entry.error!r}"
    return None


def refusal_class(detail: str, oracle: str) -> str | None:
    """The class of refusal of an ``oracle-error`` item's text, as ``oracle``
    stated it (``OracleRefusal: vllm==X: <class>``); None when the oracle did not
    refuse but failed (its process, a timeout, the harness)."""
    prefix = f"OracleRefusal: {oracle}: "
    return detail[len(prefix) :] if detail.startswith(prefix) else None


def _beyond_caps(entry: BaselineEntry, row: Mapping[str, Any]) -> str | None:
    """Why the item exceeds ``entry``'s caps; None if within (or the entry has none)."""
    if entry.max_ulp is None or entry.max_mismatch_fraction is None:
        return None
    max_ulp, mismatches, elements = (_int(row.get(k)) for k in ("max_ulp", "mismatches", "elements"))
    if max_ulp is None or mismatches is None or not elements:
        # Without the counts the caps cannot be checked: never expected on trust.
        return "no element counts in the results to check the caps against"
    if max_ulp > entry.max_ulp:
        return f"{ulp_text(max_ulp)} ULP > cap {entry.max_ulp}"
    fraction = mismatches / elements
    if fraction > entry.max_mismatch_fraction:
        return f"mismatch fraction {fraction:.6g} ({mismatches}/{elements}) > cap {entry.max_mismatch_fraction:.6g}"
    return None


def judge_item(entries: Iterable[BaselineEntry], ports: Collection[str], row: Mapping[str, Any]) -> ItemVerdict:
    """The baseline's verdict on one item, ``row`` being its results-table row
    (``level``, ``name``, ``family``, ``status``, ``detail``, ``max_ulp``,
    ``mismatches``, ``elements``). The single rule the gate, ``parity merge``
    and the pytest plugin apply."""
    status = row["status"]
    if status == PARITY:
        return ItemVerdict("", None, "")
    if status == NOT_RUN:
        # Never expected, never parity: the gate is INCOMPLETE while any remain.
        return ItemVerdict("", None, f"not run: {row.get('detail') or 'the port does not implement this level'}")
    covering = [e for e in entries if e.covers(ports, row["level"], row["name"], row["family"])]
    if status == ORACLE_ERROR and not any(e.status == ORACLE_ERROR for e in covering):
        return ItemVerdict(NEW, None, "an oracle error is never expected")
    # A case entry is the precise expectation for its case: where one covers the
    # item, the family's entries do not (a looser family cap cannot override it).
    covering = [e for e in covering if e.case is not None] or covering
    if not covering:
        return ItemVerdict(NEW, None, "not in the baseline")
    matched = tuple(e for e in covering if _mismatch(e, row) is None)
    for entry in matched:
        if _beyond_caps(entry, row) is None:
            return ItemVerdict(EXPECTED, entry, entry.reason, matched)
    if matched:
        first = matched[0]
        return ItemVerdict(NEW, None, f"beyond baseline: {_beyond_caps(first, row)} ({first.label})", matched)
    same_status = [e for e in covering if e.status == status]
    first = (same_status or covering)[0]
    return ItemVerdict(NEW, None, f"beyond baseline: {_mismatch(first, row)} ({first.label})")


def measure_entries(table: pd.DataFrame, port: str, oracle: str | None = None) -> list[dict[str, Any]]:
    """The tightest family entries that expect every divergent, port-error or
    oracle-error row of ``table`` (a results table of one port): one per (level,
    family, status), split by first divergent field at layout and by the error's
    text for an oracle error (its class of refusal, as ``oracle`` stated it);
    numeric caps are exactly the
    group's largest ``max_ulp`` and ``mismatches / elements``. Each entry's
    ``reason`` is left empty for a person to write from what was measured
    (a baseline without reasons is refused by :func:`load_baseline`)."""
    failing = table[table["status"].isin(ENTRY_STATUSES)].copy()
    failing["field"] = [
        divergent_field(str(d)) if lv in FIELD_LEVELS and s == DIVERGENT else None
        for lv, s, d in zip(failing["level"], failing["status"], failing["detail"], strict=True)
    ]
    # An oracle error's class is its text: each class a release refuses is its own entry.
    failing["error"] = [
        str(d) if s == ORACLE_ERROR else None for s, d in zip(failing["status"], failing["detail"], strict=True)
    ]
    oracle = oracle or pinned_release()
    out: list[dict[str, Any]] = []
    keys = ["level", "family", "status", "field", "error"]
    for (level, family, status, first_field, error), group in failing.groupby(keys, sort=True, dropna=False):
        entry: dict[str, Any] = {"port": port, "family": family, "level": level, "status": status}
        if isinstance(error, str):
            # The class as the release states it; a failure that is no refusal stays whole
            # (and no baseline may expect it).
            entry["error"] = refusal_class(error, oracle) or error
        if level in NUMERIC_LEVELS and status == DIVERGENT:
            entry["max_ulp"] = int(group["max_ulp"].max())
            entry["max_mismatch_fraction"] = max(
                int(m) / int(n) for m, n in zip(group["mismatches"], group["elements"], strict=True)
            )
        if isinstance(first_field, str):
            entry["field"] = first_field
        # A baseline field of an error entry (its exact count); on the others only
        # for the person writing the reason.
        entry["items"] = len(group)
        entry["reason"] = ""
        out.append(entry)
    return out
