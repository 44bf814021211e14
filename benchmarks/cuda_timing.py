"""Timing on the GPU with CUDA events, shared by the GPU report's sections
(:mod:`benchmarks.gpu_report`, :mod:`benchmarks.gpu_dcp`, :mod:`benchmarks.gpu_sparse`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch


def cuda_ms(fn: Callable[[], Any], warmup: int, repeats: int, launches: int = 1) -> dict[str, Any]:
    """Median, min and max milliseconds (and every sample, for the report's
    noise: reports/timing_noise.py) a call of ``fn`` takes over ``repeats``
    CUDA-event timings, each of ``launches`` calls back to back.

    A kernel's device time wants ``launches`` > 1: the host then enqueues the
    next launch while the device runs the last, so the timing holds the kernel
    and not the host's launch latency (tens of microseconds for a Triton launch,
    a tenth of a merge of 400 MB). A loop whose host work is part of its cost
    (the context loops) is timed one call at a time.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        stop = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(launches):
            fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / launches)
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "samples": times}


def interleaved_cuda_ms(fns: dict[str, Callable[[], Any]], warmup: int, repeats: int) -> dict[str, dict[str, Any]]:
    """:func:`cuda_ms` of each of ``fns`` (one call a timing), their timings taken
    in turn, the order rotating each round: a drift of the device's clocks or of
    the host over the run weighs on every loop alike, not on whichever ran last."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            times[name].append(cuda_ms(fns[name], 0, 1)["median"])
    return {
        # Samples in round order: the i-th of each loop was taken in the same round (paired).
        name: {"median": statistics.median(taken), "min": min(taken), "max": max(taken), "samples": taken}
        for name, taken in times.items()
    }
