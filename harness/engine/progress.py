"""How a long run shows it is alive: a bar on a terminal, a line per tenth in a log."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from harness.sides.items import PARITY

PROGRESS_EVERY_S = 60.0  # the longest a log without a terminal waits for a progress line
PROGRESS_QUIET_S = 5.0  # the shortest gap between two lines: a short run prints none


class ProgressLines:
    """Progress for logs without a terminal (CI): one line on stderr when a
    tenth of the items more is done, at most one per :data:`PROGRESS_QUIET_S`
    seconds and at least one per :data:`PROGRESS_EVERY_S`, so a long run shows
    it is alive without flooding the log and a short one stays quiet."""

    def __init__(self, total: int, what: str = "items", clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.what, self.clock = total, what, clock
        self.done = self.not_parity = 0
        self.started = self.last = clock()
        self.next_tenth = 1

    def advance(self, result: Any) -> None:
        self.done += 1
        if getattr(result, "status", PARITY) != PARITY:
            self.not_parity += 1
        now = self.clock()
        tenth = self.done * 10 // max(self.total, 1)
        quiet_for = now - self.last
        if (tenth >= self.next_tenth and quiet_for >= PROGRESS_QUIET_S) or quiet_for >= PROGRESS_EVERY_S:
            self.next_tenth = tenth + 1
            self.last = now
            percent = 100 * self.done // max(self.total, 1)
            print(
                f"parity: {self.done}/{self.total} {self.what} ({percent}%), {now - self.started:.0f} s, "
                f"{self.not_parity} not at parity",
                file=sys.stderr,
                flush=True,
            )

    def stop(self) -> None:
        pass


def progress_bar(total: int) -> tuple[Any, Any]:
    """A progress display for ``total`` items and the callback that advances it:
    a transient bar on a terminal, :class:`ProgressLines` in a log."""
    if not sys.stderr.isatty():
        lines = ProgressLines(total)
        return lines, lines.advance
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task("comparing", total=total)
    bar.start()
    return bar, lambda _result: bar.advance(task)
