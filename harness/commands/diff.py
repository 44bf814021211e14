"""``parity diff``: one case, the oracle's and the port's results side by side."""

from __future__ import annotations

import argparse
from typing import Any

from harness.commands.common import (
    EXIT_DIVERGENT,
    EXIT_PARITY,
    UsageError,
    drift_banner,
    find_case,
    open_oracle,
    select_device,
    selected_levels,
)
from harness.commands.options import device_option, port_options
from harness.model import Case, MergeCase
from harness.port import load_port
from harness.runner import LEVELS, run_item
from reports.diff_text import format_diff, format_tensor_verdict


def register(sub: Any) -> None:
    p = sub.add_parser("diff", help="side-by-side chunks of the oracle and a port for one case")
    port_options(p)
    device_option(p)
    p.add_argument("case", metavar="CASE", help="a case file, or a case name in a suite")
    p.add_argument("--suite", help="suite to look the case name up in (default: smoke, then ci)")
    p.add_argument("--level", choices=(*LEVELS, "all"), default="all", help="parity level(s) to check")
    p.set_defaults(func=cmd_diff)


def cmd_diff(args: argparse.Namespace) -> int:
    port = load_port(args.port)
    case = find_case(args.case, args.suite)
    diff_items(case, args.case, args.level)  # refuse an empty selection before any work
    kernels = select_device(args.device)
    oracle, provenance = open_oracle(args.allow_oracle_drift)
    banner = drift_banner(provenance)
    if banner:
        print(banner)
    print(
        f"oracle {provenance['release']} (upstream {provenance['upstream_commit']})  vs  port {port.name}"
        f"  on {args.device}"
    )
    if isinstance(case, MergeCase):
        print(f"merge case {case.name}: {case.to_json()}")
        result = run_item(oracle, port, "merge", case, kernels, args.device)
        print(format_tensor_verdict("L2 merge", result))
        return EXIT_PARITY if result.ok else EXIT_DIVERGENT
    results = []
    for kind, _ in diff_items(case, args.case, args.level):
        results.append(run_item(oracle, port, kind, case, kernels, args.device))
        if kind == "layout":
            print(format_diff(case, results[-1]))
        else:
            print(format_tensor_verdict("L3 prefill", results[-1]))
    if case.numeric is None and args.level == "all":
        print("L3 prefill: no item (the case has no numeric section)")
    return EXIT_PARITY if all(r.ok for r in results) else EXIT_DIVERGENT


def diff_items(case: Case | MergeCase, spec: str, level: str) -> list[tuple[str, Case | MergeCase]]:
    """The items ``parity diff`` compares for ``case`` at ``level``; none is usage."""
    levels = selected_levels(level)
    if isinstance(case, MergeCase):
        items: list[tuple[str, Case | MergeCase]] = [("merge", case)] if "merge" in levels else []
    else:
        items = [("layout", case)] if "layout" in levels else []
        if "prefill" in levels and case.numeric is not None:
            items.append(("prefill", case))
    if not items:
        kind = "a merge case" if isinstance(case, MergeCase) else "a layout-only case"
        has = "merge" if isinstance(case, MergeCase) else ("layout, prefill" if case.numeric else "layout")
        raise UsageError(f"{spec}: --level {level} selects no items of {kind} (it has {has}); nothing to compare")
    return items
