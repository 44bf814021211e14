"""``parity shrink``: a divergent case reduced to a minimal one that diverges the same way."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.commands.common import EXIT_DIVERGENT, EXIT_PARITY
from harness.commands.options import choice_of, port_options, positive_int
from harness.engine import UsageError, open_oracle, select_device
from harness.model import Case
from harness.model.levels import SHRINKING_LEVELS, Level, kind_spec, shrinking_kind
from harness.sides.loading import load_port


def register(sub: Any) -> None:
    p_shrink = sub.add_parser("shrink", help="reduce a divergent case to a minimal one; write it as a case file")
    port_options(p_shrink)
    p_shrink.add_argument("case", metavar="CASE", help="a case file, or a case name in a suite")
    p_shrink.add_argument("--suite", help="suite to look the case name up in (default: smoke, then ci)")
    p_shrink.add_argument(
        "--level",
        type=choice_of(lambda: tuple(SHRINKING_LEVELS)),
        choices=tuple(SHRINKING_LEVELS),
        default=Level.LAYOUT,
        help="level to keep diverging",
    )
    p_shrink.add_argument("--budget", type=positive_int, default=2000, help="most evaluations (default 2000)")
    p_shrink.add_argument("--out", metavar="FILE", help="where to write the shrunk case")
    p_shrink.set_defaults(func=cmd_shrink)


def cmd_shrink(args: argparse.Namespace) -> int:
    """Reduce a divergent case to a minimal one that diverges the same way."""
    from harness.cases.files import write_case_file
    from harness.search.shrink import checker, describe_case, shrink
    from harness.verdicts.launch import program_words, shell_join
    from harness.verdicts.reproduce import resolve_item

    resolved = resolve_item(args.case, args.suite)
    case = resolved.item
    if not isinstance(case, Case):
        raise UsageError(f"{args.case}: a {resolved.kind} item; shrink takes a layout case (merge items are minimal)")
    port = load_port(args.port)
    level = args.level
    kind = kind_spec(shrinking_kind(level) or level)[0]
    if not kind.holds(case):
        raise UsageError(f"{args.case}: --level {level} needs {kind.noun(case)}")
    # Torch's threads fixed as in every comparing process (the ULP figures depend on them).
    kernels = select_device("cpu")
    oracle, _ = open_oracle(args.allow_oracle_drift, args.oracle)
    try:
        outcome = shrink(case, checker(oracle, port, level, kernels), budget=args.budget)
    except ValueError as exc:
        print(str(exc))
        return EXIT_PARITY
    out = Path(args.out or f"reports/out/shrunk/{outcome.case.name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_case_file(outcome.case, out, f"shrunk from {case.name} for port {port.name}: {outcome.result.detail()}")
    print(f"original: {describe_case(case)}")
    print(f"shrunk:   {describe_case(outcome.case)}  ({outcome.steps} steps, {outcome.evaluations} evaluations)")
    print(f"still {outcome.result.status}: {outcome.result.detail()}")
    print(f"wrote {out}  ({shell_join([*program_words(args.port), 'diff', str(out), '--port', args.port])})")
    return EXIT_DIVERGENT
