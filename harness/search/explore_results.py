"""What ``parity explore`` reports: each property's search (:class:`PropertyRun`),
its finds (:class:`Find`), and the run as a whole (:class:`ExploreResult`), with
its verdict, exit code, ``explore.json`` form and ``summary.md``.

Invariants:

* Never a false clean. The verdict is ``found`` with any find, ``clean`` only
  when every property compared examples and hypothesis itself did not fail
  (:attr:`PropertyRun.complete`), and ``incomplete`` otherwise: all refused, the
  budget gone before the first example, hypothesis gave up or failed, or the port
  lacks a level (a ``not-run`` property).
* One listing per find. A run's finds are listed once, under the result's
  ``finds``; a property's JSON form gives their count.
* Stable forms. The JSON form (:meth:`ExploreResult.to_json`, written as
  ``explore.json``) and the Markdown (:meth:`ExploreResult.to_markdown`) are what
  the nightly report embeds (:mod:`harness.night.nightly`); the JSON keys and the
  exit codes are part of the command's interface.
* Layout of ``out_dir``: hypothesis's example database under
  :data:`DATABASE_DIR`, one folder per property.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXIT_CLEAN, EXIT_FOUND, EXIT_USAGE = 0, 1, 2
FOUND, CLEAN, INCOMPLETE = "found", "clean", "incomplete"

# Hypothesis's example database under out_dir, one folder per property.
DATABASE_DIR = "hypothesis-db"


@dataclass
class Find:
    """A failing input hypothesis shrank, written as a file the CLI replays."""

    property: str
    status: str
    detail: str
    item: dict[str, Any]
    size: str
    file: str = ""
    command: str = ""
    replayed: bool = False
    # Hypothesis could not make the minimal input fail again (a port that is not
    # a pure function of its input, or a timeout): the input is still written.
    flaky: bool = False
    # Shrinking ran out of time: the smallest input seen so far.
    shrink_cut_short: bool = False
    # Steps harness.search.shrink took after hypothesis (:func:`polish`).
    polish_steps: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PropertyRun:
    """One property's search: how many examples, how it ended, what it found."""

    name: str
    budget_s: float
    examples: int = 0
    examples_before_find: int | None = None
    # From the first example to the first failing one.
    seconds_to_find: float | None = None
    refused: int = 0
    refusals: list[str] = field(default_factory=list)
    # Hypothesis runs of the search (one more per round that found something new).
    rounds: int = 0
    seconds: float = 0.0
    # "budget", "exhausted" (hypothesis ran out of distinct inputs), "gave-up"
    # (every input refused), "error" (hypothesis itself failed), "not-run".
    ended_by: str = ""
    error: str | None = None
    finds: list[Find] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """It compared at least one example and hypothesis itself did not fail."""
        return self.examples > 0 and self.ended_by not in ("error", "gave-up", "not-run")

    def to_json(self) -> dict[str, Any]:
        """The run's figures; its finds are listed once, in :meth:`ExploreResult.to_json`."""
        out = dataclasses.asdict(self)
        out["finds"] = len(self.finds)
        out["complete"] = self.complete
        return out


@dataclass
class ExploreResult:
    port: str
    port_spec: str
    level: str
    seed: int
    budget_s: float
    out_dir: str
    runs: list[PropertyRun] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def finds(self) -> list[Find]:
        return [f for run in self.runs for f in run.finds]

    @property
    def examples(self) -> int:
        return sum(run.examples for run in self.runs)

    @property
    def verdict(self) -> str:
        """``found`` with any find; ``clean`` only when every property compared
        examples and none failed; otherwise ``incomplete``."""
        if self.finds:
            return FOUND
        return CLEAN if self.runs and all(run.complete for run in self.runs) else INCOMPLETE

    @property
    def exit_code(self) -> int:
        return EXIT_CLEAN if self.verdict == CLEAN else EXIT_FOUND

    def to_json(self) -> dict[str, Any]:
        import hypothesis

        return {
            "port": self.port,
            "port_spec": self.port_spec,
            "level": self.level,
            "seed": self.seed,
            "budget_s": self.budget_s,
            "seconds": round(self.seconds, 3),
            "verdict": self.verdict,
            "examples": self.examples,
            "out_dir": self.out_dir,
            "database": str(Path(self.out_dir) / DATABASE_DIR),
            "hypothesis": hypothesis.__version__,
            "notes": self.notes,
            "properties": [run.to_json() for run in self.runs],
            "finds": [f.to_json() for f in self.finds],
        }

    def headline(self) -> str:
        tried = f"{self.examples} examples compared in {self.seconds:.1f}s"
        if self.verdict == FOUND:
            return f"FOUND: {len(self.finds)} failing input(s) for port {self.port} ({tried})"
        if self.verdict == CLEAN:
            return f"CLEAN: no failing input for port {self.port} ({tried}; a search, not a proof)"
        short = [f"{r.name} ({r.ended_by}, {r.examples} compared)" for r in self.runs if not r.complete]
        return f"INCOMPLETE: {', '.join(short) or 'no property ran'} for port {self.port} ({tried})"

    def to_markdown(self, heading: str = "#") -> str:
        """``summary.md``; ``heading`` ("###", say) sets the level of its title
        (its finds are one level below), for embedding in another report."""
        lines = [
            f"{heading} parity explore: port {self.port}, level {self.level}, seed {self.seed}",
            "",
            f"**{self.headline()}**",
            "",
            f"Budget {self.budget_s:g}s for the search; database `{Path(self.out_dir) / DATABASE_DIR}`.",
            "",
            "| property | examples compared | refused by the oracle | seconds | ended by | finds |",
            "|---|---:|---:|---:|---|---:|",
        ]
        for run in self.runs:
            lines.append(
                f"| {run.name} | {run.examples} | {run.refused} | {run.seconds:.1f} | {run.ended_by}"
                f"{' (' + run.error + ')' if run.error else ''} | {len(run.finds)} |"
            )
        for note in self.notes:
            lines += ["", f"Note: {note}"]
        if self.finds:
            lines += ["", f"{heading}# Finds", ""]
            for i, find in enumerate(self.finds, 1):
                flags = [
                    flag
                    for flag, on in (
                        ("replayed from the database", find.replayed),
                        ("flaky", find.flaky),
                        ("shrinking cut short", find.shrink_cut_short),
                    )
                    if on
                ]
                lines.append(
                    f"{i}. **{find.property}, {find.status}**: {find.detail}"
                    + (f" ({', '.join(flags)})" if flags else "")
                )
                lines.append(f"   - input: {find.size}")
                lines.append(f"   - file: `{find.file}`")
                lines.append(f"   - reproduce: `{find.command}`")
        return "\n".join(lines) + "\n"
