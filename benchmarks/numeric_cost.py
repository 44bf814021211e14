"""L2 and L3 cost on the CPU: seconds per case, printed, never asserted.

For the ci suite's merge (L2) and prefill (L3) cases: the oracle alone (its
Triton merge under the interpreter; its context loop on the shared kernels), and
oracle + port + bitwise comparison (the work of ``parity run --level merge|prefill``).
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from harness.cases.suites import load_suite
from harness.kernels import CpuKernels
from harness.kernels.numeric import materialise_merge, materialise_prefill
from harness.sides.loading import load_port
from harness.sides.runner import compare_merge, compare_prefill
from oracle.side import OracleSide


def seconds_per_case(items: Sequence[Any], fn: Callable[[Any], object]) -> float:
    started = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - started) / len(items)


def main() -> None:
    warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", default="per_request")
    args = parser.parse_args()
    oracle, port, kernels = OracleSide(), load_port(args.port), CpuKernels()
    suite = load_suite("ci")
    merges = suite.merge_cases
    prefills = [c for c in suite.cases if c.numeric is not None]
    # Warm the interpreter and the oracle's imports once, outside the figures.
    compare_merge(oracle, port, merges[0])
    compare_prefill(oracle, port, prefills[0], kernels)

    def oracle_merge(case: Any) -> object:
        return oracle.merge_states(materialise_merge(case))

    def oracle_prefill(case: Any) -> object:
        inputs = materialise_prefill(case.context_lens, case.query_lens, case.block_size, case.numeric)
        return oracle.prefill(case, inputs, kernels)

    rows = [
        (
            "L2 merge",
            len(merges),
            seconds_per_case(merges, oracle_merge),
            seconds_per_case(merges, lambda c: compare_merge(oracle, port, c)),
        ),
        (
            "L3 prefill",
            len(prefills),
            seconds_per_case(prefills, oracle_prefill),
            seconds_per_case(prefills, lambda c: compare_prefill(oracle, port, c, kernels)),
        ),
    ]
    print(f"ci suite, port {port.name}, CPU (Triton interpreter)")
    print(f"{'level':<12}{'cases':>7}{'oracle alone s/case':>22}{'oracle+port+compare s/case':>30}")
    for level, count, alone, full in rows:
        print(f"{level:<12}{count:>7}{alone:>22.4f}{full:>30.4f}")


if __name__ == "__main__":
    main()
