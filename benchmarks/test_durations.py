"""How long ``make test`` takes, and its slowest tests, written into docs/figures.md.

Runs ``make test`` with pytest's ``--durations=25`` (the same lint, type check,
import contracts and tests CI runs, the environments already built), times the
whole command, and writes the block ``tests`` of docs/figures.md: the wall
time, the machine, pytest's summary line and the 25 slowest test phases. A
figure, never an assertion: run it with nothing else on the machine.

    .tox/oracle/bin/python -m benchmarks.test_durations
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness.verdicts.provenance import repository_state
from reports.figures_page import write_figures

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 600
DURATION_LINE = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+)$")
SUMMARY_LINE = re.compile(r"^=+ (.* in [\d.]+s.*) =+$")


def slowest(output: str) -> list[tuple[float, str, str]]:
    """pytest's ``--durations`` lines: (seconds, phase, test id)."""
    return [(float(m[1]), m[2], m[3]) for m in map(DURATION_LINE.match, output.splitlines()) if m]


def summary(output: str) -> str:
    found = [m[1] for m in map(SUMMARY_LINE.match, output.splitlines()) if m]
    return found[-1] if found else "(no pytest summary line)"


def render(seconds: float, code: int, output: str) -> str:
    rows = "\n".join(f"| {s:.1f} | {phase} | `{test}` |" for s, phase, test in slowest(output))
    verdict = "within" if seconds <= TARGET_S else "over"
    return (
        f"`make test` (environments built): **{seconds / 60:.1f} min** wall ({seconds:.0f} s), exit {code}, "
        f"{verdict} the {TARGET_S // 60}-minute budget, on {os.cpu_count()} cores. pytest: {summary(output)}.\n\n"
        "The slowest test phases (`pytest --durations=25`, two workers, so they overlap):\n\n"
        "| seconds | phase | test |\n|---|---|---|\n" + rows + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", default="reports/out/test-durations.log", help="where make test's output goes")
    args = parser.parse_args(argv)
    log = Path(args.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    # make test runs tox with the machine's python3, as from a fresh shell: not this environment's.
    own_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != own_bin)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")} | {"PATH": path}
    started = time.perf_counter()
    done = subprocess.run(
        ["make", "test", "PYTEST_ARGS=--durations=25 tests"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    output = done.stdout + done.stderr
    log.write_text(output, encoding="utf-8")
    markdown = render(seconds, done.returncode, output)
    print(markdown)
    if done.returncode != 0:
        # A failed make test is no figure of the suite: the block keeps the last passing run's.
        print(f"make test exited {done.returncode} (its output: {log}); the tests block is left as it was")
        return 1
    write_figures("tests", markdown, "python -m benchmarks.test_durations", repository_state(ROOT).get("commit"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
