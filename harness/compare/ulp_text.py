"""How ULP distances are named and printed: the histogram's buckets and labels
and the texts of a distance (SPEC section 3; :mod:`harness.compare.bits`
measures the distances).

Text only, no tensor: the verdicts and reports read recorded distances without
loading torch.
"""

from __future__ import annotations

# Histogram buckets of finite ULP distance: 0 (bits differ, values equal: only
# ±0), 1, 2, 3-4, 5-8, ..., then everything from 2**20 on; then the non-finite
# buckets (HISTOGRAM_LABELS lists them all, in order).
HISTOGRAM_EDGES: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 64, 256, 1024, 1 << 20)
# The distances recorded when an infinity (and no NaN), or a NaN, differs: beyond
# any finite one (a finite fp32 distance is below 2**32), NaN the furthest of all.
INF_ULP = 1 << 62
NAN_ULP = (1 << 63) - 1
# Every distance from here on is one of the two above.
NON_FINITE_ULP = INF_ULP
INF_BUCKET, NAN_BUCKET = "inf", "NaN"


def bucket_label(index: int) -> str:
    """The label of finite bucket ``index`` (``0`` .. ``len(HISTOGRAM_EDGES)``)."""
    if index == 0:
        return "0"
    if index == len(HISTOGRAM_EDGES):
        return f">{HISTOGRAM_EDGES[-1]}"
    lo, hi = HISTOGRAM_EDGES[index - 1] + 1, HISTOGRAM_EDGES[index]
    return str(hi) if lo == hi else f"{lo}-{hi}"


# Every histogram label, in the order of the distances they hold.
HISTOGRAM_LABELS: tuple[str, ...] = (
    *(bucket_label(i) for i in range(len(HISTOGRAM_EDGES) + 1)),
    INF_BUCKET,
    NAN_BUCKET,
)
_LABEL_RANK = {label: rank for rank, label in enumerate(HISTOGRAM_LABELS)}


def sorted_histogram(histogram: dict[str, int]) -> dict[str, int]:
    """``histogram`` with its buckets in numeric order (never string order);
    a label this version does not know goes last, so an odd file still reads."""
    return dict(sorted(histogram.items(), key=lambda item: (_LABEL_RANK.get(item[0], len(_LABEL_RANK)), item[0])))


def histogram_text(histogram: dict[str, int]) -> str:
    """``1: 3, 3-4: 1, NaN: 2``: the non-empty buckets in numeric order."""
    return ", ".join(f"{label}: {count}" for label, count in sorted_histogram(histogram).items() if count)


def ulp_text(distance: int) -> str:
    """A recorded distance as printed: ``NaN``, ``inf`` or the integer."""
    if distance >= NAN_ULP:
        return NAN_BUCKET
    if distance >= INF_ULP:
        return INF_BUCKET
    return str(distance)


def max_distance_text(distance: int) -> str:
    """``max 3 ULP``; where the largest difference is no number of ULPs, what it is."""
    if distance >= NAN_ULP:
        return "max: a NaN against a number (no ULP distance)"
    if distance >= INF_ULP:
        return "max: an infinity against a finite value or the other infinity (no ULP distance)"
    return f"max {distance} ULP"


def ulp_of_larger_text(error: float) -> str:
    """An error in ULPs of the larger value as printed: four significant
    digits (``0.5``, ``130``, ``1.004``), whole numbers from 10000 on."""
    return f"{error:.0f}" if error >= 10_000 else f"{error:.4g}"
