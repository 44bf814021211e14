"""The interpreter's float32 exp and log (harness/kernels/interpreted_math.py):
numpy's SIMD algorithm out of exactly rounded operations, so the same bits on
every machine. Held here against numpy's own SIMD path where this CPU takes it,
against exact arithmetic for the emulated fused multiply-add, and inside a
Triton kernel run by the interpreter. (The C++ port is held against the same
functions in tests/test_cpp_port_numerics.py; the smoke suite's outputs with
numpy's SIMD off in tests/test_output_digests.py.)"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from harness.kernels.interpreted_math import EXP, LOG, exp32, fma32, log32
from tests.test_cpp_port_numerics import bits, float_inputs, mismatches


def numpy_takes_its_simd_path() -> bool:
    from numpy._core._multiarray_umath import __cpu_features__ as features

    return bool(features.get("AVX512F") or (features.get("AVX2") and features.get("FMA3")))


@pytest.mark.skipif(not numpy_takes_its_simd_path(), reason="numpy's float32 exp/log are libm's on this CPU")
def test_exp_and_log_are_numpys_simd_ones_bit_for_bit() -> None:
    x = float_inputs()
    with np.errstate(all="ignore"):
        assert not mismatches(exp32(x), np.exp(x), x)
        assert not mismatches(log32(x), np.log(x), x)


def test_exp_and_log_keep_shape_and_scalars_and_leave_other_dtypes_to_numpy() -> None:
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    assert exp32(x).shape == x.shape and exp32(x).dtype == np.float32
    assert bits(EXP(np.float32(0.5))) == bits(exp32(np.array([0.5], np.float32)))[0]
    wide = np.linspace(0.1, 3, 5)
    assert np.array_equal(EXP(wide), np.exp(wide)) and np.array_equal(LOG(wide), np.log(wide))


def exact_fma32(a: np.float32, b: np.float32, c: np.float32) -> int:
    """The bits of a*b+c rounded once to float32 (to nearest, ties to even)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    low = np.float32(float(exact))  # within an ULP or so; then settle by exact comparison
    candidates = [np.nextafter(low, np.float32(-np.inf)), low, np.nextafter(low, np.float32(np.inf))]
    distances = [abs(Fraction(float(v)) - exact) for v in candidates]
    best = min(distances)
    ties = [v for v, d in zip(candidates, distances, strict=True) if d == best]
    chosen = ties[0] if len(ties) == 1 else next(v for v in ties if int(bits(np.array([v]))[0]) % 2 == 0)
    return int(bits(np.array([chosen], np.float32))[0])


def test_fma32_rounds_once_where_float64_would_round_twice() -> None:
    rng = np.random.default_rng(7)
    a = rng.uniform(-2, 2, 3000).astype(np.float32)
    b = rng.uniform(-2, 2, 3000).astype(np.float32)
    # c near -a*b: the sum cancels, and its rounding error decides the last bit.
    c = (-(a.astype(np.float64) * b.astype(np.float64)) * (1 + rng.uniform(-1e-7, 1e-7, 3000))).astype(np.float32)
    c[:1000] = rng.uniform(-2, 2, 1000).astype(np.float32)
    # A double-rounding trap: a*b+c exactly halfway between two float32 plus a tiny bit.
    a[0], b[0], c[0] = np.float32(1 + 2**-12), np.float32(1 + 2**-12), np.float32(2**-60)
    found = bits(fma32(a, b, c))
    expected = [exact_fma32(*t) for t in zip(a, b, c, strict=True)]
    assert found.tolist() == expected
    naive = bits((a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32))
    assert naive[0] != expected[0]  # rounding the float64 sum would have got it wrong


def test_they_are_the_same_bits_with_numpys_simd_off() -> None:
    """numpy's own dispatch reaches none of their operations: a child with its
    SIMD features off computes the same bits as this process."""
    import hashlib
    import os
    import subprocess
    import sys

    from tests.test_input_digests import NUMPY_SIMD

    code = (
        "import hashlib, numpy as np; from harness.kernels.interpreted_math import exp32, log32; "
        "from tests.test_cpp_port_numerics import float_inputs; x = float_inputs(); "
        "np.seterr(all='ignore'); print(hashlib.sha256(exp32(x).tobytes() + log32(x).tobytes()).hexdigest())"
    )
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": NUMPY_SIMD}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
    x = float_inputs()
    with np.errstate(all="ignore"):
        here = hashlib.sha256(exp32(x).tobytes() + log32(x).tobytes()).hexdigest()
    assert done.stdout.strip() == here, done.stderr[-2000:]


def test_the_interpreter_takes_them_for_tl_exp_and_tl_log(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import triton
    import triton.language as tl

    from harness.kernels import interpreted_math
    from harness.kernels.interpreter import math_defined, streamline_interpreter

    streamline_interpreter()
    assert math_defined()

    @triton.jit  # type: ignore[untyped-decorator]
    def exp_log(x_ptr, e_ptr, l_ptr, n: tl.constexpr):  # type: ignore[no-untyped-def]
        offsets = tl.arange(0, n)
        x = tl.load(x_ptr + offsets)
        tl.store(e_ptr + offsets, tl.exp(x))
        tl.store(l_ptr + offsets, tl.log(x))

    x = torch.from_numpy(np.random.default_rng(3).uniform(-30, 30, 1024).astype(np.float32))
    e, lg = torch.empty_like(x), torch.empty_like(x)
    exp_log[(1,)](x, e, lg, 1024)
    assert np.array_equal(bits(e.numpy()), bits(exp32(x.numpy())))
    with np.errstate(all="ignore"):
        assert np.array_equal(bits(lg.numpy()), bits(log32(x.numpy())))
    # On a CPU where numpy's exp is this one, equal bits alone would not show the
    # route: with the module's functions swapped, the kernel computes the swap's.
    monkeypatch.setattr(interpreted_math, "EXP", lambda data: np.full_like(data, 42.0))
    monkeypatch.setattr(interpreted_math, "LOG", lambda data: np.full_like(data, -42.0))
    exp_log[(1,)](x, e, lg, 1024)
    assert bool((e == 42.0).all()) and bool((lg == -42.0).all())
