// float32 exp and log exactly as the oracle computes them on a CPU.
//
// The oracle's merge kernel runs under Triton's interpreter, whose tl.exp and
// tl.log of float32 the harness defines (harness/kernels/interpreted_math.py) as
// numpy's SIMD float32 exp and log compute them: the same bits on every machine,
// where numpy's own np.exp/np.log would change with the CPU (its SIMD
// approximations with AVX2 and FMA3, or AVX512F; the C library's expf/logf
// elsewhere). They are not correctly rounded (up to 2.52 ULP for exp and 3.83
// ULP for log by numpy's own measure) and differ from libm's on about a third
// of inputs.
//
// `numpy_simd` below mirrors numpy's AVX2 float32 exp/log, BSD-3 (numpy's
// numpy/_core/src/umath/loops_exponent_log.dispatch.c.src, Copyright (c) 2005-2025,
// NumPy Developers): the same constants, the same operations in the same order,
// one lane at a time, with std::fma wherever numpy issues a fused multiply-add.
// numpy's AVX512F variant uses the same constants and polynomials; where it
// differs (getexp/getmant instead of integer bit fields for log's range reduction,
// scalef instead of an exponent add and a division for exp's denormal results)
// each replacement is exact or rounds once to nearest, as the AVX2 code does, so
// the two give identical bits. Measured over all 2^32 float32 inputs: this code
// equals numpy 2.5.2's exp and log on its AVX512 (X86_V4) and its AVX2 (X86_V3)
// paths; against numpy 2.3.5 on an AVX2-only CPU, 26 of the 256 blocks of 2^24
// bit patterns (every special class among them) and a million samples.
// std::fma is exact wherever the C++ library is conforming (in hardware or not),
// so this code gives the same bits on any CPU.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

// Every operation must round on its own, as numpy's do: no a*b+c fused behind
// our back when the build targets a CPU with FMA (-march=native, -mfma).
// std::fma stays fused where numpy fuses.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#if defined(__FAST_MATH__)
#error "bit-exact arithmetic needs IEEE semantics: do not build with -ffast-math"
#endif
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "float expressions must be evaluated in float (SSE), not in extended precision"
#endif

namespace port {

inline std::uint32_t float_bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

inline float bits_float(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

namespace numpy_simd {

// numpy's NPY_NANF (a positive quiet NaN), which its exp and log return for NaN input.
constexpr std::uint32_t kQuietNan = 0x7FC00000u;

// exp(x) = P(r)/Q(r) * 2^k, r = x - k ln2 reduced in Cody-Waite steps, k = rint(x log2 e).
inline float exp(float input) {
  const float xmax = 88.72283935546875f;
  const float xmin = -103.97208404541015625f;
  const float log2e = 1.442695040888963407359924681001892137F;
  const float cvt_magic = 0x1.800000p+23f;
  const float ln2_high = -6.93145752e-1f;
  const float ln2_low = -1.42860677e-6f;
  const float p0 = 9.999999999980870924916e-01f, p1 = 7.257664613233124478488e-01f,
              p2 = 2.473615434895520810817e-01f, p3 = 5.114512081637298353406e-02f,
              p4 = 6.757896990527504603057e-03f, p5 = 5.082762527590693718096e-04f;
  const float q0 = 1.000000000000000000000e+00f, q1 = -2.742335390411667452936e-01f,
              q2 = 2.159509375685829852307e-02f;

  const bool is_nan = input != input;
  float x = is_nan ? 0.0f : input;
  const bool overflow = x >= xmax;
  const bool underflow = x <= xmin;
  if (overflow || underflow) x = 0.0f;

  float quadrant = x * log2e;
  quadrant = quadrant + cvt_magic;  // round to nearest integer
  quadrant = quadrant - cvt_magic;

  float r = std::fma(quadrant, ln2_high, x);
  r = std::fma(quadrant, ln2_low, r);
  r = std::fma(quadrant, 0.0f, r);  // numpy's third reduction step, by zero; it can turn -0 into +0

  float num = std::fma(p5, r, p4);
  num = std::fma(num, r, p3);
  num = std::fma(num, r, p2);
  num = std::fma(num, r, p1);
  num = std::fma(num, r, p0);
  float den = std::fma(q2, r, q1);
  den = std::fma(den, r, q0);
  float poly = num / den;

  // poly * 2^quadrant: add quadrant to poly's exponent field; for results below
  // the normal range, scale to 2^-125 that way and divide by the remaining power of 2.
  // quadrant lies in [-150, 128] here, so these conversions are exact.
  if (quadrant <= -125.0f) {
    float diff = quadrant - (-125.0f);
    diff = 0.0f - diff;
    const int shift = static_cast<int>(std::nearbyint(diff));
    const std::int32_t power = shift > 31 ? 0 : static_cast<std::int32_t>(std::uint32_t{1} << shift);
    const std::uint32_t exponent = static_cast<std::uint32_t>(-125) << 23;
    poly = bits_float(float_bits(poly) + exponent);
    poly = poly / static_cast<float>(power);
  } else {
    const std::uint32_t exponent = static_cast<std::uint32_t>(static_cast<std::int32_t>(quadrant)) << 23;
    poly = bits_float(float_bits(poly) + exponent);
  }

  if (is_nan) poly = bits_float(kQuietNan);
  if (overflow) poly = std::numeric_limits<float>::infinity();
  if (underflow) poly = 0.0f;
  return poly;
}

// log(x) = log(m) + e ln2, m the mantissa in [sqrt(1/2), sqrt(2)), log(m) = P(m-1)/Q(m-1).
inline float log(float input) {
  const float p0 = 0.000000000000000000000e+00f, p1 = 9.999999999999998702752e-01f,
              p2 = 2.112677543073053063722e+00f, p3 = 1.480000633576506585156e+00f,
              p4 = 3.808837741388407920751e-01f, p5 = 2.589979117907922693523e-02f;
  const float q0 = 1.000000000000000000000e+00f, q1 = 2.612677543073109236779e+00f,
              q2 = 2.453006071784736363091e+00f, q3 = 9.864942958519418960339e-01f,
              q4 = 1.546476374983906719538e-01f, q5 = 5.875095403124574342950e-03f;
  const float ln2 = 0.693147180559945309417232121458176568F;
  const float sqrt_half = 0.707106781186547524400844362104849039F;
  const float two_power_100 = bits_float(0x71800000u);

  const bool negative = input < 0.0f;
  const bool zero = input == 0.0f;
  const bool infinite = input == std::numeric_limits<float>::infinity();
  const bool is_nan = input != input;
  float x = negative ? 0.0f : input;

  // Denormals are scaled by 2^100 first so that their exponent field is meaningful.
  const bool denormal = x < FLT_MIN;
  const bool normal = x >= FLT_MIN;
  const float scaled = (normal ? 0.0f : x) * two_power_100;
  const float source = denormal ? scaled : x;
  const std::uint32_t bits = float_bits(source);
  float exponent = static_cast<float>(static_cast<std::int32_t>(bits >> 23) - 0x7E);
  if (denormal) exponent = exponent - 100.0f;
  float m = bits_float((bits & 0x7FFFFFu) | (126u << 23));  // in [0.5, 1)

  if (m <= sqrt_half) {
    m = m + m;
    exponent = exponent - 1.0f;
  }
  m = m - 1.0f;

  float num = std::fma(p5, m, p4);
  num = std::fma(num, m, p3);
  num = std::fma(num, m, p2);
  num = std::fma(num, m, p1);
  num = std::fma(num, m, p0);
  float den = std::fma(q5, m, q4);
  den = std::fma(den, m, q3);
  den = std::fma(den, m, q2);
  den = std::fma(den, m, q1);
  den = std::fma(den, m, q0);
  float poly = num / den;
  poly = std::fma(exponent, ln2, poly);

  if (is_nan) poly = bits_float(kQuietNan);
  if (negative) poly = bits_float(kQuietNan | 0x80000000u);
  if (zero) poly = -std::numeric_limits<float>::infinity();
  if (infinite) poly = std::numeric_limits<float>::infinity();
  return poly;
}

}  // namespace numpy_simd

// Which exp/log this port uses: the harness's definition (numpy's SIMD
// algorithm) on every CPU. CPP_PORT_FLOAT32_MATH=libm swaps in the C library's
// expf/logf, for measuring what that would break.
enum class Float32Math { NumpySimd, Libm };

inline Float32Math detect_float32_math() {
  const char* forced = std::getenv("CPP_PORT_FLOAT32_MATH");
  return forced != nullptr && std::string(forced) == "libm" ? Float32Math::Libm : Float32Math::NumpySimd;
}

inline Float32Math float32_math() {
  static const Float32Math chosen = detect_float32_math();
  return chosen;
}

inline const char* float32_math_name(Float32Math m) { return m == Float32Math::NumpySimd ? "numpy-simd" : "libm"; }

inline float oracle_exp(float x) {
  return float32_math() == Float32Math::NumpySimd ? numpy_simd::exp(x) : std::exp(x);
}

inline float oracle_log(float x) {
  return float32_math() == Float32Math::NumpySimd ? numpy_simd::log(x) : std::log(x);
}

}  // namespace port
