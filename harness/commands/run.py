"""``parity run``: a port against the oracle over a suite or case files; the summary on stdout."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.commands.common import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    dcp_backend_of,
    run_request,
    verdict_code,
    write_output,
)
from harness.commands.options import (
    dcp_backend_option,
    device_option,
    jobs_options,
    non_negative_int,
    port_options,
    selection_options,
)
from harness.engine import drift_banner, execute, reproduce_meta
from reports.failure_text import failure_lines
from reports.run_summary import format_summary


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="compare a port with the oracle over a suite or case files")
    port_options(p)
    selection_options(p)
    device_option(p)
    dcp_backend_option(p)
    jobs_options(p)
    p.add_argument("--json", metavar="OUT", help="write the full results as JSON")
    p.add_argument("--show", type=non_negative_int, default=10, help="divergences listed in the summary (default 10)")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from harness.protocol.port import l3_compares
    from harness.sides.items import NOT_RUN, PARITY
    from harness.verdicts.reproduce import printed_id, reproduce_from_meta
    from harness.verdicts.summary import layout_causes, summarise_table

    # Only the JSON report writes every layout's chunks; without it workers send figures.
    done = execute(run_request(args), keep_layouts=bool(args.json))
    done.close()
    banner = drift_banner(done.provenance)
    # An interrupted run's not-run rows are what it did not reach, not findings.
    shown = (PARITY, NOT_RUN) if done.interrupted or done.stopped else (PARITY,)
    failing = done.table[~done.table["status"].isin(shown)].head(args.show)
    meta = reproduce_meta(run_request(args), done.result.suite, done.provenance)
    causes = layout_causes(done.table)
    failures = [
        (
            row.status,
            printed_id(row.id, meta["suite"], meta["size"], meta["cases"]),
            "\n    ".join(failure_lines(row, causes)),
            reproduce_from_meta(row.name, row.kind, meta),
        )
        for row in failing.itertuples(index=False)
    ]
    if banner:
        print(banner)
    summary = summarise_table(
        done.table, done.result.suite, done.result.port, done.result.levels, l3_compares(done.port)
    )
    summary["seconds"] = round(done.result.seconds, 3)
    if args.device != "cpu":
        summary["device"] = args.device
    if dcp_backend_of(args) != "one-process":
        # A pass says how its DCP cases' ranks ran.
        summary["device"] = f"{args.device}, DCP ranks over {dcp_backend_of(args)}"
    print(format_summary(summary, failures))
    code = EXIT_INTERRUPTED if done.interrupted else verdict_code(summary["verdict"])
    if done.interrupted:
        print(f"\ninterrupted: {int((done.table['status'] != 'not-run').sum())} of {len(done.table)} items compared")
    elif done.stopped:
        print(f"\nstopped early: {done.stopped}")
    if args.json:
        from reports.json_report import write_json_report

        if not write_output(lambda: write_json_report(done.result, Path(args.json), done.table), args.json):
            return code or EXIT_USAGE
        print(f"\nwrote {args.json}")
    return code
