"""float32 exp and log for Triton's interpreter, the same bits on every machine.

Under ``TRITON_INTERPRET=1`` the interpreter evaluates ``tl.exp`` and ``tl.log``
with numpy's ``np.exp`` and ``np.log``, and numpy picks their float32 code by
the CPU it finds: its own SIMD approximations where the CPU has AVX512F, or
AVX2 with FMA3 (not correctly rounded: up to 2.52 ULP for exp, 3.83 for log),
the C library's ``expf``/``logf`` elsewhere (ARM, older x86, or
``NPY_DISABLE_CPU_FEATURES``). They differ on about a third of inputs, so every
merge weight, and with it the oracle's merged outputs and LSEs, depended on the
machine (measured on the smoke suite: 25 of its 73 float items changed with
numpy's SIMD turned off).

:func:`exp32` and :func:`log32` define them once: numpy's SIMD algorithm (the
one x86 machines already ran, so their bits are unchanged), written with
operations that IEEE 754 rounds exactly on every machine: float32 ``+ - * /``,
integer bit-field arithmetic, and a fused multiply-add (:func:`fma32`) emulated
exactly in float64 with round-to-odd. The C++ reference port runs the same
algorithm one lane at a time (ports/cpp/float32_math.h, with ``std::fma``).
:func:`define_interpreter_math` hands them to the interpreter for float32
operands; other dtypes keep numpy's functions (no shipped kernel takes exp or
log of another dtype), and so do ``tl.exp2``, ``tl.log2``, ``tl.sin`` and
``tl.cos``, which no kernel of the oracle or of this repository's ports calls.

Invariants a reader must keep:

- Every operation below is an IEEE 754 basic operation on float32 (rounded
  once, to nearest even), an exact integer operation on the bit pattern, or
  :func:`fma32`; no numpy transcendental is called, so nothing depends on the
  CPU's dispatch. tests/test_interpreted_math.py holds both functions against
  numpy's own SIMD path (where this CPU has it) and against the C++ port's.
- The constants and the order of operations are numpy's (BSD-3,
  numpy/_core/src/umath/loops_exponent_log.dispatch.c.src), as the C++ port's
  comment says; change one and the other together.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_F32 = np.float32
_QUIET_NAN = np.uint32(0x7FC00000)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` rounded once to float32, for float32 operands whose exact
    result is finite. The product of two float32 is exact in float64; the sum is
    rounded to odd at float64's 53 bits (TwoSum gives the error exactly), and a
    value rounded to odd with at least two bits to spare rounds to float32 as
    the exact value would."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = np.asarray(c, dtype=np.float64)
    s = p + c64
    back = s - p
    error = (p - (s - back)) + (c64 - back)
    even = (s.view(np.uint64) & np.uint64(1)) == 0
    toward = np.where(error > 0, np.inf, -np.inf)
    odd = np.where((error != 0) & even, np.nextafter(s, toward), s)
    return odd.astype(np.float32)


def _c(value: float) -> np.float32:
    return _F32(value)


def exp32(values: np.ndarray) -> np.ndarray:
    """exp(x) = P(r)/Q(r) * 2^k, r = x - k ln2 reduced in Cody-Waite steps,
    k = rint(x log2 e), as numpy's SIMD float32 exp computes it."""
    x = np.array(values, dtype=np.float32, copy=True).reshape(-1)
    is_nan = np.isnan(x)
    x[is_nan] = 0.0
    overflow = x >= _c(88.72283935546875)
    underflow = x <= _c(-103.97208404541015625)
    x[overflow | underflow] = 0.0
    with np.errstate(all="ignore"):
        magic = _c(float.fromhex("0x1.8p23"))  # adding and subtracting it rounds to an integer
        quadrant = (x * _c(1.442695040888963407359924681001892137)) + magic - magic
        r = fma32(quadrant, np.full_like(x, _c(-6.93145752e-1)), x)
        r = fma32(quadrant, np.full_like(x, _c(-1.42860677e-6)), r)
        r = fma32(quadrant, np.zeros_like(x), r)  # numpy's third step, by zero: it can turn -0 into +0
        num = np.full_like(x, _c(5.082762527590693718096e-04))
        for coefficient in (6.757896990527504603057e-03, 5.114512081637298353406e-02, 2.473615434895520810817e-01,
                            7.257664613233124478488e-01, 9.999999999980870924916e-01):  # fmt: skip
            num = fma32(num, r, np.full_like(x, _c(coefficient)))
        den = np.full_like(x, _c(2.159509375685829852307e-02))
        for coefficient in (-2.742335390411667452936e-01, 1.0):
            den = fma32(den, r, np.full_like(x, _c(coefficient)))
        poly = num / den
        # poly * 2^quadrant by adding to its exponent field; below the normal
        # range, scaled to 2^-125 that way and divided by the remaining power of 2.
        small = quadrant <= _c(-125.0)
        whole = quadrant.astype(np.int32)
        shift = np.rint(_c(0.0) - (quadrant - _c(-125.0))).astype(np.int64)
        power = np.where(shift > 31, 0, np.left_shift(np.int64(1), np.clip(shift, 0, 31))).astype(np.uint32)
        power = power.view(np.int32).astype(np.float32)  # 1 << 31 is INT32_MIN, as the C code's cast makes it
        big_bits = poly.view(np.uint32) + (whole.view(np.uint32) << np.uint32(23))
        small_bits = poly.view(np.uint32) + (np.uint32((-125) & 0xFFFFFFFF) << np.uint32(23))
        out = np.where(small, small_bits.view(np.float32) / np.where(small, power, _c(1.0)), big_bits.view(np.float32))
    out = out.astype(np.float32)
    out[is_nan] = _QUIET_NAN.view(np.float32)
    out[overflow] = np.inf
    out[underflow] = 0.0
    return out.reshape(np.shape(values))


def log32(values: np.ndarray) -> np.ndarray:
    """log(x) = log(m) + e ln2, m the mantissa in [sqrt(1/2), sqrt(2)),
    log(m) = P(m-1)/Q(m-1), as numpy's SIMD float32 log computes it."""
    source_values = np.array(values, dtype=np.float32, copy=True).reshape(-1)
    negative = source_values < 0
    zero = source_values == 0
    infinite = source_values == np.inf
    is_nan = np.isnan(source_values)
    x = np.where(negative, _c(0.0), source_values)
    with np.errstate(all="ignore"):
        tiny = np.finfo(np.float32).tiny
        denormal = x < tiny
        scaled = np.where(denormal, x, _c(0.0)) * np.uint32(0x71800000).view(np.float32)  # times 2^100
        source = np.where(denormal, scaled, x)
        bits = source.view(np.uint32)
        exponent = ((bits >> np.uint32(23)).astype(np.int32) - np.int32(0x7E)).astype(np.float32)
        exponent = np.where(denormal, exponent - _c(100.0), exponent)
        m = ((bits & np.uint32(0x7FFFFF)) | np.uint32(126 << 23)).view(np.float32)
        low = m <= _c(0.707106781186547524400844362104849039)
        m = np.where(low, m + m, m)
        exponent = np.where(low, exponent - _c(1.0), exponent)
        m = m - _c(1.0)
        num = np.full_like(m, _c(2.589979117907922693523e-02))
        for coefficient in (3.808837741388407920751e-01, 1.480000633576506585156e00, 2.112677543073053063722e00,
                            9.999999999999998702752e-01, 0.0):  # fmt: skip
            num = fma32(num, m, np.full_like(m, _c(coefficient)))
        den = np.full_like(m, _c(5.875095403124574342950e-03))
        for coefficient in (1.546476374983906719538e-01, 9.864942958519418960339e-01, 2.453006071784736363091e00,
                            2.612677543073109236779e00, 1.0):  # fmt: skip
            den = fma32(den, m, np.full_like(m, _c(coefficient)))
        poly = num / den
        out = fma32(exponent, np.full_like(m, _c(0.693147180559945309417232121458176568)), poly)
    out[is_nan] = _QUIET_NAN.view(np.float32)
    out[negative] = (_QUIET_NAN | np.uint32(0x80000000)).view(np.float32)
    out[zero] = -np.inf
    out[infinite] = np.inf
    return out.reshape(np.shape(values))


def _float32_or_numpy(ours: Any, numpys: Any) -> Any:
    def unary(data: Any) -> Any:
        if isinstance(data, np.ndarray) and data.dtype == np.float32:
            return ours(data)
        if isinstance(data, np.float32):
            return ours(np.asarray(data))[()]
        return numpys(data)

    return unary


EXP = _float32_or_numpy(exp32, np.exp)
LOG = _float32_or_numpy(log32, np.log)


def define_interpreter_math(interpreter: Any) -> bool:
    """Make ``interpreter``'s (``triton.runtime.interpreter``) ``tl.exp`` and
    ``tl.log`` of float32 :func:`exp32` and :func:`log32`; idempotent. False
    when the interpreter has no such builder methods (another Triton), which
    then keeps numpy's."""
    builder = getattr(interpreter, "InterpreterBuilder", None)
    if builder is None or not all(hasattr(builder, n) for n in ("create_exp", "create_log", "unary_op")):
        return False
    builder.create_exp = lambda self, arg: self.unary_op(arg, EXP)
    builder.create_log = lambda self, arg: self.unary_op(arg, LOG)
    return True
