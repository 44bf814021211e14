"""``parity``: the command line (also ``python -m harness``).

This module builds the parser from the command modules in
:mod:`harness.commands` (one per command) and maps their outcome to the exit
code: 0 every item at parity, 1 some item diverges or errors (for
``coverage``: some target is missed), 2 bad input or usage (one line on stderr
naming the file, field and reason), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
import warnings

from harness.cases import CaseError
from harness.commands import coverage, diff, gate, mutants, nightly, oracle, run, shrink
from harness.commands.common import EXIT_USAGE, UsageError
from harness.port import PortLoadError

COMMANDS = (run, gate, diff, nightly, mutants, shrink, coverage)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    from harness.explore import add_parser as add_explore_parser

    add_explore_parser(sub)
    oracle.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Triton's interpreter evaluates -inf - -inf in numpy before the kernel selects
    # the -inf it wants; the warning is noise in every numeric run.
    warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except (CaseError, PortLoadError, UsageError) as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
