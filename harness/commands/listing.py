"""``parity list``: what the harness knows by name (suites, their items, mutants, ports)."""

from __future__ import annotations

import argparse
from typing import Any

from harness.cases.suites import load_suite, suite_names
from harness.commands.common import EXIT_PARITY
from harness.commands.options import PORT_FORMS, SIZE_HELP, non_negative_int
from harness.engine import UsageError

WHAT = ("suites", "cases", "mutants", "ports")


def register(sub: Any) -> None:
    p = sub.add_parser("list", help="the suites, a suite's items, the mutants or the port forms, one per line")
    p.add_argument("what", choices=WHAT, help="what to list")
    p.add_argument("--suite", default="smoke", help="for `list cases`: the suite whose items to list (default smoke)")
    p.add_argument("--size", type=non_negative_int, help="for `list cases`: " + SIZE_HELP)
    p.set_defaults(func=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    if args.what == "suites":
        from harness.cases.suites import suite_description

        for name in suite_names():
            print(f"{name:<10} {_abridged(suite_description(name))}")
    elif args.what == "cases":
        from harness.sides.items import LEVELS, item_id
        from harness.sides.runner import plan_items

        if args.suite not in suite_names():
            raise UsageError(f"--suite {args.suite}: no such suite (known: {', '.join(suite_names())})")
        suite = load_suite(args.suite, size=args.size)
        # The ids every report prints, and `parity diff` takes as they are.
        for kind, item in plan_items(suite, LEVELS):
            print(f"{suite.name}/{item_id(kind, item.name)}")
    elif args.what == "mutants":
        from ports.mutants import MUTANTS

        width = max(map(len, MUTANTS))
        for name, mutant in MUTANTS.items():
            aimed = f"  [{mutant.aimed_at}]" if mutant.aimed_at else ""
            print(f"mutant:{name:<{width}}  {mutant.description}{aimed}")
    else:
        width = max(len(form) for form, _ in PORT_FORMS)
        for form, meaning in PORT_FORMS:
            print(f"{form:<{width}}  {meaning}")
    return EXIT_PARITY


def _abridged(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
