"""The input stream (harness/kernels/draws.py) is what its docstring says, bit
for bit: Philox4x64-10 under the SHA-256 key, and each transform's integer
arithmetic, recomputed here in plain Python from the words."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from harness.kernels.draws import NORMAL_TERMS, Draws, stream_key

MASK = (1 << 64) - 1
# Philox4x64's round multipliers and key increments (Salmon et al. 2011).
MULTIPLIERS = (0xD2E7470EE14C6C93, 0xCA5A826395121157)
WEYL = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)


def philox_block(counter: tuple[int, int, int, int], key: tuple[int, int]) -> list[int]:
    """Philox4x64-10 of one counter, written from the paper's definition."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(10):
        if round_index:
            k0, k1 = (k0 + WEYL[0]) & MASK, (k1 + WEYL[1]) & MASK
        p0, p1 = MULTIPLIERS[0] * c0, MULTIPLIERS[1] * c2
        c0, c1, c2, c3 = (p1 >> 64) ^ c1 ^ k0, p1 & MASK, (p0 >> 64) ^ c3 ^ k1, p0 & MASK
    return [c0, c1, c2, c3]


def reference_words(key: tuple[int, int], count: int) -> list[int]:
    """The stream's first ``count`` words: counters 1, 2, ... in order."""
    words: list[int] = []
    counter = 0
    while len(words) < count:
        counter += 1
        words += philox_block((counter, 0, 0, 0), key)
    return words[:count]


def test_the_philox_of_the_reference_is_random123s_known_answer() -> None:
    # Random123's kat_vectors: philox4x64 10 rounds, counter 0 and key 0.
    expected = [0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B, 0x7E68B68AEC7BA23B]
    assert philox_block((0, 0, 0, 0), (0, 0)) == expected


@pytest.mark.parametrize(("seed", "name"), [(0, "q"), (29, "kv-cache"), (2**40 + 7, "dcp-block-order-rank3")])
def test_words_are_philox_under_the_named_key(seed: int, name: str) -> None:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    key = (int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little"))
    assert stream_key(seed, name) == key
    draws = Draws(seed, name)
    # Read in pieces that cut the four-word blocks anywhere: the stream goes on where it stopped.
    got = [int(w) for count in (3, 1, 6, 9) for w in draws.words(count)]
    assert got == reference_words(key, 19)


def test_each_transform_is_its_integer_arithmetic() -> None:
    seed, name = 5, "transforms"
    words = iter(reference_words(stream_key(seed, name), 64 + 2 * NORMAL_TERMS))
    draws = Draws(seed, name)
    assert draws.uniform((2, 2)).tolist() == [[(next(words) >> 11) / 2**53 for _ in range(2)] for _ in range(2)]
    assert draws.integers(-3, 1000, (5,)).tolist() == [-3 + ((next(words) >> 32) * 1003 >> 32) for _ in range(5)]
    expected_normals = []
    for _ in range(2):
        halves = [
            half
            for word in (next(words) for _ in range(NORMAL_TERMS // 2))
            for half in (word >> 32, word & 0xFFFF_FFFF)
        ]
        expected_normals.append((sum(halves) - NORMAL_TERMS // 2 * 2**32) / 2**32)
    assert draws.normal((2,)).tolist() == expected_normals
    order_words = [next(words) for _ in range(7)]
    assert draws.permutation(7).tolist() == sorted(range(7), key=lambda i: (order_words[i], i))


def test_the_transforms_stay_in_range_and_look_like_their_distributions() -> None:
    draws = Draws(1, "shape")
    uniform = draws.uniform((100_000,))
    assert 0.0 <= uniform.min() and uniform.max() < 1.0 and abs(uniform.mean() - 0.5) < 0.01
    normal = draws.normal((100_000,))
    assert abs(normal.mean()) < 0.02 and abs(normal.std() - 1.0) < 0.02 and np.abs(normal).max() <= 6.0
    integers = draws.integers(0, 7, (100_000,))
    assert set(np.unique(integers).tolist()) == set(range(7))
    assert sorted(draws.permutation(1000).tolist()) == list(range(1000))
    rows = draws.argsort_rows(3, 50)
    assert all(sorted(row) == list(range(50)) for row in rows.tolist())


def test_a_span_outside_32_bits_is_refused() -> None:
    with pytest.raises(ValueError, match="span"):
        Draws(0, "x").integers(0, 1 << 32, (1,))
    with pytest.raises(ValueError, match="span"):
        Draws(0, "x").integers(3, 3, (1,))
