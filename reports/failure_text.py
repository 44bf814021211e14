"""What every report says of one failing item: ``parity run``'s printed
summary, the gate's summary.md and JUnit (and, from the same pieces,
``parity diff``: :func:`reports.diff_text.format_tensor_verdict`).

For any item: its likely cause first, when it has one (an L3 item whose
layout diverges too: :func:`harness.verdicts.summary.layout_causes`), then its
detail. For an item of a float level (any level whose answers are tensors,
the dense prefill, the merge, the sparse prefill and any level to come) the
detail is its first differing tensor's: how many elements differ, the largest
distance in ULPs, the first differing index with both values and the inputs
there; a second line gives the item's ULP histogram.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.compare.ulp_text import histogram_text


def _histogram(row: Any) -> dict[str, int]:
    """A row's ULP histogram (the results table keeps it as JSON text)."""
    value = getattr(row, "histogram", None)
    if isinstance(value, str) and value:
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return dict(value) if isinstance(value, Mapping) else {}


def failure_lines(row: Any, causes: Mapping[str, str]) -> list[str]:
    """One failing row as every report says it: the cause and the detail, then
    (a float item's) its ULP histogram."""
    detail = f"{causes[row.id]}; {row.detail}" if row.id in causes else str(row.detail)
    histogram = histogram_text(_histogram(row))
    return [detail, f"ULP histogram: {histogram}"] if histogram else [detail]
