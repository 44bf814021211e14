"""How sure a GPU report's ratio is: each ratio with the spread of the calls it
came from, and a call of win, loss or tie.

Two loops timed in turn (``interleaved_cuda_ms``) give paired samples, one of
each per round: the ratio is the median of the per-round ratios and its spread
their interquartile range. Two loops timed apart (the merge kernels, many
launches a timing) give unpaired samples: the ratio is the ratio of the
medians, its spread the widest and narrowest ratio their quartiles allow.

A ratio whose spread holds 1 is a tie: the loops are not told apart by these
calls, whatever the medians say. Otherwise it is a win (the port faster) or a
loss. A record without samples (a report written before they were kept) has
no spread and no call: "n/a", never a win.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NoisyRatio:
    """``ratio`` (port time over upstream time: below 1 the port is faster), its
    spread ``low``..``high`` and the call; ``samples`` how many calls each side had."""

    ratio: float
    low: float
    high: float
    samples: int

    @property
    def call(self) -> str:
        if self.low <= 1.0 <= self.high:
            return "tie"
        return "win" if self.high < 1.0 else "loss"

    def shown(self) -> str:
        return f"{self.ratio:.3f} ({self.low:.3f}-{self.high:.3f})"


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def paired_ratio(port_ms: Sequence[float], upstream_ms: Sequence[float]) -> NoisyRatio | None:
    """Port over upstream from samples taken in turn (one pair a round)."""
    if not port_ms or len(port_ms) != len(upstream_ms):
        return None
    ratios = [p / u for p, u in zip(port_ms, upstream_ms, strict=True)]
    low, high = _quartiles(ratios)
    return NoisyRatio(statistics.median(ratios), low, high, len(ratios))


def unpaired_ratio(port_ms: Sequence[float], upstream_ms: Sequence[float]) -> NoisyRatio | None:
    """Port over upstream from samples taken apart."""
    if not port_ms or not upstream_ms:
        return None
    p1, p3 = _quartiles(port_ms)
    u1, u3 = _quartiles(upstream_ms)
    ratio = statistics.median(port_ms) / statistics.median(upstream_ms)
    return NoisyRatio(ratio, p1 / u3, p3 / u1, min(len(port_ms), len(upstream_ms)))


def shown(ratio: NoisyRatio | None) -> tuple[str, str]:
    """A table's two cells: the ratio with its spread, and the call."""
    if ratio is None:
        return "n/a (no samples recorded)", "n/a"
    return ratio.shown(), ratio.call
