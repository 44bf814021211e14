"""A table judged against a baseline (:func:`apply_baseline`): each row by its entry
(:func:`harness.verdicts.baseline.judge_item`), then the counts of the error entries.

Counted baseline entries: an error entry expects exactly as many items as it counts.

An ``oracle-error`` or ``port-error`` entry (:mod:`harness.verdicts.baseline`) carries
``items``: the number of items of its family or case that fail so, exactly as
measured (``tools/measure_baseline.py``, ``tools/measure_legacy_sparse.py``
write it). An error is an item not compared, so a count that moves is never
absorbed by a message that still matches:

- more items than the entry counts: the items it expects beyond its count (in
  the table's order, the suite's) are *new*, each saying so (``beyond
  baseline: 25 port errors where the entry counts 20 (...)``), and fail the gate;
  the entry is not stale (as an item beyond its caps is new, its entry alive);
- fewer: the entry is *miscounted*, reported with the stale entries (``it counts
  20 port errors, this run 18: <reason>``), and fails the gate too.

Items beyond a count are new in every judged table (a shard's, a night's: more
in a part are more in the whole; the pytest plugin checks it at the end of the
session). Fewer is said only by a judgement of a whole run
(:func:`harness.verdicts.baseline.apply_baseline` with ``check_stale``: an unsharded
gate, ``parity merge``): a shard or a night sees part of an entry's items.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pandas as pd

from harness.sides.items import LEVELS, NOT_RUN, ORACLE_ERROR, PORT_ERROR
from harness.verdicts.baseline import EXPECTED, NEW, BaselineEntry, ItemVerdict, judge_item

# The statuses whose entries count their items (``items`` is required on them), and
# what an entry's count is a count of.
COUNTED: dict[str, str] = {ORACLE_ERROR: "items refused", PORT_ERROR: "port errors"}


def _expected_by(verdicts: list[ItemVerdict]) -> Counter[BaselineEntry]:
    return Counter(v.entry for v in verdicts if v.entry is not None and v.entry.items is not None)


def hold_counts(verdicts: list[ItemVerdict]) -> list[ItemVerdict]:
    """``verdicts`` (one per item, in the table's order) with the items each
    counted entry expects beyond its count made new."""
    totals = _expected_by(verdicts)
    seen: Counter[BaselineEntry] = Counter()
    out = []
    for v in verdicts:
        entry = v.entry
        if entry is not None and entry.items is not None:
            seen[entry] += 1
            if seen[entry] > entry.items:
                what = COUNTED.get(entry.status, "items")
                note = f"beyond baseline: {totals[entry]} {what} where the entry counts {entry.items} ({entry.label})"
                v = dataclasses.replace(v, label=NEW, entry=None, note=note)
        out.append(v)
    return out


def miscounted(
    entries: list[BaselineEntry], verdicts: list[ItemVerdict], ports: Collection[str], levels: Collection[str]
) -> list[BaselineEntry]:
    """The counted entries (of the port under test, at the run's ``levels``) that
    some item matched but fewer items than they count were expected by, each
    with its reason saying so (entries no item matched are stale, not these).
    ``verdicts`` are :func:`hold_counts`'s input, before items beyond a count are new."""
    live = {e for v in verdicts for e in v.matched}
    expected = _expected_by(verdicts)
    return [
        dataclasses.replace(
            e, reason=f"it counts {e.items} {COUNTED.get(e.status, 'items')}, this run {expected[e]}: {e.reason}"
        )
        for e in entries
        if e.items is not None and e in live and e.port in ports and e.level in levels and expected[e] < e.items
    ]


@dataclass
class BaselineVerdict:
    """The table with a ``baseline`` column (expected / new / blank), a
    ``reason`` column (the entry's reason for an expected item, why it is new
    for a new one) and a ``baseline_entry`` column (the label of the entry that
    expected the item), and the entries that matched nothing (stale)."""

    table: pd.DataFrame
    stale: list[BaselineEntry]
    stale_checked: bool

    @property
    def new(self) -> pd.DataFrame:
        return self.table[self.table["baseline"] == NEW]

    @property
    def expected(self) -> pd.DataFrame:
        return self.table[self.table["baseline"] == EXPECTED]

    @property
    def not_run(self) -> pd.DataFrame:
        return self.table[self.table["status"] == NOT_RUN]

    @property
    def passed(self) -> bool:
        """Nothing new, nothing stale, and every item actually compared."""
        return self.new.empty and not self.stale and self.not_run.empty

    @property
    def verdict(self) -> str:
        """``pass``, ``fail`` (new or stale), or ``incomplete`` (only not-run items stand in the way)."""
        if self.passed:
            return "pass"
        return "fail" if not self.new.empty or self.stale else "incomplete"


def apply_baseline(
    table: pd.DataFrame,
    ports: Collection[str],
    entries: list[BaselineEntry],
    levels: Sequence[str] = LEVELS,
    check_stale: bool = True,
) -> BaselineVerdict:
    """Judge every row with :func:`judge_item`. ``ports`` are the names of the
    port under test (:func:`port_names`). An error entry never expects more
    items than it counts, in any table (more in a part are more in the whole).
    ``check_stale`` (stale entries, and error entries that fewer items match than
    they count: :mod:`harness.verdicts.judge`) is off for a single shard or a
    night, which see only part of what an entry covers (the merge step checks it)."""
    table = table.copy()
    judged = [judge_item(entries, ports, row) for row in table.to_dict("records")]
    verdicts = hold_counts(judged)
    table["baseline"] = [v.label for v in verdicts]
    table["reason"] = [v.note for v in verdicts]
    table["baseline_entry"] = [v.entry.label if v.entry is not None else "" for v in verdicts]
    live = {e for v in verdicts for e in v.matched}
    stale = []
    if check_stale:
        stale = [e for e in entries if e.port in ports and e.level in levels and e not in live]
        stale += miscounted(entries, judged, ports, levels)
    return BaselineVerdict(table, stale, check_stale)


# -- measuring -----------------------------------------------------------------------------
