"""``parity nightly``: every port over the nightly suite; the dated report."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.cases.suites import Suite, load_suite
from harness.commands.common import EXIT_USAGE, open_command_oracle, run_request
from harness.commands.options import (
    SIZE_HELP,
    jobs_options,
    level_choice,
    non_negative_int,
    non_negative_seconds,
    oracle_options,
    positive_seconds,
)
from harness.engine import (
    ProgressLines,
    UsageError,
    close_port,
    describe_selection,
    new_pool,
    note_unimplemented,
    parse_shard,
    pool_failure,
    prepare_device,
    refuse_empty,
    select_device,
    worker_spec,
)
from harness.night.sizes import DEFAULT_EXPLORE_BUDGET_S
from harness.sides.item_stream import planned_items
from harness.sides.items import LEVELS, selected_levels
from harness.sides.job_sizing import estimated_seconds, resolve_jobs
from harness.sides.loading import load_port
from harness.sides.pool import Executor, PoolError
from harness.sides.runner import Shard, count_items


def register(sub: Any) -> None:
    p_nightly = sub.add_parser("nightly", help="every port over the nightly suite; HTML and Markdown report")
    p_nightly.add_argument("--size", type=non_negative_int, help=SIZE_HELP + " (default: the suite's 50,000)")
    p_nightly.add_argument(
        "--numeric-size",
        type=non_negative_int,
        help="the first merge, prefill, top-k mask and sparse L3 group's count; later groups scale with it "
        "(default: --size's share of the suite's)",
    )
    p_nightly.add_argument(
        "--level", type=level_choice, choices=(*LEVELS, "all"), default="all", help="parity level(s) to check"
    )
    p_nightly.add_argument(
        "--ports",
        help="comma-separated ports, each in a form --port takes (parity list ports); default: every built-in port",
    )
    p_nightly.add_argument("--shard", metavar="K/N", help="run only shard K of N")
    p_nightly.add_argument("--from-shards", nargs="+", metavar="DIR", help="merge shard outputs into one report")
    p_nightly.add_argument("--out", default="reports", help="report root; the report goes to <out>/<date>/")
    p_nightly.add_argument("--history", help="history store (default <out>/history.jsonl)")
    p_nightly.add_argument("--date", help="report date, YYYY-MM-DD: the folder <out>/<date> (default today)")
    p_nightly.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="PORT=FILE",
        help="judge PORT (its name or --ports spelling) against the expected divergences in FILE "
        "(harness/verdicts/baseline.py; repeatable; PORT=none for no baseline); a built-in port defaults to "
        "cases/baselines/<port>-<suite>.json, else cases/baselines/<port>.json, when it exists",
    )
    p_nightly.add_argument(
        "--gpu-reports", default="reports/gpu", help="the latest <date>.json here is the report's GPU section"
    )
    p_nightly.add_argument("--skip-mutants", action="store_true", help="leave the mutant kill matrix out")
    p_nightly.add_argument(
        "--time-limit",
        type=positive_seconds,
        metavar="SECONDS",
        help="seconds the night's ports may take; then it stops, writing everything measured (INCOMPLETE)",
    )
    p_nightly.add_argument(
        "--explore-budget-s",
        type=non_negative_seconds,
        default=DEFAULT_EXPLORE_BUDGET_S,
        help=f"seconds of parity explore per port after the suite (default {DEFAULT_EXPLORE_BUDGET_S:g}; "
        "0 leaves it out); "
        "its database lives in <out>/explore/<port>, so each night replays earlier finds",
    )
    oracle_options(p_nightly)
    jobs_options(p_nightly)
    p_nightly.set_defaults(func=cmd_nightly)


def cmd_nightly(args: argparse.Namespace) -> int:
    """Every registered port over the nightly suite, into <out>/<date>/, each
    judged against its baseline; the exit code is harness.night.data.night_exit_code's."""
    import datetime

    from harness.night.baselines import parse_baseline_options
    from harness.night.data import night_exit_code
    from harness.night.folder import validate_night_date
    from harness.night.nightly import NightlyPlan, run_nightly
    from harness.night.shards import merge_nightly_shards
    from harness.sides.loading import BUILTIN_PORTS
    from reports.nightly import write_report

    date = validate_night_date(args.date) if args.date is not None else datetime.date.today().isoformat()
    baselines = parse_baseline_options(args.baseline)
    out_dir = Path(args.out) / date
    history = Path(args.history) if args.history else Path(args.out) / "history.jsonl"
    gpu_reports = Path(args.gpu_reports)
    # Before any work: a report that cannot be written is one line, not tracebacks after the night.
    check_writable(Path(args.out), "--out")
    check_writable(history.parent, "--history")
    if args.from_shards:
        if baselines:
            raise UsageError("--baseline: not with --from-shards (each shard carries the baselines it ran with)")
        night = merge_nightly_shards(
            [Path(d) for d in args.from_shards], out_dir, history, write_report=write_report, gpu_reports=gpu_reports
        )
    else:
        port_names = args.ports.split(",") if args.ports else list(BUILTIN_PORTS)
        # The night runs on the CPU: its recipe before any port (or the mutants) imports Triton.
        prepare_device("cpu")
        ports = [load_port(name) for name in port_names]
        suite = load_suite("nightly", size=args.size, numeric_size=args.numeric_size)
        shard = parse_shard(args.shard)
        levels = selected_levels(args.level)
        for port in ports:
            refuse_empty(
                count_items(suite, levels, shard), f"port {port.name}: {describe_selection(suite, levels, shard)}"
            )
            note_unimplemented(port, levels)
        pool = nightly_pool(args, suite, levels, shard, port_names)
        try:
            # The CPU recipe and torch's one thread, as the workers have them (the same figures for any --jobs).
            select_device("cpu")
            oracle, provenance = open_command_oracle(args)
            if pool is not None:
                pool.expect_provenance(provenance)
        except BaseException as exc:
            if pool is not None:
                pool.close()
            if isinstance(exc, PoolError):
                raise pool_failure(exc, args.executor) from None
            raise
        plan = NightlyPlan(
            date,
            suite,
            levels,
            shard,
            out_dir,
            history,
            not args.skip_mutants,
            gpu_reports,
            explore_budget_s=args.explore_budget_s,
            port_specs=tuple(port_names),
            baselines=baselines,
            pool=pool,
            size=args.size,
            numeric_size=args.numeric_size,
            time_limit_s=args.time_limit,
        )
        try:
            night = run_nightly(plan, oracle, ports, provenance, write_report=write_report, progress=port_progress)
        except PoolError as exc:
            raise pool_failure(exc, args.executor) from None
        finally:
            if pool is not None:
                pool.close()
            for port in ports:
                close_port(port)
    for p in night.ports:
        counts = p.tally
        print(
            f"{p.port:<14} {p.verdict.upper():<10} {counts.items} items ({counts.expected} expected, "
            f"{counts.new} new) in {p.seconds:.1f}s"
        )
    state = "" if night.complete else f"  (INCOMPLETE: {'stopped early' if night.stopped else 'interrupted'})"
    if "report" not in night.unwritten:
        print(f"wrote {out_dir / 'index.html'} and {out_dir / 'report.md'}{state}")
    for result in night.explore:
        print(f"explore {result['port_spec']:<14} {result['verdict'].upper()}  {result['examples']} examples")
    code = night_exit_code(night)
    for line in night.unwritten.values():
        print(f"parity: error: {line}", file=sys.stderr)
    return (code or EXIT_USAGE) if night.unwritten else code


def check_writable(folder: Path, option: str) -> None:
    """``folder`` (created if missing) takes a file, or a UsageError: one line naming it and why."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {folder}: cannot write there ({exc.strerror or exc})") from None


def port_progress(total: int, what: str) -> tuple[Any, Any]:
    """common.progress_bar, saying what it counts (``items of port NAME``): a
    transient bar on a terminal, :class:`ProgressLines` in a log."""
    if not sys.stderr.isatty():
        lines = ProgressLines(total, what)
        return lines, lines.advance
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task(what, total=total)
    bar.start()
    return bar, lambda _result: bar.advance(task)


def nightly_pool(
    args: argparse.Namespace, suite: Suite, levels: tuple[str, ...], shard: Shard | None, port_specs: list[str]
) -> Executor | None:
    """The night's workers (its ports, kill matrix and searches share them),
    started; None for one process. The default --jobs weighs the ports' items
    and their searches (most mutants die within a few items: not counted)."""
    from ports.mutants import MUTANTS

    planned = planned_items(suite, levels, shard)
    estimate = (estimated_seconds(kind for _, kind, _ in planned) + args.explore_budget_s) * len(port_specs)
    jobs = resolve_jobs(args.jobs, estimate, max(len(planned), len(MUTANTS)))
    pool = new_pool(run_request(args), jobs, worker_spec(run_request(args), port_specs))
    if pool is not None:
        pool.start()
    return pool
