"""Seeded generator of merge (L2) cases.

Determinism as in :mod:`harness.generate`: case ``k`` is drawn from
``random.Random(f"{seed}:merge:{k}")``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from harness.model import MERGE_PATTERNS, NUMERIC_DTYPES, MergeCase

MERGE_HEAD_SIZES = (128, 512, 576, 96)


def generate_merge(seed: int, count: int) -> Iterator[MergeCase]:
    """L2 cases: patterns, dtypes and head sizes dealt so that every combination
    recurs; a third of the cases merge only a prefix of their tokens."""
    for index in range(count):
        rng = random.Random(f"{seed}:merge:{index}")
        pattern = MERGE_PATTERNS[index % len(MERGE_PATTERNS)]
        dtype = NUMERIC_DTYPES[(index // len(MERGE_PATTERNS)) % len(NUMERIC_DTYPES)]
        head_size = MERGE_HEAD_SIZES[(index // (len(MERGE_PATTERNS) * len(NUMERIC_DTYPES))) % len(MERGE_HEAD_SIZES)]
        num_tokens = rng.randint(1, 6)
        with_context = rng.randrange(num_tokens) if rng.random() < 1 / 3 else None
        yield MergeCase(
            name=f"merge-{pattern}-{index:04d}",
            family=f"merge-{pattern}",
            num_tokens=num_tokens,
            num_heads=rng.randint(1, 3),
            head_size=head_size,
            dtype=dtype,
            pattern=pattern,
            seed=rng.randrange(1 << 31),
            prefill_tokens_with_context=with_context,
        )
