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
    p_coverage = sub.add_parser(
        "coverage", help="what a suite exercises per input feature, against its targets, and its MC/DC"
    )
    p_coverage.add_argument("--suite", default="ci", help=f"one of {', '.join(suite_names())} (default ci)")
    p_coverage.add_argument("--json", metavar="OUT", help="write the measured values and verdicts as JSON")
    p_coverage.add_argument("--targets", metavar="FILE", help="the targets file (default cases/coverage.json)")
    oracle_options(p_coverage)
    p_coverage.set_defaults(func=cmd_coverage)


def cmd_coverage(args: argparse.Namespace) -> int:
    """What a suite exercises per input feature, against its targets, and its MC/DC; 1 on a miss
    (an unmet condition or a table the oracle disagrees with, where the suite holds MC/DC)."""
    from harness.search.coverage_measuring import measure
    from harness.search.coverage_targets import TARGETS_FILE, display_path, load_targets
    from harness.search.coverage_verdicts import judge, write_json_document
    from harness.search.mcdc_measure import measure_mcdc
    from reports.coverage import render_text
    from reports.mcdc import render_text as render_mcdc

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
    mcdc = measure_mcdc(suite, oracle)
    print()
    print(render_mcdc(mcdc), end="")
    if not suite.mcdc:
        print(f'(MC/DC shown, not held: suite {suite.name} sets no "mcdc" in cases/suites.json)')
    failed = bool(judged.missed) or (suite.mcdc and not mcdc.met)
    code = EXIT_DIVERGENT if failed else EXIT_PARITY
    if args.json:
        document = {**judged.to_json(), "mcdc": {**mcdc.to_json(), "held": suite.mcdc}}
        if not write_output(lambda: write_json_document(document, Path(args.json)), args.json):
            return code or EXIT_USAGE
        print(f"\nwrote {args.json}")
    return code
