"""First-divergence reporting."""

from __future__ import annotations

from dataclasses import replace

from harness.compare.dense import Divergence, describe, first_layout_divergence
from harness.model import Layout
from ports.per_request import PORT
from tests.conftest import make_case


def layout() -> Layout:
    return PORT.plan_layout(make_case([3000, 0, 40, 5000], workspace_size=1024))


def test_identical_layouts_have_no_divergence() -> None:
    assert first_layout_divergence(layout(), layout()) is None


def test_names_first_chunk_and_field() -> None:
    good = layout()
    chunks = list(good.chunks)
    chunks[2] = replace(chunks[2], seq_lens=(chunks[2].seq_lens[0] + 1, *chunks[2].seq_lens[1:]))
    chunks[3] = replace(chunks[3], starts=(7,))
    divergence = first_layout_divergence(good, Layout(tuple(chunks), good.empty_token_slices))
    assert divergence == Divergence("seq_lens", good.chunks[2].seq_lens, chunks[2].seq_lens, chunk=2)
    assert divergence.message().startswith("chunk 2, field seq_lens: oracle ")


def test_missing_chunks_and_empty_slices() -> None:
    good = layout()
    fewer = Layout(good.chunks[:-1], good.empty_token_slices)
    assert first_layout_divergence(good, fewer) == Divergence("num_chunks", good.num_chunks, good.num_chunks - 1)
    no_empty = Layout(good.chunks, ())
    divergence = first_layout_divergence(good, no_empty)
    assert divergence is not None and divergence.field == "empty_token_slices" and divergence.chunk is None


def test_long_values_are_cut_around_the_difference() -> None:
    a = tuple(range(1000))
    b = (*a[:500], -1, *a[501:])
    text = describe(a, b)
    assert "498, 499, 500" in text and "first difference at [500]" in text and "len 1000" in text
    assert len(text) < 200
