"""The draws behind every generated tensor and index: bits that are a function of
(case seed, tensor name, position in the stream) alone, the same on any CPU,
capability, thread count, and torch or numpy version.

The stream, written out so that another implementation reproduces it:

- **Key**: the first 16 bytes of SHA-256 of the UTF-8 text ``"{seed}:{name}"``,
  read as two little-endian unsigned 64-bit words ``(k0, k1)``.
- **Words**: Philox4x64-10 (Salmon, Moraes, Dror and Shaw, "Parallel random
  numbers: as easy as 1, 2, 3", SC 2011; Random123's ``philox4x64`` with ten
  rounds) under that key, on the counters ``(1, 0, 0, 0)``, ``(2, 0, 0, 0)``, ...:
  each counter gives four 64-bit words, in order. A stream is read in order;
  each draw takes the next words. ``numpy.random.Philox(key=[k0, k1]).random_raw``
  computes exactly these (integer arithmetic in C, no vector dispatch);
  tests/test_draws.py holds it to a pure-Python Philox and to Random123's
  known answer.
- **Transforms**, integer arithmetic then at most one exact conversion, so no
  value depends on how a machine rounds (no library transcendental anywhere):

  - ``uniform``, on [0, 1): a word's top 53 bits times 2^-53 (one word each);
  - ``integers``, on [low, high) with ``n = high - low`` below 2^32:
    ``low + (h * n >> 32)``, ``h`` a word's top 32 bits (one word each;
    Lemire's multiply-shift, biased by less than n / 2^32);
  - ``normal``, approximately standard: Irwin-Hall of twelve 32-bit halves
    (six words each: the sum of their high and low halves, minus 6 * 2^32,
    times 2^-32; exact in float64, variance 1, mean -6 * 2^-32, within [-6, 6]);
  - ``permutation`` of ``n``: the stable argsort of ``n`` words;
    ``argsort_rows(rows, length)``: the stable argsort of each row of
    ``rows * length`` words.

A draw of a shape fills it in row-major (C) order: value ``i`` of the flat
array takes the ``i``-th word (six words from ``6 i`` for normals). Floats come
out as float64; :func:`rounded` takes them to a narrower dtype in two IEEE
round-to-nearest-even steps, float64 to float32 (numpy), then float32 to bf16
or fp16 (torch), which every CPU does alike.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

# Irwin-Hall terms per normal: twelve uniform halves have variance exactly 1.
NORMAL_TERMS = 12
_TOP_32 = np.uint64(32)
_LOW_32 = np.uint64(0xFFFF_FFFF)


def stream_key(seed: int, name: str) -> tuple[int, int]:
    """The Philox key of the stream named ``name`` of the case seeded ``seed``."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little")


class Draws:
    """One named stream of one case (module docstring), read in order: each
    method takes the next words it needs and leaves the stream after them."""

    def __init__(self, seed: int, name: str) -> None:
        self.seed, self.name = seed, name
        self._bits = np.random.Philox(key=np.array(stream_key(seed, name), dtype=np.uint64))

    def words(self, count: int) -> np.ndarray:
        """The next ``count`` 64-bit words (uint64)."""
        words: np.ndarray = self._bits.random_raw(count)
        return words

    def uniform(self, shape: tuple[int, ...]) -> np.ndarray:
        """float64 on [0, 1), 53 bits each."""
        return np.ldexp((self.words(math.prod(shape)) >> np.uint64(11)).astype(np.float64), -53).reshape(shape)

    def integers(self, low: int, high: int, shape: tuple[int, ...]) -> np.ndarray:
        """int64 on [low, high)."""
        span = high - low
        if not 0 < span < 1 << 32:
            raise ValueError(f"integers on [{low}, {high}): the span must be in 1 .. 2^32 - 1")
        top = self.words(math.prod(shape)) >> _TOP_32
        return (low + ((top * np.uint64(span)) >> _TOP_32).astype(np.int64)).reshape(shape)

    def normal(self, shape: tuple[int, ...]) -> np.ndarray:
        """float64, approximately standard normal (Irwin-Hall, twelve halves)."""
        words = self.words(math.prod(shape) * NORMAL_TERMS // 2).reshape(-1, NORMAL_TERMS // 2)
        # At most 12 * (2^32 - 1) < 2^36: the sums are exact in int64, and so is
        # the float64 of each centred sum, and its product with a power of two.
        halves = (words >> _TOP_32) + (words & _LOW_32)
        centred = halves.sum(axis=1, dtype=np.uint64).astype(np.int64) - NORMAL_TERMS // 2 * (1 << 32)
        normals: np.ndarray = np.ldexp(centred.astype(np.float64), -32)
        return normals.reshape(shape)

    def permutation(self, n: int) -> np.ndarray:
        """A permutation of ``range(n)`` (int64): the stable argsort of ``n`` words."""
        return np.argsort(self.words(n), kind="stable").astype(np.int64)

    def argsort_rows(self, rows: int, length: int) -> np.ndarray:
        """Per row, a permutation of ``range(length)`` ([rows, length] int64):
        the stable argsort of each row of ``rows * length`` words."""
        return np.argsort(self.words(rows * length).reshape(rows, length), axis=1, kind="stable").astype(np.int64)


# -- as torch tensors: one named stream of one case each ---------------------------------------


def normal(shape: tuple[int, ...], seed: int, name: str) -> torch.Tensor:
    """Approximately standard normals (float64) of the case's stream ``name``."""
    return torch.from_numpy(Draws(seed, name).normal(shape))


def uniform(shape: tuple[int, ...], seed: int, name: str) -> torch.Tensor:
    """Uniform on [0, 1) (float64) of the case's stream ``name``."""
    return torch.from_numpy(Draws(seed, name).uniform(shape))


def integers(low: int, high: int, shape: tuple[int, ...], seed: int, name: str) -> torch.Tensor:
    """Integers on [low, high) (int64) of the case's stream ``name``."""
    return torch.from_numpy(Draws(seed, name).integers(low, high, shape))


def permutation(n: int, seed: int, name: str) -> torch.Tensor:
    """A permutation of ``range(n)`` (int64) of the case's stream ``name``."""
    return torch.from_numpy(Draws(seed, name).permutation(n))


def rounded(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``values`` in ``dtype``: to float32 in numpy, then (bf16, fp16) in
    torch: two IEEE round-to-nearest-even steps (not one straight to bf16, which
    differs on a few values), each of which every CPU does alike."""
    return torch.from_numpy(values.numpy().astype(np.float32)).to(dtype)
