"""What generating the inputs costs: the ci suite's tensor items materialised on
the CPU, per level, printed, never asserted (the best of three passes).

Each item's inputs are what one side gets (the harness builds them once per
side); "values" counts the elements of every tensor built, NaN padding included.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.cases.sparse_inputs import materialise_topk
from harness.cases.suites import load_suite
from harness.kernels.numeric import case_prefill_inputs, materialise_merge
from harness.kernels.sparse_prefill import materialise_sparse_prefill
from harness.sides.runner import plan_items

BUILDERS: dict[str, Callable[[Any], Any]] = {
    "merge": materialise_merge,
    "prefill": case_prefill_inputs,
    "sparse-mask": materialise_topk,
    "sparse-prefill": materialise_sparse_prefill,
}


def values_in(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, list | tuple):
        return sum(values_in(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(values_in(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


def main() -> None:
    torch.set_num_threads(1)
    suite = load_suite("ci")
    print("| level | items | values (M) | seconds | M values/s |")
    print("|---|---|---|---|---|")
    total_values, total_seconds = 0, 0.0
    for kind, build in BUILDERS.items():
        items = [item for item_kind, item in plan_items(suite, (kind,)) if item_kind == kind]
        values = sum(values_in(build(item)) for item in items)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for item in items:
                build(item)
            best = min(best, time.perf_counter() - started)
        total_values, total_seconds = total_values + values, total_seconds + best
        print(f"| {kind} | {len(items)} | {values / 1e6:.2f} | {best:.2f} | {values / 1e6 / best:.1f} |")
    print(f"| all | | {total_values / 1e6:.2f} | {total_seconds:.2f} | {total_values / 1e6 / total_seconds:.1f} |")


if __name__ == "__main__":
    main()
