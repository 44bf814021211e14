"""Items per second against the number of workers, printed, never asserted.

    python -m benchmarks.executor_scaling [--workers 1,2,4,8,16] [--suite ci] [--level all]
                                          [--executor local|ray] [--json FILE]

Each point is one ``parity run`` as a user runs it (a fresh process, every
oracle result computed afresh: ``--no-oracle-cache``), with ``--jobs N``:
its wall time, items per second, the speed-up over the first point and the
efficiency (speed-up over N; the target is 0.6 at 16 workers). With
``--executor ray`` the workers are actors of a Ray cluster started in the
run's own process. For the local pool each point also prints where the time
went (:mod:`harness.sides.pool_timeline`): when the workers were ready, how
long each was busy, and how long the parent waited for them against the wall
time; a parent that hardly waits is what bounds the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.sides.pool_timeline import PROFILE_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
TARGET_EFFICIENCY = 0.6


def point(workers: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """One ``parity run`` with ``workers`` workers: its figures."""
    rows, profile = scratch / f"rows-{workers}.jsonl", scratch / f"profile-{workers}.jsonl"
    command = [sys.executable, "-m", "harness", "run", "--suite", args.suite, "--level", args.level,
               "--no-oracle-cache", "--jobs", str(workers), "--results", str(rows)]  # fmt: skip
    if args.executor == "ray":
        command += ["--executor", "ray", "--ray-address", "local"]
    env = {**os.environ, PROFILE_VARIABLE: str(profile), "PARITY_ORACLE_CACHE": str(scratch / "unused-cache")}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"executor_scaling: {' '.join(command)} failed (exit {done.returncode}): {done.stderr[-800:]}")
    items = len(rows.read_text(encoding="utf-8").splitlines()) - 1
    pools = [json.loads(line) for line in profile.read_text(encoding="utf-8").splitlines()] if profile.exists() else []
    return {"workers": workers, "seconds": seconds, "items": items, "items_per_s": items / seconds,
            "pool": pools[-1] if pools else None}  # fmt: skip


def where_time_went(pool: dict[str, Any] | None, workers: int, executor: str) -> str:
    if not pool:
        return "no pool timeline (Ray actors)" if executor == "ray" and workers > 0 else "in one process (no pool)"
    busy = pool["busy_s"] or [0.0]
    ready = pool["ready_s"] or [0.0]
    return (
        f"workers ready {min(ready):.1f}-{max(ready):.1f} s; busy mean {statistics.mean(busy):.1f} s, "
        f"max {max(busy):.1f} s over {pool['tasks']} tasks; parent waited {pool['waiting_s']:.1f} s "
        f"of {pool['wall_s']:.1f} s (busy {pool['parent_busy_s']:.1f} s); last task done at "
        f"{pool['last_done_s'] or 0:.1f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.executor_scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--suite", default="ci")
    parser.add_argument("--level", default="all")
    parser.add_argument("--executor", choices=("local", "ray"), default="local")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}; parity run --suite {args.suite} --level {args.level} "
          f"--no-oracle-cache, executor {args.executor}")  # fmt: skip
    figures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="parity-scaling-") as scratch:
        for workers in counts:
            figure = point(workers, args, Path(scratch))
            # Against the first point, taken as ideal (with --workers 1,..., the run in one process).
            base = figures[0] if figures else figure
            figure["speedup"] = base["seconds"] / figure["seconds"] * base["workers"]
            figure["efficiency"] = figure["speedup"] / workers
            figures.append(figure)
            print(f"  {workers:>3} workers: {figure['seconds']:7.1f} s, {figure['items']:,} items, "
                  f"{figure['items_per_s']:7.1f} items/s, speed-up {figure['speedup']:.2f}, "
                  f"efficiency {figure['efficiency']:.2f} (target {TARGET_EFFICIENCY} at 16)", flush=True)  # fmt: skip
            print(f"        {where_time_went(figure['pool'], workers, args.executor)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
