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

from harness.cases.suites import load_suite
from harness.model.levels import TENSOR_KINDS, kind_spec, level_of
from harness.sides.runner import plan_items


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
    # Every kind whose items have tensor inputs, built as its level builds them (KindSpec.inputs).
    for kind in TENSOR_KINDS:
        materialise = kind_spec(kind)[0].inputs
        assert materialise is not None

        def build(item: Any, materialise: Callable[[Any, str], Any] = materialise) -> Any:
            return materialise(item, "cpu")

        items = [item for item_kind, item in plan_items(suite, (level_of(kind),)) if item_kind == kind]
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
