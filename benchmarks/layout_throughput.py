"""L1 throughput: figures printed, never asserted (run with ``make bench``).

* the ci suite's layout cases per second, for the oracle alone and for oracle +
  port + comparison (the work of ``parity run``);
* SPEC section 4's oracle figures: upstream metadata builds per second for 8-,
  128- and 1024-request batches, and the planner alone for 8 requests.
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from collections.abc import Callable
from functools import partial

from harness.cases.suites import load_suite
from harness.model import Case
from harness.sides.loading import load_port
from harness.sides.runner import compare_case
from oracle.side import OracleSide


def rate(fn: Callable[[], object], items: int, min_seconds: float = 1.0) -> float:
    """Items per second, repeating ``fn`` until at least ``min_seconds`` pass."""
    fn()  # warm-up
    rounds, started = 0, time.perf_counter()
    while True:
        fn()
        rounds += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return rounds * items / elapsed


def batch(n: int, seed: int) -> Case:
    rng = random.Random(seed)
    contexts = tuple(rng.randint(0, 4096) for _ in range(n))
    return Case(f"bench-{n}", contexts, tuple(rng.randint(1, 512) for _ in range(n)), 16, 65536)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", default="per_request")
    args = parser.parse_args()
    oracle, port = OracleSide(), load_port(args.port)
    cases = load_suite("ci").cases
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(f"ci suite: {len(cases)} layout cases, {sum(sum(c.context_lens) for c in cases):,} context rows")

    started = time.perf_counter()
    for case in cases:
        oracle.plan_layout(case)
    oracle_alone = time.perf_counter() - started
    started = time.perf_counter()
    for case in cases:
        compare_case(oracle, port, case)
    full = time.perf_counter() - started
    print(f"L1 oracle alone:                {len(cases) / oracle_alone:8.0f} cases/s ({oracle_alone:.1f} s)")
    print(f"L1 oracle + {port.name} + compare: {len(cases) / full:8.0f} cases/s ({full:.1f} s)")

    for n in (8, 128, 1024):
        case = batch(n, n)
        builds = rate(partial(oracle.upstream_metadata, case), 1)
        print(f"oracle metadata build, {n:4} requests: {builds:9.0f} /s")
    case = batch(8, 8)
    plans = rate(partial(oracle.upstream_plan, case), 1)
    print(f"oracle planner alone,     8 requests: {plans:9.0f} /s")


if __name__ == "__main__":
    main()
