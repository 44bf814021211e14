// Conversions between fp32 and the 16-bit float types, exactly as the oracle's
// kernel performs them under Triton's interpreter on a CPU:
//
// * bf16 <-> fp32 go through the interpreter's own bit-level converter
//   (`_convert_float` in triton/runtime/interpreter.py, rounding mode None). A
//   downcast TRUNCATES the mantissa (no rounding), and a subnormal input is first
//   "normalised" into a mantissa whose exponent is then clamped to zero, so a
//   subnormal keeps the wrong bits (fp32 0x00600000 -> bf16 0x0040, bf16 0x0001 ->
//   fp32 +0). NaN and infinity keep an all-ones exponent, so a NaN whose payload
//   lies in the low 16 bits becomes infinity.
// * fp16 <-> fp32 are numpy's astype: round to nearest even (with subnormals),
//   overflow to infinity, a NaN keeps the top of its payload and stays a NaN.
#pragma once

#include <cstdint>

namespace port {

// Index of the highest set bit of a non-zero value.
inline int highest_bit(std::uint32_t v) { return 31 - __builtin_clz(v); }

// The interpreter's fp32 -> bf16 (truncating, with its subnormal handling).
inline std::uint16_t interpreter_fp32_to_bf16(std::uint32_t f) {
  const std::uint32_t sign = f >> 31;
  const std::uint32_t exponent = (f >> 23) & 0xFFu;
  std::uint32_t significand = f & 0x7FFFFFu;
  if (exponent == 0 && significand != 0) {
    // Shift the leading one out of the 23-bit field; the exponent it would need
    // (below 1) clamps to the subnormal field value 0.
    const int shift = 23 - highest_bit(significand);
    significand = (significand << shift) & 0x7FFFFFu;
  }
  return static_cast<std::uint16_t>((sign << 15) | (exponent << 7) | ((significand >> 16) & 0x7Fu));
}

// The interpreter's bf16 -> fp32 (exact for normal numbers, zeros, inf and NaN).
inline std::uint32_t interpreter_bf16_to_fp32(std::uint16_t h) {
  const std::uint32_t sign = h >> 15;
  const std::uint32_t exponent = (h >> 7) & 0xFFu;
  std::uint32_t significand = h & 0x7Fu;
  if (exponent == 0 && significand != 0) {
    const int shift = 7 - highest_bit(significand);
    significand = (significand << shift) & 0x7Fu;
  }
  return (sign << 31) | (exponent << 23) | (significand << 16);
}

// numpy's float32 -> float16 astype: IEEE round to nearest even.
inline std::uint16_t numpy_fp32_to_fp16(std::uint32_t f) {
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const std::uint32_t magnitude = f & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    // NaN: keep the payload's top 10 bits, and at least one of them set.
    std::uint32_t payload = (magnitude & 0x7FFFFFu) >> 13;
    if (payload == 0) payload = 1;
    return static_cast<std::uint16_t>(sign | 0x7C00u | payload);
  }
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (magnitude >= 0x38800000u) {
    // Normal in fp16: rebias the exponent, round the 13 dropped bits to nearest even;
    // a carry out of the mantissa correctly bumps the exponent.
    const std::uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded >> 13) - (112u << 10)));
  }
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent == 0) return static_cast<std::uint16_t>(sign);  // fp32 subnormals are far below fp16's
  // Subnormal in fp16: the value in units of 2^-24, rounded to nearest even.
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - exponent;  // >= 14 here
  if (shift > 24) return static_cast<std::uint16_t>(sign);  // below half of 2^-24
  std::uint32_t units = significand >> shift;
  const std::uint32_t rest = significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (units & 1u))) ++units;
  return static_cast<std::uint16_t>(sign | units);
}

// numpy's float16 -> float32 astype (exact).
inline std::uint32_t numpy_fp16_to_fp32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t significand = h & 0x3FFu;
  if (exponent == 0x1Fu) return sign | 0x7F800000u | (significand << 13);
  if (exponent != 0) return sign | ((exponent + 112u) << 23) | (significand << 13);
  if (significand == 0) return sign;
  // Subnormal: normalise.
  const int shift = 10 - highest_bit(significand);
  significand = (significand << shift) & 0x3FFu;
  return sign | (static_cast<std::uint32_t>(113 - shift) << 23) | (significand << 13);
}

}  // namespace port
