"""Issue 17's speed figures, printed in one run, never asserted (``make bench-speed``).

Each figure is the wall time of one ``parity`` command run as a user runs it
(a fresh process, the machine's own cores):

* the ci gate at every level, ``--jobs 1`` and ``--jobs 2``, both computing
  every oracle result afresh (``--no-oracle-cache``), so the ratio is the pool's
  alone (target: ``--jobs 2`` at most 0.65x of ``--jobs 1``);
* the kill matrix, ``parity mutants --suite ci``: as it ran before the pool and
  the cache (``--jobs 1 --no-oracle-cache``), then with the defaults on an empty
  cache folder (cold), then again on the folder the cold run filled (warm)
  (target: warm at most a third of the first);
* with ``--nightly``, the nightly default run (``parity nightly`` with its
  defaults) on an empty cache folder (target: within 15 minutes).

Each command's output goes to ``reports/out/speed/<label>.log``; ``--json FILE``
writes the figures. Cache folders are fresh temporary ones
(``PARITY_ORACLE_CACHE``), removed afterwards, so the user's cache is neither
read nor written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATE_TARGET = 0.65
MUTANTS_TARGET = 1 / 3
NIGHTLY_TARGET_S = 15 * 60


@dataclass
class Timed:
    label: str
    command: list[str]
    seconds: float
    exit_code: int


def timed(label: str, args: list[str], cache: Path, out: Path) -> Timed:
    """Wall seconds of ``python -m harness ARGS`` with ``cache`` as its oracle cache folder."""
    command = [sys.executable, "-m", "harness", *args]
    env = {**os.environ, "PARITY_ORACLE_CACHE": str(cache)}
    log = out / f"{label.replace(' ', '-')}.log"
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as sink:
        code = subprocess.run(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, check=False).returncode
    seconds = time.perf_counter() - started
    print(f"  {label:<40} {seconds:8.1f} s   exit {code}   (log {log})", flush=True)
    return Timed(label, args, seconds, code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nightly", action="store_true", help="also time the nightly default run (about 15 min)")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = parser.parse_args(argv)

    machine = platform.processor() or platform.machine()
    print(f"machine: {os.cpu_count()} cores, {machine}, Python {platform.python_version()}")
    figures: dict[str, object] = {"cores": os.cpu_count()}
    work = ROOT / "reports" / "out" / "speed"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="parity-speed-") as scratch:
        cold_cache, unused_cache, night_cache = (Path(scratch) / name for name in ("cache", "unused", "night"))
        print("ci gate, every level, oracle computed afresh:")
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
        gate_ratio = gate[1].seconds / gate[0].seconds
        print(f"  --jobs 2 / --jobs 1 = {gate_ratio:.2f} (target <= {GATE_TARGET})")
        print("kill matrix, parity mutants --suite ci:")
        mutants_out = ["--out", str(work / "mutants")]
        mutants = [
            timed(
                "mutants before (jobs 1, no cache)",
                ["mutants", "--suite", "ci", "--jobs", "1", "--no-oracle-cache", *mutants_out],
                unused_cache,
                work,
            ),
            timed("mutants cold cache", ["mutants", "--suite", "ci", *mutants_out], cold_cache, work),
            timed("mutants warm cache", ["mutants", "--suite", "ci", *mutants_out], cold_cache, work),
        ]
        mutants_ratio = mutants[2].seconds / mutants[0].seconds
        print(f"  warm / before = {mutants_ratio:.2f} (target <= {MUTANTS_TARGET:.2f})")
        figures |= {
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
