"""A pool worker's memory: the figure ``--jobs`` caps the workers with.

Runs the smoke suite on two workers in this process (the engine's
:func:`~harness.engine.execute`, as ``parity run --suite smoke --jobs 2`` does) and samples, every
50 ms, the peak resident memory (``VmHWM``) of each worker process it starts;
prints the largest, beside harness.sides.job_sizing.WORKER_MEMORY_BYTES. Printed, never
asserted: run it with nothing else on the machine.

    .tox/oracle/bin/python -m benchmarks.worker_memory
"""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path

from harness.engine import RunRequest, execute
from harness.sides.job_sizing import WORKER_MEMORY_BYTES


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _peak_rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="smoke")
    args = parser.parse_args()
    peaks: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            for child in _children(os.getpid()):
                peaks[child] = max(peaks.get(child, 0), _peak_rss_bytes(child))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        done = execute(RunRequest(port="per_request", suite=args.suite, jobs=2), keep_layouts=False)
        done.close()
    finally:
        stop.set()
        sampler.join()
    workers = sorted(peaks.values(), reverse=True)[:2]
    print(f"\n{args.suite} on 2 workers: {len(done.table)} items")
    for number, peak in enumerate(workers, 1):
        print(f"worker {number}: peak resident {peak / 2**20:.0f} MiB")
    print(f"harness.sides.job_sizing.WORKER_MEMORY_BYTES: {WORKER_MEMORY_BYTES / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
