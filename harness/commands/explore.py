"""``parity explore``: a property-based search (harness/search/explore.py) for inputs
where a port and the oracle differ, or the replay of one find."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.common import open_command_oracle, run_request
from harness.commands.diff import compare_and_print
from harness.commands.options import PORT_HELP, jobs_options, level_choice, oracle_options
from harness.engine import UsageError, close_port, new_pool, pool_failure, select_device, worker_spec
from harness.protocol.port import Port, port_levels
from harness.search.explore import explore
from harness.search.explore_finds import load_find, replay_kinds
from harness.search.explore_results import EXIT_CLEAN, EXIT_FOUND
from harness.sides.items import LEVELS, level_of, selected_levels
from harness.sides.job_sizing import resolve_jobs
from harness.sides.loading import load_port
from harness.sides.pool import Executor, PoolError

if TYPE_CHECKING:
    from harness.kernels import SharedKernels


def register(sub: Any) -> None:
    p = sub.add_parser(
        "explore", help="property-based search (hypothesis) for inputs where a port and the oracle differ"
    )
    p.add_argument("--port", default="per_request", help=PORT_HELP)
    p.add_argument(
        "--level",
        type=level_choice,
        choices=(*LEVELS, "all"),
        default="layout",
        help="layout (cases and workspace configs; the default), merge, prefill, or all",
    )
    p.add_argument("--budget-s", type=float, default=60.0, help="wall seconds for the search (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seeds hypothesis's generation (default 0)")
    p.add_argument("--out", metavar="DIR", help="output folder (default reports/out/explore-<port>)")
    p.add_argument("--replay", metavar="FILE", help="compare one find file (workspace and merge finds) and stop")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where L2 and L3 run")
    oracle_options(p)
    jobs_options(p)
    p.set_defaults(func=cmd_explore)


def cmd_explore(args: argparse.Namespace) -> int:
    if not (args.budget_s > 0 and math.isfinite(args.budget_s)):
        raise UsageError(f"--budget-s: must be a positive number of seconds, got {args.budget_s}")
    if args.seed < 0:
        raise UsageError(f"--seed: must be >= 0, got {args.seed}")
    port = load_port(args.port)
    try:
        if args.replay:
            kind, item = load_find(Path(args.replay))
            missing = [k for k in replay_kinds(kind, item) if level_of(k) not in port_levels(port)]
            if missing:
                raise UsageError(f"{args.replay}: port {port.name} does not implement level {missing[0]}")
            kernels = select_device(args.device)
            oracle, _ = open_command_oracle(args)
            return replay(oracle, port, kind, item, kernels, args.device)
        levels = selected_levels(args.level)
        missing = [lv for lv in levels if lv not in port_levels(port)]
        if args.level != "all" and missing:
            raise UsageError(
                f"--level {args.level}: port {port.name} does not implement it "
                f"(it implements {', '.join(port_levels(port))})"
            )
        out_dir = Path(args.out or f"reports/out/explore-{port.name}")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {out_dir}: cannot create the folder ({exc.strerror or exc})") from None
        pool = explore_pool(args, port, levels)
        try:
            kernels = select_device(args.device)
            oracle, provenance = open_command_oracle(args)
            if pool is not None:
                pool.expect_provenance(provenance)
            if provenance.get("oracle_drift_overridden"):
                print("WARNING: oracle fingerprints overridden (--allow-oracle-drift)", file=sys.stderr)
            print(f"exploring port {port.name} at level {args.level} for {args.budget_s:g}s (seed {args.seed})")
            result = explore(
                oracle, port, args.port, args.level, args.budget_s, args.seed, out_dir, kernels, args.device, pool=pool
            )
        except PoolError as exc:
            raise pool_failure(exc, args.executor) from None
        finally:
            if pool is not None:
                pool.close()
    finally:
        close_port(port)
    for run in result.runs:
        before = (
            f", first find after {run.examples_before_find} ({run.seconds_to_find:.1f}s)"
            if run.examples_before_find
            else ""
        )
        print(
            f"  {run.name:<10} {run.examples:>6} examples compared{before}, {run.refused} refused by the oracle, "
            f"{run.seconds:.1f}s, ended by {run.ended_by}" + (f" ({run.error})" if run.error else "")
        )
    for note in result.notes:
        print(f"  note: {note}")
    for find in result.finds:
        flags = [flag for flag in ("replayed", "flaky", "shrink_cut_short") if getattr(find, flag)]
        print(f"\n{find.property} {find.status}: {find.detail}" + (f"  ({', '.join(flags)})" if flags else ""))
        print(f"  input:     {find.size}")
        print(f"  reproduce: {find.command}")
    print(f"\n{result.headline()}")
    print(f"wrote {out_dir}/explore.json and summary.md")
    return result.exit_code


def explore_pool(args: argparse.Namespace, port: Port, levels: tuple[str, ...]) -> Executor | None:
    """Workers for the search's properties (one each at most), started; None for one process."""
    from harness.search.explore_strategies import properties_for

    searched = [p for p in properties_for(levels) if p.level in port_levels(port)]
    jobs = resolve_jobs(args.jobs, args.budget_s, len(searched))
    pool = new_pool(run_request(args), jobs, worker_spec(run_request(args), [args.port]))
    if pool is not None:
        pool.start()
    return pool


def replay(oracle: Port, port: Port, kind: str, item: Any, kernels: SharedKernels, device: str) -> int:
    """Compare the item of one find file (:func:`load_find`) as ``parity diff``
    does, printing what it prints. 0 parity, 1 not."""
    results = compare_and_print(oracle, port, item, replay_kinds(kind, item), kernels, device)
    return EXIT_CLEAN if all(r.ok for r in results) else EXIT_FOUND
