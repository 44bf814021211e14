"""``parity gate`` (a suite judged against a baseline, written for CI) and
``parity merge`` (sharded gates combined into one verdict)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.common import EXIT_DIVERGENT, EXIT_INTERRUPTED, EXIT_PARITY, EXIT_USAGE, run_request, write_output
from harness.commands.options import (
    dcp_backend_option,
    device_option,
    jobs_options,
    non_negative_seconds,
    port_options,
    selection_options,
)
from harness.engine import (
    Execution,
    UsageError,
    dcp_settings,
    execute,
    guarded_shrink,
    harness_identity,
    release_of,
    reproduce_meta,
)

if TYPE_CHECKING:
    from harness.search.shrink import Progress

# The default time box for shrinking a gate's first new layout divergences (all of them together).
SHRINK_TIME_S = 180.0
# How often a shrink in progress says where it is.
SHRINK_PROGRESS_S = 10.0


def register(sub: Any) -> None:
    p_gate = sub.add_parser("gate", help="the CI gate: summary.md, junit.xml, results.parquet; baseline-aware")
    port_options(p_gate)
    selection_options(p_gate)
    device_option(p_gate)
    dcp_backend_option(p_gate)
    jobs_options(p_gate)
    p_gate.add_argument("--baseline", metavar="FILE", help="expected divergences (JSON: harness/verdicts/baseline.py)")
    p_gate.add_argument("--out", metavar="DIR", help="output folder (default reports/out/gate-<port>)")
    p_gate.add_argument(
        "--shrink-time",
        type=non_negative_seconds,
        default=SHRINK_TIME_S,
        metavar="SECONDS",
        help="time box for shrinking the first new layout divergences, after the outputs are written; "
        f"0: no shrinking (default {SHRINK_TIME_S:g})",
    )
    p_gate.set_defaults(func=cmd_gate)

    p_merge = sub.add_parser("merge", help="combine sharded gate outputs into one summary and report")
    p_merge.add_argument("shards", nargs="+", metavar="DIR", help="the shard gates' output folders")
    p_merge.add_argument("--baseline", metavar="FILE", help="the baseline the shards ran with")
    p_merge.add_argument(
        "--rejudge",
        action="store_true",
        help="judge the shards against --baseline although they ran with another (the summary says so)",
    )
    p_merge.add_argument("--out", metavar="DIR", required=True, help="output folder")
    p_merge.set_defaults(func=cmd_merge)


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.verdicts.gate import check_gate_baseline

    # --time-limit boxes the whole gate: its shrinking gets only what the run left of it.
    args.time_box_ends = time.monotonic() + args.time_limit if args.time_limit else None
    entries = _baseline_entries(args.baseline)
    oracle = f"vllm=={release_of(args.oracle)}"
    # The gate writes tables and summaries, never the layouts' chunks.
    done = execute(
        run_request(args),
        before_run=lambda port, suite: check_gate_baseline(entries, suite, port.name, args.port, oracle),
        keep_layouts=False,
    )
    try:
        return _judge_gate(args, done, entries)
    finally:
        done.close()


def cmd_merge(args: argparse.Namespace) -> int:
    from harness.verdicts.gate import judge, merge_shards

    entries = _baseline_entries(args.baseline)
    table, meta = merge_shards([Path(d) for d in args.shards])
    ran_with = meta.get("baseline")
    given = baseline_identity(args.baseline)
    if "baseline" in meta and (ran_with or {}).get("sha256") != (given or {}).get("sha256"):
        ran = f"baseline {ran_with['path']}" if ran_with else "no baseline"
        now = f"--baseline {args.baseline}" if args.baseline else "no --baseline"
        if not args.rejudge:
            raise UsageError(
                f"{args.shards[0]}: the shards ran with {ran} (sha256 {(ran_with or {}).get('sha256', '-')[:12]}), "
                f"merge was given {now}: judge them with the baseline they ran with, or pass --rejudge"
            )
        meta = {**meta, "baseline": given, "rejudged": f"the shards ran with {ran}; judged here with {now}"}
    return _finish_gate(judge(table, meta, entries, check_stale=True), Path(args.out))


def _judge_gate(args: argparse.Namespace, done: Execution, entries: list[Any]) -> int:
    from harness.model.levels import kind_spec, kinds_where, level_of
    from harness.sides.items import DIVERGENT, NOT_RUN
    from harness.verdicts.gate import judge
    from harness.verdicts.summary import message_groups

    # done.oracle is opened only when asked for: only shrinking needs it here.
    port, suite = done.port, done.suite
    meta = _gate_meta(args, done)
    outcome = judge(done.table, meta, entries, check_stale=args.shard is None)
    out_dir = Path(args.out or f"reports/out/gate-{port.name}")
    if done.interrupted:
        # What finished is written (the unfinished items are not-run rows); no shrinking.
        compared = int((done.table["status"] != NOT_RUN).sum())
        outcome.meta["interrupted"] = f"stopped after {compared} of {len(done.table)} items"
        return _interrupted(_finish_gate(outcome, out_dir))
    if done.stopped:
        # It stopped itself (a hung port, its time limit): written as it is; no shrinking
        # (a hung port would only hang again on the smaller cases).
        outcome.meta["stopped"] = done.stopped
        return _finish_gate(outcome, out_dir)
    # The outputs are written before any shrinking: a slow shrink never withholds the verdict.
    code = _finish_gate(outcome, out_dir)
    if code == EXIT_USAGE:
        return code
    # The first new divergences of a host kind that shrinks (the layout level's: a
    # host shrink fits the gate's time box) come with a shrunk case that reproduces them.
    shrunk_kinds = kinds_where(lambda kind, level: kind.shrinks and level.host)
    cases = {item.name: item for kind in shrunk_kinds for item in kind_spec(kind)[0].plan(suite)}
    new = outcome.verdict.new
    new = new[new["kind"].isin(shrunk_kinds) & (new["status"] == DIVERGENT)]
    # One per distinct message (the summary shows each group's first item), the first three.
    firsts = [next(g.itertuples(index=False)) for g in message_groups(new[new["name"].isin(cases)])]
    targets = firsts[:3]
    if not targets or args.shrink_time == 0:
        return code
    shrunk: dict[str, str] = {}
    outcome.meta["shrunk"] = shrunk
    deadline = time.monotonic() + args.shrink_time
    time_box_ends = getattr(args, "time_box_ends", None)
    if time_box_ends is not None:
        if time_box_ends <= time.monotonic():
            return code  # the gate's --time-limit ran out with the run: its outputs stand, unshrunk
        deadline = min(deadline, time_box_ends)
    print(
        f"\nshrinking {len(targets)} new {'/'.join(sorted({level_of(row.kind) for row in targets}))} "
        f"divergence(s) of {port.name} "
        f"(time box {args.shrink_time:g} s, --shrink-time)",
        file=sys.stderr,
    )
    try:
        for number, row in enumerate(targets, 1):
            progress = _shrink_progress(f"{row.name} ({number} of {len(targets)}) for {port.name}", deadline)
            case, path = cases[row.name], out_dir / "shrunk" / f"{row.name}.json"
            shrunk[row.id] = guarded_shrink(
                done.oracle,
                port,
                case,
                path,
                level=level_of(row.kind),
                deadline=deadline,
                progress=progress,
                timeout_s=args.timeout,
            )
            print(f"  shrunk {row.id}: {shrunk[row.id]}", file=sys.stderr)
    except KeyboardInterrupt:
        # Every item was compared: the verdict stands; only the shrinking was cut short.
        print("\nparity: interrupted while shrinking; writing the gate's outputs", file=sys.stderr)
        outcome.meta["shrink_interrupted"] = True
        return _interrupted(_write_gate_outputs(outcome, out_dir, code))
    return _write_gate_outputs(outcome, out_dir, code)


def _shrink_progress(what: str, deadline: float) -> Progress:
    """A progress line on stderr at most every few seconds while one case shrinks."""
    last = [time.monotonic()]

    def report(evaluations: int, steps: int) -> None:
        now = time.monotonic()
        if now - last[0] >= SHRINK_PROGRESS_S:
            last[0] = now
            left = max(0.0, deadline - now)
            print(f"  shrinking {what}: {evaluations} evaluations, {steps} kept, {left:.0f} s left", file=sys.stderr)

    return report


def _interrupted(code: int) -> int:
    """An interrupted gate exits 130 once its outputs are written (2 if they could not be)."""
    return code if code == EXIT_USAGE else EXIT_INTERRUPTED


def _gate_meta(args: argparse.Namespace, done: Execution) -> dict[str, Any]:
    from harness.protocol.port import l3_compares
    from harness.sides.runner import selected_item_ids
    from harness.verdicts.provenance import collect, files_digest, port_digest
    from harness.verdicts.results_file import items_digest

    result, provenance = done.result, done.provenance
    every_item = selected_item_ids(done.suite, result.levels)
    return {
        # The whole run's items (every shard's), so merging can prove its shards add up to it.
        "items_digest": items_digest(every_item),
        "items": len(every_item),
        **harness_identity(),
        "suite": result.suite,
        "port": result.port,
        "levels": list(result.levels),
        "size": args.size,
        "shard": args.shard,
        "device": args.device,
        **dcp_settings(run_request(args)),
        # Case files a --cases run read (so its reproduce lines can name them), the port spec,
        # timeout, and how a pasted reproduce line starts (interpreter, PYTHONPATH).
        **reproduce_meta(run_request(args), result.suite, provenance),
        # Which expected divergences judged it: parity merge must judge the shards alike.
        "baseline": baseline_identity(args.baseline),
        # The port's code and the case files by content: shards of two commits are not one run.
        "port_digest": port_digest(args.port, done.port),
        "l3_compares": l3_compares(done.port),
        "cases_digest": files_digest(args.cases),
        "provenance": collect(provenance, args.port, done.port),
    }


def _finish_gate(outcome: Any, out_dir: Path) -> int:
    from reports.gate_summary import render_gate_summary

    code = EXIT_PARITY if outcome.passed else EXIT_DIVERGENT
    print(render_gate_summary(outcome), end="")
    code = _write_gate_outputs(outcome, out_dir, code)
    if code != EXIT_USAGE:
        print(f"\nwrote {out_dir}/summary.md, junit.xml, results.parquet")
    return code


def _write_gate_outputs(outcome: Any, out_dir: Path, code: int) -> int:
    """Write (or rewrite, once shrinking added its cases) the gate's files; ``code``, or 2 if they could not be."""
    from harness.verdicts.gate import JUNIT, SUMMARY, write_tables
    from reports.gate_summary import write_gate_summary
    from reports.junit import write_junit

    def write_outputs() -> None:
        write_tables(outcome, out_dir)
        write_gate_summary(outcome, out_dir / SUMMARY)
        write_junit(outcome, out_dir / JUNIT)

    return code if write_output(write_outputs, str(out_dir)) else code or EXIT_USAGE


def baseline_identity(path: str | None) -> dict[str, str] | None:
    """The baseline file a gate ran with: its path and the sha256 of its bytes."""
    if not path:
        return None
    import hashlib

    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the baseline ({exc.strerror or exc})") from None
    return {"path": path, "sha256": digest}


def _baseline_entries(path: str | None) -> list[Any]:
    from harness.verdicts.baseline import load_baseline

    return load_baseline(Path(path)) if path else []
