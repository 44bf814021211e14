"""``parity coverage``: what a suite exercises per input feature, against its targets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.cases.suites import load_suite, suite_names
from harness.commands.common import EXIT_DIVERGENT, EXIT_PARITY, EXIT_USAGE, write_output
from harness.commands.options import oracle_options
from harness.engine import UsageError, drift_banner, open_oracle


def register(sub: Any) -> None:
    p_coverage = sub.add_parser("coverage", help="what a suite exercises per input feature, against its targets")
    p_coverage.add_argument("--suite", default="ci", help=f"one of {', '.join(suite_names())} (default ci)")
    p_coverage.add_argument("--json", metavar="OUT", help="write the measured values and verdicts as JSON")
    p_coverage.add_argument("--targets", metavar="FILE", help="the targets file (default cases/coverage.json)")
    oracle_options(p_coverage)
    p_coverage.set_defaults(func=cmd_coverage)


def cmd_coverage(args: argparse.Namespace) -> int:
    """What a suite exercises per input feature, against its targets; 1 on a miss."""
    from harness.search.coverage_measuring import measure
    from harness.search.coverage_targets import TARGETS_FILE, display_path, load_targets
    from harness.search.coverage_verdicts import judge, write_json
    from reports.coverage import render_text

    path = Path(args.targets) if args.targets else TARGETS_FILE
    targets = load_targets(path, suite_names())
    if args.suite not in suite_names():
        load_suite(args.suite)  # refuses, naming the known suites
    if args.suite not in targets:
        raise UsageError(f"no coverage targets for suite {args.suite} in {display_path(path)}")
    suite = load_suite(args.suite)
    oracle, provenance = open_oracle(args.allow_oracle_drift, args.oracle)
    banner = drift_banner(provenance)
    if banner:
        print(banner)
    judged = judge(measure(suite, oracle), targets[args.suite], display_path(path))
    print(render_text(judged), end="")
    code = EXIT_DIVERGENT if judged.missed else EXIT_PARITY
    if args.json:
        if not write_output(lambda: write_json(judged, Path(args.json)), args.json):
            return code or EXIT_USAGE
        print(f"\nwrote {args.json}")
    return code
