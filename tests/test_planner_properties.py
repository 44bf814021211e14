"""Property tests: SPEC section 1b's invariants on the per_request port, and
differential parity with the oracle on hypothesis-generated cases (which shrink
to a minimal batch when they fail)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.compare.dense import first_layout_divergence
from harness.model import Case
from harness.protocol.port import Port
from ports.per_request import PORT


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(1, 12))
    block = draw(st.sampled_from([1, 4, 16, 64]))
    world = draw(st.sampled_from([1, 1, 2, 4]))
    interleave = draw(st.sampled_from([1, 2, 16])) if world > 1 else 1
    align = draw(st.booleans())
    unit = Case("u", (0,), (1,), block, 1, world, interleave, align).alignment
    workspace = draw(st.integers(unit, unit * 8 + 7))
    contexts = draw(st.lists(st.integers(0, 6 * workspace), min_size=n, max_size=n))
    queries = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    return Case("h", tuple(contexts), tuple(queries), block, workspace, world, interleave, align)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_invariants(case: Case) -> None:
    layout = PORT.plan_layout(case)
    gathered: dict[int, list[tuple[int, int]]] = {}
    previous_end = 0
    for chunk in layout.chunks:
        assert chunk.request_start >= previous_end - 1  # chunks come in request order
        previous_end = chunk.request_end
        rows = (
            chunk.num_local_context_tokens if chunk.num_local_context_tokens is not None else chunk.num_context_tokens
        )
        assert 0 < rows <= case.row_budget
        for local, request in enumerate(range(chunk.request_start, chunk.request_end)):
            assert case.context_lens[request] > 0  # no chunk covers a zero-context request
            length = chunk.seq_lens[local]
            start = chunk.starts[local] if chunk.local_starts is None else None
            if local > 0:
                assert start in (0, None)  # only the first request can be a continuation
            gathered.setdefault(request, []).append((start if start is not None else -1, length))
    for request, context in enumerate(case.context_lens):
        spans = gathered.get(request, [])
        assert sum(length for _, length in spans) == context  # every row exactly once
        offset = 0
        for start, length in spans:
            assert start in (offset, -1)  # in order, no gaps or overlaps
            offset += length


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_differential_parity(oracle: Port, case: Case) -> None:
    assert first_layout_divergence(oracle.plan_layout(case), PORT.plan_layout(case)) is None
