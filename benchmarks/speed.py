"""The speed figures of the pool and the oracle cache, printed in one run, never
asserted (``make speed`` writes them into docs/figures.md).

Each figure is the wall time of one ``parity`` command run as a user runs it
(a fresh process, the machine's own cores):

* the ci gate at every level, ``--jobs 1`` and ``--jobs 2``, both computing
  every oracle result afresh (``--no-oracle-cache``), so the ratio is the pool's
  alone (target: ``--jobs 2`` at most 0.65x of ``--jobs 1``);
* the ci gate and the kill matrix as they ran before the pool and the cache: the same
  commands in a git worktree of ``--before`` (default: the last commit before
  the pool and the cache), run in this environment with that tree's defaults;
* the kill matrix, ``parity mutants --suite ci``, with the defaults on an empty
  cache folder (cold), then again on the folder the cold run filled (warm)
  (target: warm at most a third of the kill matrix before the pool and the cache);
* with ``--nightly``, the nightly default run (``parity nightly`` with its
  defaults) on an empty cache folder (target: within 15 minutes).

Each command's output goes to ``reports/out/speed/<label>.log``; ``--json FILE``
writes the figures. Cache folders are fresh temporary ones
(``PARITY_ORACLE_CACHE``), removed afterwards, so the user's cache is neither
read nor written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The last commit before the pool and the cache (no --jobs, no oracle cache, torch's default threads).
BEFORE_POOL_AND_CACHE = "4a0c2ae"
GATE_TARGET = 0.65
MUTANTS_TARGET = 1 / 3
NIGHTLY_TARGET_S = 15 * 60


@dataclass
class Timed:
    label: str
    command: list[str]
    seconds: float
    exit_code: int


def timed(label: str, args: list[str], cache: Path, out: Path, tree: Path = ROOT) -> Timed:
    """Wall seconds of ``python -m harness ARGS`` run in ``tree`` (its harness,
    oracle and ports: ``-m`` puts the working directory first on the path) with
    ``cache`` as its oracle cache folder."""
    command = [sys.executable, "-m", "harness", *args]
    env = {**os.environ, "PARITY_ORACLE_CACHE": str(cache)}
    log = out / f"{label.replace(' ', '-')}.log"
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as sink:
        code = subprocess.run(command, cwd=tree, env=env, stdout=sink, stderr=subprocess.STDOUT, check=False).returncode
    seconds = time.perf_counter() - started
    # A run that failed may have stopped early: its time is no figure.
    verdict = "" if code == 0 else "   NOT A FIGURE: the command failed"
    print(f"  {label:<40} {seconds:8.1f} s   exit {code}   (log {log}){verdict}", flush=True)
    return Timed(label, args, seconds, code)


def ratio(numerator: Timed, denominator: Timed) -> float | None:
    """``numerator``'s time over ``denominator``'s; None unless both runs succeeded."""
    return numerator.seconds / denominator.seconds if numerator.exit_code == denominator.exit_code == 0 else None


def said(value: float | None) -> str:
    return "n/a (a run failed)" if value is None else f"{value:.2f}"


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A detached git worktree of ``revision``, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="parity-before-") as parent:
        tree = Path(parent) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), revision], cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False,
                           capture_output=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nightly", action="store_true", help="also time the nightly default run (about 15 min)")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    parser.add_argument(
        "--before",
        metavar="REV",
        default=BEFORE_POOL_AND_CACHE,
        help=f"the tree before (default {BEFORE_POOL_AND_CACHE})",
    )
    args = parser.parse_args(argv)

    machine = platform.processor() or platform.machine()
    print(f"machine: {os.cpu_count()} cores, {machine}, Python {platform.python_version()}")
    figures: dict[str, object] = {"cores": os.cpu_count()}
    work = ROOT / "reports" / "out" / "speed"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="parity-speed-") as scratch, worktree(args.before) as before:
        cold_cache, unused_cache, night_cache = (Path(scratch) / name for name in ("cache", "unused", "night"))
        print(f"ci gate, every level, oracle computed afresh (before: {args.before}):")
        gate_before = timed("gate before", ["gate", "--suite", "ci", "--out", str(work / "gate-before")], unused_cache,
                            work, before)  # fmt: skip
        gate = [
            timed(
                f"gate jobs {jobs}",
                [
                    "gate",
                    "--suite",
                    "ci",
                    "--jobs",
                    str(jobs),
                    "--no-oracle-cache",
                    "--out",
                    str(work / f"gate-{jobs}"),
                ],
                unused_cache,
                work,
            )
            for jobs in (1, 2)
        ]
        gate_ratio = ratio(gate[1], gate[0])
        print(f"  --jobs 2 / --jobs 1 = {said(gate_ratio)} (target <= {GATE_TARGET})")
        print(f"  --jobs 2 / before = {said(ratio(gate[1], gate_before))}")
        print("kill matrix, parity mutants --suite ci:")
        mutants_out = ["--out", str(work / "mutants")]
        mutants = [
            timed(
                "mutants before",
                ["mutants", "--suite", "ci", "--out", str(work / "mutants-before")],
                unused_cache,
                work,
                before,
            ),
            timed("mutants cold cache", ["mutants", "--suite", "ci", *mutants_out], cold_cache, work),
            timed("mutants warm cache", ["mutants", "--suite", "ci", *mutants_out], cold_cache, work),
        ]
        mutants_ratio = ratio(mutants[2], mutants[0])
        print(f"  warm / before = {said(mutants_ratio)} (target <= {MUTANTS_TARGET:.2f})")
        figures |= {
            "before": args.before,
            "gate_before": asdict(gate_before),
            "gate": [asdict(t) for t in gate],
            "gate_ratio": gate_ratio,
            "mutants": [asdict(t) for t in mutants],
            "mutants_ratio": mutants_ratio,
        }
        if args.nightly:
            print("nightly default run, empty cache folder:")
            night = timed("nightly default", ["nightly", "--out", str(work / "nightly")], night_cache, work)
            print(f"  {night.seconds / 60:.1f} min (target <= {NIGHTLY_TARGET_S // 60} min)")
            figures["nightly"] = asdict(night)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
