"""A GPU report's ratios with their noise (reports/timing_noise.py): a ratio
whose spread holds 1 is a tie, never a win; a record without samples has no call."""

from __future__ import annotations

import random

from reports.gpu import sparse_markdown
from reports.timing_noise import paired_ratio, shown, unpaired_ratio


def rounds(port_mean: float, upstream_mean: float, jitter: float, n: int = 30) -> tuple[list[float], list[float]]:
    draw = random.Random(7)
    port = [port_mean * (1 + draw.uniform(-jitter, jitter)) for _ in range(n)]
    upstream = [upstream_mean * (1 + draw.uniform(-jitter, jitter)) for _ in range(n)]
    return port, upstream


def test_a_difference_inside_the_noise_is_a_tie() -> None:
    port, upstream = rounds(1.004, 1.0, jitter=0.05)  # 0.4% apart, 5% noise
    ratio = paired_ratio(port, upstream)
    assert ratio is not None and ratio.low <= 1 <= ratio.high and ratio.call == "tie"


def test_a_clear_difference_is_a_win_or_a_loss() -> None:
    faster = paired_ratio(*rounds(0.90, 1.0, jitter=0.01))
    slower = paired_ratio(*rounds(1.10, 1.0, jitter=0.01))
    assert faster is not None and faster.call == "win" and faster.high < 1
    assert slower is not None and slower.call == "loss" and slower.low > 1
    apart = unpaired_ratio(*rounds(0.80, 1.0, jitter=0.02))
    assert apart is not None and apart.call == "win"


def test_no_samples_no_call() -> None:
    assert paired_ratio([], []) is None and unpaired_ratio([1.0], []) is None
    assert shown(None) == ("n/a (no samples recorded)", "n/a")


def test_the_sparse_table_shows_the_spread_and_the_call() -> None:
    port, upstream = rounds(1.004, 1.0, jitter=0.05)
    timings = {"per_request": {"median": 1.0, "samples": port}, "upstream": {"median": 1.0, "samples": upstream}}
    section = {"spec": {}, "parity": [], "timing": [{"batch": "b", "ratio": 1.004, "timings": timings}]}
    table = "\n".join(sparse_markdown(section, "##"))
    assert "ratio (spread)" in table and "| tie " in table and "timings" not in table.split("Masked forward")[1]
