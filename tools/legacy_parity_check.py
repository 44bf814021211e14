"""equal_share against vllm==0.27.1 on a suite's layout cases and workspace grid.

Usage (inside the 0.27.1 environment):
``.tox/vllm-0.27.1/bin/python tools/legacy_parity_check.py [--suite ci] [--size N] [--examples K]``

Every layout case goes through :class:`oracle.legacy.LegacyOracleSide` and
``ports.equal_share``; every workspace configuration through both sizings. It
prints counts: agree, differ (with the first examples: case, chunk, field, both
values), 0.27.1 refuses or cannot run (per reason class, with how equal_share
fared on them), and the workspace configurations that agree and differ. Exit 0
when nothing 0.27.1 can plan and run differs, else 1; bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from harness.cases.suites import Suite, load_suite
from harness.compare.dense import first_layout_divergence
from harness.kernels import kernels_for
from harness.model.levels import levels_where
from harness.sides.items import ORACLE_ERROR, PARITY
from harness.sides.runner import compare_merge, compare_prefill
from oracle.legacy import LegacyOracleSide, LegacyRefusal
from ports.equal_share import PORT


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="ci")
    parser.add_argument("--size", type=int, default=None, help="generated layout cases (the suite's count if absent)")
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--merge", type=int, default=0, help="also compare the first N merge (L2) items")
    parser.add_argument("--prefill", type=int, default=0, help="also compare the first N prefill (L3) items")
    parser.add_argument("--prefill-names", nargs="*", default=(), help="also compare these prefill items")
    parser.add_argument("--no-layout", action="store_true", help="skip the layout cases and workspace grid")
    args = parser.parse_args(argv)
    started = time.monotonic()
    suite = load_suite(args.suite, size=args.size)
    legacy = LegacyOracleSide()
    if args.no_layout:
        numeric_failures = compare_numeric(suite, legacy, args)
        print(f"({time.monotonic() - started:.0f} s)")
        return 1 if numeric_failures else 0
    agree, differ, refused = 0, [], Counter[str]()
    port_on_refused = Counter[tuple[str, str]]()
    for case in suite.cases:
        try:
            expected = legacy.plan_layout(case)
        except LegacyRefusal as exc:
            refused[str(exc)] += 1
            try:
                PORT.plan_layout(case)
                port_on_refused[(str(exc), "plans")] += 1
            except ValueError:
                port_on_refused[(str(exc), "refuses")] += 1
            continue
        try:
            got = PORT.plan_layout(case)
        except ValueError as exc:
            differ.append(f"{case.name}: equal_share refuses ({exc})")
            continue
        divergence = first_layout_divergence(expected, got)
        if divergence is None:
            agree += 1
        else:
            differ.append(f"{case.name} ({case.family}): {divergence.message()}"[:400])
    print(
        f"layout cases: {len(suite.cases)}; agree {agree}; differ {len(differ)}; 0.27.1 refuses {sum(refused.values())}"
    )
    for line in differ[: args.examples]:
        print(f"  differ: {line}")
    for reason, count in refused.most_common():
        plans, refuses = port_on_refused[(reason, "plans")], port_on_refused[(reason, "refuses")]
        print(f"  {count:5} {reason}  [equal_share plans {plans}, refuses {refuses}]")
    same, sizes_differ = 0, []
    for config in suite.workspace_configs:
        a, b = legacy.workspace_size(config), PORT.workspace_size(config)
        if a == b:
            same += 1
        else:
            sizes_differ.append(f"{config.name}: 0.27.1 {a}, equal_share {b}")
    print(f"workspace configs: {len(suite.workspace_configs)}; agree {same}; differ {len(sizes_differ)}")
    for line in sizes_differ[: args.examples]:
        print(f"  differ: {line}")
    numeric_failures = compare_numeric(suite, legacy, args)
    print(f"({time.monotonic() - started:.0f} s)")
    return 1 if differ or sizes_differ or numeric_failures else 0


def compare_numeric(suite: Suite, legacy: LegacyOracleSide, args: argparse.Namespace) -> int:
    """L2 and L3 items through the runner's own comparisons (bit patterns); the
    number that are neither parity nor a 0.27.1 refusal."""
    kernels = kernels_for("cpu")
    results = [compare_merge(legacy, PORT, case) for case in suite.merge_cases[: args.merge]]
    prefill_cases = [case for case in suite.cases if case.numeric is not None]
    chosen = prefill_cases[: args.prefill] + [c for c in prefill_cases if c.name in args.prefill_names]
    results += [compare_prefill(legacy, PORT, case, kernels) for case in chosen]
    # The dense float levels (the runner's comparisons above).
    for level in levels_where(lambda spec: spec.floats and not spec.sparse):
        statuses = Counter(r.status for r in results if r.level == level)
        if statuses:
            print(f"{level} items: " + ", ".join(f"{status} {n}" for status, n in sorted(statuses.items())))
    failing = [r for r in results if r.status not in (PARITY, ORACLE_ERROR)]
    for r in [r for r in results if r.status != PARITY][: args.examples]:
        print(f"  {r.status}: {r.name} ({r.family}): {r.detail()}"[:400])
    return len(failing)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
