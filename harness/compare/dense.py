"""Exact layout comparison (parity level L1).

Two layouts are at parity when every field of every chunk and the empty token
slices are equal. Otherwise :func:`first_layout_divergence` names the first
chunk (in chunk order) and field (in :meth:`Chunk.field_names` order) that
differ, with both values, the way ``torch.testing`` names the first mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.model import Chunk, Layout

# Sequences longer than this are shown around their first differing element.
_SHOWN = 12


@dataclass(frozen=True)
class Divergence:
    """The first place two sides disagree. ``chunk`` is None for whole-layout
    fields (``num_chunks``, ``empty_token_slices``, ``workspace_size``)."""

    field: str
    oracle: Any
    port: Any
    chunk: int | None = None

    @property
    def where(self) -> str:
        return f"chunk {self.chunk}, field {self.field}" if self.chunk is not None else f"field {self.field}"

    def message(self) -> str:
        return f"{self.where}: oracle {describe(self.oracle, self.port)} != port {describe(self.port, self.oracle)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "chunk": self.chunk,
            "field": self.field,
            "oracle": _jsonable(self.oracle),
            "port": _jsonable(self.port),
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def first_difference(a: Any, b: Any) -> int | None:
    """Index of the first differing element of two sequences (or the shorter length)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def describe(value: Any, other: Any) -> str:
    """A short rendering; long sequences are cut around their first difference."""
    if not isinstance(value, tuple) or len(value) <= _SHOWN:
        return repr(_jsonable(value))
    at = first_difference(value, other) if isinstance(other, tuple) else 0
    at = at or 0
    lo = max(0, at - 3)
    hi = min(len(value), lo + _SHOWN)
    body = ", ".join(repr(_jsonable(v)) for v in value[lo:hi])
    head = "..., " if lo else ""
    tail = ", ..." if hi < len(value) else ""
    return f"[{head}{body}{tail}] (len {len(value)}, first difference at [{at}])"


def compare_chunks(index: int, oracle: Chunk, port: Chunk) -> Divergence | None:
    if oracle == port:
        # The dataclass's __eq__ is this loop's verdict (same class, each field
        # ==) in one call; only a difference needs the field-by-field walk.
        return None
    for name in Chunk.field_names():
        a, b = getattr(oracle, name), getattr(port, name)
        if a != b:
            return Divergence(name, a, b, chunk=index)
    return None


def first_layout_divergence(oracle: Layout, port: Layout) -> Divergence | None:
    """None when the layouts are identical; else the first differing chunk field.

    Chunks are compared pairwise in order before chunk counts, so a port that
    splits one chunk differently is reported at the field where it first goes
    wrong, not merely as "different number of chunks".
    """
    for index, (a, b) in enumerate(zip(oracle.chunks, port.chunks, strict=False)):
        divergence = compare_chunks(index, a, b)
        if divergence is not None:
            return divergence
    if oracle.num_chunks != port.num_chunks:
        return Divergence("num_chunks", oracle.num_chunks, port.num_chunks)
    if oracle.empty_token_slices != port.empty_token_slices:
        return Divergence("empty_token_slices", oracle.empty_token_slices, port.empty_token_slices)
    return None
