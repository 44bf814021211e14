"""Bounded work: a run stops early, and says why, when its port is hung or its
time is up; everything it measured is kept, and every item it did not reach
is a ``not-run`` row (so the verdict is FAIL or INCOMPLETE, never PASS).

A port is declared hung when its calls time out on :data:`HUNG_AFTER` items
compared in a row (a port that restarts after each timeout and hangs again
would otherwise cost the item count times the timeout). Items not compared
(not run: a level the port lacks) neither count nor break the row. A time
limit (``--time-limit``) is checked after each item: the item running when it
passes finishes, or times out, first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.sides.items import NOT_RUN, PORT_ERROR, CaseResult
from harness.sides.time_limits import is_timeout

# Items compared in a row whose port calls all timed out: the port is hung.
HUNG_AFTER = 3


@dataclass
class WorkBox:
    """Says when a run must stop: :meth:`stop_after` each result, in order."""

    time_limit_s: float | None = None
    hung_after: int = HUNG_AFTER
    clock: Callable[[], float] = time.monotonic
    # When the limited time began (None: now); a night's ports share the night's.
    started: float | None = None
    timed_out: list[str] = field(default_factory=list)
    # Why it stopped, in a few words (each unreached item's not-run row says it).
    short: str = ""

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.clock()

    @property
    def out_of_time(self) -> bool:
        """Whether it stopped (or would now stop) for its time limit."""
        assert self.started is not None
        return self.time_limit_s is not None and self.clock() - self.started >= self.time_limit_s

    def stop_after(self, result: CaseResult) -> str | None:
        """Why the run stops after ``result`` (one line), or None to go on."""
        if result.status == PORT_ERROR and is_timeout(result.error):
            self.timed_out.append(result.id)
        elif result.status != NOT_RUN:
            self.timed_out.clear()
        if len(self.timed_out) >= self.hung_after:
            shown = ", ".join(self.timed_out[:3]) + (", ..." if len(self.timed_out) > 3 else "")
            self.short = "the port is hung"
            return (
                f"the port is hung: its calls timed out on {len(self.timed_out)} items in a row ({shown}); "
                "the items not compared by then were not run"
            )
        if self.out_of_time:
            self.short = f"its time limit of {self.time_limit_s:g} s ran out"
            return (
                f"the run's time limit ({self.time_limit_s:g} s, --time-limit) ran out; "
                "the items not compared by then were not run"
            )
        return None
