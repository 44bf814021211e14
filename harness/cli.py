"""``parity``: the command line (also ``python -m harness``).

Exit codes everywhere: 0 every item at parity, 1 some item diverges or errors
(for ``coverage``: some target is missed), 2 bad input or usage (one line on
stderr naming the file, field and reason).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cases import CaseError, load_cases
from harness.kernels import SharedKernels
from harness.model import Case, Chunk, Layout, MergeCase
from harness.port import Port, PortLoadError, load_port
from harness.runner import (
    LEVELS,
    CaseResult,
    RunResult,
    Shard,
    count_items,
    reraise_interrupt,
    run_item,
    run_items,
)
from harness.suites import Suite, load_suite, suite_names
from harness.summary import format_summary

EXIT_PARITY, EXIT_DIVERGENT, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input or usage; the message is the one line printed."""


# -- the oracle, behind its fingerprint check ---------------------------------------------


def open_oracle(allow_drift: bool) -> tuple[Port, dict[str, Any]]:
    """The oracle side and the provenance every output carries.

    Refuses (UsageError, one line naming the symbol) when an installed oracle
    symbol's fingerprint differs from the pin, unless ``allow_drift``.
    """
    from oracle.environment import OracleUnavailable
    from oracle.pin import check_fingerprints, installed_version, load_pin

    try:
        from oracle.side import OracleSide

        version, commit = installed_version()
        statuses = check_fingerprints()
        side = OracleSide()
    except OracleUnavailable as exc:
        raise UsageError(str(exc)) from None
    pin = load_pin()
    bad = [s for s in statuses if s.status != "ok"]
    if bad and not allow_drift:
        s = bad[0]
        raise UsageError(
            f"oracle fingerprint {s.status}: {s.symbol} (pinned {s.expected}, installed {s.found or 'absent'}); "
            "pass --allow-oracle-drift to run anyway"
        )
    provenance = {
        "upstream_commit": pin["upstream_commit"],
        "upstream_pr": pin["upstream_pr"],
        "release": pin["release"],
        "installed_vllm": version,
        "installed_commit_id": commit,
        "fingerprints": {s.symbol: s.status for s in statuses},
        "oracle_drift_overridden": bool(bad),
    }
    return side, provenance


def _drift_banner(provenance: dict[str, Any]) -> str | None:
    if not provenance.get("oracle_drift_overridden"):
        return None
    drifted = [k for k, v in provenance["fingerprints"].items() if v != "ok"]
    return f"WARNING: oracle fingerprints overridden ({len(drifted)} drifted: {', '.join(drifted)})"


def select_device(device: str) -> SharedKernels:
    """Prepare the oracle's recipe for ``device`` and return that device's shared
    kernels. Call before the oracle is opened (vLLM reads the recipe on import)."""
    from harness.kernels import kernels_for
    from oracle.environment import OracleUnavailable, use_device

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device cuda: torch {torch.__version__} sees no CUDA device on this machine")
    try:
        use_device(device)
    except OracleUnavailable as exc:
        raise UsageError(f"--device {device}: {exc}") from None
    return kernels_for(device)


# -- case selection ------------------------------------------------------------------------


def select_suite(args: argparse.Namespace) -> Suite:
    if args.cases:
        return Suite("cases", tuple(load_cases([Path(p) for p in args.cases])), ())
    return load_suite(args.suite, size=args.size)


def selected_levels(level: str) -> tuple[str, ...]:
    return LEVELS if level == "all" else (level,)


def find_case(spec: str, suite: str | None) -> Case | MergeCase:
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        cases = load_cases([path])
        if len(cases) != 1:
            raise UsageError(
                f"{spec}: holds {len(cases)} cases; diff takes one (name it: parity diff NAME --suite ...)"
            )
        return cases[0]
    name = spec.split("/", 1)[1] if "/" in spec else spec
    for suite_name in [suite] if suite else ["smoke", "ci"]:
        loaded = load_suite(suite_name)
        items: tuple[Case | MergeCase, ...] = (*loaded.cases, *loaded.merge_cases)
        for item in items:
            if item.name == name:
                return item
    where = suite or "smoke or ci"
    raise UsageError(f"{spec}: no such case file, and no case of that name in suite {where}")


# -- printing ------------------------------------------------------------------------------


def _short(values: tuple[object, ...], limit: int = 4) -> str:
    if len(values) <= limit:
        return "[" + ",".join(map(str, values)) + "]"
    return "[" + ",".join(map(str, values[:limit])) + f",..+{len(values) - limit}]"


def chunk_line(chunk: Chunk) -> str:
    cont = "cont" if chunk.is_continuation else "    "
    return (
        f"#{chunk.index:<3} req[{chunk.request_start},{chunk.request_end}) "
        f"tok[{chunk.token_start},{chunk.token_end}) {cont} "
        f"starts={_short(chunk.starts)} lens={_short(chunk.seq_lens)} rows={chunk.num_context_tokens}"
    )


def format_diff(case: Case, result: CaseResult) -> str:
    width = 64
    lines = [
        f"case {case.name} (family {case.family}): {case.num_requests} requests, "
        f"total context {sum(case.context_lens)}, W={case.workspace_size}, block {case.block_size}, "
        f"DCP {case.dcp_world_size}x{case.cp_kv_cache_interleave_size}, align {case.align_to_block}",
        f"context_lens {_short(case.context_lens, 12)}",
        f"query_lens   {_short(case.query_lens, 12)}",
    ]
    if result.error:
        lines.append(f"{result.status}: {result.error}")
        return "\n".join(lines)
    oracle, port = result.oracle_layout or Layout(()), result.port_layout or Layout(())
    lines.append("")
    lines.append(f"   {'oracle: ' + str(oracle.num_chunks) + ' chunks':<{width}} | port: {port.num_chunks} chunks")
    bad_chunk = result.divergence.chunk if result.divergence else None
    for i in range(max(oracle.num_chunks, port.num_chunks)):
        left = chunk_line(oracle.chunks[i]) if i < oracle.num_chunks else "-"
        right = chunk_line(port.chunks[i]) if i < port.num_chunks else "-"
        mark = ">> " if i == bad_chunk else "   "
        lines.append(f"{mark}{left:<{width}} | {right}")
    oracle_empty = "empty token slices " + _short(oracle.empty_token_slices)
    lines.append(f"   {oracle_empty:<{width}} | empty token slices {_short(port.empty_token_slices)}")
    lines.append("")
    if result.divergence is None:
        lines.append("L1 layout: PARITY (every field of every chunk identical)")
    else:
        lines.append(f"L1 layout: DIVERGENT at {result.divergence.message()}")
    return "\n".join(lines)


def format_tensor_verdict(label: str, result: CaseResult) -> str:
    """Per-tensor ULP summaries and a short table of the worst token rows."""
    if result.error:
        return f"{label}: {result.status.upper()}: {result.error}"
    verdict = "BIT-EXACT" if result.ok else "DIVERGENT"
    lines = [f"{label}: {verdict}"]
    for t in result.tensors:
        lines.append(f"  {t.summary()}")
        if t.histogram:
            lines.append("    ULP histogram: " + ", ".join(f"{k}: {v}" for k, v in t.histogram.items()))
        if t.worst_rows:
            lines.append(f"    {'token':>7}{'mismatches':>12}{'max ULP':>10}")
            for row in t.worst_rows:
                lines.append(f"    {row['token']:>7}{row['mismatches']:>12}{row['max_ulp']:>10}")
    return "\n".join(lines)


# -- commands ------------------------------------------------------------------------------


def _progress(total: int) -> tuple[Any, Any]:
    if not sys.stderr.isatty():
        return None, None
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task("comparing", total=total)
    bar.start()
    return bar, lambda _result: bar.advance(task)


def parse_shard(text: str | None) -> Shard | None:
    if text is None:
        return None
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise UsageError(f"--shard: {exc}") from None


@dataclass
class Execution:
    """What run and gate share: the table of every item (resumed ones included),
    the new results in full, and where they came from."""

    table: Any
    result: RunResult
    port: Port
    oracle: Port
    suite: Suite
    provenance: dict[str, Any]


def harness_identity() -> dict[str, Any]:
    """The harness's version and commit, for results-file headers."""
    from importlib.metadata import PackageNotFoundError, version

    from harness.provenance import repository_state, source_digest

    try:
        harness_version = version("mla-parity")
    except PackageNotFoundError:
        harness_version = None
    return {
        "harness_version": harness_version,
        "harness_commit": repository_state().get("commit"),
        "harness_sources": source_digest(),
    }


def refuse_empty(selected: int, what: str) -> None:
    """Zero selected items compare nothing: that is usage, never a pass."""
    if selected == 0:
        raise UsageError(f"{what} selects no items: nothing would be compared (choose another --level or --shard)")


def describe_selection(suite: Suite, levels: tuple[str, ...], shard: Shard | None) -> str:
    where = f" shard {shard}" if shard else ""
    return f"suite {suite.name} at level {', '.join(levels)}{where}"


def note_unimplemented(port: Port, levels: tuple[str, ...]) -> None:
    from harness.port import port_levels

    missing = [lv for lv in levels if lv not in port_levels(port)]
    if missing:
        print(
            f"note: port {port.name} implements {', '.join(port_levels(port))}; its items at "
            f"{', '.join(missing)} are not-run and the verdict is at best INCOMPLETE "
            f"(narrow the run with --level)"
        )


def execute(args: argparse.Namespace, before_run: Callable[[Port, Suite], None] | None = None) -> Execution:
    """Load, check the oracle, run with progress; rows go to --results as they finish.

    ``before_run`` checks the loaded port and suite before any work (the gate's
    baseline against what the suite holds)."""
    import pandas as pd

    import harness.runner
    from harness.results_file import ResultsWriter, items_digest
    from harness.runner import selected_item_ids
    from harness.summary import COLUMNS, result_row

    if args.resume and not args.results:
        raise UsageError("--resume needs --results FILE (the file to resume)")
    harness.runner.PORT_TIMEOUT_S = args.timeout
    port = load_port(args.port)
    suite = select_suite(args)
    levels = selected_levels(args.level)
    shard = parse_shard(args.shard)
    item_ids = selected_item_ids(suite, levels, shard)
    try:
        refuse_empty(len(item_ids), describe_selection(suite, levels, shard))
        if before_run is not None:
            before_run(port, suite)
    except Exception:
        close_port(port)
        raise
    note_unimplemented(port, levels)
    kernels = select_device(args.device)
    oracle, provenance = open_oracle(args.allow_oracle_drift)
    banner = _drift_banner(provenance)
    if banner:
        print(banner, file=sys.stderr)
    writer = None
    if args.results:
        header = {
            "items_digest": items_digest(item_ids),
            "items": len(item_ids),
            "suite": suite.name,
            "levels": list(levels),
            "size": args.size,
            "shard": args.shard,
            "port_spec": args.port,
            "port": port.name,
            "device": args.device,
            "pin": f"{provenance['release']} @ {provenance['upstream_commit']}",
            "oracle_drift_overridden": provenance["oracle_drift_overridden"],
            **harness_identity(),
        }
        writer = ResultsWriter(Path(args.results), header, args.resume, item_ids)
    skip = writer.done_ids if writer else frozenset()
    bar, advance = _progress(len(item_ids) - len(skip))
    result = RunResult(suite=suite.name, port=port.name, levels=levels)
    started = time.perf_counter()
    try:
        for item in run_items(oracle, port, suite, levels, shard, kernels, skip, args.device):
            result.results.append(item)
            if writer is not None:
                writer.write(result_row(item))
            if advance is not None:
                advance(item)
    finally:
        if bar is not None:
            bar.stop()
        if writer is not None:
            writer.close()
    result.seconds = time.perf_counter() - started
    result.provenance = provenance
    rows = (writer.done if writer else []) + [result_row(r) for r in result.results]
    table = pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("index", kind="stable").reset_index(drop=True)
    return Execution(table, result, port, oracle, suite, provenance)


def close_port(port: Port) -> None:
    """An external port's processes end with the command that used it. What
    ``close`` raises (``sys.exit`` included) is reported, never the exit code."""
    from harness.runner import printable

    close = getattr(port, "close", None)
    if callable(close):
        try:
            close()
        except BaseException as exc:
            reraise_interrupt(exc)
            print(f"parity: warning: port {port.name}: close() raised {printable(repr(exc))}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from harness.summary import summarise_table

    done = execute(args)
    close_port(done.port)
    banner = _drift_banner(done.provenance)
    failing = done.table[done.table["status"] != "parity"].head(args.show)
    failures = [(row.status, row.id, row.detail) for row in failing.itertuples(index=False)]
    if banner:
        print(banner)
    summary = summarise_table(done.table, done.result.suite, done.result.port, done.result.levels)
    summary["seconds"] = round(done.result.seconds, 3)
    if args.device != "cpu":
        summary["device"] = args.device
    print(format_summary(summary, failures))
    code = verdict_code(summary["verdict"])
    if args.json:
        from reports.json_report import write_json_report

        if not write_output(lambda: write_json_report(done.result, Path(args.json), done.table), args.json):
            return code or EXIT_USAGE
        print(f"\nwrote {args.json}")
    return code


def verdict_code(verdict: str) -> int:
    """0 only for a pass; a failing or INCOMPLETE run exits 1."""
    return EXIT_PARITY if verdict == "pass" else EXIT_DIVERGENT


def write_output(write: Any, where: str) -> bool:
    """Write a report; a failure is one line on stderr, never a traceback that
    replaces the verdict's exit code (the results file already holds every row)."""
    try:
        write()
    except Exception as exc:
        print(f"parity: error: {where}: cannot write the report ({type(exc).__name__}: {exc})", file=sys.stderr)
        return False
    return True


def _gate_meta(args: argparse.Namespace, done: Execution) -> dict[str, Any]:
    from harness.provenance import collect
    from harness.results_file import items_digest
    from harness.runner import selected_item_ids

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
        "port_spec": args.port,
        "pin": f"{provenance['release']} @ {provenance['upstream_commit']}",
        "oracle_drift_overridden": provenance["oracle_drift_overridden"],
        "provenance": collect(provenance),
    }


def _finish_gate(outcome: Any, out_dir: Path) -> int:
    from harness.gate import write_outputs
    from reports.gate_summary import render_gate_summary

    code = EXIT_PARITY if outcome.passed else EXIT_DIVERGENT
    print(render_gate_summary(outcome), end="")
    if not write_output(lambda: write_outputs(outcome, out_dir), str(out_dir)):
        return code or EXIT_USAGE
    print(f"\nwrote {out_dir}/summary.md, junit.xml, results.parquet")
    return code


def _baseline_entries(path: str | None) -> list[Any]:
    from harness.baseline import load_baseline

    return load_baseline(Path(path)) if path else []


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate import check_gate_baseline

    entries = _baseline_entries(args.baseline)
    done = execute(args, before_run=lambda port, suite: check_gate_baseline(entries, suite, port.name, args.port))
    try:
        return _judge_gate(args, done, entries)
    finally:
        close_port(done.port)


def _judge_gate(args: argparse.Namespace, done: Execution, entries: list[Any]) -> int:
    from harness.gate import judge

    port, oracle, suite = done.port, done.oracle, done.suite
    meta = _gate_meta(args, done)
    outcome = judge(done.table, meta, entries, check_stale=args.shard is None)
    out_dir = Path(args.out or f"reports/out/gate-{port.name}")
    # The first new layout divergences come with a shrunk case that reproduces them.
    cases = {c.name: c for c in suite.cases}
    new_layout = outcome.verdict.new
    new_layout = new_layout[(new_layout["kind"] == "layout") & (new_layout["status"] == "divergent")].head(3)
    outcome.meta["shrunk"] = {
        row.id: guarded_shrink(oracle, port, cases[row.name], out_dir / "shrunk" / f"{row.name}.json")
        for row in new_layout.itertuples(index=False)
        if row.name in cases
    }
    return _finish_gate(outcome, out_dir)


def cmd_merge(args: argparse.Namespace) -> int:
    from harness.gate import judge, merge_shards

    entries = _baseline_entries(args.baseline)
    table, meta = merge_shards([Path(d) for d in args.shards])
    return _finish_gate(judge(table, meta, entries, check_stale=True), Path(args.out))


def cmd_nightly(args: argparse.Namespace) -> int:
    """Every registered port over the nightly suite, into <out>/<date>/."""
    import datetime

    from harness.nightly import NightlyPlan, merge_nightly_shards, run_nightly
    from harness.port import BUILTIN_PORTS
    from reports.nightly import explore_verdict

    date = args.date or datetime.date.today().isoformat()
    out_dir = Path(args.out) / date
    history = Path(args.history) if args.history else Path(args.out) / "history.jsonl"
    gpu_reports = Path(args.gpu_reports)
    if args.from_shards:
        night = merge_nightly_shards([Path(d) for d in args.from_shards], out_dir, history, gpu_reports)
    else:
        port_names = args.ports.split(",") if args.ports else list(BUILTIN_PORTS)
        ports = [load_port(name) for name in port_names]
        suite = load_suite("nightly", size=args.size, numeric_size=args.numeric_size)
        shard = parse_shard(args.shard)
        levels = selected_levels(args.level)
        for port in ports:
            refuse_empty(
                count_items(suite, levels, shard), f"port {port.name}: {describe_selection(suite, levels, shard)}"
            )
            note_unimplemented(port, levels)
        oracle, provenance = open_oracle(args.allow_oracle_drift)
        plan = NightlyPlan(
            date,
            suite,
            selected_levels(args.level),
            shard,
            out_dir,
            history,
            not args.skip_mutants,
            gpu_reports,
            explore_budget_s=args.explore_budget_s,
            port_specs=tuple(port_names),
        )
        try:
            night = run_nightly(plan, oracle, ports, provenance, progress=_progress)
        finally:
            for port in ports:
                close_port(port)
    for p in night.ports:
        verdict = p.summary["verdict"].upper()
        print(f"{p.port:<14} {verdict}  {len(p.table)} items in {p.seconds:.1f}s")
    state = "" if night.complete else "  (INCOMPLETE: interrupted)"
    print(f"wrote {out_dir / 'index.html'} and {out_dir / 'report.md'}{state}")
    if not night.complete:
        return 130
    for result in night.explore:
        print(f"explore {result['port_spec']:<14} {result['verdict'].upper()}  {result['examples']} examples")
    gated = nightly_gated_ports(args.ports, [p.port for p in night.ports])
    gating = [p for p in night.ports if p.port in gated]
    # A gated port's search must come back clean too: a find is a divergence, a
    # search that compared nothing is not a pass.
    clean = night.explore_budget_s <= 0 or all(explore_verdict(night, port) == "clean" for port in gated)
    return EXIT_PARITY if gating and clean and all(p.summary["verdict"] == "pass" for p in gating) else EXIT_DIVERGENT


def nightly_gated_ports(requested: str | None, ran: list[str]) -> list[str]:
    """The ports whose verdict is the night's exit code: every port named with
    ``--ports``; by default (every registered port) per_request alone, since the
    legacy equal_share is in the night as a reference that is known to diverge."""
    return ran if requested else [name for name in ran if name == "per_request"]


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
    oracle, _ = open_oracle(args.allow_oracle_drift)
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


def guarded_shrink(oracle: Port, port: Port, case: Case, out: Path, level: str = "layout", kernels: Any = None) -> str:
    """Shrinking for the gate and the kill matrix: a failure there is reported in
    the shrunk column, never raised, so the outputs and the exit code stand."""
    try:
        return shrink_to_file(oracle, port, case, level, kernels, out)
    except BaseException as exc:
        reraise_interrupt(exc)
        return f"not shrunk ({type(exc).__name__}: {' '.join(str(exc).split())})"


def shrink_to_file(oracle: Port, port: Port, case: Case, level: str, kernels: Any, out: Path) -> str:
    """Shrink a kill and write it; the kill matrix and gate summary show the result."""
    from harness.cases import write_case_file
    from harness.shrink import checker, describe_case, shrink

    budget = 60 if level == "prefill" else 600
    outcome = shrink(case, checker(oracle, port, level, kernels), budget=budget)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_case_file(outcome.case, out, f"shrunk from {case.name} for {port.name}: {outcome.result.detail()}")
    return f"{describe_case(outcome.case)} ({out})"


def cmd_shrink(args: argparse.Namespace) -> int:
    """Reduce a divergent case to a minimal one that diverges the same way."""
    from harness.cases import write_case_file
    from harness.kernels import CpuKernels
    from harness.shrink import checker, describe_case, shrink

    port = load_port(args.port)
    case = find_case(args.case, args.suite)
    if isinstance(case, MergeCase):
        raise UsageError(f"{args.case}: merge cases are already minimal partials; shrink takes a layout case")
    level = "prefill" if args.level == "prefill" else "layout"
    if level == "prefill" and case.numeric is None:
        raise UsageError(f"{args.case}: --level prefill needs a case with a numeric section")
    oracle, _ = open_oracle(args.allow_oracle_drift)
    try:
        outcome = shrink(case, checker(oracle, port, level, CpuKernels()), budget=args.budget)
    except ValueError as exc:
        print(str(exc))
        return EXIT_PARITY
    out = Path(args.out or f"reports/out/shrunk/{outcome.case.name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_case_file(outcome.case, out, f"shrunk from {case.name} for port {port.name}: {outcome.result.detail()}")
    print(f"original: {describe_case(case)}")
    print(f"shrunk:   {describe_case(outcome.case)}  ({outcome.steps} steps, {outcome.evaluations} evaluations)")
    print(f"still {outcome.result.status}: {outcome.result.detail()}")
    print(f"wrote {out}  (parity diff {out} --port {args.port})")
    return EXIT_DIVERGENT


def cmd_diff(args: argparse.Namespace) -> int:
    port = load_port(args.port)
    case = find_case(args.case, args.suite)
    diff_items(case, args.case, args.level)  # refuse an empty selection before any work
    kernels = select_device(args.device)
    oracle, provenance = open_oracle(args.allow_oracle_drift)
    banner = _drift_banner(provenance)
    if banner:
        print(banner)
    print(
        f"oracle {provenance['release']} (upstream {provenance['upstream_commit']})  vs  port {port.name}"
        f"  on {args.device}"
    )
    if isinstance(case, MergeCase):
        print(f"merge case {case.name}: {case.to_json()}")
        result = run_item(oracle, port, "merge", case, kernels, args.device)
        print(format_tensor_verdict("L2 merge", result))
        return EXIT_PARITY if result.ok else EXIT_DIVERGENT
    results = []
    for kind, _ in diff_items(case, args.case, args.level):
        results.append(run_item(oracle, port, kind, case, kernels, args.device))
        if kind == "layout":
            print(format_diff(case, results[-1]))
        else:
            print(format_tensor_verdict("L3 prefill", results[-1]))
    if case.numeric is None and args.level == "all":
        print("L3 prefill: no item (the case has no numeric section)")
    return EXIT_PARITY if all(r.ok for r in results) else EXIT_DIVERGENT


def diff_items(case: Case | MergeCase, spec: str, level: str) -> list[tuple[str, Case | MergeCase]]:
    """The items ``parity diff`` compares for ``case`` at ``level``; none is usage."""
    levels = selected_levels(level)
    if isinstance(case, MergeCase):
        items: list[tuple[str, Case | MergeCase]] = [("merge", case)] if "merge" in levels else []
    else:
        items = [("layout", case)] if "layout" in levels else []
        if "prefill" in levels and case.numeric is not None:
            items.append(("prefill", case))
    if not items:
        kind = "a merge case" if isinstance(case, MergeCase) else "a layout-only case"
        has = "merge" if isinstance(case, MergeCase) else ("layout, prefill" if case.numeric else "layout")
        raise UsageError(f"{spec}: --level {level} selects no items of {kind} (it has {has}); nothing to compare")
    return items


def cmd_coverage(args: argparse.Namespace) -> int:
    """What a suite exercises per input feature, against its targets; 1 on a miss."""
    from harness.coverage import TARGETS_FILE, display_path, judge, load_targets, measure, render_text, write_json

    path = Path(args.targets) if args.targets else TARGETS_FILE
    targets = load_targets(path, suite_names())
    if args.suite not in suite_names():
        load_suite(args.suite)  # refuses, naming the known suites
    if args.suite not in targets:
        raise UsageError(f"no coverage targets for suite {args.suite} in {display_path(path)}")
    suite = load_suite(args.suite)
    oracle, provenance = open_oracle(args.allow_oracle_drift)
    banner = _drift_banner(provenance)
    if banner:
        print(banner)
    judged = judge(measure(suite, oracle), targets[args.suite], display_path(path))
    print(render_text(judged), end="")
    code = EXIT_DIVERGENT if judged.missed else EXIT_PARITY
    if args.json:
        if not write_output(lambda: write_json(judged, Path(args.json)), args.json):
            return code or EXIT_USAGE
        print(f"\nwrote {args.json}")
    return code


def cmd_oracle(args: argparse.Namespace) -> int:
    from oracle.environment import OracleUnavailable
    from oracle.pin import check_fingerprints, installed_version, load_pin, record_fingerprints

    pin = load_pin()
    print(f"pin: upstream commit {pin['upstream_commit']} ({pin['upstream_pr']}), release {pin['release']}")
    try:
        version, commit = installed_version()
        if args.record:
            record_fingerprints()
        statuses = check_fingerprints()
    except OracleUnavailable as exc:
        raise UsageError(str(exc)) from None
    print(f"installed: vllm {version}, commit id {commit} (pinned release reports {pin['release_commit_id']})")
    for s in statuses:
        print("  " + s.line())
    ok = all(s.status == "ok" for s in statuses) and version == pin["release_version"]
    print("oracle: OK" if ok else "oracle: DRIFTED from the pin")
    return EXIT_PARITY if ok else EXIT_DIVERGENT


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--port", default="per_request", help="per_request, equal_share, or package.module:attr")
        p.add_argument(
            "--allow-oracle-drift",
            action="store_true",
            help="run even if an oracle fingerprint differs from the pin (every output says so)",
        )

    def device(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--device",
            choices=("cpu", "cuda"),
            default="cpu",
            help="where L2 and L3 run: cpu (Triton interpreted) or cuda (Triton compiled, GPU shared kernels)",
        )

    def selection(p: argparse.ArgumentParser) -> None:
        group = p.add_mutually_exclusive_group()
        group.add_argument("--suite", default="ci", help=f"one of {', '.join(suite_names())} (default ci)")
        group.add_argument("--cases", nargs="+", metavar="FILE_OR_DIR", help="case files or folders instead of a suite")
        p.add_argument("--size", type=int, help="number of generated layout cases (overrides the suite's count)")
        p.add_argument("--level", choices=(*LEVELS, "all"), default="all", help="parity level(s) to check")
        p.add_argument("--shard", metavar="K/N", help="run only shard K of N (deterministic, interleaved)")
        p.add_argument("--results", metavar="FILE", help="write each item's row as it finishes (JSON lines)")
        p.add_argument("--resume", action="store_true", help="finish the run recorded in --results FILE")
        p.add_argument("--timeout", type=float, default=300.0, help="seconds a port call may take (default 300)")

    p_run = sub.add_parser("run", help="compare a port with the oracle over a suite or case files")
    common(p_run)
    selection(p_run)
    device(p_run)
    p_run.add_argument("--json", metavar="OUT", help="write the full results as JSON")
    p_run.add_argument("--show", type=int, default=10, help="divergences listed in the summary (default 10)")
    p_run.set_defaults(func=cmd_run)

    p_gate = sub.add_parser("gate", help="the CI gate: summary.md, junit.xml, results.parquet; baseline-aware")
    common(p_gate)
    selection(p_gate)
    device(p_gate)
    p_gate.add_argument("--baseline", metavar="FILE", help="expected divergences (JSON, see harness/baseline.py)")
    p_gate.add_argument("--out", metavar="DIR", help="output folder (default reports/out/gate-<port>)")
    p_gate.set_defaults(func=cmd_gate)

    p_merge = sub.add_parser("merge", help="combine sharded gate outputs into one summary and report")
    p_merge.add_argument("shards", nargs="+", metavar="DIR", help="the shard gates' output folders")
    p_merge.add_argument("--baseline", metavar="FILE", help="the baseline the shards ran with")
    p_merge.add_argument("--out", metavar="DIR", required=True, help="output folder")
    p_merge.set_defaults(func=cmd_merge)

    p_diff = sub.add_parser("diff", help="side-by-side chunks of the oracle and a port for one case")
    common(p_diff)
    device(p_diff)
    p_diff.add_argument("case", metavar="CASE", help="a case file, or a case name in a suite")
    p_diff.add_argument("--suite", help="suite to look the case name up in (default: smoke, then ci)")
    p_diff.add_argument("--level", choices=(*LEVELS, "all"), default="all", help="parity level(s) to check")
    p_diff.set_defaults(func=cmd_diff)

    p_nightly = sub.add_parser("nightly", help="every port over the nightly suite; HTML and Markdown report")
    p_nightly.add_argument("--size", type=int, help="generated layout cases (default: the suite's 50,000)")
    p_nightly.add_argument("--numeric-size", type=int, help="merge and prefill cases (default: the suite's)")
    p_nightly.add_argument("--level", choices=(*LEVELS, "all"), default="all", help="parity level(s) to check")
    p_nightly.add_argument("--ports", help="comma-separated ports (default: every registered port)")
    p_nightly.add_argument("--shard", metavar="K/N", help="run only shard K of N")
    p_nightly.add_argument("--from-shards", nargs="+", metavar="DIR", help="merge shard outputs into one report")
    p_nightly.add_argument("--out", default="reports", help="report root; the report goes to <out>/<date>/")
    p_nightly.add_argument("--history", help="history store (default <out>/history.jsonl)")
    p_nightly.add_argument("--date", help="report date (default today)")
    p_nightly.add_argument(
        "--gpu-reports", default="reports/gpu", help="the latest <date>.json here is the report's GPU section"
    )
    p_nightly.add_argument("--skip-mutants", action="store_true", help="leave the mutant kill matrix out")
    p_nightly.add_argument(
        "--explore-budget-s",
        type=non_negative_seconds,
        default=60.0,
        help="seconds of parity explore per port after the suite (default 60; 0 leaves it out); "
        "its database lives in <out>/explore/<port>, so each night replays earlier finds",
    )
    p_nightly.add_argument(
        "--allow-oracle-drift", action="store_true", help="run even if an oracle fingerprint differs"
    )
    p_nightly.set_defaults(func=cmd_nightly)

    p_mutants = sub.add_parser("mutants", help="run the seeded mutant ports; write the kill matrix")
    p_mutants.add_argument("--suite", default="ci", help="suite to kill them with (default ci)")
    p_mutants.add_argument("--size", type=int, help="generated layout cases (overrides the suite's count)")
    p_mutants.add_argument("--level", choices=(*LEVELS, "all"), default="all", help="parity level(s)")
    p_mutants.add_argument("--only", help="comma-separated mutant names")
    p_mutants.add_argument("--out", metavar="DIR", help="output folder (default reports/out/mutants-<suite>)")
    p_mutants.add_argument("--no-shrink", action="store_true", help="do not shrink the killing cases")
    p_mutants.add_argument("--allow-oracle-drift", action="store_true", help="run despite fingerprint drift")
    p_mutants.set_defaults(func=cmd_mutants)

    p_shrink = sub.add_parser("shrink", help="reduce a divergent case to a minimal one; write it as a case file")
    common(p_shrink)
    p_shrink.add_argument("case", metavar="CASE", help="a case file, or a case name in a suite")
    p_shrink.add_argument("--suite", help="suite to look the case name up in (default: smoke, then ci)")
    p_shrink.add_argument("--level", choices=("layout", "prefill"), default="layout", help="level to keep diverging")
    p_shrink.add_argument("--budget", type=int, default=2000, help="most evaluations (default 2000)")
    p_shrink.add_argument("--out", metavar="FILE", help="where to write the shrunk case")
    p_shrink.set_defaults(func=cmd_shrink)

    p_coverage = sub.add_parser("coverage", help="what a suite exercises per input feature, against its targets")
    p_coverage.add_argument("--suite", default="ci", help=f"one of {', '.join(suite_names())} (default ci)")
    p_coverage.add_argument("--json", metavar="OUT", help="write the measured values and verdicts as JSON")
    p_coverage.add_argument("--targets", metavar="FILE", help="the targets file (default cases/coverage.json)")
    p_coverage.add_argument("--allow-oracle-drift", action="store_true", help="run despite fingerprint drift")
    p_coverage.set_defaults(func=cmd_coverage)

    # harness.explore builds on this module's helpers, so it is imported here, not at the top.
    from harness.explore import add_parser as add_explore_parser

    add_explore_parser(sub)

    p_oracle = sub.add_parser("oracle", help="the pin, the installed vLLM and each fingerprint's status")
    p_oracle.add_argument("--record", action="store_true", help="rewrite the pin's fingerprints (maintainers)")
    p_oracle.set_defaults(func=cmd_oracle)
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
