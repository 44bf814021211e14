"""Run a benchmark and write what it prints into docs/figures.md.

    python -m benchmarks.figures NAME COMMAND...

runs ``COMMAND``, passing its output through as it comes, and when it exits 0
puts that output (as printed) in the block ``NAME`` of docs/figures.md with the
command, the date and the commit (:mod:`reports.figures_page`). A failed run
writes nothing and exits with the command's code. The Makefile's ``bench`` and
``speed`` run their benchmarks through it.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from harness.verdicts.provenance import repository_state
from reports.figures_page import write_figures

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m benchmarks.figures NAME COMMAND...", file=sys.stderr)
        return 2
    name, command = args[0], args[1:]
    lines: list[str] = []
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        assert run.stdout is not None
        for line in run.stdout:
            sys.stdout.write(line)
            lines.append(line)
    if run.returncode != 0:
        print(f"figures: {shlex.join(command)} exited {run.returncode}; block {name} left as it was", file=sys.stderr)
        return run.returncode
    printed = "".join(lines).strip("\n")
    write_figures(name, f"```text\n{printed}\n```", shlex.join(command), repository_state(ROOT).get("commit"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
