"""``parity drift``: what upstream changed since the pin, release by release.

For each ``--against vllm==X`` (default: every release newer than the pin with
a ``requirements/vllm-X.txt`` here), :mod:`harness.night.drift` diffs the source of
every fingerprinted symbol between the pinned release and X, traces what X's
oracle side enters at every level, and runs the pinned oracle against X's
(served from ``.tox/vllm-X``, built on first use) on a suite at every level, the
sparse ones included; :mod:`reports.drift_report` writes ``<out>/<date>.md`` and ``.json``.

Exit codes: 0 every release at parity on every level (source drift alone is
not a failure: it is what the report is for), 1 some item diverges or only one
release refuses it, 2 bad input (an unknown release, no requirements file, an
environment that does not build or serve), 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from harness.commands.common import EXIT_DIVERGENT, EXIT_PARITY, EXIT_USAGE, write_output
from harness.commands.options import SIZE_HELP, DefaultsHelpFormatter, level_choice, non_negative_int
from harness.engine import UsageError, close_port
from harness.sides.items import LEVELS, selected_levels

DEFAULT_OUT = Path("reports") / "drift"


class _HelpFormatter(DefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and every option's default."""


def register(sub: Any) -> None:
    from harness.cases.suites import suite_names
    from harness.night.drift import default_releases

    p = sub.add_parser(
        "drift",
        help="source diffs and oracle-vs-oracle parity between the pinned vLLM and newer releases",
        description=__doc__,
        formatter_class=_HelpFormatter,
    )
    today_default = ", ".join(f"vllm=={v}" for v in default_releases()) or "none"
    p.add_argument(
        "--against",
        nargs="+",
        action="extend",
        metavar="vllm==X.Y.Z",
        help="releases to compare with the pin (default: every release newer than the pin that has "
        f"requirements/vllm-X.Y.Z.txt here, now {today_default}; each one's environment .tox/vllm-X.Y.Z "
        "is built on first use)",
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for <date>.md and <date>.json")
    p.add_argument("--suite", default="ci", help=f"suite for the parity part: one of {', '.join(suite_names())}")
    p.add_argument("--size", type=non_negative_int, help=SIZE_HELP)
    p.add_argument(
        "--level", type=level_choice, choices=(*LEVELS, "all"), default="all", help="parity level(s) to compare"
    )
    p.set_defaults(func=cmd_drift)


def today() -> str:
    return datetime.date.today().isoformat()


def _out_folder(text: str) -> Path:
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    parent = out if out.exists() else out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--out {out}: {parent} is not a folder")
    return out


def command_line(releases: list[str], args: argparse.Namespace) -> str:
    """The command that reproduces this report (defaults spelled out)."""
    words = ["parity", "drift", "--against", *(f"vllm=={r}" for r in releases), "--suite", args.suite]
    if args.size is not None:
        words += ["--size", str(args.size)]
    words += ["--level", args.level]
    return shlex.join(words)


def cmd_drift(args: argparse.Namespace) -> int:
    from harness.night.drift import DriftError, default_releases, parse_against, pinned_release

    out = _out_folder(args.out)
    try:
        releases = parse_against(args.against) if args.against else default_releases()
    except DriftError as exc:
        raise UsageError(str(exc)) from None
    if not releases:
        raise UsageError(
            f"no release newer than the pin (vllm=={pinned_release()}) has a requirements/vllm-X.txt here; "
            "name one with --against vllm==X.Y.Z"
        )
    from harness.cases.suites import load_suite

    suite = load_suite(args.suite, size=args.size)
    levels = selected_levels(args.level)
    try:
        record = measure(releases, suite, levels)
    except DriftError as exc:
        raise UsageError(str(exc)) from None
    record["command"] = command_line(releases, args)
    from harness.night.drift import record_agrees
    from reports.drift_report import upstream_since_pin, write_reports

    written: list[Path] = []

    def write() -> None:
        written.extend(write_reports(record, out))

    code = EXIT_PARITY if record_agrees(record) else EXIT_DIVERGENT
    print("\n".join(upstream_since_pin(record)))
    if not write_output(write, str(out)):
        return code or EXIT_USAGE
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    return code


def release_pythons(releases: list[str]) -> dict[str, Path]:
    """Each release's environment python, built first where missing (before any
    comparison, so a release that cannot install stops the run at once)."""
    from harness.night.drift import DriftError
    from oracle.process import OracleSpecError, ensure_environment

    pythons = {}
    for release in releases:
        try:
            pythons[release] = ensure_environment(release)
        except OracleSpecError as exc:
            raise DriftError(str(exc).replace("--oracle", "--against")) from None
    return pythons


def measure(releases: list[str], suite: Any, levels: tuple[str, ...]) -> dict[str, Any]:
    """Every release's source drift and parity, as :func:`harness.night.drift.drift_record`."""
    from harness.engine import open_oracle, select_device

    pythons = release_pythons(releases)
    kernels = select_device("cpu")
    pinned_oracle, provenance = open_oracle(allow_drift=False)
    try:
        return _measure(releases, pythons, suite, levels, kernels, pinned_oracle, provenance)
    finally:
        close_port(pinned_oracle)


def _measure(
    releases: list[str],
    pythons: dict[str, Path],
    suite: Any,
    levels: tuple[str, ...],
    kernels: Any,
    pinned_oracle: Any,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    from harness.engine import progress_bar
    from harness.night.drift import (
        DriftError,
        SourceSnapshot,
        compare_oracles,
        directory_bytes,
        drift_record,
        drift_symbols,
        read_sources,
        read_trace,
        release_record,
        symbol_drift,
    )
    from harness.sides.runner import count_items
    from oracle.process import OracleProcessError, OracleSpecError, open_oracle_process
    from oracle.sources import collect

    # The harness runs in the pinned environment (open_oracle checked its
    # fingerprints): the pinned sources are read in-process.
    from oracle.trace import trace_in_process

    entered = trace_in_process()
    # What each release's own side enters, level by level (its environment traces it).
    traces, trace_seconds = {}, {}
    for release in releases:
        started = time.perf_counter()
        traces[release] = read_trace(pythons[release])
        trace_seconds[release] = time.perf_counter() - started
    all_symbols = sorted({s for r in releases for s in drift_symbols(r, traces[r])})
    pinned_all = SourceSnapshot.from_json(collect(all_symbols))
    records = []
    for release in releases:
        print(f"parity drift: vllm=={release} against the pin ({provenance['release']})", file=sys.stderr)
        python = pythons[release]
        symbols = drift_symbols(release, traces[release])
        started = time.perf_counter()
        snapshot = read_sources(python, symbols)
        if snapshot.version != release:
            raise DriftError(f"the vllm-{release} environment holds vllm {snapshot.version}, not {release}")
        drifts = symbol_drift(symbols, pinned_all, snapshot)
        sources_s = time.perf_counter() - started
        try:
            release_oracle, hello = open_oracle_process(release)
        except (OracleSpecError, OracleProcessError) as exc:
            raise DriftError(str(exc)) from None
        started = time.perf_counter()
        bar, advance = progress_bar(count_items(suite, levels))
        try:
            level_drift = compare_oracles(pinned_oracle, release_oracle, suite, levels, kernels, "cpu", advance=advance)
        finally:
            bar.stop()
            close_port(release_oracle)
        parity_s = time.perf_counter() - started
        environment = python.parent.parent
        pin_statuses = [s["status"] for s in hello.get("fingerprints", [])]
        own_pin = (
            f"{pin_statuses.count('ok')}/{len(pin_statuses)} fingerprints ok" if hello.get("pin") is not None else None
        )
        extra = {
            "suite": suite.name,
            "environment": f".tox/{environment.name}",
            "environment_bytes": directory_bytes(environment),
            "release_pin": own_pin,
            "seconds": {
                "trace": round(trace_seconds[release], 1),
                "sources": round(sources_s, 1),
                "parity": round(parity_s, 1),
            },
        }
        records.append(release_record(pinned_all, snapshot, drifts, level_drift, extra, entered, traces[release]))
    return drift_record(today(), pinned_all, suite.name, levels, records)
