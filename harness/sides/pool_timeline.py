"""Where a worker pool's time goes, for the scaling benchmark
(``benchmarks/executor_scaling.py``): each worker's start-up and busy time,
and the seconds the parent waited for a worker's message, against the pool's
wall time. Kept by every pool (a few clock reads per task); written, as JSON,
when the pool closes and ``PARITY_POOL_PROFILE`` names a file.

What the figures tell apart: workers that start late (``ready_s``), workers
idle while the parent is busy digesting results (``parent_busy_s`` near
``wall_s`` and ``waiting_s`` small), and a long tail (``last_done_s`` far past
the mean of the workers' busy time).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILE_VARIABLE = "PARITY_POOL_PROFILE"


@dataclass
class PoolTimeline:
    """Clock readings of one pool, in seconds since it was created."""

    created: float = field(default_factory=time.perf_counter)
    ready_s: list[float] = field(default_factory=list)
    busy_s: dict[int, float] = field(default_factory=dict)
    tasks: int = 0
    waiting_s: float = 0.0
    first_dispatch_s: float | None = None
    last_done_s: float | None = None

    def now(self) -> float:
        return time.perf_counter() - self.created

    def worker_ready(self) -> None:
        self.ready_s.append(self.now())

    def task_started(self) -> float:
        now = self.now()
        if self.first_dispatch_s is None:
            self.first_dispatch_s = now
        self.tasks += 1
        return now

    def task_ended(self, worker: int, started: float) -> None:
        now = self.now()
        self.busy_s[worker] = self.busy_s.get(worker, 0.0) + now - started
        self.last_done_s = now

    def waited(self, seconds: float) -> None:
        self.waiting_s += seconds

    def to_json(self) -> dict[str, Any]:
        wall = self.now()
        return {
            "wall_s": wall,
            "workers": len(self.ready_s),
            "ready_s": self.ready_s,
            "busy_s": sorted(self.busy_s.values()),
            "tasks": self.tasks,
            "waiting_s": self.waiting_s,
            "parent_busy_s": wall - self.waiting_s,
            "first_dispatch_s": self.first_dispatch_s,
            "last_done_s": self.last_done_s,
        }

    def write(self) -> None:
        """Append this pool's figures to ``$PARITY_POOL_PROFILE`` (one JSON line per pool), if set."""
        path = os.environ.get(PROFILE_VARIABLE)
        if path:
            with Path(path).open("a", encoding="utf-8") as out:
                out.write(json.dumps(self.to_json()) + "\n")
