"""The dense planner's decisions (SPEC 1b), declared for MC/DC (:mod:`harness.search.mcdc`).

Upstream's planner walks the requests and, at every request with context it
visits, decides (``plan_mla_context_chunks``):

- ``dense.take_whole``: the request's remaining rows fit the rows still free;
- ``dense.split``: a request that does not fit is cut (the chunk takes a
  piece) when one alignment unit fits the free rows and the request is longer
  than one unit; otherwise the chunk closes without it;
- ``dense.cut_by_free_rows``: the cut is bounded by the free rows, not by
  the request's remainder or the longest span;
- ``dense.cut_aligned``: a cut bounded by free rows that are not a multiple of
  the alignment leaves rows unused (the cut is rounded down), without DCP;
- ``dense.continuation``: a chunk starts mid-request exactly when the chunk
  before it cut that request;
- ``dense.dcp_rounding``: under DCP, ``padded(n) = ceil(n / (I*D)) * I`` rounds
  a span boundary ``n`` up unless it sits on the stride.

The visits are read back from the oracle's chunks: each chunk's spans are the
visits it took, and a chunk whose last span was whole, followed by a request
with context in the same run, visited that request and closed without it.
An observation's item is ``<case>@<chunk>/<request>``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from harness.model import Case, Chunk
from harness.search.mcdc import Condition, Decision, Observation

C = Condition

TAKE_WHOLE = Decision(
    "dense.take_whole",
    "dense",
    "a visited request's remaining context joins the chunk whole: used + cost(start, remaining) <= budget",
    "plan_mla_context_chunks",
    (C("fits", "used + cost(start, remaining) <= row budget", edge=1),),
    lambda v: v["fits"],
)

SPLIT = Decision(
    "dense.split",
    "dense",
    "a request that does not fit is cut (L > 0): one alignment unit fits the free rows and the "
    "request is longer than one unit",
    "plan_mla_context_chunks",
    (
        C("unit_fits", "cost(start, A) <= free rows", edge=1),
        C("longer_than_unit", "remaining - 1 >= A (an aligned prefix strictly shorter exists)", edge=1),
    ),
    lambda v: v["unit_fits"] and v["longer_than_unit"],
    {
        "longer_than_unit": "no input makes it matter: a request no longer than one unit whose unit fits the "
        "free rows fits whole (a span's cost grows with its length), so the split is never reached with "
        "unit_fits true and longer_than_unit false; upstream's remaining - 1 bound shows in dense.cut_by_free_rows"
    },
)

CUT_BY_FREE_ROWS = Decision(
    "dense.cut_by_free_rows",
    "dense",
    "the cut is shorter than min(max_context_chunk, remaining - 1 rounded down to A): the free rows bind",
    "plan_mla_context_chunks",
    (C("free_rows_bind", "cost(start, that bound) > free rows", edge=1),),
    lambda v: v["free_rows_bind"],
)

CUT_ALIGNED = Decision(
    "dense.cut_aligned",
    "dense",
    "a cut bounded by the free rows leaves rows free: the free rows are not a multiple of A (no DCP)",
    "plan_mla_context_chunks",
    (C("free_rows_unaligned", "free rows % A != 0", edge=1),),
    lambda v: v["free_rows_unaligned"],
)

CONTINUATION = Decision(
    "dense.continuation",
    "dense",
    "a chunk continues a request (its first start > 0) exactly when the chunk before cut it",
    "build_mla_chunked_context_metadata",
    (C("previous_cut", "the chunk before took a piece of this chunk's first request"),),
    lambda v: v["previous_cut"],
)

DCP_ROUNDING = Decision(
    "dense.dcp_rounding",
    "dense",
    "under DCP a span boundary n is held as padded(n) = ceil(n / (I*D)) * I: rounded up off the stride",
    "build_mla_chunked_context_metadata (DCP)",
    (C("off_stride", "n % (I*D) != 0", edge=1),),
    lambda v: v["off_stride"],
)

DENSE_DECISIONS: tuple[Decision, ...] = (TAKE_WHOLE, SPLIT, CUT_BY_FREE_ROWS, CUT_ALIGNED, CONTINUATION, DCP_ROUNDING)


@dataclass(frozen=True)
class _Geometry:
    budget: int
    alignment: int
    max_span: int
    world: int
    interleave: int

    @classmethod
    def of(cls, case: Case) -> _Geometry:
        alignment = case.block_size if case.align_to_block else 1
        budget = case.workspace_size
        if case.dcp_world_size > 1:
            alignment = math.lcm(alignment, case.dcp_world_size * case.cp_kv_cache_interleave_size)
            budget //= case.dcp_world_size
        return cls(
            budget,
            alignment,
            case.workspace_size // alignment * alignment,
            case.dcp_world_size,
            case.cp_kv_cache_interleave_size,
        )

    def padded(self, n: int) -> int:
        if self.world <= 1:
            return n
        return -(-n // (self.interleave * self.world)) * self.interleave

    def cost(self, start: int, length: int) -> int:
        return self.padded(start + length) - self.padded(start)


@dataclass(frozen=True)
class ChunkSpans:
    """What the observers read of an oracle chunk: its requests and spans, and
    under DCP its local starts and padded local lengths."""

    request_start: int
    request_end: int
    starts: tuple[int, ...]
    seq_lens: tuple[int, ...]
    full: Chunk | None = None


def _not_fitting(
    item: str, geometry: _Geometry, start: int, remaining: int, used: int, cut: int
) -> Iterator[tuple[Decision, Observation]]:
    """A visit whose request did not fit whole: the chunk cut it (``cut`` > 0) or closed."""
    free = geometry.budget - used
    need = geometry.cost(start, remaining)
    yield (
        TAKE_WHOLE,
        Observation(item, {"fits": used + need <= geometry.budget}, False, {"fits": used + need - geometry.budget}),
    )
    unit = geometry.alignment
    unit_cost = geometry.cost(start, unit)
    split = {"unit_fits": unit_cost <= free, "longer_than_unit": remaining - 1 >= unit}
    distances = {"unit_fits": unit_cost - free, "longer_than_unit": remaining - 1 - unit}
    yield SPLIT, Observation(item, dict(split), cut > 0, dict(distances))
    if cut <= 0:
        return
    bound = min(geometry.max_span, (remaining - 1) // unit * unit)
    bound_cost = geometry.cost(start, bound)
    yield (
        CUT_BY_FREE_ROWS,
        Observation(
            item, {"free_rows_bind": bound_cost > free}, cut < bound, {"free_rows_bind": bound_cost - free - 1}
        ),
    )
    if geometry.world <= 1 and bound_cost > free:
        yield (
            CUT_ALIGNED,
            Observation(
                item, {"free_rows_unaligned": free % unit != 0}, cut < free, {"free_rows_unaligned": free % unit}
            ),
        )


def observe_layout(name: str, case: Case, chunks: Sequence[ChunkSpans]) -> Iterator[tuple[Decision, Observation]]:
    """Every planner decision the oracle's ``chunks`` of ``case`` record."""
    geometry = _Geometry.of(case)
    contexts = case.context_lens
    # Where each request's next piece starts in its context: under DCP a chunk's
    # ``starts`` are the local ones (padded), so the global ones are summed here.
    offsets = [0] * len(contexts)
    previous_cut = False
    for j, chunk in enumerate(chunks):
        if j:
            yield CONTINUATION, Observation(f"{name}@{j}", {"previous_cut": previous_cut}, chunk.starts[0] > 0)
        used = 0
        previous_cut = False
        for k, request in enumerate(range(chunk.request_start, chunk.request_end)):
            item = f"{name}@{j}/{request}"
            start, length = offsets[request], chunk.seq_lens[k]
            offsets[request] += length
            remaining = contexts[request] - start
            need = geometry.cost(start, remaining)
            if length == remaining:
                yield (
                    TAKE_WHOLE,
                    Observation(
                        item, {"fits": used + need <= geometry.budget}, True, {"fits": used + need - geometry.budget}
                    ),
                )
                used += need
            else:
                yield from _not_fitting(item, geometry, start, remaining, used, length)
                previous_cut = True
            if chunk.full is not None and chunk.full.local_starts and chunk.full.padded_local_seq_lens:
                yield from _observe_rounding(item, geometry, chunk.full, k, start, length)
        after = chunk.request_end
        following = chunks[j + 1] if j + 1 < len(chunks) else None
        if (
            not previous_cut
            and after < len(contexts)
            and contexts[after] > 0
            and following is not None
            and following.request_start == after
            and following.starts[0] == 0
        ):
            # The chunk visited the next request of its run and closed without it.
            yield from _not_fitting(f"{name}@{j}/{after}", geometry, 0, contexts[after], used, 0)


def _observe_rounding(
    item: str, geometry: _Geometry, chunk: Chunk, k: int, start: int, length: int
) -> Iterator[tuple[Decision, Observation]]:
    assert chunk.local_starts is not None and chunk.padded_local_seq_lens is not None
    stride = geometry.interleave * geometry.world
    local_start = chunk.local_starts[k]
    local_end = local_start + chunk.padded_local_seq_lens[k]
    for point, held in ((start, local_start), (start + length, local_end)):
        yield (
            DCP_ROUNDING,
            Observation(
                f"{item}:n={point}",
                {"off_stride": point % stride != 0},
                held * geometry.world > point,
                {"off_stride": point % stride},
            ),
        )
