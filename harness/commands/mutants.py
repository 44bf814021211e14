"""``parity mutants``: the seeded mutant ports against the oracle; the kill matrix."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.cases.suites import load_suite
from harness.commands.common import (
    EXIT_DIVERGENT,
    EXIT_PARITY,
    open_command_oracle,
    run_request,
)
from harness.commands.options import (
    SIZE_HELP,
    jobs_options,
    level_choice,
    non_negative_int,
    oracle_options,
    positive_seconds,
)
from harness.engine import (
    UsageError,
    guarded_shrink,
    new_pool,
    pool_failure,
    prepare_device,
    select_device,
    worker_spec,
)
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S
from harness.sides.items import LEVELS, selected_levels


def register(sub: Any) -> None:
    p_mutants = sub.add_parser("mutants", help="run the seeded mutant ports; write the kill matrix")
    p_mutants.add_argument("--suite", default="ci", help="suite to kill them with (default ci)")
    p_mutants.add_argument("--size", type=non_negative_int, help=SIZE_HELP)
    p_mutants.add_argument(
        "--level", type=level_choice, choices=(*LEVELS, "all"), default="all", help="parity level(s)"
    )
    p_mutants.add_argument("--only", help="comma-separated mutant names")
    p_mutants.add_argument("--out", metavar="DIR", help="output folder (default reports/out/mutants-<suite>)")
    p_mutants.add_argument("--no-shrink", action="store_true", help="do not shrink the killing cases")
    p_mutants.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_PORT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"seconds one mutant call may take; a call past it is no kill (default {DEFAULT_PORT_TIMEOUT_S:g})",
    )
    p_mutants.add_argument(
        "--exhaustive",
        action="store_true",
        help="run every mutant on every item (default: only on the items whose run of the fault-free base "
        "calls the mutant's fault, or is not at parity; the matrix is the same)",
    )
    oracle_options(p_mutants)
    jobs_options(p_mutants)
    p_mutants.set_defaults(func=cmd_mutants)


def cmd_mutants(args: argparse.Namespace) -> int:
    """Every seeded mutant against the oracle; the kill matrix. With ``--jobs``
    above 1 the (mutant, level) searches run side by side in worker processes;
    the matrix and the shrunk files are the same."""
    from harness.search.mutants import ShrinkKills, estimated_matrix_seconds, kill_matrix, render_matrix, write_matrix
    from harness.sides.job_sizing import resolve_jobs
    from harness.sides.pool import PoolError

    # Mutants run on the CPU; its recipe before the mutants import Triton (the
    # oracle's interpreted kernels call Triton's helpers, built in import-time mode).
    prepare_device("cpu")
    from ports.mutants import MUTANTS, fault_probe

    names = args.only.split(",") if args.only else list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        raise UsageError(f"unknown mutant {unknown[0]!r} (known: {', '.join(MUTANTS)})")
    suite = load_suite(args.suite, size=args.size)
    levels = selected_levels(args.level)
    searches = len(names) * len(levels)
    jobs = resolve_jobs(args.jobs, estimated_matrix_seconds(suite, levels, len(names)), searches)
    pool = new_pool(run_request(args), jobs, worker_spec(run_request(args)))
    try:
        if pool is not None:
            pool.start()
        kernels = select_device("cpu")
        oracle, provenance = open_command_oracle(args)
        if pool is not None:
            pool.expect_provenance(provenance)
        out_dir = Path(args.out or f"reports/out/mutants-{suite.name}")
        shrink = None if args.no_shrink else ShrinkKills(out_dir / "shrunk", guarded_shrink)
        mutants = [MUTANTS[n]() for n in names]
        probe = None if args.exhaustive else fault_probe
        rows = kill_matrix(
            oracle, mutants, suite, levels, kernels, shrink=shrink, pool=pool, probe=probe, timeout_s=args.timeout
        )
    except PoolError as exc:
        raise pool_failure(exc, args.executor) from None
    finally:
        if pool is not None:
            pool.close()
    write_matrix(rows, levels, suite.name, out_dir)
    print(render_matrix(rows, levels, suite.name), end="")
    print(f"\nwrote {out_dir}/kill-matrix.md and kill-matrix.json")
    return EXIT_PARITY if all(r.killed or r.searched_nowhere for r in rows) else EXIT_DIVERGENT
