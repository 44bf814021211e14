"""Write or check ``cases/output_digests.json``: per item of the smoke suite at
every level whose answers are floats (merge, prefill, sparse-prefill), the bits
both sides computed (:func:`harness.compare.bits.bits_digest` of each tensor),
the oracle (the pinned release, asked afresh: no oracle cache) and per_request.

    python tools/output_digests.py --write      # after a deliberate change of a kernel, the stream or the suite
    python tools/output_digests.py --check      # this machine's bits against the file (exit 1 if any differs)
    python tools/output_digests.py --check --threads 2    # what another thread count changes (it does)

The inputs come first: ``--check`` runs ``tools/input_digests.py --check
--threads 1,2``'s comparison before any output is computed, since outputs on
other inputs say nothing of the kernels. ``--threads`` runs the items under each of torch's
intra-op thread counts given (the harness itself always runs at
:data:`harness.engine.device.NUMERIC_THREADS`, one, because at two a few
items' bits differ); it prints one line per difference, then the machine it
ran on.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from harness.model.levels import FLOAT_LEVELS

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_DIGESTS_FILE = ROOT / "cases" / "output_digests.json"
SUITE = "smoke"
LEVELS = FLOAT_LEVELS
FORMAT = 1


def _input_tool() -> Any:
    spec = importlib.util.spec_from_file_location("input_digests_tool", ROOT / "tools" / "input_digests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def current_digests(threads: int) -> dict[str, Any]:
    """Every item's tensors as this process computes them at ``threads`` threads:
    ``{item id: {tensor: [oracle bits, port bits]}}``; an item that did not
    compute (an error, not run) holds its status instead."""
    from harness.engine import RunRequest, execute
    from harness.engine import device as engine_device
    from harness.sides.loading import close_port

    engine_device.NUMERIC_THREADS = threads
    items: dict[str, Any] = {}
    for level in LEVELS:
        done = execute(RunRequest(port="per_request", suite=SUITE, level=level, oracle_cache=False, jobs=1))
        close_port(done.port)
        for result in done.result.results:
            if result.tensors and not result.error:
                items[result.id] = {t.name: [t.oracle_bits, t.port_bits] for t in result.tensors}
            else:
                items[result.id] = {"status": result.status, "error": result.error}
    return {"format": FORMAT, "suite": SUITE, "levels": list(LEVELS), "items": dict(sorted(items.items()))}


def main(argv: list[str] | None = None) -> int:
    inputs = _input_tool()
    assert __doc__ is not None
    args = inputs.digests_parser("output_digests.py", __doc__, "cases/output_digests.json", "bits").parse_args(argv)
    if args.write:
        OUTPUT_DIGESTS_FILE.write_text(json.dumps(current_digests(1), indent=1) + "\n")
        print(f"wrote {OUTPUT_DIGESTS_FILE}")
        return 0
    if inputs.main(["--check", "--threads", "1,2"]) != 0:
        print("the inputs differ: outputs not checked")
        return 1
    committed = json.loads(OUTPUT_DIGESTS_FILE.read_text())
    differences = 0
    for threads in [int(t) for t in args.threads.split(",")]:
        found = current_digests(threads)
        differences += inputs.item_differences(found["items"], committed["items"], f"{threads} threads: ")
    print(f"{differences} differences, {len(committed['items'])} items' outputs, on {inputs.machine()}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
