// The weight fold of Hopper's fp8 fast mode (issue 29): the four MXFP8
// blocks (32 K each) of a 128-K group under one e8m0 scale, the largest of
// their four, so that an fp8 MMA over 128 K and one f32 multiply per group
// replace the four block scales. A block of exponent e below the group's E
// has its e4m3 values multiplied by 2^(e - E) and rounded to e4m3 (RN-even):
// exact while the result stays a normal e4m3 (>= 2^-6) or lands on the
// subnormal grid (2^-9); smaller values lose bits, and below 2^-10 become ±0.
// Host + device, shared by the golden model and (later) the prepare kernel.
#pragma once

#include <stdint.h>

#include "common/numerics.h"

namespace m3qkv::fold {

constexpr int kGroupK = 128;  // K per folded scale
constexpr int kBlocksPerGroup = kGroupK / 32;
// A shift of this many binades or more takes every e4m3 (|v| <= 448 < 2^9)
// below 2^-10, half the smallest subnormal: the value rounds to ±0.
constexpr int kZeroShift = 20;

// The group's scale: the largest of its blocks' e8m0 bytes; NaN (0xFF) if any is.
M3_HD uint8_t group_exponent(uint8_t e0, uint8_t e1, uint8_t e2, uint8_t e3) {
  if (e0 == 0xffu || e1 == 0xffu || e2 == 0xffu || e3 == 0xffu) return 0xffu;
  uint8_t m = e0 > e1 ? e0 : e1;
  m = m > e2 ? m : e2;
  return m > e3 ? m : e3;
}

// One e4m3 of a block `shift` = E - e >= 0 binades below its group's scale.
// NaN codes (0x7F, 0xFF) stay as they are; the sign of a zero is kept.
M3_HD uint8_t shift_e4m3(uint8_t b, int shift) {
  if ((b & 0x7fu) == 0x7fu || shift <= 0) return b;
  if (shift >= kZeroShift) return static_cast<uint8_t>(b & 0x80u);
  return f32_to_e4m3_satfinite_rn_soft(mul_rn(e4m3_to_f32(b), exp2i_f32(-shift)));
}

}  // namespace m3qkv::fold
