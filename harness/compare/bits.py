"""Bit-pattern comparison of float tensors (SPEC section 3).

Two tensors agree when their bit patterns are identical: there is no tolerance.
When they differ the report gives what ``torch.testing`` would and more: the
mismatch count, the largest distance in ULPs (through the order-preserving map
from float bits to integers, so adjacent floats are 1 apart and -0.0 sits on
+0.0), a histogram of ULP distances in numeric order, the first mismatching
index with both values, and the worst rows. -inf equals -inf because the bits
do; NaNs compare by bits and are always flagged, even when both sides have the
same NaN.

A difference involving a NaN or an infinity has no distance: it is recorded as
:data:`NAN_ULP` or :data:`INF_ULP`, beyond every finite distance (so a baseline
cap never admits one), counted in the ``NaN`` and ``inf`` histogram buckets and
printed as ``NaN`` and ``inf`` (:func:`ulp_text`), never as the sentinel.

The raw distance counts every representable value in between, so across zero
it counts every denormal: bf16 ``2**-14`` against ``-2**-20`` is 28160 ULP
apart. Beside it, ``max_ulp_of_larger`` is ``|a - b| / ulp(max(|a|, |b|))`` in
the tensor's dtype (130 there): the error in units of the larger value's last
place. It is descriptive only; bit patterns alone decide parity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.compare.ulp_text import (
    HISTOGRAM_EDGES,
    HISTOGRAM_LABELS,
    INF_BUCKET,
    INF_ULP,
    NAN_BUCKET,
    NAN_ULP,
    max_distance_text,
    ulp_of_larger_text,
)

_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
_SIGN_MASK = {torch.int32: 0x7FFFFFFF, torch.int16: 0x7FFF}
# (stored mantissa bits, smallest normal exponent) of each compared dtype.
_FORMATS = {torch.float32: (23, -126), torch.float16: (10, -14), torch.bfloat16: (7, -126)}


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Float bits as int64 in value order: ``ordered(a) - ordered(b)`` counts
    the representable values between ``a`` and ``b``."""
    view = _INT_VIEW[t.dtype]
    bits = t.contiguous().view(view).to(torch.int64)
    magnitude = bits & _SIGN_MASK[view]
    return torch.where(bits < 0, -magnitude, magnitude)


def _powers_of_two(exponents: torch.Tensor) -> torch.Tensor:
    """``2.0**exponents`` in float64, built from the bits (exact; the int64
    ``exponents`` must lie in float64's normal range, as every one here does)."""
    return ((exponents + 1023) << 52).view(torch.float64)


def ulp_of(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each finite float64 ``magnitude`` (>= 0):
    ``2**(e - mantissa bits)`` for ``2**e <= magnitude < 2**(e + 1)``, and the
    smallest subnormal below the normal range, zero included. Exact: a power of
    two built from its bits."""
    mantissa_bits, min_exponent = _FORMATS[dtype]
    _, exponent = torch.frexp(magnitude)  # magnitude = m * 2**exponent, 0.5 <= m < 1
    binade = torch.where(magnitude > 0, exponent.to(torch.int64) - 1, min_exponent)
    return _powers_of_two(torch.clamp(binade, min=min_exponent) - mantissa_bits)


@dataclass
class TensorComparison:
    """The bitwise verdict on one named tensor pair.

    ``index_names`` name the axes of ``first_mismatch`` (for example
    ``("token", "head", "dim")`` for outputs, ``("head", "token")`` for LSEs).
    ``max_ulp`` is the largest raw distance (:data:`NAN_ULP` or :data:`INF_ULP`
    when a non-finite value differs); ``max_ulp_of_larger`` the largest error in
    ULPs of the larger value over the finite differing pairs (0.0 when none),
    never above the raw distance: every spacing below the larger value is at
    most its ULP.
    ``histogram`` holds the non-empty buckets in numeric order.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    index_names: tuple[str, ...]
    mismatches: int = 0
    max_ulp: int = 0
    max_ulp_of_larger: float = 0.0
    histogram: dict[str, int] = field(default_factory=dict)
    first_mismatch: dict[str, Any] | None = None
    nan_oracle: int = 0
    nan_port: int = 0
    worst_rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    # bits_digest of each side's tensor: what a run on another machine must
    # reproduce for "the same case, the same bits" (None where no tensor was read).
    oracle_bits: str | None = None
    port_bits: str | None = None

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
    def nan_mismatches(self) -> int:
        """Differing elements where either side is a NaN."""
        return self.histogram.get(NAN_BUCKET, 0)

    @property
    def inf_mismatches(self) -> int:
        """Differing elements where either side is an infinity and neither a NaN."""
        return self.histogram.get(INF_BUCKET, 0)

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
        non_finite = [
            f"{n} by {what}" for n, what in ((self.nan_mismatches, "a NaN"), (self.inf_mismatches, "an infinity")) if n
        ]
        how = f" ({', '.join(non_finite)})" if non_finite else ""
        finite = self.mismatches - self.nan_mismatches - self.inf_mismatches
        # Beside the raw distance, which counts every denormal across zero; never
        # above it, so said only where it differs.
        larger = (
            f"; {'finite ones ' if non_finite else ''}at most "
            f"{ulp_of_larger_text(self.max_ulp_of_larger)} ULP of the larger value"
            if finite and self.max_ulp_of_larger != self.max_ulp
            else ""
        )
        inputs = f"; inputs there: {first['inputs']}" if first.get("inputs") else ""
        return (
            f"{head}: {self.mismatches}/{size} elements differ{how}, {max_distance_text(self.max_ulp)}; "
            f"first at ({at}): oracle {first.get('oracle')} port {first.get('port')}{inputs}{larger}{nan}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "exact": self.exact,
            "mismatches": self.mismatches,
            "max_ulp": self.max_ulp,
            "max_ulp_of_larger": self.max_ulp_of_larger,
            "nan_mismatches": self.nan_mismatches,
            "inf_mismatches": self.inf_mismatches,
            "histogram": self.histogram,
            "first_mismatch": self.first_mismatch,
            "nan_oracle": self.nan_oracle,
            "nan_port": self.nan_port,
            "worst_rows": self.worst_rows,
            "error": self.error,
            "oracle_bits": self.oracle_bits,
            "port_bits": self.port_bits,
        }


def bits_digest(tensor: torch.Tensor) -> str:
    """16 hex digits of SHA-256 over a tensor's dtype, shape and bit pattern
    (row-major, whatever its strides): equal digests, equal bits."""
    import hashlib

    host = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{str(host.dtype).removeprefix('torch.')}{list(host.shape)}".encode())
    # Bytes through torch's own view: numpy has no bf16, float8 or the like.
    digest.update(host.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


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
    result.oracle_bits, result.port_bits = bits_digest(oracle), bits_digest(port)
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
    nan = oracle.isnan() | port.isnan()
    inf = (oracle.isinf() | port.isinf()) & ~nan
    # A NaN or an infinity has no distance, whatever its bits say: record how far it gets.
    distance = torch.where(differ & inf, torch.full_like(distance, INF_ULP), distance)
    distance = torch.where(differ & nan, torch.full_like(distance, NAN_ULP), distance)
    distance = torch.where(differ, distance, torch.full_like(distance, -1))
    result.max_ulp = int(distance.max())
    finite_differ = differ & ~nan & ~inf
    of_larger = torch.zeros(oracle.shape, dtype=torch.float64)
    if bool(finite_differ.any()):
        # float64 holds every bf16 and fp16 difference exactly, and an fp32 one
        # correctly rounded; dividing by a power of two adds no error.
        x, y = oracle[finite_differ].to(torch.float64), port[finite_differ].to(torch.float64)
        of_larger[finite_differ] = (x - y).abs() / ulp_of(torch.maximum(x.abs(), y.abs()), oracle.dtype)
        result.max_ulp_of_larger = float(of_larger.max())
    edges = torch.tensor(HISTOGRAM_EDGES, dtype=torch.int64)
    finite_buckets = torch.bucketize(distance[finite_differ], edges)
    counts = torch.bincount(finite_buckets, minlength=len(HISTOGRAM_EDGES) + 1).tolist()
    counts += [int((differ & inf).sum()), int((differ & nan).sum())]
    result.histogram = {label: int(c) for label, c in zip(HISTOGRAM_LABELS, counts, strict=True) if c}
    flat = int(differ.flatten().nonzero()[0])
    index = list(torch.unravel_index(torch.tensor(flat), oracle.shape))
    result.first_mismatch = {
        "index": {n: int(i) for n, i in zip(index_names, index, strict=True)},
        "oracle": float(oracle.flatten()[flat]),
        "port": float(port.flatten()[flat]),
        "ulp": int(distance.flatten()[flat]),
        "ulp_of_larger": float(of_larger.flatten()[flat]),
    }
    per_row = _by_row(torch.where(differ, distance, torch.zeros_like(distance))).max(dim=1).values
    of_larger_per_row = _by_row(of_larger).max(dim=1).values
    mismatches_per_row = _by_row(differ).sum(dim=1)
    for row in per_row.argsort(descending=True, stable=True)[:worst].tolist():
        if mismatches_per_row[row] == 0:
            break
        result.worst_rows.append(
            {
                index_names[0]: row,
                "mismatches": int(mismatches_per_row[row]),
                "max_ulp": int(per_row[row]),
                "max_ulp_of_larger": float(of_larger_per_row[row]),
            }
        )
    return result


def first_new_nan(oracle: Any, port: Any, name: str, inputs_at: Callable[[int, int, int | None], str] | None) -> str:
    """``; first at (token T, head H[, dim D]): oracle X, port lse Y[; inputs there: ...]``
    for the first element (token-major) where the port has a NaN and the oracle has not."""
    import torch

    if name.endswith("lse"):  # [heads, tokens]: token-major like the outputs
        oracle, port = oracle.transpose(0, 1), port.transpose(0, 1)
    new = torch.isnan(port) & ~torch.isnan(oracle)
    if not bool(new.any()):
        return ""
    index = [int(i) for i in new.nonzero()[0]]
    token, head = index[0], index[1]
    dim = index[2] if len(index) > 2 else None
    at = f"token {token}, head {head}" + (f", dim {dim}" if dim is not None else "")
    text = f"; first at ({at}): oracle {float(oracle[tuple(index)])!r}"
    if inputs_at is not None:
        text += f"; inputs there: {inputs_at(token, head, dim)}"
    return text
