"""``parity diff``: one item, the oracle's and the port's results side by side.

The item is named as any output prints it (:func:`harness.verdicts.reproduce.resolve_item`:
``ci/skew-0031[prefill]``, ``skew-0031[prefill]``, a workspace item, a case
name or file stem, a case, shrunk or find file); its ``[KIND]`` selects the
level unless ``--level`` does. ``--json OUT`` writes the record of
:func:`reports.diff_text.diff_record`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.common import (
    EXIT_DIVERGENT,
    EXIT_PARITY,
    EXIT_USAGE,
    open_command_oracle,
    run_request,
    write_output,
)
from harness.commands.options import (
    dcp_backend_option,
    device_option,
    level_choice,
    non_negative_int,
    oracle_cache_option,
    port_options,
    positive_seconds,
)
from harness.engine import (
    UsageError,
    close_port,
    dcp_settings,
    drift_banner,
    prepare_device,
    real_ranks_of,
    select_device,
)
from harness.model.levels import kind_spec, kinds_of
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port, port_levels
from harness.sides.items import LEVELS, CaseResult, selected_levels
from harness.sides.loading import load_port
from harness.sides.runner import run_item
from harness.verdicts.reproduce import Item, ResolvedItem, level_of, resolve_item

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.sides.dcp_ranks import RealRanks


def register(sub: Any) -> None:
    p = sub.add_parser("diff", help="one item of the oracle and a port side by side (chunks, sizes, ULPs)")
    port_options(p)
    device_option(p)
    dcp_backend_option(p)
    oracle_cache_option(p)
    p.add_argument(
        "case",
        metavar="ITEM",
        help="an item id as printed (ci/skew-0031[prefill], skew-0031[prefill], "
        "workspace/len2048-seqs1-blk16-dcp4x64[workspace]), a case name or case file stem, "
        "or a case, shrunk-case or explore find file",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--suite",
        help="suite to look a name up in (default: the id's, else every suite; a name two suites define "
        "differently is refused)",
    )
    where.add_argument("--cases", nargs="+", metavar="FILE_OR_DIR", help="look the name up in these case files")
    p.add_argument(
        "--size", type=non_negative_int, help="the suite's scale (its --size), as the run that printed it had"
    )
    p.add_argument(
        "--numeric-size",
        type=non_negative_int,
        help="the suite's numeric group counts (its --numeric-size), as the night that printed it had",
    )
    p.add_argument(
        "--timeout", type=positive_seconds, default=DEFAULT_PORT_TIMEOUT_S, help="seconds a port call may take"
    )
    p.add_argument(
        "--level",
        type=level_choice,
        choices=(*LEVELS, "all"),
        help="parity level(s) to compare (default: the id's [kind], else every level the item has)",
    )
    p.add_argument("--json", metavar="OUT", help="also write the diff as a JSON record")
    p.set_defaults(func=cmd_diff)


def cmd_diff(args: argparse.Namespace) -> int:
    resolved = resolve_item(args.case, args.suite, args.size, args.cases, args.numeric_size)
    kinds = diff_kinds(resolved, args.case, args.level)  # refuse an empty selection before any work
    json_path = Path(args.json) if args.json else None
    if json_path is not None and not json_path.parent.is_dir():
        raise UsageError(f"--json {json_path}: folder {json_path.parent} does not exist")
    real_ranks = real_ranks_of(run_request(args))
    prepare_device(args.device)
    port = load_port(args.port, args.timeout)
    try:
        chosen = args.level is not None or resolved.wanted is not None
        missing = [k for k in kinds if level_of(k) not in port_levels(port)]
        if chosen and missing:
            raise UsageError(
                f"{args.case}: port {port.name} does not implement level {level_of(missing[0])} "
                f"(it implements {', '.join(port_levels(port))})"
            )
        kernels = select_device(args.device)
        oracle, provenance = open_command_oracle(args)
        banner = drift_banner(provenance)
        if banner:
            print(banner)
        print(
            f"oracle {provenance['release']} (upstream {provenance['upstream_commit']})  vs  port {port.name}"
            f"  on {args.device}  ({resolved.item.name}, from {resolved.source})"
        )
        results = compare_and_print(oracle, port, resolved.item, kinds, kernels, args.device, args.timeout, real_ranks)
    finally:
        close_port(port)
    code = EXIT_PARITY if all(r.ok for r in results) else EXIT_DIVERGENT
    if json_path is not None:
        from reports.diff_text import diff_record

        context = {
            "item_spec": args.case,
            "source": resolved.source,
            "suite": resolved.suite,
            "port": port.name,
            "port_spec": args.port,
            "device": args.device,
            **dcp_settings(run_request(args)),
            "provenance": provenance,
            "exit_code": code,
        }
        record = diff_record(resolved.item, results, context)

        def write() -> None:
            json_path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

        if not write_output(write, str(json_path)):
            return code or EXIT_USAGE
    return code


def item_kinds(item: Item) -> list[str]:
    """The kinds of item a thing is, in suite order (each registered kind's
    ``holds``): a case its layout and, with a numeric section, its prefill; a
    merge case its merge; a configuration its size."""
    return kinds_of(item)


def diff_kinds(resolved: ResolvedItem, spec: str, level: str | None) -> list[str]:
    """The items ``parity diff`` compares: those of ``level`` (``--level``),
    else of the id's ``[KIND]``, else all the item has. None is usage."""
    has = item_kinds(resolved.item)
    what = kind_spec(has[0])[0].noun(resolved.item) if has else "an item of no level"
    if resolved.wanted is not None and resolved.wanted not in has:
        raise UsageError(f"{spec}: {resolved.item.name} is {what}: it has no {resolved.wanted} item")
    if level is not None:
        levels = selected_levels(level)
        kinds = [k for k in has if level_of(k) in levels]
    elif resolved.wanted is not None:
        kinds = [resolved.wanted]
    else:
        kinds = has
    if not kinds:
        raise UsageError(
            f"{spec}: --level {level} selects no items of {what} (it has {', '.join(has)}); nothing to compare"
        )
    return kinds


def compare_and_print(
    oracle: Port,
    port: Port,
    item: Item,
    kinds: list[str],
    kernels: SharedKernels,
    device: str,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
    real_ranks: RealRanks | None = None,
) -> list[CaseResult]:
    """Compare ``item`` at each of ``kinds`` and print what ``parity diff``
    prints (also ``parity explore --replay``'s output); return the results."""
    from harness.levels.shown import ShowContext
    from reports.diff_text import format_result, verdict_line

    context = ShowContext(oracle, port, tuple(kinds))
    results: list[CaseResult] = []
    for kind in kinds:
        result = run_item(oracle, port, kind, item, kernels, device, timeout_s, real_ranks)
        results.append(result)
        # Shown as its level shows it (harness.model.levels.KindSpec.show), else the common way.
        show = kind_spec(kind)[0].show
        print(show(item, result, context) if show is not None else format_result(item, result))
        cause = _layout_cause(oracle, port, item, result, results, kernels, device, timeout_s)
        if cause is not None:
            print(f"  {cause}")
    print(verdict_line(results))
    return results


def _layout_cause(
    oracle: Port,
    port: Port,
    item: Item,
    result: CaseResult,
    results: list[CaseResult],
    kernels: SharedKernels,
    device: str,
    timeout_s: float,
) -> str | None:
    """The gate's note for a failing item that runs over the port's layout
    (:attr:`~harness.model.levels.KindSpec.caused_by`) when that layout
    diverges too: compared here if ``parity diff`` was not asked for it."""
    from harness.sides.items import DIVERGENT, PARITY
    from harness.verdicts.summary import cause_note

    layout_kind = kind_spec(result.kind)[0].caused_by
    if layout_kind is None or result.status == PARITY or layout_kind not in kinds_of(item):
        return None
    layout = next((r for r in results if r.kind == layout_kind), None)
    if layout is None:
        layout = run_item(oracle, port, layout_kind, item, kernels, device, timeout_s)
    return cause_note(layout.id) if layout.status == DIVERGENT else None
