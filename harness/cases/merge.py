"""Seeded generator of merge (L2) cases.

Determinism as in :mod:`harness.cases.generate`: case ``k`` is drawn from
``random.Random(f"{seed}:merge:{k}")``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from harness.model import MERGE_LSE_VIEWS, MERGE_PATTERNS, MERGE_VALUE_VIEWS, NUMERIC_DTYPES, MergeCase

MERGE_HEAD_SIZES = (128, 512, 576, 96)

# How many of a case's tokens are merged (prefill_tokens_with_context), drawn
# in these proportions: None (all, the final merge's call), the token count
# itself, none of them (0: every token copied from the suffix), and a count in
# between (0 for a single token).
TOKENS_WITH_CONTEXT = ("none", "none", "all", "zero", "between", "between")


def _tokens_with_context(rng: random.Random, num_tokens: int) -> int | None:
    share = rng.choice(TOKENS_WITH_CONTEXT)
    if share == "none":
        return None
    if share == "all":
        return num_tokens
    if share == "zero" or num_tokens == 1:
        return 0
    return rng.randint(1, num_tokens - 1)


def generate_merge(seed: int, count: int) -> Iterator[MergeCase]:
    """L2 cases: patterns, dtypes and head sizes dealt so that every combination
    recurs (every ``12 * len(MERGE_PATTERNS)`` cases); LSE and value views and
    ``prefill_tokens_with_context`` drawn per case. A case with a strided LSE
    view has at least 2 heads, so that its head stride is read."""
    for index in range(count):
        rng = random.Random(f"{seed}:merge:{index}")
        pattern = MERGE_PATTERNS[index % len(MERGE_PATTERNS)]
        dtype = NUMERIC_DTYPES[(index // len(MERGE_PATTERNS)) % len(NUMERIC_DTYPES)]
        head_size = MERGE_HEAD_SIZES[(index // (len(MERGE_PATTERNS) * len(NUMERIC_DTYPES))) % len(MERGE_HEAD_SIZES)]
        lse_view = rng.choice(MERGE_LSE_VIEWS)
        value_view = rng.choice(MERGE_VALUE_VIEWS)
        num_tokens = rng.randint(1, 6)
        num_heads = rng.randint(1 if lse_view == MERGE_LSE_VIEWS[0] else 2, 3)
        yield MergeCase(
            name=f"merge-{pattern}-{index:04d}",
            family=f"merge-{pattern}",
            num_tokens=num_tokens,
            num_heads=num_heads,
            head_size=head_size,
            dtype=dtype,
            pattern=pattern,
            seed=rng.randrange(1 << 31),
            prefill_tokens_with_context=_tokens_with_context(rng, num_tokens),
            lse_view=lse_view,
            value_view=value_view,
        )
