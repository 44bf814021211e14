"""Write or check ``cases/input_digests.json`` (harness/sides/input_digests.py):
the stream's digest and, per item of the smoke and ci suites at every tensor
level, its materialised inputs' digest.

    python tools/input_digests.py --write      # after a deliberate change of the stream or a suite
    python tools/input_digests.py --check      # this machine's inputs against the file (exit 1 if any differs)
    python tools/input_digests.py --check --threads 1,2

``--check`` recomputes every digest under each thread count given (torch's
intra-op threads; the inputs must not depend on them) and prints one line per
difference, then the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def current_digests() -> dict[str, Any]:
    """The file's content as this process computes it."""
    from harness.cases.suites import load_suite
    from harness.sides.input_digests import (
        DIGESTED_SUITES,
        DIGESTS_FORMAT,
        TENSOR_KINDS,
        digest_of,
        item_inputs,
        item_key,
        stream_probe,
    )
    from harness.sides.runner import plan_items

    items: dict[str, str] = {}
    for suite_name in DIGESTED_SUITES:
        for kind, item in plan_items(load_suite(suite_name), TENSOR_KINDS):
            items[item_key(kind, item)] = digest_of(item_inputs(kind, item))
    return {"format": DIGESTS_FORMAT, "stream": stream_probe(), "items": dict(sorted(items.items()))}


def machine() -> str:
    import platform

    import numpy as np
    import torch

    return (
        f"{platform.machine()}, torch {torch.__version__} capability {torch.backends.cpu.get_cpu_capability()}, "
        f"numpy {np.__version__}"
    )


def item_differences(found: dict[str, Any], committed: dict[str, Any], prefix: str) -> int:
    """Print one line per item whose digest differs between ``found`` and
    ``committed`` (or that only one holds); how many."""
    differing = [key for key in sorted(set(found) | set(committed)) if found.get(key) != committed.get(key)]
    for key in differing:
        print(f"{prefix}{key}: {found.get(key)} != {committed.get(key)}")
    return len(differing)


def digests_parser(tool: str, doc: str, file: str, compared: str) -> argparse.ArgumentParser:
    """The command line of a digests tool (this one, tools/output_digests.py):
    ``--write`` or ``--check``, and ``--threads``."""
    parser = argparse.ArgumentParser(prog=f"python tools/{tool}", description=doc.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help=f"rewrite {file}")
    action.add_argument("--check", action="store_true", help=f"compare this machine's {compared} with the file")
    parser.add_argument("--threads", default="1", help="torch thread counts to check under, comma-separated")
    return parser


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    args = digests_parser("input_digests.py", __doc__, "cases/input_digests.json", "inputs").parse_args(argv)

    import torch

    from harness.sides.input_digests import DIGESTS_FILE

    if args.write:
        torch.set_num_threads(1)
        DIGESTS_FILE.write_text(json.dumps(current_digests(), indent=1) + "\n")
        print(f"wrote {DIGESTS_FILE}")
        return 0
    committed = json.loads(DIGESTS_FILE.read_text())
    differences = 0
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        found = current_digests()
        if found["stream"] != committed["stream"]:
            differences += 1
            print(f"{threads} threads: stream {found['stream']} != {committed['stream']}")
        differences += item_differences(found["items"], committed["items"], f"{threads} threads: item ")
    print(f"{differences} differences, {len(committed['items'])} items and the stream, on {machine()}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
