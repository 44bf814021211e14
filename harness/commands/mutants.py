"""``parity mutants``: the seeded mutant ports against the oracle; the kill matrix."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.commands.common import (
    EXIT_DIVERGENT,
    EXIT_PARITY,
    UsageError,
    guarded_shrink,
    open_oracle,
)
from harness.commands.options import non_negative_int, oracle_options
from harness.runner import LEVELS, CaseResult, selected_levels
from harness.suites import load_suite


def register(sub: Any) -> None:
    p_mutants = sub.add_parser("mutants", help="run the seeded mutant ports; write the kill matrix")
    p_mutants.add_argument("--suite", default="ci", help="suite to kill them with (default ci)")
    p_mutants.add_argument("--size", type=non_negative_int, help="generated layout cases (overrides the suite's count)")
    p_mutants.add_argument("--level", choices=(*LEVELS, "all"), default="all", help="parity level(s)")
    p_mutants.add_argument("--only", help="comma-separated mutant names")
    p_mutants.add_argument("--out", metavar="DIR", help="output folder (default reports/out/mutants-<suite>)")
    p_mutants.add_argument("--no-shrink", action="store_true", help="do not shrink the killing cases")
    oracle_options(p_mutants)
    p_mutants.set_defaults(func=cmd_mutants)


def cmd_mutants(args: argparse.Namespace) -> int:
    """Every seeded mutant against the oracle; the kill matrix."""
    from harness.kernels import CpuKernels
    from harness.mutants import kill_matrix, render_matrix, write_matrix
    from ports.mutants import MUTANTS

    names = args.only.split(",") if args.only else list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        raise UsageError(f"unknown mutant {unknown[0]!r} (known: {', '.join(MUTANTS)})")
    suite = load_suite(args.suite, size=args.size)
    levels = selected_levels(args.level)
    oracle, _ = open_oracle(args.allow_oracle_drift, args.oracle)
    out_dir = Path(args.out or f"reports/out/mutants-{suite.name}")
    kernels = CpuKernels()
    cases = {c.name: c for c in suite.cases}

    def shrink_kill(mutant: Any, level: str, kill: Any, result: CaseResult) -> None:
        case = cases.get(result.name)
        if args.no_shrink or case is None or level not in ("layout", "prefill") or result.kind == "workspace":
            return
        kill.shrunk = guarded_shrink(
            oracle, mutant, case, out_dir / "shrunk" / f"{mutant.name}-{level}.json", level, kernels
        )

    rows = kill_matrix(oracle, [MUTANTS[n]() for n in names], suite, levels, kernels, on_kill=shrink_kill)
    write_matrix(rows, levels, suite.name, out_dir)
    print(render_matrix(rows, levels, suite.name), end="")
    print(f"\nwrote {out_dir}/kill-matrix.md and kill-matrix.json")
    return EXIT_PARITY if all(r.killed for r in rows) else EXIT_DIVERGENT
