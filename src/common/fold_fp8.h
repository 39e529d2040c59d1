// The weight fold of Hopper's fp8 fast mode (issue 29): the four MXFP8
// blocks (32 K each) of a 128-K group under one e8m0 scale, the largest of
// their four, so that an fp8 MMA over 128 K and one f32 multiply per group
// replace the four block scales. A block of exponent e below the group's E
// has its e4m3 values multiplied by 2^(e - E) and rounded to e4m3 (RN-even):
// exact while the result stays a normal e4m3 (>= 2^-6) or lands on the
// subnormal grid (2^-9); smaller values lose bits, and below 2^-10 become ±0.
// Host + device, shared by the golden model, the prepare kernel
// (m3qkv_prepare_weights_fp8) and the SM90 fast mode's activation fold.
#pragma once

#include <stdint.h>

#include "common/numerics.h"
#include "ptx/cvt.cuh"

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

// Four e4m3 bytes of one block (a 32-bit word, byte i = element i), each as
// shift_e4m3 shifts it. Where the cvt instructions exist: e4m3 -> f16 -> f32
// is exact, the product by 2^-shift is exact (shift clamped to 32: any shift
// >= kZeroShift gives ±0 either way), and one RN-even satfinite rounding back
// gives the soft path's bits (GPU-tested over every code and shift).
M3_HD uint32_t shift_e4m3x4(uint32_t w, int shift) {
  if (shift <= 0) return w;
#if M3QKV_HAS_CVT_RN_SATFINITE_E4M3X2_F32 && M3QKV_HAS_CVT_RN_F16X2_E4M3X2
  const float s = exp2i_f32(-(shift < 32 ? shift : 32));
  uint32_t out = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t f16 = cvt_rn_f16x2_e4m3x2(static_cast<uint16_t>(w >> (16 * h)));
    const float lo = cvt_f32_f16(static_cast<uint16_t>(f16 & 0xffffu)) * s;
    const float hi = cvt_f32_f16(static_cast<uint16_t>(f16 >> 16)) * s;
    out |= static_cast<uint32_t>(cvt_rn_satfinite_e4m3x2_f32(lo, hi)) << (16 * h);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)  // NaN codes stay as they are (the cvt would canonicalize them)
    if (((w >> (8 * i)) & 0x7fu) == 0x7fu) out = (out & ~(0xffu << (8 * i))) | (w & (0xffu << (8 * i)));
  return out;
#else
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i)
    out |= static_cast<uint32_t>(shift_e4m3(static_cast<uint8_t>(w >> (8 * i)), shift)) << (8 * i);
  return out;
#endif
}

// One (row, 128-K group): its 128 e4m3 values as 32 words `q` (word j =
// elements 4j .. 4j+3, block j / 8) and its four block scales `sf` (byte b =
// block b, the word of an F8_128x4 chunk) -> the folded words in `out` (may
// be `q`); returns the group's scale byte. A NaN scale leaves the values as
// they are.
M3_HD uint8_t fold_group(const uint32_t (&q)[kGroupK / 4], uint32_t sf, uint32_t (&out)[kGroupK / 4]) {
  const uint8_t e[kBlocksPerGroup] = {static_cast<uint8_t>(sf), static_cast<uint8_t>(sf >> 8),
                                      static_cast<uint8_t>(sf >> 16), static_cast<uint8_t>(sf >> 24)};
  const uint8_t big = group_exponent(e[0], e[1], e[2], e[3]);
#pragma unroll
  for (int j = 0; j < kGroupK / 4; ++j)
    out[j] = big == 0xffu ? q[j] : shift_e4m3x4(q[j], big - e[j / 8]);
  return big;
}

// The F8_128x4 word of a folded group: its scale in all four blocks, so the
// prepared weights are an MXFP8 weight too (exact mode reads them as such).
M3_HD uint32_t group_scale_word(uint8_t big) { return 0x01010101u * big; }

}  // namespace m3qkv::fold
