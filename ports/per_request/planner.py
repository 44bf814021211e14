"""Per-request packing of prefill context into workspace chunks (SPEC section 1b).

This is the project's own port of the planner that upstream b38e111d3e
(vllm PR #50613) introduced. It is written from the contract, not from vLLM's
source, and must not import vLLM: it is the thing the harness checks.

Terms used below:

* a *span* is a run of context rows ``[start, start + length)`` of one request;
* a span's *cost* is the workspace rows it needs: its length without DCP, and
  ``padded(start + length) - padded(start)`` under DCP, where
  ``padded(n) = ceil(n / (interleave * world)) * interleave`` is the number of
  rows one rank holds of the first ``n`` context rows;
* the *budget* is the rows one chunk may occupy: ``W``, or ``W // world`` under DCP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    """How context rows map onto workspace rows for one configuration."""

    budget: int
    alignment: int
    max_span: int
    dcp_world_size: int
    interleave: int

    @classmethod
    def for_workspace(
        cls, workspace_size: int, block_size: int, align_to_block: bool, dcp_world_size: int, interleave: int
    ) -> Geometry:
        alignment = block_size if align_to_block else 1
        budget = workspace_size
        if dcp_world_size > 1:
            alignment = math.lcm(alignment, dcp_world_size * interleave)
            budget = workspace_size // dcp_world_size
        max_span = workspace_size // alignment * alignment
        if max_span <= 0:
            raise ValueError(f"workspace of {workspace_size} rows is below one alignment unit ({alignment} rows)")
        return cls(budget, alignment, max_span, dcp_world_size, interleave)

    @property
    def sharded(self) -> bool:
        return self.dcp_world_size > 1

    def padded(self, rows: int) -> int:
        """Rows one rank holds of the first ``rows`` context rows (identity without DCP)."""
        if not self.sharded:
            return rows
        stride = self.interleave * self.dcp_world_size
        return -(-rows // stride) * self.interleave

    def cost(self, start: int, length: int) -> int:
        return self.padded(start + length) - self.padded(start)


@dataclass(frozen=True)
class PlannedChunk:
    """A chunk in request space: requests ``[first, first + len(spans))``, each
    contributing the span ``(start, length)`` at the same position."""

    first: int
    spans: tuple[tuple[int, int], ...]

    @property
    def end(self) -> int:
        return self.first + len(self.spans)


def fits_whole(geometry: Geometry, used: int, need: int) -> bool:
    """A span that costs ``need`` joins a chunk that holds ``used`` rows whole:
    the budget is a limit the chunk may reach exactly."""
    return used + need <= geometry.budget


def _largest_split(geometry: Geometry, start: int, remaining: int, free_rows: int) -> int:
    """Longest aligned prefix of a request's remaining context that fits ``free_rows``.

    The prefix is a multiple of the alignment, at most ``max_span``, strictly
    shorter than ``remaining`` (a request that fits whole is never split), and
    its cost fits. Cost grows monotonically with length, so bisect on the number
    of alignment units.
    """
    unit = geometry.alignment
    longest = min(geometry.max_span, (remaining - 1) // unit * unit)
    lo, hi = 0, longest // unit
    while lo < hi:
        units = (lo + hi + 1) // 2
        if geometry.cost(start, units * unit) <= free_rows:
            lo = units
        else:
            hi = units - 1
    return lo * unit


def plan_chunks(context_lens: list[int], geometry: Geometry) -> list[PlannedChunk]:
    """Pack the requests, in order, into chunks.

    A request without context is in no chunk and ends the current run. A request
    that does not fit is cut at :func:`_largest_split`; the rest continues at the
    head of the next chunk.
    """
    chunks: list[PlannedChunk] = []
    request, offset = 0, 0
    n = len(context_lens)
    while request < n:
        if context_lens[request] == 0:
            request += 1
            continue
        first = request
        spans: list[tuple[int, int]] = []
        used = 0
        while request < n and context_lens[request] > 0:
            remaining = context_lens[request] - offset
            need = geometry.cost(offset, remaining)
            if fits_whole(geometry, used, need):
                spans.append((offset, remaining))
                used += need
                request, offset = request + 1, 0
                continue
            cut = _largest_split(geometry, offset, remaining, geometry.budget - used)
            if cut > 0:
                spans.append((offset, cut))
                offset += cut
            break
        if not spans:
            raise AssertionError(f"planner made no progress at request {request} offset {offset}")
        chunks.append(PlannedChunk(first, tuple(spans)))
    return chunks
