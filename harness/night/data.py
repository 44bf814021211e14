"""The night's data and its verdict: each port's results judged against its
baseline (:class:`PortNight`, :class:`Tally`), the night that holds them
(:class:`Night`), and what the night says (:func:`night_verdict`,
:func:`night_exit_code`).

This is the model every other module of the night shares: the runner
(harness/night/nightly.py) and the shard merger (harness/night/shards.py) fill a
:class:`Night`; the history store (harness/night/history.py) makes its rows of
one; reports/nightly.py renders one. Invariants a reader must keep:

- A divergence the port's baseline expects is not a failure; a new one fails
  the night. ``Tally.expected`` and ``Tally.new`` partition the failing items.
- A night that did not finish is never PASS: it is INCOMPLETE, and its exit
  code is 130 (``EXIT_INTERRUPTED``), whatever its ports' tables say.
- An explore find counts only for a port with no baseline (:func:`judges_explore`).

Nothing here reads or writes a file.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.model.levels import TextEnum
from harness.night.baselines import PortBaseline
from harness.night.sizes import reduced_reasons
from harness.search.coverage_verdicts import JudgedCoverage
from harness.sides.items import NOT_RUN, PARITY
from harness.verdicts.baseline import EXPECTED, NEW


class PortVerdict(TextEnum):
    """A port's verdict against its baseline (:attr:`Tally.verdict`)."""

    PASS = "pass"
    EXPECTED_ONLY = "expected"
    FAIL = "fail"
    INCOMPLETE = "incomplete"
    NO_ITEMS = "-"


PASS, EXPECTED_ONLY, FAIL, INCOMPLETE, NO_ITEMS = PortVerdict


class NightVerdict(TextEnum):
    """The whole night's verdict over its gated ports (:func:`night_verdict`)."""

    PASS = "PASS"
    FAIL = "FAIL"
    INCOMPLETE = "INCOMPLETE"


# The exit codes every command uses (harness/commands/common.py).
EXIT_PASS, EXIT_DIVERGENT, EXIT_INTERRUPTED = 0, 1, 130


@dataclass(frozen=True)
class Tally:
    """A port's (or a level's) items by how the baseline judged them. ``expected``
    and ``new`` partition the failing items (divergent, errors); ``not_run`` are
    items of a level the port does not implement."""

    items: int
    parity: int
    expected: int
    new: int
    not_run: int

    @property
    def verdict(self) -> str:
        """``fail`` when anything is new; ``incomplete`` when items did not run;
        ``expected`` when every failing item is in the baseline (a pass that is
        not bit-for-bit clean); ``pass`` when everything is at parity; ``-`` for none."""
        if not self.items:
            return NO_ITEMS
        if self.new:
            return FAIL
        if self.not_run:
            return INCOMPLETE
        return EXPECTED_ONLY if self.expected else PASS


def tally(table: pd.DataFrame) -> Tally:
    """Count ``table``'s items. Without a ``baseline`` column (a table nothing
    judged) every failing item is new."""
    status = table["status"]
    failing = ~status.isin([PARITY, NOT_RUN])
    if "baseline" in table.columns:
        expected = int((failing & (table["baseline"] == EXPECTED)).sum())
        new = int((failing & (table["baseline"] == NEW)).sum())
    else:
        expected, new = 0, int(failing.sum())
    return Tally(len(table), int((status == PARITY).sum()), expected, new, int((status == NOT_RUN).sum()))


@dataclass
class PortNight:
    """One port's share of a night: its results table (with the baseline's
    ``baseline``/``reason``/``baseline_entry`` columns when judged) and summary."""

    port: str
    table: pd.DataFrame
    summary: dict[str, Any]
    seconds: float = 0.0
    # The baseline file it was judged against; None: no baseline (every divergence is new).
    baseline: str | None = None
    # Why its run stopped before its last item (harness.sides.work_box: a hung port,
    # the night's time limit); its unreached items are not-run rows. None: it did not.
    stopped: str | None = None

    @property
    def tally(self) -> Tally:
        return tally(self.table)

    @property
    def verdict(self) -> str:
        return self.tally.verdict


@dataclass
class Night:
    date: str
    suite: str
    expected_items: int
    ports: list[PortNight] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    complete: bool = False
    kill_matrix: dict[str, Any] | None = None  # harness.search.mutants' JSON form
    gpu: tuple[Path, dict[str, Any]] | None = None  # the latest GPU report (harness.night.gpu_report)
    # The latest ``parity drift`` report (reports/drift_report.py): "Upstream since the pin".
    drift: tuple[Path, dict[str, Any]] | None = None
    coverage: JudgedCoverage | None = None  # the suite's coverage (harness/search/coverage_verdicts.py)
    # One ``parity explore`` per port (harness/search/explore_results.py's JSON form plus "markdown").
    explore: list[dict[str, Any]] = field(default_factory=list)
    # The seconds of explore asked for per port; 0: the night did not search.
    explore_budget_s: float = 0.0
    # Per port name, the baseline it is judged against (absent: none).
    baselines: dict[str, PortBaseline] = field(default_factory=dict)
    # The steps not finished yet, in order; while the night runs the first is running,
    # after an interruption it is where the night stopped. Empty once complete.
    pending: list[str] = field(default_factory=list)
    interrupted: bool = False
    # Why the night stopped itself (its --time-limit ran out), or None: then, as after
    # an interruption, the steps still pending did not run.
    stopped: str | None = None
    # The sizes it ran with (harness.night.history.night_sizes; {}: not recorded).
    sizes: dict[str, Any] = field(default_factory=dict)
    # Per port name, its ``--ports`` spelling (for the failing items' reproduce commands).
    port_specs: dict[str, str] = field(default_factory=dict)
    # What could not be written ("report", "history"), one line each naming the path and why.
    unwritten: dict[str, str] = field(default_factory=dict)

    @property
    def items_done(self) -> int:
        return sum(len(p.table) for p in self.ports)

    @property
    def reduced(self) -> list[str]:
        """Why the night is smaller than a full one ([]: it is not)."""
        return reduced_reasons(self.sizes)


def explore_verdict(night: Night, port: str) -> str:
    """``clean``, ``found`` or ``incomplete`` for a port's search tonight, ``not-run``
    when the night asked for none; asked for and missing (a shard 1 that never got
    there, say) is ``incomplete``."""
    if night.explore_budget_s <= 0:
        return "not-run"
    return next((r["verdict"] for r in night.explore if r["port"] == port), "incomplete")


def judges_explore(port: PortNight) -> bool:
    """Whether a port's explore finds count in the night's verdict: only for a
    port the night expects at parity everywhere (no baseline). A port with
    expected divergences (equal_share, the legacy reference) diverges on most
    inputs by design, and a find has no family or case a baseline entry could
    name; its finds are listed on the page, marked as not judged."""
    return port.baseline is None


def night_verdict(night: Night, gated_ports: Collection[str] | None = None) -> NightVerdict:
    """``PASS``, ``FAIL`` or ``INCOMPLETE`` over ``gated_ports`` (default: every
    port of the night), each against its baseline: FAIL when one has a new
    divergence or its search found one; INCOMPLETE when the night did not finish,
    a port left items unrun, a search asked for is missing, or no port was judged."""
    if not night.complete:
        return NightVerdict.INCOMPLETE
    ports = [p for p in night.ports if gated_ports is None or p.port in gated_ports]
    verdicts = [p.verdict for p in ports]
    searches = [explore_verdict(night, p.port) for p in ports if judges_explore(p)]
    if FAIL in verdicts or "found" in searches:
        return NightVerdict.FAIL
    if not ports or INCOMPLETE in verdicts or NO_ITEMS in verdicts or "incomplete" in searches:
        return NightVerdict.INCOMPLETE
    return NightVerdict.PASS


def night_exit_code(night: Night, gated_ports: Collection[str] | None = None) -> int:
    """The night's exit status, as every command's: 130 when it did not finish;
    0 when every gated port (default: every port) is at parity or diverges only
    as its baseline expects and its search (if asked for) came back clean; 1 otherwise."""
    if not night.complete:
        return EXIT_INTERRUPTED
    return EXIT_PASS if night_verdict(night, gated_ports) is NightVerdict.PASS else EXIT_DIVERGENT
