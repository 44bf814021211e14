"""Bit-pattern comparison of float tensors (SPEC section 3).

Two tensors agree when their bit patterns are identical: there is no tolerance.
When they differ the report gives what ``torch.testing`` would and more: the
mismatch count, the largest distance in ULPs (through the order-preserving map
from float bits to integers, so adjacent floats are 1 apart and -0.0 sits on
+0.0), a histogram of ULP distances, the first mismatching index with both
values, and the worst rows. -inf equals -inf because the bits do; NaNs compare
by bits and are always flagged, even when both sides have the same NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
_SIGN_MASK = {torch.int32: 0x7FFFFFFF, torch.int16: 0x7FFF}

# Histogram buckets of ULP distance: 0 (bits differ, values equal: only ±0),
# 1, 2, 3-4, 5-8, ..., then everything from 2**20 on, including inf and NaN.
HISTOGRAM_EDGES: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 64, 256, 1024, 1 << 20)
# The distance recorded when a NaN or an infinity differs: beyond any finite one.
NON_FINITE_ULP = 1 << 62


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Float bits as int64 in value order: ``ordered(a) - ordered(b)`` counts
    the representable values between ``a`` and ``b``."""
    view = _INT_VIEW[t.dtype]
    bits = t.contiguous().view(view).to(torch.int64)
    magnitude = bits & _SIGN_MASK[view]
    return torch.where(bits < 0, -magnitude, magnitude)


def bucket_label(index: int) -> str:
    if index == 0:
        return "0"
    if index == len(HISTOGRAM_EDGES):
        return f">{HISTOGRAM_EDGES[-1]}"
    lo, hi = HISTOGRAM_EDGES[index - 1] + 1, HISTOGRAM_EDGES[index]
    return str(hi) if lo == hi else f"{lo}-{hi}"


@dataclass
class TensorComparison:
    """The bitwise verdict on one named tensor pair.

    ``index_names`` name the axes of ``first_mismatch`` (for example
    ``("token", "head", "dim")`` for outputs, ``("head", "token")`` for LSEs).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    index_names: tuple[str, ...]
    mismatches: int = 0
    max_ulp: int = 0
    histogram: dict[str, int] = field(default_factory=dict)
    first_mismatch: dict[str, Any] | None = None
    nan_oracle: int = 0
    nan_port: int = 0
    worst_rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def elements(self) -> int:
        """How many elements were compared (0 when the shapes disagree)."""
        if self.error:
            return 0
        size = 1
        for n in self.shape:
            size *= n
        return size

    @property
    def exact(self) -> bool:
        return self.error is None and self.mismatches == 0 and self.nan_oracle == 0 and self.nan_port == 0

    def summary(self) -> str:
        if self.error:
            return f"{self.name}: {self.error}"
        size = 1
        for n in self.shape:
            size *= n
        head = f"{self.name} {self.dtype}{list(self.shape)}"
        nan = f"; NaN oracle {self.nan_oracle} port {self.nan_port}" if self.nan_oracle or self.nan_port else ""
        if self.mismatches == 0:
            return f"{head}: bit-exact{nan}"
        first = self.first_mismatch or {}
        at = ", ".join(f"{k} {v}" for k, v in first.get("index", {}).items())
        worst = "inf (a non-finite value differs)" if self.max_ulp >= NON_FINITE_ULP else str(self.max_ulp)
        return (
            f"{head}: {self.mismatches}/{size} elements differ, max {worst} ULP; first at ({at}): "
            f"oracle {first.get('oracle')} port {first.get('port')}{nan}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "exact": self.exact,
            "mismatches": self.mismatches,
            "max_ulp": self.max_ulp,
            "histogram": self.histogram,
            "first_mismatch": self.first_mismatch,
            "nan_oracle": self.nan_oracle,
            "nan_port": self.nan_port,
            "worst_rows": self.worst_rows,
            "error": self.error,
        }


def identical_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bit pattern, checked where the tensors live."""
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype not in _INT_VIEW:
        return False
    view = _INT_VIEW[a.dtype]
    return bool(torch.equal(a.contiguous().view(view), b.contiguous().view(view)))


def _by_row(t: torch.Tensor) -> torch.Tensor:
    """``[rows, everything else]``; a scalar is one row of one element."""
    return t.reshape(t.shape[0] if t.dim() else 1, -1)


def compare_bits(
    name: str, oracle: torch.Tensor, port: torch.Tensor, index_names: tuple[str, ...], worst: int = 5
) -> TensorComparison:
    """Compare two tensors bit for bit; rows are the first axis."""
    result = TensorComparison(name, str(oracle.dtype).removeprefix("torch."), tuple(oracle.shape), index_names)
    if oracle.dtype != port.dtype or oracle.shape != port.shape:
        result.error = (
            f"port gave {str(port.dtype).removeprefix('torch.')}{list(port.shape)}, "
            f"oracle {result.dtype}{list(oracle.shape)}"
        )
        return result
    if oracle.dtype not in _INT_VIEW:
        result.error = f"unsupported dtype {result.dtype}"
        return result
    oracle, port = oracle.detach().cpu(), port.detach().cpu()
    result.nan_oracle = int(oracle.isnan().sum())
    result.nan_port = int(port.isnan().sum())
    view = _INT_VIEW[oracle.dtype]
    # Bits decide equality (so -0.0 differs from +0.0); the ordered map only measures distance.
    differ = oracle.contiguous().view(view) != port.contiguous().view(view)
    a, b = ordered(oracle), ordered(port)
    result.mismatches = int(differ.sum())
    if result.mismatches == 0:
        return result
    distance = (a - b).abs()
    # A NaN or an infinity is as far as it gets, whatever its bits say.
    special = oracle.isnan() | port.isnan() | oracle.isinf() | port.isinf()
    distance = torch.where(differ & special, torch.full_like(distance, NON_FINITE_ULP), distance)
    distance = torch.where(differ, distance, torch.full_like(distance, -1))
    result.max_ulp = int(distance.max())
    edges = torch.tensor(HISTOGRAM_EDGES, dtype=torch.int64)
    buckets = torch.bucketize(distance[differ], edges)
    counts = torch.bincount(buckets, minlength=len(HISTOGRAM_EDGES) + 1)
    result.histogram = {bucket_label(i): int(c) for i, c in enumerate(counts.tolist()) if c}
    flat = int(differ.flatten().nonzero()[0])
    index = list(torch.unravel_index(torch.tensor(flat), oracle.shape))
    result.first_mismatch = {
        "index": {n: int(i) for n, i in zip(index_names, index, strict=True)},
        "oracle": float(oracle.flatten()[flat]),
        "port": float(port.flatten()[flat]),
        "ulp": int(distance.flatten()[flat]),
    }
    per_row = _by_row(torch.where(differ, distance, torch.zeros_like(distance))).max(dim=1).values
    mismatches_per_row = _by_row(differ).sum(dim=1)
    for row in per_row.argsort(descending=True, stable=True)[:worst].tolist():
        if mismatches_per_row[row] == 0:
            break
        result.worst_rows.append(
            {index_names[0]: row, "mismatches": int(mismatches_per_row[row]), "max_ulp": int(per_row[row])}
        )
    return result
