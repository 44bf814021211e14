"""per_request's masked-MHA threshold (``ports/per_request/sparse.py``:
``masked_threshold``) against the pinned release's ``_use_masked_mha``, called
as ``oracle/sparse.py`` calls it, on every sparse backend, tensor-parallel sizes
1 to 8 and 16, every sequence-length ceiling and every table minimum one
below, at and one above (both tables' values), and the extremes."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from harness.model.sparse import SPARSE_BACKENDS
from ports.per_request.sparse import MASKED_MHA_MIN_QUERY, SEQ_LEN_BUCKETS, masked_threshold


@pytest.fixture(scope="module")
def mla() -> Any:
    from oracle.environment import prepare_cpu_environment

    prepare_cpu_environment()
    from oracle.side import OracleSide

    return OracleSide()._sparse().mla


def _around(values: set[int]) -> list[int]:
    return sorted({v + d for v in values for d in (-1, 0, 1)})


def test_threshold_is_upstreams_everywhere_it_can_change(mla: Any) -> None:
    upstream_edges = set(mla._DSV32_SEQ_LEN_BUCKETS)
    upstream_minimums = {
        m for per_tp in mla._DSV32_MASKED_MHA_THRESHOLDS.values() for row in per_tp.values() for m in row if m
    }
    seq_lens = [*_around(upstream_edges | set(SEQ_LEN_BUCKETS) | {0, 1}), 1 << 40]
    query_lens = [*_around(upstream_minimums | {row.least_query_len for row in MASKED_MHA_MIN_QUERY} | {0, 1}), 1 << 40]
    sizes = [*range(1, 9), 16]
    checked, masked = 0, 0
    for backend, tp, seq, query in itertools.product(SPARSE_BACKENDS, sizes, seq_lens, query_lens):
        theirs = bool(mla._use_masked_mha(backend_name=backend, tensor_parallel_size=tp, query_len=query, seq_len=seq))
        assert masked_threshold(backend, tp, query, seq) is theirs, (backend, tp, query, seq)
        checked += 1
        masked += theirs
    # Both verdicts are taken many times over: the sweep reaches every row.
    assert checked > 20000 and 100 < masked < checked - 100


def test_every_row_is_on_a_ceiling() -> None:
    assert list(SEQ_LEN_BUCKETS) == sorted(set(SEQ_LEN_BUCKETS))
    assert all(row.longest_seq_len in SEQ_LEN_BUCKETS for row in MASKED_MHA_MIN_QUERY)
    keys = [(row.backend, row.tensor_parallel_size, row.longest_seq_len) for row in MASKED_MHA_MIN_QUERY]
    assert len(keys) == len(set(keys))
    assert {row.backend for row in MASKED_MHA_MIN_QUERY} <= set(SPARSE_BACKENDS)
